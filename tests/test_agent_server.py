"""The agent's HTTP server, started for real on 127.0.0.1 (port 0) in a thread."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from slurmtel.agent.metrics import AgentMetrics
from slurmtel.agent.protocol import (
    AgentRecord,
    decode_ack_response,
    decode_summaries_response,
    encode_ack_request,
    summaries_query,
)
from slurmtel.agent.server import AgentHttpServer
from slurmtel.agent.spool import Spool
from slurmtel.records import GpuEvent
from tests.test_agent_protocol import INVENTORY, SUMMARY

AT = datetime(2026, 12, 2, 14, 0, 30, tzinfo=UTC)


class Agent:
    def __init__(self, tmp_path: Path, token: str = "") -> None:
        self.spool = Spool(tmp_path / "spool.sqlite")
        self.metrics = AgentMetrics()
        self.metrics.watch_spool(self.spool)
        self.server = AgentHttpServer(self.spool, self.metrics, "gpu01", "0.1.0", "127.0.0.1", 0, token)
        self.server.start()
        host, port = self.server.address
        self.base = f"http://{host}:{port}"

    def request(
        self, path: str, body: bytes | None = None, headers: dict[str, str] | None = None
    ) -> tuple[int, bytes, str]:
        req = urllib.request.Request(self.base + path, data=body, headers=headers or {})
        try:
            with urllib.request.urlopen(req, timeout=30) as response:
                return response.status, response.read(), response.headers.get("Content-Type", "")
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read(), exc.headers.get("Content-Type", "")

    def close(self) -> None:
        self.server.stop()
        self.spool.close()


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[Agent]:
    running = Agent(tmp_path)
    yield running
    running.close()


def test_paging_ack_and_idempotent_pulls(agent: Agent) -> None:
    records: list[AgentRecord] = [INVENTORY]
    records += [replace(SUMMARY, window_start_at=AT.replace(second=s)) for s in range(5)]
    records.append(GpuEvent("gpu01", SUMMARY.gpu_uuid, AT, "xid", 79))
    agent.spool.append_records(records)

    status, raw, content_type = agent.request(summaries_query(0, 3))
    assert (status, content_type) == (200, "application/json")
    first = decode_summaries_response(raw)
    assert [i.seq for i in first.items] == [1, 2, 3]
    assert first.items[0].record == INVENTORY
    assert first.items[1].record == records[1]
    assert (first.next_cursor, first.spool_items, first.evicted_total) == (3, 7, 0)

    # a retry of the same pull (the head crashed before storing) gets the same items
    assert decode_summaries_response(agent.request(summaries_query(0, 3))[1]).items == first.items

    second = decode_summaries_response(agent.request(summaries_query(first.next_cursor, 3))[1])
    assert [i.seq for i in second.items] == [4, 5, 6]

    status, raw, _ = agent.request("/v1/ack", encode_ack_request(first.next_cursor))
    assert status == 200
    assert decode_ack_response(raw).acked_cursor == 3
    assert decode_ack_response(raw).spool_items == 4
    # acked items are gone, even for a head that asks from the start again
    again = decode_summaries_response(agent.request(summaries_query(0, 100))[1])
    assert [i.seq for i in again.items] == [4, 5, 6, 7]
    assert again.events == [records[-1]]
    # the same ack twice, and an ack beyond the end (clamped)
    assert decode_ack_response(agent.request("/v1/ack", encode_ack_request(3))[1]).acked_cursor == 3
    assert decode_ack_response(agent.request("/v1/ack", encode_ack_request(500))[1]).acked_cursor == 7
    empty = decode_summaries_response(agent.request(summaries_query(7, 100))[1])
    assert (empty.items, empty.next_cursor, empty.spool_items, empty.spool_bytes) == ((), 7, 0, 0)


def test_metrics_parse(agent: Agent) -> None:
    agent.spool.append_records([INVENTORY, SUMMARY])
    agent.metrics.samples.inc(8)
    agent.metrics.nvml_errors.labels(call="nvmlDeviceGetPowerUsage", error="GpuIsLost").inc()
    agent.request(summaries_query(0))
    status, raw, content_type = agent.request("/metrics")
    assert status == 200
    assert content_type.startswith("text/plain")
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(raw.decode())
        for s in family.samples
    }
    assert samples[("slurmtel_agent_samples_total", ())] == 8.0
    assert samples[("slurmtel_agent_spool_items", ())] == 2.0
    assert samples[("slurmtel_agent_spool_evicted_total", ())] == 0.0
    assert samples[("slurmtel_agent_spool_last_seq", ())] == 2.0
    assert samples[("slurmtel_agent_spool_bytes", ())] == float(agent.spool.stats().bytes)
    assert (
        samples[
            (
                "slurmtel_agent_nvml_errors_total",
                (("call", "nvmlDeviceGetPowerUsage"), ("error", "GpuIsLost")),
            )
        ]
        == 1.0
    )
    assert (
        samples[
            (
                "slurmtel_agent_http_requests_total",
                (("code", "200"), ("method", "GET"), ("path", "/v1/summaries")),
            )
        ]
        == 1.0
    )


def test_bad_requests(agent: Agent) -> None:
    assert agent.request("/v1/summaries?after=x")[0] == 400
    assert agent.request("/v1/summaries?limit=0")[0] == 400
    assert agent.request("/nope")[0] == 404
    assert agent.request("/v1/ack", b'{"cursor": "3"}')[0] == 400
    assert agent.request("/v1/ack", b"x" * 5000)[0] == 413
    status, raw, _ = agent.request("/v1/ack", b"{}")
    assert status == 400
    assert "cursor" in json.loads(raw)["error"]
    assert agent.request("/healthz")[:2] == (200, b"ok\n")


def test_token_guards_the_data_endpoints(tmp_path: Path) -> None:
    agent = Agent(tmp_path, token="s3cret")
    try:
        agent.spool.append_records([SUMMARY])
        assert agent.request(summaries_query(0))[0] == 401
        assert agent.request("/v1/ack", encode_ack_request(1), {"Authorization": "Bearer wrong"})[0] == 401
        assert agent.spool.stats().items == 1
        status, raw, _ = agent.request(summaries_query(0), headers={"Authorization": "Bearer s3cret"})
        assert status == 200
        assert decode_summaries_response(raw).summaries == [SUMMARY]
        assert agent.request("/metrics")[0] == 200
    finally:
        agent.close()
