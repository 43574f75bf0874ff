"""The agent's HTTP server: the head pulls summaries and acks them; Prometheus scrapes /metrics.

GET  /v1/summaries?after=CURSOR&limit=N[&kinds=K,...]
                                          spooled items with seq > CURSOR, of the kinds the
                                          head named (the original three without it; protocol.py)
POST /v1/ack  {"cursor": N}               drop items with seq <= N (idempotent); N beyond the
                                          last cursor served is clamped to it, so items never
                                          served are never dropped
GET  /metrics                             the agent's own health (private registry)
GET  /healthz                             "ok"

/v1/* need "Authorization: Bearer <token>" always: the server refuses to start without a token
(token.py makes one). /metrics and /healthz stay open like any exporter's and carry no user,
account or job: only counts, sizes and times of the agent itself.

The listener is bounded (slurmtel.listen): connections in all and per address, the time a request
may take to arrive, the threads that answer; what it refuses is counted in
slurmtel_agent_http_refused{reason}. One answer per connection.
"""

from __future__ import annotations

import dataclasses
import hmac
import json
import logging
import threading
from http import HTTPStatus
from typing import Any
from urllib.parse import parse_qs, urlsplit

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from slurmtel.agent.metrics import AgentMetrics
from slurmtel.agent.protocol import (
    ACK_PATH,
    DEFAULT_PAGE_LIMIT,
    MAX_CURSOR,
    MAX_PAGE_LIMIT,
    ORIGINAL_KINDS,
    SUMMARIES_PATH,
    AckResult,
    decode_ack_request,
    encode_ack_response,
    encode_summaries_response,
    requested_kinds,
)
from slurmtel.agent.spool import Spool
from slurmtel.errors import ParseError
from slurmtel.listen import GatedHTTPServer, GatedRequestHandler, ListenLimits, open_files_for

log = logging.getLogger(__name__)

_MAX_BODY = 4096
_ROUTES = {SUMMARIES_PATH, ACK_PATH, "/metrics", "/healthz"}


class _Server(GatedHTTPServer):
    app: AgentHttpServer


class _Handler(GatedRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"
    server_version = "slurmtel-agent"

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s %s", self.address_string(), format % args)

    def _send(self, status: int, body: bytes, content_type: str = "application/json") -> None:
        # counted before the answer goes out: a client that has read the answer (and scrapes
        # /metrics next) must find its request counted
        path = urlsplit(self.path).path
        self.server.app.metrics.http_requests.labels(
            method=self.command, path=path if path in _ROUTES else "other", code=str(status)
        ).inc()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _error(self, status: int, message: str) -> None:
        self._send(status, json.dumps({"error": message}).encode())

    def _authorized(self) -> bool:
        given = self.headers.get_all("Authorization") or []
        expected = f"Bearer {self.server.app.token}".encode()
        # a token is never empty (AgentHttpServer refuses one); exactly one header, equal in
        # constant time
        return len(given) == 1 and hmac.compare_digest(given[0].encode(), expected)

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        app = self.server.app
        if url.path == "/metrics":
            self._send(HTTPStatus.OK, generate_latest(app.metrics.registry), CONTENT_TYPE_LATEST)
        elif url.path == "/healthz":
            self._send(HTTPStatus.OK, b"ok\n", "text/plain")
        elif url.path == SUMMARIES_PATH:
            if not self._authorized():
                self._error(HTTPStatus.UNAUTHORIZED, "missing or wrong bearer token")
                return
            try:
                after, limit, kinds = _page_args(url.query)
            except ValueError as exc:
                self._error(HTTPStatus.BAD_REQUEST, str(exc))
                return
            self._send(HTTPStatus.OK, app.summaries(after, limit, kinds))
        else:
            self._error(HTTPStatus.NOT_FOUND, f"no such path: {url.path}")

    def do_POST(self) -> None:
        url = urlsplit(self.path)
        if url.path != ACK_PATH:
            self._error(HTTPStatus.NOT_FOUND, f"no such path: {url.path}")
            return
        if not self._authorized():
            self._error(HTTPStatus.UNAUTHORIZED, "missing or wrong bearer token")
            return
        try:
            length = int(self.headers.get("Content-Length", ""))
        except ValueError:
            self._error(HTTPStatus.LENGTH_REQUIRED, "Content-Length required")
            return
        if not 0 <= length <= _MAX_BODY:
            self._error(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"body over {_MAX_BODY} bytes")
            return
        try:
            cursor = decode_ack_request(self.rfile.read(length))
        except ParseError as exc:
            self._error(HTTPStatus.BAD_REQUEST, str(exc))
            return
        self._send(HTTPStatus.OK, self.server.app.ack(cursor, self.address_string()))


def _page_args(query: str) -> tuple[int, int, tuple[str, ...]]:
    args = parse_qs(query, keep_blank_values=True)
    after_text = args.get("after", ["0"])[-1]
    limit_text = args.get("limit", [str(DEFAULT_PAGE_LIMIT)])[-1]
    if not (after_text.isascii() and after_text.isdigit() and limit_text.isascii() and limit_text.isdigit()):
        raise ValueError("after and limit must be whole numbers")
    if len(after_text) > 19 or int(after_text) > MAX_CURSOR:
        raise ValueError(f"after must be at most {MAX_CURSOR}")
    after = int(after_text)
    # a limit beyond the page's is the page's (and never a 4,300-digit int())
    limit = int(limit_text) if len(limit_text) <= 12 else MAX_PAGE_LIMIT
    if limit < 1:
        raise ValueError("limit must be 1 or more")
    kinds = args.get("kinds")
    return after, min(limit, MAX_PAGE_LIMIT), requested_kinds(kinds[-1] if kinds else None)


class AgentHttpServer:
    """Serves the spool and the metrics; start() runs it in a daemon thread."""

    def __init__(
        self,
        spool: Spool,
        metrics: AgentMetrics,
        node: str,
        agent_version: str,
        address: str = "0.0.0.0",
        port: int = 9767,
        *,
        token: str,
        limits: ListenLimits | None = None,
    ) -> None:
        if not token or any(c.isspace() or not c.isprintable() for c in token):
            raise ValueError("the agent serves /v1/* only with a token (agent.token_file)")
        self.spool = spool
        self.metrics = metrics
        self.node = node
        self.agent_version = agent_version
        self.token = token
        limits = limits or ListenLimits()
        connections = open_files_for(limits.max_connections)
        if connections < limits.max_connections:
            log.warning(
                "agent.max_connections %d is beyond the open-file limit: %d connections at most "
                "(LimitNOFILE in the unit)",
                limits.max_connections,
                connections,
            )
            limits = dataclasses.replace(limits, max_connections=connections)
        refused = metrics.http_refused
        self._server = _Server(
            (address, port),
            _Handler,
            limits,
            on_refused=lambda reason: refused.labels(reason=reason).inc(),
            name="agent-http",
            logger=log,
        )
        self._server.app = self
        self._thread: threading.Thread | None = None

    @property
    def address(self) -> tuple[str, int]:
        host, port = self._server.server_address[:2]
        return str(host), int(port)

    def summaries(self, after: int, limit: int, kinds: tuple[str, ...] = ORIGINAL_KINDS) -> bytes:
        # stats first: a page never claims fewer evictions than happened before its items
        stats = self.spool.stats()
        items, covered = self.spool.read_page(after, limit, kinds)
        return encode_summaries_response(
            node=self.node,
            agent_version=self.agent_version,
            items=[(i.seq, i.kind, i.payload) for i in items],
            next_cursor=covered,
            evicted_total=stats.evicted_total,
            spool_items=stats.items,
            spool_bytes=stats.bytes,
            spool_id=stats.spool_id,
        )

    def ack(self, cursor: int, peer: str = "") -> bytes:
        acked = self.spool.ack(cursor)
        if acked < cursor:
            # beyond what was ever served: those items never reached a head, keep them
            self.metrics.acks_clamped.inc()
            log.warning(
                "ack of cursor %d from %s is beyond the last cursor served; clamped to %d",
                cursor,
                peer or "?",
                acked,
            )
        stats = self.spool.stats()
        return encode_ack_response(AckResult(acked, stats.items, stats.bytes))

    def start(self) -> None:
        self._thread = threading.Thread(target=self._server.serve_forever, name="agent-http", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join()
            self._thread = None
        self._server.server_close()

    @property
    def open_connections(self) -> int:
        return self._server.open_connections
