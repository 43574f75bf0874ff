"""A site for the page tests: the admin day of tests/factories.py in the test database,
`slurmtel serve` started as its own process (the real server, the reader and writer roles of
`slurmtel db roles`, row security proven with the scope key), and a trusted reverse proxy per
person in front of it, as Open OnDemand or an OIDC proxy stands in front of it at a site: each
proxy strips any user header its client sends and sets its own person's.

People (their roles come from [access] and the real sacctmgr capture of
tests/fixtures/slurmctld/slurm-22.05, as in tests/test_coordinators.py):
- erin, a researcher: job 105 (a MIG slice, busy), the hostile-named jobs 301... and job 401,
  running at NOW with one of its two GPUs idle for the last 3 hours;
- alice, who coordinates physics and chemistry (the capture): her job 101 (idle half the
  time) and bob's 102 (chemistry here);
- fiona, finance; ada, an admin; nobody, no role and no jobs.
"""

from __future__ import annotations

import dataclasses
import http.client
import http.server
import os
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import Engine

from slurmtel.attribution import run_attribution
from slurmtel.config import Config, config_from_dict
from slurmtel.parsers.nccl import parse_nccl_tests
from slurmtel.records import NcclRun
from slurmtel.store.fabric import NcclLogWrite, write_nccl_log
from tests.conftest import LoginRoles, fixture_path
from tests.factories import admin_day, at, attempt, inventory, load_admin_day, windows

# December: November has ended and can be closed
NOW = at("2026-12-01T06:00:00")
MONTH = "2026-11"
WINDOW = {"start": "2026-11-01T00:00:00", "end": "2026-11-02T00:00:00"}
RESEARCHER, COORDINATOR, FINANCE, ADMIN, NOBODY = "erin", "alice", "fiona", "ada", "nobody"
PEOPLE = (RESEARCHER, COORDINATOR, FINANCE, ADMIN, NOBODY)
# job names are user input: the terminal tests' hostile names, and HTML's
HOSTILE_NAMES = (
    "[/]",
    "[link=http://x]y[/link]",
    "\x1b]0;pwned\x07",
    "<script>document.title='pwned'</script>",
    '"><img src=x onerror="document.title=1">',
    "{{ 7*7 }} &amp; </td></tr></table>",
)
HOSTILE_JOBS = {str(301 + i): name for i, name in enumerate(HOSTILE_NAMES)}
ACCEPTANCE = fixture_path("nccl_tests", "cases", "cscs_alps_gh200_2node_srun_v2.17.1_cxi_hook")
COORDINATORS = fixture_path("slurmctld", "slurm-22.05", "sacctmgr-show-user-withcoord.psv")
ACCOUNT_TREE = fixture_path("slurmctld", "slurm-22.05", "sacctmgr-show-account-withassoc.psv")


def site_settings(database_url: str, sacctmgr: str) -> dict[str, Any]:
    """The config both `slurmtel serve` and the CLI of the tests read (the server adds [api])."""
    return {
        "database": {"url": database_url},
        "site": {"timezone": "UTC", "clock": NOW.isoformat()},
        "access": {"finance": [FINANCE], "admins": ["root", ADMIN], "sacctmgr_command": sacctmgr},
        "cost": {
            "compute_per_month": "2400",
            "network_per_month": "150",
            "storage_per_month": "300",
            "support_per_month": "90",
            "operations_per_month": "60",
        },
        "chargeback": {
            "rates": [{"price_per_gpu_hour": "2.00", "valid_from": "2026-01-01"}],
            "budgets": [{"account": "physics", "period": "month", "gpu_hours": "10"}],
        },
    }


def sacctmgr_script(directory: Path) -> str:
    """A sacctmgr that answers the two questions slurmtel asks with the real captures."""
    path = directory / "sacctmgr"
    path.write_text(
        "#!/bin/sh\n"
        f'[ "$*" = "-P show account withassoc" ] && exec cat {ACCOUNT_TREE}\n'
        f'[ "$*" = "-n -P show user withcoord format=User,Coordinators" ] && exec cat {COORDINATORS}\n'
        "exit 9\n"
    )
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


def load_site(engine: Engine, config: Config) -> None:
    day = admin_day()
    chemistry = {"chem": "chemistry"}
    day.attempts = [dataclasses.replace(a, account=chemistry.get(a.account, a.account)) for a in day.attempts]
    for i, (job, name) in enumerate(HOSTILE_JOBS.items()):
        start = at("2026-11-01T16:00:00") + timedelta(minutes=10 * i)
        day.attempts.append(
            attempt(
                job_id_raw=int(job),
                name=name,
                user=RESEARCHER,
                account="physics",
                submit_at=start - timedelta(minutes=5),
                eligible_at=start - timedelta(minutes=5),
                start_at=start,
                end_at=start + timedelta(minutes=5),
                alloc_gpus=1,
                nodes=("gpu03",),
                nodelist="gpu03",
            )
        )
    # the first hostile job's GPU (gpu03) idle all its 5 minutes: the page marks it
    day.summaries["gpu03"] = windows("GPU-C0", at("2026-11-01T16:00:00"), 10, job="301", node="gpu03")
    # erin's job 401 runs at NOW on gpu07's two GPUs since 02:00: gpu07/0 busy throughout,
    # gpu07/1 busy for an hour, then idle (since 03:00, 3 hours at NOW)
    day.attempts.append(
        attempt(
            job_id_raw=401,
            name="finetune",
            user=RESEARCHER,
            account="physics",
            state="RUNNING",
            submit_at=at("2026-12-01T01:55:00"),
            eligible_at=at("2026-12-01T01:55:00"),
            start_at=at("2026-12-01T02:00:00"),
            end_at=None,
            alloc_gpus=2,
            nodes=("gpu07",),
            nodelist="gpu07",
        )
    )
    day.inventory += inventory("gpu07", ["GPU-G0", "GPU-G1"], seen=at("2026-12-01T00:00:00"))
    running = at("2026-12-01T02:00:00")
    day.summaries["gpu07"] = [
        *windows("GPU-G0", running, 480, set(range(480)), job="401", node="gpu07"),
        *windows("GPU-G1", running, 480, set(range(120)), job="401", node="gpu07"),
    ]
    # bob's job 402 on nid005471 (a node of a real nccl-tests acceptance capture), an hour after
    # an acceptance run used it
    day.attempts.append(
        attempt(
            job_id_raw=402,
            name="allreduce-check",
            user="bob",
            account="chemistry",
            submit_at=at("2026-11-01T12:50:00"),
            eligible_at=at("2026-11-01T12:50:00"),
            start_at=at("2026-11-01T13:00:00"),
            end_at=at("2026-11-01T14:00:00"),
            alloc_gpus=4,
            nodes=("nid005471",),
            nodelist="nid005471",
        )
    )
    load_admin_day(engine, config, day)
    with engine.begin() as conn:
        write_nccl_log(
            conn,
            NcclLogWrite(
                log_sha256="pages-acceptance",
                origin=ACCEPTANCE.name,
                bytes=1,
                runs=[
                    r
                    for r in parse_nccl_tests((ACCEPTANCE / "input.txt").read_bytes())
                    if isinstance(r, NcclRun)
                ],
                job=None,
                label="acceptance",
                run_at=at("2026-11-01T12:00:00"),
            ),
        )
    # attributed again at the site's now, when 401 runs
    run_attribution(engine, config, now=NOW)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def wait_for(url: str, process: subprocess.Popen[bytes], log: Path) -> None:
    for _ in range(600):
        if process.poll() is not None:
            raise AssertionError(f"slurmtel serve exited {process.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url + "/healthz", timeout=2) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.1)
    raise AssertionError(f"slurmtel serve did not answer:\n{log.read_text()[-3000:]}")


@contextmanager
def serve(config_file: Path, *extra: str, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """`slurmtel serve` as a process of its own, stopped with SIGTERM at the end."""
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "slurmtel", "--config", str(config_file), "serve", *extra],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "SLURMTEL_DATABASE_URL": ""},
        )
    try:
        yield process
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def write_serve_config(
    directory: Path,
    roles: LoginRoles,
    sacctmgr: str,
    port: int,
    methods: tuple[str, ...] = ("proxy",),
    name: str = "serve.toml",
    **api: Any,
) -> Path:

    key = directory / "scope.key"
    key.write_text(roles.scope_key.hex())
    key.chmod(0o600)
    statements = directory / "statements.url"
    statements.write_text(roles.url(roles.writer))
    statements.chmod(0o600)
    settings = site_settings(roles.url(roles.reader), sacctmgr)
    settings["api"] = {
        "listen_address": "127.0.0.1",
        "port": port,
        "auth_methods": list(methods),
        "trusted_proxies": ["127.0.0.1"],
        "scope_key_file": str(key),
        "statements_database_url_file": str(statements),
        **api,
    }
    config_from_dict(settings)  # refused here, not in the server, when a key is wrong
    path = directory / name
    path.write_text(to_toml(settings))
    return path


def to_toml(settings: dict[str, Any]) -> str:
    def value(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, int | float):
            return str(v)
        if isinstance(v, str):
            return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
        if isinstance(v, list) and v and isinstance(v[0], dict):
            return (
                "["
                + ", ".join("{" + ", ".join(f"{k} = {value(x)}" for k, x in d.items()) + "}" for d in v)
                + "]"
            )
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v) + "]"
        raise TypeError(v)

    lines = []
    for table, body in settings.items():
        lines.append(f"[{table}]")
        lines += [f"{k} = {value(v)}" for k, v in body.items()]
        lines.append("")
    return "\n".join(lines)


class _ProxyHandler(http.server.BaseHTTPRequestHandler):
    upstream: tuple[str, int]
    user: str
    header = "X-Remote-User"
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _forward(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else None
        headers = {
            k: v
            for k, v in self.headers.items()
            if k.lower() not in ("connection", "keep-alive", self.header.lower(), "content-length")
        }
        if self.user:
            headers[self.header] = self.user
        connection = http.client.HTTPConnection(*self.upstream, timeout=120)
        try:
            connection.request(self.command, self.path, body=body, headers=headers)
            response = connection.getresponse()
            data = response.read()
            self.send_response(response.status)
            for k, v in response.getheaders():
                if k.lower() not in (
                    "connection",
                    "keep-alive",
                    "transfer-encoding",
                    "content-length",
                    "date",
                    "server",
                ):
                    self.send_header(k, v)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        finally:
            connection.close()

    do_GET = _forward
    do_POST = _forward
    do_HEAD = _forward


class Proxy:
    """A trusted reverse proxy on loopback that tells UPSTREAM its client is USER (none: the
    request goes on without a user header, the client's own stripped)."""

    def __init__(self, upstream_port: int, user: str) -> None:
        handler = type("Handler", (_ProxyHandler,), {"upstream": ("127.0.0.1", upstream_port), "user": user})
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def fetch(
    url: str, *, data: bytes | None = None, headers: dict[str, str] | None = None
) -> tuple[int, bytes, dict[str, str]]:
    request = urllib.request.Request(
        url, data=data, headers=headers or {}, method="POST" if data is not None else "GET"
    )
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, response.read(), dict(response.headers.items())
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(), dict(exc.headers.items())
