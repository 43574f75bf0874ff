"""The action rules after an attribution run, at 10,000 GPUs with 2,000 running jobs.

A cluster of --gpus GPUs in nodes of 8 runs --jobs jobs that hold every GPU (the default: 1,000
jobs of 8 GPUs, one node each, and 1,000 of 2 GPUs, four to a node), all running. Their node
agents' 30 s windows (utilisation from a hash, so about 5 % of windows are idle and idle
stretches are short; one job in a hundred entirely idle at 0 % with 0.5 GiB in use) are
generated in PostgreSQL as benchmarks/attribution.py does, one ingest batch per node and step.

--hours of history are generated, attributed and folded (not timed: the daemon has done that
long before). Then, --steps times, as the daemon's schedule does every 5 minutes: --step-minutes
of new windows for every GPU arrive; the attribution run folds them in (timed); then the action
round (slurmtel.actions.cycle.run_cycle with the shipped rules: idle and process-less GPUs,
job-end summaries, node health, budgets, statements; recording what they decide, delivering
nothing) is timed, whole and its evaluation alone.

Printed per step: windows, attribution seconds, action seconds, decisions, and the ratio of the
action round to the attribution run; then the medians. Target: the action round < 2 s.

    python benchmarks/actions.py [--gpus 10000] [--jobs 2000] [--hours 2] [--steps 3] [--dsn URL]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from datetime import UTC, datetime, timedelta

from cputime import Meter
from scratch import configured_server, scratch_database
from sqlalchemy import Engine, text

from slurmtel.actions.cycle import run_cycle
from slurmtel.actions.recipients import Recipients
from slurmtel.attribution import run_attribution
from slurmtel.config import Config, config_from_dict
from slurmtel.records import GpuInventory, JobAttempt
from slurmtel.store.jobs import write_attempts
from slurmtel.store.telemetry import ensure_partitions, write_inventory

TARGET_SECONDS = 2.0
GPUS_PER_NODE = 8
WINDOW = 30
START = datetime(2026, 10, 1, tzinfo=UTC)


def node_of(gpu: int) -> str:
    return f"n{gpu // GPUS_PER_NODE:04d}"


def layout(gpus: int, jobs: int) -> list[tuple[int, int]]:
    """(first GPU, GPU count) per job: 8-GPU jobs on whole nodes, then 2-GPU jobs, as many of
    each as make JOBS jobs hold the GPUS (the default: 1,000 x 8 + 1,000 x 2)."""
    big = max(0, min(jobs, (gpus - 2 * jobs) // 6))
    out = [(GPUS_PER_NODE * i, 8) for i in range(big)]
    first = 8 * big
    while len(out) < jobs and first + 2 <= gpus:
        out.append((first, 2))
        first += 2
    return out


def job_attempts(layout_: list[tuple[int, int]], now: datetime) -> list[JobAttempt]:
    attempts = []
    for i, (first, count) in enumerate(layout_):
        job_id = 100_000 + i
        started = now - timedelta(hours=6) + timedelta(seconds=(i * 37) % 3600)
        attempts.append(
            JobAttempt(
                cluster="bench",
                job_id_raw=job_id,
                submit_at=started - timedelta(minutes=5),
                job_id=str(job_id),
                name="train",
                user=f"u{i % 200}",
                account=f"acct{i % 20}",
                partition="gpu",
                state="RUNNING",
                eligible_at=started - timedelta(minutes=5),
                start_at=started,
                end_at=None,
                alloc_gpus=count,
                alloc_tres={"gres/gpu": count},
                nodes=(node_of(first),),
                nodelist=node_of(first),
                gpu_model="h100",
                time_limit_seconds=48 * 3600,
            )
        )
    return attempts


def generate_windows(
    engine: Engine, gpus: int, layout_: list[tuple[int, int]], lo: datetime, hi: datetime
) -> int:
    """Every GPU's windows in [lo, hi), one ingest batch per node; the job of a GPU is in each."""
    job_of = [0] * gpus
    for i, (first, count) in enumerate(layout_):
        for g in range(first, first + count):
            job_of[g] = 100_000 + i
    total = 0
    with engine.begin() as conn:
        ensure_partitions(conn, lo.date(), (hi - timedelta(microseconds=1)).date())
        conn.execute(text("CREATE TEMP TABLE gpu_job (g bigint PRIMARY KEY, job bigint) ON COMMIT DROP"))
        conn.execute(
            text("INSERT INTO gpu_job SELECT * FROM unnest(CAST(:g AS bigint[]), CAST(:j AS bigint[]))"),
            {"g": list(range(gpus)), "j": job_of},
        )
        for first in range(0, gpus, GPUS_PER_NODE):
            batch = conn.execute(
                text(
                    "INSERT INTO ingest_batch (source, node, window_min_at, window_max_at, rows) "
                    "VALUES ('agent', :node, :lo, :hi, :rows) RETURNING id"
                ),
                {"node": node_of(first), "lo": lo, "hi": hi - timedelta(seconds=WINDOW),
                 "rows": GPUS_PER_NODE * int((hi - lo).total_seconds() // WINDOW)},
            ).scalar_one()  # fmt: skip
            total += conn.execute(
                text(
                    """
                    INSERT INTO gpu_window (source, node, gpu_uuid, window_start_at, window_seconds,
                        util_metric, sample_count, covered_seconds, util_mean_percent, util_max_percent,
                        idle_seconds, no_process_seconds, memory_used_max_bytes, energy_joules,
                        energy_method, job_ids, batch_id)
                    SELECT 'agent', :node, 'GPU-' || s.gpu, t, 30, 'gr_engine_active', 30, 30, u, least(100, u + 7),
                           CASE WHEN u < 5 THEN 30 ELSE 0 END, 0,
                           CASE WHEN u < 5 THEN 512::bigint << 20 ELSE 40::bigint << 30 END,
                           300, 'counter', ARRAY[CAST(j.job AS text)], :batch
                    FROM generate_series(CAST(:g0 AS bigint), CAST(:g1 AS bigint)) AS s(gpu)
                    JOIN gpu_job j ON j.g = s.gpu,
                         generate_series(CAST(:lo AS timestamptz), CAST(:hi AS timestamptz) - interval '30 seconds',
                                         interval '30 seconds') AS t,
                         LATERAL (SELECT CASE WHEN j.job % 100 = 0 THEN CAST(0 AS real)
                                              ELSE CAST(abs(hashint8(s.gpu * 100000000 + extract(epoch FROM t)::bigint)) % 100 AS real)
                                         END AS u) r
                    """
                ),
                {"node": node_of(first), "g0": first, "g1": min(gpus, first + GPUS_PER_NODE) - 1,
                 "lo": lo, "hi": hi, "batch": batch},
            ).rowcount  # fmt: skip
    return total


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--gpus", type=int, default=10_000)
    parser.add_argument("--jobs", type=int, default=2_000)
    parser.add_argument("--hours", type=float, default=2)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--step-minutes", type=int, default=5)
    parser.add_argument("--dsn", default=None)
    parser.add_argument("--keep", action="store_true", help="keep the scratch database")
    args = parser.parse_args()
    base = configured_server(args.dsn)
    if not base:
        print("give --dsn or SLURMTEL_TEST_DSN: this benchmark needs a PostgreSQL server with room for it")
        return 2
    config = config_from_dict(
        {"actions": {"enabled": True, "recipients": {"domain": "example.org", "admins": ["hpc@example.org"]}}}
    )
    with scratch_database(base, keep=args.keep) as engine:
        jobs = layout(args.gpus, args.jobs)
        held = sum(n for _, n in jobs)
        print(f"{args.gpus:,} GPUs, {len(jobs):,} running jobs holding {held:,} of them", flush=True)
        t0 = time.perf_counter()
        now = START + timedelta(hours=args.hours)
        with engine.begin() as conn:
            write_attempts(conn, job_attempts(jobs, START))
            inventory = [
                GpuInventory(node=node_of(g), gpu_uuid=f"GPU-{g}", index=g % GPUS_PER_NODE, model="NVIDIA H100",
                             observed_at=START - timedelta(days=1))
                for g in range(args.gpus)
            ]  # fmt: skip
            write_inventory(conn, inventory, source="agent")
        history = generate_windows(engine, args.gpus, jobs, START, now)
        with engine.begin() as conn:
            conn.execute(text("UPDATE job_attempt SET updated_at = now() - interval '1 day'"))
        with engine.connect() as conn:
            conn.execute(text("ANALYZE"))
            conn.commit()
        run_attribution(engine, Config(), now=now)
        recipients = Recipients(config, coordinators=dict)
        first = run_cycle(engine, config, now=now, deliver=False, recipients=recipients)
        print(
            f"  history: {history:,} windows, attributed and folded in {time.perf_counter() - t0:.0f} s "
            f"(the first round decided {len(first.decisions)}: "
            f"{', '.join(sorted({f'{d.rule.name}/{d.step}' for d in first.decisions})) or 'nothing'})",
            flush=True,
        )
        with engine.begin() as conn:
            conn.execute(text("UPDATE attribution_watermark SET value_at = now() WHERE name = 'jobs'"))
        attribution_seconds, action_seconds, evaluation_seconds, ratios = [], [], [], []
        cpu_ratios = []
        meter = Meter(engine)
        for step in range(args.steps):
            lo, now = now, now + timedelta(minutes=args.step_minutes)
            windows = generate_windows(engine, args.gpus, jobs, lo, now)
            with meter.measure() as attribution_section:
                attributed = run_attribution(engine, Config(), now=now)
            attribution = attribution_section.usage.wall
            with meter.measure() as acting_section:
                report = run_cycle(engine, config, now=now, deliver=False, recipients=recipients)
            acting = acting_section.usage.wall
            cpu_ratios.append(acting_section.usage.cpu / attribution_section.usage.cpu)
            attribution_seconds.append(attribution)
            action_seconds.append(acting)
            evaluation_seconds.append(report.evaluation_seconds)
            ratios.append(acting / attribution)
            print(
                f"  step {step + 1}: {windows:,} new windows; attribution {attribution:.2f} s "
                f"({attributed.attempts:,} attempts); action round {acting:.2f} s (evaluation "
                f"{report.evaluation_seconds:.2f} s, {report.fold.windows:,} windows folded, "
                f"{report.running_jobs:,} running jobs, {report.recorded} recorded, {len(report.skipped)} skipped"
                f"{', errors: ' + '; '.join(report.errors) if report.errors else ''}); "
                f"ratio to the attribution run {acting / attribution:.2f}",
                flush=True,
            )
            print(f"    attribution {attribution_section.usage}; action round {acting_section.usage}; "
                  f"CPU ratio {cpu_ratios[-1]:.2f}")  # fmt: skip
            parts = sorted(report.timings.items(), key=lambda kv: -kv[1])
            print("    where: " + ", ".join(f"{part} {seconds:.2f} s" for part, seconds in parts), flush=True)
        median = statistics.median(action_seconds)
        print(
            f"median: attribution run {statistics.median(attribution_seconds):.2f} s, action round "
            f"{median:.2f} s (evaluation {statistics.median(evaluation_seconds):.2f} s), "
            f"ratio {statistics.median(ratios):.2f} (from CPU seconds {statistics.median(cpu_ratios):.2f})"
        )
        verdict = "met" if median < TARGET_SECONDS else "NOT met"
        print(
            f"target: action round < {TARGET_SECONDS:g} s at {args.gpus:,} GPUs and {len(jobs):,} running jobs: {verdict}"
        )
        return 0


if __name__ == "__main__":
    sys.exit(main())
