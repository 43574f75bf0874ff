"""The sacct source: job attempts from Slurm accounting (slurmdbd).

One bulk, time-windowed `sacct -a -D` call per cluster and cycle (gentle on slurmdbd). The
window starts `rescan_seconds` before the stored cursor, because records change after a job
ends; writes are upserts on the natural key, so overlapping windows never duplicate.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

from slurmtel.config import Config, SacctSourceConfig
from slurmtel.errors import ConfigError, SourceUnavailable
from slurmtel.parsers.sacct_json import parse_sacct_json
from slurmtel.parsers.sacct_parsable import SACCT_DELIMITER, SACCT_FIELDS, parse_sacct_parsable
from slurmtel.records import JobAttempt, Rejected
from slurmtel.sources.base import RunContext, RunResult
from slurmtel.sources.io import run_command
from slurmtel.store.jobs import sync_outcome_classes, write_attempts
from slurmtel.store.quarantine import quarantine
from slurmtel.store.runs import get_cursor, set_cursor
from slurmtel.timeparse import parse_slurm_time

NAME = "sacct"
LOCAL_SCOPE = "local"


class SacctSource:
    name = NAME
    description = "job attempts from Slurm accounting (sacct --json -a -D)"

    def enabled(self, config: Config) -> bool:
        return config.sources.sacct.enabled

    def interval_seconds(self, config: Config) -> int:
        return config.sources.sacct.interval_seconds

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "-S",
            "--starttime",
            dest="start",
            default=None,
            help="window start (sacct forms: 2026-11-01, 2026-11-01T10:00:00, now-2hours); "
            "default: the cursor minus sources.sacct.rescan_seconds",
        )
        parser.add_argument("-E", "--endtime", dest="end", default=None, help="window end (default: now)")
        parser.add_argument(
            "-M",
            "--clusters",
            dest="clusters",
            default=None,
            help="comma-separated clusters (default: sources.sacct.clusters, else sacct's own)",
        )
        parser.add_argument(
            "--format",
            dest="input_format",
            choices=("auto", "json", "parsable"),
            default="auto",
            help="with --input: the capture's format (default: detect)",
        )
        parser.add_argument(
            "--fields",
            default=None,
            help="with --input of a -P capture without a header line: its comma-separated field names",
        )
        parser.add_argument(
            "--delimiter", default=None, help="with --input of a -P capture: the delimiter (default |)"
        )
        parser.add_argument(
            "--timezone",
            dest="input_timezone",
            default=None,
            help="with --input of a -P capture: the zone its times were printed in (default site.timezone)",
        )
        parser.add_argument(
            "--cluster",
            dest="input_cluster",
            default=None,
            help="with --input of a -P capture without a Cluster column: the cluster name (default site.cluster)",
        )

    def collect(self, ctx: RunContext, options: argparse.Namespace) -> RunResult:
        config = ctx.config
        now = ctx.clock().replace(microsecond=0)
        zone = config.zone
        explicit_start = _time_option(options.start, now, zone, "-S")
        explicit_end = _time_option(options.end, now, zone, "-E")
        # None = no -M: sacct's own cluster
        clusters: list[str | None] = [*(_split(options.clusters) or config.sources.sacct.clusters)] or [None]
        result = RunResult()
        for cluster in clusters:
            scope = cluster or LOCAL_SCOPE
            with ctx.engine.connect() as conn:
                cursor = get_cursor(conn, NAME, scope)
            start = explicit_start or _window_start(config.sources.sacct, cursor, now)
            end = explicit_end or now
            if end <= start:
                raise ConfigError(f"sacct window is empty: {start.isoformat()} .. {end.isoformat()}")
            raw = run_sacct(config.sources.sacct, start, end, cluster)
            origin = f"sacct -S {_sacct_time(start)} -E {_sacct_time(end)}" + (
                f" -M {cluster}" if cluster else ""
            )
            if config.sources.sacct.format == "json":
                records = parse_sacct_json(raw, origin=origin)
            else:
                records = parse_sacct_parsable(
                    raw.decode("utf-8", "replace"),
                    origin=origin,
                    delimiter=SACCT_DELIMITER,
                    timezone=UTC,
                    default_cluster=cluster or config.site.cluster,
                )
            # the cursor only moves when the caller did not pick the window by hand
            store_records(
                ctx,
                records,
                result,
                cursor_scope=None if explicit_start or explicit_end else scope,
                cursor_at=end,
            )
            result.window_start_at = min(filter(None, (result.window_start_at, start)))
            result.window_end_at = max(filter(None, (result.window_end_at, end)))
        return result

    def ingest(self, ctx: RunContext, path: Path, options: argparse.Namespace) -> RunResult:
        config = ctx.config
        try:
            raw = path.read_bytes()
        except OSError as exc:
            raise SourceUnavailable(f"cannot read {path}: {exc.strerror}") from exc
        fmt = options.input_format
        if fmt == "auto":
            fmt = "json" if raw.lstrip()[:1] == b"{" else "parsable"
        if fmt == "json":
            records = parse_sacct_json(raw, origin=str(path))
        else:
            try:
                zone = ZoneInfo(options.input_timezone) if options.input_timezone else config.zone
            except Exception as exc:
                raise ConfigError(f"--timezone: unknown time zone '{options.input_timezone}'") from exc
            records = parse_sacct_parsable(
                raw.decode("utf-8", "surrogateescape"),
                origin=str(path),
                fields=_split(options.fields) or None,
                delimiter=options.delimiter or "|",
                timezone=zone,
                default_cluster=options.input_cluster or config.site.cluster,
            )
        if any(isinstance(r, JobAttempt) and not r.cluster for r in records):
            raise ConfigError(f"{path} has no Cluster column: give --cluster NAME (or set site.cluster)")
        result = RunResult()
        store_records(ctx, records, result, cursor_scope=None, cursor_at=None)
        return result


def store_records(
    ctx: RunContext,
    records: Sequence[JobAttempt | Rejected],
    result: RunResult,
    *,
    cursor_scope: str | None,
    cursor_at: datetime | None,
) -> None:
    """Write attempts, quarantine the rest and move the cursor, in one transaction."""
    attempts = [r for r in records if isinstance(r, JobAttempt)]
    rejected = [r for r in records if isinstance(r, Rejected)]
    with ctx.engine.begin() as conn:
        sync_outcome_classes(conn, ctx.config.outcomes.mapping())
        stats = write_attempts(conn, attempts)
        quarantine(conn, rejected)
        if cursor_scope is not None and cursor_at is not None:
            set_cursor(conn, NAME, cursor_scope, cursor_at)
    result.rows_read += len(records)
    result.rows_written += stats.inserted + stats.updated
    result.rows_quarantined += len(rejected)
    result.notes.append(
        f"{len(attempts)} attempts read: {stats.inserted} new, {stats.updated} changed, "
        f"{stats.unchanged} unchanged; {len(rejected)} quarantined"
    )
    result.notes.extend(f"quarantined {r.record_key}: {r.reason}" for r in rejected[:20])


def run_sacct(config: SacctSourceConfig, start: datetime, end: datetime, cluster: str | None) -> bytes:
    """Run one bulk sacct call for the window; raise SourceUnavailable when it fails."""
    # -X: allocations only; the steps sacct would print are not attempts and only cost time
    argv = [config.command, "-a", "-D", "-X", "-S", _sacct_time(start), "-E", _sacct_time(end)]
    if cluster:
        argv += ["-M", cluster]
    env = dict(os.environ, TZ="UTC")
    if config.format == "json":
        argv.append("--json")
    else:
        # epoch times (no zone ambiguity), a delimiter that cannot occur, free text last
        env["SLURM_TIME_FORMAT"] = "%s"
        argv += ["-P", f"--delimiter={SACCT_DELIMITER}", "--format=" + ",".join(SACCT_FIELDS)]
    return run_command(argv, timeout_seconds=config.timeout_seconds, env=env)


def _window_start(config: SacctSourceConfig, cursor: datetime | None, now: datetime) -> datetime:
    if cursor is None:
        return now - timedelta(seconds=config.initial_lookback_seconds)
    return cursor - timedelta(seconds=config.rescan_seconds)


def _sacct_time(at: datetime) -> str:
    # sacct runs with TZ=UTC, so a naive UTC time means what it says
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S")


def _time_option(value: str | None, now: datetime, zone: ZoneInfo, flag: str) -> datetime | None:
    if not value:
        return None
    try:
        return parse_slurm_time(value, now=now, zone=zone)
    except ValueError as exc:
        raise ConfigError(f"{flag}: {exc}") from exc


def _split(value: str | None) -> list[str]:
    return [v.strip() for v in (value or "").split(",") if v.strip()]
