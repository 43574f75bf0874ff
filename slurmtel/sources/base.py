"""What a source is, and the context a run gets."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, tzinfo
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from slurmtel.config import Config
from slurmtel.errors import ConfigError
from slurmtel.timeparse import parse_slurm_time

if TYPE_CHECKING:
    from sqlalchemy import Engine


def utc_now() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True)
class RunContext:
    config: Config
    engine: Engine
    # the only clock a run reads (tests pass a fixed one)
    clock: Callable[[], datetime] = utc_now


@dataclass
class RunResult:
    rows_read: int = 0
    rows_written: int = 0
    rows_quarantined: int = 0
    window_start_at: datetime | None = None
    window_end_at: datetime | None = None
    # human-readable lines for the CLI and the run record
    notes: list[str] = field(default_factory=list)
    # parts that failed while the rest went on (an unreachable node); the run is 'partial'
    errors: list[str] = field(default_factory=list)
    # the schema names of documents read in a schema version slurmtel does not know (read by
    # the newest shape it knows), once per document: slurmtel_schema_unknown_total counts them
    unknown_schemas: list[str] = field(default_factory=list)


class Source(Protocol):
    """A source of records. One module per source under slurmtel/sources, registered once.

    A source may also define `check_options(options, config) -> None`: the checks of its own
    options that need no database (ConfigError), which `slurmtel collect` makes before it opens
    one (slurmtel.commands.argtypes.check_collect_arguments)."""

    name: str
    description: str

    def enabled(self, config: Config) -> bool: ...

    def interval_seconds(self, config: Config) -> int: ...

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """Options of `slurmtel collect NAME` beyond --once/--input; all must have defaults,
        because the daemon runs `collect` with the defaults."""

    def collect(self, ctx: RunContext, options: argparse.Namespace) -> RunResult:
        """One polling cycle: exactly what `slurmtel collect NAME --once` and the daemon run."""

    def ingest(self, ctx: RunContext, path: Path, options: argparse.Namespace) -> RunResult:
        """Store a saved capture instead of reading the live source (`--input FILE`)."""


def time_option(value: str | None, now: datetime, zone: tzinfo, flag: str) -> datetime | None:
    """A source's -S/-E as typed (sacct time forms in the site's zone), None when not given;
    ConfigError naming FLAG for a form Slurm refuses."""
    if not value:
        return None
    try:
        return parse_slurm_time(value, now=now, zone=zone)
    except ValueError as exc:
        raise ConfigError(f"{flag}: {exc}") from exc
