"""Typed records passed between the layers: parsers produce them, the store writes them.

Frozen dataclasses; datetimes are aware UTC; units are in the names (`_seconds`, `_bytes`,
`_watts`, `_joules`, `_percent`, `_at`). A GPU is identified by its UUID (a MIG instance by
its MIG UUID) everywhere.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any


@dataclass(frozen=True, slots=True)
class JobAttempt:
    """One run of a job: one allocation record of `sacct -D` (steps are not attempts).

    Natural key: (cluster, job_id_raw, submit_at). Slurm resets the submit time on requeue,
    and job ids are reused after a controller state wipe, so each attempt has its own key.
    """

    cluster: str
    job_id_raw: int
    submit_at: datetime
    # the id users see: "2", "10_4", "123+1"
    job_id: str
    name: str
    user: str
    account: str
    partition: str
    # base state without decorations: "CANCELLED" for "CANCELLED by 0", "RUNNING", "FOO" ...
    state: str
    eligible_at: datetime | None
    start_at: datetime | None
    end_at: datetime | None
    alloc_gpus: int
    # AllocTRES as a name -> count map, e.g. {"cpu": 2, "gres/gpu": 2, "gres/gpu:h100": 2}
    alloc_tres: dict[str, int] = field(default_factory=dict, hash=False)
    req_tres: dict[str, int] = field(default_factory=dict, hash=False)
    alloc_cpus: int = 0
    qos: str = ""
    wckey: str = ""
    # the GPU type when the allocation names exactly one ("h100"), else ""
    gpu_model: str = ""
    array_job_id: int | None = None
    array_task_id: int | None = None
    het_job_id: int | None = None
    het_job_offset: int | None = None
    # slurmdbd's job_db_inx, exact attempt identity where sacct -P shows it
    db_index: int | None = None
    # "1:0", "0:15"; "" when Slurm shows none
    exit_code: str = ""
    state_reason: str = ""
    time_limit_seconds: int | None = None
    nodelist: str = ""
    nodes: tuple[str, ...] = ()
    uid: int | None = None
    work_dir: str = ""
    submit_line: str = ""
    # the batch script's StdOut file as Slurm expanded it (sacct JSON stdout_expanded, 24.05+);
    # "" when sacct does not say
    stdout_path: str = ""
    # the --output pattern as given ("slurm-%j.out", relative to work_dir); "" when not known
    stdout_pattern: str = ""
    # what the attempt's steps used (sacct without -X); None when no step was read.
    # TotalCPU (user + system) summed over the steps
    cpu_time_seconds: float | None = None
    # the largest task's peak RSS in any step (MaxRSS, TRESUsageInMax mem)
    mem_peak_task_bytes: int | None = None
    # the largest step's peak RSS over all its tasks and nodes (TRESUsageInTot mem)
    mem_peak_step_bytes: int | None = None
    # how many steps the usage figures come from
    usage_steps: int | None = None


@dataclass(frozen=True, slots=True)
class Rejected:
    """A record a parser could not accept. Stored in the quarantine table with its reason."""

    source: str
    # the file or command it came from
    origin: str
    # what identifies it, as far as it could be read ("job 123", "line 17")
    record_key: str
    reason: str
    raw: str


# the newest Slurm JSON schema (sacct --json, squeue --json, scontrol show nodes --json) whose
# shape slurmtel knows (Slurm 25.11); a newer one is read by this shape, with a SchemaNotice
NEWEST_KNOWN_SCHEMA = "data_parser/v0.0.44"


@dataclass(frozen=True, slots=True)
class SchemaNotice:
    """A document in a schema version slurmtel does not know, read all the same by the newest
    shape it knows (a Slurm upgrade must not stop ingestion). Sources log it and count it in
    the daemon's slurmtel_schema_unknown_total metric."""

    source: str
    origin: str
    # what the document says it is ("data_parser/v0.0.45"), as it says it
    schema: str
    # how it was read ("data_parser/v0.0.44")
    read_as: str


@dataclass(frozen=True, slots=True)
class GpuInventory:
    """One GPU (or MIG instance) of a node, as the node agent or DCGM sees it."""

    node: str
    gpu_uuid: str
    index: int
    model: str
    observed_at: datetime
    memory_total_bytes: int | None = None
    minor_number: int | None = None
    pci_bus_id: str = ""
    driver_version: str = ""
    cuda_version: str = ""
    vbios_version: str = ""
    # "enabled", "disabled" or "" (not supported)
    mig_mode: str = ""
    # a MIG instance's parent GPU UUID; "" for a whole GPU
    parent_gpu_uuid: str = ""
    mig_profile: str = ""
    # share of the parent GPU a MIG instance represents (slices / 7, or SM share); 1.0 for a GPU
    gpu_fraction: float = 1.0
    # the power cap NVML enforces (W; nvidia-smi's Current/Enforced Power Limit); None = unknown
    # (a MIG instance, an agent or capture from before it was read)
    power_limit_watts: float | None = None


@dataclass(frozen=True, slots=True)
class GpuSummary:
    """What one GPU did during one window (default 30 s).

    Produced by the node agent from ~1 s NVML samples, or by the dcgm source from scrapes.
    Natural key: (source, gpu_uuid, window_start_at).
    """

    source: str
    node: str
    gpu_uuid: str
    window_start_at: datetime
    window_seconds: float
    # which utilisation metric the numbers are: "gr_engine_active", "sm_active" or "gpu_util"
    util_metric: str
    sample_count: int
    # seconds inside the window that samples cover (gaps > 2 sample periods are not covered)
    covered_seconds: float
    util_mean_percent: float | None
    util_max_percent: float | None
    # covered seconds with utilisation below the idle threshold
    idle_seconds: float
    # covered seconds with no process on the GPU (None when the source cannot tell)
    no_process_seconds: float | None
    memory_used_mean_bytes: int | None = None
    memory_used_max_bytes: int | None = None
    memory_total_bytes: int | None = None
    power_mean_watts: float | None = None
    energy_joules: float | None = None
    # "counter" (total-energy counter delta) or "power_integral"
    energy_method: str = ""
    temperature_max_celsius: float | None = None
    sm_clock_max_mhz: float | None = None
    # Slurm job ids seen on the GPU (processes' cgroup or environment, DCGM hpc_job label)
    job_ids: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class GpuEvent:
    """An XID or ECC event on one GPU."""

    node: str
    gpu_uuid: str
    at: datetime
    # "xid", "ecc_single_bit", "ecc_double_bit"
    kind: str
    value: int
    detail: str = ""


@dataclass(frozen=True, slots=True)
class GpuAllocation:
    """One GPU held by one running job on one node, as the controller shows it (IDX)."""

    cluster: str
    job_id_raw: int
    submit_at: datetime
    node: str
    gpu_index: int
    observed_at: datetime
    gpu_model: str = ""
    # filled in from the node's inventory at observed_at; "" when no inventory is known
    gpu_uuid: str = ""


@dataclass(frozen=True, slots=True)
class NodeState:
    """A node's GPU capacity and state at one moment (scontrol show node / sinfo --json)."""

    cluster: str
    node: str
    observed_at: datetime
    # Slurm's state words, e.g. ("IDLE",), ("MIXED",), ("DOWN", "DRAIN")
    states: tuple[str, ...]
    gpus_total: int
    gpus_allocated: int
    partitions: tuple[str, ...] = ()
    gpu_model: str = ""
    reason: str = ""


@dataclass(frozen=True, slots=True)
class PendingJob:
    """A job waiting in the queue at one moment, with the reason Slurm gives."""

    cluster: str
    job_id_raw: int
    job_id: str
    submit_at: datetime
    observed_at: datetime
    user: str
    account: str
    partition: str
    reason: str
    gpus_requested: int = 0
    eligible_at: datetime | None = None


# --------------------------------------------------------------------------- fabric and node plane


@dataclass(frozen=True, slots=True)
class NcclRank:
    """One `# Rank N ... on HOST device D [PCI] MODEL` line of an nccl-tests / rccl-tests log."""

    rank: int
    host: str
    device: int
    # the id as printed: "0x35" (bus only, old versions), "0000:04:00", "0000:05:00.0"
    pci_id: str
    # NVML's form "00000000:04:00.0" when the print has a domain, else ""
    pci_bus_id: str = ""
    # "" when the line names none (rccl-tests on MI355X)
    gpu_model: str = ""
    pid: int | None = None
    group: int | None = None


@dataclass(frozen=True, slots=True)
class NcclSizeResult:
    """One message size of an nccl-tests table: out-of-place and in-place measurements.

    Bandwidths are GB/s (10^9 bytes/s) as nccl-tests prints them. `*_wrong` is the `#wrong`
    column (values that differ from the expected result); older versions print `error` (the
    largest relative error) instead, kept in `*_error`. None where the log shows N/A or has no
    such column.
    """

    size_bytes: int
    count_elements: int
    data_type: str
    # reduction ("sum", "none"); "" where the collective has none
    redop: str = ""
    root: int | None = None
    out_of_place_time_microseconds: float | None = None
    out_of_place_algbw_gbps: float | None = None
    out_of_place_busbw_gbps: float | None = None
    out_of_place_wrong: int | None = None
    out_of_place_error: float | None = None
    in_place_time_microseconds: float | None = None
    in_place_algbw_gbps: float | None = None
    in_place_busbw_gbps: float | None = None
    in_place_wrong: int | None = None
    in_place_error: float | None = None


@dataclass(frozen=True, slots=True)
class NcclRun:
    """One nccl-tests / rccl-tests run read from a log (a log can hold several runs).

    `status`: "ok"; "degraded" when the results are incomplete or cannot be trusted to be
    complete (no footer, a cut-off or unreadable table row, fewer sizes than the header asked
    for); "failed" when data was wrong (`#wrong` > 0, out-of-bounds values FAILED), a rank
    failed (NCCL/CUDA failure, an MPI or srun abort), or no size was measured. `reasons` says
    why, one line each.
    """

    # position of the run in its log, from 0
    index: int
    # "nccl-tests" or "rccl-tests"
    tool: str
    # "all_reduce", "all_gather", "alltoall", "broadcast", "reduce", "reduce_scatter",
    # "sendrecv", ...; "" when the log does not say and the table does not tell
    collective: str
    # where the collective came from: "log" (the test names itself or its command line),
    # "table" (inferred from the columns and busbw/algbw), ""
    collective_source: str
    status: str
    reasons: tuple[str, ...]
    tests_version: str = ""
    # NCCL or RCCL library version, "2.26.2"
    nccl_version: str = ""
    # "nccl" or "rccl"
    library: str = ""
    ranks: int | None = None
    # hosts in rank order, each once
    hosts: tuple[str, ...] = ()
    gpu_model: str = ""
    rank_devices: tuple[NcclRank, ...] = ()
    results: tuple[NcclSizeResult, ...] = ()
    # the footer's "Avg bus bandwidth", else the mean busbw of the rows (avg_busbw_source)
    avg_busbw_gbps: float | None = None
    # "footer", "computed" or "" (no rows)
    avg_busbw_source: str = ""
    # largest out-of-place busbw over the sizes
    peak_busbw_gbps: float | None = None
    # Σ #wrong over sizes and both placements (0 where the log has no #wrong column)
    wrong_values: int = 0
    # the footer's "Out of bounds values : N"
    out_of_bounds_values: int | None = None
    footer_seen: bool = False
    # hosts that reported a failure (NCCL/CUDA failure lines, mpirun/srun abort lines)
    failed_hosts: tuple[str, ...] = ()
    # header: "validation: 1"; None when the log has no header
    validation: bool | None = None
    threads: int | None = None
    gpus_per_process: int | None = None
    min_bytes: int | None = None
    max_bytes: int | None = None
    iterations: int | None = None
    warmup_iterations: int | None = None


@dataclass(frozen=True, slots=True)
class PortCounters:
    """What one InfiniBand / RoCE port counted during one window: the increase of each sysfs
    counter (`ports/N/counters/*`, `ports/N/hw_counters/*`) between two reads.

    Names are the kernel's: port_xmit_data / port_rcv_data count 4-byte words, port_xmit_wait
    ticks with data to send and no credit (congestion), the *_errors, link_downed,
    link_error_recovery, symbol_error ... events. Natural key: (node, device, port,
    window_start_at).
    """

    node: str
    # "mlx5_0"
    device: str
    port: int
    window_start_at: datetime
    window_seconds: float
    # "InfiniBand" or "Ethernet" (RoCE)
    link_layer: str = ""
    # "ACTIVE", "DOWN", ... and "LinkUp", "Disabled", ... at the end of the window
    state: str = ""
    phys_state: str = ""
    rate_gbps: float | None = None
    # counter -> increase during the window (a counter that cannot be read is absent)
    deltas: dict[str, int] = field(default_factory=dict, hash=False)
    # counters that went back (cleared, driver reload): their increase counts from zero
    resets: tuple[str, ...] = ()
    # counters pinned at their maximum (IB error counters saturate): the increase is a floor
    saturated: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class NvlinkCounters:
    """What one GPU's NVLinks did during one window (NVML counters, increases between reads)."""

    node: str
    gpu_uuid: str
    window_start_at: datetime
    window_seconds: float
    links_active: int
    # links NVML reports on the GPU, active or not
    links_total: int
    # payload bytes sent and received over all links (None where NVML has no counter)
    tx_bytes: int | None = None
    rx_bytes: int | None = None
    # error counter -> increase over all links: "replay", "recovery", "crc_flit", "crc_data", "ecc_data"
    errors: dict[str, int] = field(default_factory=dict, hash=False)
    # "LINK:counter" -> increase, for the links and counters that grew
    link_errors: dict[str, int] = field(default_factory=dict, hash=False)
    # counters that went back during the window
    resets: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class NodeTopology:
    """A node's GPU topology: how each pair of GPUs (and NICs) is connected.

    `links` are "A-B:KIND" for every unordered pair of devices, KIND as `nvidia-smi topo -m`
    words it: NV<n> (n bonded NVLinks), PIX, PXB, PHB, NODE, SYS. `summary` says the same in
    words, GPU pairs only (what drift compares across nodes).
    """

    node: str
    observed_at: datetime
    # "nvml" (the agent) or "topo-matrix" (a saved `nvidia-smi topo -m`)
    source: str
    # "GPU0", "GPU1", ..., "NIC0", ...
    devices: tuple[str, ...]
    links: tuple[str, ...]
    summary: str
    # per GPU, in order: its UUID ("" where not known), CPU and NUMA affinity as printed
    gpu_uuids: tuple[str, ...] = ()
    cpu_affinity: tuple[str, ...] = ()
    numa_affinity: tuple[str, ...] = ()
    # per NIC, in order: its device name ("mlx5_0") where the legend names it
    nic_names: tuple[str, ...] = ()
    # peer-to-peer reads per ordered GPU pair (NVML): "GPU0-GPU1:ok", "GPU0-GPU2:not_supported"
    p2p: tuple[str, ...] = ()


# --- the one table of field types -----------------------------------------------------------
#
# What a parser builds from a JSON document can hold any JSON type anywhere: a cluster that is an
# object, a name that is a list. Before a record is hashed (deduplicated by its key) or stored,
# its fields are checked against the types its dataclass declares: this table, read from the
# annotations above, is the only statement of them (the agent's pages are decoded against the
# same annotations by msgspec). A record whose field is of another type is rejected by the
# parser with the field named; a NUL in text (PostgreSQL text cannot hold one) becomes U+FFFD,
# so the record keeps what it counts.

_FieldCheck = Callable[[Any], "tuple[str, Any] | None"]
_CHECKERS: dict[type, _FieldCheck] = {}
_TEXT_FIELDS: dict[type, tuple[str, ...]] = {}


def _type_test(hint: Any, value: str) -> str:
    """A Python expression true when VALUE (a name) is not of HINT."""
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        nullable = type(None) in args
        inner = [a for a in args if a is not type(None)]
        (only,) = inner
        test = _type_test(only, value)
        return f"({value} is not None and {test})" if nullable else test
    if hint is float:
        return f"(type({value}) is not float and type({value}) is not int)"
    if hint in (str, int, bool, datetime):
        return f"type({value}) is not {hint.__name__}"
    if origin is tuple:
        return f"(type({value}) is not tuple or not _TYPES({value}) <= _STR)"
    if origin is dict:
        key, item = args
        return (
            f"(type({value}) is not dict or not _TYPES({value}) <= {{{key.__name__}}} "
            f"or not _TYPES({value}.values()) <= {{{item.__name__}}})"
        )
    raise TypeError(f"no type check for {hint!r}")


def _checker(cls: type) -> _FieldCheck:
    checker = _CHECKERS.get(cls)
    if checker is not None:
        return checker
    hints = typing.get_type_hints(cls)
    body = ["def check(r):", "    nul = False"]
    for f in dataclasses.fields(cls):
        body.append(f"    v = r.{f.name}")
        body.append(f"    if {_type_test(hints[f.name], 'v')}:")
        body.append(f"        return {f.name!r}, v")
        if hints[f.name] is str:
            body.append("    if '\\x00' in v:")
            body.append("        nul = True")
    body.append("    return ('', None) if nul else None")
    namespace: dict[str, Any] = {"datetime": datetime, "_STR": {str}, "_TYPES": lambda v: set(map(type, v))}
    exec("\n".join(body), namespace)  # one straight-line check per field: the hot path of a bulk parse
    checker = namespace["check"]
    _CHECKERS[cls] = checker
    _TEXT_FIELDS[cls] = tuple(f.name for f in dataclasses.fields(cls) if hints[f.name] is str)
    return checker


def _expected(hint: Any) -> str:
    """How a reason names what a field holds ("text", "an integer"), as slurmtel.store.checks does."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        (hint,) = args
        args = list(typing.get_args(hint))
    origin = typing.get_origin(hint)
    if origin is tuple:
        return "a list of text"
    if origin is dict:
        return "a map of names to integers"
    return {str: "text", int: "an integer", float: "a number", bool: "true or false", datetime: "a time"}.get(
        hint, getattr(hint, "__name__", str(hint))
    )


def type_problem(record: Any) -> tuple[Any, str | None]:
    """RECORD checked against its declared field types: (RECORD, None) when every field is of its
    type (NUL in its text replaced by U+FFFD), else (RECORD, why not), naming the field."""
    found = _checker(type(record))(record)
    if found is None:
        return record, None
    name, value = found
    if name:
        shown = repr(value)
        shown = shown if len(shown) <= 60 else shown[:57] + "..."
        hint = typing.get_type_hints(type(record))[name]
        return record, f"{name} is {type(value).__name__} {shown}, not {_expected(hint)}"
    with_nul = [n for n in _TEXT_FIELDS[type(record)] if "\x00" in getattr(record, n)]
    return dataclasses.replace(
        record, **{n: getattr(record, n).replace("\x00", "\ufffd") for n in with_nul}
    ), None


# ------------------------------------------------------------------ storage and host side (issue 26)
# Every figure a node or filesystem does not give is None ("not measured"), never 0.


@dataclass(frozen=True, slots=True)
class IoDeviceCounters:
    """One block device's line of a cgroup's io.stat (v2) or blkio.throttle.* (v1): counters
    since the cgroup was created."""

    # "MAJ:MIN"
    device: str
    read_bytes: int | None = None
    write_bytes: int | None = None
    read_ops: int | None = None
    write_ops: int | None = None
    discard_bytes: int | None = None
    discard_ops: int | None = None


@dataclass(frozen=True, slots=True)
class CpuUsage:
    """cpu.stat (v2, microseconds) or cpuacct.usage (v1, nanoseconds), in seconds."""

    usage_seconds: float | None = None
    user_seconds: float | None = None
    system_seconds: float | None = None
    throttled_seconds: float | None = None
    throttled_periods: int | None = None


@dataclass(frozen=True, slots=True)
class PressureStall:
    """A PSI file (io.pressure, cpu.pressure, memory.pressure, /proc/pressure/*).

    `some`: share of time at least one task stalled on the resource; `full`: all non-idle
    tasks stalled at once. Totals are cumulative stall time; avg10 is the kernel's 10 s
    running average as a share 0..1. `full` is None where the kernel prints no such line
    (cpu before 5.13).
    """

    resource: str
    some_total_seconds: float
    some_avg10_share: float
    full_total_seconds: float | None = None
    full_avg10_share: float | None = None


@dataclass(frozen=True, slots=True)
class JobCgroupReading:
    """One read of a Slurm job's cgroup on one node: cumulative counters at one moment."""

    job_id: str
    # 1 or 2
    cgroup_version: int
    read_bytes: int | None = None
    write_bytes: int | None = None
    read_ops: int | None = None
    write_ops: int | None = None
    cpu_usage_seconds: float | None = None
    # CPUs the job may use on this node (cpuset.cpus.effective)
    cpus: int | None = None
    memory_peak_bytes: int | None = None
    io_some_stall_seconds: float | None = None
    io_full_stall_seconds: float | None = None
    cpu_some_stall_seconds: float | None = None
    memory_some_stall_seconds: float | None = None
    memory_full_stall_seconds: float | None = None


@dataclass(frozen=True, slots=True)
class NodeFsWindow:
    """What one network file system client of a node moved during one summary window: the
    increase of its counters (NFS: /proc/self/mountstats per mount; the fstype says which).
    Node-level: every job on the node together; the attribution run gives it to a job only in
    windows the job holds the node alone. Natural key: (node, filesystem, window_start_at). A
    counter that went backwards (remounted) counts from zero."""

    node: str
    # the mountpoint (NFS), or the file system's name where the client names it so
    filesystem: str
    fstype: str
    device: str
    window_start_at: datetime
    window_seconds: float
    # what applications read and wrote through it (page cache and O_DIRECT)
    read_bytes: int | None = None
    write_bytes: int | None = None
    read_ops: int | None = None
    write_ops: int | None = None
    # round-trip time of the window's READ and WRITE RPCs together
    read_rtt_seconds: float | None = None
    write_rtt_seconds: float | None = None


@dataclass(frozen=True, slots=True)
class JobHostWindow:
    """What one job did on one node's host side during one summary window: the increase of
    its cgroup counters between two reads. Natural key: (node, job_id, window_start_at).

    A counter that went backwards (the cgroup was recreated: a requeue on the same node, a
    job id reused) counts from zero. Fields the node does not give are None.
    """

    node: str
    job_id: str
    window_start_at: datetime
    window_seconds: float
    cgroup_version: int
    read_bytes: int | None = None
    write_bytes: int | None = None
    read_ops: int | None = None
    write_ops: int | None = None
    cpu_usage_seconds: float | None = None
    cpus: int | None = None
    memory_peak_bytes: int | None = None
    io_some_stall_seconds: float | None = None
    io_full_stall_seconds: float | None = None
    cpu_some_stall_seconds: float | None = None
    memory_some_stall_seconds: float | None = None
    memory_full_stall_seconds: float | None = None
    # PCIe bytes of the job's GPUs on the node (NVML; None when not read)
    pcie_tx_bytes: int | None = None
    pcie_rx_bytes: int | None = None


@dataclass(frozen=True, slots=True)
class GpuHostWindow:
    """One GPU's PCIe traffic and clock-throttle time during one summary window (its NVLink
    traffic per window is NvlinkCounters, read with the fabric).

    Natural key: (node, gpu_uuid, window_start_at). Throttle seconds are covered seconds in
    which NVML's clocks-event reasons held that reason (power cap: SW power cap or HW power
    brake; thermal: SW or HW thermal slowdown; hw_slowdown: HW slowdown).
    """

    node: str
    gpu_uuid: str
    window_start_at: datetime
    window_seconds: float
    pcie_tx_bytes: int | None = None
    pcie_rx_bytes: int | None = None
    throttle_power_seconds: float | None = None
    throttle_thermal_seconds: float | None = None
    throttle_hw_slowdown_seconds: float | None = None
    # the Slurm jobs seen on the GPU in the window (its PCIe bytes go to their job windows)
    job_ids: tuple[str, ...] = ()

    @property
    def throttled(self) -> bool:
        """Any power, thermal or HW-slowdown throttling in the window."""
        return any(
            (v or 0) > 0
            for v in (
                self.throttle_power_seconds,
                self.throttle_thermal_seconds,
                self.throttle_hw_slowdown_seconds,
            )
        )


@dataclass(frozen=True, slots=True)
class GpfsFsIo:
    """One file system of a GPFS (IBM Storage Scale) client node as `mmpmon -p` answers
    `fs_io_s`: counters since GPFS started on the node or the last `reset`."""

    node_address: str
    node_name: str
    cluster: str
    filesystem: str
    disks: int
    at: datetime
    read_bytes: int
    write_bytes: int
    opens: int
    closes: int
    reads: int
    writes: int
    readdirs: int
    inode_updates: int


@dataclass(frozen=True, slots=True)
class LustreJobStat:
    """One job's entry in one Lustre target's job_stats: cumulative since `start_at` (2.15+)
    or since the entry appeared. Natural key: (target, job_name, snapshot_at)."""

    # "es01a-OST0001", "lustrefs-MDT0000"; "" when the text has no heading (`lctl get_param -n`)
    target: str
    # the entry's job_id as Lustre shows it ("24", "SLURM_JOB10:0:host", "cp.0")
    job_name: str
    # the Slurm job id read from it ("" when the name holds none)
    job_id: str
    snapshot_at: datetime
    start_at: datetime | None = None
    read_bytes: int | None = None
    write_bytes: int | None = None
    read_ops: int | None = None
    write_ops: int | None = None
    # samples of every other operation (open, close, getattr, punch, sync, ...)
    metadata_ops: int | None = None
    # total server time of reads and writes (2.15+ report it in usecs)
    read_wait_seconds: float | None = None
    write_wait_seconds: float | None = None


@dataclass(frozen=True, slots=True)
class NfsMountStats:
    """One NFS mount of /proc/self/mountstats: counters since it was mounted."""

    device: str
    mountpoint: str
    fstype: str
    age_seconds: int | None = None
    # what applications read and wrote through the page cache and O_DIRECT
    read_bytes: int | None = None
    write_bytes: int | None = None
    # what went over the wire (READ/WRITE RPC payloads)
    server_read_bytes: int | None = None
    server_write_bytes: int | None = None
    read_ops: int | None = None
    write_ops: int | None = None
    # cumulative round-trip and execute time of READ and WRITE RPCs
    read_rtt_seconds: float | None = None
    write_rtt_seconds: float | None = None
