"""What "now" is for every command and the daemon: the wall clock, or `site.clock`'s.

- `site.clock = ""` (the default): the wall clock.
- `site.clock = "2026-12-04T00:00:00Z"` (ISO 8601 with a zone): a fixed now. Every report,
  `collect` and the daemon read this instant, so a report prints the same whenever it runs
  (tests, reproducing a report).
- `site.clock = "/abs/path/clock"`: a simulated world's clock (`slurmtel demo` writes one).
  The file holds an instant. Reports read it, so they print the same until it moves;
  `collect SOURCE --once` first moves it on by the source's interval (the time the daemon
  would have waited), and `run` moves it on with the wall clock while it runs. The demo's
  stand-in `sacct`/`scontrol` print the simulated cluster as of the instant in the file, so
  it goes on from where it stopped.

Not for production: a real cluster's records are dated by the wall clock.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from slurmtel.errors import ConfigError

if TYPE_CHECKING:
    from slurmtel.config import Config

Clock = Callable[[], datetime]


def parse_clock_setting(value: str) -> datetime | Path | None:
    """site.clock: None (the wall clock), a fixed instant, or the path of a clock file."""
    if not value:
        return None
    if value.startswith("/"):
        return Path(value)
    at = _instant(value)
    if at is None:
        raise ConfigError(
            f'site.clock must be "" (the wall clock), an ISO 8601 instant with a zone '
            f"(\"2026-12-04T00:00:00Z\") or the absolute path of a clock file, not '{value}'"
        )
    return at


def _instant(text: str) -> datetime | None:
    """TEXT as an ISO 8601 instant with a zone, in UTC; None when it is not one."""
    try:
        at = datetime.fromisoformat(text)
    except ValueError:
        return None
    return at.astimezone(UTC) if at.tzinfo is not None else None


def read_clock_file(path: Path) -> datetime:
    try:
        text = path.read_text().strip()
    except OSError as exc:
        raise ConfigError(f"site.clock: cannot read the clock file {path}: {exc.strerror}") from exc
    at = _instant(text)
    if at is None:
        raise ConfigError(f"site.clock: {path} must hold an ISO 8601 instant with a zone, not '{text}'")
    return at


def write_clock_file(path: Path, at: datetime) -> None:
    """Atomically: a stand-in reading the file sees the old instant or the new one."""
    write_atomically(path, (at.astimezone(UTC).isoformat() + "\n").encode())


def write_atomically(path: Path, content: bytes) -> None:
    """Write PATH so that a reader sees the old file or the new one, never half."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}")
    tmp.write_bytes(content)
    os.replace(tmp, path)


def site_clock(config: Config, wall: Clock, *, moving: bool = False) -> Clock:
    """The clock a command reads: WALL unless site.clock is set. MOVING (the daemon): a clock
    file moves on with the wall clock from its instant at the start, and is written as it goes."""
    setting = parse_clock_setting(config.site.clock)
    if setting is None:
        return wall
    if isinstance(setting, datetime):
        return _Fixed(setting)
    at = read_clock_file(setting)
    return _Moving(setting, at) if moving else _Fixed(at)


def advance_clock(config: Config, seconds: float) -> None:
    """`collect --once`: a clock file moves on by SECONDS (a fixed instant or the wall clock
    do not move)."""
    setting = parse_clock_setting(config.site.clock)
    if isinstance(setting, Path):
        write_clock_file(setting, read_clock_file(setting) + timedelta(seconds=seconds))


class _Fixed:
    def __init__(self, at: datetime) -> None:
        self.at = at

    def __call__(self) -> datetime:
        return self.at


class _Moving:
    def __init__(self, path: Path, at: datetime) -> None:
        self.path, self.at, self.t0 = path, at, time.monotonic()
        self.written = at
        self.lock = threading.Lock()

    def __call__(self) -> datetime:
        now = self.at + timedelta(seconds=round(time.monotonic() - self.t0, 3))
        with self.lock:
            if now > self.written:
                write_clock_file(self.path, now)
                self.written = now
        return now
