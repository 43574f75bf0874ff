"""Log lines: one line per event, `key=value` pairs (logfmt), journald-friendly, no secrets.

    level=info event=source_run source=sacct status=ok rows_read=22 seconds=0.41

Call `log_event(logger, "source_run", source="sacct", ...)` for structured events; plain
`logger.info("text")` calls become `level=info logger=NAME msg="text"`. Under systemd
(`$JOURNAL_STREAM` names our stderr) lines carry no timestamp, because journald adds one, and
start with a `<N>` syslog priority prefix so `journalctl -p warning` works; elsewhere they
start with `ts=` (UTC, ISO 8601). A traceback is folded into the same line (`exc="..."`).

Secrets never reach a line: every URL password (`scheme://user:PASSWORD@host`), libpq
`password=...`, `Authorization: Bearer ...` and each value given to `add_secret` is replaced
by `***` in the finished line, whatever logger or exception produced it.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import threading
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import IO, Any

MASK = "***"
# scheme://user:password@host -> scheme://user:***@host
_URL_PASSWORD = re.compile(r"(?P<head>[a-zA-Z][a-zA-Z0-9+.-]*://[^:/@\s\"']*:)[^@\s\"']+(?=@)")
_KEYWORD_PASSWORD = re.compile(
    r"(?P<head>\b(?:ssl)?password\s*=\s*)(?:'[^']*'|\"[^\"]*\"|[^\s'\"&]+)", re.IGNORECASE
)
_BEARER = re.compile(r"(?P<head>\bBearer\s+)[A-Za-z0-9._~+/=-]+")
_SYSLOG_PRIORITY = {"debug": 7, "info": 6, "warning": 4, "error": 3, "critical": 2}
# attributes every LogRecord has; anything else in record.__dict__ came from `extra`
_RECORD_ATTRIBUTES = frozenset(logging.makeLogRecord({}).__dict__) | {"message", "asctime", "taskName"}

_secrets: set[str] = set()
_secrets_lock = threading.Lock()


def add_secret(value: str | None) -> None:
    """Mask VALUE wherever it appears in a log line (a password, a token)."""
    if value and len(value) >= 4:  # shorter values would mask ordinary words
        with _secrets_lock:
            _secrets.add(value)


def redact(text: str) -> str:
    """TEXT with URL passwords, password= values, bearer tokens and registered secrets masked."""
    text = _URL_PASSWORD.sub(lambda m: m.group("head") + MASK, text)
    text = _KEYWORD_PASSWORD.sub(lambda m: m.group("head") + MASK, text)
    text = _BEARER.sub(lambda m: m.group("head") + MASK, text)
    with _secrets_lock:
        secrets = sorted(_secrets, key=len, reverse=True)
    for secret in secrets:
        text = text.replace(secret, MASK)
    return text


def log_event(logger: logging.Logger, event: str, level: int = logging.INFO, **fields: Any) -> None:
    """Log one structured event: `event=EVENT key=value ...`."""
    logger.log(level, event, extra={"event": event, "fields": fields})


def format_value(value: Any) -> str:
    """A logfmt value: bare when it is one plain word, else double-quoted with escapes."""
    if value is None:
        return '""'
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        text = f"{value:.3f}".rstrip("0").rstrip(".") if value == value else "NaN"
        return text or "0"
    if isinstance(value, datetime):
        value = value.astimezone(UTC).isoformat().replace("+00:00", "Z")
    text = str(value)
    if text and re.fullmatch(r"[A-Za-z0-9_.:/@,+*-]+", text):
        return text
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\r", "\\r")
    return f'"{escaped}"'


def under_journald(stream: IO[str] | None = None) -> bool:
    """True when STREAM (default stderr) is connected to the journal ($JOURNAL_STREAM = dev:inode)."""
    value = os.environ.get("JOURNAL_STREAM", "")
    if not value:
        return False
    stream = stream or sys.stderr
    try:
        device, inode = (int(part) for part in value.split(":", 1))
        stat = os.fstat(stream.fileno())
    except (ValueError, OSError, AttributeError):
        return False
    return (stat.st_dev, stat.st_ino) == (device, inode)


class StructuredFormatter(logging.Formatter):
    """logfmt lines; JOURNAL=True drops the timestamp and adds a `<N>` priority prefix."""

    def __init__(self, *, journal: bool = False) -> None:
        super().__init__()
        self.journal = journal

    def format(self, record: logging.LogRecord) -> str:
        level = record.levelname.lower()
        pairs: list[tuple[str, Any]] = []
        if not self.journal:
            pairs.append(("ts", datetime.fromtimestamp(record.created, UTC)))
        pairs.append(("level", level))
        event = getattr(record, "event", None)
        if event:
            pairs.append(("event", event))
            pairs.extend(dict(getattr(record, "fields", None) or {}).items())
        else:
            pairs.append(("logger", record.name))
            pairs.append(("msg", record.getMessage()))
            pairs.extend(
                (key, value) for key, value in record.__dict__.items() if key not in _RECORD_ATTRIBUTES
            )
        if record.exc_info:
            pairs.append(("exc", self.formatException(record.exc_info).strip()))
        elif record.stack_info:
            pairs.append(("stack", record.stack_info.strip()))
        line = " ".join(f"{key}={format_value(value)}" for key, value in pairs)
        line = redact(line)
        if self.journal:
            line = f"<{_SYSLOG_PRIORITY.get(level, 6)}>{line}"
        return line


class _StructuredHandler(logging.StreamHandler[IO[str]]):
    """Writes to STREAM, or to whatever sys.stderr is at the time (tests swap it)."""

    def __init__(self, stream: IO[str] | None) -> None:
        super().__init__(stream or sys.stderr)
        self._fixed = stream is not None

    def emit(self, record: logging.LogRecord) -> None:
        if not self._fixed:
            self.stream = sys.stderr
        super().emit(record)


def configure_logging(
    level: str | int, *, stream: IO[str] | None = None, secrets: Iterable[str] = ()
) -> None:
    """Send every log record to STREAM (default stderr) as one structured line.

    Replaces the handler an earlier call installed; handlers others installed stay.
    """
    for secret in secrets:
        add_secret(secret)
    handler = _StructuredHandler(stream)
    handler.setFormatter(StructuredFormatter(journal=under_journald(stream or sys.stderr)))
    root = logging.getLogger()
    for old in list(root.handlers):
        if isinstance(old, _StructuredHandler):
            root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper() if isinstance(level, str) else level)
    # APScheduler logs every job start and end at INFO; our own source_run lines say more
    logging.getLogger("apscheduler").setLevel(max(root.level, logging.WARNING))
    # alembic announces each plugin it loads whenever the schema is checked
    logging.getLogger("alembic.runtime.plugins").setLevel(max(root.level, logging.WARNING))
