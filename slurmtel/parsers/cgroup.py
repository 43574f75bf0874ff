"""A Slurm job's cgroup files -> typed counters (the host side of a job, issue 26).

Where Slurm puts a job (cgroup.conf `CgroupPlugin`):

- cgroup v2 (`cgroup/v2`): `<mount>/system.slice/slurmstepd.scope/job_<id>/` (with
  `step_*/user/task_*` below; on a node with several slurmd, `<nodename>_slurmstepd.scope`).
  Files: `io.stat` (per device: `rbytes= wbytes= rios= wios= dbytes= dios=`), `cpu.stat`
  (`usage_usec user_usec system_usec nr_throttled throttled_usec ...`), `memory.peak` (6.x
  kernels), `cpuset.cpus.effective`, and PSI `io.pressure`, `cpu.pressure`,
  `memory.pressure` (`some avg10=.. avg60=.. avg300=.. total=<usec>` and a `full` line).
- cgroup v1 (`cgroup/v1`): one tree per controller, `<mount>/<controller>/slurm/uid_<uid>/job_<id>/`:
  `blkio/…/blkio.throttle.io_service_bytes` and `blkio.throttle.io_serviced`
  (`MAJ:MIN Read|Write|Sync|Async|Discard|Total N`, then `Total N`), `cpuacct/…/cpuacct.usage`
  (nanoseconds), `memory/…/memory.max_usage_in_bytes`, `cpuset/…/cpuset.effective_cpus`.
  No PSI in v1.

What a node lacks (no io controller delegated to the job, a kernel without PSI or without
memory.peak) stays None: "not measured", never 0. A file that is present but unreadable text
is a Rejected record with its reason; the other files of the same read are kept.

Pure: text in, records out; reading the files is the agent's (slurmtel.agent.host).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from slurmtel.records import CpuUsage, IoDeviceCounters, JobCgroupReading, PressureStall, Rejected

SOURCE = "cgroup"
# how much of a bad file a Rejected record keeps
RAW_CHARS = 4096
# no counter the kernel prints is wider than u64
_U64_MAX = 2**64 - 1
# Linux's NR_CPUS ceiling (CONFIG_NR_CPUS is at most 8192)
MAX_CPUS = 8192
_DEVICE = re.compile(r"^\d{1,10}:\d{1,10}$")
_IO_KEYS = {
    "rbytes": "read_bytes",
    "wbytes": "write_bytes",
    "rios": "read_ops",
    "wios": "write_ops",
    "dbytes": "discard_bytes",
    "dios": "discard_ops",
}
_BLKIO_OPS = {"Read": "read", "Write": "write", "Discard": "discard"}
_PSI_LINE = re.compile(r"^(some|full) avg10=(\d+\.\d+) avg60=(\d+\.\d+) avg300=(\d+\.\d+) total=(\d+)$")
PRESSURE_RESOURCES = ("io", "cpu", "memory")

# the files one read of a job's cgroup uses, by cgroup version (path relative to the job's
# directory; v1 paths are relative to the controller's job directory, named by controller)
V2_FILES = (
    "io.stat",
    "cpu.stat",
    "memory.peak",
    "cpuset.cpus.effective",
    "io.pressure",
    "cpu.pressure",
    "memory.pressure",
)
V1_FILES = (
    "blkio/blkio.throttle.io_service_bytes",
    "blkio/blkio.throttle.io_serviced",
    "cpuacct/cpuacct.usage",
    "memory/memory.max_usage_in_bytes",
    "cpuset/cpuset.effective_cpus",
)


class _Bad(ValueError):
    """One file's text is not what the kernel prints."""


def _text(raw: str | bytes) -> str:
    return raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw


def _counter(value: str, what: str) -> int:
    if not value.isascii() or not value.isdigit():
        raise _Bad(f"{what}: {value[:40]!r} is not a counter")
    number = int(value)
    if number > _U64_MAX:
        raise _Bad(f"{what}: {value[:40]} is larger than any kernel counter")
    return number


def _rejected(origin: str, name: str, reason: str, raw: str | bytes) -> Rejected:
    return Rejected(SOURCE, origin, name, reason, _text(raw)[:RAW_CHARS])


# ---------------------------------------------------------------- single files


def parse_io_stat(raw: str | bytes) -> list[IoDeviceCounters]:
    """cgroup v2 io.stat -> one IoDeviceCounters per device line. Keys the kernel adds
    (io.latency's depth/avg_lat/win, iocost's cost.*) are ignored; an empty file (no IO yet)
    is []. Raises ValueError on text that is not io.stat."""
    devices = []
    for number, line in enumerate(_text(raw).splitlines(), start=1):
        fields = line.split()
        if not fields:
            continue
        if not _DEVICE.match(fields[0]):
            raise _Bad(f"line {number}: {fields[0][:40]!r} is not a MAJ:MIN device")
        values: dict[str, int] = {}
        for item in fields[1:]:
            key, sep, value = item.partition("=")
            if not sep:
                raise _Bad(f"line {number}: {item[:40]!r} is not key=value")
            if key in _IO_KEYS:
                values[_IO_KEYS[key]] = _counter(value, f"line {number} {key}")
        devices.append(IoDeviceCounters(fields[0], **values))
    return devices


def parse_blkio_throttle(
    bytes_raw: str | bytes | None, ops_raw: str | bytes | None = None
) -> list[IoDeviceCounters]:
    """cgroup v1 blkio.throttle.io_service_bytes[_recursive] and io_serviced (same format)
    -> one IoDeviceCounters per device. Sync/Async/Total lines are sums of the others and
    are checked for form only. Raises ValueError on text that is not this format."""
    by_device: dict[str, dict[str, int]] = {}
    for raw, unit in ((bytes_raw, "bytes"), (ops_raw, "ops")):
        if raw is None:
            continue
        for number, line in enumerate(_text(raw).splitlines(), start=1):
            fields = line.split()
            if not fields:
                continue
            if fields[0] == "Total" and len(fields) == 2:
                _counter(fields[1], f"{unit} line {number} Total")
                continue
            if len(fields) != 3 or not _DEVICE.match(fields[0]):
                raise _Bad(f"{unit} line {number}: {line[:60]!r} is not 'MAJ:MIN Op N'")
            value = _counter(fields[2], f"{unit} line {number}")
            op = _BLKIO_OPS.get(fields[1])
            if op is None:
                if fields[1] not in ("Sync", "Async", "Total"):
                    raise _Bad(f"{unit} line {number}: unknown operation {fields[1][:20]!r}")
                continue
            by_device.setdefault(fields[0], {})[f"{op}_{unit}"] = value
    return [IoDeviceCounters(device, **values) for device, values in by_device.items()]


def parse_cpu_stat(raw: str | bytes) -> CpuUsage:
    """cgroup v2 cpu.stat (microseconds) -> CpuUsage in seconds."""
    values: dict[str, int] = {}
    for number, line in enumerate(_text(raw).splitlines(), start=1):
        fields = line.split()
        if not fields:
            continue
        if len(fields) != 2:
            raise _Bad(f"line {number}: {line[:60]!r} is not 'key value'")
        values[fields[0]] = _counter(fields[1], f"line {number} {fields[0][:30]}")
    if "usage_usec" not in values:
        raise _Bad("no usage_usec line")

    def seconds(key: str) -> float | None:
        return values[key] / 1e6 if key in values else None

    return CpuUsage(
        usage_seconds=seconds("usage_usec"),
        user_seconds=seconds("user_usec"),
        system_seconds=seconds("system_usec"),
        throttled_seconds=seconds("throttled_usec"),
        throttled_periods=values.get("nr_throttled"),
    )


def parse_cpuacct_usage(raw: str | bytes) -> CpuUsage:
    """cgroup v1 cpuacct.usage (nanoseconds) -> CpuUsage in seconds."""
    return CpuUsage(usage_seconds=_single(raw, "cpuacct.usage") / 1e9)


def _single(raw: str | bytes, what: str) -> int:
    text = _text(raw).strip()
    if not text:
        raise _Bad(f"{what}: empty")
    return _counter(text, what)


def parse_bytes_value(raw: str | bytes, what: str = "value") -> int | None:
    """A one-number file (memory.peak, memory.max_usage_in_bytes, memory.max): bytes, or
    None for `max` (no limit)."""
    if _text(raw).strip() == "max":
        return None
    return _single(raw, what)


def parse_pressure(raw: str | bytes, resource: str) -> PressureStall:
    """A PSI file -> PressureStall; totals in seconds (the kernel prints microseconds)."""
    lines: dict[str, tuple[float, int]] = {}
    for number, line in enumerate(_text(raw).splitlines(), start=1):
        if not line.strip():
            continue
        match = _PSI_LINE.match(line.strip())
        if match is None:
            raise _Bad(f"line {number}: {line[:80]!r} is not a PSI line")
        avg10 = float(match.group(2))
        if avg10 > 100.0:
            raise _Bad(f"line {number}: avg10={avg10} is above 100 %")
        lines[match.group(1)] = (avg10, _counter(match.group(5), f"line {number} total"))
    if "some" not in lines:
        raise _Bad("no 'some' line")
    some_avg, some_total = lines["some"]
    full = lines.get("full")
    return PressureStall(
        resource=resource,
        some_total_seconds=some_total / 1e6,
        some_avg10_share=some_avg / 100.0,
        full_total_seconds=full[1] / 1e6 if full else None,
        full_avg10_share=full[0] / 100.0 if full else None,
    )


def count_cpus(raw: str | bytes) -> int | None:
    """cpuset.cpus.effective (`0-3,8-11`) -> how many CPUs; None for an empty set."""
    text = _text(raw).strip()
    if not text:
        return None
    cpus: set[int] = set()
    for part in text.split(","):
        low, sep, high = part.partition("-")
        if not (low.isascii() and low.isdigit() and (not sep or (high.isascii() and high.isdigit()))):
            raise _Bad(f"{text[:40]!r} is not a CPU list")
        first, last = int(low), int(high) if sep else int(low)
        if last < first or last >= MAX_CPUS:
            raise _Bad(f"{part[:40]!r} is not a CPU range")
        cpus.update(range(first, last + 1))
    return len(cpus)


# ---------------------------------------------------------------- one read of a job


@dataclass(frozen=True, slots=True)
class _Totals:
    read_bytes: int | None = None
    write_bytes: int | None = None
    read_ops: int | None = None
    write_ops: int | None = None


def _sum_devices(devices: list[IoDeviceCounters]) -> _Totals:
    def total(name: str) -> int | None:
        values = [getattr(d, name) for d in devices if getattr(d, name) is not None]
        # a present file with no device line: the job did no block IO yet -> 0 (measured)
        return sum(values) if values or not devices else None

    return _Totals(total("read_bytes"), total("write_bytes"), total("read_ops"), total("write_ops"))


def parse_job_cgroup(
    files: Mapping[str, str | bytes | None], *, job_id: str, version: int, origin: str = "<cgroup>"
) -> list[JobCgroupReading | Rejected]:
    """One read of a job's cgroup files (name -> text, None or missing when the file is
    absent; names as in V2_FILES / V1_FILES) -> one JobCgroupReading, plus a Rejected for each
    file whose text is not what the kernel prints (that file's figures stay None)."""
    out: list[JobCgroupReading | Rejected] = []
    values: dict[str, int | float | None] = {}

    def attempt(name: str, read: Callable[[str | bytes], None]) -> None:
        raw = files.get(name)
        if raw is None:
            return
        try:
            read(raw)
        except ValueError as exc:
            out.append(_rejected(origin, f"job {job_id} {name}", str(exc), raw))

    def io(raw: str | bytes) -> None:
        totals = _sum_devices(parse_io_stat(raw))
        values.update(read_bytes=totals.read_bytes, write_bytes=totals.write_bytes)
        values.update(read_ops=totals.read_ops, write_ops=totals.write_ops)

    def blkio_bytes(raw: str | bytes) -> None:
        totals = _sum_devices(parse_blkio_throttle(raw))
        values.update(read_bytes=totals.read_bytes, write_bytes=totals.write_bytes)

    def blkio_ops(raw: str | bytes) -> None:
        devices = parse_blkio_throttle(None, raw)
        totals = _sum_devices(devices)
        values.update(read_ops=totals.read_ops, write_ops=totals.write_ops)

    def cpu(raw: str | bytes) -> None:
        values["cpu_usage_seconds"] = parse_cpu_stat(raw).usage_seconds

    def cpuacct(raw: str | bytes) -> None:
        values["cpu_usage_seconds"] = parse_cpuacct_usage(raw).usage_seconds

    def peak(raw: str | bytes) -> None:
        values["memory_peak_bytes"] = parse_bytes_value(raw, "memory peak")

    def cpus(raw: str | bytes) -> None:
        values["cpus"] = count_cpus(raw)

    def pressure(resource: str) -> Callable[[str | bytes], None]:
        def read(raw: str | bytes) -> None:
            stall = parse_pressure(raw, resource)
            values[f"{resource}_some_stall_seconds"] = stall.some_total_seconds
            if resource != "cpu":
                values[f"{resource}_full_stall_seconds"] = stall.full_total_seconds

        return read

    if version == 2:
        attempt("io.stat", io)
        attempt("cpu.stat", cpu)
        attempt("memory.peak", peak)
        attempt("cpuset.cpus.effective", cpus)
        for resource in PRESSURE_RESOURCES:
            attempt(f"{resource}.pressure", pressure(resource))
    elif version == 1:
        attempt("blkio/blkio.throttle.io_service_bytes", blkio_bytes)
        attempt("blkio/blkio.throttle.io_serviced", blkio_ops)
        attempt("cpuacct/cpuacct.usage", cpuacct)
        attempt("memory/memory.max_usage_in_bytes", peak)
        attempt("cpuset/cpuset.effective_cpus", cpus)
    else:
        return [_rejected(origin, f"job {job_id}", f"unknown cgroup version {version}", "")]
    out.insert(0, JobCgroupReading(job_id=job_id, cgroup_version=version, **values))  # type: ignore[arg-type]
    return out
