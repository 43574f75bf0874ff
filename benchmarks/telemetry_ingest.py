"""Telemetry ingest, measured in one run:

1. DCGM text parsing in sample rows/s, and the ratio to prometheus_client's parser
   (target >= 50,000 rows/s) - benchmarks/dcgm_parse.py;
2. end to end: the head's agent source pulling node agents' /v1/summaries pages over HTTP
   (served from another process), decoding and storing them (COPY into the day-partitioned
   table, cursor, ack), one agent at a time and with the default concurrency, against binary
   COPY of the very same final rows into the same table (target: ratio >= 0.5);
3. agent CPU time per GPU-second sampled, with the fake NVML - benchmarks/agent_cpu.py.

    python benchmarks/telemetry_ingest.py [--gpus 64] [--hours 24] [--dsn URL]
"""

from __future__ import annotations

import argparse
import multiprocessing
import sys
import tempfile
import threading
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from multiprocessing.connection import Connection
from pathlib import Path
from urllib.parse import parse_qs, urlparse

from sqlalchemy import text

sys.path.insert(0, str(Path(__file__).resolve().parent))

import agent_cpu
import dcgm_parse
from cputime import Meter, rate_ratios
from scratch import configured_server, scratch_database

from slurmtel.agent.protocol import (
    AckResult,
    encode_ack_response,
    encode_summaries_response,
    record_to_json,
)
from slurmtel.config import AgentSourceConfig, config_from_dict
from slurmtel.records import GpuSummary
from slurmtel.sources import default_options, get_source
from slurmtel.sources.base import RunContext
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


def payloads(records: list[GpuSummary]) -> dict[int, bytes]:
    """The /v1/summaries pages one node's agent would serve for RECORDS, by the `after` that
    asks for each (not timed)."""
    pages = {}
    for i in range(0, len(records), PAGE):
        chunk = records[i : i + PAGE]
        items = [(i + k + 1, "summary", record_to_json(r)) for k, r in enumerate(chunk)]
        pages[i] = encode_summaries_response(
            node=chunk[0].node,
            agent_version="bench",
            items=items,
            next_cursor=i + len(chunk),
            evicted_total=0,
            spool_items=len(records) - i,
            spool_bytes=0,
            spool_id="bench",
        )
    return pages


def serve_agents(pages_by_node: dict[str, dict[int, bytes]], ports: Connection) -> None:
    """In a process of its own (as the agents are on their nodes): one HTTP server per node
    answering /v1/summaries from the prepared pages and /v1/ack; sends the ports back."""
    servers = []
    for node, pages in pages_by_node.items():

        class Handler(BaseHTTPRequestHandler):
            node_pages = pages
            node_name = node

            def do_GET(self) -> None:
                after = int(parse_qs(urlparse(self.path).query)["after"][0])
                body = self.node_pages.get(after) or encode_summaries_response(
                    node=self.node_name, agent_version="bench", items=[], next_cursor=after, evicted_total=0,
                    spool_items=0, spool_bytes=0, spool_id="bench",
                )  # fmt: skip
                self.reply(body)

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers["Content-Length"]))
                self.reply(encode_ack_response(AckResult(0, 0, 0)))

            def reply(self, body: bytes) -> None:
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(f"{node}=127.0.0.1:{server.server_address[1]}")
    ports.send(servers)
    ports.recv()  # until the benchmark is done


def end_to_end(dsn: str, gpus: int, hours: int) -> None:
    records = summaries(gpus, hours)
    by_node: dict[str, list[GpuSummary]] = {}
    for record in records:
        by_node.setdefault(record.node, []).append(record)
    pages_by_node = {node: payloads(node_records) for node, node_records in by_node.items()}
    size = sum(len(p) for pages in pages_by_node.values() for p in pages.values()) / 1e6
    parent, child = multiprocessing.get_context("spawn").Pipe()
    agents = multiprocessing.get_context("spawn").Process(target=serve_agents, args=(pages_by_node, child))
    agents.start()
    targets = parent.recv()
    print(f"\n2. agent payloads -> PostgreSQL: {len(records):,} summaries ({gpus} GPUs x {hours} h, "
          f"{len(by_node)} nodes of 8 GPUs), {size:.0f} MB of JSON in pages of {PAGE}")  # fmt: skip
    print("   (the head's agent source as the daemon runs it: HTTP pull, decode, COPY, cursor, ack;")
    print("    the agents are served from another process)")
    try:
        with scratch_database(dsn) as engine, tempfile.TemporaryDirectory() as tokens:
            with engine.begin() as conn:
                ensure_partitions(conn, START.date(), (START + timedelta(hours=hours)).date())
            source = get_source("agent")
            # the head sends each node's token (the served agents here do not check it)
            token_file = Path(tokens) / "agent-token"
            token_file.write_text("benchmark-token-0123456789\n")
            token_file.chmod(0o600)
            rates = {}
            usages = {}
            meter = Meter(engine)
            for concurrency in (1, AgentSourceConfig.concurrency):
                with engine.begin() as conn:
                    conn.execute(
                        text("TRUNCATE gpu_window, gpu_window_hour, agent_cursor, ingest_batch CASCADE")
                    )
                config = config_from_dict(
                    {
                        "sources": {
                            "agent": {
                                "targets": targets,
                                "concurrency": concurrency,
                                "page_size": PAGE,
                                "token_file": str(token_file),
                            }
                        }
                    }
                )
                ctx = RunContext(config=config, engine=engine)
                with meter.measure() as section:
                    result = source.collect(ctx, default_options(source))
                usages[concurrency] = section.usage
                rates[concurrency] = len(records) / section.usage.wall
                with engine.connect() as conn:
                    stored = conn.execute(text("SELECT count(*) FROM gpu_summary")).scalar_one()
                assert stored == len(records) == result.rows_written, (
                    stored,
                    len(records),
                    result.rows_written,
                )
            rows = summary_rows(records, batch_id=1)
            with engine.begin() as conn:
                conn.execute(text("TRUNCATE gpu_window"))
            with meter.measure() as copy_section:
                for i in range(0, len(rows), PAGE):
                    with engine.begin() as conn:
                        copy_rows(conn, "gpu_window", _COPY_COLUMNS, rows[i : i + PAGE])
            copy = copy_section.usage
            copy_rate = len(rows) / copy.wall
    finally:
        parent.send("done")
        agents.join()
    print(f"   binary COPY of the same rows (one stream, {PAGE} per transaction): {copy_rate:10,.0f} rows/s")
    for concurrency, rate in rates.items():
        what = "one agent at a time" if concurrency == 1 else f"{concurrency} agents at a time (the default)"
        print(f"   head ingest, {what + ':':38s} {rate:10,.0f} rows/s  ratio {rate / copy_rate:.2f}")
        print(f"     {usages[concurrency]}; {rate_ratios('ratio to COPY', usages[concurrency], copy)}")
    print(f"   binary COPY: {copy}")
    ratio = rates[AgentSourceConfig.concurrency] / copy_rate
    print(
        f"   target: ratio >= {TARGET_RATIO} with the default settings: {'met' if ratio >= TARGET_RATIO else 'NOT met'}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--gpus", type=int, default=64)
    parser.add_argument("--hours", type=int, default=24)
    parser.add_argument("--dsn", default=None)
    args = parser.parse_args()
    dsn = configured_server(args.dsn)
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
