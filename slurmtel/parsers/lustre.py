"""Lustre jobstats (`lctl get_param obdfilter.*.job_stats mdt.*.job_stats`) -> LustreJobStat.

The text is YAML-shaped but read line by line (no YAML library: a hostile or truncated
entry must cost that entry only). Forms read:

- with a heading per target (`obdfilter.es01a-OST0001.job_stats=` then `job_stats:`), or
  without (`lctl get_param -n`, or a saved `/proc/fs/lustre/.../job_stats` file): the target
  is then the caller's `target` argument;
- `- job_id: 24` (jobid_var=SLURM_JOB_ID), `- job_id: "SLURM_JOB10:0:host"` (jobid_name with
  %j, quoted when it holds a colon), `cp.0` (procname.uid: no Slurm job);
- `snapshot_time: 1510782606` (2.10) or `1723114647.887515895 secs.nsecs` with `start_time`
  and `elapsed_time` (2.15+);
- counters `{ samples: N, unit: bytes|reqs|usecs, min: .., max: .., sum: .., sumsq: .., hist: {..} }`.

The Slurm job id is read from the name with `job_pattern` (a regex whose first group is the
id; the default takes a bare number, `SLURM_JOB<n>`, or the digits before the first `:` or
`.` when the name starts with them). An entry whose id cannot be read keeps job_id "".

Counters are cumulative since the entry appeared; `job_stats_increase` gives the increase
between two snapshots, treating a counter that went backwards, or a changed start_time, as a
new entry (Lustre dropped and recreated it after `job_cleanup_interval`, or the job id was
reused): its increase counts from zero.
"""

from __future__ import annotations

import re
from dataclasses import replace
from datetime import UTC, datetime

from slurmtel.records import LustreJobStat, Rejected

SOURCE = "lustre"
RAW_CHARS = 4096
DEFAULT_JOB_PATTERN = r"^(?:SLURM_JOB)?(\d+)(?:$|[:.@])"
_HEADING = re.compile(r"^(?:obdfilter|mdt)\.([^\s=]+)\.job_stats=\s*$")
_ENTRY = re.compile(r"^-\s+job_id:\s*(.*?)\s*$")
_FIELD = re.compile(r"^\s+([a-z_]+):\s*(.*?)\s*$")
_TIME = re.compile(r"^(\d{1,12})(?:\.(\d{1,9}))?(?:\s+secs\.nsecs)?$")
_STAT = re.compile(r"^\{\s*samples:\s*(\d{1,20})\s*,\s*unit:\s*([a-z]+)(.*)\}$")
_SUM = re.compile(r"\bsum:\s*(\d{1,20})\b")
_U64_MAX = 2**64 - 1
_NOT_OPS = frozenset({"read_bytes", "write_bytes", "read", "write"})


class _Bad(ValueError):
    pass


def _time(value: str, what: str) -> datetime:
    match = _TIME.match(value)
    if match is None:
        raise _Bad(f"{what}: {value[:40]!r} is not a time")
    seconds = int(match.group(1)) + (int((match.group(2) or "0").ljust(9, "0")) / 1e9)
    try:
        return datetime.fromtimestamp(seconds, UTC)
    except (OverflowError, OSError, ValueError) as exc:
        raise _Bad(f"{what}: {value[:40]!r} is out of range") from exc


def _unquote(name: str) -> str:
    if len(name) >= 2 and name[0] == name[-1] and name[0] in "\"'":
        return name[1:-1]
    return name


class _Entry:
    def __init__(self, target: str, name: str, line: int) -> None:
        self.target = target
        self.name = name
        self.line = line
        self.lines: list[str] = []
        self.snapshot: datetime | None = None
        self.start: datetime | None = None
        # op -> (samples, unit, sum or None)
        self.stats: dict[str, tuple[int, str, int | None]] = {}

    def field(self, key: str, value: str) -> None:
        if key == "snapshot_time":
            self.snapshot = _time(value, key)
        elif key == "start_time":
            self.start = _time(value, key)
        elif key == "elapsed_time":
            _time(value, key)
        else:
            match = _STAT.match(value)
            if match is None:
                raise _Bad(f"{key}: {value[:60]!r} is not a counter")
            samples = int(match.group(1))
            total = _SUM.search(match.group(3))
            total_value = int(total.group(1)) if total else None
            if samples > _U64_MAX or (total_value is not None and total_value > _U64_MAX):
                raise _Bad(f"{key}: counter above 2^64")
            self.stats[key] = (samples, match.group(2), total_value)

    def record(self, pattern: re.Pattern[str]) -> LustreJobStat:
        if self.snapshot is None:
            raise _Bad("no snapshot_time")
        if not self.name:
            raise _Bad("empty job_id")
        match = pattern.search(self.name)
        stats = self.stats

        def total(op: str, unit: str) -> int | None:
            entry = stats.get(op)
            return entry[2] if entry is not None and entry[1] == unit else None

        def samples(op: str) -> int | None:
            entry = stats.get(op)
            return entry[0] if entry is not None else None

        def wait(op: str) -> float | None:
            value = total(op, "usecs")
            return value / 1e6 if value is not None else None

        other = [s for op, (s, _, _) in stats.items() if op not in _NOT_OPS]
        return LustreJobStat(
            target=self.target,
            job_name=self.name,
            job_id=match.group(1) if match else "",
            snapshot_at=self.snapshot,
            start_at=self.start,
            read_bytes=total("read_bytes", "bytes"),
            write_bytes=total("write_bytes", "bytes"),
            read_ops=samples("read_bytes"),
            write_ops=samples("write_bytes"),
            metadata_ops=sum(other) if other else None,
            read_wait_seconds=wait("read"),
            write_wait_seconds=wait("write"),
        )


def parse_lustre_jobstats(
    raw: str | bytes,
    *,
    origin: str = "<lustre>",
    target: str = "",
    job_pattern: str = DEFAULT_JOB_PATTERN,
) -> list[LustreJobStat | Rejected]:
    """Every entry of every target in the text; a bad entry is one Rejected, the rest kept."""
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
    pattern = re.compile(job_pattern)
    out: list[LustreJobStat | Rejected] = []
    current_target = target
    entry: _Entry | None = None
    broken: str | None = None

    def finish() -> None:
        nonlocal entry, broken
        if entry is None:
            return
        raw_text = "\n".join(entry.lines)[:RAW_CHARS]
        key = f"{entry.target or '-'} job {entry.name[:200]} (line {entry.line})"
        if broken is not None:
            out.append(Rejected(SOURCE, origin, key, broken, raw_text))
        else:
            try:
                out.append(entry.record(pattern))
            except _Bad as exc:
                out.append(Rejected(SOURCE, origin, key, str(exc), raw_text))
        entry, broken = None, None

    for number, line in enumerate(text.splitlines(), start=1):
        line = line.rstrip("\r")
        if not line.strip():
            continue
        if (m := _HEADING.match(line)) is not None:
            finish()
            current_target = m.group(1)
            continue
        if line.startswith("job_stats:"):
            finish()
            continue
        if (m := _ENTRY.match(line)) is not None:
            finish()
            entry = _Entry(current_target, _unquote(m.group(1)), number)
            entry.lines.append(line)
            continue
        if entry is None:
            out.append(
                Rejected(
                    SOURCE, origin, f"line {number}", "text outside any job_stats entry", line[:RAW_CHARS]
                )
            )
            continue
        entry.lines.append(line)
        if broken is not None:
            continue
        if (m := _FIELD.match(line)) is None:
            broken = f"line {number}: {line[:60]!r} is not 'key: value'"
            continue
        try:
            entry.field(m.group(1), m.group(2))
        except _Bad as exc:
            broken = f"line {number}: {exc}"
    finish()
    return out


def job_stats_increase(previous: LustreJobStat | None, current: LustreJobStat) -> LustreJobStat:
    """What CURRENT adds to PREVIOUS (the same target and job name, an earlier snapshot): a
    record of the same shape whose counters are increases. A counter that went backwards, or
    a changed start_time, means the entry was recreated: the increase is CURRENT's own value."""
    if previous is None:
        return current
    recreated = (
        current.start_at is not None
        and previous.start_at is not None
        and current.start_at != previous.start_at
    )
    names = ("read_bytes", "write_bytes", "read_ops", "write_ops", "metadata_ops")
    waits = ("read_wait_seconds", "write_wait_seconds")
    if not recreated:
        for name in (*names, *waits):
            now, before = getattr(current, name), getattr(previous, name)
            if now is not None and before is not None and now < before:
                recreated = True
                break
    if recreated:
        return current
    changes: dict[str, int | float | None] = {}
    for name in (*names, *waits):
        now, before = getattr(current, name), getattr(previous, name)
        changes[name] = now - before if now is not None and before is not None else now
    return replace(current, **changes)  # type: ignore[arg-type]
