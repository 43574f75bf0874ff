"""Delivery through real parts: SMTP, webhooks over HTTP(S), scancel.

Exactly once. Each delivery (one e-mail address, one webhook, one scancel) moves through states
the database records, each change its own committed transaction:

    pending --claim--> sending --last byte--> committing --answer--> sent
                          |                        |
                          +-- error: pending (a retry after a backoff) or failed (given up)
                                                   +-- no answer: uncertain (never sent again)

- A claim is a compare-and-set (pending -> sending) by the process holding the actions lease,
  so no two processes ever send the same delivery.
- `sending` -> `committing` is recorded just before the last byte that makes the receiver act:
  the final "." of SMTP's DATA, the last byte of a webhook's body. Until then the receiver has
  nothing it would act on (an SMTP server drops a message whose DATA never ended; an HTTP
  server a request whose body is short), so a process killed in `sending` left nothing behind:
  the next lease holder puts the delivery back to pending and sends it again.
- A process killed in `committing` may have had its message accepted: the delivery is then
  `uncertain` and never sent again (nobody gets the same mail twice); `act log` and the metrics
  show it. The window is one network round trip. The Message-ID (and a webhook's
  Idempotency-Key header) is the same on every try of a delivery, so a receiver can also tell.
- Every error is classed: permanent (an SMTP 5xx, an HTTP 4xx but 408/429) fails the delivery
  at once; any other is tried again after actions.retry_backoff_seconds x 2^(tries-1), at most
  actions.retry_backoff_max_seconds, up to actions.retry_max_attempts tries.

scancel: see slurmtel.actions.cycle (the re-check before it) and run_scancel below.
"""

from __future__ import annotations

import http.client
import json
import os
import smtplib
import ssl
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from email.message import EmailMessage
from email.policy import SMTP as SMTP_POLICY
from email.utils import format_datetime, make_msgid
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from slurmtel import __version__
from slurmtel.actions.settings import EmailConfig, WebhookConfig


class DeliveryError(Exception):
    """A delivery that did not happen (or may have: uncertain)."""

    def __init__(
        self, message: str, *, permanent: bool = False, uncertain: bool = False, unreachable: bool = False
    ) -> None:
        super().__init__(message)
        self.permanent = permanent
        self.uncertain = uncertain
        # the server could not be reached at all: the round tries it no more
        self.unreachable = unreachable


class NotDone(Exception):
    """A cancel the re-check stopped (the job ended, works again, or was excluded meanwhile)."""


PointOfNoReturn = Callable[[], None]


def message_id(delivery_id: int, domain: str) -> str:
    """The same Message-ID on every try of one delivery."""
    return f"<slurmtel-action-delivery-{delivery_id}@{domain}>"


def _tls_context(ca_file: str) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=ca_file or None)


def _read_secret(path: str) -> str:
    try:
        return Path(path).read_text().strip()
    except OSError as exc:
        raise DeliveryError(f"cannot read {path}: {exc.strerror or exc}") from exc


# ------------------------------------------------------------------ e-mail


def build_email(
    settings: EmailConfig,
    *,
    to: str,
    title: str,
    text: str,
    html: str,
    msgid: str,
    headers: Mapping[str, str] = {},
) -> EmailMessage:
    """A multipart/alternative message (text, HTML). Header values are one line each: the
    email package refuses CR and LF in them, and the title was made one line already."""
    message = EmailMessage(policy=SMTP_POLICY)
    message["From"] = settings.sender
    message["To"] = to
    if settings.reply_to:
        message["Reply-To"] = settings.reply_to
    message["Subject"] = f"{settings.subject_prefix}{title}"
    message["Message-ID"] = msgid
    message["Date"] = format_datetime(_utc_now())
    # RFC 3834: no auto-replies (vacation mail) to an automatic message
    message["Auto-Submitted"] = "auto-generated"
    for name, value in headers.items():
        message[name] = value
    message.set_content(text)
    if html:
        message.add_alternative(html, subtype="html")
    return message


def _utc_now() -> Any:
    from datetime import UTC, datetime

    return datetime.now(UTC)


def send_email(
    settings: EmailConfig, message: EmailMessage, to: str, point_of_no_return: PointOfNoReturn
) -> str:
    """Send MESSAGE to TO over SMTP (STARTTLS, TLS and AUTH as configured); returns the server's
    answer to the end of DATA. POINT_OF_NO_RETURN runs just before the final "."."""
    timeout = settings.timeout_seconds
    try:
        if settings.security == "tls":
            smtp: smtplib.SMTP = smtplib.SMTP_SSL(
                settings.smtp_host,
                settings.smtp_port,
                timeout=timeout,
                context=_tls_context(settings.ca_file),
            )
        else:
            smtp = smtplib.SMTP(settings.smtp_host, settings.smtp_port, timeout=timeout)
    except (OSError, smtplib.SMTPException) as exc:
        raise DeliveryError(
            f"cannot reach {settings.smtp_host}:{settings.smtp_port}: {exc}", unreachable=True
        ) from exc
    try:
        return _transaction(smtp, settings, message, to, point_of_no_return)
    finally:
        try:
            smtp.quit()
        except (OSError, smtplib.SMTPException):
            smtp.close()


def _transaction(
    smtp: smtplib.SMTP,
    settings: EmailConfig,
    message: EmailMessage,
    to: str,
    point_of_no_return: PointOfNoReturn,
) -> str:
    try:
        smtp.ehlo()
        if settings.security == "starttls":
            if not smtp.has_extn("starttls"):
                raise DeliveryError(f"{settings.smtp_host} does not offer STARTTLS", permanent=True)
            smtp.starttls(context=_tls_context(settings.ca_file))
            smtp.ehlo()
        if settings.username:
            _login(smtp, settings.username, _read_secret(settings.password_file))
        _expect(smtp.mail(settings.sender), (250,), "MAIL FROM")
        _expect(smtp.rcpt(to), (250, 251), f"RCPT TO <{to}>")
        _expect(smtp.docmd("DATA"), (354,), "DATA")
        payload = smtplib._quote_periods(message.as_bytes())  # type: ignore[attr-defined]
        if not payload.endswith(b"\r\n"):
            payload += b"\r\n"
        smtp.send(payload)
    except smtplib.SMTPAuthenticationError as exc:
        raise DeliveryError(
            f"SMTP AUTH refused: {exc.smtp_code} {_text(exc.smtp_error)}", permanent=True
        ) from exc
    except smtplib.SMTPNotSupportedError as exc:
        raise DeliveryError(f"{settings.smtp_host}: {exc}", permanent=True) from exc
    except (OSError, smtplib.SMTPException, ssl.SSLError) as exc:
        if isinstance(exc, DeliveryError):
            raise
        raise DeliveryError(f"SMTP: {exc}") from exc
    point_of_no_return()
    try:
        smtp.send(b".\r\n")
        code, reply = smtp.getreply()
    except (OSError, smtplib.SMTPException) as exc:
        raise DeliveryError(f"no answer to the end of DATA: {exc}", uncertain=True) from exc
    if code != 250:
        raise DeliveryError(f"end of DATA: {code} {_text(reply)}", permanent=500 <= code < 600)
    return f"{code} {_text(reply)}"


def _login(smtp: smtplib.SMTP, user: str, password: str) -> None:
    """AUTH PLAIN where offered (one try: a wrong password is not sent again by another
    mechanism), else whatever smtplib finds."""
    if not smtp.has_extn("auth"):
        raise DeliveryError("the SMTP server offers no AUTH (actions.email.username is set)", permanent=True)
    if "PLAIN" in smtp.esmtp_features.get("auth", "").upper().split():
        smtp.user, smtp.password = user, password
        smtp.auth("PLAIN", smtp.auth_plain)
    else:
        smtp.login(user, password)


def _expect(answer: tuple[int, bytes], codes: Sequence[int], what: str) -> None:
    code, reply = answer
    if code not in codes:
        raise DeliveryError(f"{what}: {code} {_text(reply)}", permanent=500 <= code < 600)


def _text(reply: bytes | str) -> str:
    return (reply.decode("utf-8", "replace") if isinstance(reply, bytes) else str(reply)).replace("\n", " ")


# ------------------------------------------------------------------ webhooks


def webhook_payload(hook: WebhookConfig, record: Mapping[str, Any]) -> bytes:
    """The body a webhook gets: the record as JSON, or a chat message."""
    title, text = str(record["title"]), str(record["text"])
    if hook.format == "json":
        document: Any = dict(record)
    elif hook.format in ("slack", "mattermost"):
        document = {"text": f"*{title}*\n{text}"}
    else:  # teams: an Office 365 connector MessageCard
        document = {
            "@type": "MessageCard",
            "@context": "https://schema.org/extensions",
            "summary": title,
            "title": title,
            "text": text.replace("\n", "\n\n"),
        }
    return json.dumps(document, default=str, ensure_ascii=False).encode()


def send_webhook(
    hook: WebhookConfig, body: bytes, idempotency_key: str, point_of_no_return: PointOfNoReturn
) -> str:
    """POST BODY to the webhook; POINT_OF_NO_RETURN runs just before its last byte."""
    url = urlsplit(hook.url)
    path = (url.path or "/") + (f"?{url.query}" if url.query else "")
    try:
        if url.scheme == "https":
            conn: http.client.HTTPConnection = http.client.HTTPSConnection(
                url.hostname or "", url.port, timeout=hook.timeout_seconds, context=_tls_context(hook.ca_file)
            )
        else:
            conn = http.client.HTTPConnection(url.hostname or "", url.port, timeout=hook.timeout_seconds)
    except (OSError, ValueError) as exc:
        raise DeliveryError(f"webhook {hook.name}: {exc}") from exc
    try:
        try:
            conn.connect()
        except OSError as exc:
            raise DeliveryError(
                f"webhook {hook.name}: cannot reach {url.netloc}: {exc}", unreachable=True
            ) from exc
        try:
            conn.putrequest("POST", path)
            conn.putheader("Content-Type", "application/json")
            conn.putheader("Content-Length", str(len(body)))
            conn.putheader("User-Agent", f"slurmtel/{__version__}")
            conn.putheader("Idempotency-Key", idempotency_key)
            if hook.token_file:
                conn.putheader("Authorization", f"Bearer {_read_secret(hook.token_file)}")
            conn.endheaders()
            conn.send(body[:-1])
        except (OSError, http.client.HTTPException) as exc:
            if isinstance(exc, DeliveryError):
                raise
            raise DeliveryError(f"webhook {hook.name}: {exc}") from exc
        point_of_no_return()
        try:
            conn.send(body[-1:])
            response = conn.getresponse()
            answer = response.read(4096).decode("utf-8", "replace")
        except (OSError, http.client.HTTPException) as exc:
            raise DeliveryError(f"webhook {hook.name}: no answer: {exc}", uncertain=True) from exc
    finally:
        conn.close()
    status = response.status
    if 200 <= status < 300:
        return f"HTTP {status}"
    permanent = 400 <= status < 500 and status not in (408, 429)
    raise DeliveryError(f"webhook {hook.name}: HTTP {status} {answer[:200].strip()}", permanent=permanent)


# ------------------------------------------------------------------ scancel and squeue


@dataclass(frozen=True)
class CommandResult:
    returncode: int
    output: str


def run_tool(argv: Sequence[str], timeout_seconds: float) -> CommandResult:
    """Run a Slurm client; its exit status and its output (stdout and stderr, one line)."""
    try:
        proc = subprocess.run(
            list(argv),
            capture_output=True,
            text=True,
            timeout=timeout_seconds,
            check=False,
            env={**os.environ, "SLURM_TIME_FORMAT": "standard"},
        )
    except FileNotFoundError as exc:
        raise DeliveryError(f"{argv[0]}: not found") from exc
    except subprocess.TimeoutExpired as exc:
        raise DeliveryError(f"{argv[0]}: no answer in {timeout_seconds:g} s") from exc
    output = " ".join((proc.stdout + " " + proc.stderr).split())
    return CommandResult(proc.returncode, output)


# scancel's words for a job that is not there to cancel any more
GONE = ("already completing or completed", "invalid job id", "job has already finished")


def run_scancel(command: str, job_id: str, cluster_args: Sequence[str], timeout_seconds: float) -> str:
    result = run_tool([command, *cluster_args, job_id], timeout_seconds)
    if result.returncode == 0:
        return f"scancel {job_id}: ok" + (f" ({result.output})" if result.output else "")
    lowered = result.output.lower()
    if any(word in lowered for word in GONE):
        raise NotDone(f"scancel {job_id}: the job had ended ({result.output})")
    raise DeliveryError(f"scancel {job_id} exited {result.returncode}: {result.output}")


def job_state(squeue: str, job_id: str, cluster_args: Sequence[str], timeout_seconds: float) -> str:
    """The job's state as squeue says it now ("" when squeue no longer lists it)."""
    result = run_tool([squeue, *cluster_args, "-h", "-j", job_id, "-o", "%T"], timeout_seconds)
    if result.returncode != 0:
        if "invalid job id" in result.output.lower():
            return ""
        raise DeliveryError(f"squeue -j {job_id} exited {result.returncode}: {result.output}")
    return result.output.split()[0] if result.output else ""


def make_msgid_domain() -> str:
    """The domain part of Message-IDs (this host's name, as email.utils uses it)."""
    return make_msgid().split("@", 1)[1].rstrip(">")
