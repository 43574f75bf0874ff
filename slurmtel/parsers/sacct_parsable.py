"""`sacct -P` (--parsable2) text -> JobAttempt records.

When slurmtel runs sacct itself it asks for SACCT_FIELDS, delimited by SACCT_DELIMITER (a
control character no name contains), with epoch times (SLURM_TIME_FORMAT=%s) and the only free
text, JobName, last. Captures made by others are read too: any field order (from the header line,
or `fields=` for `--noheader` output), "|" as delimiter, local times in a given zone.

sacct prints a record per physical line and escapes nothing, so names are repaired by field
count. A job name holding a newline splits its record over physical lines that are each too
short to be a record, and they are joined back. When the free text stands last (and no other
column holds a name), a name holding the delimiter splits into extra fields that the last column
takes back, and a short line after a complete record is the rest of its name. Rows that cannot be
repaired become Rejected records with their line number.

Step rows (sacct without -X: "3.batch", "3.0") are not attempts; their TotalCPU and
TRESUsageInMax / TRESUsageInTot mem (or MaxRSS) add up to their attempt's usage, as in the
JSON parser.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, tzinfo

from slurmtel.errors import ParseError
from slurmtel.parsers.slurm_common import (
    INFINITE64,
    NO_TIME_WORDS,
    NO_VAL64,
    attempt_nodes,
    gpu_count,
    gpu_model,
    minutes_to_seconds,
    normalize_state,
    parse_duration_seconds,
    parse_tres_string,
    slurm_epoch,
    text_number,
    unwrap_number,
)
from slurmtel.records import JobAttempt, Rejected

SOURCE = "sacct"
# ASCII unit separator: what slurmtel passes as --delimiter; no job name or path holds it
SACCT_DELIMITER = "\x1f"
# what slurmtel asks for with --format; JobName (free text) must stay last
SACCT_FIELDS: tuple[str, ...] = (
    "JobIDRaw",
    "JobID",
    "Cluster",
    "DBIndex",
    "Submit",
    "Eligible",
    "Start",
    "End",
    "State",
    "Reason",
    "ExitCode",
    "User",
    "UID",
    "Account",
    "Partition",
    "QOS",
    "WCKey",
    "AllocCPUS",
    "AllocTRES",
    "ReqTRES",
    "NodeList",
    "Timelimit",
    "TotalCPU",
    "TRESUsageInTot",
    "TRESUsageInMax",
    "WorkDir",
    "JobName",
)
# columns of user-chosen text that can hold anything, the delimiter and newlines included
NAME_FIELDS = frozenset({"jobname", "submitline", "comment", "admincomment", "systemcomment"})
# free text that may stand last and take back what its stray delimiters split off
FREE_TEXT_FIELDS = NAME_FIELDS | {"workdir"}
_ARRAY_ID = re.compile(r"(\d+)_(?:(\d+)|\[[^\]]*\])")
_HET_ID = re.compile(r"(\d+)\+(\d+)")
# how a record's first value looks when it is a job id (1, 10_4, 10_[1-4%2], 123+1, 1.batch)
_ROW_START = re.compile(r"\d+(?:_(?:\d+|\[[^\]]*\]))?(?:\+\d+)?(?:\.\w+)?")


def parse_sacct_parsable(
    raw: str,
    *,
    origin: str = "<input>",
    fields: Sequence[str] | None = None,
    delimiter: str = "|",
    timezone: tzinfo = UTC,
    default_cluster: str = "",
) -> list[JobAttempt | Rejected]:
    """Parse `sacct -P` output into attempts; step rows are skipped, bad rows become Rejected.

    FIELDS names the columns of `--noheader` output; without it the first line is the header.
    Field names are case-insensitive. Times are epoch seconds or ISO local times in TIMEZONE.
    Raises ParseError when a column every attempt needs (JobIDRaw or JobID, Submit, State) is
    missing.
    """
    if not delimiter:
        raise ParseError(f"{origin}: empty delimiter")
    lines = raw.split("\n")
    while lines and not lines[-1].strip("\r"):
        lines.pop()
    first = 0
    if fields is None:
        while first < len(lines) and not lines[first].strip():
            first += 1
        if first == len(lines):
            return []
        fields = lines[first].rstrip("\r").split(delimiter)
        first += 1
        what = "header"
        # sacct -p (--parsable) ends every line, the header too, with the delimiter
        trailing = len(fields) > 1 and not fields[-1].strip()
        if trailing:
            fields = fields[:-1]
    else:
        what = "field list"
        body = [line.rstrip("\r") for line in lines[first:] if line.strip()]
        trailing = _ends_in_delimiter(body, len(fields), delimiter)
    if trailing:
        lines = lines[:first] + [_without_trailing(line, delimiter) for line in lines[first:]]
    names = [f.strip().lower() for f in fields]
    column = {name: i for i, name in reversed(list(enumerate(names)))}
    missing = [
        label
        for label, present in (
            ("JobIDRaw or JobID", "jobidraw" in column or "jobid" in column),
            ("Submit", "submit" in column),
            ("State", "state" in column),
        )
        if not present
    ]
    if missing:
        raise ParseError(
            f"{origin}: sacct -P {what} lacks column(s) {', '.join(missing)} "
            f"(has: {', '.join(f.strip() for f in fields) or 'nothing'})"
        )
    reader = _RowReader(column, timezone, default_cluster, origin)
    out: list[JobAttempt | Rejected] = []
    # repairs are only safe when the last column is the only one a name can spill out of
    last_is_free = names[-1] in FREE_TEXT_FIELDS and not NAME_FIELDS.intersection(names[:-1])
    id_first = names[0] in ("jobid", "jobidraw")
    # the attempt each job id's step rows belong to: the last one read (sacct prints an
    # attempt's steps right after it)
    attempt_at: dict[str, int] = {}
    for lineno, text in _records(lines, first, len(names), delimiter, last_is_free, id_first):
        values = text.split(delimiter)
        if len(values) != len(names):
            if len(values) > len(names) and last_is_free:
                values[len(names) - 1 :] = [delimiter.join(values[len(names) - 1 :])]
            else:
                out.append(
                    Rejected(
                        source=SOURCE,
                        origin=origin,
                        record_key=f"line {lineno}",
                        reason=f"expected {len(names)} fields, found {len(values)}",
                        raw=text,
                    )
                )
                continue
        record = reader.read(values, lineno, text)
        if isinstance(record, _StepUsage):
            index = attempt_at.get(record.job)
            if index is not None:
                out[index] = _with_step(out[index], record)  # type: ignore[arg-type]
        elif record is not None:
            if isinstance(record, JobAttempt):
                attempt_at[record.job_id] = attempt_at[str(record.job_id_raw)] = len(out)
            out.append(record)
    return out


def _records(
    lines: list[str], first: int, width: int, delimiter: str, last_is_free: bool, id_first: bool
) -> Iterator[tuple[int, str]]:
    """(line number, text) of each logical record: physical lines joined where a newline split one.

    A line with fewer fields than the header is a piece of a record: it continues the record
    before it while that one is short, or (the free text being last) ends in the free text.
    A short line that starts like a row of its own (a job id, then fields) is a broken row
    rather than the rest of a job name, so it stays apart and gets rejected.
    """
    current: str | None = None
    current_line = 0
    current_width = 0
    for index in range(first, len(lines)):
        line = lines[index]
        if line.endswith("\r"):
            line = line[:-1]
        count = line.count(delimiter) + 1
        if count >= width:
            if current is not None:
                yield current_line, current
            current, current_line, current_width = line, index + 1, count
        elif current is not None and (
            current_width < width
            or (last_is_free and not (id_first and count > 2 and _looks_like_row(line, delimiter)))
        ):
            current += "\n" + line
            current_width += count - 1
        elif not line.strip():
            continue
        else:
            if current is not None:
                yield current_line, current
            current, current_line, current_width = line, index + 1, count
    if current is not None:
        yield current_line, current


def _ends_in_delimiter(body: list[str], width: int, delimiter: str) -> bool:
    """Whether headerless lines of WIDTH fields are `sacct -p` (each ends in the delimiter: one
    field more, empty) rather than `-P`, by the field count of the whole file: a -P capture whose
    last column is empty on every row ends every line in the delimiter too, but holds WIDTH
    fields, not WIDTH + 1. Names holding the delimiter add fields to their rows only, so the
    count most rows have decides."""
    if not body or not all(line.endswith(delimiter) for line in body):
        return False
    counts = [line.count(delimiter) + 1 for line in body]
    return counts.count(width + 1) > counts.count(width)


def _without_trailing(line: str, delimiter: str) -> str:
    """A line of `sacct -p` without the delimiter it ends in."""
    end = line[:-1] if line.endswith("\r") else line
    return end[: -len(delimiter)] if end.endswith(delimiter) else line


def _looks_like_row(line: str, delimiter: str) -> bool:
    return _ROW_START.fullmatch(line.split(delimiter, 1)[0]) is not None


class _RowReader:
    """Turns one row's values into a JobAttempt (or Rejected, or None for a step)."""

    def __init__(self, column: dict[str, int], zone: tzinfo, default_cluster: str, origin: str) -> None:
        self.column = column
        self.zone = zone
        self.default_cluster = default_cluster
        self.origin = origin

    def read(self, values: list[str], lineno: int, text: str) -> JobAttempt | Rejected | _StepUsage | None:
        column = self.column

        def get(name: str) -> str:
            i = column.get(name)
            return values[i] if i is not None else ""

        job_id = get("jobid").strip()
        raw_id = get("jobidraw").strip()
        if "." in job_id or "." in raw_id:
            # a step: 1.batch, 3.0, 10_1.batch, 123+0.extern
            return self._step(get, raw_id or job_id)
        key = f"job {raw_id or job_id}"
        try:
            return self._attempt(get, job_id, raw_id)
        except (ValueError, OverflowError, OSError, TypeError, RecursionError) as exc:
            key = f"{key} (line {lineno})"
            return Rejected(source=SOURCE, origin=self.origin, record_key=key, reason=str(exc), raw=text)

    def _attempt(self, get: Callable[[str], str], job_id: str, raw_id: str) -> JobAttempt:
        array_job_id = array_task_id = het_job_id = het_job_offset = None
        if m := _ARRAY_ID.fullmatch(job_id):
            array_job_id = int(m.group(1))
            array_task_id = int(m.group(2)) if m.group(2) is not None else None
        elif m := _HET_ID.fullmatch(job_id):
            het_job_id, het_job_offset = int(m.group(1)), int(m.group(2))
        if raw_id:
            if not raw_id.isdigit():
                raise ValueError(f"JobIDRaw '{raw_id}' is not a number")
            job_id_raw = int(raw_id)
        elif job_id.isdigit():
            job_id_raw = int(job_id)
        elif het_job_offset == 0:
            # a heterogeneous job's leader has its own id as the het job id
            job_id_raw = het_job_id  # type: ignore[assignment]
        elif array_job_id is not None:
            # Slurm gives array tasks ids of their own (10_1 may be job 15): only JobIDRaw says which
            raise ValueError(
                f"array task '{job_id}' and no JobIDRaw column: its raw job id cannot be told from its "
                "JobID (ask sacct for JobIDRaw)"
            )
        else:
            raise ValueError(f"no JobIDRaw column, and job id '{job_id}' does not give the raw id")
        if unwrap_number(job_id_raw) is None:
            raise ValueError(f"JobIDRaw is {job_id_raw}, Slurm's NO_VAL (no job id)")
        submit_at = self._time(get("submit"), "Submit")
        if submit_at is None:
            raise ValueError("no submission time")
        start_at = self._time(get("start"), "Start")
        end_at = self._time(get("end"), "End")
        if start_at is not None and end_at is not None and end_at < start_at:
            raise ValueError(f"end {end_at.isoformat()} precedes start {start_at.isoformat()}")
        alloc_tres = parse_tres_string(get("alloctres").strip())
        req_tres = parse_tres_string(get("reqtres").strip())
        alloc_cpus = alloc_tres.get("cpu")
        if alloc_cpus is None:
            alloc_cpus = _int(get("alloccpus")) or _int(get("ncpus")) or 0
        nodelist, nodes = attempt_nodes(get("nodelist").strip())
        if "timelimitraw" in self.column:
            time_limit = minutes_to_seconds(text_number(get("timelimitraw")))
        else:
            time_limit = parse_duration_seconds(get("timelimit"))
        return JobAttempt(
            cluster=get("cluster").strip() or self.default_cluster,
            job_id_raw=job_id_raw,
            submit_at=submit_at,
            job_id=job_id or str(job_id_raw),
            name=get("jobname"),
            user=get("user").strip(),
            account=get("account").strip(),
            partition=get("partition").strip(),
            state=normalize_state(get("state")),
            eligible_at=self._time(get("eligible"), "Eligible"),
            start_at=start_at,
            end_at=end_at,
            alloc_gpus=gpu_count(alloc_tres),
            alloc_tres=alloc_tres,
            req_tres=req_tres,
            alloc_cpus=alloc_cpus,
            qos=get("qos").strip(),
            wckey=get("wckey").strip(),
            gpu_model=gpu_model(alloc_tres),
            array_job_id=array_job_id,
            array_task_id=array_task_id,
            het_job_id=het_job_id,
            het_job_offset=het_job_offset,
            db_index=_db_index(get("dbindex")),
            exit_code=get("exitcode").strip(),
            state_reason=get("reason").strip(),
            time_limit_seconds=time_limit,
            nodelist=nodelist,
            nodes=nodes,
            uid=_int(get("uid")),
            work_dir=get("workdir"),
            submit_line=get("submitline"),
        )

    def _step(self, get: Callable[[str], str], step_id: str) -> _StepUsage | None:
        job = step_id.split(".", 1)[0]
        if (
            "totalcpu" not in self.column
            and "tresusageinmax" not in self.column
            and "maxrss" not in self.column
        ):
            return None
        try:
            cpu = cpu_time_seconds(get("totalcpu"))
        except ValueError:
            cpu = None
        task = tres_bytes(get("tresusageinmax"), "mem")
        if task is None:
            task = size_bytes(get("maxrss"))
        return _StepUsage(job, cpu, task, tres_bytes(get("tresusageintot"), "mem"))

    def _time(self, text: str, label: str) -> datetime | None:
        text = text.strip()
        if text.lower() in NO_TIME_WORDS:
            return None
        if text.isdigit() and text.isascii():
            # epoch seconds (SLURM_TIME_FORMAT=%s); 0 and NO_VAL/INFINITE are "not set"
            epoch = slurm_epoch(int(text))
            if epoch is None:
                return None
            try:
                return datetime.fromtimestamp(epoch, UTC)
            except (OverflowError, ValueError, OSError):
                raise ValueError(f"{label} is {text}, not a time") from None
        try:
            at = datetime.fromisoformat(text)
        except ValueError:
            raise ValueError(f"cannot read {label} time '{text[:60]}'") from None
        if at.tzinfo is None:
            at = at.replace(tzinfo=self.zone)
        return at.astimezone(UTC)


@dataclass(frozen=True, slots=True)
class _StepUsage:
    job: str
    cpu_time_seconds: float | None
    mem_task_bytes: int | None
    mem_step_bytes: int | None


def _with_step(attempt: JobAttempt, step: _StepUsage) -> JobAttempt:
    def peak(current: int | None, new: int | None) -> int | None:
        return current if new is None else new if current is None else max(current, new)

    cpu = attempt.cpu_time_seconds
    if step.cpu_time_seconds is not None:
        cpu = round((cpu or 0.0) + step.cpu_time_seconds, 6)
    return dataclasses.replace(
        attempt,
        cpu_time_seconds=cpu,
        mem_peak_task_bytes=peak(attempt.mem_peak_task_bytes, step.mem_task_bytes),
        mem_peak_step_bytes=peak(attempt.mem_peak_step_bytes, step.mem_step_bytes),
        usage_steps=(attempt.usage_steps or 0) + 1,
    )


_CPU_TIME = re.compile(r"(?:(\d+)-)?(?:(\d+):)?(\d+):(\d+(?:\.\d+)?)")
_SIZE = re.compile(r"(\d+(?:\.\d+)?)([KMGTPE]?)", re.IGNORECASE)


def cpu_time_seconds(text: str) -> float | None:
    """TotalCPU as sacct prints it ("00:00.017", "01:02:03", "1-02:03:04.5") -> seconds."""
    text = text.strip()
    if not text:
        return None
    m = _CPU_TIME.fullmatch(text)
    if not m:
        raise ValueError(f"cannot read CPU time '{text}'")
    days, hours, minutes, seconds = m.groups()
    return round(((int(days or 0) * 24 + int(hours or 0)) * 60 + int(minutes)) * 60 + float(seconds), 6)


def size_bytes(text: str) -> int | None:
    """A size as sacct prints MaxRSS ("10444K", "1.5G", "512") -> bytes; None when empty."""
    m = _SIZE.fullmatch(text.strip())
    if not m:
        return None
    return round(float(m.group(1)) * 1024 ** " KMGTPE".index(m.group(2).upper() or " "))


def tres_bytes(text: str, key: str) -> int | None:
    """One size entry of a TRES usage string ("cpu=00:00:00,mem=10444K,...") in bytes."""
    for item in text.split(","):
        name, sep, value = item.partition("=")
        if sep and name.strip() == key:
            return size_bytes(value)
    return None


def _db_index(text: str) -> int | None:
    """slurmdbd's job_db_inx: unsigned 64-bit (24.11+ print values beyond 2**63); None if unset."""
    text = text.strip()
    if not text.isdigit() or not text.isascii():
        return None
    value = int(text)
    return None if value in (NO_VAL64, INFINITE64) or value >= 2**64 else value


def _int(text: str) -> int | None:
    """A count or id column ("32", "1002"); None when empty or one of Slurm's sentinels."""
    return text_number(text)


__all__ = ["SACCT_DELIMITER", "SACCT_FIELDS", "parse_sacct_parsable"]
