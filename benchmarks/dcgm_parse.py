"""How fast slurmtel's dcgm-exporter parser reads a scrape, next to prometheus_client's parser.

The scrape is generated in the real format: the metric families, HELP/TYPE lines and label set
(gpu, UUID, device, modelName, Hostname, DCGM_FI_DRIVER_VERSION, DCGM_FI_PROCESS_NAME) of the
real dcgm-exporter capture in tests/fixtures/dcgm/datadog_metrics.txt, plus the profiling
fields (GR_ENGINE_ACTIVE, SM_ACTIVE, ...) and an hpc_job label on busy GPUs, with values and
UUIDs varied per GPU. Lines are grouped by metric family as the exporter prints them.

    .venv/bin/python benchmarks/dcgm_parse.py [--nodes 16] [--gpus 8] [--repeat 5]

One "sample row" is one metric line. Prints rows/s of each parser (best of --repeat runs),
the ratio, and the target (>= 50,000 rows/s).
"""

from __future__ import annotations

import argparse
import random
import uuid
from collections.abc import Callable
from datetime import UTC, datetime

from cputime import Meter, Usage, rate_ratios
from prometheus_client.parser import text_string_to_metric_families

from slurmtel.parsers.dcgm import parse_dcgm_metrics

TARGET_ROWS_PER_SECOND = 50_000

# (metric, type, help, value generator) in the capture's order; the last five are the DCP fields
FAMILIES = [
    ("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz).", lambda r: r.choice([300, 1410, 1980])),
    ("DCGM_FI_DEV_MEM_CLOCK", "gauge", "Memory clock frequency (in MHz).", lambda r: r.choice([405, 2619])),
    ("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C).", lambda r: r.randint(25, 80)),
    ("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W).", lambda r: f"{r.uniform(60, 700):.6f}"),
    (
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        "counter",
        "Total energy consumption since boot (in mJ).",
        lambda r: r.randint(10**8, 10**12),
    ),
    ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter", "Total number of PCIe retries.", lambda r: 0),
    ("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %).", lambda r: r.randint(0, 100)),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", "gauge", "Memory utilization (in %).", lambda r: r.randint(0, 100)),
    ("DCGM_FI_DEV_ENC_UTIL", "gauge", "Encoder utilization (in %).", lambda r: 0),
    ("DCGM_FI_DEV_DEC_UTIL", "gauge", "Decoder utilization (in %).", lambda r: 0),
    ("DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error encountered.", lambda r: 0),
    ("DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB).", lambda r: r.randint(0, 81559)),
    ("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB).", lambda r: r.randint(0, 81559)),
    (
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
        "counter",
        "Total number of NVLink bandwidth counters for all lanes",
        lambda r: r.randint(0, 10**9),
    ),
    ("DCGM_FI_DEV_VGPU_LICENSE_STATUS", "gauge", "vGPU License status", lambda r: 0),
    (
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        "counter",
        "Number of remapped rows for uncorrectable errors",
        lambda r: 0,
    ),
    (
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
        "counter",
        "Number of remapped rows for correctable errors",
        lambda r: 0,
    ),
    ("DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge", "Whether remapping of rows has failed", lambda r: 0),
    (
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
        "gauge",
        "Ratio of time the graphics engine is active.",
        lambda r: f"{r.random():.6f}",
    ),
    (
        "DCGM_FI_PROF_SM_ACTIVE",
        "gauge",
        "The ratio of cycles an SM has at least 1 warp assigned.",
        lambda r: f"{r.random():.6f}",
    ),
    (
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        "gauge",
        "Ratio of cycles the tensor (HMMA) pipe is active.",
        lambda r: f"{r.random():.6f}",
    ),
    (
        "DCGM_FI_PROF_DRAM_ACTIVE",
        "gauge",
        "Ratio of cycles the device memory interface is active sending or receiving data.",
        lambda r: f"{r.random():.6f}",
    ),
    (
        "DCGM_FI_PROF_PCIE_TX_BYTES",
        "gauge",
        "The rate of data transmitted over the PCIe bus - including both protocol headers and data "
        "payloads - in bytes per second.",
        lambda r: r.randint(0, 10**9),
    ),
]


def generate_scrape(nodes: int, gpus_per_node: int, seed: int = 1) -> str:
    """A scrape text with every node's GPUs, in the exporter's layout (families in order)."""
    rng = random.Random(seed)
    label_sets = []
    for node in range(nodes):
        hostname = f"gpu{node + 1:03d}"
        for index in range(gpus_per_node):
            gpu_uuid = f"GPU-{uuid.UUID(int=rng.getrandbits(128))}"
            labels = (
                f'gpu="{index}",UUID="{gpu_uuid}",device="nvidia{index}",'
                f'modelName="NVIDIA H100 80GB HBM3",Hostname="{hostname}",'
                f'DCGM_FI_DRIVER_VERSION="550.54.15",DCGM_FI_PROCESS_NAME="/usr/bin/dcgm-exporter"'
            )
            if rng.random() < 0.7:
                labels += f',hpc_job="{rng.randint(1000, 999999)}"'
            label_sets.append(labels)
    out: list[str] = []
    for name, kind, help_text, value in FAMILIES:
        out.append(f"# HELP {name} {help_text}")
        out.append(f"# TYPE {name} {kind}")
        out.extend(f"{name}{{{labels}}} {value(rng)}" for labels in label_sets)
    return "\n".join(out) + "\n"


def count_sample_rows(text: str) -> int:
    return sum(1 for line in text.splitlines() if line and not line.startswith("#"))


def time_best(function: Callable[[], object], repeat: int) -> Usage:
    """The best of REPEAT runs, by wall seconds (with that run's CPU seconds: no database here)."""
    meter = Meter()
    best = Usage(float("inf"), 0.0)
    for _ in range(repeat):
        with meter.measure() as section:
            function()
        best = min(best, section.usage, key=lambda usage: usage.wall)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=16)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()

    text = generate_scrape(args.nodes, args.gpus)
    rows = count_sample_rows(text)
    at = datetime.now(UTC)

    scrape = parse_dcgm_metrics(text, node="bench", at=at)
    assert len(scrape.gpus) == args.nodes * args.gpus, len(scrape.gpus)
    assert not scrape.rejected and not scrape.dropped
    reference_rows = sum(len(family.samples) for family in text_string_to_metric_families(text))
    assert reference_rows == rows, (reference_rows, rows)

    ours_usage = time_best(lambda: parse_dcgm_metrics(text, node="bench", at=at), args.repeat)
    theirs_usage = time_best(
        lambda: [len(f.samples) for f in text_string_to_metric_families(text)], args.repeat
    )
    ours, theirs = ours_usage.wall, theirs_usage.wall
    ours_rate, theirs_rate = rows / ours, rows / theirs
    print(f"scrape: {args.nodes} nodes x {args.gpus} GPUs, {rows} sample rows, {len(text)} bytes")
    print(f"slurmtel parse_dcgm_metrics        {ours_rate:12,.0f} rows/s  ({ours * 1000:.1f} ms)")
    print(f"prometheus_client text parser      {theirs_rate:12,.0f} rows/s  ({theirs * 1000:.1f} ms)")
    print(f"ratio                              {ours_rate / theirs_rate:12.1f} x")
    print(
        f"CPU: slurmtel {ours_usage.client * 1000:.1f} ms, prometheus_client {theirs_usage.client * 1000:.1f} ms"
    )
    print(rate_ratios("rate ratio slurmtel / prometheus_client", ours_usage, theirs_usage))
    verdict = "met" if ours_rate >= TARGET_ROWS_PER_SECOND else "NOT met"
    print(f"target                             {TARGET_ROWS_PER_SECOND:12,} rows/s  ({verdict})")


if __name__ == "__main__":
    main()
