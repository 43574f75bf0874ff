"""The controller's live view: which job holds which GPU index, who is waiting, node GPU states.

Sources (all read as text; nothing here runs a command):

- `scontrol show job -d` (records of indented lines, separated by blank lines) and
  `scontrol show job -d -o` (one record per line). Running jobs carry per-node detail entries
  `Nodes=gpu01 CPU_IDs=0-1 Mem=512 GRES=gpu:h100:2(IDX:0-1)`; nodes with identical allocations
  are folded (`Nodes=gpu[01-02] ... GRES=gpu:h100:2(IDX:0-1)`: each node holds those indices).
- `squeue --json` and slurmrestd `/slurm/vX/jobs` (`{"jobs": [...]}`): `gres_detail` holds one
  entry per node, in the order of the expanded `nodes` list. v0.0.37/38 print plain ints and a
  string job_state; v0.0.40+ print `{set, infinite, number}` objects and a list of states.
- `scontrol show node -d` (`Gres=gpu:h100:4`, `GresUsed=gpu:h100:4(IDX:0-3)`, `State=MIXED`).
- `sinfo --json` of 21.08/22.05 and slurmrestd `/slurm/vX/nodes` / `scontrol show nodes --json`
  (23.02+) (`{"nodes": [...]}`). The `{"sinfo": [...]}` document `sinfo --json` prints from
  23.02 on groups nodes by state and carries no per-node GPU use; it is refused with a
  ParseError that says to use `scontrol show nodes --json` instead.

Every schema from Slurm 21.08 (openapi/v0.0.37) to 25.11 (data_parser/v0.0.44) is read. A
schema version slurmtel does not know (a newer Slurm: 26.05 prints data_parser/v0.0.45) is read
by the newest known shape, with a SchemaNotice first in the result (the source logs it and counts
it in slurmtel_schema_unknown_total); only a document whose objects have none of the known shapes
is refused.

GPU indices exist only while a job runs; once it ends `GRES=` is empty and `gres_detail` is
`[]`. Allocations are emitted for every job that is not PENDING and shows indices (RUNNING, but
also SUSPENDED or COMPLETING jobs still holding GPUs). For a MIG GRES (`gpu:1g.10gb:1(IDX:3)`)
the index is the MIG device's index in the node's gres.conf order, not a physical GPU's.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime, tzinfo
from typing import Any

import orjson

from slurmtel.errors import ParseError
from slurmtel.parsers.gres import gpu_items, physical_gpus, single_gpu_type, tres_gpu_items
from slurmtel.parsers.json_scan import BadItem, NotAnObject, Truncated, byte_offset, read_document
from slurmtel.parsers.slurm_common import (
    BASE_STATES,
    NO_TIME_WORDS,
    expand_nodelist,
    only_informational,
    parse_tres_string,
    slurm_epoch,
    text_number,
    unknown_schema,
    unwrap_number,
)
from slurmtel.parsers.slurm_common import gpu_count as tres_gpu_count
from slurmtel.records import (
    NEWEST_KNOWN_SCHEMA,
    GpuAllocation,
    NodeState,
    PendingJob,
    Rejected,
    SchemaNotice,
    type_problem,
)

SOURCE = "slurmctld"
SUPPORTED_SCHEMAS = "openapi/v0.0.37, openapi/v0.0.38, data_parser/v0.0.39 .. data_parser/v0.0.44"

JobRecord = GpuAllocation | PendingJob | Rejected | SchemaNotice
NodeRecord = NodeState | Rejected | SchemaNotice

# "Key=" at the start of a line or after white space; scontrol keys hold letters, digits, _ : /
_KEY = re.compile(r"(?:^|(?<=\s))([A-Za-z][A-Za-z0-9_:/]*)=")
# keys whose values may hold spaces (the rest end at the first white space)
_SPACED_KEYS = frozenset(
    {"JobName", "Command", "WorkDir", "StdErr", "StdIn", "StdOut", "Comment", "OS", "Reason", "AdminComment"}
)
# scontrol show node appends who set a reason and when: "ECC memory error [root@2024-01-01T00:00:00]"
_REASON_STAMP = re.compile(r"\s*\[[^\[\]]*@[^\[\]]*\]\s*$")
_NO_TIME = frozenset({"", "None", "Unknown", "N/A", "(null)", "0"})


# --------------------------------------------------------------------------- text records


def _records(raw: str, first_key: str) -> list[str]:
    """Split scontrol output into one text per record; a record starts at a FIRST_KEY= line.

    Works for both layouts: with -o every line starts a record; without it, the indented lines
    that follow belong to the record above.
    """
    records: list[str] = []
    current: list[str] = []
    marker = first_key + "="
    for line in raw.splitlines():
        stripped = line.strip()
        if stripped.startswith(marker):
            if current:
                records.append("\n".join(current))
            current = [stripped]
        elif stripped and current:
            current.append(stripped)
    if current:
        records.append("\n".join(current))
    return records


def _pairs(record: str) -> list[tuple[str, str]]:
    """A record's `Key=value` pairs in order; keys can repeat (the per-node detail entries)."""
    pairs: list[tuple[str, str]] = []
    for line in record.split("\n"):
        matches = list(_KEY.finditer(line))
        for number, match in enumerate(matches):
            end = matches[number + 1].start() if number + 1 < len(matches) else len(line)
            key = match.group(1)
            value = line[match.end() : end].strip()
            if key not in _SPACED_KEYS:
                value = value.split(None, 1)[0] if value else ""
            pairs.append((key, value))
    return pairs


# what squeue prints when asked for --json it cannot give: its table (Slurm without the
# serializer/json plugin ignores the option or says so), or its complaint about the option
_SQUEUE_TABLE = re.compile(r"\s*JOBID\s+PARTITION\s+NAME\s+USER", re.IGNORECASE)
_NO_JSON = re.compile(r"serializer|--json|\bjson\b|data_parser", re.IGNORECASE)
SQUEUE_JSON_UNAVAILABLE = (
    "squeue --json is not available here (Slurm without the serializer/json plugin, or older "
    'than 21.08); use sources.slurmctld.job_view = "scontrol_text"'
)


def squeue_json_unavailable(text: str) -> bool:
    """Whether TEXT is what squeue prints instead of JSON when it cannot give JSON."""
    head = text.lstrip()[:2000]
    if head.startswith("{"):
        return False
    return bool(_SQUEUE_TABLE.match(head)) or bool(_NO_JSON.search(head))


def _check_text(raw: str, first_key: str, origin: str, empty_answers: Iterable[str]) -> str:
    text = raw.strip()
    if not text or any(text.startswith(answer) for answer in empty_answers):
        return ""
    if first_key + "=" not in text:
        if first_key == "JobId" and squeue_json_unavailable(text):
            raise ParseError(f"{origin}: {SQUEUE_JSON_UNAVAILABLE}; it printed: {text[:200]!r}")
        raise ParseError(f"{origin}: no {first_key}= record in the output: {text[:200]!r}")
    return text


def _local_time(value: str | None, zone: tzinfo) -> datetime | None:
    """scontrol's local `2026-12-02T13:00:06` (no zone) read in ZONE -> aware UTC; None if unset."""
    if value is None:
        return None
    value = value.strip().strip('"')
    if value in _NO_TIME or value.lower() in NO_TIME_WORDS:
        return None
    if value.isdigit() and value.isascii():
        # SLURM_TIME_FORMAT=%s: epoch seconds (0 and NO_VAL mean not set)
        return _epoch(int(value))
    parsed = datetime.fromisoformat(value)
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=zone)
    return parsed.astimezone(UTC)


def _user_name(value: str) -> str:
    # "alice(1002)" -> "alice"
    name, _, _ = value.partition("(")
    return name


def _job_display_id(
    job_id: int,
    array_job_id: int | None,
    array_task: str,
    het_job_id: int | None,
    het_offset: int | None,
) -> str:
    """The id users see: "10_1", "10_[1-4%2]" (pending array), "5+1" (het job), "42"."""
    if array_job_id:
        if array_task and array_task.isdigit():
            return f"{array_job_id}_{array_task}"
        if array_task:
            return f"{array_job_id}_[{array_task}]"
    if het_job_id:
        return f"{het_job_id}+{het_offset or 0}"
    return str(job_id)


def _requested_gpus(
    req_tres: str,
    per_job: str,
    per_node: str,
    per_task: str,
    nodes: int,
    tasks: int,
) -> int:
    """GPUs a pending job asks for: its requested TRES gres/gpu, else the tres_per_* requests.

    The requested TRES already multiply per-node/per-task requests out; clusters that do not
    account gres/gpu leave it out, so the tres_per_* strings are the fallback.
    """
    requested = tres_gpu_count(parse_tres_string(req_tres)) if req_tres else 0
    if requested:
        return requested
    for text, factor in ((per_job, 1), (per_node, max(nodes, 1)), (per_task, max(tasks, 1))):
        count = sum(item.count for item in gpu_items(text))
        if count:
            return count * factor
    return 0


def _min_count(value: str | None) -> int:
    # "NumNodes=2-2", "NumNodes=1-4", "NumTasks=N/A"
    if not value:
        return 0
    low = value.split("-", 1)[0]
    return int(low) if low.isdigit() else 0


def _allocations_from_detail(
    gres: str,
    nodes: Iterable[str],
    *,
    cluster: str,
    job_id_raw: int,
    submit_at: datetime,
    at: datetime,
) -> list[GpuAllocation]:
    allocations: list[GpuAllocation] = []
    items = gpu_items(gres)
    for node in nodes:
        for item in items:
            for index in item.indices or ():
                allocations.append(
                    GpuAllocation(
                        cluster=cluster,
                        job_id_raw=job_id_raw,
                        submit_at=submit_at,
                        node=node,
                        gpu_index=index,
                        observed_at=at,
                        gpu_model=item.type,
                    )
                )
    return allocations


def _typed(records: list[Any]) -> list[Any]:
    """RECORDS checked against their declared field types (slurmtel.records.type_problem): a
    field that holds another JSON type (a name that is an object) refuses the whole job or node
    with its name (TypeError, which the callers reject alone); a NUL in text becomes U+FFFD."""
    checked = []
    for record in records:
        fixed, problem = type_problem(record)
        if problem is not None:
            raise TypeError(problem)
        checked.append(fixed)
    return checked


def parse_scontrol_jobs(
    raw: str,
    *,
    cluster: str,
    at: datetime,
    timezone: tzinfo = UTC,
    origin: str = "scontrol show job -d",
) -> list[JobRecord]:
    """`scontrol show job -d` or `... -d -o` -> one GpuAllocation per (running job, node, GPU
    index) and one PendingJob per pending job; other jobs give nothing.

    Times are local without a zone: TIMEZONE is the controller's zone (default UTC).
    """
    text = _check_text(raw, "JobId", origin, ("No jobs in the system",))
    results: list[JobRecord] = []
    for record in _records(text, "JobId"):
        try:
            results.extend(_typed(_scontrol_job(record, cluster=cluster, at=at, zone=timezone)))
        except (ValueError, KeyError, OverflowError, TypeError) as exc:
            job_key = record.split(None, 1)[0].replace("JobId=", "job ")
            results.append(Rejected(SOURCE, origin, job_key, str(exc) or type(exc).__name__, record))
    return results


def _scontrol_job(record: str, *, cluster: str, at: datetime, zone: tzinfo) -> list[JobRecord]:
    pairs = _pairs(record)
    fields: dict[str, str] = {}
    for key, value in pairs:
        fields.setdefault(key, value)
    job_id_raw = int(fields["JobId"])
    if unwrap_number(job_id_raw) is None:
        raise ValueError(f"JobId is {job_id_raw}, Slurm's NO_VAL (no job id)")
    state = fields.get("JobState", "")
    submit_at = _local_time(fields.get("SubmitTime"), zone)
    if submit_at is None:
        raise ValueError(f"job {job_id_raw} has no SubmitTime")

    if state == "PENDING":
        job_id = _job_display_id(
            job_id_raw,
            _int(fields.get("ArrayJobId")),
            fields.get("ArrayTaskId", ""),
            _int(fields.get("HetJobId")),
            _int(fields.get("HetJobOffset")),
        )
        return [
            PendingJob(
                cluster=cluster,
                job_id_raw=job_id_raw,
                job_id=job_id,
                submit_at=submit_at,
                observed_at=at,
                user=_user_name(fields.get("UserId", "")),
                account=fields.get("Account", ""),
                partition=fields.get("Partition", ""),
                reason=fields.get("Reason", ""),
                gpus_requested=_requested_gpus(
                    fields.get("ReqTRES") or fields.get("TRES", ""),
                    fields.get("TresPerJob", ""),
                    fields.get("TresPerNode", ""),
                    fields.get("TresPerTask", ""),
                    _min_count(fields.get("NumNodes")),
                    _min_count(fields.get("NumTasks")),
                ),
                eligible_at=_local_time(fields.get("EligibleTime"), zone),
            )
        ]

    # the detail entries: each "Nodes=" starts one, its "GRES=" follows
    allocations: list[JobRecord] = []
    detail_nodes: str | None = None
    for key, value in pairs:
        if key == "Nodes":
            detail_nodes = value
        elif key == "GRES" and detail_nodes is not None:
            if value:
                allocations.extend(
                    _allocations_from_detail(
                        value,
                        expand_nodelist(detail_nodes),
                        cluster=cluster,
                        job_id_raw=job_id_raw,
                        submit_at=submit_at,
                        at=at,
                    )
                )
            detail_nodes = None
    return allocations


def _int(value: str | None) -> int | None:
    """An id or count as scontrol prints it; None when absent, "N/A" or a Slurm sentinel."""
    return text_number(value)


# --------------------------------------------------------------------------- JSON jobs


def _load_json(raw: str | bytes, origin: str, key: str) -> tuple[list[Any], SchemaNotice | None]:
    """The KEY list of a JSON document; an element that cannot be decoded is a json_scan.BadItem
    (rejected alone by the caller). With it, a SchemaNotice when the document names a schema
    version slurmtel does not know (its elements are then read by the newest known shape)."""
    try:
        document = orjson.loads(raw)
    except (orjson.JSONDecodeError, UnicodeError):
        document = _salvage_json(raw, origin, key)
    if not isinstance(document, dict):
        raise ParseError(f"{origin}: expected a JSON object, got {type(document).__name__}")
    errors = document.get("errors") or []
    if errors and not (only_informational(errors) and isinstance(document.get(key), list)):
        # an error document also carries an empty list: reading it as "nothing there" would be
        # wrong, except when all Slurm says is "Nothing found"
        first = errors[0]
        detail = first.get("error") or first.get("description") if isinstance(first, dict) else first
        raise ParseError(f"{origin}: Slurm reported {len(errors)} error(s): {detail}")
    if key not in document:
        if key == "nodes" and "sinfo" in document:
            raise ParseError(
                f"{origin}: this is the 'sinfo' document of sinfo --json from Slurm 23.02+, which "
                "groups nodes and has no per-node GPU use; use `scontrol show nodes --json` instead"
            )
        raise ParseError(f"{origin}: no '{key}' list in the document (keys: {sorted(document)[:10]})")
    items = document[key]
    if not isinstance(items, list):
        raise ParseError(f"{origin}: '{key}' is {type(items).__name__}, not a list")
    notice = _check_schema(document.get("meta"), origin)
    if notice is not None and items and not any(_has_known_shape(item, key) for item in items):
        # read by the newest known shape, and nothing had that shape: some other document
        what = "job" if key == "jobs" else "node"
        raise ParseError(
            f"{origin}: unknown slurmctld JSON schema '{notice.schema}', and its {what} objects do not "
            f"have the shape of any known one ({SUPPORTED_SCHEMAS})"
        )
    return items, notice


def _check_schema(meta: Any, origin: str) -> SchemaNotice | None:
    """A notice when META names a schema version slurmtel does not know; None for a known one,
    or when it names none (the objects are read by shape)."""
    schema = unknown_schema(meta)
    return None if schema is None else SchemaNotice(SOURCE, origin, schema, NEWEST_KNOWN_SCHEMA)


def _has_known_shape(item: Any, key: str) -> bool:
    """Whether ITEM has what every known schema's job (node) object has."""
    if type(item) is not dict:
        return False
    if key == "jobs":
        return "job_id" in item and "job_state" in item
    return "name" in item and "state" in item


def _salvage_json(raw: str | bytes, origin: str, key: str) -> dict[str, Any]:
    """A document orjson refuses (a record nested too deeply, an integer beyond 64 bits, a
    damaged record) read value by value: the records that can be read, the others as BadItem."""
    text = raw if isinstance(raw, str) else raw.decode("utf-8", "replace")
    if text.lstrip()[:1] != "{":
        raise ParseError(f"{origin}: not JSON: {text.strip()[:200]!r}")
    try:
        return read_document(text, key)
    except Truncated as cut:
        raise ParseError(f"{origin}: not JSON (cut short at byte {byte_offset(text, cut.pos)})") from None
    except (NotAnObject, ValueError) as exc:
        raise ParseError(f"{origin}: not JSON ({exc})") from None


def _epoch(value: Any) -> datetime | None:
    """Epoch seconds -> aware UTC; None for 0, NO_VAL/INFINITE, {"set": false} (not set)."""
    number = slurm_epoch(value)
    if number is None:
        return None
    try:
        return datetime.fromtimestamp(number, UTC)
    except (OverflowError, ValueError, OSError):
        raise ValueError(f"{number} is not a time") from None


def _bad_json_record(origin: str, what: str, item: BadItem) -> Rejected:
    return Rejected(SOURCE, origin, f"{what} ?", f"{what} is {item.reason}", item.text[:65536])


def _json_text(value: Any) -> str:
    try:
        return orjson.dumps(value).decode()
    except TypeError:
        try:
            return json.dumps(value)[:65536]
        except (TypeError, ValueError, RecursionError):
            return f"<{type(value).__name__} that cannot be shown>"


def _state_words(state: Any, flags: Any = None) -> tuple[str, ...]:
    """ "mixed" + ["DRAIN"] (v0.0.37/38) or ["IDLE", "DRAIN"] (v0.0.40+) -> ("MIXED", "DRAIN")."""
    words: list[str] = []
    parts: list[Any] = [state] if isinstance(state, str) else list(state or [])
    parts.extend(flags or [])
    for part in parts:
        if not isinstance(part, str):
            continue
        for word in part.split("+"):
            word = word.strip().upper()
            # scontrol marks a node that does not respond with "*": "DOWN*"
            if word.endswith("*"):
                word = word.rstrip("*")
                if word and word not in words:
                    words.append(word)
                word = "NOT_RESPONDING"
            if word and word not in words:
                words.append(word)
    return tuple(words)


def _base_state(words: tuple[str, ...]) -> str:
    for word in words:
        if word in BASE_STATES:
            return word
    return words[0] if words else ""


def parse_squeue_json(
    raw: str | bytes,
    *,
    cluster: str,
    at: datetime,
    origin: str = "squeue --json",
) -> list[JobRecord]:
    """`squeue --json` / slurmrestd `/slurm/vX/jobs` and `/job/<id>` -> allocations and pending
    jobs (first a SchemaNotice when the schema is newer than slurmtel knows)."""
    head = raw[:2000].decode("utf-8", "replace") if isinstance(raw, bytes) else raw[:2000]
    if squeue_json_unavailable(head):
        raise ParseError(f"{origin}: {SQUEUE_JSON_UNAVAILABLE}; it printed: {head.strip()[:200]!r}")
    jobs, notice = _load_json(raw, origin, "jobs")
    results: list[JobRecord] = [notice] if notice is not None else []
    for job in jobs:
        if isinstance(job, BadItem):
            results.append(_bad_json_record(origin, "job", job))
            continue
        try:
            results.extend(_typed(_json_job(job, cluster=cluster, at=at)))
        except (ValueError, KeyError, TypeError, AttributeError, OverflowError, RecursionError) as exc:
            job_id = job.get("job_id") if isinstance(job, dict) else None
            results.append(
                Rejected(
                    SOURCE,
                    origin,
                    f"job {str(job_id)[:40]}" if job_id is not None else "job ?",
                    str(exc) or type(exc).__name__,
                    _json_text(job),
                )
            )
    return results


def _json_job(job: Mapping[str, Any], *, cluster: str, at: datetime) -> list[JobRecord]:
    job_id_raw = unwrap_number(job["job_id"])
    if job_id_raw is None:
        raise ValueError("no job_id")
    state = _base_state(_state_words(job.get("job_state")))
    submit_at = _epoch(job.get("submit_time"))
    if submit_at is None:
        raise ValueError(f"job {job_id_raw} has no submit_time")

    if state == "PENDING":
        array_task = unwrap_number(job.get("array_task_id"))
        job_id = _job_display_id(
            job_id_raw,
            unwrap_number(job.get("array_job_id")),
            str(array_task) if array_task is not None else (job.get("array_task_string") or ""),
            unwrap_number(job.get("het_job_id")),
            unwrap_number(job.get("het_job_offset")),
        )
        return [
            PendingJob(
                cluster=cluster,
                job_id_raw=job_id_raw,
                job_id=job_id,
                submit_at=submit_at,
                observed_at=at,
                user=job.get("user_name") or "",
                account=job.get("account") or "",
                partition=job.get("partition") or "",
                reason=job.get("state_reason") or "",
                gpus_requested=_requested_gpus(
                    job.get("tres_req_str") or "",
                    job.get("tres_per_job") or "",
                    job.get("tres_per_node") or "",
                    job.get("tres_per_task") or "",
                    unwrap_number(job.get("node_count")) or 0,
                    unwrap_number(job.get("tasks")) or 0,
                ),
                eligible_at=_epoch(job.get("eligible_time")),
            )
        ]

    details = job.get("gres_detail") or []
    if not details:
        return []
    nodes = expand_nodelist(job.get("nodes") or "")
    if len(details) != len(nodes):
        raise ValueError(
            f"gres_detail has {len(details)} entries for {len(nodes)} nodes in {job.get('nodes')!r}"
        )
    allocations: list[JobRecord] = []
    for node, gres in zip(nodes, details, strict=True):
        allocations.extend(
            _allocations_from_detail(
                gres, (node,), cluster=cluster, job_id_raw=job_id_raw, submit_at=submit_at, at=at
            )
        )
    return allocations


# --------------------------------------------------------------------------- nodes


def _node_state(
    *,
    cluster: str,
    at: datetime,
    name: str,
    states: tuple[str, ...],
    gres: str,
    gres_used: str | None,
    cfg_tres: str,
    alloc_tres: str,
    partitions: Iterable[str],
    reason: str,
) -> NodeState:
    configured = gpu_items(gres)
    # physical GPUs: a node of MIG slices (gpu:1g.10gb:21) is its GPUs (3), never its slices
    total = physical_gpus(configured)
    if not configured:
        # no Gres: CfgTRES counts them (its typed entries say which are slices)
        total = physical_gpus(tres_gpu_items(parse_tres_string(cfg_tres), []))
    # allocated in the same unit as total: the GPUs the slices in use need at least
    if gres_used is not None and (gpu_items(gres_used) or not alloc_tres):
        allocated = physical_gpus(gpu_items(gres_used))
    else:
        # `scontrol show node` without -d prints no GresUsed: AllocTRES counts GRES (slices on
        # a MIG node), read as the node's GRES types
        allocated = physical_gpus(tres_gpu_items(parse_tres_string(alloc_tres), configured))
    return NodeState(
        cluster=cluster,
        node=name,
        observed_at=at,
        states=states,
        gpus_total=total,
        gpus_allocated=allocated,
        partitions=tuple(p for p in partitions if p and p != "(null)"),
        gpu_model=single_gpu_type(configured) or single_gpu_type(gpu_items(gres_used)),
        reason=_REASON_STAMP.sub("", reason or "").strip(),
    )


def parse_scontrol_nodes(
    raw: str,
    *,
    cluster: str,
    at: datetime,
    origin: str = "scontrol show node -d",
) -> list[NodeRecord]:
    """`scontrol show node -d` (or without -d, or -o) -> one NodeState per node."""
    text = _check_text(raw, "NodeName", origin, ("No nodes in the system",))
    results: list[NodeRecord] = []
    for record in _records(text, "NodeName"):
        fields: dict[str, str] = {}
        for key, value in _pairs(record):
            fields.setdefault(key, value)
        name = fields.get("NodeName", "")
        try:
            if not name:
                raise ValueError("empty NodeName")
            # "Gres=justarandomfield" names no GPU and is no error; "gpu:a:b:4" is one
            gres = fields.get("Gres", "")
            node = _node_state(
                cluster=cluster,
                at=at,
                name=name,
                states=_state_words(fields.get("State", "")),
                gres=gres,
                gres_used=fields.get("GresUsed"),
                cfg_tres=fields.get("CfgTRES", ""),
                alloc_tres=fields.get("AllocTRES", ""),
                partitions=fields.get("Partitions", "").split(","),
                reason=fields.get("Reason", ""),
            )
            results.extend(_typed([node]))
        except (ValueError, TypeError) as exc:
            results.append(Rejected(SOURCE, origin, f"node {name[:100] or '?'}", str(exc), record))
    return results


def parse_sinfo_json(
    raw: str | bytes,
    *,
    cluster: str,
    at: datetime,
    origin: str = "sinfo --json",
) -> list[NodeRecord]:
    """`sinfo --json` (21.08/22.05), slurmrestd `/slurm/vX/nodes` and `scontrol show nodes --json`
    (`{"nodes": [...]}`) -> one NodeState per node."""
    nodes, notice = _load_json(raw, origin, "nodes")
    results: list[NodeRecord] = [notice] if notice is not None else []
    for node in nodes:
        if isinstance(node, BadItem):
            results.append(_bad_json_record(origin, "node", node))
            continue
        name = node.get("name") if isinstance(node, dict) else None
        try:
            if not name:
                raise ValueError("node without a name")
            results.extend(
                _typed(
                    [
                        _node_state(
                            cluster=cluster,
                            at=at,
                            name=name,
                            states=_state_words(node.get("state"), node.get("state_flags")),
                            gres=node.get("gres") or "",
                            gres_used=node.get("gres_used"),
                            cfg_tres=node.get("tres") or "",
                            alloc_tres=node.get("tres_used") or "",
                            partitions=node.get("partitions") or (),
                            reason=node.get("reason") or "",
                        )
                    ]
                )
            )
        except (ValueError, TypeError, AttributeError, OverflowError, RecursionError) as exc:
            results.append(
                Rejected(
                    SOURCE,
                    origin,
                    f"node {str(name)[:100] if name else '?'}",
                    str(exc) or type(exc).__name__,
                    _json_text(node),
                )
            )
    return results
