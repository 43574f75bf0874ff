"""The nccl source: fabric acceptance runs (nccl-tests / rccl-tests) and their history.

`collect nccl --input LOG [--job JOBID] [--label TEXT]` reads one saved log. `--once` (the
daemon's job) looks for acceptance jobs that ended: attempts whose job name matches
`sources.nccl.job_name_pattern` (a PostgreSQL regular expression) and ended within
`sources.nccl.lookback_seconds`, and reads each one's StdOut file once. The file's path comes
from sacct: `stdout_expanded` (Slurm 24.05+ JSON), else the `stdout` pattern, else `-o/--output`
on the submit line, else Slurm's default `slurm-%j.out` (`slurm-%A_%a.out` for an array task),
relative to the job's working directory, with its %j/%u/%x/%A/%a/... expanded. A file that is
not there (yet: shared file systems lag) is looked for again on later runs until
`sources.nccl.wait_seconds` after the job ended; then it is quarantined with the reason, as
is a log with no nccl-tests output in it.

Runs are linked to their job, to the job's nodes and to each node's driver, CUDA and VBIOS
versions from the inventory at the time. Idempotent: a log is stored once per (its bytes'
sha256, job), so re-reading it, or the daemon and a manual --input of the same file for the
same job, store nothing twice.
"""

from __future__ import annotations

import argparse
import hashlib
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from slurmtel.config import Config
from slurmtel.errors import ConfigError, SourceUnavailable
from slurmtel.sources.base import RunContext, RunResult

if TYPE_CHECKING:
    from sqlalchemy import Connection

    from slurmtel.store.fabric import JobRef

NAME = "nccl"
# attempts looked at per run: a backlog (the first run after enabling) is worked off over runs
MAX_JOBS_PER_RUN = 200


class NcclSource:
    name = NAME
    description = "NCCL/RCCL acceptance runs (nccl-tests, rccl-tests) from logs and acceptance jobs' StdOut"

    def enabled(self, config: Config) -> bool:
        return config.sources.nccl.enabled

    def interval_seconds(self, config: Config) -> int:
        return config.sources.nccl.interval_seconds

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--job",
            default=None,
            metavar="JOBID",
            help="with --input: the job the log is the StdOut of (its latest attempt in site.cluster)",
        )
        parser.add_argument(
            "--label",
            default="",
            metavar="TEXT",
            help="with --input: a label kept with the runs (e.g. 'after-maintenance', 'production-image')",
        )

    def collect(self, ctx: RunContext, options: argparse.Namespace) -> RunResult:
        from sqlalchemy.exc import DataError, ProgrammingError

        from slurmtel.records import Rejected
        from slurmtel.store.fabric import pickup_candidates, record_pickup
        from slurmtel.store.quarantine import quarantine

        cfg = ctx.config.sources.nccl
        now = ctx.clock()
        result = RunResult()
        try:
            with ctx.engine.connect() as conn:
                jobs = pickup_candidates(
                    conn,
                    name_pattern=cfg.job_name_pattern,
                    ended_after=now - timedelta(seconds=cfg.lookback_seconds),
                    now=now,
                    limit=MAX_JOBS_PER_RUN,
                )
        except (DataError, ProgrammingError) as exc:
            raise ConfigError(
                f"sources.nccl.job_name_pattern {cfg.job_name_pattern!r} is not a regular expression "
                f"PostgreSQL accepts: {exc.orig}"
            ) from exc
        waiting = 0
        for job in jobs:
            path = stdout_path_of(job)
            found = _read_log(path, cfg.max_log_bytes)
            with ctx.engine.begin() as conn:
                if isinstance(found, _Missing):
                    ended = job.end_at or now
                    if (now - ended).total_seconds() < cfg.wait_seconds:
                        record_pickup(
                            conn, job, status="waiting", path=str(path), message=found.reason, at=now
                        )
                        waiting += 1
                        continue
                    reason = f"{found.reason} ({cfg.wait_seconds} s after the job ended)"
                    rejected = Rejected(NAME, str(path), f"job {job.job_id}", reason, "")
                    quarantine(conn, [rejected])
                    record_pickup(conn, job, status="quarantined", path=str(path), message=reason, at=now)
                    result.rows_quarantined += 1
                    result.notes.append(f"job {job.job_id}: {reason}")
                    continue
                stored = _store_log(conn, found, str(path), job, "", now, result)
                record_pickup(
                    conn,
                    job,
                    status="stored" if stored else "quarantined",
                    path=str(path),
                    message="" if stored else "no nccl-tests output",
                    at=now,
                )
        result.notes.append(
            f"{len(jobs)} acceptance job(s) looked at"
            + (f", {waiting} StdOut file(s) not there yet" if waiting else "")
        )
        return result

    def ingest(self, ctx: RunContext, path: Path, options: argparse.Namespace) -> RunResult:
        from slurmtel.store.fabric import find_job

        found = _read_log(path, ctx.config.sources.nccl.max_log_bytes)
        if isinstance(found, _Missing):
            raise SourceUnavailable(f"cannot read {path}: {found.reason}")
        result = RunResult()
        with ctx.engine.begin() as conn:
            job = None
            if options.job:
                attempts = find_job(conn, options.job, ctx.config.site.cluster)
                if not attempts:
                    raise ConfigError(
                        f"--job {options.job}: no such job in the database (collect sacct first)"
                    )
                job = attempts[0]
            _store_log(conn, found, str(path), job, options.label or "", ctx.clock(), result)
        return result


def stdout_path_of(job: JobRef) -> Path:
    """Where the batch step's StdOut went (see the module docstring for the order)."""
    from slurmtel.parsers.slurm_common import (
        DEFAULT_ARRAY_OUTPUT,
        DEFAULT_OUTPUT,
        expand_output_pattern,
        output_option,
    )

    if job.stdout_path:
        path = job.stdout_path
    else:
        pattern = job.stdout_pattern or output_option(job.submit_line)
        if not pattern:
            pattern = DEFAULT_ARRAY_OUTPUT if job.array_task_id is not None else DEFAULT_OUTPUT
        path = expand_output_pattern(
            pattern,
            job_id_raw=job.job_id_raw,
            user=job.user,
            name=job.name,
            array_job_id=job.array_job_id,
            array_task_id=job.array_task_id,
            first_node=job.nodes[0] if job.nodes else "",
        )
    resolved = Path(path)
    if not resolved.is_absolute() and job.work_dir:
        resolved = Path(job.work_dir) / resolved
    return resolved


@dataclass(frozen=True)
class _Log:
    raw: bytes


@dataclass(frozen=True)
class _Missing:
    reason: str


def _read_log(path: Path, max_bytes: int) -> _Log | _Missing:
    try:
        size = path.stat().st_size
        if not path.is_file():
            return _Missing(f"{path} is not a regular file")
        if size > max_bytes:
            return _Missing(f"{path} is {size} bytes, over sources.nccl.max_log_bytes ({max_bytes})")
        with path.open("rb") as handle:
            return _Log(handle.read(max_bytes + 1)[:max_bytes])
    except FileNotFoundError:
        return _Missing(f"StdOut file {path} not found")
    except PermissionError:
        return _Missing(f"StdOut file {path} is not readable by this user")
    except OSError as exc:
        return _Missing(f"cannot read {path}: {exc.strerror}")


def _store_log(
    conn: Connection, log: _Log, origin: str, job: JobRef | None, label: str, now: datetime, result: RunResult
) -> bool:
    """Parse and store one log; False when it held no run (then it is quarantined)."""
    import orjson
    from sqlalchemy.exc import DataError

    from slurmtel.parsers.nccl import parse_nccl_tests
    from slurmtel.records import NcclRun, Rejected
    from slurmtel.store.fabric import NcclLogWrite, write_nccl_log
    from slurmtel.store.quarantine import quarantine

    records = parse_nccl_tests(log.raw, origin=origin)
    runs = [r for r in records if isinstance(r, NcclRun)]
    rejected = [r for r in records if isinstance(r, Rejected)]
    result.rows_read += len(records)
    who = f"job {job.job_id}" if job else origin
    if rejected:
        if job is not None:
            rejected = [Rejected(r.source, r.origin, f"job {job.job_id}", r.reason, r.raw) for r in rejected]
        quarantine(conn, rejected)
        result.rows_quarantined += len(rejected)
        result.notes.extend(f"{who}: quarantined: {r.reason}" for r in rejected)
    if not runs:
        return False
    run_at = (job.end_at or job.start_at or now) if job else now
    # a value no column holds (a size beyond bigint, a NUL in a host name): the log is
    # quarantined with the database's reason, the run goes on
    savepoint = conn.begin_nested()
    try:
        stats = write_nccl_log(
            conn,
            NcclLogWrite(
                log_sha256=hashlib.sha256(log.raw).hexdigest(),
                origin=origin,
                bytes=len(log.raw),
                runs=runs,
                job=job,
                label=label,
                run_at=run_at,
            ),
        )
        savepoint.commit()
    except (DataError, orjson.JSONEncodeError) as exc:
        savepoint.rollback()
        error = str(getattr(exc, "orig", None) or exc).strip().split("\n", 1)[0]
        reason = f"cannot be stored: {error}"
        key = f"job {job.job_id}" if job else "log"
        quarantine(conn, [Rejected(NAME, origin, key, reason, log.raw.decode("utf-8", "replace"))])
        result.rows_quarantined += 1
        result.notes.append(f"{who}: quarantined: {reason}")
        return False
    result.rows_written += stats.runs
    if not stats.new:
        result.notes.append(f"{who}: already stored")
    for run in runs:
        what = run.collective or "collective ?"
        avg = f"{run.avg_busbw_gbps:g} GB/s" if run.avg_busbw_gbps is not None else "no busbw"
        why = f" ({'; '.join(run.reasons)})" if run.reasons else ""
        result.notes.append(f"{who}: {what} on {run.ranks or '?'} ranks, {avg}, {run.status}{why}")
    return True
