"""`sacct --json` (and slurmrestd `/slurmdb/v0.0.4x/jobs`) -> JobAttempt records.

Every schema from Slurm 21.08 (openapi/dbv0.0.37) to 25.11 (data_parser/v0.0.44) is read by the
same per-job code: the fields slurmtel uses only changed shape between versions (a string or a
list of states, a plain int or a `{"set", "infinite", "number"}` object), and each field is read
in a way that accepts every shape. `meta` names the schema; a version outside the supported
range is refused. Without a readable `meta` (a slurmrestd response trimmed by a proxy, a
truncated file whose `meta` came after the jobs) the jobs are read by shape.

Only allocations become attempts; the steps nested under each job (sacct without -X) give
the attempt's usage: TotalCPU summed over the steps, the largest task's and the largest step's
peak memory (TRESUsageInMax / TRESUsageInTot mem).

A well-formed document is read job by job (msgspec finds each job's text, orjson decodes it);
anything else (truncated, damaged, numbers orjson refuses) is read as a whole, the slower
general way, with the same results.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import msgspec
import orjson

from slurmtel.errors import ParseError
from slurmtel.parsers.slurm_common import (
    BASE_STATES,
    GPU_KEY,
    expand_nodelist,
    gc_paused,
    minutes_to_seconds,
    normalize_state,
    parse_tres_list,
    unwrap_number,
)
from slurmtel.records import JobAttempt, Rejected

SOURCE = "sacct"
SUPPORTED_VERSIONS = range(37, 45)
SUPPORTED_SCHEMAS = "openapi/dbv0.0.37, openapi/dbv0.0.38, data_parser/v0.0.39 .. data_parser/v0.0.44"
# how much of a broken tail (characters) a truncation record keeps
TAIL_CHARS = 4096

_SCHEMA = re.compile(r"(?:openapi/dbv|data_parser/v)0\.0\.(\d+)")
# slurmctld's own plugin names: squeue --json and slurmrestd /slurm/ responses, not accounting
_SLURMCTLD = re.compile(r"openapi/(?:v0\.0\.\d+|slurmctld)")
_GPU_TYPED = GPU_KEY + ":"
_from_epoch = datetime.fromtimestamp


def parse_sacct_json(raw: str | bytes, *, origin: str = "<input>") -> list[JobAttempt | Rejected]:
    """Parse one `sacct --json` document into attempts; bad jobs become Rejected records.

    Raises ParseError when the input as a whole cannot be read: not JSON, not an object, no
    "jobs" list, an unknown schema version, slurmctld job JSON instead of sacct's. A truncated
    document keeps every job that was complete before the cut, plus one Rejected record that
    says where the cut is.
    """
    # A bulk sacct call becomes hundreds of thousands of small acyclic objects; with the cyclic
    # collector on, CPython rescans them again and again while they are built (twice the time).
    with gc_paused():
        return _parse(raw, origin)


class _Envelope(msgspec.Struct):
    """A sacct JSON document with its jobs left as undecoded JSON text."""

    jobs: list[msgspec.Raw]
    meta: Any = None
    errors: Any = None


# msgspec checks the whole document and finds each job's bytes without building a thing
_ENVELOPE = msgspec.json.Decoder(_Envelope)


def _parse(raw: str | bytes, origin: str) -> list[JobAttempt | Rejected]:
    # Job by job: each job is decoded (orjson), read and freed before the next, so the work
    # stays in the CPU caches and a 20,000-job document never exists as 4 million Python
    # objects at once (a third of the time of decoding it whole, and a fraction of the memory).
    try:
        envelope = _ENVELOPE.decode(raw)
    except msgspec.DecodeError:
        pass  # not an object with a "jobs" list, truncated, damaged: the general path says which
    else:
        try:
            return _read(envelope.jobs, envelope.meta, envelope.errors, origin, None, _decode_job)
        except orjson.JSONDecodeError:
            pass  # a job orjson refuses where msgspec did not look (bad UTF-8, 1e999)
    return _parse_whole(raw, origin)


def _parse_whole(raw: str | bytes, origin: str) -> list[JobAttempt | Rejected]:
    """The general path: the document decoded at once, or what can be read of it."""
    truncation: Rejected | None = None
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError:
        doc, truncation = _recover(raw, origin)
    if not isinstance(doc, dict):
        raise ParseError(f"{origin}: expected a JSON object with a 'jobs' list, got {type(doc).__name__}")
    jobs = doc.get("jobs")
    if not isinstance(jobs, list):
        raise ParseError(f"{origin}: no 'jobs' list in the sacct JSON")
    return _read(jobs, doc.get("meta"), doc.get("errors"), origin, truncation, None)


def _decode_job(raw: msgspec.Raw) -> Any:
    return orjson.loads(memoryview(raw))


def _read(
    jobs: list[Any],
    meta: Any,
    errors: Any,
    origin: str,
    truncation: Rejected | None,
    decode: Callable[[msgspec.Raw], Any] | None,
) -> list[JobAttempt | Rejected]:
    """The attempts of JOBS: decoded objects, or JSON texts that DECODE decodes one by one."""
    if decode is not None and jobs:
        jobs[0] = decode(jobs[0])  # the checks below look at the first job
    if isinstance(meta, dict):
        _check_schema(meta, origin)
    if truncation is not None and not isinstance(meta, dict) and not all(map(_looks_like_job, jobs)):
        raise ParseError(f"{origin}: truncated JSON whose job objects are not sacct jobs")
    if jobs and isinstance(jobs[0], dict) and "job_state" in jobs[0] and "state" not in jobs[0]:
        raise ParseError(f"{origin}: this is slurmctld job JSON (squeue --json), not sacct --json")
    if errors and not jobs:
        raise ParseError(f"{origin}: sacct reported errors and no jobs: {_describe_errors(errors)}")
    default_cluster = _meta_cluster(meta)
    out: list[JobAttempt | Rejected] = []
    append = out.append
    for index, job in enumerate(jobs):
        # each job is freed once it is read: its memory, still in the caches, takes the next one
        jobs[index] = None
        if decode is not None and index:
            job = decode(job)
        if type(job) is not dict:
            append(_reject(origin, f"jobs[{index}]", "job is not a JSON object", job))
            continue
        try:
            append(_attempt(job, default_cluster))
        except _BadJob as exc:
            append(_reject(origin, exc.key, exc.reason, job))
        except (TypeError, ValueError, AttributeError, OverflowError, OSError) as exc:
            key = f"job {job.get('job_id')}" if "job_id" in job else f"jobs[{index}]"
            append(_reject(origin, key, f"unreadable job: {exc}", job))
    if truncation is not None:
        out.append(truncation)
    return out


class _BadJob(Exception):
    def __init__(self, key: str, reason: str) -> None:
        super().__init__(reason)
        self.key = key
        self.reason = reason


def _attempt(job: dict[str, Any], default_cluster: str) -> JobAttempt:
    # The per-job hot path of a bulk parse (tens of thousands of jobs per sacct call): bound
    # gets, plain-int and plain-list fast paths for the shapes of v0.0.40+, the general
    # helpers only for the other shapes.
    get = job.get
    job_id_raw = get("job_id")
    if type(job_id_raw) is not int:
        job_id_raw = unwrap_number(job_id_raw) if job_id_raw is not None else None
        if job_id_raw is None:
            raise _BadJob("job ?", "no job_id")
    time = get("time")
    if type(time) is not dict:
        raise _BadJob(f"job {job_id_raw}", "no time object")
    time_get = time.get
    submission = time_get("submission")
    submit_at = _at(submission)
    if submit_at is None:
        raise _BadJob(f"job {job_id_raw}", "no submission time")
    start_at = _at(time_get("start"))
    end_at = _at(time_get("end"))
    if start_at is not None and end_at is not None and end_at < start_at:
        raise _BadJob(f"job {job_id_raw}", f"end {end_at.isoformat()} precedes start {start_at.isoformat()}")
    eligible = time_get("eligible")
    # most jobs are eligible when submitted: share the datetime instead of building another
    eligible_at = submit_at if eligible == submission and type(eligible) is int else _at(eligible)

    array_job_id = array_task_id = het_job_id = het_job_offset = None
    job_id = str(job_id_raw)
    array = get("array")
    if array:
        array_job_id = array.get("job_id") or None
        array_task_id = unwrap_number(array.get("task_id"))
        if array_job_id is not None:
            if array_task_id is not None:
                job_id = f"{array_job_id}_{array_task_id}"
            else:
                job_id = _array_range_id(array_job_id, array)
    het = get("het")
    if het:
        het_job_id = het.get("job_id") or None
        het_job_offset = unwrap_number(het.get("job_offset"))
        if het_job_id is not None and het_job_offset is not None:
            job_id = f"{het_job_id}+{het_job_offset}"

    tres = get("tres") or {}
    alloc_tres = parse_tres_list(tres.get("allocated"))
    req_tres = parse_tres_list(tres.get("requested"))
    gpus = alloc_tres.get(GPU_KEY)
    models = [k[9:] for k in alloc_tres if k.startswith(_GPU_TYPED)]
    if gpus is None:
        gpus = sum(alloc_tres[f"{_GPU_TYPED}{m}"] for m in models)
    alloc_cpus = alloc_tres.get("cpu")
    if alloc_cpus is None:
        alloc_cpus = unwrap_number((get("required") or {}).get("CPUs")) or 0

    state = get("state") or {}
    current = state.get("current")
    if type(current) is list and len(current) == 1 and current[0] in BASE_STATES:
        state_name = current[0]  # the common case of v0.0.40+, without the general rules
    else:
        state_name = normalize_state(current)
    wckey = get("wckey")
    if type(wckey) is dict:
        wckey = wckey.get("wckey")
    nodelist = get("nodes") or ""
    try:
        nodes = expand_nodelist(nodelist)
    except ValueError:
        # the allocation still counts; only the per-node view is lost (nodelist keeps the text)
        nodes = ()
    else:
        if not nodes:
            nodelist = ""
    uid = get("uid")
    steps = get("steps")
    cpu_time, mem_task, mem_step, steps_read = _step_usage(steps) if steps else (None, None, None, None)

    return JobAttempt(
        cluster=get("cluster") or default_cluster,
        job_id_raw=job_id_raw,
        submit_at=submit_at,
        job_id=job_id,
        name=get("name") or "",
        user=get("user") or "",
        account=get("account") or "",
        partition=get("partition") or "",
        state=state_name,
        eligible_at=eligible_at,
        start_at=start_at,
        end_at=end_at,
        alloc_gpus=gpus,
        alloc_tres=alloc_tres,
        req_tres=req_tres,
        alloc_cpus=alloc_cpus,
        qos=get("qos") or "",
        wckey=wckey or "",
        gpu_model=models[0] if len(models) == 1 else "",
        array_job_id=array_job_id,
        array_task_id=array_task_id,
        het_job_id=het_job_id,
        het_job_offset=het_job_offset,
        exit_code=_exit_code(get("exit_code")),
        state_reason=state.get("reason") or "",
        time_limit_seconds=minutes_to_seconds(time_get("limit")),
        nodelist=nodelist,
        nodes=nodes,
        uid=uid if type(uid) is int else None,
        work_dir=get("working_directory") or "",
        submit_line=get("submit_line") or "",
        stdout_path=get("stdout_expanded") or "",
        stdout_pattern=get("stdout") or "",
        cpu_time_seconds=cpu_time,
        mem_peak_task_bytes=mem_task,
        mem_peak_step_bytes=mem_step,
        usage_steps=steps_read,
    )


def _step_usage(steps: Any) -> tuple[float | None, int | None, int | None, int | None]:
    """(TotalCPU seconds, largest task RSS, largest step RSS, steps read) of a job's steps.

    Every version from v0.0.37 names them alike: `time.total` {seconds, microseconds} (user +
    system), and `tres.requested.max` / `.total` (what sacct -P calls TRESUsageInMax /
    TRESUsageInTot) with `mem` in bytes. A step without a figure adds nothing to it.
    """
    if type(steps) is not list:
        return None, None, None, None
    cpu: float | None = None
    task_peak: int | None = None
    step_peak: int | None = None
    read = 0
    for step in steps:
        if type(step) is not dict:
            continue
        read += 1
        total = (step.get("time") or {}).get("total")
        if type(total) is dict:
            seconds = unwrap_number(total.get("seconds"))
            micros = unwrap_number(total.get("microseconds"))
            if seconds is not None or micros is not None:
                cpu = (cpu or 0.0) + (seconds or 0) + (micros or 0) / 1e6
        usage = (step.get("tres") or {}).get("requested")
        if type(usage) is dict:
            task = _tres_mem(usage.get("max"))
            if task is not None:
                task_peak = task if task_peak is None else max(task_peak, task)
            whole = _tres_mem(usage.get("total"))
            if whole is not None:
                step_peak = whole if step_peak is None else max(step_peak, whole)
    if not read:
        return None, None, None, None
    return (round(cpu, 6) if cpu is not None else None), task_peak, step_peak, read


def _tres_mem(items: Any) -> int | None:
    if type(items) is not list:
        return None
    for item in items:
        if type(item) is dict and item.get("type") == "mem":
            count = unwrap_number(item.get("count"))
            return count if count is not None and count >= 0 else None
    return None


def _at(value: Any) -> datetime | None:
    """Epoch seconds -> aware UTC datetime; 0, null and unset objects mean "not set"."""
    if type(value) is not int:
        if not value:
            return None
        value = unwrap_number(value)
    if not value:
        return None
    return _from_epoch(value, UTC)


def _array_range_id(array_job_id: int, array: dict[str, Any]) -> str:
    """The id sacct shows for a pending array's meta record: "10_[1-4%2]"."""
    task = array.get("task")
    if not isinstance(task, str) or not task:
        return str(array_job_id)
    if task.startswith("0x"):
        # v0.0.37/38 print the pending task set as a hex bitmap
        try:
            task = _bitmap_ranges(int(task, 16))
        except ValueError:
            return str(array_job_id)
    limit = unwrap_number(((array.get("limits") or {}).get("max") or {}).get("running", {}).get("tasks"))
    if limit and "%" not in task:
        task = f"{task}%{limit}"
    return f"{array_job_id}_[{task}]"


def _bitmap_ranges(bits: int) -> str:
    ranges: list[str] = []
    index = 0
    while bits >> index:
        if bits >> index & 1:
            first = index
            while bits >> (index + 1) & 1:
                index += 1
            ranges.append(str(first) if first == index else f"{first}-{index}")
        index += 1
    return ",".join(ranges)


def _exit_code(value: Any) -> str:
    """sacct's "return_code:signal" ("1:0", "0:125") from any version's exit_code object."""
    if type(value) is not dict:
        return ""
    rc = unwrap_number(value.get("return_code"))
    signal = value.get("signal")
    sig = None
    if type(signal) is dict:
        # v0.0.37/38: {"signal_id": 125, "name": ...}; v0.0.40+: {"id": {set, number}, "name": ...}
        sig = unwrap_number(signal["id"] if "id" in signal else signal.get("signal_id"))
    if rc is None and sig is None:
        return ""
    return _EXIT_CODES.get((rc, sig)) or f"{rc or 0}:{sig or 0}"


# the exit codes nearly every job has, without formatting them again
_EXIT_CODES = {(rc, sig): f"{rc or 0}:{sig or 0}" for rc in (None, 0, 1, 2) for sig in (None, 0)}


def _check_schema(meta: dict[str, Any], origin: str) -> None:
    plugin = meta.get("plugin")
    plugin = plugin if isinstance(plugin, dict) else {}
    plugins = meta.get("plugins")
    plugins = plugins if isinstance(plugins, dict) else {}
    plugin_type = plugin.get("type")
    plugin_type = plugin_type if isinstance(plugin_type, str) else ""
    if _SLURMCTLD.fullmatch(plugin_type):
        raise ParseError(
            f"{origin}: this is slurmctld job JSON ({plugin_type}: squeue --json or slurmrestd /slurm/), "
            "not sacct --json"
        )
    # 23.02 names the parser in meta.plugins, 23.11+ in meta.plugin.data_parser (with type
    # "" or "openapi/slurmdbd"), 21.08/22.05 only in meta.plugin.type
    for label in (plugin.get("data_parser"), plugins.get("data_parser"), plugin_type):
        if not isinstance(label, str) or not label or label == "openapi/slurmdbd":
            continue
        m = _SCHEMA.fullmatch(label)
        if m is None or int(m.group(1)) not in SUPPORTED_VERSIONS:
            raise ParseError(f"{origin}: unknown sacct JSON schema '{label}'; supported: {SUPPORTED_SCHEMAS}")
        return
    # meta names no schema: the jobs are read by shape


def _meta_cluster(meta: Any) -> str:
    if not isinstance(meta, dict):
        return ""
    slurm = meta.get("slurm") or meta.get("Slurm")
    cluster = slurm.get("cluster") if isinstance(slurm, dict) else None
    return cluster if isinstance(cluster, str) else ""


def _looks_like_job(job: Any) -> bool:
    return type(job) is dict and "job_id" in job and type(job.get("time")) is dict and "state" in job


def _describe_errors(errors: Any) -> str:
    if not isinstance(errors, list):
        return str(errors)[:500]
    parts = []
    for err in errors[:5]:
        if isinstance(err, dict):
            parts.append(str(err.get("description") or err.get("error") or err))
        else:
            parts.append(str(err))
    return "; ".join(parts)[:500]


def _reject(origin: str, key: str, reason: str, job: Any) -> Rejected:
    if type(job) is dict:
        job = {k: v for k, v in job.items() if k != "steps"}
    try:
        raw = orjson.dumps(job).decode()
    except TypeError:
        raw = repr(job)
    return Rejected(source=SOURCE, origin=origin, record_key=key, reason=reason, raw=raw)


# --- truncated or damaged input ---------------------------------------------------------------

_WS = re.compile(r"[ \t\n\r]*")
_PARTIAL_TOKEN = re.compile(
    r"-?\d*(?:\.\d*)?(?:[eE][+-]?\d*)?|t(?:r(?:ue?)?)?|f(?:a(?:l(?:se?)?)?)?|n(?:u(?:ll?)?)?"
)


class _Truncated(Exception):
    def __init__(self, pos: int) -> None:
        super().__init__(pos)
        self.pos = pos


def _recover(raw: str | bytes, origin: str) -> tuple[Any, Rejected | None]:
    """Read what can be read of a document orjson refused.

    Invalid UTF-8 is replaced and the document read again. A document cut short keeps every
    job before the cut; anything else is a ParseError.
    """
    if not raw.strip():
        raise ParseError(f"{origin}: empty input, expected sacct JSON")
    text = raw if isinstance(raw, str) else raw.decode("utf-8", "replace")
    if not isinstance(raw, str):
        try:
            return orjson.loads(text), None
        except orjson.JSONDecodeError:
            pass
    decoder = json.JSONDecoder()
    doc: dict[str, Any] = {}
    jobs: list[Any] = []
    try:
        _scan_document(text, decoder, doc, jobs)
    except _Truncated as cut:
        at = _byte_offset(text, cut.pos)
        if not jobs:
            raise ParseError(f"{origin}: truncated JSON before any complete job (at byte {at})") from None
        truncation = Rejected(
            source=SOURCE,
            origin=origin,
            record_key="truncated input",
            reason=f"truncated JSON after {len(jobs)} complete jobs at byte {at}",
            raw=text[cut.pos : cut.pos + TAIL_CHARS],
        )
        return doc, truncation
    except ValueError as bad:
        raise ParseError(f"{origin}: invalid JSON: {bad}") from None
    # the whole document was read: orjson refused something Python's json accepts (an
    # integer beyond 64 bits, say)
    return doc, None


def _scan_document(text: str, decoder: json.JSONDecoder, doc: dict[str, Any], jobs: list[Any]) -> None:
    """Read the top-level object key by key and "jobs" element by element into DOC and JOBS.

    Raises _Truncated at the start of the first value the text ends inside of, ValueError when
    the text is not JSON for another reason, and returns when the whole object was read.
    """
    end = len(text)
    pos = _WS.match(text, 0).end()  # type: ignore[union-attr]
    if pos >= end:
        raise _Truncated(pos)
    if text[pos] != "{":
        raise ValueError(f"expected an object at char {pos}")
    pos += 1
    while True:
        pos = _WS.match(text, pos).end()  # type: ignore[union-attr]
        if pos >= end:
            raise _Truncated(pos)
        char = text[pos]
        if char == "}":
            if _WS.match(text, pos + 1).end() != end:  # type: ignore[union-attr]
                raise ValueError(f"extra data after the document at char {pos + 1}")
            return
        if char == ",":
            pos += 1
            continue
        item_start = pos
        key, pos = _decode(decoder, text, pos, item_start)
        pos = _WS.match(text, pos).end()  # type: ignore[union-attr]
        if pos >= end:
            raise _Truncated(item_start)
        if text[pos] != ":":
            raise ValueError(f"expected ':' at char {pos}")
        pos = _WS.match(text, pos + 1).end()  # type: ignore[union-attr]
        if pos >= end:
            raise _Truncated(item_start)
        if key == "jobs" and text[pos] == "[":
            doc["jobs"] = jobs
            pos = _scan_array(text, decoder, pos + 1, jobs)
        else:
            doc[key], pos = _decode(decoder, text, pos, item_start)


def _scan_array(text: str, decoder: json.JSONDecoder, pos: int, items: list[Any]) -> int:
    """Read array elements into ITEMS; a cut reports the end of the last complete element."""
    end = len(text)
    after_last = pos
    try:
        while True:
            pos = _WS.match(text, pos).end()  # type: ignore[union-attr]
            if pos >= end:
                raise _Truncated(pos)
            char = text[pos]
            if char == "]":
                return pos + 1
            if char == ",":
                pos += 1
                continue
            item, pos = _decode(decoder, text, pos, pos)
            items.append(item)
            after_last = pos
    except _Truncated:
        raise _Truncated(after_last) from None


def _decode(decoder: json.JSONDecoder, text: str, pos: int, restart: int) -> tuple[Any, int]:
    try:
        return decoder.raw_decode(text, pos)
    except json.JSONDecodeError as exc:
        if _ends_inside(text, exc):
            raise _Truncated(restart) from None
        raise ValueError(f"{exc.msg} at char {exc.pos}") from None


def _ends_inside(text: str, exc: json.JSONDecodeError) -> bool:
    """Whether a decode error means "the text stopped" rather than "the text is wrong"."""
    if exc.pos >= len(text) or exc.msg.startswith("Unterminated string"):
        return True
    if exc.msg.startswith("Invalid \\uXXXX escape") or exc.msg.startswith("Invalid \\escape"):
        return exc.pos >= len(text) - 6
    # a number or literal cut in the middle: "tru", "-", "12."
    return _PARTIAL_TOKEN.fullmatch(text, exc.pos) is not None


def _byte_offset(text: str, pos: int) -> int:
    return len(text[:pos].encode("utf-8", "replace"))


__all__ = ["SUPPORTED_SCHEMAS", "parse_sacct_json"]
