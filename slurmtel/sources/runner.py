"""Run a source once and record the run, whatever happens.

Used by `slurmtel collect` and by the daemon, so both record runs the same way.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy.exc import OperationalError

from slurmtel.errors import DatabaseUnavailable, SlurmtelError, described
from slurmtel.sources.base import RunContext, RunResult
from slurmtel.store.runs import finish_run, mark_interrupted_runs, start_run

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunOutcome:
    source: str
    status: str  # ok | partial | error
    result: RunResult
    error_kind: str = ""
    message: str = ""


def run_recorded(ctx: RunContext, source: str, mode: str, work: Callable[[], RunResult]) -> RunOutcome:
    """Call WORK, record the run in collect_run, classify any failure.

    A run with quarantined records is 'partial'. Errors are returned, not raised, so one
    failing source never stops the others - except a database that is down, which the caller
    must see (nothing can be recorded then).
    """
    started = ctx.clock()
    # how long the run takes is measured, not read off the run's clock: site.clock may stand
    # still while a run works (a fixed instant, or the demo's clock file between moves)
    timer = time.monotonic()
    try:
        interrupted = mark_interrupted_runs(ctx.engine)
        lock = start_run(ctx.engine, source, mode, started)
    except OperationalError as exc:
        raise DatabaseUnavailable(f"cannot record the {source} run: {described(exc)}") from exc
    if interrupted:
        log.warning("runs %s were interrupted (their process ended before they did)", interrupted)
    try:
        return _run(ctx, source, lock.run_id, work, started, timer)
    finally:
        lock.release()


def _run(
    ctx: RunContext,
    source: str,
    run_id: int,
    work: Callable[[], RunResult],
    started: datetime,
    timer: float,
) -> RunOutcome:
    result = RunResult()
    status, kind, message = "ok", "", ""
    try:
        result = work()
        problems = [f"{result.rows_quarantined} record(s) quarantined"] if result.rows_quarantined else []
        problems += result.errors
        if problems:
            status, kind = "partial", "source_unavailable" if result.errors else ""
            message = "; ".join(problems)
    except SlurmtelError as exc:
        status, kind, message = "error", exc.kind, str(exc)
        if isinstance(exc.partial_result, RunResult):
            result = exc.partial_result
    except OperationalError as exc:
        status, kind, message = "error", DatabaseUnavailable.kind, f"database error: {described(exc)}"
    except Exception as exc:  # a bug: recorded and logged, never fatal to the daemon
        # one line for whoever reads the output, without SQL, parameters or row values; the
        # traceback at DEBUG, for a bug report
        log.error("source %s failed: %s", source, described(exc))
        log.debug("source %s failed", source, exc_info=True)
        status, kind, message = "error", "internal_error", described(exc)
    try:
        finish_run(
            ctx.engine,
            run_id,
            # its start on the run's clock plus the seconds it took, so that finished_at minus
            # started_at (`slurmtel runs`) is the run's real duration on any clock
            finished_at=started + timedelta(seconds=time.monotonic() - timer),
            status=status,
            error_kind=kind,
            message=message,
            rows_read=result.rows_read,
            rows_written=result.rows_written,
            rows_quarantined=result.rows_quarantined,
            window_start_at=result.window_start_at,
            window_end_at=result.window_end_at,
        )
    except OperationalError as exc:
        log.warning("could not record the end of the %s run: %s", source, described(exc))
    return RunOutcome(source, status, result, kind, message)
