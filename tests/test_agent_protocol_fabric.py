"""The agent protocol's new record kinds (port counters, NVLink counters, topology): negotiated
by the head, so an old head never meets them and a new head reads an old agent as before; and
the head stores them once."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import Engine, text

from slurmtel.agent.metrics import AgentMetrics
from slurmtel.agent.protocol import (
    ALL_KINDS,
    ORIGINAL_KINDS,
    decode_summaries_response,
    encode_summaries_response,
    record_from_dict,
    record_kind,
    record_to_json,
    requested_kinds,
    summaries_query,
)
from slurmtel.agent.server import AgentHttpServer
from slurmtel.agent.spool import Spool
from slurmtel.config import config_from_dict
from slurmtel.records import NodeTopology, NvlinkCounters, PortCounters
from slurmtel.sources import default_options, get_source
from slurmtel.sources.base import RunContext
from slurmtel.sources.runner import run_recorded
from tests.factories import T0, windows

PORT = PortCounters(
    node="gpu01",
    device="mlx5_0",
    port=1,
    window_start_at=T0,
    window_seconds=30.0,
    link_layer="InfiniBand",
    state="ACTIVE",
    phys_state="LinkUp",
    rate_gbps=400.0,
    deltas={"symbol_error": 3, "port_xmit_data": 250_000_000, "port_xmit_wait": 1000},
    resets=(),
    saturated=("excessive_buffer_overrun_errors",),
)
NVLINK = NvlinkCounters(
    node="gpu01",
    gpu_uuid="GPU-0",
    window_start_at=T0,
    window_seconds=30.0,
    links_active=12,
    links_total=18,
    tx_bytes=2**40,
    rx_bytes=2**39,
    errors={"replay": 4, "crc_flit": 2},
    link_errors={"3:replay": 4, "3:crc_flit": 2},
)
TOPOLOGY = NodeTopology(
    node="gpu01",
    observed_at=T0,
    source="nvml",
    devices=("GPU0", "GPU1"),
    links=("GPU0-GPU1:NV12",),
    summary="2 GPUs; every pair NV12 (12 bonded NVLinks)",
    gpu_uuids=("GPU-0", "GPU-1"),
    p2p=("GPU0-GPU1:ok", "GPU1-GPU0:ok"),
)
NEW = [PORT, NVLINK, TOPOLOGY]


@pytest.mark.parametrize("record", NEW, ids=lambda r: type(r).__name__)
def test_new_records_round_trip(record: object) -> None:
    kind = record_kind(record)  # type: ignore[arg-type]
    payload = record_to_json(record)  # type: ignore[arg-type]
    assert record_from_dict(kind, json.loads(payload)) == record
    page = encode_summaries_response(
        node="gpu01", agent_version="x", items=[(1, kind, payload)], next_cursor=1,
        evicted_total=0, spool_items=1, spool_bytes=1, spool_id="s",
    )  # fmt: skip
    assert decode_summaries_response(page).items[0].record == record


def test_a_bad_counter_map_is_one_rejected_item() -> None:
    bad = json.loads(record_to_json(PORT))
    bad["deltas"]["symbol_error"] = "three"
    page = encode_summaries_response(
        node="gpu01",
        agent_version="x",
        items=[(1, "port_counters", json.dumps(bad)), (2, "topology", record_to_json(TOPOLOGY))],
        next_cursor=2, evicted_total=0, spool_items=2, spool_bytes=1, spool_id="s",
    )  # fmt: skip
    decoded = decode_summaries_response(page)
    assert [i.kind for i in decoded.items] == ["topology"]
    assert "field 'deltas' must be an object of integers" in decoded.rejected[0].reason


def test_requested_kinds() -> None:
    assert requested_kinds(None) == ORIGINAL_KINDS
    assert requested_kinds("summary,port_counters,some_future_kind,summary") == ("summary", "port_counters")
    assert "kinds=summary%2Cevent" in summaries_query(0, 10, ("summary", "event"))
    assert "kinds" not in summaries_query(0, 10, None)
    assert summaries_query(0, 10) == summaries_query(0, 10, ALL_KINDS)


TOKEN = "fabric-test-token-0123"


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Spool, int]]:
    spool = Spool(tmp_path / "spool.sqlite")
    server = AgentHttpServer(spool, AgentMetrics(), "gpu01", "0.1.0", "127.0.0.1", 0, token=TOKEN)
    server.start()
    yield spool, server.address[1]
    server.stop()
    spool.close()


def get(port: int, query: str) -> dict:  # type: ignore[type-arg]
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{query}", headers={"Authorization": f"Bearer {TOKEN}"}
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def test_an_old_head_gets_the_original_kinds_and_its_cursor_covers_the_rest(
    served: tuple[Spool, int],
) -> None:
    spool, port = served
    spool.append_records([*windows("GPU-0", T0, 2), PORT, NVLINK, TOPOLOGY])  # seqs 1..5
    old = get(port, "/v1/summaries?after=0&limit=100")
    assert [i["kind"] for i in old["items"]] == ["summary", "summary"]
    assert old["next_cursor"] == 5
    page = get(port, summaries_query(0, 100, ALL_KINDS))
    assert [i["kind"] for i in page["items"]] == [
        "summary",
        "summary",
        "port_counters",
        "nvlink_counters",
        "topology",
    ]
    # a full page covers up to its last item only
    full = get(port, "/v1/summaries?after=0&limit=1")
    assert (len(full["items"]), full["next_cursor"]) == (1, 1)
    # only new kinds after the cursor: an empty page that still moves it on
    tail = get(port, "/v1/summaries?after=2&limit=100")
    assert (tail["items"], tail["next_cursor"]) == ([], 5)
    # a head that wants only kinds this agent does not know gets nothing, and moves on
    future = get(port, "/v1/summaries?after=0&limit=100&kinds=some_future_kind")
    assert (future["items"], future["next_cursor"]) == ([], 5)


def test_the_head_stores_the_new_kinds_once(
    ctx: RunContext, served: tuple[Spool, int], engine: Engine, tmp_path: Path
) -> None:
    spool, port = served
    token = tmp_path / "agent-token"
    token.write_text(TOKEN)
    later = replace(PORT, window_start_at=T0 + timedelta(seconds=30), deltas={"symbol_error": 1})
    spool.append_records(
        [PORT, later, NVLINK, TOPOLOGY, replace(TOPOLOGY, observed_at=T0 + timedelta(hours=1))]
    )
    config = config_from_dict(
        {"sources": {"agent": {"targets": [f"gpu01=127.0.0.1:{port}"], "token_file": str(token)}}}
    )
    c = replace(ctx, config=config)
    source = get_source("agent")
    outcome = run_recorded(c, "agent", "once", lambda: source.collect(c, default_options(source)))
    assert outcome.status == "ok", outcome.message
    with engine.connect() as conn:
        ports = conn.execute(
            text("SELECT device, port, deltas, saturated FROM fabric_port_window ORDER BY window_start_at")
        ).all()
        assert [(p.device, p.deltas["symbol_error"]) for p in ports] == [("mlx5_0", 3), ("mlx5_0", 1)]
        assert ports[0].saturated == ["excessive_buffer_overrun_errors"]
        (nvlink,) = conn.execute(
            text("SELECT links_active, tx_bytes, errors, link_errors FROM nvlink_window")
        ).all()
        assert (nvlink.links_active, nvlink.tx_bytes, nvlink.errors) == (
            12,
            2**40,
            {"replay": 4, "crc_flit": 2},
        )
        (topology,) = conn.execute(
            text("SELECT summary, links, p2p, first_seen_at, last_seen_at FROM node_topology")
        ).all()
        assert topology.links == ["GPU0-GPU1:NV12"] and topology.p2p == ["GPU0-GPU1:ok", "GPU1-GPU0:ok"]
        assert (topology.first_seen_at, topology.last_seen_at) == (T0, T0 + timedelta(hours=1))
    assert spool.stats().items == 0
    # the same page again (an --input replay): nothing new
    from slurmtel.store.fabric import write_nvlink_counters, write_port_counters

    with engine.begin() as conn:
        assert write_port_counters(conn, [PORT, later]) == 0
        assert write_nvlink_counters(conn, [NVLINK]) == 0


def test_an_old_agent_is_read_as_before(ctx: RunContext, tmp_path: Path, engine: Engine) -> None:
    """An agent from before kinds were negotiated ignores the parameter: its page has the
    original kinds only, and a head that asks for more reads it unchanged."""
    page = encode_summaries_response(
        node="gpu01",
        agent_version="0.0.9",
        items=[(i + 1, "summary", record_to_json(w)) for i, w in enumerate(windows("GPU-0", T0, 3))],
        next_cursor=3, evicted_total=0, spool_items=3, spool_bytes=1, spool_id="s",
    )  # fmt: skip
    decoded = decode_summaries_response(page)
    assert len(decoded.summaries) == 3 and decoded.port_counters == [] and decoded.topologies == []
    assert datetime.fromisoformat(json.loads(page)["items"][0]["record"]["window_start_at"]).tzinfo == UTC


@pytest.mark.parametrize("record", NEW, ids=lambda r: type(r).__name__)
def test_record_to_dict_converts_every_field_as_one_by_one_would(record: object) -> None:
    """record_to_dict looks only at the fields whose type may need converting (a week of
    windows spooled at once, `slurmtel demo`): the same dict as converting each field."""
    import dataclasses
    from datetime import datetime

    from slurmtel.agent.protocol import format_datetime, record_to_dict

    def one_by_one(value: object) -> object:
        if isinstance(value, datetime):
            return format_datetime(value)
        if isinstance(value, tuple):
            return list(value)
        return dict(value) if isinstance(value, dict) else value

    expected = {f.name: one_by_one(getattr(record, f.name)) for f in dataclasses.fields(record)}  # type: ignore[arg-type]
    got = record_to_dict(record)  # type: ignore[arg-type]
    assert got == expected and list(got) == list(expected)
    assert all(type(got[k]) is type(v) for k, v in expected.items())
