"""The agent <-> head wire format (slurmtel.agent.protocol): pure encode/decode."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from datetime import UTC, datetime

import pytest

from slurmtel.agent.protocol import (
    AckResult,
    AgentRecord,
    decode_ack_request,
    decode_ack_response,
    decode_summaries_response,
    encode_ack_request,
    encode_ack_response,
    encode_summaries_response,
    record_from_dict,
    record_to_dict,
    record_to_json,
    summaries_query,
)
from slurmtel.errors import ParseError
from slurmtel.records import GpuEvent, GpuInventory, GpuSummary

AT = datetime(2026, 12, 2, 14, 0, 30, tzinfo=UTC)

SUMMARY = GpuSummary(
    source="agent",
    node="gpu01",
    gpu_uuid="GPU-00000000-0000-0000-0000-000000000000",
    window_start_at=AT,
    window_seconds=30.0,
    util_metric="gr_engine_active",
    sample_count=30,
    covered_seconds=29.0,
    util_mean_percent=41.5,
    util_max_percent=100.0,
    idle_seconds=12.0,
    no_process_seconds=None,
    memory_used_mean_bytes=1 << 30,
    memory_used_max_bytes=2 << 30,
    memory_total_bytes=81559 << 20,
    power_mean_watts=432.21,
    energy_joules=12966.3,
    energy_method="counter",
    temperature_max_celsius=53.0,
    sm_clock_max_mhz=1980.0,
    job_ids=("123", "124"),
)
EVENT = GpuEvent("gpu01", "MIG-00000001-0000-0000-0000-000000000001", AT, "xid", 43, "gpu_instance_id=3")
INVENTORY = GpuInventory(
    node="gpu01",
    gpu_uuid="MIG-00000000-0000-0000-0000-000000000000",
    index=0,
    model="NVIDIA H100 80GB HBM3 MIG 3g.40gb",
    observed_at=AT,
    memory_total_bytes=40448 << 20,
    parent_gpu_uuid="GPU-00000000-0000-0000-0000-000000000000",
    mig_profile="3g.40gb",
    gpu_fraction=3 / 7,
)


def page(*records: tuple[str, AgentRecord], after: int = 0, **overrides: object) -> bytes:
    items = [(after + i + 1, kind, record_to_json(r)) for i, (kind, r) in enumerate(records)]
    fields: dict[str, object] = {
        "node": "gpu01",
        "agent_version": "0.1.0",
        "items": items,
        "next_cursor": items[-1][0] if items else after,
        "evicted_total": 2,
        "spool_items": len(items),
        "spool_bytes": 999,
        "spool_id": "abc",
    }
    fields.update(overrides)
    return encode_summaries_response(**fields)  # type: ignore[arg-type]


def test_record_fields_on_the_wire() -> None:
    data = record_to_dict(SUMMARY)
    assert data["window_start_at"] == "2026-12-02T14:00:30Z"
    assert data["job_ids"] == ["123", "124"]
    assert data["no_process_seconds"] is None
    assert list(data) == [f for f in GpuSummary.__dataclass_fields__]
    for record, kind in ((SUMMARY, "summary"), (EVENT, "event"), (INVENTORY, "inventory")):
        assert record_from_dict(kind, json.loads(record_to_json(record))) == record


def test_page_round_trip() -> None:
    raw = page(("inventory", INVENTORY), ("summary", SUMMARY), ("event", EVENT), after=40)
    decoded = decode_summaries_response(raw, origin="gpu01:9767")
    assert [(i.seq, i.kind) for i in decoded.items] == [(41, "inventory"), (42, "summary"), (43, "event")]
    assert decoded.summaries == [SUMMARY]
    assert decoded.events == [EVENT]
    assert decoded.inventory == [INVENTORY]
    assert (decoded.node, decoded.agent_version, decoded.spool_id) == ("gpu01", "0.1.0", "abc")
    assert (decoded.next_cursor, decoded.evicted_total, decoded.spool_items, decoded.spool_bytes) == (
        43,
        2,
        3,
        999,
    )
    assert decoded.rejected == ()
    body = json.loads(raw)
    assert body["items"][1] == {"seq": 42, "kind": "summary", "record": record_to_dict(SUMMARY)}


def test_empty_page_keeps_the_cursor() -> None:
    decoded = decode_summaries_response(page(after=17))
    assert (decoded.items, decoded.next_cursor) == ((), 17)


def test_bad_item_is_rejected_and_the_rest_kept() -> None:
    body = json.loads(page(("summary", SUMMARY), ("event", EVENT)))
    body["items"][0]["record"]["window_start_at"] = "2026-12-02T14:00:30"  # no zone
    body["items"][1]["record"]["value"] = "43"
    body["items"].append({"seq": 3, "kind": "sample", "record": {}})
    body["items"].append({"seq": 4, "kind": "inventory", "record": record_to_dict(INVENTORY)})
    body["next_cursor"] = 4
    decoded = decode_summaries_response(json.dumps(body).encode(), origin="gpu01:9767")
    assert [i.seq for i in decoded.items] == [4]
    assert [(r.source, r.origin, r.record_key, r.reason) for r in decoded.rejected] == [
        ("agent", "gpu01:9767", "seq 1", "field 'window_start_at' has no time zone: '2026-12-02T14:00:30'"),
        ("agent", "gpu01:9767", "seq 2", "field 'value' must be an integer"),
        ("agent", "gpu01:9767", "seq 3", "unknown kind 'sample'"),
    ]


def test_unknown_record_fields_are_ignored_missing_required_ones_rejected() -> None:
    data = record_to_dict(EVENT) | {"new_field": 1}
    assert record_from_dict("event", data) == EVENT
    del data["gpu_uuid"]
    with pytest.raises(ValueError, match="missing field 'gpu_uuid'"):
        record_from_dict("event", data)
    # a field with a default may be absent (an older agent)
    minimal = {k: v for k, v in record_to_dict(EVENT).items() if k != "detail"}
    restored = record_from_dict("event", minimal)
    assert isinstance(restored, GpuEvent)
    assert restored.detail == ""


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b"{not json", "not JSON"),
        (b"[]", "not a JSON object"),
        (b'{"node": "gpu01"}', "has no 'agent_version'"),
        (json.dumps({"protocol_version": 2}).encode(), "unsupported agent protocol version 2"),
        (
            json.dumps(
                {
                    "node": "n",
                    "agent_version": "v",
                    "items": [],
                    "next_cursor": "5",
                    "evicted_total": 0,
                    "spool_items": 0,
                    "spool_bytes": 0,
                }
            ).encode(),
            "'next_cursor' must be an integer",
        ),
        (
            json.dumps(
                {
                    "node": "n",
                    "agent_version": "v",
                    "items": [{"kind": "event"}],
                    "next_cursor": 5,
                    "evicted_total": 0,
                    "spool_items": 0,
                    "spool_bytes": 0,
                }
            ).encode(),
            "item 0 has no integer 'seq'",
        ),
        (
            json.dumps(
                {
                    "node": "n",
                    "agent_version": "v",
                    "items": [{"seq": 3}, {"seq": 3}],
                    "next_cursor": 5,
                    "evicted_total": 0,
                    "spool_items": 0,
                    "spool_bytes": 0,
                }
            ).encode(),
            "seq 3 does not follow 3",
        ),
        (
            json.dumps(
                {
                    "node": "n",
                    "agent_version": "v",
                    "items": [{"seq": 9}],
                    "next_cursor": 5,
                    "evicted_total": 0,
                    "spool_items": 0,
                    "spool_bytes": 0,
                }
            ).encode(),
            "next_cursor 5 is before the last item's seq 9",
        ),
    ],
)
def test_unreadable_page_raises_parse_error(raw: bytes, reason: str) -> None:
    with pytest.raises(ParseError, match=f"^gpu01:9767: .*{reason}"):
        decode_summaries_response(raw, origin="gpu01:9767")


def test_ack_messages() -> None:
    assert decode_ack_request(encode_ack_request(41)) == 41
    for bad in (b"{}", b'{"cursor": -1}', b'{"cursor": "4"}', b'{"cursor": true}', b"nope"):
        with pytest.raises(ParseError):
            decode_ack_request(bad)
    result = AckResult(41, 3, 1200)
    assert decode_ack_response(encode_ack_response(result)) == result
    # the request of a head from before kinds were negotiated; this head names what it stores
    assert summaries_query(41, 500, None) == "/v1/summaries?after=41&limit=500"
    assert summaries_query(41, 500).startswith(
        "/v1/summaries?after=41&limit=500&kinds=summary%2Cevent%2Cinventory"
    )


def test_protocol_imports_no_nvml() -> None:
    """The head imports protocol.py: it must not pull in pynvml or the agent's NVML code."""
    code = (
        "import sys, slurmtel.agent.protocol; "
        "print(sorted(m for m in sys.modules if 'nvml' in m or m.startswith('slurmtel.agent.')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['slurmtel.agent.protocol']"


def test_an_integer_where_a_number_is_due_takes_the_checking_path() -> None:
    data = record_to_dict(SUMMARY) | {"window_seconds": 30, "util_max_percent": 100}
    restored = record_from_dict("summary", data)
    assert restored == SUMMARY
    assert type(restored.window_seconds) is float
    with pytest.raises(ValueError, match="'job_ids' must be a list of strings"):
        record_from_dict("summary", data | {"job_ids": [17]})
    with pytest.raises(ValueError, match="'sample_count' must be an integer"):
        record_from_dict("summary", data | {"sample_count": True})


@pytest.mark.parametrize(
    "change",
    [
        {},
        {"window_seconds": 30, "util_max_percent": 100},
        {"window_start_at": "2026-12-02T15:00:30+01:00"},
        {"window_start_at": "2026-12-02T14:00:30"},
        {"window_start_at": "yesterday"},
        {"window_start_at": 1764684030},
        {"sample_count": True},
        {"sample_count": 30.0},
        {"window_seconds": False},
        {"window_seconds": "30"},
        {"util_mean_percent": None},
        {"memory_used_max_bytes": 1.5},
        {"job_ids": [17]},
        {"job_ids": "123"},
        {"job_ids": []},
        {"node": None},
        {"energy_method": None},
        {"gpu_uuid": "GPU-\u00e9\u2603"},
        {"from_a_newer_agent": {"nested": [1, 2]}},
        {"idle_seconds": 1e308},
    ],
)
@pytest.mark.parametrize("summaries_only", [True, False])
def test_the_fast_decoder_agrees_with_the_checking_one(
    change: dict[str, object], summaries_only: bool
) -> None:
    """Pages of well-behaved agents take a msgspec fast path (one call for a page of summaries
    alone, a record at a time otherwise); whatever it meets must come out exactly as the
    checking decoder (record_from_dict) makes it: same records, same types, same rejections
    and reasons - or it hands the page to the checking decoder."""
    from slurmtel.agent.protocol import _decode_checking, _decode_well_formed, _SlowPath

    others = (
        [("summary", replace(SUMMARY, gpu_uuid="GPU-2"))]
        if summaries_only
        else [("event", EVENT), ("inventory", INVENTORY)]
    )
    body = json.loads(page(("summary", SUMMARY), *others))
    body["items"][0]["record"].update(change)
    raw = json.dumps(body).encode()
    checked = _decode_checking(raw, "gpu01:9767")
    assert decode_summaries_response(raw, origin="gpu01:9767") == checked
    try:
        fast = _decode_well_formed(raw, "gpu01:9767")
    except _SlowPath:
        assert checked.rejected  # only a page with something wrong takes the checking path
        return
    assert fast == checked
    assert [[type(v) for v in vars_of(i.record)] for i in fast.items] == [
        [type(v) for v in vars_of(i.record)] for i in checked.items
    ]


@pytest.mark.parametrize(
    ("target", "change"),
    [
        ("event", {}),
        ("event", {"at": "2026-12-02T15:00:30+01:00"}),
        ("event", {"at": "2026-12-02T14:00:30"}),
        ("event", {"value": "43"}),
        ("event", {"value": 43.0}),
        ("event", {"detail": None}),
        ("inventory", {"observed_at": "2026-12-02T09:00:30-05:00"}),
        ("inventory", {"observed_at": "2026-12-02T14:00:30"}),
        ("inventory", {"index": True}),
        ("inventory", {"gpu_fraction": 1}),
        ("inventory", {"memory_total_bytes": None}),
        ("inventory", {"from_a_newer_agent": [1]}),
        ("summary", {"window_start_at": "2026-12-02T15:00:30+01:00"}),
    ],
)
def test_pages_of_several_kinds_decode_at_once_as_the_checking_decoder_does(
    target: str, change: dict[str, object]
) -> None:
    """A node's first page holds its inventory, an agent reading the fabric sends counters with
    its windows: such pages are decoded in one msgspec call too (the items told apart by their
    kind), and must come out as the checking decoder makes them, whichever record is odd. A
    kind this head does not know sends the page a record at a time."""
    from slurmtel.agent.protocol import _decode_checking, _decode_well_formed, _SlowPath

    body = json.loads(page(("inventory", INVENTORY), ("summary", SUMMARY), ("event", EVENT)))
    for item in body["items"]:
        if item["kind"] == target:
            item["record"].update(change)
    raw = json.dumps(body).encode()
    checked = _decode_checking(raw, "gpu01:9767")
    try:
        fast = _decode_well_formed(raw, "gpu01:9767")
    except _SlowPath:
        assert checked.rejected
        return
    assert fast == checked
    assert [[type(v) for v in vars_of(i.record)] for i in fast.items] == [
        [type(v) for v in vars_of(i.record)] for i in checked.items
    ]
    assert all(
        getattr(i.record, f).tzinfo is UTC
        for i in fast.items
        for f in ("at", "observed_at", "window_start_at")
        if hasattr(i.record, f)
    )
    body["items"].append({"seq": 99, "kind": "from_a_newer_agent", "record": {"x": 1}})
    body["next_cursor"] = 99
    raw = json.dumps(body).encode()
    assert _decode_well_formed(raw, "gpu01:9767") == _decode_checking(raw, "gpu01:9767")


def vars_of(record: AgentRecord) -> list[object]:
    return [getattr(record, name) for name in record.__dataclass_fields__]


def test_a_page_the_fast_decoder_cannot_read_gets_the_checking_decoders_reason() -> None:
    body = json.loads(page(("summary", SUMMARY)))
    body["evicted_total"] = True
    with pytest.raises(ParseError, match="'evicted_total' must be an integer, not bool"):
        decode_summaries_response(json.dumps(body).encode(), origin="gpu01:9767")


def test_a_summary_has_one_datetime_the_fast_path_puts_in_utc() -> None:
    """The page-at-once path checks window_start_at alone for UTC: a new datetime field in
    GpuSummary must be added there."""
    import typing

    hints = typing.get_type_hints(GpuSummary)
    assert [name for name, hint in hints.items() if hint is datetime] == ["window_start_at"]
