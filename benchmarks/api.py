"""The read API under load on loopback: requests/s and p95 latency of `/v1/me` and
`/v1/reports/usage`, against the same query run directly, in one run; then the login-node CLI
end to end through that API (`slurmtel job`, `me`, `report usage`, a fresh interpreter per
command, best and median of --cli-repeat), against the 0.3 s target of the scale issue.

Loads N synthetic jobs (slurmtel.simulate -> sacct --json -> the real parser and writer) into a
scratch database, starts a munged of its own (tests/munge_lab.py) and `slurmtel serve`'s app
on uvicorn (loopback, a free port), connected as the database owner with the row-level
security settings set per request as in production. Credentials are made beforehand with the
real `munge` (that cost is the client's), then --threads clients send --requests requests per
endpoint; the direct figure is the same store function in a loop on one connection. Bounded:
--requests per endpoint, and every request has a timeout.

    python benchmarks/api.py [--jobs 20000] [--requests 400] [--threads 8] [--cli-repeat 7] [--dsn URL]
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
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path

import uvicorn
from cputime import Meter
from scratch import scratch_database
from sqlalchemy import Engine, text

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from slurmtel.access import Identity, Role, allowed
from slurmtel.api.app import ReadApi, build_app
from slurmtel.auth.identity import AuthSettings
from slurmtel.auth.replay import ReplayCache
from slurmtel.config import Config, config_from_dict
from slurmtel.parsers.sacct_json import parse_sacct_json
from slurmtel.records import JobAttempt
from slurmtel.reports.catalog import REPORTS
from slurmtel.reports.researcher import me_document, me_query
from slurmtel.reports.spec import build_query, run_report
from slurmtel.simulate import USERS, render_sacct_json, synthetic_jobs
from slurmtel.store.jobs import sync_outcome_classes, write_attempts
from slurmtel.store.rls import set_transaction_scope
from tests import munge_lab

ROOT = Path(__file__).resolve().parents[1]
CLI_TARGET_SECONDS = 0.3
START = datetime(2026, 11, 1, tzinfo=UTC)
NOW = datetime(2026, 12, 1, tzinfo=UTC)
MONTH = "2026-11"


def load(engine: Engine, jobs: int) -> None:
    with engine.begin() as conn:
        sync_outcome_classes(conn, Config().outcomes.mapping())
        sims = list(synthetic_jobs(jobs, start=START))
        for i in range(0, len(sims), 10_000):
            records = parse_sacct_json(render_sacct_json(sims[i : i + 10_000]), origin="benchmark")
            write_attempts(conn, [r for r in records if isinstance(r, JobAttempt)])


def p95(values: list[float]) -> float:
    return statistics.quantiles(values, n=20)[18] if len(values) >= 20 else max(values)


def direct(engine: Engine, run: Callable[[object], object], scope: object, count: int) -> list[float]:
    times = []
    for _ in range(count):
        begun = time.perf_counter()
        with engine.begin() as conn:
            set_transaction_scope(conn, scope)  # type: ignore[arg-type]
            run(conn)
        times.append(time.perf_counter() - begun)
    return times


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--requests", type=int, default=400, help="requests per endpoint")
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--cli-repeat", type=int, default=7, help="runs of each CLI command")
    parser.add_argument("--dsn", default=None)
    args = parser.parse_args()
    munge_lab.ensure_munge()
    user = next(iter(USERS.values()))[0]
    with munge_lab.running() as daemon, scratch_database(args.dsn, prefix="slurmtel_bench_api") as engine:
        began = time.perf_counter()
        load(engine, args.jobs)
        print(f"loaded {args.jobs:,} synthetic jobs in {time.perf_counter() - began:.1f} s")
        config = config_from_dict(
            {"site": {"timezone": "UTC", "clock": NOW.isoformat()}, "api": {"munge_socket": daemon.socket}}
        )
        root = Identity("root", Role.ADMIN)
        settings = AuthSettings(
            methods=("munge",),
            access=config.access,
            munge_socket=daemon.socket,
            replay_cache=ReplayCache(),
        )
        app = build_app(ReadApi(config, engine, settings, lambda: NOW))
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
        # as root (an admin): `me -u USER` and usage over every job of the month
        endpoints = {
            "/v1/me": f"user={user}&month={MONTH}",
            "/v1/reports/usage": "start=2026-11-01&end=2026-12-01",
        }
        me = me_query(root, user=user, month=MONTH, now=NOW, zone=config.zone, jobs=False, top=10)
        usage = REPORTS["usage"]
        query = build_query(usage, root, start=START, end=NOW, now=NOW, zone=config.zone)
        directs = {
            "/v1/me": lambda conn: me_document(conn, me),
            "/v1/reports/usage": lambda conn: run_report(conn, usage, query),
        }
        print(f"{args.requests} requests per endpoint, {args.threads} client threads, loopback, as an admin")
        for path, qs in endpoints.items():
            credentials = [
                # bound to the whole target, its query string included
                daemon.credential(f"GET {path}?{qs} {os.urandom(16).hex()}")
                for _ in range(args.requests)
            ]

            def one(credential: str, path: str = path, qs: str = qs) -> float:
                request = urllib.request.Request(
                    f"http://127.0.0.1:{port}{path}?{qs}", headers={"Authorization": f"MUNGE {credential}"}
                )
                begun = time.perf_counter()
                with urllib.request.urlopen(request, timeout=60) as response:
                    response.read()
                    assert response.status == 200
                return time.perf_counter() - begun

            meter = Meter(engine)
            with meter.measure() as api_section, ThreadPoolExecutor(args.threads) as pool:
                latencies = list(pool.map(one, credentials))
            wall = api_section.usage.wall
            direct_count = min(args.requests, 100)
            with meter.measure() as direct_section:
                local = direct(engine, directs[path], allowed(root, usage.action), direct_count)
            print(
                f"{path:<20} API {args.requests / wall:7.1f} req/s, p50 {statistics.median(latencies) * 1000:6.1f} ms, "
                f"p95 {p95(latencies) * 1000:6.1f} ms | direct query p50 {statistics.median(local) * 1000:6.1f} ms, "
                f"p95 {p95(local) * 1000:6.1f} ms ({1 / statistics.median(local):.1f}/s on one connection) | "
                f"API p50 / direct p50 = {statistics.median(latencies) / statistics.median(local):.1f}"
            )
            # the server runs in this process: its CPU is the client's here
            api_cpu = api_section.usage.cpu / args.requests
            direct_cpu = direct_section.usage.cpu / direct_count
            print(
                f"{'':<20} CPU per request: API {api_cpu * 1000:6.1f} ms, direct query {direct_cpu * 1000:6.1f} ms, "
                f"ratio {api_cpu / direct_cpu:.1f} (API: {api_section.usage}; direct: {direct_section.usage})"
            )
        with engine.connect() as conn:
            job = conn.execute(
                text("SELECT max(job_id_raw) FROM job_attempt WHERE start_at IS NOT NULL")
            ).scalar_one()
        login_node_cli(engine, port, daemon.socket, job, user, args.cli_repeat)
        server.should_exit = True
        thread.join(timeout=30)
    return 0


def login_node_cli(engine: Engine, port: int, munge_socket: str, job: int, user: str, repeat: int) -> None:
    """`slurmtel job|me|report` as a user types them on a login node: a config with [api] url,
    a fresh interpreter per command, each request with a MUNGE credential from munged."""
    with tempfile.TemporaryDirectory(prefix="slurmtel-bench-cli-") as tmp:
        config = Path(tmp) / "slurmtel.toml"
        config.write_text(
            f'[site]\ntimezone = "UTC"\nclock = "{NOW.isoformat()}"\n'
            f'[api]\nurl = "http://127.0.0.1:{port}"\nmunge_socket = "{munge_socket}"\n'
        )
        # an installed slurmtel has its bytecode: the first run writes it, whatever the caller's
        # PYTHONDONTWRITEBYTECODE says, and is not counted
        env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONPYCACHEPREFIX=str(Path(tmp) / "pyc"))
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        commands = {
            f"slurmtel job {job}": ["job", str(job)],
            f"slurmtel me -u {user}": ["me", "-u", user, "--month", MONTH],
            "slurmtel report usage": ["report", "usage", "-S", "2026-11-01", "-E", "2026-12-01"],
        }
        bare, bare_cpu = _timed(engine, [sys.executable, "-c", "pass"], env, repeat)
        print(
            f"login-node CLI through the API, best / median of {repeat} (a bare interpreter: {min(bare):.3f} s, "
            f"{min(bare_cpu):.3f} s CPU)"
        )
        for name, argv in commands.items():
            times, cpus = _timed(
                engine, [sys.executable, "-m", "slurmtel", "--config", str(config), *argv], env, repeat
            )
            verdict = "met" if min(times) < CLI_TARGET_SECONDS else "NOT met"
            print(f"  {name:<28} {min(times):.3f} s / {statistics.median(times):.3f} s  "
                  f"(target < {CLI_TARGET_SECONDS} s: {verdict}); CPU (command, API server, backends) "
                  f"best {min(cpus):.3f} s, {min(cpus) / min(bare_cpu):.1f}x a bare interpreter")  # fmt: skip


def _timed(
    engine: Engine, argv: list[str], env: dict[str, str], repeat: int
) -> tuple[list[float], list[float]]:
    """Wall seconds and CPU seconds (this process, which serves the API, the command, and the
    API's backends) of REPEAT runs of ARGV."""
    subprocess.run(argv, env=env, capture_output=True, check=True)  # writes the bytecode cache: not counted
    times, cpus = [], []
    meter = Meter(engine)
    for _ in range(repeat):
        with meter.measure() as section:
            subprocess.run(argv, env=env, capture_output=True, check=True)
        times.append(section.usage.wall)
        cpus.append(section.usage.cpu)
    return times, cpus


if __name__ == "__main__":
    raise SystemExit(main())
