"""telemetry: GPU inventory, window summaries (partitioned by day), events, live allocations,
node states, pending jobs, ingest batches, agent cursors

Revision ID: 0002
Revises: 0001
"""

from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # every write of telemetry is one batch; attribution processes the batches it has not seen
    # (a watermark on commit order, not on ids, so a late commit is never skipped)
    op.execute(
        """
        CREATE TABLE ingest_batch (
            id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            source text NOT NULL,
            node text NOT NULL DEFAULT '',
            window_min_at timestamptz,
            window_max_at timestamptz,
            rows integer NOT NULL,
            ingested_at timestamptz NOT NULL DEFAULT now()
        )
        """
    )
    op.execute(
        """
        CREATE TABLE gpu_summary (
            source text NOT NULL,
            node text NOT NULL,
            gpu_uuid text NOT NULL,
            window_start_at timestamptz NOT NULL,
            window_seconds real NOT NULL,
            util_metric text NOT NULL,
            sample_count integer NOT NULL,
            covered_seconds real NOT NULL,
            util_mean_percent real,
            util_max_percent real,
            idle_seconds real NOT NULL,
            no_process_seconds real,
            memory_used_mean_bytes bigint,
            memory_used_max_bytes bigint,
            memory_total_bytes bigint,
            power_mean_watts real,
            energy_joules double precision,
            energy_method text NOT NULL DEFAULT '',
            temperature_max_celsius real,
            sm_clock_max_mhz real,
            job_ids text[] NOT NULL DEFAULT '{}',
            batch_id bigint NOT NULL,
            PRIMARY KEY (gpu_uuid, window_start_at, source)
        ) PARTITION BY RANGE (window_start_at)
        """
    )
    op.execute("CREATE INDEX gpu_summary_node_window ON gpu_summary (node, window_start_at)")
    op.execute("CREATE INDEX gpu_summary_batch ON gpu_summary (batch_id)")
    op.execute(
        """
        CREATE TABLE gpu_inventory (
            id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            source text NOT NULL,
            node text NOT NULL,
            gpu_uuid text NOT NULL,
            gpu_index integer NOT NULL,
            model text NOT NULL DEFAULT '',
            memory_total_bytes bigint,
            minor_number integer,
            pci_bus_id text NOT NULL DEFAULT '',
            driver_version text NOT NULL DEFAULT '',
            cuda_version text NOT NULL DEFAULT '',
            vbios_version text NOT NULL DEFAULT '',
            mig_mode text NOT NULL DEFAULT '',
            parent_gpu_uuid text NOT NULL DEFAULT '',
            mig_profile text NOT NULL DEFAULT '',
            gpu_fraction real NOT NULL DEFAULT 1.0,
            first_seen_at timestamptz NOT NULL,
            last_seen_at timestamptz NOT NULL,
            -- one row per distinct configuration of a GPU: a new driver or index is a new row,
            -- so index -> UUID can be translated as it was at any time
            UNIQUE (node, gpu_uuid, gpu_index, driver_version, cuda_version, vbios_version, mig_profile)
        )
        """
    )
    op.execute("CREATE INDEX gpu_inventory_lookup ON gpu_inventory (node, gpu_index, last_seen_at)")
    op.execute(
        """
        CREATE TABLE gpu_event (
            node text NOT NULL,
            gpu_uuid text NOT NULL,
            at timestamptz NOT NULL,
            kind text NOT NULL,
            value bigint NOT NULL,
            detail text NOT NULL DEFAULT '',
            PRIMARY KEY (gpu_uuid, at, kind, value)
        )
        """
    )
    op.execute("CREATE INDEX gpu_event_node ON gpu_event (node, at)")
    op.execute(
        """
        CREATE TABLE gpu_allocation (
            cluster text NOT NULL,
            job_id_raw bigint NOT NULL,
            submit_at timestamptz NOT NULL,
            node text NOT NULL,
            gpu_index integer NOT NULL,
            gpu_uuid text NOT NULL DEFAULT '',
            gpu_model text NOT NULL DEFAULT '',
            first_seen_at timestamptz NOT NULL,
            last_seen_at timestamptz NOT NULL,
            PRIMARY KEY (cluster, job_id_raw, submit_at, node, gpu_index)
        )
        """
    )
    op.execute("CREATE INDEX gpu_allocation_gpu ON gpu_allocation (node, gpu_uuid, last_seen_at)")
    # node states as intervals: a row is extended while the state is unchanged
    op.execute(
        """
        CREATE TABLE node_state (
            id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            cluster text NOT NULL,
            node text NOT NULL,
            states text[] NOT NULL,
            gpus_total integer NOT NULL,
            gpus_allocated integer NOT NULL,
            partitions text[] NOT NULL DEFAULT '{}',
            gpu_model text NOT NULL DEFAULT '',
            reason text NOT NULL DEFAULT '',
            first_seen_at timestamptz NOT NULL,
            last_seen_at timestamptz NOT NULL
        )
        """
    )
    op.execute("CREATE INDEX node_state_node ON node_state (cluster, node, last_seen_at DESC)")
    op.execute(
        """
        CREATE TABLE pending_job (
            cluster text NOT NULL,
            job_id_raw bigint NOT NULL,
            submit_at timestamptz NOT NULL,
            reason text NOT NULL,
            job_id text NOT NULL,
            user_name text NOT NULL DEFAULT '',
            account text NOT NULL DEFAULT '',
            partition text NOT NULL DEFAULT '',
            gpus_requested integer NOT NULL DEFAULT 0,
            eligible_at timestamptz,
            first_seen_at timestamptz NOT NULL,
            last_seen_at timestamptz NOT NULL,
            PRIMARY KEY (cluster, job_id_raw, submit_at, reason)
        )
        """
    )
    op.execute("CREATE INDEX pending_job_last_seen ON pending_job (cluster, last_seen_at)")
    # the last controller snapshot per cluster: "pending now" means seen in it
    op.execute(
        """
        CREATE TABLE controller_snapshot (
            cluster text PRIMARY KEY,
            observed_at timestamptz NOT NULL
        )
        """
    )
    # pull cursors of node agents; spool_id changes when an agent's spool is recreated
    op.execute(
        """
        CREATE TABLE agent_cursor (
            node text PRIMARY KEY,
            spool_id text NOT NULL,
            cursor bigint NOT NULL,
            evicted_total bigint NOT NULL DEFAULT 0,
            spool_items bigint NOT NULL DEFAULT 0,
            spool_bytes bigint NOT NULL DEFAULT 0,
            updated_at timestamptz NOT NULL DEFAULT now()
        )
        """
    )


def downgrade() -> None:
    for table in (
        "agent_cursor",
        "controller_snapshot",
        "pending_job",
        "node_state",
        "gpu_allocation",
        "gpu_event",
        "gpu_inventory",
        "gpu_summary",
        "ingest_batch",
    ):
        op.execute(f"DROP TABLE {table}")
