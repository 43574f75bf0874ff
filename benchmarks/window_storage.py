"""Window storage: bytes per GPU window, one row per window against packed hours, in one run.

--gpus GPUs (8 per node) report --days of 30 s windows, generated as the NVML agent summarises
its 1 s samples (slurmtel.simulate.sampled_windows: unrounded means, a job changing every few
minutes) and stored through the real writer (write_summaries, binary COPY into gpu_window).
Whole-node jobs of 4 h cover the period. Then, in one database:

  before: the windows one row each (the layout up to migration 0011): bytes per window with
          indexes after VACUUM, and a full attribution run over them;
  pack:   the attribution run's packing of closed hours (pack_windows), windows/s;
  after:  the same windows packed one row per GPU and hour: bytes per window, and the same full
          attribution run;
  host:   issue 26's host signals for the same windows, as the agent ships them: a job host
          window (cgroup IO, CPU, PSI, its GPUs' PCIe) per job, node and window, and a GPU host
          window (throttle seconds) for the GPU-windows with throttling (10 % here): the bytes
          they add per stored GPU-window.

    python benchmarks/window_storage.py [--gpus 256] [--days 1] [--dsn URL]

Target (scale issue): at most 40 bytes per window with indexes; a 10,000-GPU month at 30 s
(864 million windows) in 40 GB.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from datetime import UTC, datetime, timedelta

from cputime import Meter, Usage, ratios
from scratch import scratch_database
from sqlalchemy import Engine, text

from slurmtel.attribution import run_attribution
from slurmtel.config import Config
from slurmtel.records import GpuHostWindow, GpuInventory, JobAttempt, JobHostWindow
from slurmtel.simulate import sampled_windows
from slurmtel.store.hostside import write_gpu_host_windows, write_job_host_windows
from slurmtel.store.jobs import write_attempts
from slurmtel.store.telemetry import window_store_size, write_inventory, write_summaries

TARGET_BYTES_PER_WINDOW = 40
GPUS_PER_NODE = 8
JOB_HOURS = 4
START = datetime(2026, 10, 5, tzinfo=UTC)
WINDOWS_PER_MONTH_10K = 10_000 * 30 * 86_400 // 30


def node_of(gpu: int) -> str:
    return f"n{gpu // GPUS_PER_NODE:04d}"


def load(engine: Engine, gpus: int, days: int) -> tuple[int, float]:
    """Store every GPU's windows node by node through the writer; (windows, seconds writing)."""
    per_gpu = days * 86_400 // 30
    written, writing = 0, 0.0
    for first in range(0, gpus, GPUS_PER_NODE):
        node = node_of(first)
        windows = [
            w for g in range(first, min(gpus, first + GPUS_PER_NODE)) for w in sampled_windows(node, f"GPU-{g:05d}", START, per_gpu)
        ]  # fmt: skip
        t0 = time.perf_counter()
        with engine.begin() as conn:
            written += write_summaries(conn, windows, source="agent", node=node).inserted
        writing += time.perf_counter() - t0
    return written, writing


def jobs(gpus: int, days: int) -> list[JobAttempt]:
    result = []
    for n, first in enumerate(range(0, gpus, GPUS_PER_NODE)):
        for slot in range(days * 24 // JOB_HOURS):
            begin = START + timedelta(hours=JOB_HOURS * slot)
            job_id = n * 1_000 + slot + 1
            result.append(
                JobAttempt(
                    cluster="bench", job_id_raw=job_id, submit_at=begin, job_id=str(job_id), name="train",
                    user=f"u{n % 20}", account=f"acct{n % 5}", partition="gpu", state="COMPLETED",
                    eligible_at=begin, start_at=begin, end_at=begin + timedelta(hours=JOB_HOURS),
                    alloc_gpus=GPUS_PER_NODE, alloc_tres={"gres/gpu": GPUS_PER_NODE},
                    nodes=(node_of(first),), nodelist=node_of(first), gpu_model="h100",
                )
            )  # fmt: skip
    return result


def inventory(gpus: int) -> list[GpuInventory]:
    return [
        GpuInventory(node=node_of(g), gpu_uuid=f"GPU-{g:05d}", index=g % GPUS_PER_NODE, model="NVIDIA H100",
                     observed_at=START, memory_total_bytes=81_559 * 2**20)
        for g in range(gpus)
    ]  # fmt: skip


def load_host(engine: Engine, gpus: int, days: int) -> tuple[int, int]:
    """Every GPU-window's host window and every node's job window (one job per node at a time)."""
    rng = random.Random(26)
    per_gpu = days * 86_400 // 30
    gpu_rows = job_rows = 0
    for first in range(0, gpus, GPUS_PER_NODE):
        node = node_of(first)
        gpu_windows, job_windows = [], []
        for k in range(per_gpu):
            at = START + timedelta(seconds=30 * k)
            for g in range(first, min(gpus, first + GPUS_PER_NODE)):
                throttled = rng.random() < 0.1
                gpu_windows.append(
                    GpuHostWindow(
                        node, f"GPU-{g:05d}", at, 30.0, pcie_tx_bytes=rng.randrange(0, 2**34),
                        pcie_rx_bytes=rng.randrange(0, 2**34),
                        throttle_power_seconds=rng.uniform(0, 30) if throttled else 0.0,
                        throttle_thermal_seconds=0.0, throttle_hw_slowdown_seconds=0.0,
                    )
                )  # fmt: skip
            job = (first // GPUS_PER_NODE) * 1_000 + (k * 30) // (JOB_HOURS * 3600) + 1
            job_windows.append(
                JobHostWindow(
                    node, str(job), at, 30.0, 2, read_bytes=rng.randrange(0, 2**32), write_bytes=rng.randrange(0, 2**30),
                    read_ops=rng.randrange(0, 10**5), write_ops=rng.randrange(0, 10**4),
                    cpu_usage_seconds=rng.uniform(0, 30 * 64), cpus=64, memory_peak_bytes=rng.randrange(2**34, 2**39),
                    io_some_stall_seconds=rng.uniform(0, 3), io_full_stall_seconds=rng.uniform(0, 1),
                    cpu_some_stall_seconds=rng.uniform(0, 3), memory_some_stall_seconds=0.0,
                    memory_full_stall_seconds=0.0, pcie_tx_bytes=rng.randrange(0, 2**37),
                    pcie_rx_bytes=rng.randrange(0, 2**37),
                )
            )  # fmt: skip
        with engine.begin() as conn:
            gpu_rows += write_gpu_host_windows(conn, gpu_windows)
            job_rows += write_job_host_windows(conn, job_windows)
    return gpu_rows, job_rows


def host_size(engine: Engine) -> tuple[int, int]:
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("VACUUM ANALYZE gpu_host_window, job_host_window"))
        gpu = conn.execute(text("SELECT pg_total_relation_size('gpu_host_window')")).scalar_one()
        job = conn.execute(text("SELECT pg_total_relation_size('job_host_window')")).scalar_one()
    return int(gpu), int(job)


def measure(engine: Engine) -> tuple[float, int, int]:
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("VACUUM ANALYZE gpu_window, gpu_window_hour"))
        size, windows = window_store_size(conn)
    return size / windows, size, windows


def attribute(engine: Engine, config: Config, now: datetime, *, pack: bool) -> Usage:
    with Meter(engine).measure() as section:
        run_attribution(engine, config, now=now, full=True, pack=pack)
    return section.usage


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--gpus", type=int, default=256)
    parser.add_argument("--days", type=int, default=1)
    parser.add_argument("--dsn", default=None)
    parser.add_argument("--keep", action="store_true", help="keep the scratch database")
    args = parser.parse_args()
    config = Config()
    end = START + timedelta(days=args.days)
    with scratch_database(args.dsn, keep=args.keep) as engine:
        print(
            f"{args.gpus} GPUs x {args.days} day(s) of 30 s windows, {JOB_HOURS} h whole-node jobs",
            flush=True,
        )
        with engine.begin() as conn:
            write_attempts(conn, jobs(args.gpus, args.days))
            write_inventory(conn, inventory(args.gpus), source="agent")
        windows, writing = load(engine, args.gpus, args.days)
        print(f"  stored {windows:,} windows through write_summaries: {windows / writing:,.0f} windows/s")

        before, before_size, _ = measure(engine)
        unpacked_usage = attribute(engine, config, end + timedelta(hours=2), pack=False)
        with Meter(engine).measure() as packing_section:
            packed = run_attribution(engine, config, now=end + timedelta(hours=2)).packed_windows
        packing = packing_section.usage.wall
        after, after_size, counted = measure(engine)
        packed_usage = attribute(engine, config, end + timedelta(hours=2), pack=False)
        attributed_unpacked, attributed_packed = unpacked_usage.wall, packed_usage.wall
        assert counted == windows, (counted, windows)

        print(f"before (one row per window): {before:,.1f} bytes/window ({before_size / 2**20:,.1f} MiB), "
              f"full attribution {attributed_unpacked:.2f} s = {windows / attributed_unpacked:,.0f} windows/s")  # fmt: skip
        print(f"pack: {packed:,} windows in {packing:.2f} s = {packed / packing:,.0f} windows/s "
              f"(the attribution run that packs them, included)")  # fmt: skip
        print(f"after (packed hours):        {after:,.1f} bytes/window ({after_size / 2**20:,.1f} MiB), "
              f"full attribution {attributed_packed:.2f} s = {windows / attributed_packed:,.0f} windows/s")  # fmt: skip
        print(f"ratio: {before / after:.1f}x fewer bytes; attribution packed/unpacked time "
              f"{attributed_packed / attributed_unpacked:.2f}")  # fmt: skip
        print(f"  full attribution, unpacked: {unpacked_usage}")
        print(f"  packing run:                {packing_section.usage}")
        print(f"  full attribution, packed:   {packed_usage}")
        print(ratios("attribution packed / unpacked", packed_usage, unpacked_usage))
        gpu_rows, job_rows = load_host(engine, args.gpus, args.days)
        gpu_bytes, job_bytes = host_size(engine)
        added = (gpu_bytes + job_bytes) / windows
        print(f"host signals (issue 26): {gpu_rows:,} throttled GPU host windows "
              f"{gpu_bytes / max(gpu_rows, 1):,.1f} bytes each, "
              f"{job_rows:,} job host windows {job_bytes / job_rows:,.1f} bytes each")  # fmt: skip
        print(f"  added bytes per stored GPU-window: {added:,.1f} (GPU {gpu_bytes / windows:,.1f} + "
              f"job {job_bytes / windows:,.1f}); before {after:,.1f}, after {after + added:,.1f} bytes/window "
              f"(ratio {(after + added) / after:.1f}x); a 10,000-GPU month: "
              f"{(after + added) * WINDOWS_PER_MONTH_10K / 1e9:,.1f} GB")  # fmt: skip
        month = after * WINDOWS_PER_MONTH_10K / 1e9
        verdict = "met" if after <= TARGET_BYTES_PER_WINDOW else "NOT met"
        print(f"target: <= {TARGET_BYTES_PER_WINDOW} bytes/window: {verdict}; a 10,000-GPU month at 30 s: "
              f"{month:,.1f} GB (must fit in 40 GB)")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
