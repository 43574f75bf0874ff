"""Where write_attempts' time goes, statement by statement: client and backend CPU per job.

Parses N generated jobs (documents of --batch, as benchmarks/sacct_ingest.py does) up front,
then stores them with write_attempts one document per transaction, in this thread (no
pipeline: the parse is not measured), twice: into an empty job_attempt ("ingest") and again
over the stored rows ("again", the rescan). For each round it prints write_attempts' CPU per
job (client: this process; backend: the connection's PostgreSQL backend, from /proc) and each
statement's share, the staging COPY included.

    python benchmarks/sacct_store_statements.py [--jobs 40000] [--batch 20000] [--dsn URL]

The backend figures need the server on this machine (/proc of the backend); they move in
steps of one clock tick (10 ms: 0.25 us a job at 40,000 jobs).
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

from cputime import process_cpu
from scratch import scratch_database
from sqlalchemy import Connection, event, text

import slurmtel.store.jobs as jobs
from slurmtel.parsers.sacct_json import parse_sacct_json
from slurmtel.records import JobAttempt
from slurmtel.simulate import render_sacct_json, synthetic_jobs


def _client() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _backend(pid: int | None) -> float:
    cpu = process_cpu(pid, comm="postgres") if pid else None
    return cpu or 0.0


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=40_000)
    parser.add_argument("--batch", type=int, default=20_000)
    parser.add_argument("--dsn", default=None)
    args = parser.parse_args()

    # statement label -> [count, wall, client CPU, backend CPU]
    spent: dict[str, list[float]] = {}
    started: list[tuple[float, float, float]] = []

    def add(label: str, wall: float, client: float, backend: float) -> None:
        entry = spent.setdefault(label, [0, 0.0, 0.0, 0.0])
        entry[0] += 1
        entry[1] += wall
        entry[2] += client
        entry[3] += backend

    with scratch_database(args.dsn) as engine:
        generated = list(synthetic_jobs(args.jobs, start=datetime(2026, 11, 1, tzinfo=UTC)))
        documents = [
            [
                r
                for r in parse_sacct_json(render_sacct_json(generated[i : i + args.batch]), origin="b")
                if isinstance(r, JobAttempt)
            ]
            for i in range(0, len(generated), args.batch)
        ]
        del generated

        @event.listens_for(engine, "before_cursor_execute")
        def before(conn: Any, cursor: Any, statement: str, *_: Any) -> None:
            started.append((time.perf_counter(), _client(), _backend(conn.info.get("pid"))))

        @event.listens_for(engine, "after_cursor_execute")
        def after(conn: Any, cursor: Any, statement: str, *_: Any) -> None:
            wall, client, backend = started.pop()
            label = " ".join(statement.split())[:60]
            pid = conn.info.get("pid")
            add(label, time.perf_counter() - wall, _client() - client, _backend(pid) - backend)

        copy_rows = jobs.copy_rows

        def timed_copy(
            conn: Connection, table: str, columns: Sequence[tuple[str, str]], rows: Iterable[Sequence[Any]]
        ) -> None:
            pid = conn.info.get("pid")
            wall, client, backend = time.perf_counter(), _client(), _backend(pid)
            copy_rows(conn, table, columns, rows)
            add(f"COPY {table}", time.perf_counter() - wall, _client() - client, _backend(pid) - backend)

        jobs.copy_rows = timed_copy  # type: ignore[assignment]
        captured_at = datetime.now(UTC)
        for round_name in ("ingest", "again"):
            spent.clear()
            wall = client = backend = 0.0
            for attempts in documents:
                with engine.begin() as conn:
                    pid = conn.execute(text("SELECT pg_backend_pid()")).scalar_one()
                    conn.info["pid"] = pid
                    w0, c0, b0 = time.perf_counter(), _client(), _backend(pid)
                    jobs.write_attempts(conn, attempts, captured_at=captured_at)
                    wall += time.perf_counter() - w0
                    client += _client() - c0
                    backend += _backend(pid) - b0
            n = args.jobs
            print(
                f"{round_name}: write_attempts {wall:.2f} s wall, {client + backend:.2f} s CPU (client "
                f"{client:.2f} + backend {backend:.2f}); client {client / n * 1e6:.1f} us/job, "
                f"backend {backend / n * 1e6:.1f} us/job"
            )
            for label, (count, s_wall, s_client, s_backend) in sorted(
                spent.items(), key=lambda kv: -kv[1][1]
            ):
                if s_wall < 0.005:
                    continue
                print(
                    f"  {s_wall:6.2f} s wall  client {s_client / n * 1e6:5.1f} us  "
                    f"backend {s_backend / n * 1e6:5.1f} us  x{count:.0f}  {label}"
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
