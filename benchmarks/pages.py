"""The job page's server time and weight on the benchmark database, beside the CLI's
`slurmtel job` for the same job, in one run.

Loads N synthetic jobs (slurmtel.simulate -> sacct --json -> the real parser and writer, as
benchmarks/api.py), gives the longest 8-GPU job of them a GPU telemetry window every 30 s on
each of its GPUs for up to --hours of its run (the real sample writer, then attribution), with
a few XID events, and serves the read API and the pages on loopback (uvicorn in a thread, a
trusted proxy's user header as identity, connected as the database owner). Then, for that
job: GET /jobs/ID as the job's user (the researcher who clicks the link in an idle-GPU mail)
and as an admin (whose page adds the acceptance runs and fabric counters of the job's nodes),
and GET /v1/jobs/ID (its JSON), --requests times each, one after another (server time on
loopback: the client is a thread of this process, the body read in full), the page's bytes,
and `slurmtel job ID` on the head node (a fresh interpreter per run, best and median of
--cli-repeat).

    python benchmarks/pages.py [--jobs 200000] [--hours 24] [--requests 60] [--cli-repeat 5] [--dsn URL]
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from datetime import timedelta
from pathlib import Path

import uvicorn
from api import NOW, load, p95
from cputime import Meter
from scratch import scratch_database
from sqlalchemy import Engine, text

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from slurmtel.api.app import ReadApi, build_app
from slurmtel.attribution import run_attribution
from slurmtel.auth.identity import AuthSettings
from slurmtel.auth.proxy import parse_networks
from slurmtel.config import Config, config_from_dict
from slurmtel.pages.app import Pages
from slurmtel.records import GpuEvent
from slurmtel.store.telemetry import write_events, write_inventory, write_summaries
from tests.factories import inventory, windows

ROOT = Path(__file__).resolve().parents[1]
TARGET_P95_SECONDS = 0.150
TARGET_PAGE_BYTES = 300_000
GPUS = 8


def telemetry(engine: Engine, config: Config, hours: float) -> tuple[str, str, int]:
    """Windows for every GPU of the longest finished 8-GPU job (up to HOURS of it): its id and
    how many windows were written."""
    with engine.connect() as conn:
        job = conn.execute(
            text(
                "SELECT job_id, user_name, start_at, end_at, nodes[1] AS node FROM job_attempt "
                "WHERE alloc_gpus = :gpus AND cardinality(nodes) = 1 AND end_at IS NOT NULL "
                "ORDER BY end_at - start_at DESC, job_id LIMIT 1"
            ),
            {"gpus": GPUS},
        ).one()
    count = int(min((job.end_at - job.start_at).total_seconds(), hours * 3600) // 30)
    uuids = [f"GPU-bench-{job.job_id}-{i}" for i in range(GPUS)]
    with engine.begin() as conn:
        write_inventory(conn, inventory(job.node, uuids, seen=job.start_at), source="agent")
        for i, uuid in enumerate(uuids):
            # the first half of the GPUs busy, the rest idle: the page marks them
            busy = set(range(count)) if i < GPUS // 2 else set()
            write_summaries(
                conn,
                windows(uuid, job.start_at, count, busy, job=job.job_id, node=job.node),
                source="agent",
                node=job.node,
            )
        write_events(
            conn,
            [
                GpuEvent(job.node, uuids[0], job.start_at + timedelta(minutes=10 * k), "xid", 79)
                for k in range(3)
            ],
        )
    run_attribution(engine, config, now=NOW)
    return str(job.job_id), job.user_name, count * GPUS


def timed_get(url: str, count: int, user: str) -> tuple[list[float], int]:
    times, size = [], 0
    for _ in range(count):
        began = time.perf_counter()
        request = urllib.request.Request(url, headers={"X-Remote-User": user})
        with urllib.request.urlopen(request, timeout=60) as response:
            body = response.read()
            assert response.status == 200, url
        times.append(time.perf_counter() - began)
        size = len(body)
    return times, size


def cli_job(database_url: str, job: str, repeat: int) -> list[float]:
    with tempfile.TemporaryDirectory(prefix="slurmtel-bench-pages-") as tmp:
        config = Path(tmp) / "slurmtel.toml"
        config.write_text(
            f'[site]\ntimezone = "UTC"\nclock = "{NOW.isoformat()}"\n[database]\nurl = "{database_url}"\n'
        )
        env = {k: v for k, v in os.environ.items() if not k.startswith("SLURMTEL_")}
        env.update(PYTHONPATH=str(ROOT), PYTHONPYCACHEPREFIX=str(Path(tmp) / "pyc"))
        argv = [sys.executable, "-m", "slurmtel", "--config", str(config), "job", job]
        subprocess.run(argv, env=env, capture_output=True, check=True)  # bytecode: not counted
        times = []
        for _ in range(repeat):
            began = time.perf_counter()
            subprocess.run(argv, env=env, capture_output=True, check=True)
            times.append(time.perf_counter() - began)
        return times


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=200_000)
    parser.add_argument("--hours", type=float, default=24.0, help="hours of telemetry on the job's GPUs")
    parser.add_argument("--requests", type=int, default=60, help="requests of the page and of its JSON")
    parser.add_argument("--cli-repeat", type=int, default=5)
    parser.add_argument("--dsn", default=None)
    args = parser.parse_args()
    config = config_from_dict({"site": {"timezone": "UTC", "clock": NOW.isoformat()}})
    with scratch_database(args.dsn, prefix="slurmtel_bench_pages") as engine:
        began = time.perf_counter()
        load(engine, args.jobs)
        print(f"loaded {args.jobs:,} synthetic jobs in {time.perf_counter() - began:.1f} s")
        began = time.perf_counter()
        job, owner, written = telemetry(engine, config, args.hours)
        print(
            f"job {job}: {written:,} windows on its {GPUS} GPUs, attributed in {time.perf_counter() - began:.1f} s"
        )
        settings = AuthSettings(
            methods=("proxy",), access=config.access, trusted_proxies=parse_networks(["127.0.0.1"])
        )
        api = ReadApi(config, engine, settings, lambda: NOW)
        app = build_app(api, pages=Pages(api).routes())
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        server = uvicorn.Server(
            uvicorn.Config(app, host="127.0.0.1", port=port, log_config=None, access_log=False)
        )
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        while not server.started:
            time.sleep(0.05)
        base = f"http://127.0.0.1:{port}"
        timed_get(f"{base}/jobs/{job}", 3, owner)  # warm: templates compiled, pool filled
        # the server runs in this process: its CPU is the client's here, the backends' measured
        meter = Meter(engine)
        with meter.measure() as page_section:
            page, page_bytes = timed_get(f"{base}/jobs/{job}", args.requests, owner)
        with meter.measure() as admin_section:
            admin, admin_bytes = timed_get(f"{base}/jobs/{job}", args.requests, "root")
        with meter.measure() as document_section:
            document, document_bytes = timed_get(f"{base}/v1/jobs/{job}", args.requests, owner)
        server.should_exit = True
        thread.join(timeout=30)
        with Meter(engine, exited_backends=True).measure() as cli_section:
            cli = cli_job(engine.url.render_as_string(hide_password=False), job, args.cli_repeat)
    print(
        f"job page of job {job} ({args.jobs:,} jobs in the database), {args.requests} requests each, loopback:"
    )
    print(
        f"  GET /jobs/{job:<10} as its user {owner}: p50 {statistics.median(page) * 1000:6.1f} ms, p95 {p95(page) * 1000:6.1f} ms "
        f"(target p95 < {TARGET_P95_SECONDS * 1000:.0f} ms: {'met' if p95(page) < TARGET_P95_SECONDS else 'NOT met'}); "
        f"{page_bytes / 1000:.1f} KB (target < {TARGET_PAGE_BYTES / 1000:.0f} KB: "
        f"{'met' if page_bytes < TARGET_PAGE_BYTES else 'NOT met'}; no other resource loads)"
    )
    print(
        f"  GET /jobs/{job:<10} as an admin (with its nodes' acceptance runs and fabric counters): "
        f"p50 {statistics.median(admin) * 1000:6.1f} ms, p95 {p95(admin) * 1000:6.1f} ms, {admin_bytes / 1000:.1f} KB"
    )
    print(
        f"  GET /v1/jobs/{job:<7} p50 {statistics.median(document) * 1000:6.1f} ms, p95 {p95(document) * 1000:6.1f} ms "
        f"({document_bytes / 1000:.1f} KB): the page / its JSON, p50 = "
        f"{statistics.median(page) / statistics.median(document):.2f}"
    )
    per = {
        "the page as its user": (page_section.usage, args.requests),
        "the page as an admin": (admin_section.usage, args.requests),
        "its JSON": (document_section.usage, args.requests),
        "slurmtel job": (cli_section.usage, args.cli_repeat + 1),
    }
    print(
        "  CPU per request: "
        + ", ".join(f"{name} {usage.cpu / count * 1000:.1f} ms" for name, (usage, count) in per.items())
        + f" (the page as its user: {page_section.usage}; slurmtel job, {args.cli_repeat + 1} runs: "
        f"{cli_section.usage})"
    )
    print(
        f"  slurmtel job {job:<8} best {min(cli):.3f} s, median {statistics.median(cli):.3f} s (a fresh interpreter, "
        f"on the head node): the page's p95 / the CLI's median = {p95(page) / statistics.median(cli):.2f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
