"""Every listener is bounded (DESIGN §8): the agent's and the daemon's (slurmtel.listen) and
`slurmtel serve`'s (slurmtel.api.limits, the real command in a process of its own). Slow clients
on loopback (bounded: tens of connections, a few seconds) are cut at the request deadline and
hold nothing; connections beyond the limits are answered 503 at once; a legitimate request is
answered meanwhile; what is refused is counted; accept() failures are logged once per interval.
The 2,000-connection figure is benchmarks/slowloris.py's."""

from __future__ import annotations

import asyncio
import configparser
import errno
import logging
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from slurmtel.agent.metrics import AgentMetrics
from slurmtel.agent.server import AgentHttpServer
from slurmtel.agent.spool import Spool
from slurmtel.api.limits import ApiLimits, ListenerState, loop_exception_handler
from slurmtel.config import AgentConfig, ApiConfig
from slurmtel.listen import RESERVED_FILES, EveryInterval, GatedHTTPServer, ListenLimits

ROOT = Path(__file__).resolve().parents[1]
TOKEN = "listener-test-token-0123456789"
# a request's deadline in these tests (the default is 10 s)
DEADLINE_SECONDS = 1.0


def trickle(port: int, source: str = "127.0.0.1", seconds: float = 6.0) -> tuple[float, bytes]:
    """A slowloris client: a request line, then one header line every 0.2 s, never the blank line
    that ends the head. Returns how long the server let it go on and what it answered."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=5, source_address=(source, 0))
    began = time.monotonic()
    answer = b""
    try:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: slow\r\n")
        sock.settimeout(0.2)
        while time.monotonic() - began < seconds:
            try:
                sock.sendall(b"X-Slow: 1\r\n")
            except OSError:
                break
            try:
                chunk = sock.recv(4096)
            except TimeoutError:
                continue
            except OSError:
                break
            if not chunk:
                break
            answer += chunk
    finally:
        sock.close()
    return time.monotonic() - began, answer


def get(port: int, path: str, source: str = "127.0.0.1", headers: dict[str, str] | None = None) -> int:
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10, source_address=(source, 0))
    try:
        conn.request("GET", path, headers=headers or {})
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


def counted(text: str, name: str, **labels: str) -> float:
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return sample.value
    return 0.0


# --- the agent (slurmtel.listen.GatedHTTPServer) ----------------------------------------------


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[AgentHttpServer]:
    spool = Spool(tmp_path / "spool.sqlite")
    metrics = AgentMetrics()
    limits = ListenLimits(
        max_connections=60, max_connections_per_address=40, request_timeout_seconds=DEADLINE_SECONDS
    )
    server = AgentHttpServer(spool, metrics, "gpu01", "0.1.0", "127.0.0.1", 0, token=TOKEN, limits=limits)
    server.start()
    yield server
    server.stop()
    spool.close()


def agent_metrics(server: AgentHttpServer) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{server.address[1]}/metrics", timeout=10) as r:
        return str(r.read().decode())


def test_agent_cuts_slow_clients_at_the_deadline_and_serves_others(agent: AgentHttpServer) -> None:
    port = agent.address[1]
    with ThreadPoolExecutor(30) as pool:
        slow = [pool.submit(trickle, port) for _ in range(30)]
        time.sleep(0.3)
        # while 30 clients trickle, a request of the head is answered at once
        began = time.monotonic()
        assert get(port, "/v1/summaries", headers={"Authorization": f"Bearer {TOKEN}"}) == 200
        assert time.monotonic() - began < 0.5
        results = [f.result() for f in slow]
    for held, answer in results:
        assert held < DEADLINE_SECONDS + 1.0, held
        assert answer.startswith(b"HTTP/1.1 408"), answer[:80]
    assert counted(agent_metrics(agent), "slurmtel_agent_http_refused_total", reason="timeout") == 30
    assert agent.open_connections <= 1


def test_agent_connections_beyond_the_limits_are_answered_503(agent: AgentHttpServer) -> None:
    port = agent.address[1]
    idle = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(40)]
    try:
        time.sleep(0.2)
        # a 41st connection from the same address: 503 at once, without a request
        extra = socket.create_connection(("127.0.0.1", port), timeout=5)
        assert extra.recv(4096).startswith(b"HTTP/1.1 503")
        extra.close()
        # another address is served
        assert get(port, "/healthz", source="127.0.0.2") == 200
        # 40 + 20 = max_connections: then every address is refused
        others = [
            socket.create_connection(("127.0.0.1", port), timeout=5, source_address=("127.0.0.3", 0))
            for _ in range(20)
        ]
        time.sleep(0.2)
        assert get(port, "/healthz", source="127.0.0.4") == 503
        for sock in others:
            sock.close()
    finally:
        for sock in idle:
            sock.close()
    time.sleep(0.3)
    text = agent_metrics(agent)
    assert counted(text, "slurmtel_agent_http_refused_total", reason="address") == 1
    assert counted(text, "slurmtel_agent_http_refused_total", reason="connections") == 1


def test_agent_refuses_heads_and_bodies_too_large(agent: AgentHttpServer) -> None:
    port = agent.address[1]
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nX-Big: " + b"a" * 70000 + b"\r\n\r\n")
        assert sock.recv(4096).startswith(b"HTTP/1.1 431")
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(b"POST /v1/ack HTTP/1.1\r\nContent-Length: 99999999\r\n\r\n")
        assert sock.recv(4096).startswith(b"HTTP/1.1 413")
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(b"POST /v1/ack HTTP/1.1\r\nContent-Length: 4\r\nContent-Length: 5\r\n\r\nabcd")
        assert sock.recv(4096).startswith(b"HTTP/1.1 400")


def test_accept_errors_are_logged_once_per_interval(caplog: pytest.LogCaptureFixture) -> None:
    """Out of file descriptors, accept() fails again and again: one line per interval with the
    count, never a traceback per attempt (the red team saw 31,965 in 20 s)."""
    from http.server import BaseHTTPRequestHandler

    refused: list[str] = []
    server = GatedHTTPServer(("127.0.0.1", 0), BaseHTTPRequestHandler, on_refused=refused.append, name="t")

    class Exhausted:
        def accept(self) -> None:
            raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))

        def close(self) -> None:
            pass

    listening, server.socket = server.socket, Exhausted()  # type: ignore[assignment]
    try:
        with caplog.at_level(logging.WARNING):
            for _ in range(10):
                server._handle_request_noblock()
    finally:
        server.socket = listening
        server.server_close()
    lines = [r for r in caplog.records if "cannot accept" in r.getMessage()]
    assert len(lines) == 1 and lines[0].exc_info is None
    assert refused.count("accept_error") == 10


def test_every_interval_counts_what_it_held_back() -> None:
    now = [0.0]
    limiter = EveryInterval(60.0, clock=lambda: now[0])
    assert limiter("a") == 0
    assert limiter("a") is None and limiter("a") is None
    assert limiter("b") == 0
    now[0] = 61.0
    assert limiter("a") == 2


# --- the units ------------------------------------------------------------------------------


@pytest.mark.parametrize("unit", ["slurmtel-serve.service", "slurmtel-agent.service", "slurmtel.service"])
def test_units_give_the_listeners_their_files(unit: str) -> None:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.read(ROOT / "systemd" / unit)
    limit = int(parser["Service"]["LimitNOFILE"])
    needed = max(ApiConfig().max_connections, AgentConfig().max_connections, ListenLimits().max_connections)
    assert limit >= needed + RESERVED_FILES


# --- slurmtel serve (uvicorn with slurmtel.api.limits) --------------------------------------


@pytest.fixture
def serve(tmp_path: Path, database_url: str, engine: object) -> Iterator[int]:
    """`slurmtel serve` in a process of its own with small limits."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    config = tmp_path / "slurmtel.toml"
    config.write_text(
        f'[site]\nstate_dir = "{tmp_path}"\n[database]\nurl = "{database_url}"\n'
        f"[api]\nport = {port}\nrequest_timeout_seconds = {DEADLINE_SECONDS}\n"
        "max_connections = 60\nmax_connections_per_address = 40\n"
    )
    log = (tmp_path / "serve.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "slurmtel", "--config", str(config), "serve"],
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=ROOT,
    )
    try:
        for _ in range(300):
            try:
                if get(port, "/healthz") == 200:
                    break
            except OSError:
                time.sleep(0.1)
        else:
            raise AssertionError((tmp_path / "serve.log").read_text())
        yield port
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()
        output = (tmp_path / "serve.log").read_text()
        assert "Traceback" not in output, output[-3000:]


def serve_metrics(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        return str(r.read().decode())


def test_serve_cuts_slow_clients_at_the_deadline_and_serves_others(serve: int) -> None:
    with ThreadPoolExecutor(30) as pool:
        slow = [pool.submit(trickle, serve) for _ in range(30)]
        time.sleep(0.3)
        began = time.monotonic()
        assert get(serve, "/v1/openapi.json", source="127.0.0.2") == 200
        assert time.monotonic() - began < 0.5
        results = [f.result() for f in slow]
    for held, answer in results:
        assert held < DEADLINE_SECONDS + 1.0, held
        assert answer.startswith(b"HTTP/1.1 408"), answer[:80]
    text = serve_metrics(serve)
    assert counted(text, "slurmtel_api_refused_total", reason="timeout") == 30
    # a client that connects and sends nothing is cut too
    with socket.create_connection(("127.0.0.1", serve), timeout=5) as sock:
        began = time.monotonic()
        assert sock.recv(4096).startswith(b"HTTP/1.1 408")
        assert time.monotonic() - began < DEADLINE_SECONDS + 1.0


def test_serve_connections_beyond_the_limits_are_answered_503(serve: int) -> None:
    idle = [socket.create_connection(("127.0.0.1", serve), timeout=5) for _ in range(40)]
    try:
        time.sleep(0.2)
        extra = socket.create_connection(("127.0.0.1", serve), timeout=5)
        assert extra.recv(4096).startswith(b"HTTP/1.1 503")
        extra.close()
        assert get(serve, "/healthz", source="127.0.0.2") == 200
    finally:
        for sock in idle:
            sock.close()
    assert counted(serve_metrics(serve), "slurmtel_api_refused_total", reason="address") == 1


def test_serve_loop_errors_are_one_line_per_interval(caplog: pytest.LogCaptureFixture) -> None:
    state = ListenerState(ApiLimits())
    handle = loop_exception_handler(state)
    loop = asyncio.new_event_loop()
    try:
        with caplog.at_level(logging.WARNING):
            for _ in range(1000):
                handle(
                    loop,
                    {
                        "message": "socket.accept() out of system resource",
                        "exception": OSError(errno.EMFILE, os.strerror(errno.EMFILE)),
                    },
                )
    finally:
        loop.close()
    lines = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(lines) == 1 and lines[0].exc_info is None
    assert "Too many open files" in lines[0].getMessage()
    assert state.refused["accept_error"] == 1000


def test_the_gate_answers_503_when_every_worker_is_busy_and_the_queue_full() -> None:
    """Complete requests wait for one of the workers; beyond max_queued waiting, 503 at once."""
    from slurmtel.listen import GatedRequestHandler

    release = threading.Event()

    class Slow(GatedRequestHandler):
        def do_GET(self) -> None:
            release.wait(10)
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: object) -> None:
            pass

    refused: list[str] = []
    server = GatedHTTPServer(
        ("127.0.0.1", 0), Slow, ListenLimits(workers=1, max_queued=1), on_refused=refused.append
    )
    serving = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    serving.start()
    port = server.server_address[1]
    try:
        socks = []
        for _ in range(2):  # one in the worker, one waiting
            sock = socket.create_connection(("127.0.0.1", port), timeout=5)
            sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            socks.append(sock)
            time.sleep(0.2)
        third = socket.create_connection(("127.0.0.1", port), timeout=5)
        third.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        assert third.recv(4096).startswith(b"HTTP/1.1 503")
        third.close()
        release.set()
        for sock in socks:
            assert sock.recv(4096).startswith(b"HTTP/1.0 200")
            sock.close()
        assert refused.count("busy") == 1
    finally:
        release.set()
        server.shutdown()
        server.server_close()


def test_serve_answers_503_beyond_its_requests_in_flight() -> None:
    """api.max_requests_in_flight: one more request is answered 503 "busy" at once (counted);
    /healthz and /metrics are answered whatever the load."""
    from slurmtel.api.limits import InFlightLimit

    state = ListenerState(ApiLimits(max_requests_in_flight=1))
    entered, release = asyncio.Event(), asyncio.Event()

    async def app(scope: dict[str, object], receive: object, send: object) -> None:
        entered.set()
        await release.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})  # type: ignore[operator]
        await send({"type": "http.response.body", "body": b"ok"})  # type: ignore[operator]

    limited = InFlightLimit(app, state)

    async def request(path: str) -> int:
        sent: list[dict[str, object]] = []

        async def send(message: dict[str, object]) -> None:
            sent.append(message)

        await limited({"type": "http", "path": path}, None, send)
        return int(sent[0]["status"])  # type: ignore[call-overload]

    async def scenario() -> tuple[int, int, int]:
        first = asyncio.create_task(request("/v1/me"))
        await entered.wait()
        second = await request("/v1/reports/usage")
        release.set()
        health = await request("/healthz")
        return await first, second, health

    assert asyncio.run(scenario()) == (200, 503, 200)
    assert state.refused["busy"] == 1 and state.in_flight == 0
