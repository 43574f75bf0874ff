"""The one configuration object.

Loaded once from TOML (``--config``, ``$SLURMTEL_CONFIG``, else ``/etc/slurmtel/slurmtel.toml``
when it exists, else built-in defaults; the ``slurmtel`` command also finds the config
``slurmtel demo`` left in the user's own state directory: see implicit_demo_config) and passed
explicitly to everything that needs it.
Unknown keys are errors that name the key. Secrets (the database URL) may come from a file or
the environment and are never logged.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
import tomllib
import types
import typing
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import date
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from slurmtel.actions.settings import ActionRule, ActionsConfig, validate_actions
from slurmtel.errors import ConfigError

DEFAULT_CONFIG_PATH = Path("/etc/slurmtel/slurmtel.toml")
ENV_CONFIG = "SLURMTEL_CONFIG"
ENV_DATABASE_URL = "SLURMTEL_DATABASE_URL"


@dataclass(frozen=True)
class SiteConfig:
    # the Slurm cluster's name; "" = ask the controller (scontrol show config: ClusterName)
    cluster: str = ""
    # reports cut days and months in this zone; -S/-E without a zone are read in it; "" = the
    # host's zone, as Slurm's tools read and print times ($TZ, else /etc/localtime, else UTC)
    timezone: str = ""
    # embedded PostgreSQL, agent spool and other local state; "" = /var/lib/slurmtel when
    # writable, else $XDG_STATE_HOME/slurmtel (~/.local/state/slurmtel)
    state_dir: str = ""
    # for demos and tests only: "" = the wall clock; an ISO 8601 instant with a zone
    # ("2026-12-04T00:00:00Z") = a fixed "now" for every command and the daemon; an absolute
    # path = a simulated world's clock file (`slurmtel demo`; see slurmtel/clock.py)
    clock: str = ""


@dataclass(frozen=True)
class DatabaseConfig:
    # SQLAlchemy/psycopg URL; "" = $SLURMTEL_DATABASE_URL, else url_file, else embedded
    url: str = ""
    # file holding the URL (keeps the password out of the config file)
    url_file: str = ""
    # seconds to wait for a connection before a run counts as "database unavailable"
    connect_timeout_seconds: int = 10


@dataclass(frozen=True)
class SacctSourceConfig:
    enabled: bool = True
    interval_seconds: int = 300
    # sacct binary
    command: str = "sacct"
    # -M: clusters to collect; [] = the local cluster of the sacct client
    clusters: list[str] = field(default_factory=list)
    # "json" (preferred) or "parsable" (sacct -P, for Slurm without --json)
    format: str = "json"
    # each poll re-reads this many seconds before the cursor: records change after a job ends
    rescan_seconds: int = 3600
    # the first poll (no cursor yet) starts this far back
    initial_lookback_seconds: int = 86400
    # a sacct call that takes longer is killed and the run counts as "source unavailable"
    timeout_seconds: int = 600
    # a longer window (a backfill, collect --once -S ...) is read in sacct calls of at most
    # this many seconds, each stored in its own transaction; 0 = one call for the whole window
    chunk_seconds: int = 86400
    # read the job steps too (sacct without -X): CPU time and peak memory per attempt, for
    # the researcher's efficiency figures; false = allocations only (-X), a smaller answer
    steps: bool = True


@dataclass(frozen=True)
class OutcomeConfig:
    # final job state -> outcome class (DESIGN §4); states not listed are classed "unknown"
    completed: list[str] = field(default_factory=lambda: ["COMPLETED"])
    user_failure: list[str] = field(
        default_factory=lambda: ["FAILED", "OUT_OF_MEMORY", "TIMEOUT", "DEADLINE"]
    )
    system_failure: list[str] = field(default_factory=lambda: ["NODE_FAIL", "BOOT_FAIL"])
    cancelled: list[str] = field(default_factory=lambda: ["CANCELLED", "REVOKED"])
    preempted: list[str] = field(
        default_factory=lambda: ["PREEMPTED", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD"]
    )
    # not final: time so far counts as "running"; pending attempts hold no GPU
    running: list[str] = field(
        default_factory=lambda: [
            "RUNNING",
            "SUSPENDED",
            "COMPLETING",
            "CONFIGURING",
            "RESIZING",
            "SIGNALING",
            "STAGE_OUT",
            "STOPPED",
        ]
    )
    pending: list[str] = field(default_factory=lambda: ["PENDING"])

    def mapping(self) -> dict[str, str]:
        """state -> class, every listed state once."""
        result: dict[str, str] = {}
        for f in dataclasses.fields(self):
            for state in getattr(self, f.name):
                result[state.upper()] = f.name
        return result


@dataclass(frozen=True)
class SlurmctldSourceConfig:
    enabled: bool = True
    interval_seconds: int = 60
    squeue_command: str = "squeue"
    scontrol_command: str = "scontrol"
    # running jobs' GPU indices and pending jobs from "squeue_json" (squeue -a --json, its
    # gres_detail) or "scontrol_text" (scontrol show job -d)
    job_view: str = "squeue_json"
    timeout_seconds: int = 60


@dataclass(frozen=True)
class ScrapeTargetsConfig:
    """Where the head finds per-node HTTP endpoints (dcgm-exporter, slurmtel-agent)."""

    enabled: bool = False
    interval_seconds: int = 30
    # "node" (host = node name), "node=host:port" or "http://host:port/path" entries
    targets: list[str] = field(default_factory=list)
    # add every Slurm node that has GPUs (sinfo), reached at its NodeAddr on `port`
    discover_nodes: bool = False
    sinfo_command: str = "sinfo"
    port: int = 9400
    timeout_seconds: int = 10
    # nodes worked on at once: an unreachable one costs one worker its timeout, not the run
    concurrency: int = 4


@dataclass(frozen=True)
class DcgmSourceConfig(ScrapeTargetsConfig):
    path: str = "/metrics"


@dataclass(frozen=True)
class AgentSourceConfig(ScrapeTargetsConfig):
    interval_seconds: int = 60
    port: int = 9767
    # file holding the agents' shared token (agent.token_file on the nodes)
    token_file: str = ""
    # directory of per-node tokens: a file named after the node (the target's node name)
    # holds that node's token (the agent's own <state_dir>/agent-token) and wins over token_file
    token_dir: str = ""
    # items per pull request
    page_size: int = 5000


# the DCGM fields the prometheus source reads by default (dcgm-exporter's default names, DCGM 3):
# the same quantities the dcgm source reads from a scrape
DEFAULT_PROMETHEUS_METRICS = (
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
    "DCGM_FI_PROF_SM_ACTIVE",
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_DEV_FB_USED",
    "DCGM_FI_DEV_FB_FREE",
    "DCGM_FI_DEV_FB_TOTAL",
    "DCGM_FI_DEV_POWER_USAGE",
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
    "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_SM_CLOCK",
    "DCGM_FI_DEV_XID_ERRORS",
)


@dataclass(frozen=True)
class PrometheusSourceConfig:
    """[sources.prometheus]: the DCGM series a Prometheus-compatible server has scraped from
    dcgm-exporter, read through its HTTP API (/api/v1/query_range)."""

    enabled: bool = False
    interval_seconds: int = 60
    # the server's base URL ("http://prometheus.example.org:9090", or with a path prefix)
    url: str = ""
    # file holding a bearer token sent as "Authorization: Bearer <token>"; "" = none
    bearer_token_file: str = ""
    # https: CA certificates (PEM) to verify the server with; "" = the system's
    ca_file: str = ""
    # https: do not verify the server's certificate (tests and labs only)
    insecure_skip_verify: bool = False
    timeout_seconds: int = 30
    # the label that names the GPU node; "instance" (host:port of the exporter) and FQDNs are
    # cut to the short host name, as the dcgm source names a target's node
    node_label: str = "instance"
    # query resolution: each window is this many seconds, its sample the latest one the server
    # has in the step before the window's start
    step_seconds: int = 30
    # the newest seconds are left for the next run (scrapes still arriving)
    delay_seconds: int = 60
    # the first run (no cursor yet) starts this far back
    initial_lookback_seconds: int = 3600
    # points per series and query at most: a longer window is read in several queries
    max_points_per_series: int = 240
    # nodes per query at most: more nodes are read in several queries
    nodes_per_query: int = 8
    # the DCGM fields read (DCGM 3, DCGM 4.7 or 1.x-compatibility names: each name says its unit)
    metrics: list[str] = field(default_factory=lambda: list(DEFAULT_PROMETHEUS_METRICS))
    # DCGM field -> the metric's name on this server, where it differs (a recording rule, a prefix)
    metric_names: dict[str, str] = field(default_factory=dict)


# nccl-tests / rccl-tests jobs: "nccl" or "rccl" as a word of the name, or a *_perf binary's name
DEFAULT_NCCL_JOB_PATTERN = "(?i)(^|[^a-z0-9])(nccl|rccl)([^a-z0-9]|$)|_perf$"


@dataclass(frozen=True)
class NcclSourceConfig:
    """[sources.nccl]: acceptance runs (nccl-tests, rccl-tests) from acceptance jobs' StdOut."""

    # the daemon reads acceptance jobs' StdOut files (they must be readable by its user: see
    # README); off by default, `collect nccl --input` works either way
    enabled: bool = False
    interval_seconds: int = 300
    # jobs whose name matches this (a regular expression as PostgreSQL reads it, searched in
    # the name) are acceptance runs: their StdOut file is read once they have ended
    job_name_pattern: str = DEFAULT_NCCL_JOB_PATTERN
    # attempts that ended at most this long ago are looked at
    lookback_seconds: int = 7 * 86400
    # a StdOut file that is not there is looked for again until this long after the job ended
    # (shared file systems lag); then it is quarantined
    wait_seconds: int = 3600
    # a larger log is quarantined rather than read
    max_log_bytes: int = 64 * 1024 * 1024


@dataclass(frozen=True)
class LustreSourceConfig:
    """[sources.lustre]: Lustre jobstats, read on the head (or an admin node) per job."""

    enabled: bool = False
    interval_seconds: int = 60
    # the command whose output is the jobstats (run without a shell); its stdout is read
    command: list[str] = field(
        default_factory=lambda: ["lctl", "get_param", "obdfilter.*.job_stats", "mdt.*.job_stats"]
    )
    # or a file a site's own job writes (e.g. from every OSS by pdsh); read instead of the command
    path: str = ""
    timeout_seconds: int = 60
    # a regular expression (Python) whose first group is the Slurm job id in a jobstats name:
    # jobid_var=SLURM_JOB_ID gives "1234"; jobid_name="SLURM_JOB%j:%u:%H" gives "SLURM_JOB1234:..."
    job_pattern: str = r"^(?:SLURM_JOB)?(\d+)(?:$|[:.@])"


@dataclass(frozen=True)
class SourcesConfig:
    sacct: SacctSourceConfig = field(default_factory=SacctSourceConfig)
    slurmctld: SlurmctldSourceConfig = field(default_factory=SlurmctldSourceConfig)
    dcgm: DcgmSourceConfig = field(default_factory=DcgmSourceConfig)
    agent: AgentSourceConfig = field(default_factory=AgentSourceConfig)
    nccl: NcclSourceConfig = field(default_factory=NcclSourceConfig)
    prometheus: PrometheusSourceConfig = field(default_factory=PrometheusSourceConfig)
    lustre: LustreSourceConfig = field(default_factory=LustreSourceConfig)


@dataclass(frozen=True)
class TelemetryConfig:
    # raw window summaries are kept this many days (daily partitions are dropped after it);
    # per attempt and GPU rollups are kept forever
    retention_days: int = 90
    # daily partitions are created this many days ahead
    partitions_ahead_days: int = 7
    # windows and events dated more than this many seconds after the head's clock are
    # quarantined (a node's clock is wrong), as are those older than retention_days
    max_future_seconds: int = 300
    # daily partitions one run of a source may create at most; windows of further new days are
    # quarantined (with the plausible range above, only a very long backlog comes near it)
    max_new_partitions_per_run: int = 100
    # where the windows are kept: "postgresql" (slurmtel's database), or "prometheus": they stay
    # in the Prometheus-compatible server of [sources.prometheus] and attribution and `slurmtel
    # job` read them from it when they need them (PostgreSQL keeps no windows)
    sample_store: str = "postgresql"


@dataclass(frozen=True)
class AttributionConfig:
    enabled: bool = True
    # seconds between attribution runs in the daemon
    interval_seconds: int = 300
    # each run also re-reads jobs changed this many seconds before the last watermark,
    # so a write that committed late is never skipped
    overlap_seconds: int = 600
    # utilisation below this is idle (DCGM scrapes; the node agent applies agent.idle_threshold_percent)
    idle_threshold_percent: float = 5.0
    # a job that follows a failed job of the same user, account, partition and name within
    # this many seconds is a resubmission (retry chains)
    resubmission_window_seconds: int = 21600


@dataclass(frozen=True)
class IdleCausesConfig:
    """[idle_causes]: when an idle GPU-second is blamed on storage, network or CPUs
    (docs/idle-causes.md argues the defaults)."""

    # the job's IO pressure (PSI io "some": share of the window a task of the job stalled on
    # block IO) at or above this share of the window is storage_wait
    io_pressure_share: float = 0.10
    # or the job's block IO (read + written, its cgroup on the node) at or above this rate
    io_bytes_per_second: float = 500e6
    # a multi-node job whose node moved at least this many bytes per second over its
    # InfiniBand/RoCE ports (sent + received) while its GPU idled is network_wait
    network_bytes_per_second: float = 1e9
    # the job's CPU time at or above this share of its CPUs x window is cpu_bound ...
    cpu_saturated_share: float = 0.90
    # ... or its CPU pressure (PSI cpu "some") at or above this share of the window
    cpu_pressure_share: float = 0.50
    # checkpoints: a window in which the job wrote at least this many bytes (block IO on its
    # nodes) while its GPUs' mean utilisation fell below checkpoint_dip_percent ...
    checkpoint_write_bytes: int = 1_000_000_000
    checkpoint_dip_percent: float = 20.0
    # ... starts or continues an episode; windows this many windows apart join one episode
    checkpoint_merge_windows: int = 2
    # start-up: from the job's start until its GPUs' mean utilisation first reaches this
    startup_active_percent: float = 20.0


@dataclass(frozen=True)
class AccessConfig:
    # unix users who see everything (root always does); Slurm AdminLevel is not consulted
    admins: list[str] = field(default_factory=lambda: ["root", "slurm"])
    # unix users with the finance role: aggregates and chargeback statements, no job detail
    finance: list[str] = field(default_factory=list)
    # coordinators see their accounts' jobs: asked of `sacctmgr ... withcoord`; "" = nobody is
    # treated as a coordinator
    sacctmgr_command: str = "sacctmgr"


@dataclass(frozen=True)
class AgentConfig:
    """[agent]: the node agent `slurmtel-agent` (one per GPU node)."""

    # the agent's HTTP server (GET /v1/summaries, POST /v1/ack, GET /metrics) binds here
    listen_address: str = "0.0.0.0"
    # 9767: slurmtel-agent's default port, chosen in the Prometheus exporter range
    port: int = 9767
    # NVML is read this often (seconds)
    sample_interval_seconds: float = 1.0
    # summaries cover windows of this length, aligned to wall-clock multiples of it
    summary_window_seconds: int = 30
    # utilisation below this counts as idle (DESIGN §4)
    idle_threshold_percent: float = 5.0
    # local spool (SQLite); "" = <state_dir>/agent-spool.sqlite
    spool_path: str = ""
    # the spool evicts its oldest items beyond this many bytes of payload (and counts them)
    spool_max_bytes: int = 64 * 1024 * 1024
    # where /PID/cgroup and /PID/environ are read to map GPU processes to Slurm jobs
    proc_root: str = "/proc"
    # where class/infiniband/*/ports/*/counters and hw_counters are read (InfiniBand/RoCE
    # port counters, once per summary window)
    sysfs_root: str = "/sys"
    # where Slurm's job cgroups are read each round (v2 system.slice/slurmstepd.scope/job_*,
    # v1 <controller>/slurm/uid_*/job_*): the jobs' IO, CPU, memory peak and pressure stalls
    cgroup_root: str = "/sys/fs/cgroup"
    # the node's NFS client counters per mount, read once per summary window ("" = not read)
    mountstats_path: str = "/proc/self/mountstats"
    # a command that prints `mmpmon -p` fs_io_s lines (GPFS/Storage Scale client counters per file
    # system), run once a summary window with "fs_io_s" on its stdin ([] = not run); mmpmon needs
    # root: e.g. ["sudo", "-n", "/usr/lpp/mmfs/bin/mmpmon", "-p", "-s"] with a sudoers rule
    mmpmon_command: list[str] = field(default_factory=list)
    # the job cgroups are read this often (seconds; their counters are cumulative: a job that
    # ends loses at most this much of its last window)
    cgroup_read_seconds: float = 5.0
    # read the host side of jobs and GPUs (job cgroups, GPU throttle reasons, PCIe throughput)
    host_signals: bool = True
    # NVML samples PCIe throughput over 20 ms a call: read it every this many rounds (the
    # reading is held in between)
    pcie_sample_every: int = 5
    # node name the agent reports; "" = the short hostname
    node_name: str = ""
    # file holding the token /v1/* requests need ("Authorization: Bearer <token>"); "" = the
    # agent's own <state_dir>/agent-token, made (mode 0600) on first start
    token_file: str = ""
    # connections the HTTP server holds at once, in all and from one address (the head pulls
    # over one, Prometheus scrapes over one); one more is answered 503 and closed. The unit's
    # LimitNOFILE covers max_connections
    max_connections: int = 4096
    max_connections_per_address: int = 64
    # a request (its head and body) must have arrived this many seconds after the server began
    # to wait for it, else it is answered 408 and closed (a client that trickles holds nothing)
    request_timeout_seconds: float = 10.0


# a rate's price key -> the TRES it prices (Slurm's name); exactly one is set per rate
RATE_PRICE_KEYS = {
    "price_per_gpu_hour": "gres/gpu",
    "price_per_cpu_hour": "cpu",
    "price_per_gib_hour": "mem",
    "price_per_node_hour": "node",
}


@dataclass(frozen=True)
class ChargebackRate:
    """One [[chargeback.rates]] table: a price per hour of one TRES from a date on."""

    # Slurm partition, or "*" for any
    partition: str = "*"
    # GPU model as AllocTRES names it (gres/gpu:h100 -> "h100"), "unknown" (no model), or "*";
    # "none" for attempts without GPUs (CPU, memory and node rates)
    gpu_model: str = "*"
    # price per GPU-hour as a string, e.g. "2.50" (TOML floats are binary, money is not)
    price_per_gpu_hour: str = ""
    # "YYYY-MM-DD": applies to months whose first day is on or after it
    valid_from: str = ""
    # or: price per CPU-hour (AllocTRES cpu)
    price_per_cpu_hour: str = ""
    # or: price per GiB-hour of memory (AllocTRES mem, which Slurm counts in MB)
    price_per_gib_hour: str = ""
    # or: price per node-hour (AllocTRES node)
    price_per_node_hour: str = ""

    def prices(self) -> dict[str, str]:
        """The price keys this rate sets: exactly one in a valid config."""
        return {key: getattr(self, key) for key in RATE_PRICE_KEYS if getattr(self, key).strip()}

    def price(self) -> Decimal:
        return self.price_of(self.tres())

    def tres(self) -> str:
        """The TRES this rate prices, as Slurm names it."""
        (key,) = self.prices() or {"price_per_gpu_hour": ""}
        return RATE_PRICE_KEYS[key]

    def price_of(self, tres: str) -> Decimal:
        """The price per billed unit of TRES (GPU-, CPU-, GiB- or node-hour)."""
        key = next(k for k, t in RATE_PRICE_KEYS.items() if t == tres)
        return Decimal(getattr(self, key))

    def valid_from_date(self) -> date:
        return date.fromisoformat(self.valid_from)


@dataclass(frozen=True)
class ChargebackAccount:
    """One [[chargeback.accounts]] table: the codes a ledger needs for an account's lines."""

    # Slurm account; its sub-accounts inherit the codes they do not have themselves
    account: str = ""
    # the principal investigator the account's lines belong to (one statement per PI)
    pi: str = ""
    # the institution's cost centre, and its grant or general-ledger code
    cost_centre: str = ""
    gl_code: str = ""


# what sacctmgr's Organization and Description of an account may stand for
LEDGER_FIELDS = ("pi", "cost_centre", "gl_code")


@dataclass(frozen=True)
class ChargebackBudget:
    """One [[chargeback.budgets]] table: a budget of an account (and its sub-accounts) per period."""

    # Slurm account; the budget covers its sub-accounts too (as GrpTRESMins does)
    account: str = ""
    # "month", "quarter" or "year" (calendar periods in site.timezone)
    period: str = "month"
    # the budget in allocated GPU-hours, a decimal string ("100"); or set amount
    gpu_hours: str = ""
    # the budget in money (chargeback.currency), a decimal string ("250.00"), usage priced with the rates
    amount: str = ""
    # "YYYY-MM-DD": the budget applies to periods whose first day is on or after it; "" = always
    valid_from: str = ""


@dataclass(frozen=True)
class ChargebackConfig:
    """[chargeback]: monthly statements (`slurmtel chargeback`)."""

    # ISO 4217 code; amounts are rounded to its minor unit
    currency: str = "EUR"
    # attempts classed system_failure are waived (charged nothing)
    waive_system_failures: bool = True
    # the daemon closes the previous month on this day of the month (site.timezone); 0 = never
    close_day_of_month: int = 5
    # price Slurm's billing TRES x hours x billing_rate instead of GPU-hours x rates
    use_billing_tres: bool = False
    # price per billing-TRES-hour as a string, e.g. "0.04"; needed with use_billing_tres
    billing_rate: str = ""
    rates: list[ChargebackRate] = field(default_factory=list)
    # ledger codes per account (pi, cost_centre, gl_code); with the two keys below, sacctmgr's
    # Organization and Description fields fill in what no entry sets ("" = not used)
    accounts: list[ChargebackAccount] = field(default_factory=list)
    # which ledger field sacctmgr's Organization holds: "pi", "cost_centre", "gl_code" or ""
    sacctmgr_organization: str = ""
    # which ledger field sacctmgr's Description holds: "pi", "cost_centre", "gl_code" or ""
    sacctmgr_description: str = ""
    # who bills (`chargeback --format focus`: ProviderName, PublisherName, InvoiceIssuerName);
    # "" = "Slurm cluster <name>"
    provider_name: str = ""
    # price per kWh of Slurm's energy TRES (the joules acct_gather_energy measured per job), a
    # string ("0.25"); "" = energy is not billed
    price_per_kwh: str = ""
    # grid carbon intensity in grams CO2e per kWh ("350"): energy lines and `slurmtel job` show
    # kg CO2e; "" = not shown
    carbon_grams_per_kwh: str = ""
    budgets: list[ChargebackBudget] = field(default_factory=list)
    # accounts' GrpTRESMins gres/gpu (sacctmgr, access.sacctmgr_command) become GPU-hour
    # budgets per budget_slurm_period; a [[chargeback.budgets]] entry for the account wins
    budgets_from_slurm: bool = False
    budget_slurm_period: str = "month"


@dataclass(frozen=True)
class CostConfig:
    """[cost]: `slurmtel report cost` (docs/reports.md "report cost"). Money in chargeback.currency, as
    decimal strings ("12000.00"): TOML floats are binary, money is not."""

    # monthly costs of the whole site (every cluster slurmtel collects); "" = not set. All
    # five must be set ("0" for none) before the report runs
    compute_per_month: str = ""
    network_per_month: str = ""
    storage_per_month: str = ""
    support_per_month: str = ""
    operations_per_month: str = ""
    # the accepted unit of work: "completed_jobs", "completed_gpu_hours" (useful GPU-hours)
    # or "configured" (unit_name, units_per_month)
    unit: str = "completed_jobs"
    unit_name: str = ""
    units_per_month: str = ""
    # baselines, "" = none: a cloud price per GPU-hour; a managed-API price per unit
    baseline_price_per_gpu_hour: str = ""
    baseline_price_per_unit: str = ""
    # useful GPU-hours a month the site must deliver, "" = none (report cost --target-work wins)
    target_gpu_hours_per_month: str = ""


@dataclass(frozen=True)
class DaemonConfig:
    """[daemon]: `slurmtel run`, the head daemon."""

    # the daemon's HTTP server binds here: GET /metrics (its own Prometheus metrics) and
    # POST /v1/job-ended (the EpilogSlurmctld hook)
    listen_address: str = "0.0.0.0"
    # 9768: next to slurmtel-agent's 9767; 0 = any free port
    port: int = 9768
    # sacct runs this many seconds after the epilog hook reports a job end; ends within that
    # window share one run
    job_end_delay_seconds: float = 5.0
    # a job that failed waits its interval x 2^(failures-1), at most this long, before it runs again
    backoff_max_seconds: int = 300
    # seconds between partition maintenance and retention runs
    maintenance_interval_seconds: int = 3600
    # on SIGTERM, running jobs get this long to finish; then the daemon exits anyway
    stop_timeout_seconds: float = 5.0
    # a job running longer than this stops the systemd watchdog pings, so systemd restarts
    # the daemon (WatchdogSec= in the unit); 0 = never
    stuck_job_seconds: int = 3600
    # POST /v1/job-ended takes a MUNGE credential (api.munge_socket, api.credential_ttl_seconds)
    # of one of these users: root and slurm.conf's SlurmUser, who runs EpilogSlurmctld
    job_end_users: list[str] = field(default_factory=lambda: ["root", "slurm"])
    # ... sent from one of these addresses or networks (the slurmctld hosts); [] = any address
    job_end_peers: list[str] = field(default_factory=list)
    # or "Authorization: Bearer <token>" with the token in this file; "" = MUNGE only
    job_end_token_file: str = ""
    # POST /v1/job-ended requests a peer may make per second (bursts of twice as many); the
    # rest are answered 429 before any credential is checked
    job_end_rate_per_second: float = 100.0


API_AUTH_METHODS = ("munge", "jwt", "proxy")


@dataclass(frozen=True)
class ApiConfig:
    """[api]: the read API (`slurmtel serve`) and how it knows who asks (slurmtel.auth)."""

    # where clients (the CLI on a login node) reach the read API, e.g. "https://head01:9769"
    url: str = ""
    # the CLI refuses a plain http:// url to a host that is not this one (loopback): requests
    # and answers would cross the network unencrypted; true allows it (a trusted network)
    allow_plain_http: bool = False
    # the read API binds here
    listen_address: str = "127.0.0.1"
    # 9769: next to the daemon's 9768 and the agent's 9767
    port: int = 9769
    # TLS certificate and key (PEM) of the read API; both or neither ("" = plain HTTP)
    tls_cert_file: str = ""
    tls_key_file: str = ""
    # identity methods, tried in this order: "munge", "jwt" (Slurm's scontrol token), "proxy"
    # (a trusted reverse proxy's user header); a request with none of them is denied
    auth_methods: list[str] = field(default_factory=lambda: ["munge"])
    # munged's socket; "" = MUNGE's default (/run/munge/munge.socket.2)
    munge_socket: str = ""
    # a MUNGE credential encoded longer ago than this is refused (munged also applies its TTL)
    credential_ttl_seconds: int = 60
    # Slurm's HS256 key (jwt_hs256.key, AuthAltParameters=jwt_key=...), needed for "jwt"
    jwt_key_file: str = ""
    # addresses or networks of reverse proxies whose user header is believed, needed for "proxy"
    trusted_proxies: list[str] = field(default_factory=list)
    # the header such a proxy sets to the authenticated user name
    proxy_user_header: str = "X-Remote-User"
    # credentials remembered against replay (until the server would refuse them anyway:
    # credential_ttl_seconds plus the clock skew allowed); when full, new ones are refused
    replay_cache_entries: int = 100000
    # ... of one user at most (and at most replay_cache_entries): when a user's share is full
    # only that user is refused
    replay_cache_entries_per_user: int = 5000
    # connections the read API holds at once, in all and from one address (a login node or a
    # portal is one address for all its users); one more is answered 503 and closed. The
    # unit's LimitNOFILE covers max_connections
    max_connections: int = 4096
    max_connections_per_address: int = 1024
    # a request's head and body must have arrived this many seconds after the server began to
    # wait for it, else the connection is closed (a client that trickles holds nothing)
    request_timeout_seconds: float = 10.0
    # an idle connection between two requests is closed after this many seconds
    keep_alive_timeout_seconds: float = 5.0
    # requests being answered at once; one more is answered 503 at once (a metric counts them)
    max_requests_in_flight: int = 64
    # file holding the database URL `serve` closes months with (a role that may write
    # statements: the writer of `slurmtel db roles`); "" = the database URL it reads with
    statements_database_url_file: str = ""
    # file holding the key (hex, mode 0600) `serve` proves each request's scope with: row
    # security admits the reader's rows only by a proven scope (`slurmtel db roles
    # --scope-key-file` makes it and gives the database its copy); "" = none (a `serve` that
    # reads as the database owner needs none)
    scope_key_file: str = ""


@dataclass(frozen=True)
class FabricConfig:
    """[fabric]: `slurmtel report fabric`."""

    # a run whose average bus bandwidth is below this fraction of its baseline is flagged
    # (the baseline: the median of the earlier ok runs of the same nodes, collective, ranks,
    # data type and sizes)
    baseline_fraction: float = 0.9
    # the baseline is the median of at most this many of those earlier runs, the latest
    baseline_runs: int = 10


@dataclass(frozen=True)
class LoggingConfig:
    # DEBUG, INFO, WARNING, ERROR
    level: str = "INFO"


@dataclass(frozen=True)
class Config:
    site: SiteConfig = field(default_factory=SiteConfig)
    database: DatabaseConfig = field(default_factory=DatabaseConfig)
    sources: SourcesConfig = field(default_factory=SourcesConfig)
    outcomes: OutcomeConfig = field(default_factory=OutcomeConfig)
    telemetry: TelemetryConfig = field(default_factory=TelemetryConfig)
    attribution: AttributionConfig = field(default_factory=AttributionConfig)
    idle_causes: IdleCausesConfig = field(default_factory=IdleCausesConfig)
    access: AccessConfig = field(default_factory=AccessConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    agent: AgentConfig = field(default_factory=AgentConfig)
    chargeback: ChargebackConfig = field(default_factory=ChargebackConfig)
    daemon: DaemonConfig = field(default_factory=DaemonConfig)
    api: ApiConfig = field(default_factory=ApiConfig)
    fabric: FabricConfig = field(default_factory=FabricConfig)
    cost: CostConfig = field(default_factory=CostConfig)
    actions: ActionsConfig = field(default_factory=ActionsConfig)
    # where the config was read from (None = built-in defaults); not a TOML key
    path: Path | None = field(default=None, compare=False, metadata={"toml": False})

    @property
    def zone(self) -> ZoneInfo:
        return ZoneInfo(self.timezone_name)

    @property
    def timezone_name(self) -> str:
        """The zone reports cut days in: site.timezone, or the host's (host_timezone)."""
        return self.site.timezone or host_timezone()[0]

    def timezone_origin(self) -> str:
        """Where timezone_name comes from, for check-config."""
        return (
            "site.timezone"
            if self.site.timezone
            else f"site.timezone unset: the host's zone, {host_timezone()[1]}"
        )

    def state_dir(self) -> Path:
        if self.site.state_dir:
            return Path(self.site.state_dir)
        system = Path("/var/lib/slurmtel")
        if system.is_dir() and os.access(system, os.W_OK):
            return system
        return user_state_dir()

    def database_url(self) -> str | None:
        """The configured server URL, or None for the embedded PostgreSQL. ConfigError (one line,
        naming where the URL came from) for a URL that is not PostgreSQL's."""
        if self.database.url:
            return check_database_url(self.database.url, "database.url")
        env = os.environ.get(ENV_DATABASE_URL, "").strip()
        if env:
            return check_database_url(env, f"${ENV_DATABASE_URL}")
        if self.database.url_file:
            try:
                text = Path(self.database.url_file).read_text().strip()
            except OSError as exc:
                raise ConfigError(f"database.url_file: cannot read {self.database.url_file}: {exc}") from exc
            return check_database_url(text, f"database.url_file ({self.database.url_file})") if text else None
        return None

    def database_origin(self) -> str:
        """Why a command uses the database it uses, as messages say it: where its URL was set,
        or why it is the embedded PostgreSQL (no URL in which config file, or no file at all)."""
        where = f"in {self.path}" if self.path else f"and no config file: {NO_CONFIG_FILE}"
        if self.database.url:
            return f"database.url {where}"
        if os.environ.get(ENV_DATABASE_URL, "").strip():
            return f"${ENV_DATABASE_URL}"
        if self.database.url_file:
            return f"database.url_file {self.database.url_file} {where}"
        return f"no database.url {where}"

    def database_description(self) -> str:
        """The database a command uses and why, password masked: "PostgreSQL at postgresql://u:***@db/x
        (database.url in /etc/slurmtel/slurmtel.toml)", or "the embedded PostgreSQL under
        <state_dir>/pgdata (no database.url in ...)". For the errors that say a database is
        missing, unreachable or without its schema."""
        from slurmtel.logs import redact

        url = self.database_url()
        if url is None:
            return f"the embedded PostgreSQL under {self.state_dir() / 'pgdata'} ({self.database_origin()})"
        return f"PostgreSQL at {redact(url)} ({self.database_origin()})"

    def head_only_message(self, command: str = "") -> str:
        """What a login-node client says of a command that needs the database (COMMAND, e.g.
        "runs"; "" = this command)."""
        what = f"`slurmtel {command}`" if command else "this command"
        where = f" in {self.path}" if self.path else ""
        return (
            f"{what} runs on the head node: this is a login-node client of {self.api.url} "
            f"(api.url{where}, no database.url), which starts no database of its own"
        )

    def api_client_only(self) -> bool:
        """A login node's config: the read API is named (api.url) and no database is. Such a
        client asks `slurmtel serve`; it never starts an embedded PostgreSQL."""
        return bool(self.api.url) and self.database_url() is None


# where glibc (and so sacct and sreport) reads the host's zone when $TZ is not set
LOCALTIME = Path("/etc/localtime")


def host_timezone(environ: Mapping[str, str] | None = None, localtime: Path = LOCALTIME) -> tuple[str, str]:
    """(the IANA name of the host's time zone, where it was read) as Slurm's tools take it:
    sacct and sreport read and print times in the local zone of the process, which glibc takes
    from $TZ (a zone name, ":name" or a zoneinfo file; empty = UTC), else from /etc/localtime,
    else UTC. ConfigError when that zone has no IANA name slurmtel can use (a POSIX rule such as
    "CET-1CEST"): set site.timezone."""
    env = os.environ if environ is None else environ
    tz = env.get("TZ")
    try:
        link = os.readlink(localtime)
    except OSError:
        link = None
    return _host_timezone(tz, str(localtime), link)


# names of UTC itself: a host in one of them cuts days in "UTC", as site.timezone's old default
_UTC_NAMES = frozenset(
    {"Etc/UTC", "Etc/UCT", "Etc/Universal", "Etc/Zulu", "UCT", "Universal", "Zulu", "Etc/GMT", "GMT"}
)


@functools.lru_cache(maxsize=16)
def _host_timezone(tz: str | None, localtime: str, link: str | None) -> tuple[str, str]:
    name, origin = _host_zone_named(tz, localtime)
    return ("UTC" if name in _UTC_NAMES else name), origin


def _host_zone_named(tz: str | None, localtime: str) -> tuple[str, str]:
    if tz is not None:
        if not tz.strip():
            return "UTC", "$TZ is empty: UTC"
        name = tz[1:] if tz.startswith(":") else tz
        found = _zone_of_file(Path(name)) if name.startswith("/") else _iana(name)
        if found is None:
            raise ConfigError(
                f"site.timezone is not set and $TZ ('{tz}') names no IANA time zone slurmtel can use: "
                'set site.timezone (e.g. "Europe/Berlin")'
            )
        return found, f"$TZ={tz}"
    path = Path(localtime)
    if not path.exists():
        return "UTC", f"no $TZ and no {localtime}: UTC"
    found = _zone_of_file(path) or _iana(_read_text(Path("/etc/timezone")))
    if found is None:
        raise ConfigError(
            f"site.timezone is not set and the zone of {localtime} has no IANA name slurmtel can find: "
            'set site.timezone (e.g. "Europe/Berlin")'
        )
    return found, f"{localtime} -> {found}"


def _iana(name: str) -> str | None:
    name = name.strip()
    if not name:
        return None
    try:
        ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        return None
    return name


def _read_text(path: Path) -> str:
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError):
        return ""


def _zone_of_file(path: Path) -> str | None:
    """The IANA name of a zoneinfo file: by its path (/usr/share/zoneinfo/Europe/Berlin, a
    symlink to it), else the zone whose file has the same bytes (a copied /etc/localtime)."""
    real = path.resolve()
    parts = real.parts
    if "zoneinfo" in parts:
        tail = list(parts[len(parts) - parts[::-1].index("zoneinfo") :])
        if tail and tail[0] in ("posix", "right"):
            tail = tail[1:]
        if (name := _iana("/".join(tail))) is not None:
            return name
    try:
        content = real.read_bytes()
    except OSError:
        return None
    import zoneinfo

    for root in map(Path, zoneinfo.TZPATH):
        for candidate in sorted(root.rglob("*")) if root.is_dir() else ():
            rel = candidate.relative_to(root)
            if rel.parts[0] in ("posix", "right") or not candidate.is_file():
                continue
            same = candidate.stat().st_size == len(content) and candidate.read_bytes() == content
            if same and (name := _iana(str(rel))) is not None:
                return name
    return None


# what load_config looked for, for messages that say no config file was found
NO_CONFIG_FILE = f"none given with --config or ${ENV_CONFIG} and no {DEFAULT_CONFIG_PATH}"

# the drivers a database URL may name: libpq's schemes, and SQLAlchemy's name of psycopg 3
POSTGRESQL_SCHEMES = ("postgresql", "postgres", "postgresql+psycopg", "postgres+psycopg")


def check_database_url(url: str, origin: str) -> str:
    """URL when it is a PostgreSQL URL slurmtel connects to (psycopg 3); else ConfigError
    naming ORIGIN (the key or variable it came from), the URL with its password masked."""
    from urllib.parse import urlsplit

    from slurmtel.logs import redact

    shown = redact(url)
    scheme, sep, _ = url.partition("://")
    if not sep or scheme.lower() not in POSTGRESQL_SCHEMES:
        raise ConfigError(
            f"{origin} must be a PostgreSQL URL such as postgresql://USER@HOST/DATABASE, not '{shown}': "
            "slurmtel keeps its data in PostgreSQL only (through psycopg 3); leave it empty for the "
            "embedded PostgreSQL"
        )
    try:
        parts = urlsplit(url)
    except ValueError as exc:  # "Invalid IPv6 URL"
        raise ConfigError(f"{origin}: cannot read '{shown}': {exc}") from None
    try:
        port = parts.port
    except ValueError:
        port = 0
    if port == 0:
        raise ConfigError(f"{origin}: the port of '{shown}' must be a number from 1 to 65535")
    return url


def load_config(path: str | os.PathLike[str] | None = None) -> Config:
    """Load the config from PATH, $SLURMTEL_CONFIG or the default path; defaults if none exists."""
    explicit = path or os.environ.get(ENV_CONFIG)
    if explicit:
        file = Path(explicit)
        if not file.is_file():
            raise ConfigError(f"config file not found: {file}")
    elif DEFAULT_CONFIG_PATH.is_file():
        file = DEFAULT_CONFIG_PATH
    else:
        return _validated(Config())
    try:
        data = tomllib.loads(file.read_text())
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{file}: cannot read: {exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{file}: invalid TOML: {exc}") from exc
    config = config_from_dict(data, source=str(file))
    return _validated(dataclasses.replace(config, path=file))


def user_state_dir() -> Path:
    """The caller's own state directory: $XDG_STATE_HOME/slurmtel, else ~/.local/state/slurmtel."""
    xdg = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(xdg) / "slurmtel"


def demo_config_path() -> Path:
    """Where `slurmtel demo` leaves its config when the caller's state directory is their own."""
    return user_state_dir() / "demo" / "slurmtel.toml"


def implicit_demo_config() -> Path | None:
    """The demo's config, for a `slurmtel` command given no other: so the commands a new user
    types after `slurmtel demo` read the demo's world, and never where a real config exists.

    None (load_config's order applies) when $SLURMTEL_CONFIG is set, /etc/slurmtel/slurmtel.toml
    exists (readable or not), $SLURMTEL_DATABASE_URL names a database (the demo's config would
    pair the demo's stand-ins and clock with it), or the state directory is the system's
    (/var/lib/slurmtel: a head running on built-in defaults keeps them after a demo); else the
    demo's config in the caller's own state directory, when it is there. The agent never looks."""
    if os.environ.get(ENV_CONFIG) or DEFAULT_CONFIG_PATH.exists():
        return None
    if os.environ.get(ENV_DATABASE_URL, "").strip():
        return None
    if Config().state_dir() != user_state_dir():
        return None
    path = demo_config_path()
    return path if path.is_file() else None


def config_from_dict(data: Mapping[str, Any], source: str = "<config>") -> Config:
    config = _validated(_build(Config, data, prefix="", source=source))
    actions = data.get("actions")
    if isinstance(actions, Mapping) and actions.get("rules_file") and "rules" in actions:
        # the rules in force are the file's; the same tables beside it (what check-config
        # prints) are fine, others would be silently ignored
        inline = _build(ActionsConfig, {"rules": actions["rules"]}, prefix="actions.", source=source).rules
        if inline != config.actions.rules:
            raise ConfigError(f"{source}: set actions.rules_file or [[actions.rules]], not both")
    return config


def load_action_rules(path: str) -> list[ActionRule]:
    """The [[rules]] tables of actions.rules_file PATH (unknown keys are errors, as in the config)."""
    file = Path(path)
    try:
        data = tomllib.loads(file.read_text())
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"actions.rules_file: cannot read {file}: {exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"actions.rules_file: {file}: invalid TOML: {exc}") from exc
    unknown = sorted(set(data) - {"rules"})
    if unknown:
        raise ConfigError(f"{file}: unknown key '{unknown[0]}' (the file holds [[rules]] tables only)")
    rules = data.get("rules", [])
    if not isinstance(rules, list):
        raise ConfigError(f"{file}: 'rules' must be [[rules]] tables")
    return [_build(ActionRule, r, prefix=f"rules[{i}].", source=str(file)) for i, r in enumerate(rules)]


def iter_keys(cls: type = Config, prefix: str = "") -> Iterator[str]:
    """Every dotted key the config accepts (the docs test checks each is documented)."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if not f.metadata.get("toml", True):
            continue
        hint = hints[f.name]
        name = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(hint):
            yield from iter_keys(typing.cast(type, hint), prefix=f"{name}.")
        elif (item := _table_list_item(hint)) is not None:
            # a list of tables ([[name]]): its keys are documented as name.key
            yield from iter_keys(item, prefix=f"{name}.")
        else:
            yield name


def _table_list_item(hint: Any) -> type | None:
    """The dataclass of a list[SomeDataclass] field (a TOML array of tables), else None."""
    if typing.get_origin(hint) is list:
        (item,) = typing.get_args(hint)
        if dataclasses.is_dataclass(item):
            return typing.cast(type, item)
    return None


def _build(cls: type, data: Mapping[str, Any], prefix: str, source: str) -> Any:
    if not isinstance(data, Mapping):
        raise ConfigError(f"{source}: [{prefix.rstrip('.')}] must be a table")
    hints = typing.get_type_hints(cls)
    known = {f.name: f for f in dataclasses.fields(cls) if f.metadata.get("toml", True)}
    for key in data:
        if key not in known:
            raise ConfigError(f"{source}: unknown key '{prefix}{key}'")
    values: dict[str, Any] = {}
    for name, value in data.items():
        hint = hints[name]
        dotted = f"{prefix}{name}"
        if dataclasses.is_dataclass(hint):
            values[name] = _build(typing.cast(type, hint), value, prefix=f"{dotted}.", source=source)
        else:
            values[name] = _coerce(hint, value, dotted, source)
    return cls(**values)


def _coerce(hint: Any, value: Any, dotted: str, source: str) -> Any:
    origin = typing.get_origin(hint)
    if origin is list:
        (item,) = typing.get_args(hint)
        if not isinstance(value, list):
            raise ConfigError(f"{source}: '{dotted}' must be a list")
        if dataclasses.is_dataclass(item):
            # an array of tables: errors name the entry, e.g. 'chargeback.rates[1].pric'
            table = typing.cast(type, item)
            return [_build(table, v, prefix=f"{dotted}[{i}].", source=source) for i, v in enumerate(value)]
        return [_coerce(item, v, dotted, source) for v in value]
    if origin is dict:
        _, item = typing.get_args(hint)
        if not isinstance(value, dict):
            raise ConfigError(f"{source}: '{dotted}' must be a table")
        return {str(k): _coerce(item, v, f"{dotted}.{k}", source) for k, v in value.items()}
    if origin in (typing.Union, types.UnionType):
        for arg in typing.get_args(hint):
            try:
                return _coerce(arg, value, dotted, source)
            except ConfigError:
                continue
        raise ConfigError(f"{source}: '{dotted}' has the wrong type ({_given(value)})")
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if hint is bool and not isinstance(value, bool):
        raise ConfigError(f"{source}: '{dotted}' must be true or false")
    if hint in (str, int, float) and (not isinstance(value, hint) or isinstance(value, bool)):
        raise ConfigError(f"{source}: '{dotted}' must be {_EXPECTED[hint]}, not {_given(value)}")
    return value


# how the messages name TOML's types: "'sources.sacct.chunk_seconds' must be an integer, not a
# string ("600s")"
_EXPECTED: dict[Any, str] = {int: "an integer", float: "a number", str: "a string", bool: "true or false"}
_GIVEN: dict[type, str] = {
    bool: "true or false",
    int: "an integer",
    float: "a decimal number",
    str: "a string",
    list: "a list",
    dict: "a table",
}


def _given(value: object) -> str:
    name = _GIVEN.get(type(value), f"a {type(value).__name__}")
    if isinstance(value, str | int | float) and not isinstance(value, bool) and len(repr(value)) <= 40:
        return f"{name} ({value!r})"
    return name


def _validate_agent(agent: AgentConfig) -> None:
    if not 0 <= agent.port <= 65535:
        raise ConfigError("agent.port must be between 0 and 65535")
    if agent.sample_interval_seconds <= 0:
        raise ConfigError("agent.sample_interval_seconds must be positive")
    if agent.cgroup_read_seconds <= 0:
        raise ConfigError("agent.cgroup_read_seconds must be positive")
    if agent.pcie_sample_every < 1:
        raise ConfigError("agent.pcie_sample_every must be at least 1")
    if agent.summary_window_seconds < 2 * agent.sample_interval_seconds:
        raise ConfigError("agent.summary_window_seconds must be at least two sample intervals")
    if agent.summary_window_seconds > 3600:
        raise ConfigError(
            "agent.summary_window_seconds must be at most 3600 (a window spans at most an hour)"
        )
    if not 0 <= agent.idle_threshold_percent <= 100:
        raise ConfigError("agent.idle_threshold_percent must be between 0 and 100")
    if agent.spool_max_bytes < 65536:
        raise ConfigError("agent.spool_max_bytes must be at least 65536")
    _validate_listener(agent, "agent")


def _validate_listener(section: AgentConfig | ApiConfig, name: str) -> None:
    if section.max_connections < 1 or section.max_connections_per_address < 1:
        raise ConfigError(f"{name}.max_connections and {name}.max_connections_per_address must be 1 or more")
    if section.max_connections_per_address > section.max_connections:
        raise ConfigError(f"{name}.max_connections_per_address must be at most {name}.max_connections")
    if not 0 < section.request_timeout_seconds <= 3600:
        raise ConfigError(f"{name}.request_timeout_seconds must be between 0 and 3600")


def _decimal(text: str, key: str) -> Decimal:
    try:
        value = Decimal(text.strip())
    except InvalidOperation:
        raise ConfigError(
            f"{key} must be a decimal number in a string, e.g. \"2.50\", not '{text}'"
        ) from None
    if not value.is_finite() or value < 0:
        raise ConfigError(f"{key} must be a non-negative decimal number, not '{text}'")
    return value


def _validate_chargeback(chargeback: ChargebackConfig) -> None:
    if not re.fullmatch(r"[A-Z]{3}", chargeback.currency):
        raise ConfigError(
            f"chargeback.currency must be an ISO 4217 code such as EUR, not '{chargeback.currency}'"
        )
    if not 0 <= chargeback.close_day_of_month <= 28:
        raise ConfigError("chargeback.close_day_of_month must be between 0 (never) and 28")
    if chargeback.use_billing_tres or chargeback.billing_rate:
        if not chargeback.billing_rate:
            raise ConfigError("chargeback.billing_rate is needed with chargeback.use_billing_tres = true")
        _decimal(chargeback.billing_rate, "chargeback.billing_rate")
    _validate_ledger(chargeback)
    _validate_energy(chargeback)
    seen: dict[tuple[str, str, str, date], int] = {}
    for i, rate in enumerate(chargeback.rates):
        key = f"chargeback.rates[{i}]"
        for name in ("partition", "gpu_model", "valid_from"):
            if not getattr(rate, name).strip():
                raise ConfigError(f"{key}.{name} is required")
        prices = rate.prices()
        if len(prices) != 1:
            raise ConfigError(
                f"{key} needs exactly one of {', '.join(RATE_PRICE_KEYS)} (the TRES it prices), "
                f"not {len(prices)}"
            )
        for name, text in prices.items():
            _decimal(text, f"{key}.{name}")
        if not re.fullmatch(r"\d{4}-\d{2}-\d{2}", rate.valid_from):
            raise ConfigError(f"{key}.valid_from must be a date YYYY-MM-DD, not '{rate.valid_from}'")
        try:
            valid_from = rate.valid_from_date()
        except ValueError:
            raise ConfigError(f"{key}.valid_from is not a valid date: '{rate.valid_from}'") from None
        other = seen.setdefault((rate.tres(), rate.partition, rate.gpu_model.lower(), valid_from), i)
        if other != i:
            raise ConfigError(
                f"{key} repeats chargeback.rates[{other}] ({rate.tres()}, partition '{rate.partition}', "
                f"gpu_model '{rate.gpu_model}', valid_from {rate.valid_from})"
            )


def _validate_energy(chargeback: ChargebackConfig) -> None:
    for key in ("price_per_kwh", "carbon_grams_per_kwh"):
        value = getattr(chargeback, key)
        if value.strip():
            _decimal(value, f"chargeback.{key}")


def _validate_ledger(chargeback: ChargebackConfig) -> None:
    for key in ("sacctmgr_organization", "sacctmgr_description"):
        value = getattr(chargeback, key)
        if value and value not in LEDGER_FIELDS:
            raise ConfigError(
                f"chargeback.{key} must be one of {', '.join(LEDGER_FIELDS)} or \"\", not '{value}'"
            )
    if (
        chargeback.sacctmgr_organization
        and chargeback.sacctmgr_organization == chargeback.sacctmgr_description
    ):
        raise ConfigError(
            "chargeback.sacctmgr_organization and chargeback.sacctmgr_description name the same field "
            f"'{chargeback.sacctmgr_organization}'"
        )
    seen: dict[str, int] = {}
    for i, entry in enumerate(chargeback.accounts):
        key = f"chargeback.accounts[{i}]"
        if not entry.account.strip():
            raise ConfigError(f"{key}.account is required")
        if not any(getattr(entry, name).strip() for name in LEDGER_FIELDS):
            raise ConfigError(f"{key} sets none of {', '.join(f'{key}.{n}' for n in LEDGER_FIELDS)}")
        other = seen.setdefault(entry.account, i)
        if other != i:
            raise ConfigError(f"{key} repeats chargeback.accounts[{other}] (account '{entry.account}')")


BUDGET_PERIODS = ("month", "quarter", "year")


def _validate_budgets(chargeback: ChargebackConfig) -> None:
    if chargeback.budget_slurm_period not in BUDGET_PERIODS:
        raise ConfigError(
            "chargeback.budget_slurm_period must be 'month', 'quarter' or 'year', "
            f"not '{chargeback.budget_slurm_period}'"
        )
    seen: dict[tuple[str, str, str], int] = {}
    for i, budget in enumerate(chargeback.budgets):
        key = f"chargeback.budgets[{i}]"
        if not budget.account.strip():
            raise ConfigError(f"{key}.account is required")
        if budget.period not in BUDGET_PERIODS:
            raise ConfigError(f"{key}.period must be 'month', 'quarter' or 'year', not '{budget.period}'")
        if bool(budget.gpu_hours.strip()) == bool(budget.amount.strip()):
            raise ConfigError(f"{key}: set exactly one of {key}.gpu_hours and {key}.amount")
        if budget.gpu_hours.strip():
            _decimal(budget.gpu_hours, f"{key}.gpu_hours")
        else:
            _decimal(budget.amount, f"{key}.amount")
        if budget.valid_from:
            if not re.fullmatch(r"\d{4}-\d{2}-\d{2}", budget.valid_from):
                raise ConfigError(f"{key}.valid_from must be a date YYYY-MM-DD, not '{budget.valid_from}'")
            try:
                date.fromisoformat(budget.valid_from)
            except ValueError:
                raise ConfigError(f"{key}.valid_from is not a valid date: '{budget.valid_from}'") from None
        other = seen.setdefault((budget.account, budget.period, budget.valid_from), i)
        if other != i:
            raise ConfigError(
                f"{key} repeats chargeback.budgets[{other}] (account '{budget.account}', "
                f"period '{budget.period}', valid_from '{budget.valid_from}')"
            )


def _validate_idle_causes(causes: IdleCausesConfig) -> None:
    for name in ("io_pressure_share", "cpu_saturated_share", "cpu_pressure_share"):
        if not 0 < getattr(causes, name) <= 1:
            raise ConfigError(f"idle_causes.{name} must be a share in (0, 1]")
    for name in ("io_bytes_per_second", "network_bytes_per_second", "checkpoint_write_bytes"):
        if getattr(causes, name) <= 0:
            raise ConfigError(f"idle_causes.{name} must be positive")
    for name in ("checkpoint_dip_percent", "startup_active_percent"):
        if not 0 < getattr(causes, name) <= 100:
            raise ConfigError(f"idle_causes.{name} must be a percentage in (0, 100]")
    if causes.checkpoint_merge_windows < 1:
        raise ConfigError("idle_causes.checkpoint_merge_windows must be at least 1")


def _validate_lustre(lustre: LustreSourceConfig) -> None:
    for name in ("interval_seconds", "timeout_seconds"):
        if getattr(lustre, name) <= 0:
            raise ConfigError(f"sources.lustre.{name} must be positive")
    if not lustre.command and not lustre.path:
        raise ConfigError("sources.lustre: set command or path")
    try:
        pattern = re.compile(lustre.job_pattern)
    except re.error as exc:
        raise ConfigError(f"sources.lustre.job_pattern is not a regular expression: {exc}") from exc
    if pattern.groups < 1:
        raise ConfigError("sources.lustre.job_pattern needs a group: the job id")


def _validate_nccl(nccl: NcclSourceConfig) -> None:
    for name in ("interval_seconds", "lookback_seconds", "max_log_bytes"):
        if getattr(nccl, name) <= 0:
            raise ConfigError(f"sources.nccl.{name} must be positive")
    if nccl.wait_seconds < 0:
        raise ConfigError("sources.nccl.wait_seconds must not be negative")
    if not nccl.job_name_pattern:
        raise ConfigError("sources.nccl.job_name_pattern must not be empty (set enabled = false instead)")


_PROMQL_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_PROMQL_LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")


def _validate_prometheus(prometheus: PrometheusSourceConfig) -> None:
    key = "sources.prometheus"
    if prometheus.enabled and not prometheus.url:
        raise ConfigError(f"{key}.url is required with {key}.enabled = true")
    if prometheus.url and not re.match(r"https?://[^/?#]+", prometheus.url):
        raise ConfigError(f"{key}.url must be an http:// or https:// URL, not '{prometheus.url}'")
    if re.match(r"https?://[^/?#]*@", prometheus.url):
        # the URL is the cursor's scope and shows in run messages: no secrets in it
        raise ConfigError(f"{key}.url must not hold credentials: put a token in {key}.bearer_token_file")
    for name in ("interval_seconds", "timeout_seconds", "step_seconds", "nodes_per_query"):
        if getattr(prometheus, name) <= 0:
            raise ConfigError(f"{key}.{name} must be positive")
    if prometheus.step_seconds > 3600:
        raise ConfigError(f"{key}.step_seconds must be at most 3600 (a window spans at most an hour)")
    for name in ("delay_seconds", "initial_lookback_seconds"):
        if getattr(prometheus, name) < 0:
            raise ConfigError(f"{key}.{name} must not be negative")
    # Prometheus answers at most 11,000 points per series; the first point of a query is the
    # window before (energy)
    if not 2 <= prometheus.max_points_per_series <= 11000:
        raise ConfigError(f"{key}.max_points_per_series must be between 2 and 11000")
    if not _PROMQL_LABEL.fullmatch(prometheus.node_label):
        raise ConfigError(f"{key}.node_label is no label name: '{prometheus.node_label}'")
    if not prometheus.metrics:
        raise ConfigError(f"{key}.metrics must name at least one DCGM field")
    # the defaults are DCGM fields (tests/test_config.py): every command loads the config, and
    # `slurmtel job` on a login node should not pay for importing the DCGM parser to check them
    if prometheus.metrics == PrometheusSourceConfig().metrics:
        known = frozenset(prometheus.metrics)
    else:
        from slurmtel.parsers.dcgm import dcgm_field_names

        known = dcgm_field_names()
    for metric in prometheus.metrics:
        if metric not in known:
            raise ConfigError(
                f"{key}.metrics: '{metric}' is no DCGM field slurmtel reads (its unit would be "
                f"unknown); name the field here and its name on the server in {key}.metric_names"
            )
    for metric, name in prometheus.metric_names.items():
        if metric not in prometheus.metrics:
            raise ConfigError(f"{key}.metric_names: '{metric}' is not in {key}.metrics")
        if not _PROMQL_NAME.fullmatch(name):
            raise ConfigError(f"{key}.metric_names.{metric}: '{name}' is no metric name")


def _validate_fabric(fabric: FabricConfig) -> None:
    if not 0 < fabric.baseline_fraction <= 1:
        raise ConfigError("fabric.baseline_fraction must be in (0, 1]")
    if fabric.baseline_runs < 1:
        raise ConfigError("fabric.baseline_runs must be at least 1")


def _validate_daemon(daemon: DaemonConfig) -> None:
    if not 0 <= daemon.port <= 65535:
        raise ConfigError("daemon.port must be between 0 and 65535")
    for name in ("backoff_max_seconds", "maintenance_interval_seconds"):
        if getattr(daemon, name) <= 0:
            raise ConfigError(f"daemon.{name} must be positive")
    for name in ("job_end_delay_seconds", "stop_timeout_seconds", "stuck_job_seconds"):
        if getattr(daemon, name) < 0:
            raise ConfigError(f"daemon.{name} must not be negative")
    if daemon.job_end_rate_per_second <= 0:
        raise ConfigError("daemon.job_end_rate_per_second must be positive")
    from slurmtel.auth.proxy import parse_networks

    parse_networks(daemon.job_end_peers, "daemon.job_end_peers")


def _validate_api(api: ApiConfig) -> None:
    if not 0 <= api.port <= 65535:
        raise ConfigError("api.port must be between 0 and 65535")
    if bool(api.tls_cert_file) != bool(api.tls_key_file):
        raise ConfigError("api.tls_cert_file and api.tls_key_file go together: set both or neither")
    if not api.auth_methods:
        raise ConfigError("api.auth_methods must name at least one method (deny by default)")
    for method in api.auth_methods:
        if method not in API_AUTH_METHODS:
            raise ConfigError(f"api.auth_methods: unknown method '{method}' (known: munge, jwt, proxy)")
    if len(set(api.auth_methods)) != len(api.auth_methods):
        raise ConfigError("api.auth_methods names a method twice")
    if not 1 <= api.credential_ttl_seconds <= 3600:
        raise ConfigError("api.credential_ttl_seconds must be between 1 and 3600")
    if "jwt" in api.auth_methods and not api.jwt_key_file:
        raise ConfigError('api.jwt_key_file is required with "jwt" in api.auth_methods')
    from slurmtel.auth.proxy import parse_networks

    if "proxy" in api.auth_methods and not api.trusted_proxies:
        raise ConfigError('api.trusted_proxies is required with "proxy" in api.auth_methods')
    parse_networks(api.trusted_proxies, "api.trusted_proxies")
    if not re.fullmatch(r"[A-Za-z0-9-]+", api.proxy_user_header):
        raise ConfigError(f"api.proxy_user_header is not a header name: '{api.proxy_user_header}'")
    if api.replay_cache_entries < 1:
        raise ConfigError("api.replay_cache_entries must be at least 1")
    if api.replay_cache_entries_per_user < 1:
        raise ConfigError("api.replay_cache_entries_per_user must be at least 1")
    _validate_listener(api, "api")
    if not 0 < api.keep_alive_timeout_seconds <= 3600:
        raise ConfigError("api.keep_alive_timeout_seconds must be between 0 and 3600")
    if api.max_requests_in_flight < 1:
        raise ConfigError("api.max_requests_in_flight must be 1 or more")


COST_UNITS = ("completed_jobs", "completed_gpu_hours", "configured")
COST_MONEY_KEYS = (
    "compute_per_month",
    "network_per_month",
    "storage_per_month",
    "support_per_month",
    "operations_per_month",
)


def _validate_cost(cost: CostConfig) -> None:
    for name in (
        *COST_MONEY_KEYS,
        "units_per_month",
        "baseline_price_per_gpu_hour",
        "baseline_price_per_unit",
        "target_gpu_hours_per_month",
    ):
        if getattr(cost, name).strip():
            _decimal(getattr(cost, name), f"cost.{name}")
    if cost.unit not in COST_UNITS:
        raise ConfigError(
            f"cost.unit must be 'completed_jobs', 'completed_gpu_hours' or 'configured', not '{cost.unit}'"
        )
    if cost.unit == "configured":
        if not cost.unit_name.strip():
            raise ConfigError('cost.unit_name is required with cost.unit = "configured"')
        if not cost.units_per_month.strip():
            raise ConfigError('cost.units_per_month is required with cost.unit = "configured"')
    elif cost.unit_name.strip() or cost.units_per_month.strip():
        raise ConfigError('cost.unit_name and cost.units_per_month apply only with cost.unit = "configured"')


SAMPLE_STORES = ("postgresql", "prometheus")


def _validate_sample_store(config: Config) -> None:
    store = config.telemetry.sample_store
    if store not in SAMPLE_STORES:
        raise ConfigError(f"telemetry.sample_store must be 'postgresql' or 'prometheus', not '{store}'")
    if store == "prometheus":
        if not config.sources.prometheus.url:
            raise ConfigError(
                "telemetry.sample_store = 'prometheus' reads the windows from sources.prometheus.url: set it"
            )
        # their windows would have nowhere to go: the store keeps none
        for source in ("dcgm", "agent"):
            if getattr(config.sources, source).enabled:
                raise ConfigError(
                    f"telemetry.sample_store = 'prometheus' keeps no windows in PostgreSQL: sources.{source} "
                    "cannot be enabled with it (let the site's Prometheus scrape the GPUs)"
                )


def _validated(config: Config) -> Config:
    if config.database.url:
        check_database_url(config.database.url, "database.url")
    try:
        # unset: the host's zone, which must have an IANA name (host_timezone says why not)
        ZoneInfo(config.timezone_name)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise ConfigError(f"site.timezone: unknown time zone '{config.site.timezone}'") from exc
    from slurmtel.clock import parse_clock_setting

    parse_clock_setting(config.site.clock)
    if config.sources.sacct.format not in ("json", "parsable"):
        raise ConfigError("sources.sacct.format must be 'json' or 'parsable'")
    if config.sources.sacct.chunk_seconds < 0:
        raise ConfigError("sources.sacct.chunk_seconds must not be negative")
    if config.sources.slurmctld.job_view not in ("squeue_json", "scontrol_text"):
        raise ConfigError("sources.slurmctld.job_view must be 'squeue_json' or 'scontrol_text'")
    for source in ("sacct", "slurmctld", "dcgm", "agent"):
        for name in ("interval_seconds", "timeout_seconds"):
            if getattr(getattr(config.sources, source), name) <= 0:
                raise ConfigError(f"sources.{source}.{name} must be positive")
    _validate_nccl(config.sources.nccl)
    _validate_lustre(config.sources.lustre)
    _validate_idle_causes(config.idle_causes)
    _validate_prometheus(config.sources.prometheus)
    _validate_fabric(config.fabric)
    for source in ("dcgm", "agent"):
        if not 1 <= getattr(config.sources, source).concurrency <= 64:
            raise ConfigError(f"sources.{source}.concurrency must be between 1 and 64")
    if config.telemetry.retention_days < 1 or config.telemetry.partitions_ahead_days < 0:
        raise ConfigError("telemetry.retention_days must be >= 1 and partitions_ahead_days >= 0")
    if config.telemetry.max_future_seconds < 0:
        raise ConfigError("telemetry.max_future_seconds must not be negative")
    if config.telemetry.max_new_partitions_per_run < 1:
        raise ConfigError("telemetry.max_new_partitions_per_run must be at least 1")
    _validate_sample_store(config)
    seen: dict[str, str] = {}
    for f in dataclasses.fields(config.outcomes):
        for state in getattr(config.outcomes, f.name):
            other = seen.setdefault(state.upper(), f.name)
            if other != f.name:
                raise ConfigError(f"outcomes: state {state} is in both '{other}' and '{f.name}'")
    if config.logging.level.upper() not in ("DEBUG", "INFO", "WARNING", "ERROR"):
        raise ConfigError("logging.level must be DEBUG, INFO, WARNING or ERROR")
    _validate_agent(config.agent)
    _validate_chargeback(config.chargeback)
    _validate_budgets(config.chargeback)
    _validate_daemon(config.daemon)
    _validate_api(config.api)
    _validate_cost(config.cost)
    if config.actions.rules_file:
        rules = load_action_rules(config.actions.rules_file)
        validate_actions(config.actions, rules)
        config = dataclasses.replace(config, actions=dataclasses.replace(config.actions, rules=rules))
    else:
        validate_actions(config.actions)
    return config
