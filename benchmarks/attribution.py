"""Attribution throughput: incremental rollups and a full recompute of a generated month.

A cluster of --gpus GPUs (8 per node) runs back-to-back single-GPU jobs of --job-hours each;
its node agents' 30 s window summaries (sample_count 30, so one window = 30 samples) are
generated inside PostgreSQL with generate_series, straight into the partitioned table, in the
shape slurmtel's store writes (one ingest batch per node and day), and the jobs go through
the real store (write_attempts). Then, measured in one run:

  incremental: one more hour of telemetry arrives for every GPU; the attribution run that
               folds it in (it recomputes every attempt the new windows touch) -> new samples/s
               and windows read/s (target >= 500,000 samples/s);
  full:        `run_attribution(full=True)` over the whole period -> seconds, windows/s;
  causes:      issue 26's idle causes: a job host window (cgroup IO, CPU, PSI) per job and window
               is generated for every window, and the full recompute is run again without the
               idle-cause classification ("before", idle_causes=False) and with it ("after"),
               on the same data in the same run -> both times and their ratio;
  planted:     the simulator's five jobs with known idle causes (slurmtel.simulate.
               idle_cause_scenario: data-loader-bound, storage stall, periodic checkpoints, a
               two-node job on a busy link, no process) on nodes of their own, stored through
               the real parser and writers among the generated cluster's rows; the next run must
               recover each planted cause within 1 % and each checkpoint count exactly.

    python benchmarks/attribution.py [--gpus 1024] [--days 30] [--hours H] [--dsn URL]

`--hours H` replaces --days with a period of H hours (a small run at 10,000 GPUs:
`--gpus 10000 --hours 2`).

The defaults are the issue's month (1,024 GPUs x 30 days = 88 million windows, ~25 GB with
indexes); --days 3 gives the same rates in minutes.
"""

from __future__ import annotations

import argparse
import sys
import time
from datetime import UTC, datetime, timedelta

from cputime import Meter, ratios
from scratch import configured_server, scratch_database
from sqlalchemy import Engine, text

from slurmtel.attribution import run_attribution
from slurmtel.config import Config
from slurmtel.parsers.sacct_json import parse_sacct_json
from slurmtel.records import JobAttempt
from slurmtel.simulate import idle_cause_scenario, render_sacct_json
from slurmtel.store.fabric import write_port_counters
from slurmtel.store.hostside import write_job_host_windows
from slurmtel.store.jobs import write_attempts
from slurmtel.store.reports_idle import attempt_idle_causes
from slurmtel.store.telemetry import ensure_partitions, write_inventory, write_summaries

TARGET_SAMPLES_PER_SECOND = 500_000
# the planted causes must come back within this share of their idle GPU-seconds
PLANTED_TOLERANCE = 0.01
GPUS_PER_NODE = 8
WINDOW = 30
START = datetime(2026, 10, 1, tzinfo=UTC)


def node_of(gpu: int) -> str:
    return f"n{gpu // GPUS_PER_NODE:04d}"


def jobs_for(gpus: int, start: datetime, end: datetime, job_hours: int) -> list[JobAttempt]:
    jobs = []
    slots = int((end - start) / timedelta(hours=job_hours))
    for gpu in range(gpus):
        for slot in range(slots):
            begin = start + timedelta(hours=job_hours * slot)
            job_id = gpu * 10_000 + slot + 1
            jobs.append(
                JobAttempt(
                    cluster="bench",
                    job_id_raw=job_id,
                    submit_at=begin - timedelta(minutes=5),
                    job_id=str(job_id),
                    name="train",
                    user=f"u{gpu % 50}",
                    account=f"acct{gpu % 7}",
                    partition="gpu",
                    state="COMPLETED",
                    eligible_at=begin - timedelta(minutes=5),
                    start_at=begin,
                    end_at=begin + timedelta(hours=job_hours),
                    alloc_gpus=1,
                    alloc_tres={"gres/gpu": 1},
                    nodes=(node_of(gpu),),
                    nodelist=node_of(gpu),
                    gpu_model="h100",
                )
            )
    return jobs


def generate_windows(engine: Engine, gpus: int, lo: datetime, hi: datetime, job_hours: int) -> int:
    """Insert every GPU's windows in [lo, hi), one ingest batch per node and day; return windows."""
    total = 0
    day = lo
    while day < hi:
        day_end = min(hi, day + timedelta(days=1))
        with engine.begin() as conn:
            ensure_partitions(conn, day.date(), (day_end - timedelta(microseconds=1)).date())
            for first in range(0, gpus, GPUS_PER_NODE):
                batch = conn.execute(
                    text(
                        "INSERT INTO ingest_batch (source, node, window_min_at, window_max_at, rows) "
                        "VALUES ('agent', :node, :lo, :hi, :rows) RETURNING id"
                    ),
                    {"node": node_of(first), "lo": day, "hi": day_end - timedelta(seconds=WINDOW),
                     "rows": GPUS_PER_NODE * int((day_end - day).total_seconds() // WINDOW)},
                ).scalar_one()  # fmt: skip
                total += conn.execute(
                    text(
                        """
                        INSERT INTO gpu_window (source, node, gpu_uuid, window_start_at, window_seconds,
                            util_metric, sample_count, covered_seconds, util_mean_percent, util_max_percent,
                            idle_seconds, no_process_seconds, memory_used_max_bytes, energy_joules,
                            energy_method, job_ids, batch_id)
                        SELECT 'agent', :node, 'GPU-' || g, t, 30, 'gr_engine_active', 30, 30, u, least(100, u + 7),
                               CASE WHEN u < 5 THEN 30 ELSE 0 END, 0, 40::bigint << 30, 300, 'counter',
                               ARRAY[(g * 10000 + floor(extract(epoch FROM t - CAST(:start AS timestamptz)) / (CAST(:hours AS int) * 3600)) + 1)::bigint::text],
                               :batch
                        FROM generate_series(CAST(:g0 AS bigint), CAST(:g1 AS bigint)) AS g,
                             generate_series(CAST(:lo AS timestamptz), CAST(:hi AS timestamptz) - interval '30 seconds',
                                             interval '30 seconds') AS t,
                             LATERAL (SELECT CAST(abs(hashint8(g * 100000000 + extract(epoch FROM t)::bigint)) % 100
                                                  AS real) AS u) r
                        """
                    ),
                    {"node": node_of(first), "g0": first, "g1": min(gpus, first + GPUS_PER_NODE) - 1,
                     "lo": day, "hi": day_end, "batch": batch, "start": START, "hours": job_hours},
                ).rowcount  # fmt: skip
        day = day_end
    return total


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--gpus", type=int, default=1024)
    parser.add_argument("--days", type=int, default=30)
    parser.add_argument("--job-hours", type=int, default=6)
    parser.add_argument("--hours", type=int, default=0, help="a period of this many hours instead of --days")
    parser.add_argument("--dsn", default=None)
    parser.add_argument("--keep", action="store_true", help="keep the scratch database")
    args = parser.parse_args()
    base = configured_server(args.dsn)
    if not base:
        print("give --dsn or SLURMTEL_TEST_DSN: this benchmark needs a PostgreSQL server with room for it")
        return 2
    config = Config()
    with scratch_database(base, keep=args.keep) as engine:
        end = START + (timedelta(hours=args.hours) if args.hours else timedelta(days=args.days))
        period = f"{args.hours} hours" if args.hours else f"{args.days} days"
        print(f"{args.gpus} GPUs x {period} of {WINDOW} s windows, {args.job_hours} h jobs", flush=True)
        t0 = time.perf_counter()
        jobs = jobs_for(args.gpus, START, end + timedelta(hours=args.job_hours), args.job_hours)
        with engine.begin() as conn:
            for i in range(0, len(jobs), 50_000):
                write_attempts(conn, jobs[i : i + 50_000])
        windows = generate_windows(engine, args.gpus, START, end, args.job_hours)
        with engine.begin() as conn:
            # the jobs were written long before the telemetry that is measured arrives: otherwise
            # every one is still inside the attribution.overlap_seconds re-read window
            conn.execute(text("UPDATE job_attempt SET updated_at = now() - interval '1 day'"))
        with engine.connect() as conn:
            conn.execute(text("ANALYZE"))
        print(
            f"  generated {len(jobs):,} attempts and {windows:,} windows in {time.perf_counter() - t0:.0f} s"
        )

        meter = Meter(engine)
        with meter.measure() as first_section:
            first = run_attribution(engine, config, now=end)
        first_seconds = first_section.usage.wall
        print(f"first run (everything new): {first.attempts:,} attempts, {first_seconds:.1f} s, "
              f"{windows * 30 / first_seconds:,.0f} samples/s")  # fmt: skip
        print(
            f"  {first_section.usage}; {windows * 30 / first_section.usage.cpu:,.0f} samples per CPU-second"
        )

        with engine.begin() as conn:
            # a day passes: later runs have moved the job watermark on (the jobs, written a day
            # ago, are outside attribution.overlap_seconds) - the steady state of the daemon
            conn.execute(text("UPDATE attribution_watermark SET value_at = now() WHERE name = 'jobs'"))
        hour = generate_windows(engine, args.gpus, end, end + timedelta(hours=1), args.job_hours)
        with meter.measure() as step_section:
            step = run_attribution(engine, config, now=end + timedelta(hours=1))
        step_seconds = step_section.usage.wall
        rate = hour * 30 / step_seconds
        print(f"incremental (1 h of new telemetry, {hour:,} windows = {hour * 30:,} samples): "
              f"{step.attempts:,} attempts recomputed in {step_seconds:.2f} s -> {rate:,.0f} new samples/s")  # fmt: skip
        cpu_rate = hour * 30 / step_section.usage.cpu
        print(f"  {step_section.usage}; {cpu_rate:,.0f} new samples per CPU-second")
        verdict = "met" if rate >= TARGET_SAMPLES_PER_SECOND else "NOT met"
        cpu_verdict = "met" if cpu_rate >= TARGET_SAMPLES_PER_SECOND else "NOT met"
        print(
            f"target: >= {TARGET_SAMPLES_PER_SECOND:,} samples/s incremental: {verdict} (per CPU-second: {cpu_verdict})"
        )

        with meter.measure() as full_section:
            full = run_attribution(engine, config, now=end + timedelta(hours=1), full=True)
        full_seconds = full_section.usage.wall
        print(f"full recompute: {full.attempts:,} attempts, {full.slices:,} hour slices, {full.rows:,} rows "
              f"rewritten (unchanged rows are kept) in {full_seconds:.1f} s "
              f"({(windows + hour) / full_seconds:,.0f} windows/s, {(windows + hour) * 30 / full_seconds:,.0f} samples/s)")  # fmt: skip
        print(f"  {full_section.usage}")
        print(ratios("full recompute / first run", full_section.usage, first_section.usage))

        hosts = generate_job_windows(engine, START, end + timedelta(hours=1), args.job_hours)
        t0 = time.perf_counter()
        run_attribution(engine, config, now=end + timedelta(hours=1), full=True, idle_causes=False)
        before = time.perf_counter() - t0
        t0 = time.perf_counter()
        run_attribution(engine, config, now=end + timedelta(hours=1), full=True)
        after = time.perf_counter() - t0
        with engine.connect() as conn:
            parts = conn.execute(
                text("SELECT count(*) FROM gpu_attribution_part WHERE cause_unmeasured_seconds IS NOT NULL")
            ).scalar_one()
        print(f"idle causes ({hosts:,} job host windows): full recompute before (idle_causes off) {before:.1f} s, "
              f"after (on, {parts:,} cause slices) {after:.1f} s, ratio {after / before:.2f}")  # fmt: skip
        print(planted_check(engine, config, end + timedelta(hours=1), end - START))
        return 0


def planted_check(engine: Engine, config: Config, now: datetime, period: timedelta) -> str:
    """Store the simulator's planted-cause jobs (at most 2 hours of them, inside the period),
    run attribution once more and say how far each recovered cause is from its planted figure."""
    windows = min(240, int(period.total_seconds()) // WINDOW)
    if windows < 8:
        return f"planted causes: the period is too short for them ({windows} windows; give --hours 1 or more)"
    scenario = idle_cause_scenario(START, windows=windows, cluster="planted")
    attempts = [r for r in parse_sacct_json(render_sacct_json(scenario.jobs)) if isinstance(r, JobAttempt)]
    with engine.begin() as conn:
        write_attempts(conn, attempts)
        write_inventory(conn, scenario.inventory, source="agent")
        for node in sorted({s.node for s in scenario.summaries}):
            write_summaries(
                conn, [s for s in scenario.summaries if s.node == node], source="agent", node=node
            )
        write_job_host_windows(conn, scenario.job_hosts)
        write_port_counters(conn, scenario.ports)
    run_attribution(engine, config, now=now)
    keys = [(a.cluster, a.job_id_raw, a.submit_at) for a in attempts]
    with engine.connect() as conn:
        causes = attempt_idle_causes(conn, keys)
        episodes = dict(
            conn.execute(
                text(
                    "SELECT CAST(job_id_raw AS text), episodes FROM job_checkpoint WHERE cluster = 'planted'"
                )
            ).all()
        )
    worst, wrong_episodes = 0.0, 0
    for key in keys:
        job = str(key[1])
        got = {c["idle_cause"]: float(c["idle_gpu_seconds"]) for c in causes.get(key, [])}
        planted = scenario.planted[job]
        for cause in set(got) | set(planted):
            want = planted.get(cause, 0.0)
            error = abs(got.get(cause, 0.0) - want) / want if want else float(got.get(cause, 0.0) > 1e-6)
            worst = max(worst, error)
        wrong_episodes += episodes.get(job) != scenario.checkpoints[job]
    met = "met" if worst <= PLANTED_TOLERANCE and not wrong_episodes else "NOT met"
    return (
        f"planted causes ({len(keys)} jobs, {windows} windows each): worst cause error {100 * worst:.2f} %, "
        f"checkpoint counts wrong {wrong_episodes} (target: within {100 * PLANTED_TOLERANCE:g} % and exact: {met})"
    )


def generate_job_windows(engine: Engine, lo: datetime, hi: datetime, job_hours: int) -> int:
    """A cgroup window per job (one per GPU here) and window, as the agents ship them."""
    with engine.begin() as conn:
        return int(
            conn.execute(
                text(
                    """
                    INSERT INTO job_host_window (node, job_id, window_start_at, window_seconds, cgroup_version,
                        read_bytes, write_bytes, read_ops, write_ops, cpu_usage_seconds, cpus,
                        memory_peak_bytes, io_some_stall_seconds, io_full_stall_seconds, cpu_some_stall_seconds)
                    SELECT a.nodes[1], CAST(a.job_id_raw AS text), t, 30, 2,
                           abs(hashint8(h)) % 2000000000, abs(hashint8(h + 1)) % 200000000, 100, 10,
                           (abs(hashint8(h + 2)) % 3000) / 10.0, 8, 64::bigint << 30,
                           (abs(hashint8(h + 3)) % 60) / 10.0, 0, (abs(hashint8(h + 4)) % 100) / 10.0
                    FROM job_attempt a,
                         generate_series(greatest(a.start_at, CAST(:lo AS timestamptz)),
                                         least(a.end_at, CAST(:hi AS timestamptz)) - interval '30 seconds',
                                         interval '30 seconds') AS t,
                         LATERAL (SELECT a.job_id_raw * 100000000 + extract(epoch FROM t)::bigint AS h) x
                    WHERE a.start_at < :hi AND a.end_at > :lo
                    ON CONFLICT DO NOTHING
                    """
                ),
                {"lo": lo, "hi": hi},
            ).rowcount
        )


if __name__ == "__main__":
    sys.exit(main())
