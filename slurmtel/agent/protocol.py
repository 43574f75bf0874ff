"""The wire format between a node agent and the head: pure functions, no NVML, no I/O.

The head pulls `GET /v1/summaries?after=CURSOR&limit=N` from each agent (default port 9767)
and, once the items are stored, `POST /v1/ack` with `{"cursor": N}`; the agent then drops
every item up to N. Pulls are idempotent: the same `after` returns the same items until they
are acked. Response of /v1/summaries:

    {"protocol_version": 1, "node": "gpu01", "agent_version": "0.1.0",
     "spool_id": "6f1c...", "items": [{"seq": 41, "kind": "summary", "record": {...}}, ...],
     "next_cursor": 41, "evicted_total": 0, "spool_items": 12, "spool_bytes": 7301}

- `seq` increases strictly and is never reused within a spool; `next_cursor` is the `after`
  for the next page (the last item's seq, or the request's `after` when there are none).
- `kind` is "summary" (GpuSummary), "event" (GpuEvent) or "inventory" (GpuInventory), and,
  for a head that asks for them, "port_counters" (PortCounters), "nvlink_counters"
  (NvlinkCounters), "topology" (NodeTopology), "job_host" (JobHostWindow: a job's cgroup
  counters per window), "gpu_host" (GpuHostWindow: throttle reasons, PCIe) or "rejected"
  (Rejected: a cgroup file the agent could not read; the head quarantines it like an item
  it cannot read); `record` holds that record's fields by name:
  datetimes as ISO 8601 UTC ("...Z"), tuples as lists, maps as objects. Unknown fields are
  ignored so newer agents can add fields.
- Kinds are negotiated by the head: `&kinds=summary,event,inventory,port_counters,...` lists
  what it can store. An agent serves only those; without the parameter (a head from before
  it existed) only the three original kinds. An agent from before it existed ignores the
  parameter and serves the original kinds. Either way neither side meets a kind it does not
  know. Items a head did not ask for are skipped, and trimmed with the items it acks;
  `next_cursor` is the last seq the page covered, skipped items included.
- `spool_id` is fixed when the spool is created: when it changes (the spool file was lost
  and recreated), sequence numbers start again at 1 and the head must reset its cursor.
- `evicted_total` counts items the agent dropped unacked because its spool was full.

A whole response that cannot be read raises ParseError naming the reason; a single bad item
becomes a `Rejected` in `SummariesPage.rejected` and the rest of the page is kept.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import cache
from typing import Any, NamedTuple
from urllib.parse import urlencode

import msgspec
import orjson

from slurmtel.errors import ParseError
from slurmtel.gcpause import gc_paused
from slurmtel.parsers.json_scan import BadItem, NotAnObject, Truncated, read_document, scan_object
from slurmtel.records import (
    GpuEvent,
    GpuHostWindow,
    GpuInventory,
    GpuSummary,
    JobHostWindow,
    NodeFsWindow,
    NodeTopology,
    NvlinkCounters,
    PortCounters,
    Rejected,
)

PROTOCOL_VERSION = 1
DEFAULT_PORT = 9767
SUMMARIES_PATH = "/v1/summaries"
ACK_PATH = "/v1/ack"
DEFAULT_PAGE_LIMIT = 1000
MAX_PAGE_LIMIT = 10000

AgentRecord = (
    GpuSummary
    | GpuEvent
    | GpuInventory
    | PortCounters
    | NvlinkCounters
    | NodeTopology
    | JobHostWindow
    | GpuHostWindow
    | NodeFsWindow
    | Rejected
)

RECORD_TYPES: dict[str, type] = {
    "summary": GpuSummary,
    "event": GpuEvent,
    "inventory": GpuInventory,
    "port_counters": PortCounters,
    "nvlink_counters": NvlinkCounters,
    "topology": NodeTopology,
    "job_host": JobHostWindow,
    "gpu_host": GpuHostWindow,
    "node_fs": NodeFsWindow,
    # text the agent could not read (a bad cgroup file): quarantined by the head with its reason
    "rejected": Rejected,
}
# what an agent serves a head that names no kinds (every head before kinds were negotiated)
ORIGINAL_KINDS: tuple[str, ...] = ("summary", "event", "inventory")
# what this head stores, and so asks for
ALL_KINDS: tuple[str, ...] = tuple(RECORD_TYPES)
_KINDS: dict[type, str] = {cls: kind for kind, cls in RECORD_TYPES.items()}


class PageItem(NamedTuple):
    # a tuple, not a frozen dataclass: a page builds one per item, and a frozen dataclass's
    # __init__ cost as much as the rest of the page's Python loop (measured)
    seq: int
    kind: str
    record: AgentRecord


@dataclass(frozen=True, slots=True)
class SummariesPage:
    node: str
    agent_version: str
    items: tuple[PageItem, ...]
    next_cursor: int
    evicted_total: int
    spool_items: int
    spool_bytes: int
    spool_id: str = ""
    protocol_version: int = PROTOCOL_VERSION
    rejected: tuple[Rejected, ...] = ()
    # the records by type, in page order: sorted out once (the head asks for each kind of
    # every page, some twice)
    _by_type: dict[type, list[Any]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        by_type: dict[type, list[Any]] = {}
        for item in self.items:
            by_type.setdefault(type(item.record), []).append(item.record)
        object.__setattr__(self, "_by_type", by_type)

    def records(self, kind: str) -> list[AgentRecord]:
        return [item.record for item in self.items if item.kind == kind]

    def _of(self, cls: type) -> list[Any]:
        return list(self._by_type.get(cls, ()))

    @property
    def summaries(self) -> list[GpuSummary]:
        return self._of(GpuSummary)

    @property
    def events(self) -> list[GpuEvent]:
        return self._of(GpuEvent)

    @property
    def inventory(self) -> list[GpuInventory]:
        return self._of(GpuInventory)

    @property
    def port_counters(self) -> list[PortCounters]:
        return self._of(PortCounters)

    @property
    def nvlink_counters(self) -> list[NvlinkCounters]:
        return self._of(NvlinkCounters)

    @property
    def topologies(self) -> list[NodeTopology]:
        return self._of(NodeTopology)

    @property
    def job_host_windows(self) -> list[JobHostWindow]:
        return self._of(JobHostWindow)

    @property
    def gpu_host_windows(self) -> list[GpuHostWindow]:
        return self._of(GpuHostWindow)

    @property
    def node_fs_windows(self) -> list[NodeFsWindow]:
        return self._of(NodeFsWindow)


@dataclass(frozen=True, slots=True)
class AckResult:
    # the cursor the agent applied (clamped to the last sequence number it assigned)
    acked_cursor: int
    spool_items: int
    spool_bytes: int


# ---------------------------------------------------------------------------------------------
# records


def record_kind(record: AgentRecord) -> str:
    try:
        return _KINDS[type(record)]
    except KeyError:
        raise TypeError(f"not an agent record: {type(record).__name__}") from None


def format_datetime(value: datetime) -> str:
    if value.tzinfo is None:
        raise ValueError("naive datetime: agent records carry aware UTC datetimes")
    return value.astimezone(UTC).isoformat().replace("+00:00", "Z")


def record_to_dict(record: AgentRecord) -> dict[str, Any]:
    """The record's fields by name, JSON-ready (datetimes ISO 8601 UTC, tuples as lists)."""
    cls: type = type(record)
    names, values, converted = _field_plan(cls)
    result = dict(zip(names, values(record), strict=True))
    for name in converted:
        value = result[name]
        if isinstance(value, datetime):
            result[name] = format_datetime(value)
        elif isinstance(value, tuple):
            result[name] = list(value)
        elif isinstance(value, dict):
            result[name] = dict(value)
    return result


@cache
def _field_plan(cls: type) -> tuple[tuple[str, ...], Callable[[Any], tuple[Any, ...]], tuple[str, ...]]:
    """CLS's field names, a getter of their values, and the fields whose declared type may hold
    a datetime, tuple or dict (the only values record_to_dict converts): a spool filled with a
    week of windows (`slurmtel demo`) spent most of its time looking at every field."""
    import operator

    names = tuple(f.name for f in dataclasses.fields(cls))
    hints = _hints(cls)
    plain = (str, int, float, bool, type(None))

    def is_plain(hint: Any) -> bool:
        if typing.get_origin(hint) in (typing.Union, types.UnionType):
            return all(arg in plain for arg in typing.get_args(hint))
        return hint in plain

    converted = tuple(name for name in names if not is_plain(hints[name]))
    getter = operator.attrgetter(*names) if len(names) > 1 else (lambda r: (getattr(r, names[0]),))
    return names, getter, converted


def record_to_json(record: AgentRecord) -> str:
    return json.dumps(record_to_dict(record), separators=(",", ":"), allow_nan=False)


@cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _parse_datetime(value: Any, name: str) -> datetime:
    if not isinstance(value, str):
        raise ValueError(f"field '{name}' must be an ISO 8601 string")
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise ValueError(f"field '{name}' is not an ISO 8601 datetime: {value!r}") from None
    if parsed.tzinfo is None:
        raise ValueError(f"field '{name}' has no time zone: {value!r}")
    return parsed.astimezone(UTC)


Converter = Callable[[Any], Any]


def _converter(hint: Any, name: str) -> Converter:
    """A checking converter for one field, built once per record type (decoding is a hot path:
    the head reads every window summary of every GPU through it)."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(hint)
        (inner,) = [a for a in args if a is not type(None)]
        if inner is float and type(None) in args:

            def optional_number(value: Any) -> float | None:
                kind = type(value)
                if kind is float or value is None:
                    return value
                if kind is int:
                    return float(value)
                raise ValueError(f"field '{name}' must be a number or null")

            return optional_number
        convert = _converter(inner, name)
        if type(None) not in args:
            return convert

        def optional(value: Any) -> Any:
            return None if value is None else convert(value)

        return optional
    if origin is dict:

        def counts(value: Any) -> dict[str, int]:
            if type(value) is not dict or not all(
                type(k) is str and type(v) is int for k, v in value.items()
            ):
                raise ValueError(f"field '{name}' must be an object of integers")
            return dict(value)

        return counts
    if origin is tuple:

        def strings(value: Any) -> tuple[str, ...]:
            if type(value) is not list or not all(type(v) is str for v in value):
                raise ValueError(f"field '{name}' must be a list of strings")
            return tuple(value)

        return strings
    if hint is datetime:
        return lambda value: _parse_datetime(value, name)
    if hint is float:

        def number(value: Any) -> float:
            kind = type(value)
            if kind is float:
                return value
            if kind is int:
                return float(value)
            raise ValueError(f"field '{name}' must be a number")

        return number
    if hint in (bool, int, str):
        expected = hint

        def exact(value: Any) -> Any:
            # bool is not an int here: exact types only
            if type(value) is not expected:
                raise ValueError(f"field '{name}' must be {_TYPE_WORDS[expected]}")
            return value

        return exact
    raise ValueError(f"field '{name}' has an unsupported type {hint!r}")


_TYPE_WORDS: dict[Any, str] = {bool: "true or false", int: "an integer", str: "a string"}


_REQUIRED = object()


def _default(f: dataclasses.Field[Any]) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return _REQUIRED


@cache
def _fields(cls: type) -> tuple[tuple[str, Converter, Any], ...]:
    """(name, converter, default or _REQUIRED) for every field of CLS, in order."""
    hints = _hints(cls)
    return tuple((f.name, _converter(hints[f.name], f.name), _default(f)) for f in dataclasses.fields(cls))


@cache
def _datetime_fields(cls: type) -> tuple[str, ...]:
    hints = _hints(cls)
    return tuple(f.name for f in dataclasses.fields(cls) if hints[f.name] is datetime)


def record_from_dict(kind: str, data: Mapping[str, Any]) -> AgentRecord:
    """Rebuild a record of KIND from record_to_dict() output; ValueError names the bad field."""
    cls = RECORD_TYPES.get(kind)
    if cls is None:
        raise ValueError(f"unknown kind {kind!r}")
    if not isinstance(data, Mapping):
        raise ValueError("record must be an object")
    # the head reads well-formed pages with msgspec (_decode_well_formed); this is the checking
    # path that names what is wrong with a record
    # positional, in field order
    args: list[Any] = []
    append = args.append
    for name, convert, default in _fields(cls):
        value = data.get(name, default)
        if value is default:
            if default is _REQUIRED:
                raise ValueError(f"missing field '{name}'")
            append(default)
        else:
            append(convert(value))
    record: AgentRecord = cls(*args)
    return record


# ---------------------------------------------------------------------------------------------
# GET /v1/summaries


def summaries_query(
    after: int, limit: int = DEFAULT_PAGE_LIMIT, kinds: tuple[str, ...] | None = ALL_KINDS
) -> str:
    """The path and query the head requests: "/v1/summaries?after=41&limit=1000&kinds=...".

    KINDS: the record kinds the head stores, every kind this head knows by default (None:
    leave the parameter out, as heads before kinds were negotiated did)."""
    # formatted, not urlencoded: a head asks every node for a page every minute, and urlencode
    # cost more than the rest of building the request (the kinds are encoded once)
    if kinds is None:
        return f"{SUMMARIES_PATH}?after={int(after)}&limit={int(limit)}"
    return f"{SUMMARIES_PATH}?after={int(after)}&limit={int(limit)}&kinds={_kinds_query(kinds)}"


@cache
def _kinds_query(kinds: tuple[str, ...]) -> str:
    return urlencode({"kinds": ",".join(kinds)}).removeprefix("kinds=")


def requested_kinds(value: str | None) -> tuple[str, ...]:
    """The kinds a request's `kinds` parameter asks for that this agent knows; the original
    kinds without the parameter."""
    if value is None:
        return ORIGINAL_KINDS
    return tuple(k for k in dict.fromkeys(v.strip() for v in value.split(",")) if k in RECORD_TYPES)


def encode_summaries_response(
    *,
    node: str,
    agent_version: str,
    items: Iterable[tuple[int, str, str]],
    next_cursor: int,
    evicted_total: int,
    spool_items: int,
    spool_bytes: int,
    spool_id: str,
) -> bytes:
    """The /v1/summaries body. ITEMS are (seq, kind, record JSON text) as the spool holds them."""
    head = {
        "protocol_version": PROTOCOL_VERSION,
        "node": node,
        "agent_version": agent_version,
        "spool_id": spool_id,
        "next_cursor": next_cursor,
        "evicted_total": evicted_total,
        "spool_items": spool_items,
        "spool_bytes": spool_bytes,
    }
    # the spool stores each record's JSON already: splice it in rather than re-encoding
    parts = [
        f'{{"seq":{int(seq)},"kind":{json.dumps(kind)},"record":{payload}}}' for seq, kind, payload in items
    ]
    body = json.dumps(head, separators=(",", ":"))
    return (body[:-1] + ',"items":[' + ",".join(parts) + "]}").encode()


def _require(data: Mapping[str, Any], key: str, kind: type, origin: str) -> Any:
    if key not in data:
        raise ParseError(f"{origin}: summaries response has no '{key}'")
    value = data[key]
    if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise ParseError(f"{origin}: '{key}' must be an integer, not {type(value).__name__}")
    if kind is not int and not isinstance(value, kind):
        raise ParseError(f"{origin}: '{key}' must be a {kind.__name__}, not {type(value).__name__}")
    return value


def decode_summaries_response(raw: bytes | str, origin: str = "agent") -> SummariesPage:
    """Parse a /v1/summaries body. ORIGIN (e.g. "gpu01:9767") names the agent in errors."""
    # a page is thousands of small acyclic objects: the cyclic collector would rescan them
    # over and over while they are built
    with gc_paused():
        try:
            page = _decode_well_formed(raw, origin)
        except _SlowPath:
            page = _decode_checking(raw, origin)
    if not any(item.kind == "rejected" for item in page.items):
        return page
    # what the agent could not read itself (a bad cgroup file) joins what the head could not
    shipped = [item.record for item in page.items if isinstance(item.record, Rejected)]
    return dataclasses.replace(
        page,
        items=tuple(item for item in page.items if item.kind != "rejected"),
        rejected=(*page.rejected, *shipped),
    )


class _WireItem(msgspec.Struct):
    seq: int
    kind: str
    record: msgspec.Raw


def _known_item(kind: str, cls: type) -> type[msgspec.Struct]:
    # an item of one known kind, told apart from the others by its "kind" (a tagged union)
    return msgspec.defstruct(
        f"_{cls.__name__}Item", [("seq", int), ("record", cls)], tag_field="kind", tag=kind
    )


_KNOWN_ITEMS: dict[type, str] = {_known_item(kind, cls): kind for kind, cls in RECORD_TYPES.items()}


# the envelope's fields as SummariesPage declares them, with the items of one wire shape
_ENVELOPE = tuple(
    f for f in dataclasses.fields(SummariesPage) if f.init and f.name not in ("items", "rejected")
)


def _wire_page(name: str, item: Any) -> type[msgspec.Struct]:
    hints = _hints(SummariesPage)
    fields: list[tuple[str, Any] | tuple[str, Any, Any]] = [
        (f.name, hints[f.name]) if f.default is dataclasses.MISSING else (f.name, hints[f.name], f.default)
        for f in _ENVELOPE
    ]
    return msgspec.defstruct(name, [*fields, ("items", types.GenericAlias(list, (item,)))], kw_only=True)


_WirePage = _wire_page("_WirePage", _WireItem)
_KnownPage = _wire_page("_KnownPage", typing.Union[tuple(_KNOWN_ITEMS)])  # noqa: UP007  # built at runtime
# a page of known kinds (most hold window summaries alone; a node's first page its inventory
# too, and an agent that reads the fabric its counters): one msgspec call builds all records
_KNOWN_PAGE = msgspec.json.Decoder(_KnownPage)
_WIRE_PAGE = msgspec.json.Decoder(_WirePage)
# msgspec builds the frozen records straight from their JSON, checking each field's type the
# way record_from_dict does (exact types, an int is a float, unknown fields ignored)
_RECORD_DECODERS: dict[str, msgspec.json.Decoder[Any]] = {
    kind: msgspec.json.Decoder(cls) for kind, cls in RECORD_TYPES.items()
}


class _SlowPath(Exception):
    """The page needs the checking decoder, which says exactly what is wrong with it."""


def _decode_well_formed(raw: bytes | str, origin: str) -> SummariesPage:
    """The fast path, taken by every page of a well-behaved agent: raises _SlowPath when the
    envelope is anything but well formed. A record msgspec refuses goes through
    record_from_dict alone, so it is rejected with the same reason as on the checking path."""
    wire: Any
    try:
        wire = _KNOWN_PAGE.decode(raw)
    except msgspec.ValidationError:
        # a kind this head does not know, or a record that is not right: each record on its own
        try:
            wire = _WIRE_PAGE.decode(raw)
        except (msgspec.DecodeError, UnicodeError, RecursionError):
            raise _SlowPath from None
    except (msgspec.DecodeError, UnicodeError, RecursionError):
        # RecursionError: an item nested deeper than msgspec goes (the checking path rejects it)
        raise _SlowPath from None
    if wire.protocol_version != PROTOCOL_VERSION:
        raise _SlowPath
    items: list[PageItem] = []
    rejected: list[Rejected] = []
    last_seq: int | None = None
    for item in wire.items:
        seq = item.seq
        if last_seq is not None and seq <= last_seq:
            raise _SlowPath
        last_seq = seq
        record: AgentRecord | None
        if isinstance(item, _WireItem):
            kind = item.kind
            decoder = _RECORD_DECODERS.get(kind)
            try:
                record = _utc_datetimes(decoder.decode(item.record)) if decoder else None
            except msgspec.DecodeError:
                record = None
            if record is None:
                try:
                    data = {"seq": seq, "kind": kind, "record": _loads(memoryview(item.record))}
                except (ValueError, RecursionError) as exc:
                    rejected.append(
                        _rejected_item(item, seq, wire.node, origin, f"record is not JSON: {exc}")
                    )
                    continue
                decoded = _decode_item(data, seq, wire.node, origin)
                if isinstance(decoded, Rejected):
                    rejected.append(decoded)
                    continue
                record = decoded
        else:
            kind = _KNOWN_ITEMS[type(item)]
            record = item.record
            # a summary's one datetime, in UTC as agents send it: nothing to convert
            if not (type(record) is GpuSummary and record.window_start_at.tzinfo is UTC):
                record = _utc_datetimes(record)
                if record is None:
                    raise _SlowPath  # a datetime without a time zone: the checking path names it
        items.append(PageItem(seq, kind, record))
    if last_seq is not None and wire.next_cursor < last_seq:
        raise _SlowPath
    if any(not 0 <= getattr(wire, name) <= _INT8_MAX for name in _COUNTERS):
        raise _SlowPath
    return SummariesPage(
        **{f.name: getattr(wire, f.name) for f in _ENVELOPE}, items=tuple(items), rejected=tuple(rejected)
    )


_INT8_MAX = 2**63 - 1
# the envelope's counters, stored as bigint with the node's cursor
_COUNTERS = ("next_cursor", "evicted_total", "spool_items", "spool_bytes")


def _loads(raw: bytes | str | memoryview) -> Any:
    """JSON text -> objects; integers beyond 64 bits (which orjson refuses) through Python's json."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        text = bytes(raw).decode("utf-8", "replace") if not isinstance(raw, str) else raw
        return json.loads(text)


def _rejected_item(item: _WireItem, seq: int, node: str, origin: str, reason: str) -> Rejected:
    raw = f'{{"seq":{seq},"kind":{json.dumps(item.kind)},"record":{bytes(item.record).decode("utf-8", "replace")}}}'
    return Rejected(
        source="agent",
        origin=f"{origin} ({node})" if node and node not in origin else origin,
        record_key=f"seq {seq}",
        reason=reason,
        raw=raw[:10000],
    )


def _utc_datetimes(record: AgentRecord) -> AgentRecord | None:
    """RECORD with its datetimes in UTC; None when one has no time zone (record_from_dict
    rejects it, naming the field)."""
    changes = {}
    cls: type = type(record)
    for name in _datetime_fields(cls):
        value = getattr(record, name)
        if value.tzinfo is UTC:
            continue
        if value.tzinfo is None:
            return None
        changes[name] = value.astimezone(UTC)
    return dataclasses.replace(record, **changes) if changes else record


def _decode_item(item: Any, seq: int, node: str, origin: str) -> AgentRecord | Rejected:
    try:
        kind = item.get("kind")
        if not isinstance(kind, str):
            raise ValueError("no 'kind'")
        return record_from_dict(kind, item.get("record"))
    except (ValueError, TypeError, RecursionError) as exc:
        try:
            raw = json.dumps(item, sort_keys=True)[:10000]
        except (ValueError, TypeError, RecursionError):
            try:
                raw = repr(item)[:10000]
            except RecursionError:
                raw = f"<seq {seq}: nested too deeply to show>"
        return Rejected(
            source="agent",
            origin=f"{origin} ({node})" if node and node not in origin else origin,
            record_key=f"seq {seq}",
            reason=str(exc) or type(exc).__name__,
            raw=raw,
        )


def _salvage(raw: bytes | str, origin: str) -> dict[str, Any]:
    """A page no decoder takes whole (an item nested too deeply, or damaged) read value by
    value: the items that can be decoded, the others as BadItem (rejected alone)."""
    text = raw if isinstance(raw, str) else raw.decode("utf-8", "replace")
    try:
        return read_document(text, "items")
    except (Truncated, NotAnObject, ValueError) as exc:
        kind = "cut short" if isinstance(exc, Truncated) else str(exc)
        raise ParseError(f"{origin}: summaries response is not JSON ({kind})") from None


def _decode_checking(raw: bytes | str, origin: str) -> SummariesPage:
    try:
        data = _loads(raw)
    except (ValueError, UnicodeError, RecursionError):
        data = _salvage(raw, origin)
    if not isinstance(data, dict):
        raise ParseError(f"{origin}: summaries response is not a JSON object")
    version = data.get("protocol_version", PROTOCOL_VERSION)
    if isinstance(version, bool) or not isinstance(version, int) or version != PROTOCOL_VERSION:
        raise ParseError(
            f"{origin}: unsupported agent protocol version {version!r} (expected {PROTOCOL_VERSION})"
        )
    node = _require(data, "node", str, origin)
    agent_version = _require(data, "agent_version", str, origin)
    raw_items = _require(data, "items", list, origin)
    next_cursor = _require(data, "next_cursor", int, origin)
    evicted_total = _require(data, "evicted_total", int, origin)
    spool_items = _require(data, "spool_items", int, origin)
    spool_bytes = _require(data, "spool_bytes", int, origin)
    spool_id = data.get("spool_id", "")
    if not isinstance(spool_id, str):
        raise ParseError(f"{origin}: 'spool_id' must be a string")
    for name in _COUNTERS:
        if not 0 <= data[name] <= _INT8_MAX:
            raise ParseError(f"{origin}: '{name}' is {data[name]}, outside 0 .. {_INT8_MAX}")
    items: list[PageItem] = []
    rejected: list[Rejected] = []
    last_seq: int | None = None
    for position, item in enumerate(raw_items):
        if isinstance(item, BadItem):
            # its seq cannot be read either: the next seq check still holds the page's order
            rejected.append(
                Rejected("agent", origin, f"item {position}", f"item is {item.reason}", item.text[:10000])
            )
            continue
        seq = item.get("seq") if isinstance(item, dict) else None
        if isinstance(seq, bool) or not isinstance(seq, int):
            raise ParseError(f"{origin}: item {position} has no integer 'seq'")
        if last_seq is not None and seq <= last_seq:
            raise ParseError(f"{origin}: item seq {seq} does not follow {last_seq}")
        last_seq = seq
        decoded = _decode_item(item, seq, node, origin)
        if isinstance(decoded, Rejected):
            rejected.append(decoded)
            continue
        items.append(PageItem(seq, item["kind"], decoded))
    if last_seq is not None and next_cursor < last_seq:
        raise ParseError(f"{origin}: next_cursor {next_cursor} is before the last item's seq {last_seq}")
    return SummariesPage(
        node=node,
        agent_version=agent_version,
        items=tuple(items),
        next_cursor=next_cursor,
        evicted_total=evicted_total,
        spool_items=spool_items,
        spool_bytes=spool_bytes,
        spool_id=spool_id,
        protocol_version=version,
        rejected=tuple(rejected),
    )


# ---------------------------------------------------------------------------------------------
# POST /v1/ack


def encode_ack_request(cursor: int) -> bytes:
    return json.dumps({"cursor": int(cursor)}).encode()


# a cursor is a spool sequence number, a bigint at the head and an integer in SQLite
MAX_CURSOR = 2**63 - 1


def salvage_envelope(raw: bytes | str) -> dict[str, Any] | None:
    """What can be read of a page's top-level values (next_cursor, spool_id, ...) whatever its
    items hold, for a page the head cannot use; {} when the text is no JSON object at all; None
    when it is cut short (the transfer broke: fetched again, it may well be whole)."""
    text = raw if isinstance(raw, str) else raw.decode("utf-8", "replace")
    values: dict[str, Any] = {}

    def on_value(key: str, value: Any) -> None:
        if not isinstance(value, BadItem):
            values[key] = value

    try:
        scan_object(text, "items", lambda index, item, item_text: None, on_value)
    except Truncated:
        return None
    except (NotAnObject, ValueError):
        return {}
    return values


def decode_ack_request(raw: bytes | str) -> int:
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ParseError(f"ack request is not JSON: {exc}") from exc
    except RecursionError:
        raise ParseError("ack request is nested too deeply") from None
    cursor = data.get("cursor") if isinstance(data, dict) else None
    if isinstance(cursor, bool) or not isinstance(cursor, int) or not 0 <= cursor <= MAX_CURSOR:
        raise ParseError("ack request needs an integer 'cursor' from 0 to 2^63-1")
    return cursor


def encode_ack_response(result: AckResult) -> bytes:
    # the fields by name, as asdict gave them: asdict deep-copies, a third of an ack's CPU
    return json.dumps(
        {
            "acked_cursor": result.acked_cursor,
            "spool_items": result.spool_items,
            "spool_bytes": result.spool_bytes,
        }
    ).encode()


def decode_ack_response(raw: bytes | str, origin: str = "agent") -> AckResult:
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ParseError(f"{origin}: ack response is not JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise ParseError(f"{origin}: ack response is not a JSON object")
    return AckResult(
        acked_cursor=_require(data, "acked_cursor", int, origin),
        spool_items=_require(data, "spool_items", int, origin),
        spool_bytes=_require(data, "spool_bytes", int, origin),
    )
