"""The sacct source: job attempts from Slurm accounting (slurmdbd).

One bulk, time-windowed `sacct -a -D` call per cluster and cycle (gentle on slurmdbd); a
window longer than `chunk_seconds` (a backfill) is read in several calls. The window starts
`rescan_seconds` before the stored cursor, because records change after a job ends; writes
are upserts on the natural key, so overlapping windows never duplicate. Each call's output is
stored in its own transaction, which also moves the cursor to the end of the call's window;
the next call is made and parsed while the previous output is written (store_documents).
The steps come in the same call (no -X unless `sources.sacct.steps` is false): they are not
attempts, but their TotalCPU and peak memory are kept per attempt.
"""

from __future__ import annotations

import argparse
import logging
import os
import queue
import threading
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING
from zoneinfo import ZoneInfo

from slurmtel.config import Config, SacctSourceConfig
from slurmtel.errors import ConfigError, SlurmtelError, SourceUnavailable
from slurmtel.sources.base import RunContext, RunResult, time_option
from slurmtel.sources.io import run_command
from slurmtel.threads import start_thread

if TYPE_CHECKING:
    from sqlalchemy import Connection

    from slurmtel.records import JobAttempt, Rejected, SchemaNotice
    from slurmtel.store.jobs import WriteStats

NAME = "sacct"
LOCAL_SCOPE = "local"

log = logging.getLogger(__name__)


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
        explicit_start = time_option(options.start, now, zone, "-S")
        explicit_end = time_option(options.end, now, zone, "-E")
        # None = no -M: sacct's own cluster
        clusters: list[str | None] = [*(_split(options.clusters) or config.sources.sacct.clusters)] or [None]
        result = RunResult()
        store_documents(
            ctx, self._documents(ctx, clusters, explicit_start, explicit_end, now, result), result
        )
        return result

    def _documents(
        self,
        ctx: RunContext,
        clusters: list[str | None],
        explicit_start: datetime | None,
        explicit_end: datetime | None,
        now: datetime,
        result: RunResult,
    ) -> Iterator[SacctDocument]:
        """One sacct call per cluster and chunk of the window, run as the pipeline asks for it."""
        from slurmtel.store.runs import get_cursor

        config = ctx.config.sources.sacct
        for cluster in clusters:
            scope = cluster or LOCAL_SCOPE
            with ctx.engine.connect() as conn:
                cursor = get_cursor(conn, NAME, scope)
            start = explicit_start or _window_start(config, cursor, now)
            end = explicit_end or now
            if end <= start:
                raise ConfigError(f"sacct window is empty: {start.isoformat()} .. {end.isoformat()}")
            result.window_start_at = min(filter(None, (result.window_start_at, start)))
            result.window_end_at = max(filter(None, (result.window_end_at, end)))
            for chunk_start, chunk_end in _chunks(start, end, config.chunk_seconds):
                origin = f"sacct -S {_sacct_time(chunk_start)} -E {_sacct_time(chunk_end)}" + (
                    f" -M {cluster}" if cluster else ""
                )
                captured_at = ctx.clock()
                # no local name for the output: it is freed once parsed, not at the next call
                yield SacctDocument(
                    origin,
                    run_sacct(config, chunk_start, chunk_end, cluster),
                    captured_at=captured_at,
                    format=config.format,
                    default_cluster=cluster or ctx.config.site.cluster,
                    # the cursor only moves when the caller did not pick the window by hand
                    cursor_scope=None if explicit_start or explicit_end else scope,
                    cursor_at=chunk_end,
                )

    def ingest(self, ctx: RunContext, path: Path, options: argparse.Namespace) -> RunResult:
        from slurmtel.parsers.sacct_json import parse_sacct_json
        from slurmtel.parsers.sacct_parsable import parse_sacct_parsable

        config = ctx.config
        try:
            raw = path.read_bytes()
        except OSError as exc:
            raise SourceUnavailable(f"cannot read {path}: {exc.strerror}") from exc
        fmt = options.input_format
        if fmt == "auto":
            fmt = "json" if raw.lstrip()[:1] == b"{" else "parsable"
        records: Sequence[JobAttempt | Rejected | SchemaNotice]
        if fmt == "json":
            records = parse_sacct_json(
                raw, origin=str(path), default_cluster=options.input_cluster or config.site.cluster
            )
        else:
            try:
                zone = ZoneInfo(options.input_timezone) if options.input_timezone else config.zone
            except Exception as exc:
                raise ConfigError(f"--timezone: unknown time zone '{options.input_timezone}'") from exc
            records = parse_sacct_parsable(
                # a byte that is not UTF-8 becomes U+FFFD, as in what sacct prints live: the
                # attempt keeps its GPU time
                raw.decode("utf-8", "replace"),
                origin=str(path),
                fields=_split(options.fields) or None,
                delimiter=options.delimiter or "|",
                timezone=zone,
                default_cluster=options.input_cluster or config.site.cluster,
            )
        records = _without_cluster(records, path)
        result = RunResult()
        # when a saved file was captured is not known: it never replaces a view as far along
        store_records(ctx, records, result, origin=str(path), cursor_scope=None, cursor_at=None)
        return result


def _without_cluster(
    records: Sequence[JobAttempt | Rejected | SchemaNotice], path: Path
) -> list[JobAttempt | Rejected | SchemaNotice]:
    """RECORDS, an attempt that names no cluster (when neither the input, --cluster nor
    site.cluster gives one) quarantined with the reason; ConfigError when none names one."""
    from slurmtel.records import JobAttempt, Rejected

    attempts = [r for r in records if isinstance(r, JobAttempt)]
    lacking = [a for a in attempts if not a.cluster]
    if not lacking:
        return list(records)
    if len(lacking) == len(attempts):
        raise ConfigError(f"{path} names no cluster: give --cluster NAME (or set site.cluster)")
    reason = "names no cluster (give --cluster NAME, or set site.cluster)"
    return [
        Rejected(NAME, str(path), f"job {r.job_id}", reason, repr(r)[:4096])
        if isinstance(r, JobAttempt) and not r.cluster
        else r
        for r in records
    ]


def store_records(
    ctx: RunContext,
    records: Sequence[JobAttempt | Rejected | SchemaNotice],
    result: RunResult,
    *,
    origin: str,
    cursor_scope: str | None,
    cursor_at: datetime | None,
) -> None:
    """Write attempts, quarantine the rest and move the cursor, in one transaction (records of
    unknown capture time: they replace only stored views they have come further than)."""
    totals = _Totals()
    _store(ctx, _Parsed(records, origin, cursor_scope, cursor_at, None), totals)
    totals.report(result)


@dataclass(frozen=True)
class SacctDocument:
    """One sacct call's output: what the pipeline parses and stores in one transaction."""

    origin: str
    raw: bytes
    # when the output was taken (None: unknown, a saved file)
    captured_at: datetime | None = None
    # "json" or "parsable" (sacct -P with SACCT_FIELDS, epoch times)
    format: str = "json"
    # the cluster of -P rows without one
    default_cluster: str = ""
    # where the source's cursor moves once the document is stored; None leaves it alone
    cursor_scope: str | None = None
    cursor_at: datetime | None = None


def parse_document(document: SacctDocument) -> Sequence[JobAttempt | Rejected | SchemaNotice]:
    """The records of one sacct output (ParseError when it cannot be read at all)."""
    from slurmtel.parsers.sacct_json import parse_sacct_json
    from slurmtel.parsers.sacct_parsable import SACCT_DELIMITER, parse_sacct_parsable

    if document.format == "json":
        return parse_sacct_json(
            document.raw, origin=document.origin, default_cluster=document.default_cluster
        )
    return parse_sacct_parsable(
        document.raw.decode("utf-8", "replace"),
        origin=document.origin,
        delimiter=SACCT_DELIMITER,
        timezone=UTC,
        default_cluster=document.default_cluster,
    )


def store_documents(ctx: RunContext, documents: Iterable[SacctDocument], result: RunResult) -> None:
    """Parse and store DOCUMENTS in order, each in its own transaction with its cursor move.

    A two-stage pipeline: while a writer thread stores one document (its COPY, upsert and
    linking are mostly PostgreSQL's work, on the other core, with the GIL released), this
    thread fetches and parses the next. At most one parsed document waits for the writer,
    so memory stays bounded by about three documents whatever the number of them.

    Documents are committed in order, and after a failed one none of the later ones are
    written: the cursor never passes a document that is not stored. When fetching or parsing
    a document fails, the documents before it are still stored, then the error is raised (an
    error of the writer first: it concerns an earlier document).
    """
    writer = _Writer(ctx)
    failure: Exception | None = None
    try:
        for document in documents:
            records = parse_document(document)
            writer.put(
                _Parsed(
                    records, document.origin, document.cursor_scope, document.cursor_at, document.captured_at
                )
            )
            del document, records  # the writer holds the records; the raw text can go
    except Exception as exc:
        failure = exc
    finally:
        writer.close()
    # what was stored before a failure counts too: the run's record says so
    writer.totals.report(result)
    if writer.error is not None and failure is not None and failure is not writer.error:
        writer.error.add_note(f"then, reading a later document: {type(failure).__name__}: {failure}")
    error = writer.error or failure
    if error is not None:
        if isinstance(error, SlurmtelError):
            error.partial_result = result
        raise error


@dataclass(frozen=True)
class _Parsed:
    records: Sequence[JobAttempt | Rejected | SchemaNotice]
    origin: str
    cursor_scope: str | None
    cursor_at: datetime | None
    captured_at: datetime | None


@dataclass
class _Totals:
    documents: int = 0
    read: int = 0
    attempts: int = 0
    inserted: int = 0
    updated: int = 0
    quarantined: int = 0
    # natural keys: overlapping windows (cursor and trailing rescan) read one attempt twice
    keys: set[tuple[str, int, datetime]] = field(default_factory=set)
    # the updated attempts (natural key -> first_seen_at), and when each of the run's writes
    # began (the first_seen_at of what it inserted): an attempt the run inserted, then
    # updated in a later sacct call, is new, not changed
    changed_keys: dict[tuple[str, int, datetime], datetime] = field(default_factory=dict)
    written_at: set[datetime] = field(default_factory=set)
    # the first few, for the run's notes
    rejected: list[Rejected] = field(default_factory=list)
    notices: list[SchemaNotice] = field(default_factory=list)

    def add(
        self,
        read: int,
        attempts: int,
        stats: WriteStats,
        rejected: list[Rejected],
        notices: list[SchemaNotice],
        keys: Iterable[tuple[str, int, datetime]] = (),
    ) -> None:
        self.documents += 1
        self.keys.update(keys)
        self.changed_keys.update(stats.updated_keys)
        if stats.written_at is not None:
            self.written_at.add(stats.written_at)
        self.notices.extend(notices)
        self.read += read
        self.attempts += attempts
        self.inserted += stats.inserted
        self.updated += stats.updated
        self.quarantined += len(rejected)
        self.rejected.extend(rejected[: 20 - len(self.rejected)])

    def report(self, result: RunResult) -> None:
        result.rows_read += self.read
        result.rows_written += self.inserted + self.updated
        result.rows_quarantined += self.quarantined
        result.notes.append(self.summary())
        result.notes.extend(f"quarantined {r.record_key}: {r.reason}" for r in self.rejected)
        self._schema_notes(result)

    def summary(self) -> str:
        """What was read, counted twice: the attempt records of every sacct call (overlapping
        windows repeat some), and the distinct attempts (natural keys) new, changed or not."""
        calls = f" in {self.documents} sacct calls" if self.documents > 1 else ""
        distinct = len(self.keys)
        # an attempt is inserted once (the natural key is unique), so the writes' counts add up
        new = self.inserted
        changed = sum(1 for first_seen in self.changed_keys.values() if first_seen not in self.written_at)
        figures = f"{new} new, {changed} changed, {distinct - new - changed} unchanged"
        if self.attempts == distinct:
            counted = f"{distinct} attempts read{calls}: {figures}"
        else:
            counted = f"{self.attempts} attempt records read{calls} ({distinct} distinct attempts: {figures})"
        return f"{counted}; {self.quarantined} quarantined"

    def _schema_notes(self, result: RunResult) -> None:
        from slurmtel.parsers.sacct_json import NEWEST_SCHEMA

        for notice in self.notices:
            result.unknown_schemas.append(notice.schema)
        for schema in sorted(set(result.unknown_schemas)):
            documents = result.unknown_schemas.count(schema)
            result.notes.append(
                f"warning: {documents} sacct output(s) in schema '{schema}', which this slurmtel does not "
                f"know: read as {NEWEST_SCHEMA}, the newest it knows"
            )


class _Writer:
    """The pipeline's second stage: stores parsed documents in order on its own thread."""

    def __init__(self, ctx: RunContext) -> None:
        self.ctx = ctx
        self.totals = _Totals()
        self.error: BaseException | None = None
        # one parsed document waiting while another is written
        self._queue: queue.Queue[_Parsed | None] = queue.Queue(maxsize=1)
        # a daemon thread: an exiting process rolls back the transaction it is in
        self._thread = threading.Thread(target=self._run, name="sacct-store", daemon=True)
        start_thread(self._thread)

    def put(self, parsed: _Parsed) -> None:
        if self.error is not None:
            raise self.error
        self._queue.put(parsed)

    def close(self) -> None:
        """Store what is queued (unless a write failed), then stop."""
        self._queue.put(None)
        self._thread.join()

    def _run(self) -> None:
        while (parsed := self._queue.get()) is not None:
            if self.error is not None:
                continue  # nothing after a failed document: the cursor must not pass it
            try:
                # the outcome classes once a run, in its first document's transaction
                _store(self.ctx, parsed, self.totals, sync_outcomes=self.totals.documents == 0)
            except BaseException as exc:
                self.error = exc


def write_attempts(
    conn: Connection,
    attempts: Iterable[JobAttempt],
    *,
    captured_at: datetime | None = None,
    unknown_capture: bool = False,
) -> WriteStats:
    """slurmtel.store.jobs.write_attempts, imported when a run writes (the CLI's other commands
    do not load the database stack for the sources' arguments)."""
    from slurmtel.store.jobs import write_attempts as write

    return write(conn, attempts, captured_at=captured_at, unknown_capture=unknown_capture)


def _store(ctx: RunContext, parsed: _Parsed, totals: _Totals, *, sync_outcomes: bool = True) -> None:
    from slurmtel.records import JobAttempt, Rejected, SchemaNotice
    from slurmtel.store.checks import rejections
    from slurmtel.store.jobs import sync_outcome_classes
    from slurmtel.store.quarantine import quarantine
    from slurmtel.store.runs import set_cursor

    records = parsed.records
    attempts = [r for r in records if isinstance(r, JobAttempt)]
    # a current sacct's output is attempts alone: no second and third pass over them
    rejected: list[Rejected] = []
    notices: list[SchemaNotice] = []
    if len(attempts) < len(records):
        rejected = [r for r in records if isinstance(r, Rejected)]
        notices = [r for r in records if isinstance(r, SchemaNotice)]
    for notice in notices:
        log.warning(
            "%s: sacct JSON schema '%s' is not one this slurmtel knows; read as %s",
            notice.origin,
            notice.schema,
            notice.read_as,
        )
    with ctx.engine.begin() as conn:
        if sync_outcomes:
            sync_outcome_classes(conn, ctx.config.outcomes.mapping())
        stats = write_attempts(
            conn, attempts, captured_at=parsed.captured_at, unknown_capture=parsed.captured_at is None
        )
        # what could not be stored is quarantined in the same transaction: the cursor moves on
        rejected += rejections(stats.refused, source=NAME, origin=parsed.origin)
        quarantine(conn, rejected)
        if parsed.cursor_scope is not None and parsed.cursor_at is not None:
            set_cursor(conn, NAME, parsed.cursor_scope, parsed.cursor_at)
    totals.add(
        len(records) - len(notices), len(attempts) - len(stats.refused), stats, rejected, notices, stats.keys
    )


def run_sacct(config: SacctSourceConfig, start: datetime, end: datetime, cluster: str | None) -> bytes:
    """Run one bulk sacct call for the window; raise SourceUnavailable when it fails."""
    from slurmtel.parsers.sacct_parsable import SACCT_DELIMITER, SACCT_FIELDS

    argv = [config.command, "-a", "-D", "-S", _sacct_time(start), "-E", _sacct_time(end)]
    if not config.steps:
        # allocations only: no step usage (CPU time, peak memory), a smaller answer
        argv.insert(3, "-X")
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


def _chunks(start: datetime, end: datetime, chunk_seconds: int) -> Iterator[tuple[datetime, datetime]]:
    """START..END in consecutive windows of at most CHUNK_SECONDS (0: one window)."""
    if chunk_seconds <= 0:
        yield start, end
        return
    step = timedelta(seconds=chunk_seconds)
    while start < end:
        yield start, min(start + step, end)
        start += step


def _window_start(config: SacctSourceConfig, cursor: datetime | None, now: datetime) -> datetime:
    if cursor is None:
        return now - timedelta(seconds=config.initial_lookback_seconds)
    return cursor - timedelta(seconds=config.rescan_seconds)


def _sacct_time(at: datetime) -> str:
    # sacct runs with TZ=UTC, so a naive UTC time means what it says
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S")


def _split(value: str | None) -> list[str]:
    return [v.strip() for v in (value or "").split(",") if v.strip()]
