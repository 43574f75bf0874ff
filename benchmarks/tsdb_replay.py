"""A generated cluster replayed with its GPU samples kept in VictoriaMetrics (the sample store
of `telemetry.sample_store = "prometheus"`): what the path past one head node costs, measured.

The cluster and its jobs are benchmarks/scale.py's (nodes of 8 GPUs, about 30,000 jobs a day
per 10,000 GPUs, half the GPUs held by multi-day jobs at the start). Simulated time moves in
steps of the attribution interval (5 minutes). In each step:

  nodes:  every GPU's 30 s windows of the step as dcgm-exporter's readings (utilisation,
          memory used, power; with --all-fields the eleven fields the prometheus source reads
          by default, an energy counter among them; the job on the GPU in `hpc_job`,
          dcgm-exporter's labels), one sample per window, written into VictoriaMetrics (Debian's victoria-metrics) through
          /api/v1/import, as the site's scrapers would have; then flushed;
  sacct:  the attempts submitted, started or ended in the step, rendered as `sacct --json` and
          stored by the sacct source's own path;
  source: the prometheus source's run (`collect prometheus`): the series from its cursor, the
          inventory and one ingest batch per node; no window stored in PostgreSQL;
  attribution: `run_attribution` as the daemon runs it: the sample store reads the windows it
          needs from VictoriaMetrics (query_range) into the transaction's temporary tables.

Printed per step: the TSDB write, sacct, source and attribution seconds (wall and CPU: this
process, the PostgreSQL backends, the VictoriaMetrics process), the windows the sample store
read, and whether the step kept up with real time. At the end: attribution per step against the
target (< 60 s), PostgreSQL's growth per simulated hour and extrapolated per month,
VictoriaMetrics' bytes per sample (its own /metrics), `slurmtel job`'s SQL and reads for the
longest job that ended, and every admin report over the month.

    python benchmarks/tsdb_replay.py [--gpus 100000] [--hours 2] [--max-minutes 60] [--all-fields] [--dsn URL]

--max-minutes bounds the run's wall time: the replay stops after the step that passes it and
says how many steps it did (the figures are of those steps only).
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from datetime import UTC, timedelta
from pathlib import Path
from typing import Any

import orjson
from cputime import Meter, Usage
from peers import free_port
from scale import (
    GPUS_PER_NODE,
    START,
    WINDOW,
    Windows,
    job_mix,
    runs_back_overlap,
    sacct_document,
    time_reports,
)
from scratch import configured_server, scratch_database
from sqlalchemy import text

from slurmtel.access import EVERYTHING
from slurmtel.attribution import run_attribution
from slurmtel.config import Config, config_from_dict
from slurmtel.records import GpuSummary
from slurmtel.reports.researcher import JobQuery, job_document
from slurmtel.sources import default_options, get_source
from slurmtel.sources.base import RunContext, RunResult
from slurmtel.sources.sacct import SacctDocument, store_documents
from slurmtel.store.samples import sample_store
from slurmtel.store.telemetry import ensure_partitions

TARGET_ATTRIBUTION_SECONDS = 60.0
MODEL = "NVIDIA H100 80GB HBM3"
# import bodies of about this many bytes
IMPORT_CHUNK_BYTES = 32 << 20


@dataclass
class Victoria:
    url: str
    process: subprocess.Popen[bytes]
    data: Path

    def get(self, path: str) -> bytes:
        with urllib.request.urlopen(self.url + path, timeout=600) as response:
            body: bytes = response.read()
            return body

    def post(self, path: str, body: bytes) -> None:
        request = urllib.request.Request(self.url + path, data=body, method="POST")
        with urllib.request.urlopen(request, timeout=600) as response:
            response.read()

    def metrics(self) -> dict[str, float]:
        """Its own /metrics, name{labels} -> value."""
        out = {}
        for line in self.get("/metrics").decode().splitlines():
            if line and not line.startswith("#"):
                key, _, value = line.rpartition(" ")
                try:
                    out[key] = float(value)
                except ValueError:
                    continue
        return out


def start_victoria(binary: str, workdir: Path) -> Victoria:
    port = free_port()
    data = workdir / "vmdata"
    process = subprocess.Popen(
        [binary, f"-storageDataPath={data}", f"-httpListenAddr=127.0.0.1:{port}", "-retentionPeriod=100y",
         "-search.latencyOffset=0s", "-search.disableCache", "-loggerLevel=WARN",
         # a query of nodes_per_query nodes x 240 points stays far below these; the defaults
         # refuse the replay's first queries of a whole cluster's label values
         "-search.maxUniqueTimeseries=10000000", "-search.maxSamplesPerQuery=10000000000"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    server = Victoria(f"http://127.0.0.1:{port}", process, data)
    for _ in range(600):
        if process.poll() is not None:
            raise SystemExit(f"victoria-metrics ended at start (exit {process.returncode})")
        try:
            server.get("/health")
            return server
        except OSError:
            time.sleep(0.1)
    raise SystemExit("victoria-metrics did not answer")


MEMORY_TOTAL_MIB = 81559


def _readings(all_fields: bool) -> tuple[tuple[str, Any], ...]:
    """(metric, reading of a window) of the series written: three (utilisation, memory used,
    power), or dcgm-exporter's eleven of DEFAULT_PROMETHEUS_METRICS (the energy counter given
    apart: it carries over from window to window)."""
    three = (
        ("DCGM_FI_DEV_GPU_UTIL", lambda w: w.util_mean_percent),
        ("DCGM_FI_DEV_FB_USED", lambda w: (w.memory_used_max_bytes or 0) // 2**20),
        ("DCGM_FI_DEV_POWER_USAGE", lambda w: w.power_mean_watts),
    )
    if not all_fields:
        return three
    return (
        *three,
        ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", lambda w: round(w.util_mean_percent / 100, 4)),
        ("DCGM_FI_PROF_SM_ACTIVE", lambda w: round(w.util_mean_percent * 0.9 / 100, 4)),
        ("DCGM_FI_DEV_FB_FREE", lambda w: MEMORY_TOTAL_MIB - (w.memory_used_max_bytes or 0) // 2**20),
        ("DCGM_FI_DEV_FB_TOTAL", lambda w: MEMORY_TOTAL_MIB),
        ("DCGM_FI_DEV_GPU_TEMP", lambda w: round(30 + w.util_mean_percent * 0.4)),
        ("DCGM_FI_DEV_SM_CLOCK", lambda w: 1980 if w.util_mean_percent > 0 else 345),
        ("DCGM_FI_DEV_XID_ERRORS", lambda w: 0),
    )


def import_lines(
    by_node: dict[str, list[GpuSummary]],
    indices: dict[str, int],
    *,
    all_fields: bool,
    energy_mj: dict[str, float],
) -> tuple[list[bytes], int]:
    """The windows as /api/v1/import lines: per GPU, metric and job on the GPU, one series with
    a sample at each window's start (the reading the prometheus source gives that window); and
    how many samples. With ALL_FIELDS, dcgm-exporter's eleven default fields, the energy
    counter (mJ) carried on in ENERGY_MJ per GPU."""
    readings = _readings(all_fields)
    lines = []
    samples = 0
    for node, windows in by_node.items():
        series: dict[tuple[str, str], list[GpuSummary]] = {}
        counters: dict[int, float] = {}
        for w in windows:  # each GPU's in time order
            series.setdefault((w.gpu_uuid, w.job_ids[0] if w.job_ids else ""), []).append(w)
            if all_fields:
                counters[id(w)] = energy_mj.get(w.gpu_uuid, 0.0)
                energy_mj[w.gpu_uuid] = (
                    counters[id(w)] + (w.power_mean_watts or 0.0) * w.window_seconds * 1000
                )
        for (uuid, job), ws in series.items():
            index = str(indices[uuid])
            labels = {"gpu": index, "UUID": uuid, "device": f"nvidia{index}", "modelName": MODEL,
                      "Hostname": node, "hpc_job": job, "instance": f"{node}:9400", "job": "dcgm"}  # fmt: skip
            stamps = [int(w.window_start_at.timestamp() * 1000) for w in ws]
            columns = [(name, [reading(w) for w in ws]) for name, reading in readings]
            if all_fields:
                columns.append(("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", [counters[id(w)] for w in ws]))
            samples += len(columns) * len(ws)
            for name, values in columns:
                lines.append(
                    orjson.dumps(
                        {"metric": {"__name__": name, **labels}, "values": values, "timestamps": stamps}
                    )
                )
    return lines, samples


@dataclass
class Step:
    index: int
    write: Usage
    sacct: Usage
    source: Usage
    attribution: Usage
    samples: int
    fetched: int
    attempts: int

    @property
    def busy(self) -> float:
        return self.write.wall + self.sacct.wall + self.source.wall + self.attribution.wall


def _database_bytes(engine: Any) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text("SELECT pg_database_size(current_database())")).scalar_one())


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--gpus", type=int, default=100_000)
    parser.add_argument("--hours", type=float, default=2)
    parser.add_argument("--step-minutes", type=float, default=Config().attribution.interval_seconds / 60)
    parser.add_argument("--max-minutes", type=float, default=60, help="stop after the step that passes this")
    parser.add_argument(
        "--all-fields", action="store_true", help="write dcgm-exporter's eleven default fields, not three"
    )
    parser.add_argument("--dsn", default=None)
    args = parser.parse_args()
    dsn = configured_server(args.dsn)
    if not dsn:
        print("give --dsn or SLURMTEL_TEST_DSN: this benchmark needs a PostgreSQL server with room for it")
        return 2
    binary = shutil.which("victoria-metrics")
    if not binary:
        print("victoria-metrics is not installed (Debian: scripts/ci-slurm-deps.sh victoria-metrics)")
        return 2
    gpus = max(GPUS_PER_NODE, args.gpus // GPUS_PER_NODE * GPUS_PER_NODE)
    step = timedelta(minutes=args.step_minutes)
    steps = max(1, int(timedelta(hours=args.hours) / step))
    end = START + steps * step
    deadline = time.monotonic() + args.max_minutes * 60

    t0 = time.perf_counter()
    attempts = job_mix(gpus, START, end)
    windows = Windows(attempts, gpus)
    indices = {uuid: index for (_, index), uuid in windows.uuids.items()}
    started = sum(1 for a in attempts if a.job.start_at is not None)
    print(f"{gpus:,} GPUs in {gpus // GPUS_PER_NODE:,} nodes, {steps} steps of {step.total_seconds() / 60:g} min "
          f"({steps * step.total_seconds() / 3600:g} h), 30 s windows, {11 if args.all_fields else 3} readings a window; {len(attempts):,} "
          f"attempts ({started:,} started; generated in {time.perf_counter() - t0:.1f} s); "
          f"CPUs: {os.cpu_count()}", flush=True)  # fmt: skip

    with tempfile.TemporaryDirectory(prefix="slurmtel-tsdb-replay-") as tmp:
        vm = start_victoria(binary, Path(tmp))
        try:
            base: dict[str, Any] = {
                "telemetry": {"sample_store": "prometheus"},
                # the step's samples are all written before the source runs: it reads up to the
                # last window that has its sample (a window's sample is at its start)
                "sources": {"prometheus": {"enabled": True, "url": vm.url, "delay_seconds": WINDOW,
                                           "initial_lookback_seconds": int(step.total_seconds()),
                                           "timeout_seconds": 600}},
            }  # fmt: skip
            config = config_from_dict(base)
            with scratch_database(dsn, config=config) as engine:
                with engine.begin() as conn:
                    ensure_partitions(conn, START.date(), end.date())
                return replay(
                    args, config, base, engine, vm, attempts, windows, indices, steps, step, deadline
                )
        finally:
            vm.process.terminate()
            vm.process.wait(timeout=60)


def replay(
    args: argparse.Namespace,
    config: Config,
    base: dict[str, Any],
    engine: Any,
    vm: Victoria,
    attempts: list[Any],
    windows: Windows,
    indices: dict[str, int],
    steps: int,
    step: timedelta,
    deadline: float,
) -> int:
    meter = Meter(engine, server_pids=[vm.process.pid])
    source = get_source("prometheus")
    options = default_options(source)
    clock_at = START

    def clock() -> Any:
        return clock_at

    ctx = RunContext(config=config, engine=engine, clock=clock)
    db_start = _database_bytes(engine)
    print(f"\n{'step':>4} {'end':>5} {'samples':>9} {'write s':>8} {'sacct s':>8} {'source s':>9} "
          f"{'attr s':>7} {'attr CPU':>8} {'read':>9} {'attempts':>8} {'keeps up':>8}", flush=True)  # fmt: skip
    done: list[Step] = []
    run_starts: list[float] = []
    energy_mj: dict[str, float] = {}
    lo = None
    for k in range(steps):
        step_start = START + k * step
        step_end = step_start + step
        # the nodes' scrapes of the step, in the TSDB
        lines, samples = import_lines(
            windows.between(step_start, step_end), indices, all_fields=args.all_fields, energy_mj=energy_mj
        )
        with meter.measure() as write:
            body: list[bytes] = []
            size = 0
            for line in lines:
                body.append(line)
                size += len(line) + 1
                if size >= IMPORT_CHUNK_BYTES:
                    vm.post("/api/v1/import", b"\n".join(body) + b"\n")
                    body, size = [], 0
            if body:
                vm.post("/api/v1/import", b"\n".join(body) + b"\n")
            vm.get("/internal/force_flush")
        # sacct, then the prometheus source, as the daemon runs them at the step's end
        clock_at = step_end
        document, _ = sacct_document(attempts, lo, step_end)
        lo = step_end
        with meter.measure() as sacct:
            store_documents(ctx, [SacctDocument(f"sacct step {k}", document, step_end)], RunResult())
        with meter.measure() as collect:
            result = source.collect(ctx, options)
        if result.rows_quarantined:
            print(f"  source quarantined {result.rows_quarantined} rows: {result.notes[:3]}")
        # attribution, reading the windows it needs from the TSDB
        run_starts.append(time.time())
        run_config = config_from_dict(
            {**base, "attribution": {"overlap_seconds": runs_back_overlap(config, step, run_starts)}}
        )
        with meter.measure() as attribute:
            attribution = run_attribution(engine, run_config, now=step_end)
        s = Step(k + 1, write.usage, sacct.usage, collect.usage, attribute.usage,
                 samples, attribution.windows, attribution.attempts)  # fmt: skip
        done.append(s)
        keeps = "yes" if s.busy < step.total_seconds() else "NO"
        print(f"{s.index:>4} {step_end:%H:%M} {s.samples:>9,} {s.write.wall:>8.2f} {s.sacct.wall:>8.2f} "
              f"{s.source.wall:>9.2f} {s.attribution.wall:>7.2f} {s.attribution.cpu:>8.2f} {s.fetched:>9,} "
              f"{s.attempts:>8,} {keeps:>8}", flush=True)  # fmt: skip
        if time.monotonic() > deadline and k + 1 < steps:
            print(f"stopped after {k + 1} of {steps} steps: --max-minutes {args.max_minutes:g} passed")
            break
    return report(engine, config, vm, done, step, db_start, windows)


def report(
    engine: Any,
    config: Config,
    vm: Victoria,
    done: list[Step],
    step: timedelta,
    db_start: int,
    windows: Windows,
) -> int:
    gpus = len(windows.gpus)
    hours = len(done) * step.total_seconds() / 3600
    print(f"\n{len(done)} steps ({hours:g} simulated hours) of {gpus:,} GPUs")
    for name, pick in (
        ("TSDB write (import + flush)", lambda s: s.write),
        ("sacct", lambda s: s.sacct),
        ("prometheus source", lambda s: s.source),
        ("attribution", lambda s: s.attribution),
    ):
        usages = [pick(s) for s in done]
        print(f"  {name:<28} wall mean {statistics.fmean(u.wall for u in usages):7.2f} s, "
              f"max {max(u.wall for u in usages):7.2f} s; CPU mean {statistics.fmean(u.cpu for u in usages):7.2f} s, "
              f"max {max(u.cpu for u in usages):7.2f} s")  # fmt: skip
    slowest = max(done, key=lambda s: s.attribution.wall)
    print(f"  slowest attribution run: step {slowest.index}, {slowest.attribution}")
    attr_wall = max(s.attribution.wall for s in done)
    attr_cpu = max(s.attribution.cpu for s in done)
    print(f"  target: attribution per step < {TARGET_ATTRIBUTION_SECONDS:g} s: "
          f"{'met' if attr_wall < TARGET_ATTRIBUTION_SECONDS else 'NOT met'} by wall ({attr_wall:.1f} s), "
          f"{'met' if attr_cpu < TARGET_ATTRIBUTION_SECONDS else 'NOT met'} by CPU ({attr_cpu:.1f} s)")  # fmt: skip
    fetched = [s.fetched for s in done]
    print(f"  windows attribution read per step (its slices' windows): mean {statistics.fmean(fetched):,.0f}, max {max(fetched):,} "
          f"({statistics.fmean(fetched) / (gpus * step.total_seconds() / WINDOW):.1f} x the step's new windows)")  # fmt: skip
    slow = [s for s in done if s.busy >= step.total_seconds()]
    print(
        f"  keeps up with real time: {'every step' if not slow else f'NOT in {len(slow)} of {len(done)} steps'}"
    )

    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("VACUUM ANALYZE"))
        windows_in_pg = sample_store().size(conn)[1]
    grown = _database_bytes(engine) - db_start
    per_month = grown / hours * 24 * 30 if hours else math.nan
    print(f"\nPostgreSQL: grew {grown / 2**20:,.1f} MiB in {hours:g} simulated hours (after VACUUM), "
          f"about {per_month / 2**30:,.1f} GiB a month at this rate; windows kept in PostgreSQL: {windows_in_pg}")  # fmt: skip
    vm.get("/internal/force_flush")
    metrics = vm.metrics()

    def total(name: str, prefix: str) -> float:
        return sum(v for key, v in metrics.items() if key.startswith(f'{name}{{type="{prefix}'))

    rows, data, index = (
        total("vm_rows", "storage/"),
        total("vm_data_size_bytes", "storage/"),
        total("vm_data_size_bytes", "indexdb"),
    )
    print(f"VictoriaMetrics: {rows:,.0f} samples in {data / 2**20:,.1f} MiB of data parts ({data / rows:.2f} B per "
          f"sample), its index {index / 2**20:,.1f} MiB ({(data + index) / rows:.2f} B per sample with it)")  # fmt: skip

    # slurmtel job: the longest multi-GPU attempt that ended, its windows read from the TSDB
    end = START + len(done) * step
    with engine.connect() as conn:
        job = conn.execute(
            text(
                "SELECT job_id_raw FROM job_attempt WHERE end_at <= :end AND start_at >= :start AND alloc_gpus > 1 "
                "ORDER BY end_at - start_at DESC, job_id_raw LIMIT 1"
            ),
            {"end": end, "start": START},
        ).scalar()
    if job is not None:
        meter = Meter(engine, server_pids=[vm.process.pid])
        best = None
        for _ in range(5):
            with engine.connect() as conn, meter.measure() as section:
                query = JobQuery(str(job), (), end, UTC, EVERYTHING, samples=sample_store(config))
                doc = job_document(conn, query)
            best = section.usage if best is None or section.usage.wall < best.wall else best
        print(
            f"slurmtel job {job} (its windows read from the TSDB; best of 5): {best}; {len(doc)} attempt(s)"
        )
    seconds = time_reports(engine, config, end)
    print(f"reports over {end:%Y-%m} (best of 2)")
    for name, u in seconds.items():
        print(f"  {name:<10} {u.wall:7.3f} s  ({u})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
