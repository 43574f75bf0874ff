"""`sacct --json` (and slurmrestd `/slurmdb/v0.0.4x/jobs`) -> JobAttempt records.

Every schema from Slurm 21.08 (openapi/dbv0.0.37) to 25.11 (data_parser/v0.0.44) is read by the
same per-job code: the fields slurmtel uses only changed shape between versions (a string or a
list of states, a plain int or a `{"set", "infinite", "number"}` object), and each field is read
in a way that accepts every shape. Slurm's "not set" values (NO_VAL/INFINITE in every width,
`{"set": false}`, 0 epochs) are read as not set everywhere. `meta` names the schema; a version
slurmtel does not know (a newer Slurm) is read by the newest known shape, with a SchemaNotice;
only a document whose jobs have no known shape is refused. Without a readable `meta` (a
slurmrestd response trimmed by a proxy, a truncated file whose `meta` came after the jobs) the
jobs are read by shape. "Nothing found" (error 9003) beside an empty jobs list is an empty window.

Only allocations become attempts; the steps nested under each job (sacct without -X) give
the attempt's usage: TotalCPU summed over the steps, the largest task's and the largest step's
peak memory (TRESUsageInMax / TRESUsageInTot mem).

A well-formed document is read job by job: msgspec finds each job's text and reads the fields
an attempt needs straight into typed structs when the job has the shapes of a current sacct
(v0.0.40+); a job of another shape, or one to reject, is decoded by orjson and read by the
general rules, with the same results; anything else (truncated, damaged, nested too deep) is
read value by value (json_scan), the slower general way, with the same results; a job that
cannot be read is rejected alone.
"""

from __future__ import annotations

import dataclasses
import json
import re
from datetime import UTC, datetime
from operator import attrgetter
from typing import Any

import msgspec
import orjson

from slurmtel.errors import ParseError
from slurmtel.gcpause import gc_paused
from slurmtel.parsers.json_scan import BadItem, NotAnObject, Truncated, byte_offset, loads_one, scan_object
from slurmtel.parsers.slurm_common import (
    BASE_STATES,
    GPU_KEY,
    NO_VAL16,
    NO_VAL32,
    SENTINELS,
    attempt_nodes,
    minutes_to_seconds,
    normalize_state,
    only_informational,
    parse_tres_list,
    slurm_epoch,
    unknown_schema,
    unwrap_number,
)
from slurmtel.records import NEWEST_KNOWN_SCHEMA, JobAttempt, Rejected, SchemaNotice, type_problem

SOURCE = "sacct"
SUPPORTED_SCHEMAS = "openapi/dbv0.0.37, openapi/dbv0.0.38, data_parser/v0.0.39 .. data_parser/v0.0.44"
NEWEST_SCHEMA = NEWEST_KNOWN_SCHEMA
# how much of a broken tail (characters) a truncation record keeps
TAIL_CHARS = 4096
# how much of a job's text a Rejected record keeps when the job cannot be decoded
MAX_RAW_CHARS = 65536

# slurmctld's own plugin names: squeue --json and slurmrestd /slurm/ responses, not accounting
_SLURMCTLD = re.compile(r"openapi/(?:v0\.0\.\d+|slurmctld)")
_GPU_TYPED = GPU_KEY + ":"
_from_epoch = datetime.fromtimestamp
# epochs at or below this are 16-bit sentinels or 1970: the checked path reads them
_EARLIEST_EPOCH = 0xFFFF


def parse_sacct_json(
    raw: str | bytes, *, origin: str = "<input>", default_cluster: str = ""
) -> list[JobAttempt | Rejected | SchemaNotice]:
    """Parse one `sacct --json` document into attempts; bad jobs become Rejected records.

    Raises ParseError when the input as a whole cannot be read: not JSON, not an object, no
    "jobs" list, slurmctld job JSON instead of sacct's, Slurm's errors without any job (but
    "Nothing found", error 9003, is an empty window: []). A schema version slurmtel does not
    know is read by the newest shape it knows, with a SchemaNotice in the result; only objects
    that do not look like sacct jobs under such a schema are refused. A truncated document
    keeps every job that was complete before the cut, plus one Rejected record that says where
    the cut is. A job that cannot be read (not JSON, nested 1000 deep, a value of the wrong
    kind) is rejected alone; so is one whose field holds a JSON type its record cannot (a
    cluster that is an object: slurmtel.records.type_problem). A job that names no cluster takes
    meta's, else DEFAULT_CLUSTER (--cluster, site.cluster). A top-level value nested too deeply
    to read, outside the jobs, is skipped with a Rejected naming it; the jobs are read.
    """
    # A bulk sacct call becomes hundreds of thousands of small acyclic objects; with the cyclic
    # collector on, CPython rescans them again and again while they are built (twice the time).
    with gc_paused():
        return _parse(raw, origin, default_cluster)


class _Envelope(msgspec.Struct):
    """A sacct JSON document with its jobs left as undecoded JSON text."""

    jobs: list[msgspec.Raw]
    meta: Any = None
    errors: Any = None
    warnings: Any = None


# msgspec checks the whole document and finds each job's bytes without building a thing
_ENVELOPE = msgspec.json.Decoder(_Envelope)


def _parse(
    raw: str | bytes, origin: str, fallback_cluster: str = ""
) -> list[JobAttempt | Rejected | SchemaNotice]:
    # Job by job: each job is decoded (orjson), read and freed before the next, so the work
    # stays in the CPU caches and a 20,000-job document never exists as 4 million Python
    # objects at once (a third of the time of decoding it whole, and a fraction of the memory).
    try:
        envelope = _ENVELOPE.decode(raw)
    except (msgspec.DecodeError, RecursionError, UnicodeError):
        # not an object with a "jobs" list, truncated, damaged, nested deeper than msgspec
        # goes, a str with unpaired surrogates: the general path reads what can be read and
        # says what cannot
        return _parse_whole(raw, origin, fallback_cluster)
    reader = _Reader(origin, fallback_cluster)
    reader.set_meta(envelope.meta)
    reader.errors = envelope.errors
    jobs = envelope.jobs
    del envelope
    decode = _JOB.decode
    default_cluster = reader.default_cluster
    append = reader.out.append
    for index, job in enumerate(jobs):
        # each job is freed once it is read: its memory, still in the caches, takes the next one
        jobs[index] = None  # type: ignore[call-overload]
        # the shapes every job of a current sacct has, read straight into typed fields; any
        # other shape, and any job to reject, by the general per-job path below
        try:
            attempt = _fast_attempt(decode(job), default_cluster)
        except (msgspec.MsgspecError, _Slow, ValueError, OverflowError, OSError, RecursionError):
            attempt = None
        # its text fields are str by the structs' types: only NUL is left for type_problem
        if attempt is not None and "\x00" not in "".join(_TEXT_OF(attempt)):
            reader.seen += 1
            reader.any_job = True
            append(attempt)
            continue
        reader.read_text(index, job)
    return reader.finish()


class _Slow(Exception):
    """A job the typed path leaves to the general one (a shape or value it does not take)."""


class _Number(msgspec.Struct):
    """Slurm's {"set", "infinite", "number"} (v0.0.40+), defaults as unwrap_number reads them."""

    set: bool = True
    infinite: bool = False
    number: int | None = None


_Int = int | _Number | None


def _number(value: _Int | msgspec.UnsetType, bits: int = 32) -> int | None:
    """unwrap_number for the typed shapes."""
    if type(value) is int:
        return None if value >= NO_VAL16 and value in SENTINELS[bits] else value
    if type(value) is not _Number:
        return None
    if value.infinite or not value.set:
        return None
    number = value.number
    if number is None:
        return None
    return None if number >= NO_VAL16 and number in SENTINELS[bits] else number


class _Time(msgspec.Struct):
    submission: int
    start: int = 0
    end: int = 0
    eligible: int = 0
    limit: _Int = None


class _Array(msgspec.Struct):
    job_id: _Int = None
    task_id: _Int = None


class _Het(msgspec.Struct):
    job_id: _Int = None
    job_offset: _Int = None


class _TresItem(msgspec.Struct):
    type: str
    name: str
    count: int


class _Tres(msgspec.Struct):
    allocated: list[_TresItem] | None = None
    requested: list[_TresItem] | None = None


class _State(msgspec.Struct):
    current: list[str] | str | None = None
    reason: str | None = None


class _Wckey(msgspec.Struct):
    wckey: str | None = None


class _Signal(msgspec.Struct):
    id: _Int | msgspec.UnsetType = msgspec.UNSET
    signal_id: _Int = None


class _ExitCode(msgspec.Struct):
    return_code: _Int = None
    signal: _Signal | None = None


class _StepTotal(msgspec.Struct):
    seconds: _Int = None
    microseconds: _Int = None


class _StepTime(msgspec.Struct):
    total: _StepTotal | None = None


class _StepTresItem(msgspec.Struct):
    type: str | None = None
    count: _Int = None


class _StepUsage(msgspec.Struct):
    max: list[_StepTresItem] | None = None
    total: list[_StepTresItem] | None = None


class _StepTres(msgspec.Struct):
    requested: _StepUsage | None = None


class _Step(msgspec.Struct):
    """What _step_usage reads of a step; the rest of it (nodes, tasks, the other TRES figures,
    statistics: most of a job's JSON with steps) is skipped without being built."""

    time: _StepTime | None = None
    tres: _StepTres | None = None


class _Job(msgspec.Struct):
    """The fields of a sacct job that an attempt reads, in the shapes of v0.0.40+ (plain epochs,
    number objects, state lists); unknown fields are skipped without being built."""

    job_id: int
    time: _Time
    state: _State
    cluster: str | None = None
    name: str | None = None
    user: str | None = None
    account: str | None = None
    partition: str | None = None
    qos: str | None = None
    wckey: str | _Wckey | None = None
    nodes: str | None = None
    uid: _Int = None
    array: _Array | None = None
    het: _Het | None = None
    tres: _Tres | None = None
    exit_code: _ExitCode | None = None
    working_directory: str | None = None
    submit_line: str | None = None
    stdout_expanded: str | None = None
    stdout: str | None = None
    steps: list[_Step] | None = None


_JOB = msgspec.json.Decoder(_Job)


def _epoch(value: int) -> datetime | None:
    """_at for a plain epoch: a time, or None for 0 (not set); any other value to _Slow."""
    if _EARLIEST_EPOCH < value < NO_VAL32:
        return _from_epoch(value, UTC)
    if value == 0:
        return None
    raise _Slow


def _tres(items: list[_TresItem] | None) -> dict[str, int]:
    """parse_tres_list for the typed items."""
    tres: dict[str, int] = {}
    if not items:
        return tres
    for item in items:
        count = item.count
        if count >= NO_VAL32:
            raise _Slow
        tres_type = item.type
        if count < 0 or not tres_type:
            continue
        name = item.name
        tres[f"{tres_type}/{name}" if name else tres_type] = count
    return tres


def _fast_attempt(job: _Job, default_cluster: str) -> JobAttempt:
    """_attempt for a job in the typed shapes: the same attempt, or _Slow for a job _attempt
    would read by its general rules or reject (the general path then reads it)."""
    job_id_raw = job.job_id
    if not 0 < job_id_raw < NO_VAL32:
        raise _Slow
    time = job.time
    submission = time.submission
    submit_at = _epoch(submission)
    if submit_at is None:
        raise _Slow
    start_at = _epoch(time.start)
    end_at = _epoch(time.end)
    if start_at is not None and end_at is not None and end_at < start_at:
        raise _Slow
    eligible = time.eligible
    eligible_at = submit_at if eligible == submission else _epoch(eligible)

    array_job_id = array_task_id = het_job_id = het_job_offset = None
    job_id = str(job_id_raw)
    array = job.array
    if array is not None:
        array_job_id = _number(array.job_id) or None
        array_task_id = _number(array.task_id)
        if array_job_id is not None:
            if array_task_id is None:
                raise _Slow  # a pending array's range id
            job_id = f"{array_job_id}_{array_task_id}"
    het = job.het
    if het is not None:
        het_job_id = _number(het.job_id) or None
        het_job_offset = _number(het.job_offset)
        if het_job_id is not None and het_job_offset is not None:
            job_id = f"{het_job_id}+{het_job_offset}"

    tres = job.tres
    alloc_tres = _tres(tres.allocated) if tres is not None else {}
    req_tres = _tres(tres.requested) if tres is not None else {}
    gpus = alloc_tres.get(GPU_KEY)
    models = [k[9:] for k in alloc_tres if k.startswith(_GPU_TYPED)]
    if gpus is None:
        gpus = sum(alloc_tres[f"{_GPU_TYPED}{m}"] for m in models)
    alloc_cpus = alloc_tres.get("cpu")
    if alloc_cpus is None:
        raise _Slow  # from required.CPUs

    state = job.state
    current = state.current
    if type(current) is list and len(current) == 1 and current[0] in BASE_STATES:
        state_name = current[0]
    else:
        state_name = normalize_state(current)
    wckey = job.wckey
    if isinstance(wckey, _Wckey):
        wckey = wckey.wckey
    nodelist, nodes = attempt_nodes(job.nodes or "")
    steps = job.steps
    cpu_time, mem_task, mem_step, steps_read = _typed_step_usage(steps) if steps else (None, None, None, None)
    limit = _number(time.limit)

    # positional, in JobAttempt's field order (faster than 38 keywords; the tests compare
    # every attempt with the general path's)
    return JobAttempt(
        job.cluster or default_cluster,  # cluster
        job_id_raw,  # job_id_raw
        submit_at,  # submit_at
        job_id,  # job_id
        job.name or "",  # name
        job.user or "",  # user
        job.account or "",  # account
        job.partition or "",  # partition
        state_name,  # state
        eligible_at,  # eligible_at
        start_at,  # start_at
        end_at,  # end_at
        gpus,  # alloc_gpus
        alloc_tres,  # alloc_tres
        req_tres,  # req_tres
        alloc_cpus,  # alloc_cpus
        job.qos or "",  # qos
        wckey or "",  # wckey
        models[0] if len(models) == 1 else "",  # gpu_model
        array_job_id,  # array_job_id
        array_task_id,  # array_task_id
        het_job_id,  # het_job_id
        het_job_offset,  # het_job_offset
        None,  # db_index
        _fast_exit_code(job.exit_code),  # exit_code
        state.reason or "",  # state_reason
        None if limit is None or limit < 0 or limit >= NO_VAL32 else limit * 60,  # time_limit_seconds
        nodelist,  # nodelist
        nodes,  # nodes
        _number(job.uid),  # uid
        job.working_directory or "",  # work_dir
        job.submit_line or "",  # submit_line
        job.stdout_expanded or "",  # stdout_path
        job.stdout or "",  # stdout_pattern
        cpu_time,  # cpu_time_seconds
        mem_task,  # mem_peak_task_bytes
        mem_step,  # mem_peak_step_bytes
        steps_read,  # usage_steps
    )


def _fast_exit_code(value: _ExitCode | None) -> str:
    """_exit_code for the typed shape."""
    if value is None:
        return ""
    rc = _number(value.return_code)
    signal = value.signal
    sig = None
    if signal is not None:
        sig = _number(signal.id if signal.id is not msgspec.UNSET else signal.signal_id, 16)
    if rc is None and sig is None:
        return ""
    return _EXIT_CODES.get((rc, sig)) or f"{rc or 0}:{sig or 0}"


def _parse_whole(
    raw: str | bytes, origin: str, fallback_cluster: str = ""
) -> list[JobAttempt | Rejected | SchemaNotice]:
    """The general path: the document read value by value, each job on its own.

    Memory is bounded by the largest job, not by the document: every job is read into an
    attempt as soon as it is found (a truncated 150 MB capture is no longer 2 GB of objects).
    """
    text = raw if isinstance(raw, str) else raw.decode("utf-8", "replace")
    if not text.strip():
        raise ParseError(f"{origin}: empty input, expected sacct JSON")
    return _scan(text, origin, fallback_cluster)


class _BadText(Exception):
    """A job's text that is not JSON (or is too deeply nested to read)."""


def _decode_job(raw: msgspec.Raw | str) -> Any:
    """One job's JSON text -> objects; what orjson refuses (a 1e999, bad UTF-8, an integer
    beyond 64 bits, nesting past 1024) by Python's json, and _BadText when neither reads it."""
    try:
        return orjson.loads(memoryview(raw) if isinstance(raw, msgspec.Raw) else raw)
    except orjson.JSONDecodeError:
        pass
    try:
        return loads_one(_raw_text(raw))
    except ValueError as exc:
        raise _BadText(str(exc)) from None


def _raw_text(raw: msgspec.Raw | str) -> str:
    return bytes(raw).decode("utf-8", "replace") if isinstance(raw, msgspec.Raw) else raw


class _Reader:
    """Turns a document's jobs into records one at a time, with the document-level checks.

    `meta` may come before the jobs (sacct up to 23.02) or after them (23.11+): a cluster name
    it brings late is given to the attempts read without one.
    """

    def __init__(self, origin: str, fallback_cluster: str = "") -> None:
        self.origin = origin
        # the cluster of a job that names none when meta names none either
        self.fallback_cluster = fallback_cluster
        self.meta: Any = None
        self.errors: Any = None
        self.out: list[JobAttempt | Rejected | SchemaNotice] = []
        self.default_cluster = ""
        self.notice: SchemaNotice | None = None
        # objects read, and whether each / any of them looked like a sacct job
        self.seen = 0
        self.all_jobs = True
        self.any_job = False

    def set_meta(self, meta: Any) -> None:
        self.meta = meta
        if isinstance(meta, dict):
            self.notice = _check_schema(meta, self.origin)
        cluster = _meta_cluster(meta)
        if cluster and cluster != self.default_cluster:
            self.default_cluster = cluster
            self.out = [
                dataclasses.replace(r, cluster=cluster) if isinstance(r, JobAttempt) and not r.cluster else r
                for r in self.out
            ]

    def read_text(self, index: int, raw: msgspec.Raw | str) -> None:
        try:
            job = _decode_job(raw)
        except _BadText as exc:
            self.seen += 1
            self.all_jobs = False
            self.out.append(
                Rejected(
                    SOURCE, self.origin, f"jobs[{index}]", f"job is {exc}", _raw_text(raw)[:MAX_RAW_CHARS]
                )
            )
            return
        self.read(index, job, raw)

    def read(self, index: int, job: Any, raw: msgspec.Raw | str | None = None) -> None:
        append = self.out.append
        if not self.seen and type(job) is dict and "job_state" in job and "state" not in job:
            raise ParseError(f"{self.origin}: this is slurmctld job JSON (squeue --json), not sacct --json")
        self.seen += 1
        if type(job) is not dict:
            self.all_jobs = False
            append(_reject(self.origin, f"jobs[{index}]", "job is not a JSON object", job, raw))
            return
        if _looks_like_job(job):
            self.any_job = True
        else:
            self.all_jobs = False
        try:
            attempt, problem = _type_problem(_attempt(job, self.default_cluster))
            if problem is not None:
                raise _BadJob(f"job {_shown_id(job.get('job_id'))}", problem)
            append(attempt)
        except _BadJob as exc:
            append(_reject(self.origin, exc.key, exc.reason, job, raw))
        except (TypeError, ValueError, AttributeError, OverflowError, OSError, RecursionError) as exc:
            key = f"job {_shown_id(job.get('job_id'))}" if "job_id" in job else f"jobs[{index}]"
            append(_reject(self.origin, key, f"unreadable job: {exc or type(exc).__name__}", job, raw))

    def finish(self, truncation: Rejected | None = None) -> list[JobAttempt | Rejected | SchemaNotice]:
        if self.errors and not self.seen and not only_informational(self.errors):
            raise ParseError(
                f"{self.origin}: sacct reported errors and no jobs: {_describe_errors(self.errors)}"
            )
        if self.notice is not None and self.seen and not self.any_job:
            # read by the newest known shape, and nothing had that shape: some other document
            raise ParseError(
                f"{self.origin}: unknown sacct JSON schema '{self.notice.schema}', and its job objects "
                f"do not have the shape of any known one ({SUPPORTED_SCHEMAS})"
            )
        if truncation is not None and not isinstance(self.meta, dict) and not self.all_jobs:
            raise ParseError(f"{self.origin}: truncated JSON whose job objects are not sacct jobs")
        out = self.out
        if self.fallback_cluster and not self.default_cluster:
            fallback = self.fallback_cluster
            out = [
                dataclasses.replace(r, cluster=fallback) if isinstance(r, JobAttempt) and not r.cluster else r
                for r in out
            ]
        if self.notice is not None:
            out.insert(0, self.notice)
        if truncation is not None:
            out.append(truncation)
        return out


# The fields of an attempt that _attempt takes from the job as they are (a JSON value of any
# type) or builds from its text (so they may hold NUL): every other field has its type by
# construction (ints from unwrap_number, datetimes from _at, the node tuple from hostlist).
_TEXT_OF = attrgetter(
    "cluster",
    "job_id",
    "name",
    "user",
    "account",
    "partition",
    "state",
    "qos",
    "wckey",
    "gpu_model",
    "exit_code",
    "state_reason",
    "nodelist",
    "work_dir",
    "submit_line",
    "stdout_path",
    "stdout_pattern",
)


def _type_problem(attempt: JobAttempt) -> tuple[JobAttempt, str | None]:
    """type_problem(ATTEMPT) for an attempt _attempt built, checking only what it may get wrong.

    The common case (every text field a str without NUL, the TRES maps keyed by str) is
    answered in one join each; anything else goes to type_problem, which names the field or
    replaces the NULs, so the result is type_problem's in every case."""
    try:
        clean = "\x00" not in "".join(_TEXT_OF(attempt))
        "".join(attempt.alloc_tres)
        "".join(attempt.req_tres)
    except TypeError:
        clean = False
    return (attempt, None) if clean else type_problem(attempt)


def _shown_id(value: Any) -> str:
    text = repr(value) if not isinstance(value, int | str) else str(value)
    return text[:40]


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
    if type(job_id_raw) is not int or not 0 < job_id_raw < NO_VAL32:
        # a number object, NO_VAL, or something that is no job id at all
        shown = _shown_id(job_id_raw)
        job_id_raw = unwrap_number(job_id_raw) if job_id_raw is not None else None
        if job_id_raw is None:
            raise _BadJob("job ?", f"no job_id (it is {shown})" if shown != "None" else "no job_id")
        if job_id_raw < 0:
            raise _BadJob(f"job {job_id_raw}", f"job_id is {job_id_raw}, negative")
    time = get("time")
    if type(time) is not dict:
        raise _BadJob(f"job {job_id_raw}", "no time object")
    time_get = time.get
    submission = time_get("submission")
    submit_at = _at(submission, "submission")
    if submit_at is None:
        raise _BadJob(f"job {job_id_raw}", "no submission time")
    start_at = _at(time_get("start"), "start")
    end_at = _at(time_get("end"), "end")
    if start_at is not None and end_at is not None and end_at < start_at:
        raise _BadJob(f"job {job_id_raw}", f"end {end_at.isoformat()} precedes start {start_at.isoformat()}")
    eligible = time_get("eligible")
    # most jobs are eligible when submitted: share the datetime instead of building another
    eligible_at = submit_at if eligible == submission and type(eligible) is int else _at(eligible, "eligible")

    array_job_id = array_task_id = het_job_id = het_job_offset = None
    job_id = str(job_id_raw)
    array = get("array")
    if array:
        array_job_id = unwrap_number(array.get("job_id")) or None
        array_task_id = unwrap_number(array.get("task_id"))
        if array_job_id is not None:
            if array_task_id is not None:
                job_id = f"{array_job_id}_{array_task_id}"
            else:
                job_id = _array_range_id(array_job_id, array)
    het = get("het")
    if het:
        het_job_id = unwrap_number(het.get("job_id")) or None
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
    nodelist, nodes = attempt_nodes(get("nodes") or "")
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
        uid=unwrap_number(uid),
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


def _typed_step_usage(steps: list[_Step]) -> tuple[float | None, int | None, int | None, int | None]:
    """_step_usage for steps in the typed shapes (the tests compare both)."""
    cpu: float | None = None
    task_peak: int | None = None
    step_peak: int | None = None
    for step in steps:
        time = step.time
        total = time.total if time is not None else None
        if total is not None:
            seconds = _number(total.seconds)
            micros = _number(total.microseconds)
            if seconds is not None or micros is not None:
                cpu = (cpu or 0.0) + (seconds or 0) + (micros or 0) / 1e6
        tres = step.tres
        usage = tres.requested if tres is not None else None
        if usage is not None:
            task = _typed_tres_mem(usage.max)
            if task is not None:
                task_peak = task if task_peak is None else max(task_peak, task)
            whole = _typed_tres_mem(usage.total)
            if whole is not None:
                step_peak = whole if step_peak is None else max(step_peak, whole)
    return (round(cpu, 6) if cpu is not None else None), task_peak, step_peak, len(steps)


def _typed_tres_mem(items: list[_StepTresItem] | None) -> int | None:
    for item in items or ():
        if item.type == "mem":
            count = _number(item.count)
            return count if count is not None and count >= 0 else None
    return None


def _tres_mem(items: Any) -> int | None:
    if type(items) is not list:
        return None
    for item in items:
        if type(item) is dict and item.get("type") == "mem":
            count = unwrap_number(item.get("count"))
            return count if count is not None and count >= 0 else None
    return None


def _at(value: Any, name: str) -> datetime | None:
    """Epoch seconds -> aware UTC datetime. 0, null, unset objects and Slurm's NO_VAL/INFINITE
    (4294967294: time.start of a job that never started, 23.x-24.x) mean "not set"; a number
    no clock can show (year 36812) is an error naming the field."""
    if type(value) is int and _EARLIEST_EPOCH < value < NO_VAL32:
        return _from_epoch(value, UTC)
    seconds = slurm_epoch(value)
    if seconds is None:
        return None
    try:
        return _from_epoch(seconds, UTC)
    except (OverflowError, ValueError, OSError):
        raise ValueError(f"time.{name} is {seconds}, not a time") from None


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
        sig = unwrap_number(signal["id"] if "id" in signal else signal.get("signal_id"), 16)
    if rc is None and sig is None:
        return ""
    return _EXIT_CODES.get((rc, sig)) or f"{rc or 0}:{sig or 0}"


# the exit codes nearly every job has, without formatting them again
_EXIT_CODES = {(rc, sig): f"{rc or 0}:{sig or 0}" for rc in (None, 0, 1, 2) for sig in (None, 0)}


def _check_schema(meta: dict[str, Any], origin: str) -> SchemaNotice | None:
    """Refuse slurmctld's JSON; a schema version slurmtel does not know gives a notice (the
    jobs are read by the newest known shape); a known one, or none named, gives None."""
    plugin = meta.get("plugin")
    plugin = plugin if isinstance(plugin, dict) else {}
    plugin_type = plugin.get("type")
    plugin_type = plugin_type if isinstance(plugin_type, str) else ""
    if _SLURMCTLD.fullmatch(plugin_type):
        raise ParseError(
            f"{origin}: this is slurmctld job JSON ({plugin_type}: squeue --json or slurmrestd /slurm/), "
            "not sacct --json"
        )
    # an unknown one is read by the newest shape known; finish() refuses it if nothing in it
    # has that shape. None named: the jobs are read by shape
    schema = unknown_schema(meta)
    return None if schema is None else SchemaNotice(SOURCE, origin, schema, NEWEST_SCHEMA)


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


def _reject(origin: str, key: str, reason: str, job: Any, raw: msgspec.Raw | str | None = None) -> Rejected:
    """A Rejected for JOB: its object without the steps as JSON, or its own text when that
    cannot be written again (nested too deeply, strings that are not UTF-8)."""
    if type(job) is dict:
        job = {k: v for k, v in job.items() if k != "steps"}
    try:
        text = orjson.dumps(job).decode()
    except TypeError:
        if raw is not None:
            text = _raw_text(raw)[:MAX_RAW_CHARS]
        else:
            try:
                text = json.dumps(job)[:MAX_RAW_CHARS]
            except (TypeError, ValueError, RecursionError):
                text = f"<{type(job).__name__} that cannot be shown>"
    return Rejected(source=SOURCE, origin=origin, record_key=key, reason=reason, raw=text)


# --- the general path: truncated, damaged or unusual input ----------------------------------


def _scan(text: str, origin: str, fallback_cluster: str = "") -> list[JobAttempt | Rejected | SchemaNotice]:
    """Read the top-level object value by value and "jobs" element by element (json_scan).

    Each job is read into an attempt as soon as it is decoded; one that cannot be decoded
    (not JSON, nested too deep) is rejected alone. A document cut short keeps every job before
    the cut and ends in a truncation record; damage outside the jobs, or a document that is not
    an object with a jobs list, is a ParseError.
    """
    reader = _Reader(origin, fallback_cluster)

    def on_item(index: int, job: Any, job_text: str) -> None:
        if isinstance(job, BadItem):
            reader.seen += 1
            reader.all_jobs = False
            reader.out.append(
                Rejected(SOURCE, origin, f"jobs[{index}]", f"job is {job.reason}", job.text[:MAX_RAW_CHARS])
            )
        else:
            reader.read(index, job, job_text)

    def on_value(key: str, value: Any) -> None:
        if isinstance(value, BadItem):
            # outside every job: that value alone is lost, with its reason; the jobs are read
            reader.out.append(
                Rejected(
                    SOURCE,
                    origin,
                    f"top-level {key[:40]!r}",
                    f"{key[:40]!r} is {value.reason}",
                    value.text[:MAX_RAW_CHARS],
                )
            )
        elif key == "meta":
            reader.set_meta(value)
        elif key == "errors":
            reader.errors = value

    truncation: Rejected | None = None
    try:
        found_jobs = scan_object(text, "jobs", on_item, on_value)
    except Truncated as cut:
        at = byte_offset(text, cut.pos)
        if not reader.seen:
            raise ParseError(f"{origin}: truncated JSON before any complete job (at byte {at})") from None
        truncation = Rejected(
            source=SOURCE,
            origin=origin,
            record_key="truncated input",
            reason=f"truncated JSON after {reader.seen} complete jobs at byte {at}",
            raw=text[cut.pos : cut.pos + TAIL_CHARS],
        )
        found_jobs = True
    except NotAnObject as kind:
        raise ParseError(f"{origin}: expected a JSON object with a 'jobs' list, got {kind}") from None
    except ValueError as bad:
        raise ParseError(f"{origin}: invalid JSON: {bad}") from None
    if not found_jobs:
        raise ParseError(f"{origin}: no 'jobs' list in the sacct JSON")
    return reader.finish(truncation)


__all__ = ["SUPPORTED_SCHEMAS", "parse_sacct_json"]
