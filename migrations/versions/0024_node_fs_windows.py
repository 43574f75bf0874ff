"""network file system client counters per node and window (issue 26)

Revision ID: 0024
Revises: 0021

- node_fs_window: what one network file system client of a node moved in one summary window
  (NFS: the increases of /proc/self/mountstats' counters per mount, read by the agent once a
  window; fstype says which client, so GPFS or BeeGFS node counters can follow without a
  migration). Natural key (node, filesystem, window_start_at). Node-level traffic, no user or job: readable like
  gpu_host_window. The attribution run counts it towards a job's storage_wait only in the
  windows in which the job is the only one with a cgroup window on the node.
- job_host_window gains an index on (node, window_start_at) for that test.
"""

from alembic import op

revision = "0024"
down_revision = "0021"
branch_labels = None
depends_on = None

WRITER, READER = "slurmtel_writer", "slurmtel_reader"


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE node_fs_window (
            node text NOT NULL,
            filesystem text NOT NULL,
            window_start_at timestamptz NOT NULL,
            fstype text NOT NULL,
            device text NOT NULL,
            window_seconds real NOT NULL,
            read_bytes bigint,
            write_bytes bigint,
            read_ops bigint,
            write_ops bigint,
            read_rtt_seconds real,
            write_rtt_seconds real,
            PRIMARY KEY (node, window_start_at, filesystem)
        )
        """
    )
    # "was the job alone on the node in that window": the cgroup windows of a node and window
    # (the primary key leads with node, job_id: a lookup by window read the node's history)
    op.execute("CREATE INDEX job_host_window_node_window ON job_host_window (node, window_start_at)")
    op.execute(f"GRANT SELECT, INSERT, UPDATE, DELETE ON node_fs_window TO {WRITER}")
    op.execute(f"GRANT SELECT ON node_fs_window TO {READER}")


def downgrade() -> None:
    op.execute("DROP INDEX job_host_window_node_window")
    op.execute("DROP TABLE node_fs_window")
