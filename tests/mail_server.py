"""A real SMTP server for the tests (aiosmtpd), and a real HTTP server for webhooks.

The SMTP server speaks plain SMTP, STARTTLS or TLS from the start, with or without AUTH
(PLAIN/LOGIN against one user and password), keeps what it accepted, and can be told to
answer RCPT with an error, or to hold a client at RCPT or after DATA (to kill the sender there).
"""

from __future__ import annotations

import asyncio
import email
import email.policy
import http.server
import json
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from email.message import EmailMessage
from pathlib import Path
from typing import Any

from aiosmtpd.controller import Controller
from aiosmtpd.smtp import AuthResult, LoginPassword


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class Received:
    mail_from: str
    rcpt_tos: list[str]
    data: bytes

    @property
    def message(self) -> EmailMessage:
        parsed = email.message_from_bytes(self.data, policy=email.policy.default)
        assert isinstance(parsed, EmailMessage)
        return parsed

    def body(self, subtype: str = "plain") -> str:
        part = self.message.get_body(preferencelist=(subtype,))
        assert part is not None, f"no text/{subtype} part"
        return str(part.get_content())


@dataclass
class Mailbox:
    messages: list[Received] = field(default_factory=list)
    # the answer to the next RCPTs (e.g. "451 4.3.0 try later"), one each, then "250 OK"
    rcpt_answers: list[str] = field(default_factory=list)
    # hold a client at RCPT (before its DATA) or after its DATA was stored (before "250"):
    # `reached` is set when one arrives there, the client waits until `release` is set
    hold_at: str = ""
    reached: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)
    rcpt_seen: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def wait_for(self, count: int, timeout: float = 20.0) -> list[Received]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                if len(self.messages) >= count:
                    return list(self.messages)
            time.sleep(0.05)
        raise AssertionError(f"{len(self.messages)} messages arrived, not {count}")


class _Handler:
    def __init__(self, mailbox: Mailbox) -> None:
        self.mailbox = mailbox

    async def _hold(self, where: str) -> None:
        box = self.mailbox
        if box.hold_at == where:
            box.reached.set()
            await asyncio.get_running_loop().run_in_executor(None, box.release.wait, 60)

    async def handle_RCPT(self, server: Any, session: Any, envelope: Any, address: str, options: Any) -> str:
        box = self.mailbox
        with box.lock:
            box.rcpt_seen += 1
            answer = box.rcpt_answers.pop(0) if box.rcpt_answers else ""
        if answer:
            return answer
        await self._hold("rcpt")
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        box = self.mailbox
        with box.lock:
            box.messages.append(
                Received(envelope.mail_from, list(envelope.rcpt_tos), bytes(envelope.content))
            )
        # a real server queues a message before it says 250: a sender killed while it waits
        # for the answer has had its message accepted all the same
        await self._hold("data")
        return "250 2.0.0 queued"


@dataclass
class SmtpServer:
    host: str
    port: int
    mailbox: Mailbox
    ca_file: Path | None


@contextmanager
def smtp_server(
    tmp: Path,
    *,
    security: str = "none",
    user: str = "",
    password: str = "",
) -> Iterator[SmtpServer]:
    """An SMTP server on 127.0.0.1: SECURITY "none", "starttls" (required) or "tls"; with USER,
    AUTH is required (over TLS) and only USER/PASSWORD pass."""
    from tests.prometheus_server import self_signed_certificate

    mailbox = Mailbox()
    port = free_port()
    kwargs: dict[str, Any] = {}
    ca_file = None
    context = None
    if security in ("starttls", "tls"):
        cert, key = self_signed_certificate(tmp)
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(cert, key)
        ca_file = cert
    if security == "starttls":
        kwargs.update(tls_context=context, require_starttls=True)
    if user:

        def authenticate(server: Any, session: Any, envelope: Any, mechanism: str, data: Any) -> AuthResult:
            ok = (
                isinstance(data, LoginPassword)
                and data.login == user.encode()
                and data.password == password.encode()
            )
            return AuthResult(success=ok, handled=False)

        kwargs.update(authenticator=authenticate, auth_required=True, auth_require_tls=security != "none")
    controller = Controller(
        _Handler(mailbox),
        hostname="127.0.0.1",
        port=port,
        ssl_context=context if security == "tls" else None,
        server_hostname="127.0.0.1",
        **kwargs,
    )
    controller.start()
    try:
        yield SmtpServer("127.0.0.1", port, mailbox, ca_file)
    finally:
        mailbox.release.set()
        controller.stop()


# ------------------------------------------------------------------ webhooks


@dataclass
class Hook:
    url: str
    requests: list[dict[str, Any]]
    # the statuses to answer the next requests with, one each, then 200
    statuses: list[int]


@contextmanager
def webhook_server() -> Iterator[Hook]:
    hook = Hook("", [], [])
    lock = threading.Lock()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", "0"))
            body = self.rfile.read(length)
            with lock:
                status = hook.statuses.pop(0) if hook.statuses else 200
                hook.requests.append(
                    {
                        "path": self.path,
                        "headers": dict(self.headers),
                        "body": json.loads(body),
                        "status": status,
                    }
                )
            self.send_response(status)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    hook.url = f"http://127.0.0.1:{server.server_address[1]}/hooks/slurmtel"
    try:
        yield hook
    finally:
        server.shutdown()
        server.server_close()
