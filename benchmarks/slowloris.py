"""A slowloris against `slurmtel serve` and against the node agent, on loopback: a legitimate
request's latency idle and under 2,000 slow connections, in one run (target: within 2x).

Each server runs in a process of its own with its default limits (slurmtel.listen,
slurmtel.api.limits): the real `slurmtel serve` on a scratch database, and the agent's HTTP
server (slurmtel.agent.server) on a spool. The attacker is another process (asyncio): --connections
connections from --addresses source addresses (127.0.1.1, 127.0.1.2, ...; so each stays within
the per-address limit and the server holds them all), each sending a request line and then one
header line every --interval seconds, never ending its head; a connection the server closes is
opened again. The legitimate client, from 127.0.0.1, sends --requests requests one after another
(GET /v1/openapi.json to serve, GET /v1/summaries with the token to the agent): median and p95,
idle and then while the attack holds its connections. Bounded: the attack stops after --seconds
(or when the measurement ends), and only loopback addresses are used.

    python benchmarks/slowloris.py [--connections 2000] [--addresses 40] [--interval 1.0]
                                   [--requests 300] [--seconds 60] [--server-nofile 1024] [--dsn URL]
"""

from __future__ import annotations

import argparse
import http.client
import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

ROOT = Path(__file__).resolve().parents[1]
TOKEN = "slowloris-benchmark-token-0123456789"
TARGET_RATIO = 2.0
# a legitimate request that takes longer counts as failed
REQUEST_TIMEOUT_SECONDS = 10.0

AGENT_SERVER = f"""
import sys, time
from pathlib import Path
from slurmtel.agent.metrics import AgentMetrics
from slurmtel.agent.server import AgentHttpServer
from slurmtel.agent.spool import Spool
spool = Spool(Path(sys.argv[1]))
server = AgentHttpServer(spool, AgentMetrics(), "gpu01", "bench", "127.0.0.1", int(sys.argv[2]), token="{TOKEN}")
server.start()
print("ready", flush=True)
sys.stdin.read()
server.stop()
"""

ATTACKER = """
import asyncio, resource, socket, sys, time
connections, addresses, interval, seconds, port = (
    int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5]))
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, connections + 512), hard))
held = 0
opened = 0
stop_at = time.monotonic() + seconds

async def one(source):
    global held, opened
    while time.monotonic() < stop_at:
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0))
        except OSError:
            await asyncio.sleep(0.2)
            continue
        opened += 1
        held += 1
        try:
            writer.write(b"GET /healthz HTTP/1.1\\r\\nHost: slow\\r\\n")
            while time.monotonic() < stop_at:
                await writer.drain()
                try:
                    if await asyncio.wait_for(reader.read(4096), interval) == b"":
                        break
                    break  # an answer (408, 503): the server let go of us
                except asyncio.TimeoutError:
                    pass
                writer.write(b"X-Slow: 1\\r\\n")
        except OSError:
            pass
        finally:
            held -= 1
            writer.close()

async def report():
    while time.monotonic() < stop_at:
        print(f"held {held} opened {opened}", flush=True)
        await asyncio.sleep(0.5)

async def main():
    tasks = [one(f"127.0.1.{i % addresses + 1}") for i in range(connections)]
    await asyncio.gather(report(), *tasks)

asyncio.run(main())
"""


def limit_files(soft: int) -> Callable[[], None] | None:
    if not soft:
        return None

    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))

    return apply


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def timed_requests(
    port: int, path: str, headers: dict[str, str], count: int, failures: list[str] | None = None
) -> list[float]:
    """COUNT requests one after another: their times. With FAILURES, a request that fails or
    takes over REQUEST_TIMEOUT_SECONDS is listed there (after 3 such, the rest are not sent)."""
    times = []
    for _ in range(count):
        began = time.perf_counter()
        conn = http.client.HTTPConnection(
            "127.0.0.1", port, timeout=REQUEST_TIMEOUT_SECONDS, source_address=("127.0.0.1", 0)
        )
        try:
            conn.request("GET", path, headers=headers)
            response = conn.getresponse()
            response.read()
            if response.status != 200:
                raise RuntimeError(f"{path}: {response.status}")
        except (OSError, RuntimeError, http.client.HTTPException) as exc:
            if failures is None:
                raise
            failures.append(f"{type(exc).__name__}: {exc}")
            if len(failures) >= 3:
                break
            continue
        finally:
            conn.close()
        times.append(time.perf_counter() - began)
    return times


def p95(values: list[float]) -> float:
    return statistics.quantiles(values, n=20)[18]


def wait_ready(port: int, path: str, headers: dict[str, str]) -> None:
    for _ in range(600):
        try:
            timed_requests(port, path, headers, 1)
            return
        except (OSError, RuntimeError, http.client.HTTPException):
            time.sleep(0.1)
    raise RuntimeError(f"nothing answers on {port}")


def measure(
    name: str, port: int, path: str, headers: dict[str, str], args: argparse.Namespace, server_pid: int
) -> float:
    from cputime import Meter

    # the server's CPU (from /proc) and the requesting client's, per request
    meter = Meter(server_pids=[server_pid])
    timed_requests(port, path, headers, 20)  # warm up
    with meter.measure() as idle_section:
        idle = timed_requests(port, path, headers, args.requests)
    attacker = subprocess.Popen(
        [
            sys.executable,
            "-c",
            ATTACKER,
            str(args.connections),
            str(args.addresses),
            str(args.interval),
            str(args.seconds),
            str(port),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert attacker.stdout is not None
        held = 0
        deadline = time.monotonic() + args.seconds / 2
        while time.monotonic() < deadline:
            line = attacker.stdout.readline()
            if not line:
                break
            held = int(line.split()[1])
            if held >= args.connections * 0.98:
                break
        failures: list[str] = []
        with meter.measure() as loaded_section:
            loaded = timed_requests(port, path, headers, args.requests, failures)
        line = attacker.stdout.readline()
        held_after = int(line.split()[1]) if line else 0
    finally:
        attacker.kill()
        attacker.wait()
    idle_figures = f"idle median {statistics.median(idle) * 1000:.2f} ms, p95 {p95(idle) * 1000:.2f} ms"
    if failures:
        print(
            f"{name:6s} {path}: {idle_figures}; under {held}..{held_after} slow connections "
            f"{len(failures)} request(s) failed after {len(loaded)} answered ({failures[0]}) -> NOT met"
        )
        return float("inf")
    ratio = statistics.median(loaded) / statistics.median(idle)
    print(
        f"{name:6s} {path}: {idle_figures}; under {held}..{held_after} slow connections median "
        f"{statistics.median(loaded) * 1000:.2f} ms, p95 {p95(loaded) * 1000:.2f} ms -> {ratio:.2f}x idle "
        f"(target <= {TARGET_RATIO:.0f}x)"
    )
    idle_server = (idle_section.usage.server or 0.0) / len(idle)
    loaded_server = (loaded_section.usage.server or 0.0) / max(1, len(loaded))
    print(
        f"{'':6s} server CPU per request: idle {idle_server * 1000:.2f} ms, under the slow connections "
        f"{loaded_server * 1000:.2f} ms -> {loaded_server / idle_server if idle_server else float('inf'):.2f}x idle "
        f"(idle: {idle_section.usage}; loaded: {loaded_section.usage})"
    )
    return ratio


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--connections", type=int, default=2000)
    parser.add_argument("--addresses", type=int, default=40)
    parser.add_argument("--interval", type=float, default=1.0)
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--dsn", default=None)
    parser.add_argument(
        "--server-nofile",
        type=int,
        default=0,
        help="the servers' soft open-file limit (1024: systemd's default without LimitNOFILE); 0 = inherited",
    )
    args = parser.parse_args()
    if not 1 <= args.addresses <= 250:
        parser.error("--addresses: 1 to 250 (127.0.1.1 .. 127.0.1.250)")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    print(
        f"{args.connections} slow connections from {args.addresses} loopback addresses, a header line "
        f"every {args.interval:g} s; open-file limit {soft}/{hard}"
    )
    from scratch import scratch_database

    ratios = []
    with tempfile.TemporaryDirectory(prefix="slurmtel-slowloris-") as tmp:
        port = free_port()
        agent = subprocess.Popen(
            [sys.executable, "-c", AGENT_SERVER, str(Path(tmp) / "spool.sqlite"), str(port)],
            stdin=subprocess.PIPE,
            cwd=ROOT,
            preexec_fn=limit_files(args.server_nofile),
        )
        try:
            auth = {"Authorization": f"Bearer {TOKEN}"}
            wait_ready(port, "/v1/summaries", auth)
            ratios.append(measure("agent", port, "/v1/summaries", auth, args, agent.pid))
        finally:
            agent.terminate()
            agent.wait(timeout=30)
        with scratch_database(args.dsn, prefix="slurmtel_bench_slowloris") as engine:
            port = free_port()
            url = engine.url.render_as_string(hide_password=False)
            config = Path(tmp) / "slurmtel.toml"
            config.write_text(f'[site]\nstate_dir = "{tmp}"\n[api]\nport = {port}\n')
            env = {**os.environ, "SLURMTEL_DATABASE_URL": url}
            serve = subprocess.Popen(
                [sys.executable, "-m", "slurmtel", "--config", str(config), "serve"],
                cwd=ROOT,
                env=env,
                preexec_fn=limit_files(args.server_nofile),
            )
            try:
                wait_ready(port, "/v1/openapi.json", {})
                ratios.append(measure("serve", port, "/v1/openapi.json", {}, args, serve.pid))
            finally:
                serve.terminate()
                serve.wait(timeout=30)
            engine.dispose()
    worst = max(ratios)
    print(
        f"worst: {worst:.2f}x idle (target <= {TARGET_RATIO:.0f}x): {'met' if worst <= TARGET_RATIO else 'NOT met'}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
