"""The SQL behind `slurmtel job` (job_document), in process, on peers.py's dataset: where its
milliseconds go. Needs no Prometheus (peers.py puts the same figure beside jobstats' PromQL).

The dataset is peers.py's (simulate_cluster, nodes of 8 GPUs, backfilled and attributed, the
closed hours packed); the job is peers.py's too (the longest multi-GPU job that ended). Prints:

- job_document: best wall of --repeat runs and their mean CPU seconds (this process and the
  database backend: benchmarks/cputime.py), --rounds times, in seconds and in milliseconds: on
  a pooled connection whose read ends in a rollback, and as the read API serves it (the reader
  role, its scope proven, a committed transaction: benchmarks/served.py), where psycopg keeps
  the statements it prepared;
- the statements one run sends, each with its wall milliseconds as the client saw them, then
  each one's planning and execution time (EXPLAIN ANALYZE, the third of three runs).

--partitions N first creates the window partitions of the N days before the data (a site
keeping N days: planning looks at every partition a read cannot leave out while planning).

    python benchmarks/job_sql.py [--nodes 8] [--hours 24] [--repeat 10] [--partitions 0]
"""

from __future__ import annotations

import argparse
import re
import time
from datetime import UTC, timedelta
from typing import Any

from cputime import Meter
from peers import START, backfill_slurmtel, best, generate
from scratch import scratch_database
from served import served_api
from sqlalchemy import event

from slurmtel.access import EVERYTHING
from slurmtel.config import Config
from slurmtel.reports.researcher import JobQuery, job_document
from slurmtel.store.telemetry import ensure_partitions


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=8, help="nodes of 8 GPUs")
    parser.add_argument("--hours", type=float, default=24.0)
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--partitions", type=int, default=0, help="days of empty partitions before the data")
    parser.add_argument("--dsn", default=None)
    args = parser.parse_args()
    end = START + timedelta(hours=args.hours)
    sim, windows = generate(args.nodes, args.hours)
    ended = [
        a
        for a in sim.attempts
        if a.job.end_at is not None and a.job.start_at is not None and a.job.end_at <= end
    ]
    with scratch_database(args.dsn) as engine:
        backfill_slurmtel(engine, sim, windows, end)
        if args.partitions:
            with engine.begin() as conn:
                ensure_partitions(conn, START.date() - timedelta(days=args.partitions), START.date())
        job = max(
            (a for a in ended if a.job.gpus > 1),
            key=lambda a: (a.job.end_at - a.job.start_at, a.job.job_id_raw),
            default=None,
        ) or max(ended, key=lambda a: a.job.end_at - a.job.start_at)
        job_id = str(job.job.job_id_raw)
        hours = (job.job.end_at - job.job.start_at).total_seconds() / 3600
        print(f"job {job_id}: {job.job.gpus} GPUs, {hours:.1f} h; {args.partitions} days of partitions added")

        def sql() -> Any:
            with engine.connect() as conn:
                return job_document(conn, JobQuery(job_id, (), end, UTC, EVERYTHING))

        meter = Meter(engine)
        with served_api(engine, Config(), end) as api:

            def served() -> Any:
                return api.job_document(JobQuery(job_id, (), end, UTC, EVERYTHING))

            for _ in range(args.rounds):
                for label, run in (("job_document, rolled back", sql), ("as the API serves it", served)):
                    usage, document = best(meter, args.repeat, run)
                    print(f"  {label}: {usage}; {usage.in_ms()}")
                    assert document

        sent: list[tuple[float, str, Any]] = []
        started: dict[int, float] = {}

        @event.listens_for(engine, "before_cursor_execute")
        def before(conn: Any, cursor: Any, statement: str, params: Any, context: Any, many: bool) -> None:
            started[id(conn)] = time.perf_counter()

        @event.listens_for(engine, "after_cursor_execute")
        def after(conn: Any, cursor: Any, statement: str, params: Any, context: Any, many: bool) -> None:
            sent.append((time.perf_counter() - started[id(conn)], statement, params))

        sql()
        event.remove(engine, "before_cursor_execute", before)
        event.remove(engine, "after_cursor_execute", after)
        print(f"  one run: {len(sent)} statements, {sum(s[0] for s in sent) * 1000:.2f} ms in them")
        with engine.connect() as conn:
            cursor = conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
            for seconds, statement, params in sent:
                for _ in range(3):
                    cursor.execute("EXPLAIN (ANALYZE, SUMMARY) " + statement, params)
                    plan = "\n".join(row[0] for row in cursor.fetchall())
                planning = re.search(r"Planning Time: ([\d.]+)", plan)
                execution = re.search(r"Execution Time: ([\d.]+)", plan)
                print(
                    f"    {seconds * 1000:6.2f} ms sent; planning {planning[1] if planning else '?'} ms, "
                    f"execution {execution[1] if execution else '?'} ms: {' '.join(statement.split())[:60]}"
                )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
