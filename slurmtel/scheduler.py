"""The daemon's schedule (APScheduler 3): what `slurmtel run` runs, and when.

One job per enabled source at its own interval, each exactly `slurmtel collect NAME --once`
(run_recorded + the source's collect with its default options); an attribution job; a
partition maintenance and retention job; and, when chargeback.close_day_of_month is set, a
job that closes the previous month. Every job starts once right away, runs alone
(max_instances=1) and collapses missed runs into one (coalesce).

A failing job never stops the others. A job whose run failed (database unavailable, source
unavailable, any error) backs off: it waits its interval x 2^(failures-1), at most
daemon.backoff_max_seconds, and the scheduled runs inside that wait are skipped (counted in
slurmtel_job_runs{result="skipped"}, the wait shown in slurmtel_job_backoff_seconds).

The EpilogSlurmctld hook calls `job_ended`: the next sacct run moves to
daemon.job_end_delay_seconds from now (job ends within that window share one run; one that
arrives during a run gets a run right after it), so a finished job is stored within a minute.
The telemetry sources (agent, dcgm, prometheus) are pulled at the same time, and again once
the job's last summary window has closed (agent.summary_window_seconds after the end, plus
the delay); each of those runs and the sacct run is followed by an attribution run, so the
job's GPU utilisation is there within a minute too, not only its sacct record.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from apscheduler.executors.pool import ThreadPoolExecutor
from apscheduler.schedulers.background import BackgroundScheduler
from sqlalchemy.exc import DBAPIError, SQLAlchemyError

from slurmtel.errors import DatabaseUnavailable, SlurmtelError, described
from slurmtel.logs import log_event
from slurmtel.metrics import DaemonMetrics, JobStatus
from slurmtel.records import NEWEST_KNOWN_SCHEMA
from slurmtel.sources import SOURCES, default_options
from slurmtel.sources.base import RunContext, Source
from slurmtel.sources.runner import run_recorded
from slurmtel.timeparse import month_bounds

log = logging.getLogger(__name__)

SOURCE_JOB_PREFIX = "source:"
SACCT_JOB = SOURCE_JOB_PREFIX + "sacct"
ATTRIBUTION_JOB = "attribution"
MAINTENANCE_JOB = "maintenance"
# the sources pulled again after a job end, so that attribution has the job's last windows
TELEMETRY_JOBS = tuple(SOURCE_JOB_PREFIX + name for name in ("agent", "dcgm", "prometheus"))
# a telemetry or sacct run that starts this long after the follow-up pull was due still
# triggers attribution (the follow-up may wait for a pull that was running)
FOLLOW_UP_SLACK_SECONDS = 30.0
CHARGEBACK_JOB = "chargeback"
# the [actions] rules: after each attribution run (and on the attribution interval, for retries)
ACTIONS_JOB = "actions"
CHARGEBACK_CHECK_SECONDS = 3600
DATABASE_UNAVAILABLE = DatabaseUnavailable.kind

# what a job returns: None = it worked, else the error class of its failure
Failure = str | None


@dataclass
class JobState:
    job: str
    interval_seconds: float
    failures: int = 0
    # monotonic time before which scheduled runs are skipped (the backoff)
    retry_at: float = 0.0
    running_since: float | None = None
    # when the epilog hook (or a run after a job end) last asked for this job, and how soon
    poked_at: float | None = None
    poke_delay: float = 0.0


class Schedule:
    def __init__(
        self,
        ctx: RunContext,
        metrics: DaemonMetrics,
        *,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ctx = ctx
        self.metrics = metrics
        self.monotonic = monotonic
        self.states: dict[str, JobState] = {}
        self._work: dict[str, Callable[[], Failure]] = {}
        self._lock = threading.Lock()
        self._closed_months: set[str] = set()
        # monotonic time of the last job end the hook reported
        self._job_end_at: float | None = None
        config = ctx.config
        for source in enabled_sources(ctx):
            self._add(
                SOURCE_JOB_PREFIX + source.name, source.interval_seconds(config), self._source_job(source)
            )
        if config.attribution.enabled:
            self._add(ATTRIBUTION_JOB, config.attribution.interval_seconds, self._attribute)
        self._add(MAINTENANCE_JOB, config.daemon.maintenance_interval_seconds, self._maintain)
        if config.chargeback.close_day_of_month:
            self._add(CHARGEBACK_JOB, CHARGEBACK_CHECK_SECONDS, self._close_previous_month)
        if config.actions.enabled:
            self._add(ACTIONS_JOB, config.attribution.interval_seconds, self._act)
        # one thread per job: a slow sacct never delays another job
        self.scheduler = BackgroundScheduler(
            timezone=UTC, executors={"default": ThreadPoolExecutor(max_workers=len(self.states) + 1)}
        )
        now = datetime.now(UTC)
        for job, state in self.states.items():
            self.scheduler.add_job(
                self.run_job,
                "interval",
                seconds=state.interval_seconds,
                args=[job],
                id=job,
                name=job,
                next_run_time=now,
                max_instances=1,
                coalesce=True,
                # a run that could not start on time still runs up to one interval late
                misfire_grace_time=max(1, int(state.interval_seconds)),
            )
        metrics.job_status = self.job_status

    def _add(self, job: str, interval_seconds: float, work: Callable[[], Failure]) -> None:
        self.states[job] = JobState(job, float(interval_seconds))
        self._work[job] = work

    # lifecycle --------------------------------------------------------------------------

    def start(self) -> None:
        self.scheduler.start()

    def stop(self, timeout_seconds: float) -> list[str]:
        """Start no more runs; wait up to TIMEOUT_SECONDS for running ones. Returns those still running."""
        if self.scheduler.running:
            self.scheduler.shutdown(wait=False)
        deadline = self.monotonic() + timeout_seconds
        while True:
            running = self.running_jobs()
            if not running or self.monotonic() >= deadline:
                return running
            time.sleep(0.05)

    def running_jobs(self) -> list[str]:
        with self._lock:
            return sorted(s.job for s in self.states.values() if s.running_since is not None)

    def unhealthy_reason(self) -> str | None:
        """For the systemd watchdog: None while the scheduler thread lives and no job is stuck."""
        thread = getattr(self.scheduler, "_thread", None)
        if not self.scheduler.running or thread is None or not thread.is_alive():
            return "the scheduler thread is gone"
        limit = self.ctx.config.daemon.stuck_job_seconds
        if limit:
            now = self.monotonic()
            with self._lock:
                stuck = sorted(
                    s.job
                    for s in self.states.values()
                    if s.running_since is not None and now - s.running_since > limit
                )
            if stuck:
                return f"running longer than daemon.stuck_job_seconds ({limit} s): {', '.join(stuck)}"
        return None

    def job_status(self) -> list[JobStatus]:
        now = self.monotonic()
        with self._lock:
            return [JobStatus(s.job, s.failures, s.retry_at - now) for s in self.states.values()]

    # the epilog hook ---------------------------------------------------------------------

    def job_ended(self, job_id: str) -> None:
        self.metrics.job_end_notifications.inc()
        state = self.states.get(SACCT_JOB)
        log_event(log, "job_ended", job_id=job_id or "-", sacct=state is not None)
        if state is None:
            return
        with self._lock:
            self._job_end_at = self.monotonic()
        delay = self.ctx.config.daemon.job_end_delay_seconds
        for job in (SACCT_JOB, *TELEMETRY_JOBS):
            self._poke(job, delay)

    def _poke(self, job: str, delay: float) -> None:
        """Run JOB DELAY seconds from now, or right after the run now under way."""
        state = self.states.get(job)
        if state is None:
            return
        with self._lock:
            state.poked_at, state.poke_delay = self.monotonic(), delay
            if state.running_since is not None:
                return  # _settle schedules another run when this one ends
        self._run_soon(job, delay)

    def _after_job_end(self, state: JobState, started: float) -> list[tuple[str, float]]:
        """The runs a finished run of STATE's job asks for after a job end: attribution after
        a sacct or telemetry run that started since the end (until the follow-up pull is in),
        and a telemetry source's follow-up pull once the job's last summary window has closed."""
        with self._lock:
            ended = self._job_end_at
        if ended is None or started < ended or state.job not in (SACCT_JOB, *TELEMETRY_JOBS):
            return []
        config = self.ctx.config
        follow_up_at = ended + config.agent.summary_window_seconds + config.daemon.job_end_delay_seconds
        wanted: list[tuple[str, float]] = []
        if state.job in TELEMETRY_JOBS and started < follow_up_at:
            wanted.append((state.job, max(0.0, follow_up_at - self.monotonic())))
        if started <= follow_up_at + FOLLOW_UP_SLACK_SECONDS:
            wanted.append((ATTRIBUTION_JOB, 0.0))
        return wanted

    def _run_soon(self, job: str, delay: float) -> None:
        target = datetime.now(UTC) + timedelta(seconds=delay)
        scheduled = self.scheduler.get_job(job)
        if scheduled is not None and scheduled.next_run_time is not None and scheduled.next_run_time > target:
            scheduled.modify(next_run_time=target)

    # running a job -----------------------------------------------------------------------

    def run_job(self, job: str) -> None:
        """Run JOB now, as the scheduler does (inside a backoff: skip it)."""
        state = self.states[job]
        started = self.monotonic()
        with self._lock:
            if started < state.retry_at:
                self.metrics.job_runs.labels(job=job, result="skipped").inc()
                log.debug("%s: backing off for %.1f s more", job, state.retry_at - started)
                return
            state.running_since = started
        failure: Failure
        try:
            failure = self._work[job]()
        except DatabaseUnavailable as exc:
            failure = DATABASE_UNAVAILABLE
            log_event(log, "job_failed", logging.ERROR, job=job, error_kind=failure, message=str(exc))
        except (DBAPIError, SQLAlchemyError) as exc:
            failure = DATABASE_UNAVAILABLE if _is_connection_error(exc) else "database_error"
            log_event(log, "job_failed", logging.ERROR, job=job, error_kind=failure, message=_db_message(exc))
        except SlurmtelError as exc:
            failure = exc.kind
            log_event(log, "job_failed", logging.ERROR, job=job, error_kind=failure, message=str(exc))
        except Exception as exc:  # a bug: one line (the traceback at DEBUG), never fatal to the daemon
            failure = "internal_error"
            log.error("job %s failed: %s (a bug; DEBUG logs the traceback)", job, described(exc))
            log.debug("job %s failed", job, exc_info=True)
        self._settle(state, started, failure)

    def _settle(self, state: JobState, started: float, failure: Failure) -> None:
        if failure in (DATABASE_UNAVAILABLE, "database_error"):
            self.metrics.database_errors.labels(job=state.job).inc()
            self.metrics.set_database_up(False)
        elif failure != "internal_error":
            # the job reached the database (a source that failed still recorded its run)
            self.metrics.set_database_up(True)
        self.metrics.job_runs.labels(job=state.job, result="failed" if failure else "ok").inc()
        rerun = False
        with self._lock:
            state.running_since = None
            if failure is None:
                if state.failures:
                    log_event(log, "recovered", job=state.job, after_failures=state.failures)
                state.failures, state.retry_at = 0, 0.0
            else:
                state.failures += 1
                delay = backoff_seconds(
                    state.interval_seconds, state.failures, self.ctx.config.daemon.backoff_max_seconds
                )
                # half an interval of slack, so the tick that ends the wait is not skipped by jitter
                state.retry_at = started + delay - state.interval_seconds / 2
                log_event(
                    log,
                    "backoff",
                    logging.WARNING,
                    job=state.job,
                    failures=state.failures,
                    error_kind=failure,
                    retry_in_seconds=round(delay, 1),
                )
            rerun = state.poked_at is not None and state.poked_at >= started and failure is None
        if rerun:
            self._run_soon(state.job, state.poke_delay)
        if failure is None:
            for job, delay in self._after_job_end(state, started):
                self._poke(job, delay)

    # the jobs ----------------------------------------------------------------------------

    def _source_job(self, source: Source) -> Callable[[], Failure]:
        def run_source() -> Failure:
            ctx = self.ctx
            t0 = time.monotonic()
            try:
                outcome = run_recorded(
                    ctx, source.name, "scheduled", lambda: source.collect(ctx, default_options(source))
                )
            except DatabaseUnavailable as exc:
                # nothing could be recorded: the run is only in the metrics and the log
                seconds = time.monotonic() - t0
                self.metrics.source_run(
                    source.name, status="error", error_kind=DATABASE_UNAVAILABLE, seconds=seconds
                )
                log_event(
                    log,
                    "source_run",
                    logging.ERROR,
                    source=source.name,
                    status="error",
                    error_kind=DATABASE_UNAVAILABLE,
                    seconds=seconds,
                    message=str(exc),
                )
                return DATABASE_UNAVAILABLE
            seconds = time.monotonic() - t0
            result = outcome.result
            self.metrics.source_run(
                source.name,
                status=outcome.status,
                error_kind=outcome.error_kind,
                seconds=seconds,
                rows_read=result.rows_read,
                rows_written=result.rows_written,
                rows_quarantined=result.rows_quarantined,
                unknown_schemas=result.unknown_schemas,
            )
            fields: dict[str, object] = {
                "source": source.name,
                "status": outcome.status,
                "rows_read": result.rows_read,
                "rows_written": result.rows_written,
                "rows_quarantined": result.rows_quarantined,
                "seconds": seconds,
            }
            if outcome.error_kind or outcome.message:
                fields.update(error_kind=outcome.error_kind, message=outcome.message)
            level = {"ok": logging.INFO, "partial": logging.WARNING}.get(outcome.status, logging.ERROR)
            if result.unknown_schemas:
                schemas = ",".join(sorted(set(result.unknown_schemas)))
                fields.update(unknown_schemas=schemas)
                # a newer Slurm read by an older shape: the data may be incomplete, say so loudly
                level = max(level, logging.WARNING)
                if not outcome.message:
                    fields.update(
                        message=f"read {schemas} by the newest known shape {NEWEST_KNOWN_SCHEMA} "
                        "(a Slurm newer than this slurmtel: upgrade slurmtel)"
                    )
            log_event(log, "source_run", level, **fields)
            if outcome.status == "error":
                return outcome.error_kind or "error"
            return None

        return run_source

    def _attribute(self) -> Failure:
        from slurmtel.attribution import run_attribution

        t0 = time.monotonic()
        try:
            result = run_attribution(self.ctx.engine, self.ctx.config, now=self.ctx.clock())
        except Exception:
            self.metrics.attribution_run(ok=False, seconds=time.monotonic() - t0)
            raise
        seconds = time.monotonic() - t0
        self.metrics.attribution_run(ok=True, seconds=seconds, attempts=result.attempts)
        # the rules act on what this run folded in
        self._poke(ACTIONS_JOB, 0.0)
        log_event(
            log,
            "attribution_run",
            status="ok",
            attempts=result.attempts,
            rows=result.rows,
            batches=result.batches,
            seconds=seconds,
        )
        return None

    def _act(self) -> Failure:
        """Evaluate the [actions] rules, record and deliver (slurmtel.actions.cycle)."""
        from slurmtel.actions.cycle import run_cycle

        run_cycle(
            self.ctx.engine,
            self.ctx.config,
            now=self.ctx.clock(),
            decided_by=f"slurmtel run on {socket.gethostname()} (pid {os.getpid()})",
            metrics=self.metrics.actions,
            clock=self.ctx.clock,
        )
        return None

    def _maintain(self) -> Failure:
        """The sample store's days ahead; drop those past retention and their batches."""
        from slurmtel.store.attribution import delete_parts_before
        from slurmtel.store.daemon import delete_batches_before
        from slurmtel.store.fabric import delete_counter_windows_before
        from slurmtel.store.hostside import delete_host_windows_before
        from slurmtel.store.samples import sample_store

        telemetry = self.ctx.config.telemetry
        today = self.ctx.clock().astimezone(UTC).date()  # partitions are UTC days
        cutoff = today - timedelta(days=telemetry.retention_days)
        with self.ctx.engine.begin() as conn:
            created, dropped = sample_store(self.ctx.config).maintain(
                conn,
                first_day=today,
                last_day=today + timedelta(days=telemetry.partitions_ahead_days),
                cutoff=cutoff,
            )
            cutoff_at = datetime(cutoff.year, cutoff.month, cutoff.day, tzinfo=UTC)
            batches = delete_batches_before(conn, cutoff_at)
            # the fabric counters' windows live as long as the raw summaries
            counter_windows = delete_counter_windows_before(conn, cutoff_at)
            # and the host signals of the idle causes (issue 26)
            host_windows = delete_host_windows_before(conn, cutoff_at)
            # and the attribution's hour slices of those windows
            slices = delete_parts_before(conn, cutoff_at)
        self.metrics.partitions.labels(action="created").inc(len(created))
        self.metrics.partitions.labels(action="dropped").inc(len(dropped))
        self.metrics.batches_deleted.inc(batches)
        log_event(
            log,
            "maintenance",
            partitions_created=len(created),
            partitions_dropped=len(dropped),
            batches_deleted=batches,
            counter_windows_deleted=counter_windows,
            host_windows_deleted=host_windows,
            attribution_slices_deleted=slices,
            retention_cutoff=cutoff.isoformat(),
        )
        return None

    def _close_previous_month(self) -> Failure:
        # the chargeback close (slurmtel/chargeback.py); the daemon only adds the sacct check
        from slurmtel.chargeback import CloseRefused, close_due_month, month_due_for_closing
        from slurmtel.store.daemon import source_cursors

        config = self.ctx.config
        now = self.ctx.clock()
        month = month_due_for_closing(config, now)
        if month is None or month in self._closed_months:
            return None
        if config.sources.sacct.enabled:
            # close only what sacct has collected: every cluster's cursor past the month's end
            _, month_end = month_bounds(month, config.zone)
            with self.ctx.engine.connect() as conn:
                cursors = source_cursors(conn, "sacct")
            if not cursors or min(cursors.values()) < month_end:
                log_event(
                    log, "chargeback_waiting", month=month, reason="sacct has not collected past its end"
                )
                return None
        try:
            closed = close_due_month(self.ctx.engine, config, now)
        except CloseRefused as exc:
            # no usage, or a later month closed: only a person closes it (--close --force)
            self._closed_months.add(month)  # said once per daemon run, not every pass
            log_event(log, "chargeback_close_refused", logging.WARNING, month=month, reason=str(exc))
            return None
        self._closed_months.add(month)  # closed now, or by someone before
        if closed is not None:
            self.metrics.chargeback_closed.inc()
            log_event(log, "chargeback_closed", month=closed.month, csv_sha256=closed.csv_sha256)
        return None


def enabled_sources(ctx: RunContext) -> list[Source]:
    return [source for source in SOURCES.values() if source.enabled(ctx.config)]


def backoff_seconds(interval_seconds: float, failures: int, cap_seconds: float) -> float:
    """interval x 2^(failures-1), at most CAP_SECONDS, never less than one interval."""
    delay = interval_seconds * 2 ** min(max(failures - 1, 0), 30)
    return max(interval_seconds, min(delay, cap_seconds))


def _is_connection_error(exc: SQLAlchemyError) -> bool:
    from sqlalchemy.exc import OperationalError

    return isinstance(exc, OperationalError) or bool(getattr(exc, "connection_invalidated", False))


def _db_message(exc: SQLAlchemyError) -> str:
    """The driver's error without SQLAlchemy's statement and parameter dump, nor row values."""
    return described(exc)
