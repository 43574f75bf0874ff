"""Telemetry ingest, measured in one run:

1. DCGM text parsing in sample rows/s, and the ratio to prometheus_client's parser
   (target >= 50,000 rows/s) - benchmarks/dcgm_parse.py;
2. end to end: node-agent /v1/summaries payloads (bytes, as the agents send them) decoded and
   stored by the head's agent source (COPY into the day-partitioned table), against binary
   COPY of the very same final rows into the same table (target: ratio >= 0.5);
3. agent CPU time per GPU-second sampled, with the fake NVML - benchmarks/agent_cpu.py.

    python benchmarks/telemetry_ingest.py [--gpus 64] [--hours 24] [--dsn URL]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from sqlalchemy import text

sys.path.insert(0, str(Path(__file__).resolve().parent))

import agent_cpu
import dcgm_parse
from scratch import scratch_database

from slurmtel.agent.protocol import (
    decode_summaries_response,
    encode_summaries_response,
    record_to_json,
)
from slurmtel.records import GpuSummary
from slurmtel.sources.agent import _store_page
from slurmtel.sources.base import RunResult
from slurmtel.store.copy import copy_rows
from slurmtel.store.telemetry import _COPY_COLUMNS, ensure_partitions, summary_rows

TARGET_RATIO = 0.5
PAGE = 5000
START = datetime(2026, 11, 2, tzinfo=UTC)


def summaries(gpus: int, hours: int) -> list[GpuSummary]:
    windows = hours * 120
    result = []
    for g in range(gpus):
        for w in range(windows):
            util = float((g * 7 + w * 13) % 100)
            result.append(
                GpuSummary(
                    source="agent",
                    node=f"n{g // 8:03d}",
                    gpu_uuid=f"GPU-{g:08d}",
                    window_start_at=START + timedelta(seconds=30 * w),
                    window_seconds=30.0,
                    util_metric="gr_engine_active",
                    sample_count=30,
                    covered_seconds=30.0,
                    util_mean_percent=util,
                    util_max_percent=min(100.0, util + 5),
                    idle_seconds=30.0 if util < 5 else 0.0,
                    no_process_seconds=0.0,
                    memory_used_mean_bytes=40 << 30,
                    memory_used_max_bytes=41 << 30,
                    memory_total_bytes=80 << 30,
                    power_mean_watts=300.0 + util,
                    energy_joules=9000.0 + util,
                    energy_method="counter",
                    temperature_max_celsius=55.0,
                    sm_clock_max_mhz=1980.0,
                    job_ids=(str(1000 + g),),
                )
            )
    return result


def payloads(records: list[GpuSummary]) -> list[bytes]:
    """The /v1/summaries pages an agent would serve for RECORDS (not timed)."""
    pages = []
    for i in range(0, len(records), PAGE):
        chunk = records[i : i + PAGE]
        items = [(i + k + 1, "summary", record_to_json(r)) for k, r in enumerate(chunk)]
        pages.append(
            encode_summaries_response(
                node=chunk[0].node,
                agent_version="bench",
                items=items,
                next_cursor=i + len(chunk),
                evicted_total=0,
                spool_items=len(records) - i,
                spool_bytes=0,
                spool_id="bench",
            )
        )
    return pages


def end_to_end(dsn: str, gpus: int, hours: int) -> None:
    with scratch_database(dsn) as engine:
        records = summaries(gpus, hours)
        pages = payloads(records)
        with engine.begin() as conn:
            ensure_partitions(conn, START.date(), (START + timedelta(hours=hours)).date())
        t0 = time.perf_counter()
        for page in pages:
            decoded = decode_summaries_response(page, origin="bench")
            with engine.begin() as conn:
                _store_page(conn, decoded, RunResult())
        ingest = time.perf_counter() - t0
        with engine.connect() as conn:
            stored = conn.execute(text("SELECT count(*) FROM gpu_summary")).scalar_one()
        assert stored == len(records), (stored, len(records))
        rows = summary_rows(records, batch_id=1)
        with engine.begin() as conn:
            conn.execute(text("TRUNCATE gpu_summary"))
        t0 = time.perf_counter()
        for i in range(0, len(rows), PAGE):
            with engine.begin() as conn:
                copy_rows(conn, "gpu_summary", _COPY_COLUMNS, rows[i : i + PAGE])
        copy = time.perf_counter() - t0
        size = sum(len(p) for p in pages) / 1e6
        print(f"\n2. agent payloads -> PostgreSQL: {len(records):,} summaries ({gpus} GPUs x {hours} h), "
              f"{len(pages)} pages, {size:.0f} MB of JSON")  # fmt: skip
        print(f"   head ingest (decode + store): {ingest:6.2f} s  {len(records) / ingest:10,.0f} rows/s")
        print(f"   binary COPY of the same rows: {copy:6.2f} s  {len(records) / copy:10,.0f} rows/s")
        ratio = copy / ingest
        print(
            f"   ratio ingest / COPY: {ratio:.2f}  (target >= {TARGET_RATIO}: {'met' if ratio >= TARGET_RATIO else 'NOT met'})"
        )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--gpus", type=int, default=64)
    parser.add_argument("--hours", type=int, default=24)
    parser.add_argument("--dsn", default=None)
    args = parser.parse_args()
    dsn = args.dsn or os.environ.get("SLURMTEL_TEST_DSN") or os.environ.get("SLURMTEL_DATABASE_URL")
    if not dsn:
        print("give --dsn or SLURMTEL_TEST_DSN")
        return 2
    print("1. DCGM /metrics parsing")
    sys.argv = ["dcgm_parse.py"]
    dcgm_parse.main()
    end_to_end(dsn, args.gpus, args.hours)
    print("\n3. node agent CPU")
    sys.argv = ["agent_cpu.py", "--seconds", "1800"]
    return agent_cpu.main()


if __name__ == "__main__":
    sys.exit(main())
