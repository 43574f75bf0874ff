"""Every column slurmtel emits, defined once (DESIGN §4 "One vocabulary").

A column is a name with its kind (the unit rule follows from the kind), its meaning, how it is
computed and the DESIGN section it comes from. Every report, view, statement, API schema, page
and dashboard takes its columns from here: a row type (slurmtel.reports.spec.row_type) refuses a
name that is not registered, the OpenAPI schema takes each column's JSON type from its kind,
docs/columns.md is generated from this module (`python -m slurmtel.columns`, tested), and
tests/test_columns.py fails when an output emits a name that is not here.

The unit rule of machine output (CSV, JSON, the API):
- every duration (GPU time included) is in seconds, its name ends in `_seconds`;
- every energy in joules (`_joules`), memory and data in bytes (`_bytes`), power in watts
  (`_watts`);
- every part of a whole is a fraction in [0, 1] named `_share`; a comparison of two figures
  (which may exceed 1) a plain quotient named `_ratio`; nothing is multiplied by 100;
- instants are ISO 8601 with their offset, named `_at`; site days `day`, `first_day`, ...;
- money is an exact decimal (a string in JSON) in the currency its row names.
A terminal table converts, in one place (`table_name`, `table_value`): seconds to hours,
bytes to GiB, joules to kWh, shares and ratios to percent, each renamed (`idle_gpu_seconds`
shows as `idle_gpu_hours`, `idle_share` as `idle_percent`). Those table names are derived, not
registered; a Grafana panel may use them too.
"""

from __future__ import annotations

import enum
import sys
from dataclasses import dataclass
from datetime import date, datetime
from decimal import Decimal
from typing import Any


class Kind(enum.Enum):
    """What a column holds; the suffix its name must end with follows from it."""

    TEXT = "text"
    INTEGER = "integer"  # a count or an ordinal
    FLAG = "flag"
    DAY = "day"  # a calendar day in the site's zone
    INSTANT = "instant"
    SECONDS = "seconds"
    BYTES = "bytes"
    JOULES = "joules"
    WATTS = "watts"
    SHARE = "share"
    RATIO = "ratio"
    MONEY = "money"
    # a quantity with its own unit in its name (GPUs on average, calendar months, GB/s, per hour)
    QUANTITY = "quantity"
    # a list of texts (nodes, job ids)
    TEXTS = "texts"


SUFFIX = {
    Kind.INSTANT: "_at",
    Kind.SECONDS: "_seconds",
    Kind.BYTES: "_bytes",
    Kind.JOULES: "_joules",
    Kind.WATTS: "_watts",
    Kind.SHARE: "_share",
    Kind.RATIO: "_ratio",
}
# the same unit in another scale, for tables: (suffix, factor, decimals)
TABLE_UNIT = {
    Kind.SECONDS: ("_hours", Decimal(1) / Decimal(3600), 4),
    Kind.BYTES: ("_gib", Decimal(1) / Decimal(2**30), 2),
    Kind.JOULES: ("_kwh", Decimal(1) / Decimal(3_600_000), 3),
    Kind.SHARE: ("_percent", Decimal(100), 1),
    Kind.RATIO: ("_percent", Decimal(100), 1),
}


@dataclass(frozen=True)
class Column:
    name: str
    kind: Kind
    meaning: str
    # how it is computed, where that is more than its meaning says
    computed: str = ""
    # the DESIGN.md section it comes from
    design: str = ""


COLUMNS: dict[str, Column] = {}


def _add(name: str, kind: Kind, meaning: str, computed: str = "", design: str = "") -> None:
    if name in COLUMNS:
        raise ValueError(f"column '{name}' is defined twice")
    suffix = SUFFIX.get(kind)
    if (
        suffix is not None
        and not name.endswith(suffix)
        and not (suffix == "_seconds" and "_seconds_" in name)
    ):
        raise ValueError(f"column '{name}' is {kind.value}: its name must end in {suffix}")
    for other, other_suffix in SUFFIX.items():
        if other is not kind and name.endswith(other_suffix) and kind is not Kind.QUANTITY:
            raise ValueError(f"column '{name}' ends in {other_suffix} but is {kind.value}")
    COLUMNS[name] = Column(name, kind, meaning, computed, design)


T, INT, F, D, AT = Kind.TEXT, Kind.INTEGER, Kind.FLAG, Kind.DAY, Kind.INSTANT
S, B, J, W, SH, R, M, Q, L = (
    Kind.SECONDS,
    Kind.BYTES,
    Kind.JOULES,
    Kind.WATTS,
    Kind.SHARE,
    Kind.RATIO,
    Kind.MONEY,
    Kind.QUANTITY,
    Kind.TEXTS,
)

OUTCOME_CLASSES = (
    "completed",
    "user_failure",
    "system_failure",
    "cancelled",
    "preempted",
    "running",
    "unknown",
)
ALLOCATED = (
    "AllocTRES gres/gpu × (end − start) of each attempt, split exactly at the window's edges "
    "(a running attempt up to now); a MIG slice counts as its fraction of the GPU"
)

# --- who, where, what ---------------------------------------------------------------------
_add("cluster", T, "the Slurm cluster (sacct's Cluster)", design="§4")
_add("account", T, "the Slurm account", design="§4")
_add("user", T, "the Slurm user", design="§4")
_add("partition", T, "the Slurm partition", design="§4")
_add("partitions", L, "the partitions a node belongs to", design="§3")
_add("node", T, "a node's name as Slurm spells it", design="§3")
_add("nodes", L, "the nodes of an attempt or a run, in Slurm's order", design="§3")
_add("hosts", L, "the host names a run's ranks reported", design="§3")
_add("name", T, "the job's name (user input: shown literally)", design="§7")
_add("job_id", T, "the job's id as sacct prints it (array and het jobs as 12_3, 12+1)", design="§4")
_add("job_id_raw", INT, "the job's numeric id in slurmdbd (JobIDRaw)", design="§4")
_add("job_ids", L, "the jobs of a resubmission chain, oldest first", design="§4")
_add("attempt", INT, "the attempt's number among the job's attempts (1 for the first)", design="§4")
_add("state", T, "the state Slurm gives (an attempt's final or current state; a node's states)", design="§4")
_add("reason", T, "the reason Slurm gives (a node's drain reason; a pending job's reason)", design="§3")
_add("outcome", T, "the outcome class of the attempt's state: " + ", ".join(OUTCOME_CLASSES), design="§4")
_add("outcomes", L, "the outcome classes of a chain's jobs, in order", design="§4")
_add("exit_code", T, "Slurm's ExitCode (code:signal) of an ended attempt; empty while it runs", design="§4")
_add(
    "gpu",
    T,
    "a GPU as nvidia-smi numbers it on its node: node/index (its UUID where the index is unknown)",
    design="§7",
)
_add("gpu_uuid", T, "the GPU's UUID (a MIG instance's MIG UUID); the key of every GPU figure", design="§3")
_add("gpu_model", T, "the GPU model (h100, a100, ...)", design="§3")
_add(
    "mapping",
    T,
    "how the GPU was tied to the job: agent (its processes), slurmctld (indices seen while it ran), exclusive (the whole node), unmapped",
    design="§6",
)
_add("driver_version", T, "the NVIDIA driver version the node's agent reported", design="§3")
_add("cuda_version", T, "the CUDA version the node's agent reported", design="§3")
_add("driver_versions", L, "the driver versions of a run's nodes", design="§3")
_add("cuda_versions", L, "the CUDA versions of a run's nodes", design="§3")
_add(
    "category",
    T,
    "the category of installed GPU time a row counts (report capacity's breakdown)",
    design="§4",
)
_add("source", T, "where a record or a budget came from (a collector source; config or slurm)", design="§3")
_add("origin", T, "the input a quarantined record came from (a file, a node, a command)", design="§9")
_add("record", T, "the key of a quarantined record, as far as it could be read", design="§9")
_add("raw", T, "the quarantined record's raw text", design="§9")
_add("mode", T, "how a collect run was started (once, daemon, input)", design="§9")
_add("status", T, "the status of a run or a statement", design="§9")
_add("error_kind", T, "the class of error that stopped a collect run", design="§9")
_add("message", T, "what a collect run said about itself", design="§9")
_add("zone", T, "the site's time zone days and months are cut in (site.timezone)", design="§4")
_add("month", T, "a calendar month in the site's zone, YYYY-MM", design="§4")
_add("period", T, "a budget's period: month, quarter or year (calendar, in the site's zone)", design="§4")
_add("covered_accounts", L, "the accounts a budget covers: the account and its sub-accounts", design="§4")
_add("currency", T, "the ISO 4217 currency of every amount on the row (chargeback.currency)", design="§4")
_add(
    "accepted_unit",
    T,
    "what report cost divides its cost by: completed_jobs, completed_gpu_hours or the configured unit",
    design="§4",
)
_add(
    "kind",
    T,
    "what a row is: a line, an adjustment or a total; a cluster, partition or account row",
    design="§7",
)
_add("label", T, "the label an acceptance run was stored with", design="§3")
_add("collective", T, "the NCCL/RCCL collective of an acceptance run (all_reduce, ...)", design="§3")
_add("nccl_version", T, "the NCCL/RCCL version an acceptance run printed", design="§3")
_add("tests_version", T, "the nccl-tests/rccl-tests version an acceptance run printed", design="§3")
_add("data_type", T, "the data type of an acceptance run (float, half, ...)", design="§3")
_add("reasons", L, "why an acceptance run was classed as it was", design="§3")
_add("device", T, "an InfiniBand/RoCE device (mlx5_0)", design="§3")
_add("link_layer", T, "a port's link layer: InfiniBand or Ethernet", design="§3")
_add("phys_state", T, "a port's physical state", design="§3")
_add("attribute", T, "what a drifted node differs in (driver, cuda, vbios, gpu_model, ...)", design="§3")
_add("value", T, "the node's value of the drifted attribute", design="§3")
_add("majority_value", T, "the value most nodes of the partition have", design="§3")
_add("advice", L, "advice lines about the job (slurmtel.reports.advice)", design="§7")
_add("figure", T, "the name of a figure in a figure/value table (its column name)", design="§7")
_add("actor", T, "who did an audited action", design="§8")
_add("action", T, "the audited action (close, void, ...)", design="§8")

# --- counts -------------------------------------------------------------------------------
_add("jobs", INT, "jobs (a job with several attempts counts once)", design="§4")
_add("attempts", INT, "attempts (each run of a job; a requeued job has several)", design="§4")
_add("requeues", INT, "requeues: attempts − 1 per job (sacct -D)", design="§4 retries")
_add(
    "resubmissions",
    INT,
    "jobs that follow a failed job of the same user, account, partition and name within the resubmission window",
    design="§4 retries",
)
_add("chains", INT, "resubmission chains", design="§4 retries")
_add("failed_attempts", INT, "attempts classed user_failure or system_failure", design="§4")
_add("failed_jobs", INT, "jobs whose last attempt is classed user_failure or system_failure", design="§4")
_add("node_fail_attempts", INT, "attempts that ended NODE_FAIL on the node", design="§4")
_add(
    "completed_jobs",
    INT,
    "jobs whose last attempt (with GPUs) ended in the window classed completed",
    design="§4 cost",
)
_add(
    "gpus", INT, "GPUs: allocated to the attempt (AllocTRES gres/gpu), or installed on the node", design="§4"
)
_add("cpus", INT, "CPUs allocated to the attempt", design="§4")
_add("users", INT, "distinct users", design="§4")
_add("gpus_requested", INT, "GPUs the pending jobs ask for", design="§4")
_add("gpus_installed_now", INT, "GPUs of the nodes in the latest controller snapshot", design="§4")
_add("gpus_available_now", INT, "of those, GPUs of nodes not down or drained", design="§4")
_add(
    "additional_gpus_needed",
    INT,
    "GPUs to add to what is installed now to meet the target (required_gpus rounded up − installed)",
    design="§1",
)
_add("required_gpus_ceil", INT, "required_gpus rounded up", design="§1")
_add(
    "queue_wait_count",
    INT,
    "attempts that started in the window (those the queue wait is taken over)",
    design="§4 queue wait",
)
_add("xid_events", INT, "XID events the node's agent reported", design="§3")
_add("ecc_single_bit_errors", INT, "single-bit ECC errors (corrected) the node's agent reported", design="§3")
_add(
    "ecc_double_bit_errors", INT, "double-bit ECC errors (uncorrected) the node's agent reported", design="§3"
)
_add("xid_codes", L, "the XID codes seen", design="§3")
_add("usage_steps", INT, "job steps whose usage (TRESUsageIn) was read: 0 or empty when none", design="§4")
_add("ranks", INT, "ranks of an acceptance run", design="§3")
_add("node_count", INT, "nodes of an acceptance run", design="§3")
_add("baseline_runs", INT, "earlier runs the baseline is taken over", design="§3")
_add("wrong_values", INT, "wrong results an acceptance run reported (#wrong)", design="§3")
_add("runs", INT, "acceptance runs", design="§3")
_add("bad_runs", INT, "acceptance runs that failed, degraded or fell below their baseline", design="§3")
_add("failed_runs", INT, "acceptance runs that failed", design="§3")
_add("degraded_runs", INT, "acceptance runs that reported wrong values or errors", design="§3")
_add("below_baseline_runs", INT, "acceptance runs below their baseline", design="§3")
_add("named_in_failures", INT, "failed acceptance runs that named the node", design="§3")
_add("failed_nccl_runs", INT, "failed acceptance runs on the node", design="§3")
_add("majority_nodes", INT, "nodes of the partition with the majority value", design="§3")
_add("partition_nodes", INT, "nodes of the partition", design="§3")
_add("port", INT, "a port number of a device", design="§3")
_add("windows", INT, "counter windows read", design="§3")
_add("errors", INT, "errors counted in the window (all error counters together)", design="§3")
_add("symbol_errors", INT, "SymbolErrorCounter delta", design="§3")
_add("receive_errors", INT, "PortRcvErrors delta", design="§3")
_add("link_downed", INT, "LinkDownedCounter delta", design="§3")
_add("link_error_recoveries", INT, "LinkErrorRecoveryCounter delta", design="§3")
_add("xmit_discards", INT, "PortXmitDiscards delta", design="§3")
_add("retransmissions", INT, "RoCE retransmissions delta", design="§3")
_add("xmit_wait_ticks", INT, "PortXmitWait delta (ticks)", design="§3")
_add("congestion_notifications", INT, "ECN/CNP congestion notifications delta", design="§3")
_add("out_of_buffer", INT, "out-of-buffer drops delta", design="§3")
_add("counter_resets", INT, "counter resets seen (a counter that went back)", design="§3")
_add("saturated_counters", INT, "counters that stopped at their maximum", design="§3")
_add("links_active_min", INT, "the fewest NVLinks active at once", design="§3")
_add("links_active_max", INT, "the most NVLinks active at once", design="§3")
_add("links_total", INT, "NVLinks of the GPU", design="§3")
_add("replay_errors", INT, "NVLink replay errors delta", design="§3")
_add("recovery_errors", INT, "NVLink recovery errors delta", design="§3")
_add("crc_errors", INT, "NVLink CRC errors delta", design="§3")
_add("ecc_errors", INT, "NVLink ECC errors delta", design="§3")
_add("error_links", INT, "NVLinks with errors", design="§3")
_add("seen", INT, "how often a quarantined record was seen", design="§9")
_add("run_id", INT, "a collect run's id", design="§9")
_add("quarantine_id", INT, "a quarantined record's id", design="§9")
_add("rows_read", INT, "records a collect run read", design="§9")
_add("rows_written", INT, "records a collect run stored", design="§9")
_add("rows_quarantined", INT, "records a collect run quarantined", design="§9")

# --- flags --------------------------------------------------------------------------------
_add("retry", F, "the attempt is a retry: a requeue or a resubmission of a failed job", design="§4 retries")
_add("driver_drift", F, "the node's driver differs from the majority of its partition", design="§3")
_add("cuda_drift", F, "the node's CUDA version differs from the majority of its partition", design="§3")
_add("below_baseline", F, "the run's bus bandwidth is below its baseline's threshold", design="§3")
_add(
    "quota",
    F,
    "the pending jobs are refused by an association or QOS limit (AssocGrp*, AssocMax*, QOSGrp*, QOSMax*)",
    design="§4 queue wait",
)
_add("so_far", F, "the figures cover a period or job still running: they will grow", design="§7")

# --- days and instants ---------------------------------------------------------------------
_add("day", D, "a calendar day in the site's zone", design="§4")
_add("first_day", D, "the first site day of the window (whole-day reports)", design="§4")
_add("last_day", D, "the last site day of the window (whole-day reports; inclusive)", design="§4")
for _name, _meaning in (
    ("submit_at", "when the attempt was submitted (Slurm resets it on each requeue)"),
    ("eligible_at", "when the attempt became eligible to start"),
    ("start_at", "when the attempt started"),
    ("end_at", "when the attempt ended; empty while it runs"),
    ("first_submit_at", "the submit time of a chain's first job"),
    ("last_end_at", "the end of a chain's last job"),
    ("observed_at", "when the controller snapshot was taken"),
    ("since_at", "since when the node has drifted"),
    ("run_at", "when an acceptance run ran"),
    ("last_bad_at", "the newest bad acceptance run on the node"),
    ("started_at", "when a collect run started"),
    ("last_seen_at", "when a quarantined record was last seen"),
    ("period_start_at", "the start of the period a row covers"),
    ("period_end_at", "the end of the period a row covers (exclusive)"),
    (
        "projected_exhaustion_at",
        "when the budget runs out at the period's burn rate so far; empty when it will not within the period",
    ),
    ("closed_at", "when the statement was closed"),
    (
        "so_far_at",
        "the instant a running job's or an open period's figures are taken to (the site clock's now)",
    ),
    ("action_at", "when the audited action happened"),
):
    _add(_name, AT, _meaning, design="§4")

# --- GPU time: seconds -------------------------------------------------------------------
_add(
    "allocated_gpu_seconds",
    S,
    "GPU time allocated to attempts in the window",
    ALLOCATED,
    "§4 allocated GPU-seconds",
)
for _outcome in OUTCOME_CLASSES:
    _add(
        f"{_outcome}_gpu_seconds",
        S,
        f"allocated GPU time of attempts classed {_outcome}",
        ALLOCATED,
        "§4 outcome classes",
    )
_add(
    "failed_gpu_seconds",
    S,
    "allocated GPU time of attempts classed user_failure or system_failure",
    ALLOCATED,
    "§4 failed GPU-hours",
)
_add(
    "retry_gpu_seconds",
    S,
    "allocated GPU time of the failed attempts in requeue and resubmission chains",
    ALLOCATED,
    "§4 retries",
)
_add(
    "covered_gpu_seconds",
    S,
    "allocated GPU time covered by telemetry samples (busy + idle)",
    "allocated − unmeasured, from the attribution rollup",
    "§4 unmeasured",
)
_add(
    "busy_gpu_seconds",
    S,
    "covered GPU time at or above the idle threshold",
    "covered − idle",
    "§4 idle GPU-seconds",
)
_add(
    "idle_gpu_seconds",
    S,
    "covered GPU time below the idle threshold, no-process time included",
    "per sample window: seconds below attribution.idle_threshold (by attribution.util_metric); "
    "equals allocated_idle + allocated_no_process of the taxonomy over the same days (before "
    "the taxonomy fits an over-allocated node-day to its capacity)",
    "§4 idle GPU-seconds",
)
_add(
    "no_process_gpu_seconds",
    S,
    "idle GPU time with no process on the GPU (of idle)",
    "the agent's no-process seconds",
    "§4 taxonomy",
)
_add(
    "unmeasured_gpu_seconds",
    S,
    "allocated GPU time no sample covers (a gap longer than 2 × the sample period)",
    design="§4 unmeasured",
)
_add(
    "unmapped_gpu_seconds", S, "allocated GPU time no GPU could be mapped to (always unmeasured)", design="§6"
)
_add(
    "installed_gpu_seconds",
    S,
    "GPU time of the installed GPUs: GPUs of the nodes in the controller snapshots × time",
    "node_state intervals × gpus_total (physical GPUs), cut at site days",
    "§4 taxonomy",
)
for _part, _meaning in (
    ("unavailable", "installed GPU time while the node was down, drained or failing"),
    ("unallocated", "installed, available GPU time allocated to no attempt"),
    ("allocated_no_process", "allocated GPU time with no process on the GPU"),
    ("allocated_idle", "allocated GPU time below the idle threshold with a process on the GPU"),
    ("active", "allocated GPU time at or above the idle threshold"),
):
    _add(
        f"{_part}_gpu_seconds",
        S,
        _meaning,
        "taxonomy part: every installed GPU-second falls in exactly one part; an over-allocated "
        "node-day's allocated parts are scaled to fit its capacity",
        "§4 taxonomy",
    )
_add(
    "capacity_unknown_gpu_seconds",
    S,
    "allocated GPU time on node-days without a controller snapshot (counted as installed)",
    design="§4 taxonomy",
)
_add(
    "useful_gpu_seconds",
    S,
    "active GPU time of attempts classed completed",
    "the taxonomy's active, of completed attempts",
    "§1 capacity",
)
_add(
    "active_failed_gpu_seconds",
    S,
    "active GPU time of attempts classed user_failure or system_failure (work thrown away)",
    design="§1 capacity",
)
_add(
    "active_other_gpu_seconds",
    S,
    "active GPU time of attempts classed cancelled, preempted, running or unknown",
    design="§1 capacity",
)
_add("category_gpu_seconds", S, "GPU time of the row's category", design="§4 taxonomy")
_add(
    "unused_gpu_seconds",
    S,
    "GPU time paid for that did no work: unallocated + allocated_no_process + allocated_idle (unallocated only on rows whose basis is installed GPUs)",
    design="§4 cost",
)
_add(
    "useful_gpu_seconds_per_gpu_month",
    S,
    "useful GPU time one installed GPU delivers in a calendar month, at the window's useful share",
    "useful / installed × the seconds of a calendar month, averaged over the window's months in the site's zone",
    "§1 required_gpus",
)
_add(
    "target_gpu_seconds_per_month",
    S,
    "useful GPU time per month the site must deliver (--target-gpu-hours, cost.target_gpu_hours_per_month)",
    design="§1 required_gpus",
)
_add(
    "waived_gpu_seconds",
    S,
    "allocated GPU time not billed: attempts classed in chargeback.waive_outcomes",
    design="§4 cost",
)
_add(
    "unpriced_gpu_seconds",
    S,
    "allocated GPU time no rate matched: billed as 0, listed for finance",
    design="§4 cost",
)
_add("budget_gpu_seconds", S, "a GPU-time budget for the period", design="§4")
_add(
    "used_gpu_seconds",
    S,
    "allocated GPU time of the budget's accounts from the period's start to the time asked",
    ALLOCATED,
    "§4",
)
_add(
    "committed_gpu_seconds",
    S,
    "GPU time the budget's running attempts will still take: GPUs × (min(start + time limit, period end) − now)",
    design="§4",
)
_add("remaining_gpu_seconds", S, "budget − used − committed (negative when over)", design="§4")
_add("burn_gpu_seconds_per_day", S, "used GPU time per elapsed day of the period", design="§4")

# --- other durations -----------------------------------------------------------------------
_add("elapsed_seconds", S, "how long the attempt ran: end (or now) − start", design="§4")
_add("queue_wait_seconds", S, "start − eligible of the attempt", design="§4 queue wait")
for _stat, _how in (("p50", "median"), ("p95", "95th percentile"), ("max", "longest"), ("mean", "mean")):
    _add(
        f"queue_wait_{_stat}_seconds",
        S,
        f"the {_how} queue wait (start − eligible) of attempts started in the window",
        design="§4 queue wait",
    )
_add(
    "oldest_pending_seconds",
    S,
    "how long the longest-waiting pending job has waited (now − eligible)",
    design="§4 queue wait",
)
_add(
    "mean_pending_seconds",
    S,
    "mean time pending of the pending jobs so far (now − eligible)",
    design="§4 queue wait",
)
_add("time_limit_seconds", S, "the attempt's time limit", design="§4")
_add("cpu_time_seconds", S, "CPU time the attempt's steps used (TotalCPU)", design="§4")
_add("measured_seconds", S, "time the counters were read over", design="§3")
_add("duration_seconds", S, "how long a collect run took", design="§9")

# --- idle GPU time by cause, checkpoints and start-up (issue 26; docs/idle-causes.md) --------
_CAUSE_HOW = (
    "each idle window's idle time beyond no-process goes to the first cause that holds, by precedence"
)
_add(
    "idle_hardware_gpu_seconds",
    S,
    "idle GPU time in windows with an XID or double-bit ECC event, or HW-slowdown clock throttling, on the GPU",
    _CAUSE_HOW,
    "§4 idle GPU-seconds by cause",
)
_add(
    "idle_storage_wait_gpu_seconds",
    S,
    "idle GPU time while the job's IO pressure or block IO on the node was over idle_causes' thresholds",
    _CAUSE_HOW,
    "§4 idle GPU-seconds by cause",
)
_add(
    "idle_network_wait_gpu_seconds",
    S,
    "idle GPU time of a multi-node job while its node's InfiniBand/RoCE ports were busy",
    _CAUSE_HOW,
    "§4 idle GPU-seconds by cause",
)
_add(
    "idle_cpu_bound_gpu_seconds",
    S,
    "idle GPU time while the job's CPUs on the node were saturated (or under CPU pressure)",
    _CAUSE_HOW,
    "§4 idle GPU-seconds by cause",
)
_add(
    "idle_unexplained_gpu_seconds",
    S,
    "idle GPU time with a process and host signals, none of which explains it",
    _CAUSE_HOW,
    "§4 idle GPU-seconds by cause",
)
_add(
    "idle_unmeasured_gpu_seconds",
    S,
    "idle GPU time with a process whose host signals (the job's cgroup on the node) are missing",
    _CAUSE_HOW,
    "§4 idle GPU-seconds by cause",
)
_add(
    "idle_cause",
    T,
    "why allocated GPUs sat idle: no_process, hardware, storage_wait, network_wait, "
    "cpu_bound, idle_unexplained or unmeasured",
    design="§4 idle GPU-seconds by cause",
)
_add("idle_cause_share", SH, "this cause's part of the idle GPU time", design="§4 idle GPU-seconds by cause")
_add(
    "checkpoint_episodes",
    INT,
    "write bursts of the job that coincide with a dip of its GPUs (an estimate)",
    "windows with at least idle_causes.checkpoint_write_bytes written on the job's nodes while its GPUs' mean "
    "utilisation is below idle_causes.checkpoint_dip_percent; windows at most checkpoint_merge_windows apart "
    "are one episode",
    "§4 checkpoint time",
)
_add(
    "checkpoint_gpu_seconds",
    S,
    "GPU time the job's GPUs sat idle during its checkpoint episodes (an estimate)",
    "idle seconds of the job's GPUs in the episodes' windows",
    "§4 checkpoint time",
)
_add(
    "checkpoint_write_bytes",
    B,
    "bytes the job wrote during its checkpoint episodes",
    design="§4 checkpoint time",
)
_add(
    "startup_seconds",
    S,
    "from the job's start until its GPUs' mean utilisation first reached idle_causes.startup_active_percent, "
    "looked for in the job's first hour (an estimate of restore and start-up time)",
    design="§4 restore/start-up time",
)
_add(
    "startup_gpu_seconds",
    S,
    "allocated GPU time of the start-up (startup_seconds × GPUs)",
    design="§4 restore/start-up time",
)
_add("startup_read_bytes", B, "bytes the job read during its start-up", design="§4 restore/start-up time")

# --- shares and ratios ---------------------------------------------------------------------
_add("idle_share", SH, "idle / covered GPU time", design="§4 idle GPU-seconds")
_add("covered_share", SH, "covered / allocated GPU time (how much telemetry saw)", design="§4 unmeasured")
_add(
    "mean_util_share",
    SH,
    "time-weighted mean GPU utilisation over covered time (attribution.util_metric)",
    design="§4 mean utilisation",
)
_add("max_util_share", SH, "the highest GPU utilisation of any sample window", design="§4")
_add("failed_share", SH, "failed / allocated GPU time", design="§4")
_add("unmapped_share", SH, "unmapped / allocated GPU time", design="§6")
for _part in ("unavailable", "unallocated", "allocated_no_process", "allocated_idle", "active", "unmeasured"):
    _add(f"{_part}_share", SH, f"{_part} / installed GPU time", design="§4 taxonomy")
_add("useful_share", SH, "useful / installed (or, for accounts, allocated) GPU time", design="§1 capacity")
_add("retry_share", SH, "retry / installed (or allocated) GPU time", design="§4 retries")
_add("unused_share", SH, "unused / the row's basis (installed, or allocated for accounts)", design="§4 cost")
_add("category_share", SH, "the row's category / installed GPU time", design="§4 taxonomy")
_add("cpu_efficiency_share", SH, "CPU time used / (CPUs × elapsed)", design="§4")
_add("mem_efficiency_share", SH, "peak host memory / requested host memory", design="§4")
_add("time_limit_used_share", SH, "elapsed / time limit", design="§4")
_add("bad_share", SH, "bad runs / runs on the node", design="§3")
_add(
    "break_even_useful_ratio",
    R,
    "the useful share at which the cluster would cost what the baseline price does (above 1: the baseline is cheaper even at full use)",
    design="§4 cost",
)
_add("busbw_ratio", R, "the run's mean bus bandwidth / its baseline's", design="§3")

# --- bytes, energy, power -----------------------------------------------------------------
_add("mem_requested_bytes", B, "host memory the attempt requested (ReqMem, per node × nodes)", design="§4")
_add(
    "mem_peak_bytes",
    B,
    "peak host memory of the attempt (the largest step's MaxRSS summed over its tasks)",
    design="§4",
)
_add("mem_peak_task_bytes", B, "the largest single task's peak host memory (MaxRSS)", design="§4")
_add("memory_used_max_bytes", B, "the most GPU memory used in any sample window", design="§4")
_add("memory_total_bytes", B, "the GPU's memory capacity", design="§3")
_add("max_size_bytes", B, "the largest message size of an acceptance run", design="§3")
_add("xmit_bytes", B, "bytes sent through the port in the window", design="§3")
_add("rcv_bytes", B, "bytes received through the port in the window", design="§3")
_add("tx_bytes", B, "bytes sent over the GPU's NVLinks in the window", design="§3")
_add("rx_bytes", B, "bytes received over the GPU's NVLinks in the window", design="§3")
_add(
    "energy_joules",
    J,
    "energy of the job's GPUs: the energy counter's delta inside the allocation (∫power dt where there is no counter)",
    design="§4 energy",
)
_add("power_mean_watts", W, "mean GPU power over covered time", design="§4")
_add("power_max_watts", W, "the highest GPU power of any sample window", design="§4")
_add("power_limit_watts", W, "the GPU's power limit", design="§3")

# --- a job's timeline (`/v1/jobs/{id}/timeline`, the job page) ------------------------------
_add("window_start_at", AT, "when a GPU's sample window starts", design="§4")
_add("window_seconds", S, "how long a GPU's sample window is", design="§4")
_add("util_share", SH, "the GPU's mean utilisation over one sample window", design="§4")
_add("memory_used_bytes", B, "the most GPU memory used in one sample window", design="§4")
_add("power_watts", W, "the GPU's mean power over one sample window", design="§4")
_add(
    "idle_gpu",
    F,
    "the GPU was idle (idle_share at or above the idle threshold) while the job held it",
    design="§4",
)
_add(
    "idle_threshold_share",
    SH,
    "the idle share from which a job's GPU counts as idle (advice, pages)",
    design="§4",
)
_add(
    "idle_gpus_now",
    INT,
    "GPUs of a running job idle now (their newest window fresh, a trailing idle run)",
    design="§4",
)
_add("idle_gpu_names", L, "the GPUs (node/index) of a running job idle now", design="§4")
_add(
    "idle_since_at",
    AT,
    "since when the job's GPUs idle now have been idle (the earliest of them; not before the job started)",
    design="§4",
)
_add(
    "idle_for_seconds",
    S,
    "how long the job's GPUs idle now have been idle, to their newest window",
    design="§4",
)
_add("event_at", AT, "when a hardware event (XID, ECC) happened on the GPU", design="§3")
_add("event_kind", T, "the kind of hardware event: xid, ecc_single_bit, ecc_double_bit", design="§3")
_add("event_value", INT, "the event's code (XID number) or count (ECC errors)", design="§3")
_add("event_detail", T, "the event's text as the source reported it", design="§3")

# --- quantities with their own unit ---------------------------------------------------------
_add(
    "average_gpus_installed",
    Q,
    "installed GPU time / the window's elapsed time: GPUs on average",
    design="§4",
)
_add(
    "required_gpus",
    Q,
    "GPUs the target needs: target_gpu_seconds_per_month / useful_gpu_seconds_per_gpu_month",
    design="§1",
)
_add(
    "calendar_months",
    Q,
    "the window in calendar months of the site's zone (a whole month is 1): what monthly costs are multiplied by",
    design="§4 cost",
)
_add("accepted_units", Q, "the window's accepted units (accepted_unit)", design="§4 cost")
_add(
    "break_even_units",
    Q,
    "accepted units at which the cluster costs what the baseline price per unit would",
    design="§4 cost",
)
_add(
    "avg_busbw_gbytes_per_second",
    Q,
    "mean bus bandwidth of an acceptance run, GB/s as nccl-tests prints it",
    design="§3",
)
_add("peak_busbw_gbytes_per_second", Q, "highest bus bandwidth of an acceptance run, GB/s", design="§3")
_add("baseline_busbw_gbytes_per_second", Q, "the baseline's bus bandwidth, GB/s", design="§3")
_add("link_rate_gbits_per_second", Q, "the port's link rate, Gb/s", design="§3")
_add("errors_per_hour", Q, "errors per hour of measured time", design="§3")
_add("retransmissions_per_hour", Q, "retransmissions per hour of measured time", design="§3")
_add("xmit_wait_ticks_per_second", Q, "PortXmitWait ticks per second of measured time", design="§3")
_add("xmit_bytes_per_second", Q, "bytes sent per second of measured time", design="§3")
_add("rcv_bytes_per_second", Q, "bytes received per second of measured time", design="§3")
_add("tx_bytes_per_second", Q, "NVLink bytes sent per second of measured time", design="§3")

# --- money --------------------------------------------------------------------------------
for _name, _meaning in (
    (
        "total_cost",
        "the cluster's cost in the window: the monthly costs × calendar_months, shared out by the row's basis",
    ),
    ("compute_cost", "cost.compute_per_month × calendar_months"),
    ("network_cost", "cost.network_per_month × calendar_months"),
    ("storage_cost", "cost.storage_per_month × calendar_months"),
    ("support_cost", "cost.support_per_month × calendar_months"),
    ("operations_cost", "cost.operations_per_month × calendar_months"),
    ("unused_cost", "the row's cost × unused_share"),
    ("retry_cost", "the row's cost × retry_share"),
    ("cost_per_unit", "the row's cost / accepted units"),
    ("cost_per_useful_gpu_hour", "the row's cost / useful GPU-hours"),
    (
        "baseline_price_per_gpu_hour",
        "the baseline's price of one GPU-hour (cost.baseline_price_per_gpu_hour)",
    ),
    ("baseline_gpu_hour_cost", "what the useful GPU-hours would cost at the baseline price"),
    ("gpu_hour_savings", "baseline_gpu_hour_cost − the row's cost"),
    ("baseline_price_per_unit", "the baseline's price of one accepted unit (cost.baseline_price_per_unit)"),
    ("baseline_unit_cost", "what the accepted units would cost at the baseline price"),
    ("unit_savings", "baseline_unit_cost − the row's cost"),
    ("budget_amount", "a money budget for the period"),
    (
        "used_amount",
        "what the budget's accounts' usage from the period's start costs, priced as chargeback prices it",
    ),
    ("committed_amount", "what the budget's running attempts will still cost"),
    ("remaining_amount", "budget − used − committed (negative when over)"),
    ("burn_amount_per_day", "used amount per elapsed day of the period"),
):
    _add(_name, M, _meaning, "Decimal, rounded once to the currency's minor unit", "§4 cost")


# --- statements (slurmtel.chargeback: DESIGN §4 cost, §7) ---------------------------------
STATEMENT = "§7 chargeback"
_add("format", T, "the name and version of a statement file's format", design=STATEMENT)
_add(
    "rounding",
    T,
    "how the statement rounds money: once per line, to the currency's minor unit, half-even",
    design=STATEMENT,
)
_add("month_start_at", AT, "the start of the statement's month in the site's zone", design=STATEMENT)
_add("month_end_at", AT, "the end of the statement's month (exclusive)", design=STATEMENT)
_add(
    "format_version",
    INT,
    "the statement format the file follows (1: closed before lines-only statements; 2: lines only, billed quantity named)",
    design=STATEMENT,
)
_add(
    "statement_number",
    INT,
    "the statement's number: closed statements are numbered in the order they were closed",
    design=STATEMENT,
)
_add(
    "statement_date",
    D,
    "the statement's date: the day it was closed (empty while the month is open)",
    design=STATEMENT,
)
_add("statement_status", T, "open (not closed yet), closed or voided", design=STATEMENT)
_add(
    "statement_sha256",
    T,
    "the checksum of the statement's lines: sha256 of its lines CSV with this column left empty",
    design=STATEMENT,
)
_add("csv_sha256", T, "sha256 of the closed statement's CSV file as stored", design=STATEMENT)
_add("json_sha256", T, "sha256 of the closed statement's JSON file as stored", design=STATEMENT)
_add("closed_by", T, "who closed the statement", design=STATEMENT)
_add("voided_at", AT, "when the statement was voided; empty when it was not", design=STATEMENT)
_add("voided_by", T, "who voided the statement", design=STATEMENT)
_add(
    "adjusted_month",
    T,
    "on an adjustment line, the closed month whose usage it corrects (YYYY-MM); empty on usage lines",
    design=STATEMENT,
)
_add(
    "cost_centre",
    T,
    "the account's cost centre ([[chargeback.accounts]], else sacctmgr's Organization or Description)",
    design=STATEMENT,
)
_add("gl_code", T, "the account's grant or general-ledger code", design=STATEMENT)
_add("pi", T, "the account's principal investigator", design=STATEMENT)
_add(
    "tres",
    T,
    "a Slurm TRES (cpu, mem, node, billing, energy, gres/gpu, gres/*, license/*)",
    design="§4 TRES usage",
)
_add(
    "allocated_tres_seconds",
    S,
    "allocated TRES × time inside the period (mem in MB, as Slurm counts it), split exactly at its edges: equal to sreport -T ALL -t seconds",
    design="§4 TRES usage",
)
_add(
    "waived_tres_seconds",
    S,
    "allocated TRES × time of lines not billed (attempts classed in chargeback.waive_outcomes)",
    design=STATEMENT,
)
_add(
    "closed_allocated_tres_seconds",
    S,
    "allocated_tres_seconds as the closed statement holds it",
    design=STATEMENT,
)
_add("now_allocated_tres_seconds", S, "allocated_tres_seconds as the data holds it now", design=STATEMENT)
_add(
    "billed_unit",
    T,
    "the unit a line is billed in and its rate is per: gpu_hour, cpu_hour, gib_hour, node_hour, billing_hour, kwh",
    design=STATEMENT,
)
_add(
    "billed_quantity",
    Q,
    "the quantity billed, in billed_unit (allocated TRES-seconds / 3600 for hours; 6 places): amount = rate × billed_quantity",
    design=STATEMENT,
)
_add("waived_quantity", Q, "the quantity not billed, in billed_unit", design=STATEMENT)
_add(
    "unpriced_quantity",
    Q,
    "the quantity no rate matched, in billed_unit: billed as 0, listed for finance",
    design=STATEMENT,
)
_add("priced", F, "a rate matched the line", design=STATEMENT)
_add("cause", T, "why a line is waived or unpriced, or an adjustment made", design=STATEMENT)
_add("line_count", INT, "statement lines summed in the row", design=STATEMENT)
_add("unpriced_line_count", INT, "of those, lines no rate matched", design=STATEMENT)
_add(
    "rollup_level",
    T,
    "what a subtotal row sums: account, parent, top, pi, cost_centre or gl_code",
    design=STATEMENT,
)
_add("rollup_account", T, "the account, PI or code a subtotal row sums", design=STATEMENT)
_add(
    "co2e_kilograms",
    Q,
    "kg CO2e of the energy billed: kWh × chargeback.carbon_grams_per_kwh / 1000",
    design="§4 cost",
)
_add(
    "gpu_energy_joules",
    J,
    "energy the GPUs of the row's attempts drew (a job's, a month's, a report cost row's): the sum of their energy_joules",
    design="§4 energy",
)
_add(
    "gpu_co2e_kilograms",
    Q,
    "kg CO2e of gpu_energy_joules at chargeback.carbon_grams_per_kwh",
    design="§4 cost",
)
for _name, _meaning in (
    ("rate", "the price of one billed_unit"),
    ("amount", "rate × billed_quantity"),
    ("waived_amount", "what the waived quantity would have cost"),
    ("billable_amount", "what is billed: amount of the lines not waived"),
    ("closed_rate", "the rate of the closed statement"),
    ("now_rate", "the rate that would apply now"),
    ("closed_billable_amount", "billable_amount as the closed statement holds it"),
    ("now_billable_amount", "billable_amount priced from the data now"),
    ("billable_amount_change", "now_billable_amount − closed_billable_amount"),
    ("cost_per_completed_job", "amount / completed_jobs"),
    ("billable_per_completed_job", "billable_amount / completed_jobs"),
    ("gpu_energy_amount", "gpu_energy_joules priced at chargeback.price_per_kwh"),
    (
        "gpu_cost_amount",
        "a job attempt's allocated GPU-hours (so far, while it runs) at the chargeback GPU rate of its partition and model",
    ),
):
    _add(_name, M, _meaning, "Decimal, rounded once to the currency's minor unit", STATEMENT)


# --- actions (slurmtel.actions: DESIGN §11) -----------------------------------------------
ACT = "§11"
_add(
    "matched_gpus",
    INT,
    "GPUs of the job in the rule's condition (idle, no process) for at least its time",
    design=ACT,
)
_add(
    "stretch_seconds",
    S,
    "how long the matched GPUs have been in the rule's condition: the shortest of their stretches",
    design=ACT,
)
_add(
    "idle_stretch_seconds",
    S,
    "how long the GPU has been idle without a break (its windows below the idle threshold, memory near zero)",
    design=ACT,
)
_add("no_process_stretch_seconds", S, "how long the GPU has had no process without a break", design=ACT)
_add(
    "idle_stretch_util_max_share",
    SH,
    "the highest utilisation of any window of the GPU's idle stretch",
    design=ACT,
)
_add(
    "idle_stretch_memory_used_max_bytes",
    B,
    "the most GPU memory used in any window of the GPU's idle stretch",
    design=ACT,
)
_add(
    "cost_so_far_amount",
    M,
    "what the job's allocation costs so far at the statement's rates",
    "Decimal, rounded once",
    ACT,
)
_add("failed_attempts_share", SH, "failed_attempts / attempts on the node", design=ACT)
_add("budget_used_share", SH, "used / budget of the period so far", design=ACT)
_add(
    "total_billable_amount",
    M,
    "an account's billable amount on a statement: the sum of its lines",
    "Decimal, rounded once",
    ACT,
)
_add("subjects", INT, "jobs (nodes, accounts) a rule would have acted on at once", design=ACT)
_add(
    "max_jobs_per_run",
    INT,
    "the most jobs a rule acts on in one evaluation ([[actions.rules]] max_jobs_per_run)",
    design=ACT,
)


# --- the API -------------------------------------------------------------------------------


def column(name: str) -> Column:
    """NAME's definition; ValueError for a name that is not registered."""
    try:
        return COLUMNS[name]
    except KeyError:
        raise ValueError(f"column '{name}' is not registered in slurmtel.columns") from None


def python_type(name: str) -> Any:
    """The type a row field named NAME holds."""
    kind = column(name).kind
    if kind in (Kind.TEXT,):
        return str | None
    if kind is Kind.TEXTS:
        return tuple[str, ...] | list[str] | str | None
    if kind is Kind.INTEGER:
        return int | None
    if kind is Kind.FLAG:
        return bool | None
    if kind is Kind.DAY:
        return date | None
    if kind is Kind.INSTANT:
        return datetime | None
    return Decimal | float | int | None


def json_schema(name: str) -> dict[str, Any]:
    """NAME's JSON schema (the OpenAPI document's): exact numbers are strings in JSON."""
    col = column(name)
    kind = col.kind
    if kind is Kind.TEXT:
        schema: dict[str, Any] = {"type": ["string", "null"]}
    elif kind is Kind.TEXTS:
        schema = {"type": ["array", "null"], "items": {"type": "string"}}
    elif kind is Kind.INTEGER:
        schema = {"type": ["integer", "null"]}
    elif kind is Kind.FLAG:
        schema = {"type": ["boolean", "null"]}
    elif kind is Kind.DAY:
        schema = {"type": ["string", "null"], "format": "date"}
    elif kind is Kind.INSTANT:
        schema = {"type": ["string", "null"], "format": "date-time"}
    elif kind is Kind.MONEY:
        schema = {"type": ["string", "null"], "format": "decimal"}
    else:
        # an exact decimal travels as a string, a float as a number
        schema = {"type": ["number", "string", "null"]}
    schema["description"] = col.meaning + (f" ({unit_text(col)})" if unit_text(col) else "")
    return schema


def unit_text(col: Column) -> str:
    return {
        Kind.SECONDS: "seconds",
        Kind.BYTES: "bytes",
        Kind.JOULES: "joules",
        Kind.WATTS: "watts",
        Kind.SHARE: "fraction 0-1",
        Kind.RATIO: "quotient",
        Kind.MONEY: "money in the row's currency",
        Kind.INSTANT: "ISO 8601 instant",
        Kind.DAY: "site day",
    }.get(col.kind, "")


# --- tables -------------------------------------------------------------------------------


def decode_value(column: str, value: Any) -> Any:
    """A value as JSON carried it (exact decimals and instants as text) back as the type its
    registered column holds (COLUMNS): what the API sent prints exactly as the store's own value."""
    if not isinstance(value, str):
        return value
    col = COLUMNS.get(column)
    if col is None or col.kind in (Kind.TEXT, Kind.TEXTS):
        return value
    if col.kind is Kind.INSTANT:
        return datetime.fromisoformat(value)
    if col.kind is Kind.DAY:
        return date.fromisoformat(value)
    try:
        return Decimal(value)
    except ArithmeticError:
        return value


def table_name(name: str) -> str:
    """NAME as a terminal table shows it: seconds as hours, bytes as GiB, joules as kWh,
    shares and ratios as percent (`idle_gpu_seconds` -> `idle_gpu_hours`); other names as
    they are. Unregistered names are kept (a table's own helper column)."""
    col = COLUMNS.get(name)
    if col is None or col.kind not in TABLE_UNIT:
        return name
    suffix = TABLE_UNIT[col.kind][0]
    if col.kind is Kind.SECONDS:
        return "_".join("hours" if w == "seconds" else w for w in name.split("_"))
    return name[: -len(SUFFIX[col.kind])] + suffix


def table_value(name: str, value: Any) -> Any:
    """VALUE of column NAME in its table unit (rounded for reading: 4 decimals of hours, 2 of
    GiB, 3 of kWh, 1 of percent)."""
    col = COLUMNS.get(name)
    if col is None or col.kind not in TABLE_UNIT or value is None or isinstance(value, bool):
        return value
    if not isinstance(value, int | float | Decimal):
        return value
    _, factor, decimals = TABLE_UNIT[col.kind]
    return round(float(Decimal(str(value)) * factor), decimals)


def table_names() -> dict[str, str]:
    """Every derived table name -> the registered column it shows."""
    return {table_name(n): n for n in COLUMNS if table_name(n) != n}


# --- docs/columns.md ------------------------------------------------------------------------


def markdown() -> str:
    """docs/columns.md: every column, its unit, table name, meaning, computation and §."""
    lines = [
        "# Columns",
        "",
        "Every column any slurmtel output emits (reports, `job`, `me`, statements, budgets, cost,",
        "fabric, runs, the API's schemas, the Grafana dashboards), generated from",
        "`slurmtel/columns.py` by `python -m slurmtel.columns > docs/columns.md` (a test checks it",
        "is current). A name means the same thing wherever it appears.",
        "",
        "Machine output (CSV, JSON, the API) gives every duration in seconds (GPU time too),",
        "energy in joules, memory and data in bytes, power in watts, parts of a whole as fractions",
        "in [0, 1] (`_share`), comparisons as plain quotients (`_ratio`), instants as ISO 8601 with",
        "their offset (`_at`), money as exact decimals (strings in JSON) in the row's `currency`.",
        "A terminal table shows seconds as hours, bytes as GiB, joules as kWh and shares and",
        "ratios as percent, renamed (the *table* column below).",
        "",
        "| column | unit | table | meaning | computed | DESIGN |",
        "|---|---|---|---|---|---|",
    ]
    for name in sorted(COLUMNS):
        col = COLUMNS[name]
        shown = table_name(name)
        unit = unit_text(col) or col.kind.value
        lines.append(
            f"| `{name}` | {unit} | {'`' + shown + '`' if shown != name else ''} | {col.meaning} | "
            f"{col.computed} | {col.design} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.stdout.write(markdown())
