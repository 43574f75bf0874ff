"""The agent's HTTP server, started for real on 127.0.0.1 (port 0) in a thread."""

from __future__ import annotations

import json
import socket
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


TOKEN = "s3cret-token-for-tests"


class Agent:
    def __init__(self, tmp_path: Path, token: str = TOKEN) -> None:
        self.spool = Spool(tmp_path / "spool.sqlite")
        self.metrics = AgentMetrics()
        self.metrics.watch_spool(self.spool)
        self.server = AgentHttpServer(self.spool, self.metrics, "gpu01", "0.1.0", "127.0.0.1", 0, token=token)
        self.token = token
        self.server.start()
        host, port = self.server.address
        self.base = f"http://{host}:{port}"

    def request(
        self, path: str, body: bytes | None = None, headers: dict[str, str] | None = None
    ) -> tuple[int, bytes, str]:
        """PATH with the agent's token on /v1/* unless HEADERS says otherwise."""
        if headers is None and path.startswith("/v1/"):
            headers = {"Authorization": f"Bearer {self.token}"}
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
    # the same ack twice, and an ack beyond the end (clamped to the last cursor served, 7)
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
    agent = Agent(tmp_path, token="s3cret-token-0123456789")
    try:
        agent.spool.append_records([SUMMARY])
        for headers in (
            {},
            {"Authorization": "Bearer wrong"},
            {"Authorization": "Bearer s3cret-token-012345678"},  # a prefix
            {"Authorization": "bearer s3cret-token-0123456789"},
            {"Authorization": "s3cret-token-0123456789"},
        ):
            assert agent.request(summaries_query(0), headers=headers)[0] == 401, headers
            assert agent.request("/v1/ack", encode_ack_request(1), headers)[0] == 401, headers
        assert agent.spool.stats().items == 1
        status, raw, _ = agent.request(
            summaries_query(0), headers={"Authorization": "Bearer s3cret-token-0123456789"}
        )
        assert status == 200
        assert decode_summaries_response(raw).summaries == [SUMMARY]
        assert agent.request("/metrics", headers={})[0] == 200
        assert agent.request("/healthz", headers={})[0] == 200
    finally:
        agent.close()


def test_two_authorization_headers_are_refused(tmp_path: Path) -> None:
    agent = Agent(tmp_path)
    try:
        host, port = agent.server.address
        with socket.create_connection((host, port), timeout=30) as conn:
            conn.sendall(
                f"GET /v1/summaries HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n"
                f"Authorization: Bearer {TOKEN}\r\nConnection: close\r\n\r\n".encode()
            )
            assert conn.recv(100).startswith(b"HTTP/1.1 401")
    finally:
        agent.close()


def test_the_server_refuses_to_start_without_a_token(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "spool.sqlite")
    try:
        for token in ("", " padded "):
            with pytest.raises(ValueError, match="only with a token"):
                AgentHttpServer(spool, AgentMetrics(), "gpu01", "0.1.0", "127.0.0.1", 0, token=token)
    finally:
        spool.close()


def test_an_ack_never_drops_what_was_not_served(agent: Agent) -> None:
    """POST /v1/ack with a cursor far ahead (a confused or hostile head): clamped to the last
    cursor served, logged and counted; the items never served stay for the next pull."""
    records = [replace(SUMMARY, window_start_at=AT.replace(second=s)) for s in range(10)]
    agent.spool.append_records(records)
    # nothing served yet: an ack drops nothing
    status, raw, _ = agent.request("/v1/ack", encode_ack_request(10**12))
    assert status == 200 and decode_ack_response(raw).acked_cursor == 0
    assert agent.spool.stats().items == 10
    page = decode_summaries_response(agent.request(summaries_query(0, 4))[1])
    assert page.next_cursor == 4
    # more is written after that page went out: still unserved
    agent.spool.append_records([replace(SUMMARY, window_start_at=AT.replace(minute=1))])
    assert decode_ack_response(agent.request("/v1/ack", encode_ack_request(11))[1]).acked_cursor == 4
    assert [i.seq for i in agent.spool.read(0, 100)] == list(range(5, 12))
    # a page that jumps ahead of what was served serves nothing in between
    jumped = decode_summaries_response(agent.request(summaries_query(9, 100))[1])
    assert [i.seq for i in jumped.items] == [10, 11]
    assert decode_ack_response(agent.request("/v1/ack", encode_ack_request(11))[1]).acked_cursor == 4
    assert agent.spool.stats().items == 7
    # and "after" beyond the end marks nothing served
    agent.request(summaries_query(10**9, 100))
    assert agent.spool.stats().served_cursor == 4
    # reading on from the served mark serves the rest; then the ack takes it all
    rest = decode_summaries_response(agent.request(summaries_query(4, 100))[1])
    assert [i.seq for i in rest.items] == list(range(5, 12))
    assert decode_ack_response(agent.request("/v1/ack", encode_ack_request(10**12))[1]).acked_cursor == 11
    assert agent.spool.stats().items == 0
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(agent.request("/metrics")[1].decode())
        for s in family.samples
    }
    assert samples[("slurmtel_agent_acks_clamped_total", ())] == 4.0
    assert samples[("slurmtel_agent_spool_served_cursor", ())] == 11.0


def test_metrics_carry_no_user_account_or_job(agent: Agent) -> None:
    """/metrics is open (Prometheus scrapes it without a token): only the agent's own counts.
    Every label of every family, after traffic of every kind, is one of these."""
    agent.spool.append_records([INVENTORY, SUMMARY, GpuEvent("gpu01", SUMMARY.gpu_uuid, AT, "xid", 79)])
    agent.metrics.events.labels(kind="xid").inc()
    agent.metrics.dropped_samples.labels(reason="out_of_order").inc()
    agent.metrics.nvml_errors.labels(call="nvmlDeviceGetPowerUsage", error="GpuIsLost").inc()
    agent.request(summaries_query(0))
    agent.request("/v1/ack", encode_ack_request(1))
    agent.request("/v1/summaries?user=alice&job=4242")
    agent.request("/alice/4242")
    body = agent.request("/metrics")[1].decode()
    labels = {
        (key, value)
        for family in text_string_to_metric_families(body)
        for s in family.samples
        for key, value in s.labels.items()
    }
    assert {k for k, _ in labels} <= {"method", "path", "code", "reason", "call", "error", "kind"}
    paths = {v for k, v in labels if k == "path"}
    assert paths <= {"/v1/summaries", "/v1/ack", "/metrics", "/healthz", "other"}
    assert not {v for _, v in labels} & {"4242", "123", "124", "alice"}
    # sample values are left out: a _created timestamp may hold any digits, "4242" too
    names_and_labels = "\n".join(
        line if line.startswith("#") else line.rsplit(" ", 1)[0] for line in body.splitlines()
    )
    for private in ("alice", "4242", SUMMARY.gpu_uuid):
        assert private not in names_and_labels
