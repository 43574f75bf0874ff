"""Bounded listeners: what every HTTP server of slurmtel does before a request reaches its code
(DESIGN §8: every listener is bounded; no caller can deny service to another).

A server that gives each connection a thread (http.server's ThreadingMixIn) is held by anyone who
opens connections and sends a header line every few seconds (slowloris): each costs a thread for
ever, and at the open-file limit accept() fails for everyone. `GatedHTTPServer` instead:

- accepts at most `max_connections` connections at once and `max_connections_per_address` from
  one address; one more is answered 503 at once and closed (no thread, no read);
- reads every request's head (and its small body) in ONE thread, non-blocking, for all
  connections together, within `request_timeout_seconds` from the first byte awaited: a client
  that trickles is answered 408 and closed at that deadline, whatever it sends meanwhile;
- hands a request only once it is complete to one of `workers` threads; when they are all busy
  and `max_queued` requests wait, the next is answered 503 at once;
- writes each answer within `write_timeout_seconds` and closes the connection after it;
- logs accept failures (out of file descriptors) and handler errors once per interval with a
  count, never a traceback per attempt.

Standard library only: the node agent imports it (it has no ASGI stack); `slurmtel serve` has the
same bounds on uvicorn (slurmtel.api.limits).
"""

from __future__ import annotations

import contextlib
import errno
import heapq
import io
import logging
import queue
import re
import resource
import selectors
import socket
import socketserver
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from typing import Any

log = logging.getLogger(__name__)

# file descriptors a server needs besides its connections (database pool, logs, pipes of child
# processes such as unmunge, the spool)
RESERVED_FILES = 256
# accept() errors that mean "out of a resource", not "this one connection failed"
_RESOURCE_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
_CONTENT_LENGTH = re.compile(rb"^content-length[ \t]*:[ \t]*([^\r\n]*)", re.IGNORECASE | re.MULTILINE)
_HEAD_END = re.compile(rb"\r?\n\r?\n")


@dataclass(frozen=True)
class ListenLimits:
    """How much one listener takes: connections, time and bytes."""

    # connections open at once (answered 503 and closed beyond)
    max_connections: int = 4096
    # ... from one peer address
    max_connections_per_address: int = 64
    # a request's head and body must have arrived this long after the first byte was awaited
    request_timeout_seconds: float = 10.0
    # an answer must have been written within this
    write_timeout_seconds: float = 10.0
    # a request line and headers longer than this are answered 431
    max_head_bytes: int = 65536
    # a body longer than this is answered 413 (the servers here take at most a few KiB)
    max_body_bytes: int = 65536
    # threads that run complete requests
    workers: int = 8
    # complete requests waiting for a worker (503 beyond)
    max_queued: int = 64

    def __post_init__(self) -> None:
        for name in ("max_connections", "max_connections_per_address", "workers", "max_queued"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be 1 or more")
        if self.request_timeout_seconds <= 0 or self.write_timeout_seconds <= 0:
            raise ValueError("timeouts must be positive")


def open_files_for(connections: int) -> int:
    """The soft RLIMIT_NOFILE that CONNECTIONS need, raised toward the hard limit when it is
    lower (an unprivileged process may); returns the connections the limit now allows."""
    needed = connections + RESERVED_FILES
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        target = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return connections
    return max(1, soft - RESERVED_FILES)


class EveryInterval:
    """Says whether a kind of event is to be logged now: the first time, then at most once per
    INTERVAL seconds, with how many were not logged in between. Thread-safe."""

    def __init__(self, interval_seconds: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval = interval_seconds
        self.clock = clock
        self._last: dict[str, float] = {}
        self._quiet: Counter[str] = Counter()
        self._lock = threading.Lock()

    def __call__(self, kind: str) -> int | None:
        """None: do not log; else the number of events of KIND not logged since the last line."""
        now = self.clock()
        with self._lock:
            last = self._last.get(kind)
            if last is not None and now - last < self.interval:
                self._quiet[kind] += 1
                return None
            self._last[kind] = now
            return self._quiet.pop(kind, 0)


def log_limited(limiter: EveryInterval, logger: logging.Logger, kind: str, message: str) -> None:
    """MESSAGE at WARNING, once per the limiter's interval for KIND, with the count it held back."""
    held_back = limiter(kind)
    if held_back is None:
        return
    suffix = f" ({held_back} more since the last such line)" if held_back else ""
    logger.warning("%s%s", message, suffix)


def canned_reply(status: int, reason: str, text: str, retry_after: bool = False) -> bytes:
    body = f"{text}\n".encode()
    extra = b"Retry-After: 1\r\n" if retry_after else b""
    return (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: text/plain; charset=utf-8\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n".encode()
        + extra
        + b"\r\n"
        + body
    )


REFUSALS = {
    # reason: (status, phrase, text)
    "connections": (503, "Service Unavailable", "busy: too many connections"),
    "address": (503, "Service Unavailable", "busy: too many connections from your address"),
    "busy": (503, "Service Unavailable", "busy: too many requests waiting"),
    "timeout": (408, "Request Timeout", "request not received in time"),
    "head_too_large": (431, "Request Header Fields Too Large", "request head too large"),
    "body_too_large": (413, "Content Too Large", "request body too large"),
    "bad_length": (400, "Bad Request", "bad Content-Length"),
}


@dataclass
class _Pending:
    sock: socket.socket
    address: tuple[Any, ...]
    deadline: float
    data: bytearray


class GatedHTTPServer(socketserver.TCPServer):
    """An http.server whose connections wait in one thread until their request is complete
    (see the module's docstring). The handler is a BaseHTTPRequestHandler subclass; it reads the
    buffered request as usual (self.rfile) and the connection closes after the answer.

    ON_REFUSED(reason) is called for every connection answered by the gate itself (reasons:
    REFUSALS' keys, "accept_error", "handler_error")."""

    allow_reuse_address = True
    # the listen backlog: bursts wait in the kernel, not in a refusal
    request_queue_size = 1024

    def __init__(
        self,
        address: tuple[str, int],
        handler_class: type[BaseHTTPRequestHandler],
        limits: ListenLimits | None = None,
        *,
        on_refused: Callable[[str], None] | None = None,
        name: str = "http",
        logger: logging.Logger = log,
    ) -> None:
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        # everything server_close needs before the socket is bound (a failed bind calls it)
        self.limits = limits = limits or ListenLimits()
        self.name = name
        self.logger = logger
        self.on_refused = on_refused or (lambda reason: None)
        self.limiter = EveryInterval()
        self._lock = threading.Lock()
        self._open = 0
        self._per_address: Counter[str] = Counter()
        self._accepted: dict[int, str] = {}
        self._incoming: queue.SimpleQueue[tuple[socket.socket, tuple[Any, ...]]] = queue.SimpleQueue()
        self._work: queue.Queue[tuple[socket.socket, tuple[Any, ...], bytes] | None] = queue.Queue(
            limits.max_queued
        )
        self._wake_read, self._wake_write = socket.socketpair()
        self._wake_read.setblocking(False)
        self._wake_write.setblocking(False)
        self._stopping = threading.Event()
        self._threads: list[threading.Thread] = []
        self._buffers: dict[int, bytes] = {}
        super().__init__(address, handler_class)

    # --- counts

    @property
    def open_connections(self) -> int:
        with self._lock:
            return self._open

    def _refuse(self, sock: socket.socket, reason: str) -> None:
        status, phrase, text = REFUSALS[reason]
        self.on_refused(reason)
        with contextlib.suppress(OSError):
            sock.setblocking(False)
            sock.send(canned_reply(status, phrase, text, retry_after=status == 503))

    # --- the accepting thread (serve_forever)

    def get_request(self) -> tuple[socket.socket, Any]:
        try:
            return self.socket.accept()
        except OSError as exc:
            if exc.errno in _RESOURCE_ERRNOS:
                self.on_refused("accept_error")
                log_limited(
                    self.limiter,
                    self.logger,
                    "accept",
                    f"{self.name}: cannot accept a connection: {exc.strerror} (raise LimitNOFILE, or "
                    "lower max_connections)",
                )
                # the backlog stays full: do not spin on it
                time.sleep(0.1)
            raise

    def verify_request(self, request: Any, client_address: Any) -> bool:
        peer = str(client_address[0])
        limits = self.limits
        with self._lock:
            if self._open >= limits.max_connections:
                reason = "connections"
            elif self._per_address[peer] >= limits.max_connections_per_address:
                reason = "address"
            else:
                self._open += 1
                self._per_address[peer] += 1
                self._accepted[id(request)] = peer
                return True
        self._refuse(request, reason)
        return False

    def process_request(self, request: Any, client_address: Any) -> None:
        self._incoming.put((request, client_address))
        with contextlib.suppress(OSError):
            self._wake_write.send(b"\0")

    def shutdown_request(self, request: Any) -> None:
        with self._lock:
            peer = self._accepted.pop(id(request), None)
            if peer is not None:
                self._open -= 1
                self._per_address[peer] -= 1
                if self._per_address[peer] <= 0:
                    del self._per_address[peer]
        super().shutdown_request(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # never a traceback a flood can repeat: one line per interval (the traceback at DEBUG)
        self.on_refused("handler_error")
        self.logger.debug("%s: error handling a request from %s", self.name, client_address, exc_info=True)
        log_limited(self.limiter, self.logger, "handler", f"{self.name}: a request failed in its handler")

    # --- the gate: every connection's request head, read without a thread of its own

    def start_threads(self) -> None:
        gate = threading.Thread(target=self._gate, name=f"{self.name}-gate", daemon=True)
        self._threads.append(gate)
        for i in range(self.limits.workers):
            self._threads.append(
                threading.Thread(target=self._worker, name=f"{self.name}-worker-{i}", daemon=True)
            )
        for thread in self._threads:
            thread.start()

    def serve_forever(self, poll_interval: float = 0.5) -> None:
        if not self._threads:
            self.start_threads()
        super().serve_forever(poll_interval)

    def server_close(self) -> None:
        self._stopping.set()
        with contextlib.suppress(OSError):
            self._wake_write.send(b"\0")
        for _ in range(self.limits.workers):
            with contextlib.suppress(queue.Full):
                self._work.put_nowait(None)
        for thread in self._threads:
            thread.join(timeout=5)
        super().server_close()
        self._wake_read.close()
        self._wake_write.close()

    def _gate(self) -> None:
        selector = selectors.DefaultSelector()
        selector.register(self._wake_read, selectors.EVENT_READ)
        pending: dict[int, _Pending] = {}
        deadlines: list[tuple[float, int]] = []
        timeout = self.limits.request_timeout_seconds
        try:
            while not self._stopping.is_set():
                wait = max(0.0, deadlines[0][0] - time.monotonic()) if deadlines else 1.0
                for key, _ in selector.select(min(wait, 1.0)):
                    if key.fileobj is self._wake_read:
                        with contextlib.suppress(OSError):
                            self._wake_read.recv(4096)
                        continue
                    item: _Pending = key.data
                    outcome = self._read_more(item)
                    if outcome is not None:
                        selector.unregister(item.sock)
                        del pending[id(item.sock)]
                        self._leave_gate(item, outcome)
                while True:
                    try:
                        sock, address = self._incoming.get_nowait()
                    except queue.Empty:
                        break
                    sock.setblocking(False)
                    item = _Pending(sock, address, time.monotonic() + timeout, bytearray())
                    pending[id(sock)] = item
                    selector.register(sock, selectors.EVENT_READ, item)
                    heapq.heappush(deadlines, (item.deadline, id(sock)))
                now = time.monotonic()
                while deadlines and deadlines[0][0] <= now:
                    _, ident = heapq.heappop(deadlines)
                    late = pending.get(ident)
                    if late is None or late.deadline > now:
                        continue  # done already (the id may be a newer connection's)
                    del pending[ident]
                    selector.unregister(late.sock)
                    self._refuse(late.sock, "timeout")
                    self.shutdown_request(late.sock)
        finally:
            for item in pending.values():
                self.shutdown_request(item.sock)
            selector.close()

    def _read_more(self, item: _Pending) -> str | None:
        """Read what ITEM's socket has: None while more must come, else how it leaves the
        gate: "" complete, "closed" by the client, or the reason it is refused."""
        try:
            chunk = item.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return None
        except OSError:
            chunk = b""
        if not chunk:
            return "closed"
        item.data += chunk
        return self._complete(item.data)

    def _leave_gate(self, item: _Pending, outcome: str) -> None:
        if outcome == "":
            try:
                self._work.put_nowait((item.sock, item.address, bytes(item.data)))
                return
            except queue.Full:
                outcome = "busy"
        if outcome != "closed":
            self._refuse(item.sock, outcome)
        self.shutdown_request(item.sock)

    def _complete(self, data: bytearray) -> str | None:
        """'' when DATA holds a whole request, None when more must come, else why it is refused."""
        end = _HEAD_END.search(data)
        if end is None:
            return "head_too_large" if len(data) > self.limits.max_head_bytes else None
        if end.start() > self.limits.max_head_bytes:
            return "head_too_large"
        head = bytes(data[: end.start()])
        lengths = _CONTENT_LENGTH.findall(head)
        if not lengths:
            return ""
        values = {v.strip() for v in lengths}
        if len(values) != 1 or not next(iter(values)).isdigit():
            return "bad_length"
        length = int(next(iter(values)))
        if length > self.limits.max_body_bytes:
            return "body_too_large"
        return "" if len(data) - end.end() >= length else None

    # --- the workers: complete requests only

    def _worker(self) -> None:
        while True:
            job = self._work.get()
            if job is None:
                return
            sock, address, data = job
            try:
                sock.setblocking(True)
                sock.settimeout(self.limits.write_timeout_seconds)
                self._buffers[id(sock)] = data
                self.finish_request(sock, address)
            except Exception:
                self.handle_error(sock, address)
            finally:
                self._buffers.pop(id(sock), None)
                self.shutdown_request(sock)

    def take_buffer(self, sock: socket.socket) -> bytes:
        return self._buffers.pop(id(sock), b"")


class _SocketWriter(io.BufferedIOBase):
    """Writes go straight to the socket, whole (sendall), within the socket's timeout."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        self._sock.sendall(data)
        return len(memoryview(data))

    def fileno(self) -> int:
        return self._sock.fileno()


class GatedRequestHandler(BaseHTTPRequestHandler):
    """A BaseHTTPRequestHandler for GatedHTTPServer: reads the request the gate buffered, says
    `Connection: close` and is done after one answer."""

    server: GatedHTTPServer

    def setup(self) -> None:
        self.connection = self.request
        self.rfile = io.BytesIO(self.server.take_buffer(self.request))
        self.wfile = _SocketWriter(self.connection)

    def handle(self) -> None:
        self.close_connection = True
        self.handle_one_request()

    def end_headers(self) -> None:
        self.send_header("Connection", "close")
        super().end_headers()

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        # a method the server does not take is the client's error (405), not the server's (501)
        if code == 501:
            code, message = 405, f"method {self.command} not allowed"
        super().send_error(code, message, explain)


__all__ = [
    "REFUSALS",
    "EveryInterval",
    "GatedHTTPServer",
    "GatedRequestHandler",
    "ListenLimits",
    "log_limited",
    "open_files_for",
]
