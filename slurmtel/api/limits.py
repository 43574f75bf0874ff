"""The read API's listener, bounded (DESIGN §8): what `slurmtel serve` gives uvicorn.

uvicorn alone holds a connection for as long as its client sends a header line every few seconds,
has no cap on connections (only a 503 once a request is parsed) and, out of file descriptors,
logs a traceback for every accept() that fails. Here:

- `BoundedH11Protocol`: at most `api.max_connections` connections and
  `api.max_connections_per_address` from one address (one more is answered 503 and closed at
  once); a request's head and body must have arrived `api.request_timeout_seconds` after the
  server began to wait for them (408 and closed otherwise: a client that trickles holds nothing);
  idle connections close after `api.keep_alive_timeout_seconds`;
- `InFlightLimit`: at most `api.max_requests_in_flight` requests answered at once (the worker
  threads are as many); one more is answered 503 "busy" at once;
- the event loop's errors (accept() out of file descriptors, a failed handshake) and uvicorn's own
  warnings are logged once per interval with a count, never a traceback per attempt; an access
  line keeps at most ACCESS_TARGET_CHARS of the request's target;
- `ListenerState` counts all of it for GET /metrics (slurmtel_api_*), which holds no user data.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import h11
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from uvicorn.protocols.http.h11_impl import H11Protocol

from slurmtel.config import ApiConfig
from slurmtel.listen import REFUSALS, EveryInterval, canned_reply, log_limited, open_files_for

log = logging.getLogger(__name__)

# the loggers whose repeated lines a flood could make (uvicorn's "Invalid HTTP request received.");
# not uvicorn.access: one line per request answered is the access log's purpose
UVICORN_LOGGERS = ("uvicorn.error", "asyncio")
# how long a connection whose request h11 refused is read and drained after its 400
LINGER_SECONDS = 2.0


@dataclass(frozen=True)
class ApiLimits:
    max_connections: int = 4096
    max_connections_per_address: int = 1024
    request_timeout_seconds: float = 10.0
    keep_alive_timeout_seconds: float = 5.0
    max_requests_in_flight: int = 64

    @classmethod
    def from_config(cls, api: ApiConfig) -> ApiLimits:
        return cls(
            max_connections=api.max_connections,
            max_connections_per_address=api.max_connections_per_address,
            request_timeout_seconds=api.request_timeout_seconds,
            keep_alive_timeout_seconds=api.keep_alive_timeout_seconds,
            max_requests_in_flight=api.max_requests_in_flight,
        )


class ListenerState:
    """Connections open (in all and per address), requests in flight and what was refused. Read
    and written on the event loop's thread only."""

    def __init__(self, limits: ApiLimits) -> None:
        self.limits = limits
        self.open = 0
        self.per_address: Counter[str] = Counter()
        self.in_flight = 0
        self.refused: Counter[str] = Counter()
        self.limiter = EveryInterval()

    def admit(self, peer: str) -> str:
        """'' when PEER may hold one more connection (now counted), else the reason not."""
        if self.open >= self.limits.max_connections:
            return "connections"
        if self.per_address[peer] >= self.limits.max_connections_per_address:
            return "address"
        self.open += 1
        self.per_address[peer] += 1
        return ""

    def release(self, peer: str) -> None:
        self.open -= 1
        self.per_address[peer] -= 1
        if self.per_address[peer] <= 0:
            del self.per_address[peer]

    def refuse(self, reason: str) -> None:
        self.refused[reason] += 1


class _StateCollector(Collector):
    def __init__(self, state: ListenerState) -> None:
        self.state = state

    def collect(self) -> list[Metric]:
        connections = GaugeMetricFamily("slurmtel_api_connections", "Connections open now")
        connections.add_metric([], self.state.open)
        in_flight = GaugeMetricFamily("slurmtel_api_requests_in_flight", "Requests being answered now")
        in_flight.add_metric([], self.state.in_flight)
        refused = CounterMetricFamily(
            "slurmtel_api_refused",
            "Connections and requests the read API refused before answering: connections/address "
            "(over the connection limits, 503), busy (over api.max_requests_in_flight, 503), timeout "
            "(a request not received in time), accept_error (out of file descriptors), loop_error",
            labels=["reason"],
        )
        for reason in ("connections", "address", "busy", "timeout", "accept_error", "loop_error"):
            refused.add_metric([reason], self.state.refused[reason])
        return [connections, in_flight, refused]


def listener_registry(state: ListenerState) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_StateCollector(state))
    return registry


def bounded_protocol(state: ListenerState) -> type[H11Protocol]:
    """uvicorn's h11 protocol with STATE's connection limits and request deadline."""
    limits = state.limits

    class BoundedH11Protocol(H11Protocol):
        _peer = ""
        _counted = False
        _deadline: asyncio.TimerHandle | None = None
        _lingering = False

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._peer = self.client[0] if self.client else ""
            reason = state.admit(self._peer)
            if reason:
                state.refuse(reason)
                status, phrase, text = REFUSALS[reason]
                transport.write(canned_reply(status, phrase, text, retry_after=True))
                transport.close()
                return
            self._counted = True
            self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            if self._counted:
                self._counted = False
                state.release(self._peer)
            super().connection_lost(exc)

        def send_400_response(self, msg: str) -> None:
            """uvicorn's 400 for a request h11 refuses (a head over its limit, a malformed one),
            then a staged close (RFC 9112 9.6): our side ends after the answer, and what the
            client still sends of its request is read and dropped until it closes (at most
            LINGER_SECONDS). Closing with its data unread makes the kernel reset the connection,
            and the reset can throw away the 400 the client has not read yet."""
            for event in (
                h11.Response(
                    status_code=400,
                    reason=b"Bad Request",
                    headers=[(b"content-type", b"text/plain; charset=utf-8"), (b"connection", b"close")],
                ),
                h11.Data(data=msg.encode("ascii")),
                h11.EndOfMessage(),
            ):
                self.transport.write(self.conn.send(event))
            self._disarm()
            if not self.transport.can_write_eof():  # TLS: the client reads to our close
                self.transport.close()
                return
            self._lingering = True
            self.transport.write_eof()
            # the client's end closes it sooner (uvicorn's eof_received)
            self._deadline = self.loop.call_later(LINGER_SECONDS, self.transport.close)

        def data_received(self, data: bytes) -> None:
            if self._lingering:
                return  # the rest of a refused request
            if self._deadline is None and self.conn.their_state is h11.IDLE:
                self._arm()  # the first bytes of the next request on a kept-alive connection
            super().data_received(data)
            if self._deadline is not None and self.conn.their_state not in (h11.IDLE, h11.SEND_BODY):
                self._disarm()  # the whole request is in

        def _arm(self) -> None:
            self._disarm()
            self._deadline = self.loop.call_later(limits.request_timeout_seconds, self._too_slow)

        def _disarm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _too_slow(self) -> None:
            self._deadline = None
            if self.transport.is_closing():
                return
            state.refuse("timeout")
            if self.conn.our_state is h11.IDLE:
                status, phrase, text = REFUSALS["timeout"]
                self.transport.write(canned_reply(status, phrase, text))
            self.transport.close()

    return BoundedH11Protocol


class InFlightLimit:
    """ASGI middleware: at most limits.max_requests_in_flight requests at once; one more is
    answered 503 at once. /healthz and /metrics are answered whatever the load."""

    EXEMPT = frozenset({"/healthz", "/metrics"})

    def __init__(self, app: Callable[..., Any], state: ListenerState) -> None:
        self.app = app
        self.state = state

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope.get("path") in self.EXEMPT:
            await self.app(scope, receive, send)
            return
        state = self.state
        if state.in_flight >= state.limits.max_requests_in_flight:
            state.refuse("busy")
            body = json.dumps(
                {"error": f"busy: {state.in_flight} requests are being answered; try again shortly"}
            ).encode()
            await send(
                {
                    "type": "http.response.start",
                    "status": 503,
                    "headers": [
                        (b"content-type", b"application/json"),
                        (b"content-length", str(len(body)).encode()),
                        (b"retry-after", b"1"),
                    ],
                }
            )
            await send({"type": "http.response.body", "body": body})
            return
        state.in_flight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            state.in_flight -= 1


class OncePerInterval(logging.Filter):
    """A logging filter: each message (by its template) at most once per interval, the traceback
    only on that one; the lines held back are counted in the next."""

    def __init__(self, limiter: EveryInterval) -> None:
        super().__init__()
        self.limiter = limiter

    def filter(self, record: logging.LogRecord) -> bool:
        held_back = self.limiter(f"{record.name}:{record.msg}")
        if held_back is None:
            return False
        if held_back:
            record.msg = f"{record.msg} ({held_back} more since the last such line)"
        return True


# characters of a request's target an access log line keeps (h11 takes heads of 64 KiB: a
# client sending such targets would make every line that long, and its formatting the work)
ACCESS_TARGET_CHARS = 256


class BoundedAccessLine(logging.Filter):
    """uvicorn's access line with the request's target cut to ACCESS_TARGET_CHARS."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and len(args) >= 3 and isinstance(args[2], str):
            target = args[2]
            if len(target) > ACCESS_TARGET_CHARS:
                cut = f"{target[:ACCESS_TARGET_CHARS]}...({len(target)} characters)"
                record.args = (*args[:2], cut, *args[3:])
        return True


def loop_exception_handler(
    state: ListenerState,
) -> Callable[[asyncio.AbstractEventLoop, dict[str, Any]], None]:
    """The event loop's errors (accept() out of file descriptors: asyncio logs a traceback for
    each) as one line per interval, the traceback at DEBUG."""

    def handle(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        message = str(context.get("message", "event loop error"))
        exc = context.get("exception")
        kind = "accept_error" if "accept" in message else "loop_error"
        state.refuse(kind)
        log.debug("serve: %s", message, exc_info=exc if isinstance(exc, BaseException) else None)
        detail = f": {exc.strerror or exc}" if isinstance(exc, OSError) else f": {exc}" if exc else ""
        hint = " (raise LimitNOFILE, or lower api.max_connections)" if kind == "accept_error" else ""
        log_limited(state.limiter, log, message, f"serve: {message}{detail}{hint}")

    return handle


def startup_hook(state: ListenerState) -> Callable[[Any], Any]:
    """A Starlette lifespan: on the server's event loop, the exception handler, the quiet
    loggers and as many worker threads as requests may be in flight."""

    @asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[None]:
        import anyio.to_thread

        asyncio.get_running_loop().set_exception_handler(loop_exception_handler(state))
        quiet = OncePerInterval(state.limiter)
        for name in UVICORN_LOGGERS:
            logging.getLogger(name).addFilter(quiet)
        bounded = BoundedAccessLine()
        logging.getLogger("uvicorn.access").addFilter(bounded)
        anyio.to_thread.current_default_thread_limiter().total_tokens = state.limits.max_requests_in_flight
        try:
            yield
        finally:
            for name in UVICORN_LOGGERS:
                logging.getLogger(name).removeFilter(quiet)
            logging.getLogger("uvicorn.access").removeFilter(bounded)

    return lifespan


def uvicorn_options(state: ListenerState) -> dict[str, Any]:
    """The keyword arguments of uvicorn.run that bound the listener (serve.py passes them)."""
    limits = state.limits
    connections = open_files_for(limits.max_connections)
    if connections < limits.max_connections:
        log.warning(
            "api.max_connections %d is beyond the open-file limit: %d connections at most "
            "(LimitNOFILE in the unit)",
            limits.max_connections,
            connections,
        )
        state.limits = ApiLimits(
            max_connections=connections,
            max_connections_per_address=min(limits.max_connections_per_address, connections),
            request_timeout_seconds=limits.request_timeout_seconds,
            keep_alive_timeout_seconds=limits.keep_alive_timeout_seconds,
            max_requests_in_flight=limits.max_requests_in_flight,
        )
    return {
        "http": bounded_protocol(state),
        "timeout_keep_alive": state.limits.keep_alive_timeout_seconds,
        # bursts wait in the kernel's queue rather than being refused by it
        "backlog": 2048,
        # a request head larger than this is refused by h11 (431-like 400)
        "h11_max_incomplete_event_size": 65536,
    }


__all__ = [
    "ApiLimits",
    "InFlightLimit",
    "ListenerState",
    "bounded_protocol",
    "listener_registry",
    "startup_hook",
    "uvicorn_options",
]
