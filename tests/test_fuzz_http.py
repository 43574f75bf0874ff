"""The HTTP side of the fuzz campaign (issue 25): hypothesis-generated requests to the read API
and to the node agent, in-process on loopback, and slow clients.

- the API as `slurmtel serve` builds it (uvicorn with slurmtel.api.limits, the reader role under
  row security, an admin through a trusted proxy's header): generated paths, parameter names,
  values (any character, percent-encoded or raw bytes, huge numbers, repeated parameters) and
  methods; every answer below 500 with a reason, no traceback logged;
- the agent (slurmtel.listen's gated server): generated /v1/summaries queries and /v1/ack bodies
  (any JSON value, any bytes), paths and headers; every answer below 500, none of its handlers
  failing (slurmtel_agent_http_refused_total{reason="handler_error"} stays 0);
- a slow client per server, trickling a generated request head slower than the deadline: cut
  with 408, and a request beside it answered.

Bounded and deterministic (derandomize, 120 examples each, loopback only): about 10-20 s here.
The table-driven sweep of every endpoint and parameter is tests/test_api_hostile.py.
"""

from __future__ import annotations

import http.client
import json
import logging
import socket
import threading
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import Engine

from slurmtel.agent.metrics import AgentMetrics
from slurmtel.agent.server import AgentHttpServer
from slurmtel.agent.spool import Spool
from slurmtel.api.app import ReadApi, build_app
from slurmtel.api.limits import ApiLimits, ListenerState
from slurmtel.auth import proxy
from slurmtel.auth.identity import AuthSettings
from slurmtel.config import AccessConfig, config_from_dict
from slurmtel.listen import ListenLimits
from slurmtel.reports.catalog import REPORTS
from slurmtel.store.rls import scope_sessions_to_everything
from tests.conftest import LoginRoles
from tests.factories import at, load_admin_day
from tests.test_api_hostile import Server

pytestmark = pytest.mark.fuzz

NOW = at("2026-11-02T06:00:00")
TOKEN = "fuzz-http-token-0123456789"
HTTP = settings(
    max_examples=120,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)

ANY_TEXT = st.text(st.characters(codec=None, categories=["L", "M", "N", "P", "S", "Z", "C"]), max_size=60)
NUMBERS = st.sampled_from(
    ["0", "-1", "1", "9223372036854775808", "9" * 300, "1e999", "NaN", "0x10", "١٢"]
).map(lambda n: urllib.parse.quote(n, safe="-"))
VALUES = st.one_of(
    ANY_TEXT.map(lambda t: urllib.parse.quote(t.encode("utf-8", "surrogatepass"), safe="")), NUMBERS
)
RAW_BYTES = st.binary(max_size=40).map(lambda b: urllib.parse.quote(b, safe=""))
REPORT_PARAMS = sorted(
    {
        "start",
        "end",
        "accounts",
        "users",
        "partitions",
        "clusters",
        *(p.name for s in REPORTS.values() for p in s.parameters),
    }
)
PARAM_NAMES = st.one_of(
    st.sampled_from([*REPORT_PARAMS, "user", "month", "jobs", "top", "format"]),
    ANY_TEXT.map(urllib.parse.quote),
)


@st.composite
def api_requests(draw: st.DrawFn) -> tuple[str, str]:
    path = draw(
        st.one_of(
            st.sampled_from(
                [f"/v1/reports/{n}" for n in REPORTS] + ["/v1/me", "/v1/whoami", "/v1/jobs/1001"]
            ),
            st.builds(lambda v: f"/v1/jobs/{v}", st.one_of(VALUES, RAW_BYTES)),
            st.builds(lambda v: f"/v1/jobs/1001/plot.{v}", VALUES),
            st.builds(lambda v: f"/v1/chargeback/{v}", VALUES),
            st.builds(lambda v: f"/v1/reports/{v}", VALUES),
        )
    )
    # often none: a good request now and then keeps the sweep going past the refusals
    params = draw(
        st.one_of(st.just([]), st.lists(st.tuples(PARAM_NAMES, st.one_of(VALUES, RAW_BYTES)), max_size=6))
    )
    method = draw(st.sampled_from(["GET", "GET", "GET", "POST", "PUT", "DELETE", "HEAD"]))
    query = "&".join(f"{k}={v}" for k, v in params)
    return method, f"{path}?{query}" if query else path


@pytest.fixture
def api(engine: Engine, login_roles: LoginRoles) -> Iterator[Server]:
    config = config_from_dict(
        {
            "site": {"timezone": "UTC", "clock": NOW.isoformat()},
            "api": {"auth_methods": ["proxy"], "trusted_proxies": ["127.0.0.1/32"]},
        }
    )
    load_admin_day(engine, config)
    reader = login_roles.reader_engine()
    statements = scope_sessions_to_everything(login_roles.reader_engine())
    settings_ = AuthSettings(
        methods=("proxy",),
        access=AccessConfig(admins=["root"], finance=[]),
        trusted_proxies=proxy.parse_networks(["127.0.0.1/32"]),
    )
    limits = ApiLimits(request_timeout_seconds=1.0)
    app = build_app(ReadApi(config, reader, settings_, lambda: NOW, statements), ListenerState(limits))
    with Server(app) as server:
        yield server
    reader.dispose()
    statements.dispose()


def _reason(body: bytes) -> str:
    try:
        return str(json.loads(body)["error"])
    except (ValueError, KeyError, TypeError):
        return body.decode("utf-8", "replace")


def test_generated_requests_to_the_api_are_never_a_5xx(api: Server, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    statuses: list[int] = []

    @HTTP
    @given(request=api_requests())
    def check(request: tuple[str, str]) -> None:
        method, target = request
        status, body = api.send(method, target)
        statuses.append(status)
        assert status < 500, (method, target[:300], status, body[:300])
        if status >= 400 and method != "HEAD":
            assert _reason(body).strip(), (method, target[:300], status)

    check()
    tracebacks = [r.getMessage()[:200] for r in caplog.records if r.exc_info is not None]
    assert not tracebacks, tracebacks[:5]
    # the sweep reached the reports, not only the refusals
    assert statuses.count(200) >= 3, sorted(statuses)


# --- the agent ---------------------------------------------------------------------------------

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | ANY_TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(ANY_TEXT, inner, max_size=4),
    max_leaves=20,
)


@st.composite
def agent_requests(draw: st.DrawFn) -> tuple[str, str, bytes, dict[str, str]]:
    kind = draw(st.sampled_from(["summaries", "ack", "other"]))
    headers = {"Authorization": f"Bearer {TOKEN}"} if draw(st.booleans()) else {}
    if draw(st.booleans()):
        headers[draw(st.sampled_from(["Authorization", "X-Any", "Content-Type"]))] = draw(
            st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=40)
        )
    if kind == "summaries":
        params = draw(
            st.lists(
                st.tuples(st.sampled_from(["after", "limit", "kinds", "x"]), st.one_of(VALUES, RAW_BYTES)),
                max_size=4,
            )
        )
        query = "&".join(f"{k}={v}" for k, v in params)
        return "GET", "/v1/summaries" + (f"?{query}" if query else ""), b"", headers
    if kind == "ack":
        body = draw(
            st.one_of(
                st.builds(lambda v: json.dumps({"cursor": v}).encode(), JSON_VALUES),
                JSON_VALUES.map(lambda v: json.dumps(v).encode()),
                st.binary(max_size=200),
            )
        )
        return "POST", "/v1/ack", body, headers
    return (
        draw(st.sampled_from(["GET", "POST", "PUT"])),
        "/" + draw(RAW_BYTES),
        draw(st.binary(max_size=50)),
        headers,
    )


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[AgentHttpServer]:
    spool = Spool(tmp_path / "spool.sqlite")
    spool.append([("summary", '{"x": 1}')] * 5)
    limits = ListenLimits(request_timeout_seconds=1.0)
    server = AgentHttpServer(
        spool, AgentMetrics(), "gpu01", "0.1.0", "127.0.0.1", 0, token=TOKEN, limits=limits
    )
    server.start()
    yield server
    server.stop()
    spool.close()


def _agent_send(
    port: int, method: str, target: str, body: bytes, headers: dict[str, str]
) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.putrequest(method, target, skip_accept_encoding=True)
        for name, value in headers.items():
            conn.putheader(name, value)
        conn.putheader("Content-Length", str(len(body)))
        conn.endheaders(body)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def _refused(port: int, reason: str) -> float:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    conn.close()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "slurmtel_agent_http_refused_total" and sample.labels.get("reason") == reason:
                return float(sample.value)
    return 0.0


def test_generated_requests_to_the_agent_are_never_a_5xx(agent: AgentHttpServer) -> None:
    port = agent.address[1]

    @HTTP
    @given(request=agent_requests())
    def check(request: tuple[str, str, bytes, dict[str, str]]) -> None:
        method, target, body, headers = request
        status, answer = _agent_send(port, method, target, body, headers)
        assert status < 500, (method, target[:200], body[:100], status, answer[:200])

    check()
    assert _refused(port, "handler_error") == 0


# --- slow clients ------------------------------------------------------------------------------


def _trickle(port: int, head: bytes, pause: float) -> tuple[float, bytes]:
    """HEAD sent a byte at a time with PAUSE between, never ended: how long the server let it go
    on, and what it answered."""
    began = time.monotonic()
    answer = b""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.settimeout(pause)
        for byte in head:
            try:
                sock.sendall(bytes([byte]))
                chunk = sock.recv(4096)
            except TimeoutError:
                continue
            except OSError:
                break
            if not chunk:
                break
            answer += chunk
            break
    return time.monotonic() - began, answer


@settings(
    max_examples=4,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    head=st.binary(min_size=40, max_size=80).map(
        lambda b: b"GET /v1/" + b.replace(b"\r", b"").replace(b"\n", b"")
    )
)
def test_a_slow_client_is_cut_and_holds_nothing(agent: AgentHttpServer, head: bytes) -> None:
    """A generated request head trickled a byte every 0.1 s (8 s for 80 bytes; the deadline is
    1 s): answered 408 within the deadline; a request beside it is answered at once."""
    port = agent.address[1]
    results: list[tuple[float, bytes]] = []
    slow = threading.Thread(target=lambda: results.append(_trickle(port, head, 0.1)))
    slow.start()
    time.sleep(0.2)
    assert _agent_send(port, "GET", "/healthz", b"", {})[0] == 200
    slow.join(timeout=10)
    held, answer = results[0]
    assert held < 2.0 and answer.startswith(b"HTTP/1.1 408"), (held, answer[:60])


def test_a_slow_client_of_the_api_is_cut_and_holds_nothing(api: Server) -> None:
    head = b"GET /v1/reports/usage?start=2026-11-01 HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 40
    results: list[tuple[float, bytes]] = []
    slow = threading.Thread(target=lambda: results.append(_trickle(api.port, head, 0.1)))
    slow.start()
    time.sleep(0.2)
    assert api.send("GET", "/v1/whoami")[0] == 200
    slow.join(timeout=10)
    held, answer = results[0]
    assert held < 2.0 and answer.startswith(b"HTTP/1.1 408"), (held, answer[:60])
