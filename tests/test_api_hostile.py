"""Every bad parameter is a 4xx with its reason, never a 5xx or a traceback (DESIGN §8).

The read API runs as `slurmtel serve` builds it (uvicorn with slurmtel.api.limits, the reader
role, row-level security), the caller an admin (a trusted proxy's header: no MUNGE cost per
request, and the deepest code paths: every report, every scope). Every endpoint x every
parameter it takes (and one it does not) x a table of hostile values: NUL, control characters,
bytes that are not UTF-8, numbers beyond every column, 60 KB and 100 KB strings, an array where
a scalar is expected. Each answer must be below 500, carry a reason, and nothing may log a
traceback. Bounded: about 2,000 requests on loopback, 10-20 s. The hypothesis-driven sweep of the
same endpoints and of the agent's is tests/test_fuzz_http.py."""

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
import uvicorn
from sqlalchemy import Engine, create_engine

from slurmtel.agent.metrics import AgentMetrics
from slurmtel.agent.protocol import ACK_PATH, SUMMARIES_PATH
from slurmtel.agent.server import AgentHttpServer
from slurmtel.agent.spool import Spool
from slurmtel.api.app import ReadApi, build_app
from slurmtel.api.limits import ApiLimits, ListenerState, uvicorn_options
from slurmtel.auth import proxy
from slurmtel.auth.identity import AuthSettings
from slurmtel.config import AccessConfig, config_from_dict
from slurmtel.reports.catalog import REPORTS
from slurmtel.store.rls import scope_sessions_to_everything
from tests.conftest import LoginRoles
from tests.factories import at, load_admin_day

NOW = at("2026-11-02T06:00:00")
AGENT_TOKEN = "hostile-sweep-token-0123456789"

# (name, the value as it goes into a query string or a path: already percent-encoded)
HOSTILE = [
    ("nul", "%00"),
    ("nul_inside", "ab%00cd"),
    ("control", "%1b%5b31m%0d%0aX-Injected:%201"),
    ("not_utf8", "%ff%fe"),
    ("surrogate", "%ed%a0%80"),
    ("huge_int", "9223372036854775808"),
    ("huge_negative", "-9223372036854775809"),
    ("huge_digits", "9" * 400),
    ("float_inf", "1e999"),
    ("nan", "NaN"),
    ("negative", "-1"),
    ("zero", "0"),
    ("empty", ""),
    ("commas", "," * 5000),
    ("many_names", ",".join(f"u{i}" for i in range(3000))),
    ("quote", urllib.parse.quote("' OR 1=1 --")),
    ("percent", "%"),
    ("unicode", urllib.parse.quote("名前✓")),
    ("long_60kb", "a" * 60_000),
    ("long_100kb", "a" * 100_000),
]


class Server:
    def __init__(self, app: object) -> None:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        state: ListenerState = app.state.listener  # type: ignore[attr-defined]
        self.server = uvicorn.Server(
            uvicorn.Config(
                app,  # type: ignore[arg-type]
                host="127.0.0.1",
                port=self.port,
                log_config=None,
                proxy_headers=False,
                **uvicorn_options(state),
            )
        )
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> Server:
        self.thread.start()
        for _ in range(600):
            if self.server.started:
                return self
            time.sleep(0.05)
        raise AssertionError("uvicorn did not start")

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)

    def send(self, method: str, target: str) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        try:
            # the target as given: percent escapes, NUL escapes and all, never re-encoded
            conn.putrequest(method, target, skip_accept_encoding=True)
            conn.putheader("X-Remote-User", "root")
            conn.endheaders()
            response = conn.getresponse()
            return response.status, response.read()
        finally:
            conn.close()


def _serve(engine: Engine, login_roles: LoginRoles, *, pages: bool) -> Iterator[Server]:
    """The read API on the admin day as `slurmtel serve` builds it, with the pages
    (slurmtel.pages) beside it when PAGES."""
    from slurmtel.pages.app import Pages

    config = config_from_dict(
        {
            "site": {"timezone": "UTC", "clock": NOW.isoformat()},
            "api": {"auth_methods": ["proxy"], "trusted_proxies": ["127.0.0.1/32"]},
        }
    )
    load_admin_day(engine, config)
    reader = login_roles.reader_engine()
    statements = scope_sessions_to_everything(create_engine(login_roles.url(login_roles.writer)))
    settings = AuthSettings(
        methods=("proxy",),
        access=AccessConfig(admins=["root"], finance=[]),
        trusted_proxies=proxy.parse_networks(["127.0.0.1/32"]),
    )
    api = ReadApi(config, reader, settings, lambda: NOW, statements)
    routes = Pages(api).routes() if pages else ()
    with Server(build_app(api, ListenerState(ApiLimits()), pages=routes)) as server:
        yield server
    reader.dispose()
    statements.dispose()


@pytest.fixture
def served(engine: Engine, login_roles: LoginRoles) -> Iterator[Server]:
    yield from _serve(engine, login_roles, pages=False)


@pytest.fixture
def served_pages(engine: Engine, login_roles: LoginRoles) -> Iterator[Server]:
    """The pages beside the API, as `slurmtel serve` routes them."""
    yield from _serve(engine, login_roles, pages=True)


def page_endpoints() -> list[tuple[str, str, str, dict[str, str]]]:
    """Every page and parameter (path parameters as {}), and the timeline's points."""
    window = {"start": "2026-11-01T00:00:00", "end": "2026-11-02T00:00:00"}
    cases: list[tuple[str, str, str, dict[str, str]]] = [
        ("GET", "/jobs/{}", "", {}),
        ("GET", "/jobs/101/figures.{}", "", {}),
        ("GET", "/jobs/101/timeline.{}", "", {}),
        ("GET", "/v1/jobs/101/timeline", "points", {}),
        ("GET", "/me", "month", {}),
        ("GET", "/me", "user", {}),
        ("GET", "/reports/{}", "", {}),
        ("GET", "/finance/{}", "", {}),
        ("GET", "/finance/2026-10/statement.{}", "", {}),
        ("GET", "/finance/{}/statement.parquet", "", {}),
        ("POST", "/finance/{}/close", "", {}),
        ("POST", "/finance/{}/void", "", {}),
    ]
    for name in ("usage", "idle"):
        for param in ("start", "end", "accounts", "top", "by", "unknown"):
            others = {k: v for k, v in window.items() if k != param}
            cases.append(("GET", f"/reports/{name}", param, others))
    return cases


@pytest.mark.timeout(600)
def test_every_page_refuses_hostile_values_with_a_page_saying_why(
    served_pages: Server, caplog: pytest.LogCaptureFixture
) -> None:
    failures: list[str] = []
    sent = 0
    with caplog.at_level(logging.DEBUG):
        for method, path, param, others in page_endpoints():
            for label, value in HOSTILE:
                for target in targets(path, param, others, value):
                    status, body = served_pages.send(method, target)
                    sent += 1
                    where = f"{method} {path} {param or 'path'}={label}"
                    if status >= 500:
                        failures.append(f"{where}: {status} {body[:200]!r}")
                    elif status >= 400 and status not in (404, 405) and len(target) < 65_000:
                        text = body.decode("utf-8", "replace")
                        said = text.split('<p id="message">', 1)[-1] if "<html" in text else text
                        if not said.strip() or said.startswith("</p>"):
                            failures.append(f"{where}: {status} without a reason")
    tracebacks = [
        f"{r.name}: {r.getMessage()[:200]}"
        for r in caplog.records
        if r.exc_info is not None or "Traceback" in r.getMessage() or "(a bug)" in r.getMessage()
    ]
    assert sent > 1000
    assert not failures, f"{len(failures)} of {sent}:\n" + "\n".join(failures[:40])
    assert not tracebacks, "\n".join(tracebacks[:20])


def endpoints() -> list[tuple[str, str, str, dict[str, str]]]:
    """(method, path template, parameter, the other parameters' good values): every endpoint and
    parameter, a path parameter as {}."""
    window = {"start": "2026-11-01T00:00:00", "end": "2026-11-02T00:00:00"}
    cases: list[tuple[str, str, str, dict[str, str]]] = []
    for name, spec in REPORTS.items():
        params = ["start", "end", "accounts", "users", "partitions", "clusters", "unknown"]
        params += [p.name for p in spec.parameters]
        for param in params:
            others = {k: v for k, v in window.items() if k != param}
            cases.append(("GET", f"/v1/reports/{name}", param, others))
    cases.append(("GET", "/v1/reports/{}", "", {}))
    cases += [
        ("GET", "/v1/jobs/{}", "", {}),
        ("GET", "/v1/jobs/1001", "clusters", {}),
        ("GET", "/v1/jobs/1001/plot.{}", "", {}),
        ("GET", "/v1/jobs/1001/plot.png", "clusters", {}),
        ("GET", "/v1/me", "user", {}),
        ("GET", "/v1/me", "month", {}),
        ("GET", "/v1/me", "jobs", {}),
        ("GET", "/v1/me", "top", {}),
        ("GET", "/v1/chargeback/{}", "", {}),
        ("GET", "/v1/chargeback/2026-10", "format", {}),
        ("POST", "/v1/chargeback/{}/close", "", {}),
        ("GET", "/v1/whoami", "unknown", {}),
    ]
    return cases


def targets(path: str, param: str, others: dict[str, str], value: str) -> list[str]:
    """The request targets for VALUE in PARAM (or in the path's {}): once, and as an array."""
    if "{}" in path:
        return [path.replace("{}", value)]
    base = urllib.parse.urlencode(others)
    prefix = f"{path}?{base}&" if base else f"{path}?"
    return [f"{prefix}{param}={value}", f"{prefix}{param}={value}&{param}=1", f"{prefix}{param}[]={value}"]


@pytest.mark.timeout(600)
def test_every_endpoint_and_parameter_refuses_hostile_values_with_a_4xx(
    served: Server, caplog: pytest.LogCaptureFixture
) -> None:
    failures: list[str] = []
    sent = 0
    began = time.monotonic()
    with caplog.at_level(logging.DEBUG):
        for method, path, param, others in endpoints():
            for label, value in HOSTILE:
                for target in targets(path, param, others, value):
                    status, body = served.send(method, target)
                    sent += 1
                    where = f"{method} {path} {param or 'path'}={label}"
                    if status >= 500:
                        failures.append(f"{where}: {status} {body[:200]!r}")
                    elif status >= 400 and status != 404 and len(target) < 65_000:
                        # a reason the caller can read (h11 refuses a longer head before the app)
                        try:
                            reason = json.loads(body)["error"]
                        except (ValueError, KeyError, TypeError):
                            reason = body.decode("utf-8", "replace")
                        if not reason.strip():
                            failures.append(f"{where}: {status} without a reason")
    seconds = time.monotonic() - began
    tracebacks = [
        f"{r.name}: {r.getMessage()[:200]}"
        for r in caplog.records
        if r.exc_info is not None or "Traceback" in r.getMessage()
    ]
    # an access line keeps a bounded part of the target: 4,000 lines of 100 KB targets, each
    # formatted, were minutes of the server's time
    long_lines = [r for r in caplog.records if r.name == "uvicorn.access" and len(r.getMessage()) > 1000]
    assert not long_lines, long_lines[0].getMessage()[:300]
    print(f"{sent} hostile requests in {seconds:.1f} s")
    assert not failures, f"{len(failures)} of {sent}:\n" + "\n".join(failures[:40])
    assert not tracebacks, "\n".join(tracebacks[:20])


def test_a_head_h11_refuses_is_answered_and_drained_not_reset(served: Server) -> None:
    """A request head over h11's limit is answered 400 before it is all in. A server that then
    closes at once, with the rest of the request still arriving, makes the kernel answer that
    rest with a reset, which can throw away the 400 the client has not read yet (a client that
    sends its whole request before reading, as http.client does, saw "connection reset" at
    times). The server ends its side after the answer and reads and drops the rest until the
    client closes: the rest meets no reset."""
    with socket.create_connection(("127.0.0.1", served.port), timeout=30) as sock:
        # more than h11 holds of an unfinished head: refused once it is in
        sock.sendall(b"GET /v1/reports/usage?start=" + b"a" * 70_000)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
        assert answer.startswith(b"HTTP/1.1 400 "), answer[:200]
        assert b"Invalid HTTP request" in answer
        # the rest of the request, sent after the answer: read and dropped, not reset
        sock.sendall(b"a" * 30_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n")
        time.sleep(0.3)
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0


# --- the node agent's endpoints ------------------------------------------------------------


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[AgentHttpServer]:
    spool = Spool(tmp_path / "spool.sqlite")
    spool.append([("summary", '{"x": 1}')] * 3)
    server = AgentHttpServer(spool, AgentMetrics(), "gpu01", "0.1.0", "127.0.0.1", 0, token=AGENT_TOKEN)
    server.start()
    yield server
    server.stop()
    spool.close()


def agent_send(port: int, method: str, target: str, body: bytes = b"") -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.putrequest(method, target, skip_accept_encoding=True)
        conn.putheader("Authorization", f"Bearer {AGENT_TOKEN}")
        conn.putheader("Content-Length", str(len(body)))
        conn.endheaders(body)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def test_the_agent_refuses_hostile_parameters_and_bodies_with_a_4xx(
    agent: AgentHttpServer, caplog: pytest.LogCaptureFixture
) -> None:
    port = agent.address[1]
    failures = []
    sent = 0
    with caplog.at_level(logging.DEBUG):
        for param in ("after", "limit", "kinds", "unknown"):
            for label, value in HOSTILE:
                for target in targets(SUMMARIES_PATH, param, {}, value):
                    status, body = agent_send(port, "GET", target)
                    sent += 1
                    if status >= 500 or (status >= 400 and status != 431 and not json.loads(body)["error"]):
                        failures.append(f"{param}={label}: {status} {body[:200]!r}")
        bodies = [
            b'{"cursor": %s}' % v.encode()
            for v in ("9223372036854775808", "-1", "1e999", '"1"', "[]", "null", "9" * 5000)
        ]
        bodies += [b"\x00", b"\xff\xfe", b"[" * 3000, b'{"cursor": 1}' + b" " * 4000, b""]
        for body in bodies:
            status, answer = agent_send(port, "POST", ACK_PATH, body)
            sent += 1
            if status >= 500:
                failures.append(f"ack {body[:40]!r}: {status} {answer[:200]!r}")
    tracebacks = [r.getMessage()[:200] for r in caplog.records if r.exc_info is not None]
    assert not failures, f"{len(failures)} of {sent}:\n" + "\n".join(failures[:40])
    assert not tracebacks, tracebacks[:10]
