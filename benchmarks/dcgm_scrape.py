"""One dcgm-exporter scrape of many GPUs through the whole dcgm source: parse, energy, screening,
inventory and window writes, quarantine (slurmtel.sources.dcgm.DcgmSource, as `collect dcgm`
runs it), at growing sizes: the time per GPU must stay flat (linear in GPUs; a scan of the
scrape per GPU made 20,000 GPUs take minutes).

The scrape is benchmarks/dcgm_parse.py's generated one (the real exporter's families and
labels), every GPU on one node. Each size runs in a scratch database of its own, twice: the
first scrape of the GPUs (no energy counter before it) and the next one, 30 s later.

    python benchmarks/dcgm_scrape.py [--gpus 2504,5000,10000,20000] [--dsn URL]

Prints seconds and milliseconds per GPU of each size, the ratio of the largest size's per-GPU
time to the smallest's (1.0 = linear), and the target (20,000 GPUs in seconds: < 30 s).
"""

from __future__ import annotations

import argparse
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cputime import Meter, Usage
from dcgm_parse import generate_scrape
from scratch import scratch_database

from slurmtel.config import Config
from slurmtel.parsers.dcgm import parse_dcgm_metrics
from slurmtel.sources.base import RunContext, RunResult
from slurmtel.sources.dcgm import DcgmSource
from slurmtel.store.telemetry import PartitionBudget

TARGET_SECONDS = 30.0


def one_size(gpus: int, dsn: str | None) -> tuple[Usage, Usage]:
    """Wall and CPU seconds of the first and of the second scrape of GPUS GPUs."""
    text = generate_scrape(gpus // 8, 8)
    at = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=5)
    config = Config()
    with scratch_database(dsn, prefix="slurmtel_bench_dcgm") as engine:
        source = DcgmSource()
        times = []
        meter = Meter(engine)
        for step in range(2):
            when = at + timedelta(seconds=30 * step)
            ctx = RunContext(config=config, engine=engine, clock=lambda when=when: when)  # type: ignore[misc]
            with meter.measure() as section:
                scrape = parse_dcgm_metrics(text, node="bignode", at=when)
                result = RunResult()
                source._store(
                    ctx, scrape, result, PartitionBudget(config.telemetry.max_new_partitions_per_run)
                )
            times.append(section.usage)
            assert result.rows_written == gpus, (result.rows_written, result.notes)
        engine.dispose()
    return times[0], times[1]


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--gpus", default="2504,5000,10000,20000", help="comma-separated sizes")
    parser.add_argument("--dsn", default=None)
    args = parser.parse_args()
    sizes = [int(g) // 8 * 8 for g in args.gpus.split(",")]  # 8 GPUs per generated host
    per_gpu, per_gpu_cpu = [], []
    print(f"{'GPUs':>8}{'first s':>10}{'next s':>10}{'ms/GPU':>10}{'next CPU s':>12}{'CPU ms/GPU':>12}")
    second = Usage(0.0, 0.0)
    for gpus in sizes:
        first, second = one_size(gpus, args.dsn)
        per_gpu.append(second.wall / gpus * 1000)
        per_gpu_cpu.append(second.cpu / gpus * 1000)
        print(f"{gpus:>8}{first.wall:>10.2f}{second.wall:>10.2f}{per_gpu[-1]:>10.3f}"
              f"{second.cpu:>12.2f}{per_gpu_cpu[-1]:>12.3f}", flush=True)  # fmt: skip
    ratio = per_gpu[-1] / per_gpu[0]
    print(f"per-GPU time, {sizes[-1]} GPUs against {sizes[0]}: ratio {ratio:.2f} (1.0 = linear); "
          f"from CPU: {per_gpu_cpu[-1] / per_gpu_cpu[0]:.2f}")  # fmt: skip
    print(f"largest, next scrape: {second}")
    verdict = "met" if second.wall < TARGET_SECONDS else "NOT met"
    print(f"target: {sizes[-1]} GPUs in under {TARGET_SECONDS:.0f} s: {verdict} ({second.wall:.2f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
