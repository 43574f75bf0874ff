"""host signals and idle causes: jobs' cgroup windows, GPUs' throttle/PCIe windows, Lustre
jobstats, idle GPU-seconds by cause, checkpoint and start-up estimates (issue 26)

Revision ID: 0021
Revises: 0020

- job_host_window: what one job's cgroup did on one node in one summary window (increases of
  its IO bytes and operations, CPU seconds, pressure stall seconds; its CPUs and memory peak).
  Natural key (node, job_id, window_start_at). Bare job ids, no user or name: readable like
  gpu_summary (the job view reads a user's own job through it).
- gpu_host_window: one GPU's clock-throttle seconds (and PCIe bytes) in one window in which it
  was throttled (power, thermal, HW slowdown): no row is "not throttled" (a row per GPU-window
  would cost ~160 bytes, four times a packed window). Natural key (gpu_uuid, window_start_at).
  The PCIe bytes of every window are in the job's job_host_window (its GPUs' on the node).
- lustre_job_stat: Lustre jobstats snapshots as read (cumulative counters). Natural key
  (target, job_name, snapshot_at); increases are taken between a key's successive snapshots
  (slurmtel.store.hostside). The job name can hold a user id and host (jobid_name %u %H):
  everything-only.
- gpu_attribution_part gains the idle GPU-seconds of each cause per slice (attempt x node x
  GPU x site day x UTC hour), summed by the attribution run in the same pass as the slice's
  other sums; NULL for slices computed without them (before this migration). A user's
  `slurmtel job` and `report idle --by cause` read them: its rows are now visible with their
  attempt (as gpu_attribution's), no longer to a scope of everything only.
- job_checkpoint: per finished attempt, the checkpoint episodes and start-up estimate.
  Visible with its attempt.
"""

from alembic import op

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None

WRITER, READER = "slurmtel_writer", "slurmtel_reader"
_ALL = "(SELECT p.scope_all FROM slurmtel_proven_scope(slurmtel_scope_session()) p)"


def _of_attempt(table: str) -> str:
    return (
        f"({_ALL} OR EXISTS (SELECT 1 FROM job_attempt a WHERE a.cluster = {table}.cluster "
        f"AND a.job_id_raw = {table}.job_id_raw AND a.submit_at = {table}.submit_at))"
    )


READER_POLICIES = {
    "lustre_job_stat": _ALL,
    "job_checkpoint": _of_attempt("job_checkpoint"),
}
OPEN_TABLES = ("job_host_window", "gpu_host_window")

CAUSES = (
    "no_process",
    "hardware",
    "storage_wait",
    "network_wait",
    "cpu_bound",
    "idle_unexplained",
    "unmeasured",
)


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE job_host_window (
            node text NOT NULL,
            job_id text NOT NULL,
            window_start_at timestamptz NOT NULL,
            window_seconds real NOT NULL,
            cgroup_version smallint NOT NULL,
            read_bytes bigint,
            write_bytes bigint,
            read_ops bigint,
            write_ops bigint,
            cpu_usage_seconds real,
            cpus integer,
            memory_peak_bytes bigint,
            io_some_stall_seconds real,
            io_full_stall_seconds real,
            cpu_some_stall_seconds real,
            memory_some_stall_seconds real,
            memory_full_stall_seconds real,
            pcie_tx_bytes bigint,
            pcie_rx_bytes bigint,
            PRIMARY KEY (node, job_id, window_start_at)
        )
        """
    )
    op.execute(
        """
        CREATE TABLE gpu_host_window (
            node text NOT NULL,
            gpu_uuid text NOT NULL,
            window_start_at timestamptz NOT NULL,
            window_seconds real NOT NULL,
            pcie_tx_bytes bigint,
            pcie_rx_bytes bigint,
            throttle_power_seconds real,
            throttle_thermal_seconds real,
            throttle_hw_slowdown_seconds real,
            PRIMARY KEY (gpu_uuid, window_start_at)
        )
        """
    )
    op.execute(
        """
        CREATE TABLE lustre_job_stat (
            target text NOT NULL,
            job_name text NOT NULL,
            snapshot_at timestamptz NOT NULL,
            job_id text NOT NULL,
            start_at timestamptz,
            read_bytes bigint,
            write_bytes bigint,
            read_ops bigint,
            write_ops bigint,
            metadata_ops bigint,
            read_wait_seconds double precision,
            write_wait_seconds double precision,
            PRIMARY KEY (target, job_name, snapshot_at)
        )
        """
    )
    op.execute("CREATE INDEX lustre_job_stat_job ON lustre_job_stat (job_id, snapshot_at)")
    for cause in CAUSES:
        op.execute(f"ALTER TABLE gpu_attribution_part ADD COLUMN cause_{cause}_seconds double precision")

    op.execute(
        """
        CREATE TABLE job_checkpoint (
            cluster text NOT NULL,
            job_id_raw bigint NOT NULL,
            submit_at timestamptz NOT NULL,
            episodes integer NOT NULL,
            checkpoint_gpu_seconds double precision NOT NULL,
            checkpoint_write_bytes bigint NOT NULL,
            startup_seconds double precision,
            startup_gpu_seconds double precision,
            startup_read_bytes bigint,
            computed_at timestamptz NOT NULL,
            PRIMARY KEY (cluster, job_id_raw, submit_at)
        )
        """
    )
    op.execute("DROP POLICY reader_scope ON gpu_attribution_part")
    op.execute(
        f"CREATE POLICY reader_scope ON gpu_attribution_part FOR SELECT TO {READER} "
        f"USING ({_of_attempt('gpu_attribution_part')})"
    )
    for table in OPEN_TABLES:
        op.execute(f"GRANT SELECT, INSERT, UPDATE, DELETE ON {table} TO {WRITER}")
        op.execute(f"GRANT SELECT ON {table} TO {READER}")
    for table, using in READER_POLICIES.items():
        op.execute(f"GRANT SELECT, INSERT, UPDATE, DELETE ON {table} TO {WRITER}")
        op.execute(f"GRANT SELECT ON {table} TO {READER}")
        op.execute(f"ALTER TABLE {table} ENABLE ROW LEVEL SECURITY")
        op.execute(f"CREATE POLICY writer_all ON {table} TO {WRITER} USING (true) WITH CHECK (true)")
        op.execute(f"CREATE POLICY reader_scope ON {table} FOR SELECT TO {READER} USING ({using})")


def downgrade() -> None:
    op.execute("DROP POLICY reader_scope ON gpu_attribution_part")
    op.execute(f"CREATE POLICY reader_scope ON gpu_attribution_part FOR SELECT TO {READER} USING ({_ALL})")
    for table in ("job_checkpoint", "lustre_job_stat", "gpu_host_window", "job_host_window"):
        op.execute(f"DROP TABLE {table}")
    for cause in CAUSES:
        op.execute(f"ALTER TABLE gpu_attribution_part DROP COLUMN cause_{cause}_seconds")
