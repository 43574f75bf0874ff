"""fabric and node planes: NCCL acceptance runs, InfiniBand/RoCE and NVLink counters, GPU
topology history; per attempt StdOut path and step usage (CPU time, peak memory)

Revision ID: 0008
Revises: 0007
"""

from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

_ATTEMPT_OUTCOME_VIEW = """
    CREATE VIEW job_attempt_outcome AS
    SELECT a.*, coalesce(o.outcome, 'unknown') AS outcome
    FROM job_attempt a LEFT JOIN outcome_class o ON o.state = a.state
"""


def upgrade() -> None:
    # what the nccl source needs to find a job's StdOut file, and what seff/jobstats need
    # (sacct without -X: the steps' TotalCPU and peak RSS, summed / maxed per attempt)
    op.execute(
        """
        ALTER TABLE job_attempt
            ADD COLUMN stdout_path text NOT NULL DEFAULT '',
            ADD COLUMN stdout_pattern text NOT NULL DEFAULT '',
            ADD COLUMN cpu_time_seconds double precision,
            ADD COLUMN mem_peak_task_bytes bigint,
            ADD COLUMN mem_peak_step_bytes bigint,
            ADD COLUMN usage_steps integer
        """
    )
    # the nccl source looks for attempts that ended lately, every few minutes
    op.execute("CREATE INDEX job_attempt_end_at ON job_attempt (end_at)")
    # a.* was expanded when the view was made: make it again so it has the new columns
    op.execute("DROP VIEW job_attempt_outcome")
    op.execute(_ATTEMPT_OUTCOME_VIEW)

    # one row per log read (a file, or a job's StdOut); its runs below. Natural key: the log's
    # bytes and the job it belongs to ('' without one), so reading it again stores nothing new
    op.execute(
        """
        CREATE TABLE nccl_log (
            id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            log_sha256 text NOT NULL,
            job_ref text NOT NULL DEFAULT '',
            origin text NOT NULL,
            label text NOT NULL DEFAULT '',
            bytes bigint NOT NULL,
            runs integer NOT NULL,
            ingested_at timestamptz NOT NULL DEFAULT now(),
            UNIQUE (log_sha256, job_ref)
        )
        """
    )
    op.execute(
        """
        CREATE TABLE nccl_run (
            id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            log_id bigint NOT NULL REFERENCES nccl_log (id) ON DELETE CASCADE,
            run_index integer NOT NULL,
            -- the job the log is the StdOut of; NULL for a log ingested without --job
            cluster text NOT NULL DEFAULT '',
            job_id_raw bigint,
            job_submit_at timestamptz,
            job_id text NOT NULL DEFAULT '',
            label text NOT NULL DEFAULT '',
            -- when it ran: the job's end (else its start), else when the log was read
            run_at timestamptz NOT NULL,
            tool text NOT NULL,
            collective text NOT NULL,
            collective_source text NOT NULL DEFAULT '',
            status text NOT NULL CHECK (status IN ('ok', 'degraded', 'failed')),
            reasons text[] NOT NULL DEFAULT '{}',
            tests_version text NOT NULL DEFAULT '',
            nccl_version text NOT NULL DEFAULT '',
            library text NOT NULL DEFAULT '',
            ranks integer,
            hosts text[] NOT NULL DEFAULT '{}',
            -- Slurm node names (the job's nodes, else the hosts' short names), sorted; node_set
            -- joins them: the runs of one set of nodes are compared with each other
            nodes text[] NOT NULL DEFAULT '{}',
            node_set text NOT NULL DEFAULT '',
            gpu_model text NOT NULL DEFAULT '',
            data_type text NOT NULL DEFAULT '',
            min_size_bytes bigint,
            max_size_bytes bigint,
            sizes integer NOT NULL DEFAULT 0,
            avg_busbw_gbps double precision,
            avg_busbw_source text NOT NULL DEFAULT '',
            peak_busbw_gbps double precision,
            wrong_values bigint NOT NULL DEFAULT 0,
            out_of_bounds_values integer,
            footer_seen boolean NOT NULL DEFAULT false,
            failed_hosts text[] NOT NULL DEFAULT '{}',
            validation boolean,
            -- the header (threads, GPUs per process, iterations, size range), the size rows
            -- and the rank list, as the parser read them
            header jsonb NOT NULL DEFAULT '{}',
            results jsonb NOT NULL DEFAULT '[]',
            rank_devices jsonb NOT NULL DEFAULT '[]',
            UNIQUE (log_id, run_index)
        )
        """
    )
    op.execute("CREATE INDEX nccl_run_at ON nccl_run (run_at)")
    op.execute("CREATE INDEX nccl_run_job ON nccl_run (cluster, job_id_raw, job_submit_at)")
    # the nodes of a run, with their software at the time (from the node inventory)
    op.execute(
        """
        CREATE TABLE nccl_run_node (
            run_id bigint NOT NULL REFERENCES nccl_run (id) ON DELETE CASCADE,
            node text NOT NULL,
            host text NOT NULL DEFAULT '',
            ranks integer NOT NULL DEFAULT 0,
            gpu_model text NOT NULL DEFAULT '',
            driver_version text NOT NULL DEFAULT '',
            cuda_version text NOT NULL DEFAULT '',
            vbios_version text NOT NULL DEFAULT '',
            PRIMARY KEY (run_id, node)
        )
        """
    )
    op.execute("CREATE INDEX nccl_run_node_node ON nccl_run_node (node)")
    # the daemon's pickup of acceptance jobs' StdOut files: one row per attempt looked at
    op.execute(
        """
        CREATE TABLE nccl_pickup (
            cluster text NOT NULL,
            job_id_raw bigint NOT NULL,
            submit_at timestamptz NOT NULL,
            -- 'stored', 'quarantined', 'waiting' (file not there yet)
            status text NOT NULL,
            path text NOT NULL DEFAULT '',
            tries integer NOT NULL DEFAULT 1,
            message text NOT NULL DEFAULT '',
            first_tried_at timestamptz NOT NULL,
            last_tried_at timestamptz NOT NULL,
            PRIMARY KEY (cluster, job_id_raw, submit_at)
        )
        """
    )

    # node agents: per window and port / GPU, the increase of each counter
    op.execute(
        """
        CREATE TABLE fabric_port_window (
            node text NOT NULL,
            device text NOT NULL,
            port integer NOT NULL,
            window_start_at timestamptz NOT NULL,
            window_seconds real NOT NULL,
            link_layer text NOT NULL DEFAULT '',
            state text NOT NULL DEFAULT '',
            phys_state text NOT NULL DEFAULT '',
            rate_gbps real,
            deltas jsonb NOT NULL DEFAULT '{}',
            resets text[] NOT NULL DEFAULT '{}',
            saturated text[] NOT NULL DEFAULT '{}',
            PRIMARY KEY (node, device, port, window_start_at)
        )
        """
    )
    op.execute("CREATE INDEX fabric_port_window_at ON fabric_port_window (window_start_at)")
    op.execute(
        """
        CREATE TABLE nvlink_window (
            node text NOT NULL,
            gpu_uuid text NOT NULL,
            window_start_at timestamptz NOT NULL,
            window_seconds real NOT NULL,
            links_active integer NOT NULL,
            links_total integer NOT NULL,
            tx_bytes bigint,
            rx_bytes bigint,
            errors jsonb NOT NULL DEFAULT '{}',
            link_errors jsonb NOT NULL DEFAULT '{}',
            resets text[] NOT NULL DEFAULT '{}',
            PRIMARY KEY (gpu_uuid, window_start_at)
        )
        """
    )
    op.execute("CREATE INDEX nvlink_window_node_at ON nvlink_window (node, window_start_at)")
    # GPU topology history: one row per distinct topology of a node, seen from .. to
    op.execute(
        """
        CREATE TABLE node_topology (
            id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            node text NOT NULL,
            source text NOT NULL,
            summary text NOT NULL,
            devices text[] NOT NULL,
            links text[] NOT NULL,
            gpu_uuids text[] NOT NULL DEFAULT '{}',
            cpu_affinity text[] NOT NULL DEFAULT '{}',
            numa_affinity text[] NOT NULL DEFAULT '{}',
            nic_names text[] NOT NULL DEFAULT '{}',
            p2p text[] NOT NULL DEFAULT '{}',
            first_seen_at timestamptz NOT NULL,
            last_seen_at timestamptz NOT NULL,
            UNIQUE (node, source, summary, links)
        )
        """
    )
    op.execute("CREATE INDEX node_topology_node ON node_topology (node, last_seen_at DESC)")


def downgrade() -> None:
    for table in (
        "node_topology",
        "nvlink_window",
        "fabric_port_window",
        "nccl_pickup",
        "nccl_run_node",
        "nccl_run",
        "nccl_log",
    ):
        op.execute(f"DROP TABLE {table}")
    op.execute("DROP VIEW job_attempt_outcome")
    op.execute("DROP INDEX job_attempt_end_at")
    op.execute(
        """
        ALTER TABLE job_attempt
            DROP COLUMN stdout_path, DROP COLUMN stdout_pattern, DROP COLUMN cpu_time_seconds,
            DROP COLUMN mem_peak_task_bytes, DROP COLUMN mem_peak_step_bytes, DROP COLUMN usage_steps
        """
    )
    op.execute(_ATTEMPT_OUTCOME_VIEW)
