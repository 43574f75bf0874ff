"""Whether a record can be stored in its columns: the one check every write path shares.

Each store module names the PostgreSQL type of the column every field of its records goes
into (`jobs.COLUMNS`, `telemetry.SUMMARY_COLUMNS`, ...). `record_problem` checks a record
against such a list: integers against the column's width (int4: a GPU count, a uid, an array
task id; int8: a job id), text that is text and can be encoded (no unpaired surrogate), and so
on, and names the first field that does not fit, with its value. Writers call it on a batch
the database refused (bulk writes: the common case pays nothing) or up front (small writes),
and quarantine what it names, so one bad record never costs the rest of its batch.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any, TypeVar

import orjson

from slurmtel.records import (
    GpuAllocation,
    GpuEvent,
    GpuInventory,
    GpuSummary,
    JobAttempt,
    NodeState,
    PendingJob,
    Rejected,
)
from slurmtel.store.text import storable_text

INT_RANGES: dict[str, tuple[int, int]] = {
    "int2": (-(2**15), 2**15 - 1),
    "int4": (-(2**31), 2**31 - 1),
    "int8": (-(2**63), 2**63 - 1),
    # numeric(20, 0): slurmdbd's unsigned 64-bit ids
    "numeric": (0, 2**64 - 1),
}
FLOAT4_MAX = 3.4028234663852886e38
# a value shown in a reason is cut to this many characters
_SHOWN = 60

# (attribute, PostgreSQL type) of the records whose writers do not declare their columns
# themselves (jobs.COLUMNS and telemetry.SUMMARY_COLUMNS do)
INVENTORY_COLUMNS: tuple[tuple[str, str], ...] = (
    ("node", "text"),
    ("gpu_uuid", "text"),
    ("index", "int4"),
    ("model", "text"),
    ("observed_at", "timestamptz"),
    ("memory_total_bytes", "int8"),
    ("minor_number", "int4"),
    ("pci_bus_id", "text"),
    ("driver_version", "text"),
    ("cuda_version", "text"),
    ("vbios_version", "text"),
    ("mig_mode", "text"),
    ("parent_gpu_uuid", "text"),
    ("mig_profile", "text"),
    ("gpu_fraction", "float4"),
)
EVENT_COLUMNS: tuple[tuple[str, str], ...] = (
    ("node", "text"),
    ("gpu_uuid", "text"),
    ("at", "timestamptz"),
    ("kind", "text"),
    ("value", "int8"),
    ("detail", "text"),
)
ALLOCATION_COLUMNS: tuple[tuple[str, str], ...] = (
    ("cluster", "text"),
    ("job_id_raw", "int8"),
    ("submit_at", "timestamptz"),
    ("node", "text"),
    ("gpu_index", "int4"),
    ("observed_at", "timestamptz"),
    ("gpu_model", "text"),
    ("gpu_uuid", "text"),
)
NODE_STATE_COLUMNS: tuple[tuple[str, str], ...] = (
    ("cluster", "text"),
    ("node", "text"),
    ("observed_at", "timestamptz"),
    ("states", "text[]"),
    ("gpus_total", "int4"),
    ("gpus_allocated", "int4"),
    ("partitions", "text[]"),
    ("gpu_model", "text"),
    ("reason", "text"),
)
PENDING_COLUMNS: tuple[tuple[str, str], ...] = (
    ("cluster", "text"),
    ("job_id_raw", "int8"),
    ("job_id", "text"),
    ("submit_at", "timestamptz"),
    ("observed_at", "timestamptz"),
    ("user", "text"),
    ("account", "text"),
    ("partition", "text"),
    ("reason", "text"),
    ("gpus_requested", "int4"),
    ("eligible_at", "timestamptz"),
)


def _shown(value: Any) -> str:
    try:
        text = repr(value)
    except RecursionError:
        text = f"<{type(value).__name__}>"
    return text if len(text) <= _SHOWN else text[: _SHOWN - 3] + "..."


def _text_problem(value: Any) -> str | None:
    if type(value) is not str:
        return f"is {type(value).__name__} {_shown(value)}, not text"
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            return f"holds {value[exc.start : exc.end].encode('utf-8', 'surrogatepass')!r}, which is not text"
    return None


def value_problem(value: Any, pgtype: str) -> str | None:
    """Why VALUE cannot be stored in a column of PGTYPE ("is 2147483648, beyond int4"), or None.

    NULL is accepted everywhere: a NOT NULL column refuses it itself, and the writers' records
    only hold None where their columns allow it.
    """
    if value is None:
        return None
    if pgtype in INT_RANGES:
        if type(value) is not int:
            return f"is {type(value).__name__} {_shown(value)}, not an integer"
        low, high = INT_RANGES[pgtype]
        if not low <= value <= high:
            return f"is {_shown(value)}, beyond {pgtype} ({low} .. {high})"
        return None
    if pgtype in ("float4", "float8"):
        if type(value) not in (float, int):
            return f"is {type(value).__name__} {_shown(value)}, not a number"
        try:
            number = float(value)
        except OverflowError:
            return f"is {_shown(value)}, too large for {pgtype}"
        if pgtype == "float4" and math.isfinite(number) and abs(number) > FLOAT4_MAX:
            return f"is {_shown(value)}, too large for float4"
        return None
    if pgtype == "text":
        return _text_problem(value)
    if pgtype == "text[]":
        if not isinstance(value, tuple | list):
            return f"is {type(value).__name__} {_shown(value)}, not a list of text"
        for item in value:
            problem = _text_problem(item)
            if problem is not None:
                return f"has an item that {problem}"
        return None
    if pgtype == "timestamptz":
        if not isinstance(value, datetime) or value.tzinfo is None:
            return f"is {_shown(value)}, not an aware datetime"
        return None
    if pgtype == "jsonb":
        try:
            orjson.dumps(value)
        except (TypeError, ValueError) as exc:
            return f"cannot be stored as JSON ({exc})"
        if isinstance(value, dict):
            low, high = INT_RANGES["int8"]
            for key, item in value.items():
                if type(item) is int and not low <= item <= high:
                    return f"has {key!s:.40}={_shown(item)}, beyond int8"
        return None
    if pgtype == "bool":
        return None if type(value) is bool else f"is {_shown(value)}, not true or false"
    return None


def record_problem(record: Any, columns: Sequence[tuple[str, str]]) -> str | None:
    """The first field of RECORD that cannot be stored in its column, named with its value
    ("alloc_gpus is 2147483648, beyond int4 (...)"); None when every field fits. COLUMNS are
    (attribute, PostgreSQL type) pairs."""
    for attribute, pgtype in columns:
        problem = value_problem(getattr(record, attribute), pgtype)
        if problem is not None:
            return f"{attribute} {problem}"
    return invariant_problem(record)


def invariant_problem(record: Any) -> str | None:
    """What the table's constraints would refuse (and what no time can mean)."""
    if isinstance(record, JobAttempt):
        if record.alloc_gpus < 0:
            return f"alloc_gpus is {record.alloc_gpus}, negative"
        if record.start_at is not None and record.end_at is not None and record.end_at < record.start_at:
            return f"end_at {record.end_at.isoformat()} precedes start_at {record.start_at.isoformat()}"
    return None


def record_key(record: Any) -> str:
    """What identifies RECORD to a person reading the quarantine."""
    if isinstance(record, JobAttempt):
        return f"job {storable_text(record.job_id, 100) or record.job_id_raw}"
    if isinstance(record, GpuAllocation | PendingJob):
        return f"job {record.job_id_raw}"
    if isinstance(record, GpuSummary):
        start = record.window_start_at
        when = start.isoformat() if isinstance(start, datetime) else storable_text(start, 60)
        return f"gpu {storable_text(record.gpu_uuid, 100)} window {when}"
    if isinstance(record, GpuEvent | GpuInventory):
        return f"gpu {storable_text(record.gpu_uuid, 100)}"
    if isinstance(record, NodeState):
        return f"node {storable_text(record.node, 100)}"
    return type(record).__name__


def record_text(record: Any) -> str:
    """RECORD's fields by name as JSON (what the quarantine keeps as its raw text when the
    record's own input text is not at hand)."""
    fields = {f.name: getattr(record, f.name) for f in dataclasses.fields(record)}
    try:
        return orjson.dumps(fields, default=str, option=orjson.OPT_NON_STR_KEYS).decode()
    except (TypeError, ValueError):
        return storable_text(fields)


def rejection(record: Any, reason: str, *, source: str, origin: str) -> Rejected:
    return Rejected(
        source=source, origin=origin, record_key=record_key(record), reason=reason, raw=record_text(record)
    )


def rejections(refused: Iterable[tuple[Any, str]], *, source: str, origin: str) -> list[Rejected]:
    """A Rejected for each (record, reason) a writer refused (WriteStats.refused, ...)."""
    return [
        rejection(record, f"cannot be stored: {reason}", source=source, origin=origin)
        for record, reason in refused
    ]


R = TypeVar("R")


def sort_out(records: Iterable[R], columns: Sequence[tuple[str, str]]) -> tuple[list[R], list[tuple[R, str]]]:
    """RECORDS that fit COLUMNS, and (record, the field that does not fit) for each other."""
    kept: list[R] = []
    refused: list[tuple[R, str]] = []
    for record in records:
        problem = record_problem(record, columns)
        if problem is None:
            kept.append(record)
        else:
            refused.append((record, problem))
    return kept, refused


def split_storable(
    records: Iterable[R], columns: Sequence[tuple[str, str]], *, source: str, origin: str
) -> tuple[list[R], list[Rejected]]:
    """RECORDS that fit COLUMNS, and a Rejected (reason: the field that does not) for each other."""
    kept, refused = sort_out(records, columns)
    return kept, rejections(refused, source=source, origin=origin)


__all__ = [
    "ALLOCATION_COLUMNS",
    "EVENT_COLUMNS",
    "INVENTORY_COLUMNS",
    "NODE_STATE_COLUMNS",
    "PENDING_COLUMNS",
    "record_problem",
    "rejection",
    "rejections",
    "sort_out",
    "split_storable",
    "value_problem",
]
