"""Admin report latency on 200,000 jobs: each `slurmtel report` query, timed.

Loads N synthetic attempts through the real path (slurmtel.simulate.synthetic_jobs ->
render_sacct_json -> parse_sacct_json -> write_attempts) and runs attribution over them, as the
daemon does (it also keeps the resubmission links that `failures`, `retries` and `capacity`
read), then replaces its rollups (there is no telemetry: all unmeasured) with synthetic ones and
loads controller data sized like a 121-node, 8-GPU-per-node cluster:
  gpu_attribution: one row per attempt x node x GPU x day (what attribution writes when every
                   GPU is mapped), with busy / idle / no-process / unmeasured parts (its triggers
                   keep the report rollups attempt_node_day and node_day_allocation, as they
                   do for the attribution run);
  node_state:      every node changes state every 2 hours, a few nodes down or drained;
  pending_job:     2,000 jobs pending in the latest controller snapshot (some over quota);
  gpu_inventory:   8 GPUs per node, a few nodes on another driver; gpu_event: XID/ECC events.
Then runs every admin report's store function over the month (first run and best of --repeat)
and prints seconds per report against the target (< 1 s each): as the database owner, and as
the read API runs them, the reader role under row security with a transaction scope (proven
with a scope key from migration 0016 on) of everything and of one user.

    python benchmarks/reports.py [--jobs 200000] [--repeat 3] [--dsn URL] [--keep | --reuse DB] [--busy N]

Without --dsn it uses $SLURMTEL_TEST_DSN / $SLURMTEL_DATABASE_URL, else an embedded PostgreSQL;
it works in a scratch database it creates and drops (--keep keeps it, --reuse times the
reports on a kept one, after bringing its schema and resubmission links up to date). Tables
are ANALYZEd after loading, as autovacuum would.
"""

from __future__ import annotations

import argparse
import multiprocessing
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, date, datetime
from typing import Any

from cputime import Meter
from scratch import scratch_database, server_url
from sqlalchemy import Connection, Engine, create_engine, text
from sqlalchemy.engine import make_url

from slurmtel.access import EVERYTHING, Scope
from slurmtel.attribution import run_attribution
from slurmtel.config import Config
from slurmtel.parsers.sacct_json import parse_sacct_json
from slurmtel.records import GpuEvent, GpuInventory, JobAttempt, PendingJob
from slurmtel.simulate import USERS, render_sacct_json, synthetic_jobs
from slurmtel.store.engine import make_engine
from slurmtel.store.jobs import sync_outcome_classes, write_attempts
from slurmtel.store.migrate import upgrade
from slurmtel.store.reports_failures import failures_report
from slurmtel.store.reports_idle import idle_report
from slurmtel.store.reports_nodes import nodes_report
from slurmtel.store.reports_queue import queue_report
from slurmtel.store.reports_retries import retries_report
from slurmtel.store.reports_taxonomy import capacity_report, taxonomy_report
from slurmtel.store.retry_links import refresh_retry_links, retry_links_current
from slurmtel.store.rls import set_transaction_scope
from slurmtel.store.telemetry import write_events, write_inventory, write_pending
from slurmtel.store.usage import usage_report

TARGET_SECONDS = 1.0
START = datetime(2026, 11, 1, tzinfo=UTC)
END = datetime(2026, 12, 1, tzinfo=UTC)
NODES = [f"gpu{i:03d}" for i in range(1, 122)]


def load_attempts(conn: Connection, jobs: int, batch: int) -> int:
    sync_outcome_classes(conn, Config().outcomes.mapping())
    sims = list(synthetic_jobs(jobs, start=START))
    stored = 0
    for i in range(0, len(sims), batch):
        records = parse_sacct_json(render_sacct_json(sims[i : i + batch]), origin="benchmark")
        attempts = [r for r in records if isinstance(r, JobAttempt)]
        stored += write_attempts(conn, attempts).inserted
    return stored


ATTRIBUTION_SQL = """
    INSERT INTO gpu_attribution (cluster, job_id_raw, submit_at, node, gpu_uuid, day, mapping,
        gpu_fraction, util_metric, allocated_seconds, covered_seconds, busy_seconds, idle_seconds,
        no_process_seconds, unmeasured_seconds, util_weighted_sum)
    SELECT a.cluster, a.job_id_raw, a.submit_at, n.node, n.node || '-GPU-' || g, d.day, 'process',
           1.0, 'gr_engine_active', s.alloc, s.alloc * 0.9, s.alloc * 0.9 * s.b, s.alloc * 0.9 * (1 - s.b),
           s.alloc * 0.9 * (1 - s.b) * 0.3, s.alloc * 0.1, s.alloc * 0.9 * s.b * 70
    FROM job_attempt a
    CROSS JOIN LATERAL unnest(a.nodes) AS n(node)
    CROSS JOIN LATERAL generate_series(0, greatest(a.alloc_gpus / cardinality(a.nodes), 1) - 1) AS g
    CROSS JOIN LATERAL (
        SELECT CAST(t AS date) AS day, greatest(a.start_at, t) AS lo,
               least(coalesce(a.end_at, CAST(:now AS timestamptz)), t + interval '1 day') AS hi
        FROM generate_series(date_trunc('day', a.start_at),
                             date_trunc('day', coalesce(a.end_at, CAST(:now AS timestamptz)) - interval '1 microsecond'),
                             interval '1 day') AS t
    ) d
    CROSS JOIN LATERAL (
        SELECT extract(epoch FROM d.hi - d.lo) AS alloc, (abs(hashint8(a.job_id_raw)) % 100) / 100.0 AS b
    ) s
    WHERE a.start_at IS NOT NULL AND a.alloc_gpus > 0 AND cardinality(a.nodes) > 0 AND d.hi > d.lo
"""

NODE_STATE_SQL = """
    INSERT INTO node_state (cluster, node, states, gpus_total, gpus_allocated, partitions, first_seen_at, last_seen_at)
    SELECT 'sim', node, CASE
               WHEN node IN ('gpu007', 'gpu042') AND t >= '2026-11-10' AND t < '2026-11-12' THEN ARRAY['DOWN', 'NOT_RESPONDING']
               WHEN node = 'gpu099' AND t >= '2026-11-20' THEN ARRAY['IDLE', 'DRAIN']
               WHEN (extract(hour FROM t) / 2)::int % 2 = 0 THEN ARRAY['MIXED']
               ELSE ARRAY['ALLOCATED'] END,
           8, 4, ARRAY['gpu'], t, t + interval '119 minutes'
    FROM unnest(CAST(:nodes AS text[])) AS node,
         generate_series(CAST(:start AS timestamptz), CAST(:end AS timestamptz) - interval '2 hours', interval '2 hours') AS t
"""


def load_rest(conn: Connection, pending: int) -> None:
    conn.execute(text("DELETE FROM gpu_attribution"))
    conn.execute(text(ATTRIBUTION_SQL), {"now": END})
    conn.execute(text(NODE_STATE_SQL), {"nodes": NODES, "start": START, "end": END})
    drifted = ("gpu003", "gpu077")
    inventory = [
        GpuInventory(
            node=node,
            gpu_uuid=f"{node}-GPU-{i}",
            index=i,
            model="NVIDIA H100 80GB HBM3",
            observed_at=END,
            driver_version="535.129.03" if node in drifted else "550.54.15",
            cuda_version="12.2" if node in drifted else "12.4",
        )
        for node in NODES
        for i in range(8)
    ]
    write_inventory(conn, inventory, source="agent")
    events = [
        GpuEvent(
            NODES[k % 17],
            f"{NODES[k % 17]}-GPU-{k % 8}",
            datetime(2026, 11, 1 + k % 29, k % 24, tzinfo=UTC),
            "xid" if k % 5 else "ecc_single_bit",
            (79, 48, 94, 13)[k % 4],
        )
        for k in range(500)
    ]
    write_events(conn, events)
    accounts = list(USERS)
    reasons = ("Priority", "Resources", "AssocGrpGRES", "QOSMaxGRESPerUser", "Dependency")
    jobs = [
        PendingJob(
            cluster="sim",
            job_id_raw=5_000_000 + k,
            job_id=str(5_000_000 + k),
            submit_at=datetime(2026, 11, 30, k % 24, tzinfo=UTC),
            observed_at=END,
            user=USERS[accounts[k % 4]][0],
            account=accounts[k % 4],
            partition="gpu",
            reason=reasons[k % len(reasons)],
            gpus_requested=(1, 2, 4, 8)[k % 4],
            eligible_at=datetime(2026, 11, 30, k % 24, tzinfo=UTC),
        )
        for k in range(pending)
    ]
    write_pending(conn, jobs, cluster="sim", observed_at=END)


def reports(scope: Scope = EVERYTHING) -> dict[str, Callable[[Connection], Any]]:
    window: dict[str, Any] = {"start": START, "end": END, "now": END}
    days: dict[str, Any] = {"first_day": date(2026, 11, 1), "last_day": date(2026, 11, 30)}
    return {
        "usage (reference)": lambda c: usage_report(c, by="account", scope=scope, **window),
        "failures": lambda c: failures_report(c, scope=scope, **window),
        "idle": lambda c: idle_report(c, scope=scope, **days),
        "queue": lambda c: queue_report(c, scope=scope, **window),
        "taxonomy": lambda c: taxonomy_report(c, scope=scope, now=END, timezone="UTC", **days),
        "nodes": lambda c: nodes_report(c, scope=scope, **window),
        "capacity": lambda c: capacity_report(
            c, scope=scope, now=END, timezone="UTC", target_gpu_hours=100_000, **days
        ),
        "retries": lambda c: retries_report(c, scope=scope, **window),
    }


def time_reports(engine: Engine, repeat: int) -> int:
    """Every report as the owner (row security does not filter it), then as the read API runs
    it: the reader role under row security, the transaction's scope set (and proven, from
    migration 0016 on) with an admin's scope of everything, and with one user's. The three are
    taken in turn, --repeat times, so that a busy machine weighs on each alike; best of each."""
    user = USERS["physics"][0]
    ways: dict[str, tuple[Scope | None, Scope]] = {
        "owner": (None, EVERYTHING),
        "reader all": (EVERYTHING, EVERYTHING),
        f"reader {user}": (Scope(users=frozenset({user})), Scope(users=frozenset({user}))),
    }
    with reader_engine(engine) as reader:
        print(
            f"\n{'report':<20}" + "".join(f"{w:>14}" for w in ways) + f"  (best of {repeat} s; target < 1 s)"
        )
        slow = []
        meter = Meter(engine)
        cpu_rows = []
        for label in reports():
            best = {}
            timings: dict[str, list[float]] = {w: [] for w in ways}
            cpus: dict[str, list[float]] = {w: [] for w in ways}
            for _ in range(max(1, repeat)):
                for way, (transaction_scope, report_scope) in ways.items():
                    run = reports(report_scope)[label]
                    with (reader if transaction_scope is not None else engine).begin() as conn:
                        if transaction_scope is not None:
                            set_transaction_scope(conn, transaction_scope)
                        with meter.measure() as section:
                            run(conn)
                        timings[way].append(section.usage.wall)
                        cpus[way].append(section.usage.cpu)
            best = {w: min(t) for w, t in timings.items()}
            slow += [f"{label} ({w})" for w, t in best.items() if t >= TARGET_SECONDS]
            print(f"{label:<20}" + "".join(f"{best[w]:>14.3f}" for w in ways), flush=True)
            cpu_rows.append(f"{label:<20}" + "".join(f"{min(cpus[w]):>14.3f}" for w in ways))
            if meter.local is False or section.usage.backend is None:
                cpu_rows[-1] += "  (backend CPU not measured)"
    print(f"\n{'CPU s':<20}" + "".join(f"{w:>14}" for w in ways) + "  (client + backend, best of each)")
    print("\n".join(cpu_rows))
    print("\nall reports under target" if not slow else f"\nover target: {', '.join(slow)}")
    return 0


@contextmanager
def reader_engine(engine: Engine) -> Iterator[Engine]:
    """A login role of slurmtel_reader for this run (roles are cluster-wide: dropped after), its
    scopes proven with a scope key given to the database when the schema has one (0016)."""
    from slurmtel.store.roles import READER_GROUP, ensure_login_role

    name = f"slurmtel_bench_reader_{uuid.uuid4().hex[:8]}"
    with engine.begin() as conn:
        ensure_login_role(conn, name, READER_GROUP)
        proven = conn.execute(text("SELECT to_regclass('scope_key') IS NOT NULL")).scalar_one()
        key = None
        if proven:
            from slurmtel.store.rls import install_scope_key, new_scope_key

            key = new_scope_key()
            install_scope_key(conn, key)
    reader = create_engine(engine.url.set(username=name).render_as_string(hide_password=False))
    if key is not None:
        from slurmtel.store.rls import sign_scopes

        sign_scopes(reader, key)
    print(f"\nreader role {name}: {'scopes proven (0016)' if proven else 'scopes unproven (before 0016)'}")
    try:
        yield reader
    finally:
        reader.dispose()
        with engine.begin() as conn:
            conn.execute(text(f'DROP ROLE "{name}"'))


def update_links(engine: Engine) -> None:
    """Bring a kept database's resubmission links up to date (schema 0005 and later) without an
    attribution run, which would replace the synthetic rollups of running attempts."""
    window = Config().attribution.resubmission_window_seconds
    with engine.begin() as conn:
        if retry_links_current(conn, window):
            return
        t0 = time.perf_counter()
        refresh = refresh_retry_links(
            conn, window_seconds=window, job_mark=None, overlap_seconds=0, full=True
        )
    print(f"computed {refresh.links:,} resubmission links in {time.perf_counter() - t0:.1f} s")


def _burn() -> None:
    """A second CPU-bound process, as another user's work on the head node."""
    value = 0
    while True:
        value = (value * 1103515245 + 12345) % 2**31


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=200_000)
    parser.add_argument("--batch", type=int, default=20_000, help="jobs per sacct --json document")
    parser.add_argument("--pending", type=int, default=2_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--dsn", default=None)
    parser.add_argument("--keep", action="store_true", help="keep the scratch database (prints its name)")
    parser.add_argument("--reuse", metavar="DATABASE", help="time the reports on a database kept by --keep")
    parser.add_argument(
        "--busy",
        type=int,
        default=0,
        metavar="N",
        help="time the reports while N other processes burn a CPU each (the machine is busy)",
    )
    args = parser.parse_args()
    if args.busy:
        burners = [multiprocessing.Process(target=_burn, daemon=True) for _ in range(args.busy)]
        for burner in burners:
            burner.start()
        print(f"{args.busy} CPU-bound process(es) running beside the reports")

    if args.reuse:
        with server_url(args.dsn) as base:
            engine = make_engine(
                Config(), make_url(base).set(database=args.reuse).render_as_string(hide_password=False)
            )
            try:
                upgrade(engine)
                update_links(engine)
                return time_reports(engine, args.repeat)
            finally:
                engine.dispose()
    with scratch_database(args.dsn, keep=args.keep) as engine:
        t0 = time.perf_counter()
        with engine.begin() as conn:
            stored = load_attempts(conn, args.jobs, args.batch)
        print(
            f"loaded {stored:,} attempts through the sacct --json parser in {time.perf_counter() - t0:.1f} s"
        )
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(text("ANALYZE job_attempt"))
        t0 = time.perf_counter()
        result = run_attribution(engine, Config(), now=END)
        print(
            f"attribution run in {time.perf_counter() - t0:.1f} s: {result.attempts:,} attempts, "
            f"{result.retry_links:,} resubmission links"
        )
        t0 = time.perf_counter()
        with engine.begin() as conn:
            load_rest(conn, args.pending)
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(text("ANALYZE"))
            counts = {
                t: conn.execute(text(f"SELECT count(*) FROM {t}")).scalar_one()
                for t in (
                    "gpu_attribution",
                    "attempt_node_day",
                    "node_day_allocation",
                    "retry_link",
                    "node_state",
                    "pending_job",
                    "gpu_inventory",
                    "gpu_event",
                )
            }
        print(
            f"loaded rollups and controller data in {time.perf_counter() - t0:.1f} s: "
            + ", ".join(f"{t} {n:,}" for t, n in counts.items())
        )
        return time_reports(engine, args.repeat)


if __name__ == "__main__":
    sys.exit(main())
