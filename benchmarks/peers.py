"""slurmtel against a jobstats-like CLI over Prometheus, on the same dataset, in one run.

The dataset is the project's generator (slurmtel.simulate.simulate_cluster: nodes of 8 GPUs,
jobs, and each GPU's 30 s windows as the node agent summarises them). The same windows go two
ways:

- slurmtel: the jobs through the sacct parser and writer, the windows through the window writer
  (one batch per node and hour, as agents are pulled), the inventory, then the first attribution
  run (which packs the closed hours): "backfill";
- Prometheus (Debian's prometheus and promtool): three DCGM readings per window (utilisation,
  memory used, power) with dcgm-exporter's labels and the job on the GPU in `hpc_job`, as
  OpenMetrics with explicit timestamps, loaded with `promtool tsdb create-blocks-from
  openmetrics` ("backfill"), then served by a Prometheus on loopback.

Then, wall seconds (best of --repeat) and CPU seconds (their mean; benchmarks/cputime.py: this
process and its children, the PostgreSQL backends, the Prometheus server's process):

- one job (the longest multi-GPU job that ended): `slurmtel job JOBID` end to end (a fresh
  interpreter, as a user types it) against a jobstats-like CLI (a fresh interpreter that asks
  Prometheus the three PromQL queries jobstats asks, max memory, mean utilisation and mean
  power over the job's GPUs and time, and prints them); and in process, the SQL behind
  `slurmtel job` (job_document) against the three PromQL queries, read on a pooled connection
  and rolled back (a command's one-off read) and as the read API serves it (benchmarks/served.py:
  the reader role, a committed transaction, the job's statements prepared and planned once);
- `slurmtel report idle` over the dataset end to end, and its store function in process,
  against the PromQL query of idle GPU-hours per job over the same time (in process, and end to
  end through `promtool query instant`);
- backfill: slurmtel's ingest + first attribution against promtool's backfill; and with the
  windows left in the Prometheus (telemetry.sample_store = "prometheus"): the prometheus
  source's run (what is new, no window stored) and the first attribution run reading the
  windows from the Prometheus.

Each ratio is slurmtel's seconds over the peer's (target <= 1.0 for job and report, <= 2.0 for
backfill), by wall and by CPU.

    python benchmarks/peers.py [--nodes 4] [--days 1] [--repeat 5] [--dsn URL]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from cputime import Meter, Usage, ratios
from scratch import scratch_database
from served import served_api
from sqlalchemy import Engine, text

from slurmtel.access import EVERYTHING
from slurmtel.attribution import run_attribution
from slurmtel.config import Config, config_from_dict
from slurmtel.parsers.sacct_json import parse_sacct_json
from slurmtel.records import GpuSummary, JobAttempt
from slurmtel.reports.researcher import JobQuery, job_document
from slurmtel.simulate import SimNode, sim_inventory, sim_sacct_json, sim_summaries, simulate_cluster
from slurmtel.sources import default_options, get_source
from slurmtel.sources.base import RunContext
from slurmtel.store.jobs import sync_outcome_classes, write_attempts
from slurmtel.store.reports_idle import idle_report
from slurmtel.store.telemetry import ensure_partitions, write_inventory, write_summaries

ROOT = Path(__file__).resolve().parents[1]
START = datetime(2026, 11, 2, tzinfo=UTC)
TARGET_QUERY_RATIO = 1.0
TARGET_BACKFILL_RATIO = 2.0

# the jobstats-like CLI: the three queries jobstats asks of Prometheus for a job (memory, GPU
# utilisation, power), as instant queries at the job's end over its run time, printed per GPU
JOBSTATS = """
import json, sys, urllib.parse, urllib.request
url, job, end, seconds = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
def query(q):
    form = urllib.parse.urlencode({"query": q, "time": end}).encode()
    with urllib.request.urlopen(url + "/api/v1/query", form, timeout=60) as r:
        return json.load(r)["data"]["result"]
sel = '{hpc_job="%s"}[%ds]' % (job, seconds)
out = {}
for name, q in (("memory_max_mib", "max_over_time(DCGM_FI_DEV_FB_USED" + sel + ")"),
                ("util_mean_percent", "avg_over_time(DCGM_FI_DEV_GPU_UTIL" + sel + ")"),
                ("power_mean_watts", "avg_over_time(DCGM_FI_DEV_POWER_USAGE" + sel + ")")):
    for series in query(q):
        out.setdefault(series["metric"].get("UUID", "?"), {})[name] = float(series["value"][1])
for uuid, values in sorted(out.items()):
    print(uuid, json.dumps(values))
"""


def generate(nodes: int, hours: float) -> tuple[Any, list[GpuSummary]]:
    end = START + timedelta(hours=hours)
    cluster = tuple(SimNode(f"gpu{i + 1:03d}", 8, ("gpu",)) for i in range(nodes))
    days = max(1, int(hours // 24))
    sim = simulate_cluster(start=START, days=days, nodes=cluster, jobs_per_hour=1.2 * nodes, until=end)
    windows = [w for n in cluster for w in sim_summaries(sim, n.name)]
    return sim, windows


def openmetrics(windows: list[GpuSummary], indices: dict[str, int], path: Path) -> int:
    """The windows as dcgm-exporter's three readings, one sample each at the window's start;
    returns the samples written."""
    families = {
        "DCGM_FI_DEV_GPU_UTIL": lambda w: f"{w.util_mean_percent:g}",
        "DCGM_FI_DEV_FB_USED": lambda w: str((w.memory_used_max_bytes or 0) // 2**20),
        "DCGM_FI_DEV_POWER_USAGE": lambda w: f"{w.power_mean_watts:g}",
    }
    ordered = sorted(windows, key=lambda w: (w.window_start_at, w.gpu_uuid))
    samples = 0
    with path.open("w") as out:
        for name, value in families.items():
            out.write(f"# TYPE {name} gauge\n")
            for w in ordered:
                index = indices[w.gpu_uuid]
                labels = (
                    f'gpu="{index}",UUID="{w.gpu_uuid}",device="nvidia{index}",modelName="NVIDIA H100 80GB HBM3",'
                    f'Hostname="{w.node}",hpc_job="{w.job_ids[0] if w.job_ids else ""}",'
                    f'instance="{w.node}:9400",job="dcgm"'
                )
                out.write(f"{name}{{{labels}}} {value(w)} {w.window_start_at.timestamp():.0f}\n")
                samples += 1
        out.write("# EOF\n")
    return samples


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_prometheus(prometheus: str, data: Path, workdir: Path) -> tuple[subprocess.Popen[bytes], str]:
    config = workdir / "prometheus.yml"
    config.write_text("global: {}\n")
    port = free_port()
    process = subprocess.Popen(
        [prometheus, f"--config.file={config}", f"--storage.tsdb.path={data}",
         f"--web.listen-address=127.0.0.1:{port}", "--storage.tsdb.retention.time=100y", "--log.level=warn"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        if process.poll() is not None:
            raise SystemExit("prometheus ended at start")
        try:
            with urllib.request.urlopen(url + "/-/ready", timeout=5) as response:
                response.read()
            return process, url
        except OSError:
            time.sleep(0.1)
    raise SystemExit("prometheus did not get ready")


def promql(url: str, query: str, at: datetime) -> list[Any]:
    form = urllib.parse.urlencode({"query": query, "time": f"{at.timestamp():.0f}"}).encode()
    with urllib.request.urlopen(url + "/api/v1/query", form, timeout=300) as response:
        result: list[Any] = json.load(response)["data"]["result"]
        return result


def best(meter: Meter, repeat: int, run: Any) -> tuple[Usage, Any]:
    """REPEAT runs (one run first, not counted: caches warm on both sides): the best wall
    seconds, and the mean CPU seconds of the runs (/proc counts CPU in ticks of 10 ms: one
    short query reads 0 or 0.01, their sum over the runs does not)."""
    value = run()
    runs = []
    for _ in range(repeat):
        with meter.measure() as section:
            value = run()
        runs.append(section.usage)
    total = sum(runs[1:], runs[0])

    def mean(x: float | None) -> float | None:
        return None if x is None else x / len(runs)

    return Usage(
        min(u.wall for u in runs),
        total.client / len(runs),
        mean(total.backend),
        mean(total.server),
        total.no_database,
    ), value


def backfill_slurmtel(
    engine: Engine, sim: Any, windows: list[GpuSummary], end: datetime
) -> tuple[Usage, Usage]:
    """(ingest, first attribution run): the jobs, the windows one batch per node and hour, the
    inventory; then the attribution run that folds them in and packs the closed hours."""
    config = Config()
    meter = Meter(engine)
    with meter.measure() as ingest:
        with engine.begin() as conn:
            sync_outcome_classes(conn, config.outcomes.mapping())
            records = parse_sacct_json(sim_sacct_json(sim, until=end), origin="benchmark")
            write_attempts(conn, [r for r in records if isinstance(r, JobAttempt)])
            write_inventory(conn, sim_inventory(sim, at=START), source="agent")
            ensure_partitions(conn, START.date(), end.date())
        batches: dict[tuple[str, datetime], list[GpuSummary]] = {}
        for w in windows:
            hour = w.window_start_at.replace(minute=0, second=0)
            batches.setdefault((w.node, hour), []).append(w)
        for (node, _), batch in sorted(batches.items(), key=lambda kv: (kv[0][1], kv[0][0])):
            with engine.begin() as conn:
                write_summaries(conn, batch, source="agent", node=node)
        with engine.begin() as conn:
            # written long before the telemetry (outside the jobs' re-read window)
            conn.execute(text("UPDATE job_attempt SET updated_at = now() - interval '1 day'"))
            conn.execute(text("ANALYZE"))
    with meter.measure() as attribution:
        result = run_attribution(engine, config, now=end + timedelta(hours=2))
    print(f"  first attribution run: {result.attempts:,} attempts, {result.packed_windows:,} windows packed")
    return ingest.usage, attribution.usage


def remote_store(
    dsn: str | None, sim: Any, url: str, end: datetime, server_pid: int, postgresql: Usage
) -> None:
    """The same jobs with telemetry.sample_store = "prometheus": the prometheus source reads the
    day from the Prometheus and records what is new (no window stored), then the first
    attribution run reads the windows it needs from the Prometheus."""
    print('\nthe sample store in Prometheus (telemetry.sample_store = "prometheus")')
    span = int((end - START).total_seconds())
    config = config_from_dict(
        {
            "telemetry": {"sample_store": "prometheus"},
            "sources": {"prometheus": {"enabled": True, "url": url, "delay_seconds": 0,
                                       "initial_lookback_seconds": span}},
        }
    )  # fmt: skip
    with scratch_database(dsn, prefix="slurmtel_bench_remote") as engine:
        with engine.begin() as conn:
            sync_outcome_classes(conn, config.outcomes.mapping())
            records = parse_sacct_json(sim_sacct_json(sim, until=end), origin="benchmark")
            write_attempts(conn, [r for r in records if isinstance(r, JobAttempt)])
            conn.execute(text("UPDATE job_attempt SET updated_at = now() - interval '1 day'"))
        meter = Meter(engine, server_pids=[server_pid])
        source = get_source("prometheus")
        ctx = RunContext(config=config, engine=engine, clock=lambda: end)
        with meter.measure() as collect:
            result = source.collect(ctx, default_options(source))
        with meter.measure() as attribution:
            attributed = run_attribution(engine, config, now=end + timedelta(hours=2))
        with engine.connect() as conn:
            kept = conn.execute(text("SELECT count(*) FROM gpu_window")).scalar_one()
        print(f"  prometheus source (batches and inventory, {result.rows_written:,} windows seen, {kept} stored): "
              f"{collect.usage}")  # fmt: skip
        print(
            f"  first attribution, windows read from Prometheus ({attributed.attempts:,} attempts): {attribution.usage}"
        )
        print(
            "  "
            + ratios(
                "ratio to the PostgreSQL store's backfill", collect.usage + attribution.usage, postgresql
            )
        )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=4, help="nodes of 8 GPUs")
    parser.add_argument("--hours", type=float, default=24.0)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--dsn", default=None)
    args = parser.parse_args()
    prometheus, promtool = shutil.which("prometheus"), shutil.which("promtool")
    if not prometheus or not promtool:
        print("prometheus and promtool are needed (Debian: apt-get install prometheus)")
        return 2
    end = START + timedelta(hours=args.hours)
    t0 = time.perf_counter()
    sim, windows = generate(args.nodes, args.hours)
    ended = [
        a
        for a in sim.attempts
        if a.job.end_at is not None and a.job.start_at is not None and a.job.end_at <= end
    ]
    print(f"{args.nodes * 8} GPUs x {args.hours:g} h: {len(windows):,} windows, {len(sim.attempts):,} attempts "
          f"(generated in {time.perf_counter() - t0:.1f} s)", flush=True)  # fmt: skip

    with tempfile.TemporaryDirectory(prefix="slurmtel-peers-") as tmp, scratch_database(args.dsn) as engine:
        work = Path(tmp)
        print("\nbackfill")
        ingest, attribution = backfill_slurmtel(engine, sim, windows, end)
        slurmtel_backfill = ingest + attribution
        print(f"  slurmtel ingest:            {ingest}")
        print(f"  slurmtel first attribution: {attribution}")
        indices = {g.gpu_uuid: g.index for g in sim_inventory(sim, at=START)}
        samples = openmetrics(windows, indices, work / "dcgm.om")
        meter = Meter()
        with meter.measure() as promtool_section:
            subprocess.run(
                [promtool, "tsdb", "create-blocks-from", "openmetrics", str(work / "dcgm.om"), str(work / "data")],
                check=True, capture_output=True,
            )  # fmt: skip
        print(f"  promtool backfill ({samples:,} samples): {promtool_section.usage}")
        backfill_line = ratios(
            "ratio backfill slurmtel / promtool", slurmtel_backfill, promtool_section.usage
        )
        print(f"  {backfill_line} (target <= {TARGET_BACKFILL_RATIO:g})")
        print("  " + ratios("ratio ingest alone / promtool", ingest, promtool_section.usage))

        server, url = start_prometheus(prometheus, work / "data", work)
        try:
            prom = Meter(server_pids=[server.pid])
            pg = Meter(engine)
            # the job: the longest multi-GPU job that ended
            job = max(
                (a for a in ended if a.job.gpus > 1),
                key=lambda a: (a.job.end_at - a.job.start_at, a.job.job_id_raw),
                default=None,
            ) or max(ended, key=lambda a: a.job.end_at - a.job.start_at)
            job_id = str(job.job.job_id_raw)
            seconds = int((job.job.end_at - job.job.start_at).total_seconds())
            job_end = job.job.end_at
            print(f"\njob {job_id}: {job.job.gpus} GPUs, {seconds / 3600:.1f} h")

            def sql() -> Any:
                with engine.connect() as conn:
                    return job_document(conn, JobQuery(job_id, (), end, UTC, EVERYTHING))

            def three() -> Any:
                sel = f'{{hpc_job="{job_id}"}}[{seconds}s]'
                return [
                    promql(url, f"max_over_time(DCGM_FI_DEV_FB_USED{sel})", job_end),
                    promql(url, f"avg_over_time(DCGM_FI_DEV_GPU_UTIL{sel})", job_end),
                    promql(url, f"avg_over_time(DCGM_FI_DEV_POWER_USAGE{sel})", job_end),
                ]

            sql_usage, document = best(pg, args.repeat, sql)
            with served_api(engine, Config(), end) as api:
                served_usage, served_document = best(
                    pg, args.repeat, lambda: api.job_document(JobQuery(job_id, (), end, UTC, EVERYTHING))
                )
            three_usage, answers = best(prom, args.repeat, three)
            assert document and all(answers), (document, answers)
            assert len(answers[1]) == job.job.gpus, answers[1]
            assert served_document == document
            print(f"  SQL behind slurmtel job (job_document, rolled back): {sql_usage.in_ms()}")
            print(f"  the same as the API serves it:                       {served_usage.in_ms()}")
            print(f"  the three PromQL queries:                            {three_usage.in_ms()}")
            print(
                f"  {ratios('ratio job SQL / three PromQL queries', sql_usage, three_usage)} (target <= {TARGET_QUERY_RATIO:g})"
            )
            print(
                f"  {ratios('ratio job SQL as the API serves it / three PromQL queries', served_usage, three_usage)} (target <= {TARGET_QUERY_RATIO:g})"
            )

            config_file = work / "slurmtel.toml"
            db_url = engine.url.render_as_string(hide_password=False)
            config_file.write_text(
                f'[site]\nstate_dir = "{work}"\ntimezone = "UTC"\nclock = "{end.isoformat()}"\n\n[database]\nurl = "{db_url}"\n'
            )
            env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONPYCACHEPREFIX=str(work / "pyc"))
            env.pop("PYTHONDONTWRITEBYTECODE", None)
            slurmtel_job = [sys.executable, "-m", "slurmtel", "--config", str(config_file), "job", job_id]
            jobstats = [
                sys.executable,
                "-c",
                JOBSTATS,
                url,
                job_id,
                f"{job_end.timestamp():.0f}",
                str(seconds),
            ]

            def run(argv: list[str]) -> Any:
                return subprocess.run(argv, env=env, capture_output=True, check=True).stdout

            # the command's backend ends with it: counted from the postmaster's children
            cli = Meter(engine, exited_backends=True)
            job_cli, _ = best(cli, args.repeat, lambda: run(slurmtel_job))
            peer_cli, printed = best(prom, args.repeat, lambda: run(jobstats))
            assert printed.count(b"\n") == job.job.gpus, printed
            print(f"  slurmtel job, end to end:    {job_cli}")
            print(f"  jobstats-like CLI, end to end: {peer_cli}")
            print(
                f"  {ratios('ratio job end to end slurmtel / jobstats-like', job_cli, peer_cli)} (target <= {TARGET_QUERY_RATIO:g})"
            )

            remote_store(args.dsn, sim, url, end, server.pid, slurmtel_backfill)

            print(f"\nidle over the whole {args.hours:g} h")
            first_day, last_day = START.date(), (end - timedelta(microseconds=1)).date()

            def idle() -> Any:
                with engine.connect() as conn:
                    return idle_report(conn, scope=EVERYTHING, first_day=first_day, last_day=last_day)

            span = int((end - START).total_seconds())
            idle_query = f'sum by (hpc_job) (count_over_time((DCGM_FI_DEV_GPU_UTIL{{hpc_job!=""}} < 5)[{span}s:30s])) * 30 / 3600'
            idle_usage, _ = best(pg, args.repeat, idle)
            promql_usage, idle_answer = best(prom, args.repeat, lambda: promql(url, idle_query, end))
            print(f"  report idle's store function:          {idle_usage}")
            print(f"  PromQL idle GPU-hours per job ({len(idle_answer)} jobs): {promql_usage}")
            print(f"  {ratios('ratio report idle query / PromQL', idle_usage, promql_usage)}")
            report_idle = [sys.executable, "-m", "slurmtel", "--config", str(config_file), "report", "idle",
                           "-S", START.isoformat(), "-E", end.isoformat()]  # fmt: skip
            idle_cli, _ = best(cli, args.repeat, lambda: run(report_idle))
            print(f"  slurmtel report idle, end to end: {idle_cli}")
            print(
                f"  {ratios('ratio report idle end to end / PromQL', idle_cli, promql_usage)} (target <= {TARGET_QUERY_RATIO:g})"
            )
            # the same PromQL from a command line too (promtool, a Go binary: its start is small)
            promtool_query = [
                promtool,
                "query",
                "instant",
                "--time",
                f"{end.timestamp():.0f}",
                url,
                idle_query,
            ]
            promtool_cli, _ = best(prom, args.repeat, lambda: run(promtool_query))
            print(f"  the PromQL through `promtool query instant`, end to end: {promtool_cli}")
            print(
                f"  {ratios('ratio report idle end to end / promtool query end to end', idle_cli, promtool_cli)}"
            )
        finally:
            server.terminate()
            server.wait(timeout=30)
    print("\ntarget: job and report <= 1.0x the PromQL peer, backfill <= 2.0x promtool (wall and CPU above)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
