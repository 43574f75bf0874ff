"""`slurmtel run`, the head daemon: schedule, metrics, systemd notify, the epilog hook, stop.

The daemon runs as a real subprocess against the test database; Slurm's commands are small
scripts that print real captures (tests/fixtures/*; the real commands are exercised by the
integration suite). Its /metrics endpoint is scraped over HTTP and parsed with
prometheus_client's own parser. The helpers here are shared with tests/test_daemon_faults.py.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
import tomllib
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, ClassVar

import pytest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import Engine, text

from slurmtel import __version__
from slurmtel.cli import main
from slurmtel.config import Config, config_from_dict, load_config
from slurmtel.metrics import DaemonMetrics
from slurmtel.records import JobHostWindow, LustreJobStat
from slurmtel.scheduler import Schedule, backoff_seconds, enabled_sources
from slurmtel.sources.base import RunContext
from slurmtel.store.engine import make_engine
from slurmtel.store.hostside import write_job_host_windows, write_lustre_stats
from slurmtel.store.telemetry import existing_partitions, partition_name, write_summaries
from tests.conftest import fixture_path
from tests.factories import at, windows

ROOT = Path(__file__).resolve().parents[1]
EPILOG = ROOT / "systemd" / "slurmtel-epilog.sh"
SACCT_LAB = fixture_path("sacct", "slurm-22.05", "sacct-a-D.json")
LAB = fixture_path("slurmctld", "slurm-22.05")
# generous limits on waiting for a subprocess; never an assertion about speed
SAFETY_SECONDS = 90.0


# ---------------------------------------------------------------- helpers (shared)


def wait_for(condition: Callable[[], Any], what: str, timeout: float = SAFETY_SECONDS) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what}")
        time.sleep(0.1)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def command(directory: Path, name: str, body: str) -> str:
    """An executable shell script standing in for a Slurm command."""
    path = directory / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


def fake_sacct(directory: Path, capture: Path | str, name: str = "sacct") -> tuple[str, Path]:
    """A sacct that logs its arguments and prints CAPTURE (read at each call)."""
    calls = directory / f"{name}-calls.log"
    return command(directory, name, f'echo "$@" >> {calls}\ncat "{capture}"\n'), calls


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return repr(value)


def toml_text(data: dict[str, Any], prefix: str = "") -> str:
    scalars = [f"{k} = {_toml_value(v)}" for k, v in data.items() if not isinstance(v, dict)]
    out = (f"[{prefix}]\n" if prefix and scalars else "") + "".join(s + "\n" for s in scalars)
    for key, value in data.items():
        if isinstance(value, dict):
            out += toml_text(value, f"{prefix}.{key}" if prefix else key)
    return out


def merged(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    result = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(result.get(key), dict):
            result[key] = merged(result[key], value)
        else:
            result[key] = value
    return result


Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(port: int) -> Samples:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        body = response.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(body)
        for s in family.samples
    }


def metric(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, tuple(sorted(labels.items()))))


def labelled(samples: Samples, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {labels: value for (n, labels), value in samples.items() if n == name}


class DaemonProcess:
    """`slurmtel --config FILE run` as a subprocess; output goes to a log file."""

    # quiet defaults: only what a test enables runs
    DEFAULTS: ClassVar[dict[str, Any]] = {
        "sources": {"slurmctld": {"enabled": False}},
        "attribution": {"enabled": False},
        "chargeback": {"close_day_of_month": 0},
        "daemon": {"listen_address": "127.0.0.1", "stop_timeout_seconds": 2.0},
    }

    def __init__(
        self,
        directory: Path,
        settings: dict[str, Any],
        database_url: str,
        *,
        env: dict[str, str] | None = None,
        name: str = "daemon",
    ) -> None:
        self.port = free_port()
        data = merged(merged(self.DEFAULTS, {"daemon": {"port": self.port}}), settings)
        self.config_path = directory / f"{name}.toml"
        self.config_path.write_text(toml_text(data))
        self.log_path = directory / f"{name}.log"
        base = {
            k: v
            for k, v in os.environ.items()
            if k
            not in ("SLURMTEL_CONFIG", "NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "JOURNAL_STREAM")
        }
        self.env = {**base, "SLURMTEL_DATABASE_URL": database_url, **(env or {})}
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> DaemonProcess:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "slurmtel", "--config", str(self.config_path), "run"],
                cwd=ROOT,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        self.started_at = time.monotonic()
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def metrics(self) -> Samples:
        return scrape(self.port)

    def wait_serving(self) -> Samples:
        def serving() -> Samples | None:
            assert self.alive(), f"the daemon exited:\n{self.log()}"
            try:
                return self.metrics()
            except OSError:
                return None

        return wait_for(serving, "the daemon's /metrics")

    def terminate(self) -> tuple[int, float]:
        """SIGTERM; return the exit status and the seconds it took to exit."""
        assert self.proc is not None
        t0 = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        rc = self.proc.wait(timeout=SAFETY_SECONDS)
        return rc, time.monotonic() - t0

    def kill(self) -> None:
        if self.alive():
            assert self.proc is not None
            self.proc.kill()
            self.proc.wait(timeout=SAFETY_SECONDS)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


@pytest.fixture
def daemons() -> Iterator[list[DaemonProcess]]:
    """Register started daemons here: any still running at the end is killed."""
    started: list[DaemonProcess] = []
    yield started
    for daemon in started:
        daemon.kill()


def rows(engine: Engine, sql: str, **params: Any) -> list[tuple[Any, ...]]:
    with engine.connect() as conn:
        return [tuple(r) for r in conn.execute(text(sql), params)]


class NotifySocket:
    """The receiving end of $NOTIFY_SOCKET, as systemd holds it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.messages: list[str] = []
        self._thread = threading.Thread(target=self._receive, daemon=True)
        self._thread.start()

    def _receive(self) -> None:
        while True:
            try:
                data = self.sock.recv(4096)
            except OSError:
                return
            self.messages.append(data.decode())

    def states(self) -> list[str]:
        return [line for message in list(self.messages) for line in message.splitlines()]

    def close(self) -> None:
        self.sock.close()


# ---------------------------------------------------------------- the daemon as a process


def test_run_collects_serves_metrics_notifies_systemd_and_stops_on_sigterm(
    tmp_path: Path, engine: Engine, database_url: str, daemons: list[DaemonProcess]
) -> None:
    sacct, sacct_calls = fake_sacct(tmp_path, SACCT_LAB)
    squeue = command(tmp_path, "squeue", f"cat {LAB / 'squeue-running-1.json'}\n")
    scontrol = command(
        tmp_path,
        "scontrol",
        f'case "$*" in\n"show config") cat {LAB / "scontrol-show-config.txt"};;\n'
        f'"show node -d") cat {LAB / "scontrol-show-node-d-running-1.txt"};;\n*) exit 9;;\nesac\n',
    )
    with engine.begin() as conn:  # what a node agent reported about its spool
        conn.execute(
            text(
                "INSERT INTO agent_cursor (node, spool_id, cursor, evicted_total, spool_items, spool_bytes) "
                "VALUES ('gpu01', 'spool-a', 10, 3, 7, 12345), ('gpu02', 'spool-b', 4, 0, 0, 0)"
            )
        )
    # other tests of the session may have made some of the daily partitions already
    today = datetime.now(UTC).date()
    with engine.connect() as conn:
        missing = {today + timedelta(days=d) for d in range(8)} - set(existing_partitions(conn).values())
    notify = NotifySocket(tmp_path / "notify")
    daemon = DaemonProcess(
        tmp_path,
        {
            "sources": {
                "sacct": {"command": sacct, "interval_seconds": 3600},
                "slurmctld": {
                    "enabled": True,
                    "squeue_command": squeue,
                    "scontrol_command": scontrol,
                    "interval_seconds": 3600,
                },
            },
            "attribution": {"enabled": True, "interval_seconds": 3600},
        },
        database_url,
        env={"NOTIFY_SOCKET": str(notify.path), "WATCHDOG_USEC": "1000000"},
    )
    daemons.append(daemon.start())
    wait_for(lambda: "READY=1" in notify.states(), "READY=1")
    wait_for(lambda: notify.states().count("WATCHDOG=1") >= 2, "two watchdog pings")
    jobs = ("source:sacct", "source:slurmctld", "attribution", "maintenance")

    def all_jobs_ran() -> Samples | None:
        samples = daemon.metrics()
        done = all(metric(samples, "slurmtel_job_runs_total", job=j, result="ok") == 1 for j in jobs)
        return samples if done else None

    samples = wait_for(all_jobs_ran, "one run of every job")

    # each source: the run it recorded, and the same numbers in the metrics
    recorded = rows(
        engine,
        "SELECT source, mode, status, rows_read, rows_written, rows_quarantined FROM collect_run ORDER BY source",
    )
    assert recorded[0] == ("sacct", "scheduled", "ok", 22, 22, 0)
    assert recorded[1][:3] == ("slurmctld", "scheduled", "ok") and recorded[1][3] > 0
    for source, _, _, read, written, quarantined in recorded:
        assert metric(samples, "slurmtel_source_runs_total", source=source, status="ok") == 1
        assert metric(samples, "slurmtel_source_rows_read_total", source=source) == read
        assert metric(samples, "slurmtel_source_rows_written_total", source=source) == written
        assert metric(samples, "slurmtel_source_rows_quarantined_total", source=source) == quarantined
        assert metric(samples, "slurmtel_source_last_run_duration_seconds", source=source) > 0  # type: ignore[operator]
        assert metric(samples, "slurmtel_source_lag_seconds", source=source) >= 0  # type: ignore[operator]
        assert metric(samples, "slurmtel_source_last_success_timestamp_seconds", source=source)
    assert sacct_calls.read_text().count("\n") == 1
    assert labelled(samples, "slurmtel_source_errors_total") == {}
    # the agents' spools, read from agent_cursor at scrape time
    assert labelled(samples, "slurmtel_agent_spool_items") == {
        (("node", "gpu01"),): 7.0,
        (("node", "gpu02"),): 0.0,
    }
    assert metric(samples, "slurmtel_agent_spool_bytes", node="gpu01") == 12345
    assert metric(samples, "slurmtel_agent_spool_evicted_total", node="gpu01") == 3
    assert list(labelled(samples, "slurmtel_sacct_cursor_lag_seconds")) == [(("scope", "local"),)]
    assert metric(samples, "slurmtel_sacct_cursor_lag_seconds", scope="local") >= 0  # type: ignore[operator]
    assert metric(samples, "slurmtel_attribution_runs_total", status="ok") == 1
    # attribution ran once, before or after sacct stored the 19 started GPU attempts
    started = rows(engine, "SELECT count(*) FROM job_attempt WHERE start_at IS NOT NULL AND alloc_gpus > 0")
    assert started == [(19,)]
    assert metric(samples, "slurmtel_attribution_last_run_attempts") in (0, 19)
    assert metric(samples, "slurmtel_partitions_total", action="created") == len(missing)  # today + 7 days
    with engine.connect() as conn:
        assert {today + timedelta(days=d) for d in range(8)} <= set(existing_partitions(conn).values())
    assert metric(samples, "slurmtel_database_up") == 1
    assert metric(samples, "slurmtel_build_info", version=__version__) == 1
    assert labelled(samples, "slurmtel_job_consecutive_failures") == {((("job", j),)): 0.0 for j in jobs}
    assert all(v == 0 for v in labelled(samples, "slurmtel_job_backoff_seconds").values())

    rc, seconds = daemon.terminate()
    print(f"SIGTERM while idle: exit {rc} after {seconds:.2f} s")
    assert rc == 0
    assert notify.states()[-1] == "STATUS=stopping" and "STOPPING=1" in notify.states()
    notify.close()
    log = daemon.log()
    assert (
        "level=info event=source_run source=sacct status=ok rows_read=22 rows_written=22 rows_quarantined=0"
        in log
    )
    assert "event=stopped" in log and "abandoned" not in log
    # one line per event: every line is key=value pairs that start with ts= and level=
    for line in log.splitlines():
        assert line.startswith("ts=") and " level=" in line, line


def test_a_stuck_job_stops_the_watchdog_and_sigterm_still_exits_cleanly(
    tmp_path: Path, engine: Engine, database_url: str, daemons: list[DaemonProcess]
) -> None:
    sacct = command(tmp_path, "sacct", "sleep 60\n")
    notify = NotifySocket(tmp_path / "notify")
    daemon = DaemonProcess(
        tmp_path,
        {
            "sources": {"sacct": {"command": sacct, "timeout_seconds": 120}},
            "daemon": {"stop_timeout_seconds": 1.0, "stuck_job_seconds": 1},
        },
        database_url,
        env={"NOTIFY_SOCKET": str(notify.path), "WATCHDOG_USEC": "400000"},
    )
    daemons.append(daemon.start())
    wait_for(
        lambda: rows(engine, "SELECT 1 FROM collect_run WHERE source = 'sacct' AND status = 'running'"),
        "the sacct run to start",
    )
    # sacct hangs longer than daemon.stuck_job_seconds: the pings stop (systemd would restart us)
    wait_for(lambda: "event=watchdog_withheld" in daemon.log(), "the watchdog to be withheld")
    assert "source:sacct" in daemon.log().split("event=watchdog_withheld", 1)[1].splitlines()[0]
    pings = notify.states().count("WATCHDOG=1")
    time.sleep(1.0)  # five watchdog periods of 0.2 s
    assert notify.states().count("WATCHDOG=1") == pings
    rc, seconds = daemon.terminate()
    print(f"SIGTERM during a hanging sacct: exit {rc} after {seconds:.2f} s")
    assert rc == 0
    assert "event=stopped" in daemon.log() and "abandoned=source:sacct" in daemon.log()
    assert "STOPPING=1" in notify.states()
    notify.close()


def test_the_epilog_hook_makes_sacct_run_now(
    tmp_path: Path, engine: Engine, database_url: str, daemons: list[DaemonProcess]
) -> None:
    sacct, calls = fake_sacct(tmp_path, SACCT_LAB)
    # authenticated by a bearer token here (MUNGE: tests/test_daemon_job_ended.py)
    token = tmp_path / "job-ended.token"
    token.write_text("job-ended-token-0123456789\n")
    token.chmod(0o600)
    daemon = DaemonProcess(
        tmp_path,
        {
            "sources": {"sacct": {"command": sacct, "interval_seconds": 3600}},
            "daemon": {"job_end_delay_seconds": 0.5, "job_end_token_file": str(token)},
        },
        database_url,
    )
    daemons.append(daemon.start())
    daemon.wait_serving()
    wait_for(lambda: rows(engine, "SELECT 1 FROM collect_run WHERE status = 'ok'"), "the first sacct run")
    conf = tmp_path / "epilog.conf"
    conf.write_text(
        f"# where slurmtel run listens\nSLURMTEL_DAEMON=127.0.0.1:{daemon.port}\nSLURMTEL_TOKEN_FILE={token}\n"
    )
    env = {"SLURMTEL_EPILOG_CONF": str(conf), "SLURM_JOB_ID": "42"}
    hook = subprocess.run([str(EPILOG)], env=env, timeout=SAFETY_SECONDS, check=False)
    assert hook.returncode == 0
    # the next sacct run came at once, not an hour later
    wait_for(lambda: len(rows(engine, "SELECT 1 FROM collect_run WHERE status = 'ok'")) == 2, "a second run")
    assert calls.read_text().count("\n") == 2
    assert metric(daemon.metrics(), "slurmtel_job_end_notifications_total") == 1
    assert "event=job_ended job_id=42 sacct=true" in daemon.log()
    # the hook drops a job id that is not one (and still exits 0); the daemon refuses one
    bad = subprocess.run([str(EPILOG)], env={**env, "SLURM_JOB_ID": "4;2"}, timeout=SAFETY_SECONDS)
    assert bad.returncode == 0
    wait_for(lambda: "event=job_ended job_id=- sacct=true" in daemon.log(), "the second notification")
    request = urllib.request.Request(
        f"http://127.0.0.1:{daemon.port}/v1/job-ended",
        data=b"job_id=4;2",
        method="POST",
        headers={"Authorization": "Bearer job-ended-token-0123456789"},
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=10)
    assert refused.value.code == 400
    assert metric(daemon.metrics(), "slurmtel_job_end_notifications_total") == 2
    assert daemon.terminate()[0] == 0


def test_the_epilog_hook_never_fails_and_never_hangs(tmp_path: Path) -> None:
    # a daemon that accepts the connection and never answers: the hook gives up after ~1 s
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    dead_port = free_port()  # nothing listens there
    timings = {}
    for name, port in (("nothing listening", dead_port), ("never answers", silent.getsockname()[1])):
        conf = tmp_path / f"{port}.conf"
        conf.write_text(f"SLURMTEL_DAEMON=127.0.0.1:{port}\n")
        t0 = time.monotonic()
        hook = subprocess.run(
            [str(EPILOG)],
            env={"SLURMTEL_EPILOG_CONF": str(conf), "SLURM_JOB_ID": "7"},
            timeout=SAFETY_SECONDS,
            check=False,
        )
        timings[name] = time.monotonic() - t0
        assert hook.returncode == 0, name
    silent.close()
    # no config file at all, no job id: still exit 0
    assert (
        subprocess.run([str(EPILOG)], env={"SLURMTEL_EPILOG_CONF": "/nonexistent"}, check=False).returncode
        == 0
    )
    print("epilog hook: " + ", ".join(f"{k} {v:.2f} s" for k, v in timings.items()))


def test_run_refuses_a_database_without_the_schema(
    tmp_path: Path, server_url: str, daemons: list[DaemonProcess]
) -> None:
    from sqlalchemy import create_engine
    from sqlalchemy.engine import make_url

    name = f"slurmtel_empty_{os.getpid()}"
    admin = create_engine(server_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}"'))
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        url = make_url(server_url).set(database=name).render_as_string(hide_password=False)
        daemon = DaemonProcess(tmp_path, {}, url)
        daemons.append(daemon.start())
        assert daemon.proc is not None
        assert daemon.proc.wait(timeout=SAFETY_SECONDS) == 1
        assert "no slurmtel schema yet: run `slurmtel db upgrade` first" in daemon.log()
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


# ---------------------------------------------------------------- check-config


def test_check_config_prints_the_effective_config_with_the_password_masked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("SLURMTEL_DATABASE_URL", raising=False)
    file = tmp_path / "slurmtel.toml"
    file.write_text(
        '[database]\nurl = "postgresql://slurmtel:Sup3r-Secret@db.example.org/slurmtel"\n'
        '[sources.sacct]\nclusters = ["lab", "other"]\n[daemon]\nport = 9999\n'
        '[chargeback]\nclose_day_of_month = 3\n[[chargeback.rates]]\nprice_per_gpu_hour = "2.50"\n'
        'valid_from = "2026-01-01"\n'
    )
    assert main(["check-config", str(file)]) == 0
    out = capsys.readouterr().out
    assert "Sup3r-Secret" not in out
    assert (
        f"# database: PostgreSQL at postgresql://slurmtel:***@db.example.org/slurmtel (database.url in {file})"
        in out
    )
    # the printout is the effective configuration: it loads back to the same config
    printed = tomllib.loads(out)
    assert printed["database"]["url"] == "postgresql://slurmtel:***@db.example.org/slurmtel"
    printed["database"]["url"] = "postgresql://slurmtel:Sup3r-Secret@db.example.org/slurmtel"
    assert config_from_dict(printed) == load_config(file)
    assert printed["daemon"]["port"] == 9999 and printed["sources"]["sacct"]["clusters"] == ["lab", "other"]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("[daemon]\nprot = 9768\n", "unknown key 'daemon.prot'"),
        ('[daemon]\nport = "9768"\n', "'daemon.port' must be an integer"),
        ("[daemon]\nport = 70000\n", "daemon.port must be between 0 and 65535"),
        ("[daemon]\nbackoff_max_seconds = 0\n", "daemon.backoff_max_seconds must be positive"),
        ("[agent]\nsummary_window_seconds = 7200\n", "agent.summary_window_seconds must be at most 3600"),
        (
            '[sources.prometheus]\nurl = "http://prom:9090"\nstep_seconds = 7200\n',
            "sources.prometheus.step_seconds must be at most 3600",
        ),
        ("[daemon\n", "invalid TOML"),
    ],
)
def test_check_config_names_the_bad_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str, message: str
) -> None:
    file = tmp_path / "bad.toml"
    file.write_text(content)
    assert main(["check-config", str(file)]) == 2
    assert message in capsys.readouterr().err


# ---------------------------------------------------------------- the schedule, in process


def test_the_schedule_has_one_job_per_enabled_source_and_the_housekeeping(ctx: RunContext) -> None:
    config = config_from_dict(
        {
            "sources": {"dcgm": {"enabled": True, "targets": ["gpu01"], "interval_seconds": 30}},
            "attribution": {"interval_seconds": 120},
            "chargeback": {"close_day_of_month": 5},
        }
    )
    c = replace(ctx, config=config)
    schedule = Schedule(c, DaemonMetrics([s.name for s in enabled_sources(c)]))
    jobs = {job.id: job for job in schedule.scheduler.get_jobs()}
    assert {j: jobs[j].trigger.interval.total_seconds() for j in jobs} == {
        "source:sacct": 300,
        "source:slurmctld": 60,
        "source:dcgm": 30,
        "attribution": 120,
        "maintenance": 3600,
        "chargeback": 3600,
    }
    assert {(j.max_instances, j.coalesce) for j in jobs.values()} == {(1, True)}
    assert jobs["source:dcgm"].misfire_grace_time == 30
    # disabled things get no job
    quiet = config_from_dict(
        {
            "sources": {"sacct": {"enabled": False}, "slurmctld": {"enabled": False}},
            "attribution": {"enabled": False},
            "chargeback": {"close_day_of_month": 0},
        }
    )
    q = replace(ctx, config=quiet)
    assert [j.id for j in Schedule(q, DaemonMetrics([])).scheduler.get_jobs()] == ["maintenance"]


def test_backoff_doubles_from_the_interval_up_to_the_cap() -> None:
    assert [backoff_seconds(30, n, 300) for n in range(1, 7)] == [30, 60, 120, 240, 300, 300]
    assert [backoff_seconds(300, n, 300) for n in range(1, 3)] == [300, 300]
    assert backoff_seconds(600, 3, 300) == 600  # never less than one interval


def test_a_database_outage_makes_a_job_skip_runs_in_process(ctx: RunContext) -> None:
    """A real refused connection (nothing listens on port 1); a hand-moved monotonic clock."""
    config = config_from_dict(
        {
            "sources": {"slurmctld": {"enabled": False}, "sacct": {"interval_seconds": 10}},
            "daemon": {"backoff_max_seconds": 40},
            "database": {"connect_timeout_seconds": 2},
        }
    )
    dead = make_engine(config, "postgresql+psycopg://slurmtel:pw@127.0.0.1:1/none")
    c = RunContext(config=config, engine=dead, clock=ctx.clock)
    clock = [1000.0]
    metrics = DaemonMetrics(["sacct"])
    schedule = Schedule(c, metrics, monotonic=lambda: clock[0])
    ran = []
    for tick in range(12):  # one scheduled run every 10 s
        clock[0] = 1000.0 + 10 * tick
        before = metrics.job_runs.labels(job="source:sacct", result="skipped")._value.get()
        schedule.run_job("source:sacct")
        if metrics.job_runs.labels(job="source:sacct", result="skipped")._value.get() == before:
            ran.append(tick)
    dead.dispose()
    # waits of 10, 20, 40, 40 s after failures 1, 2, 3, 4...: runs at ticks 0, 1, 3, 7, 11
    assert ran == [0, 1, 3, 7, 11]
    status = {s.job: s for s in schedule.job_status()}["source:sacct"]
    assert status.consecutive_failures == 5
    assert metrics.database_errors.labels(job="source:sacct")._value.get() == 5
    assert metrics.database_ok is False


def test_maintenance_creates_partitions_ahead_and_drops_expired_ones(ctx: RunContext) -> None:
    config = config_from_dict({"telemetry": {"retention_days": 30, "partitions_ahead_days": 2}})
    now = at("2026-12-02T14:00:00")
    c = replace(ctx, config=config, clock=lambda: now)
    with c.engine.begin() as conn:
        old = write_summaries(
            conn, windows("GPU-a", at("2026-10-20T10:00:00"), 4, node="n1"), source="agent", node="n1"
        )
        recent = write_summaries(
            conn, windows("GPU-a", at("2026-11-20T10:00:00"), 4, node="n1"), source="agent", node="n1"
        )
        write_job_host_windows(
            conn,
            [
                JobHostWindow("n1", "7", at(when), 30.0, 2)
                for when in ("2026-10-20T10:00:00", "2026-11-20T10:00:00")
            ],
        )
        write_lustre_stats(
            conn,
            [
                LustreJobStat("fs-OST0000", "7", "7", at(when), write_bytes=n)
                for n, when in enumerate(
                    ("2026-10-20T10:00:00", "2026-10-21T10:00:00", "2026-11-20T10:00:00")
                )
            ],
        )
    ahead = {partition_name((now + timedelta(days=d)).date()) for d in range(3)}
    cutoff = datetime(2026, 11, 2, tzinfo=UTC).date()  # 30 days before
    with c.engine.connect() as conn:
        before = existing_partitions(conn)  # other tests of this session made some too
    missing = ahead - set(before)
    expired = {name for name, day in before.items() if day < cutoff}
    assert partition_name(datetime(2026, 10, 20, tzinfo=UTC).date()) in expired
    metrics = DaemonMetrics([])
    schedule = Schedule(c, metrics)
    schedule.run_job("maintenance")
    with c.engine.connect() as conn:
        names = set(existing_partitions(conn))
    assert names.isdisjoint(expired) and ahead <= names
    assert partition_name(datetime(2026, 11, 20, tzinfo=UTC).date()) in names
    assert rows(c.engine, "SELECT id FROM ingest_batch ORDER BY id") == [(recent.batch_id,)]
    assert old.batch_id != recent.batch_id
    assert rows(c.engine, "SELECT count(*) FROM gpu_summary") == [(4,)]
    assert metrics.partitions.labels(action="dropped")._value.get() == len(expired)
    assert metrics.batches_deleted._value.get() == 1
    # the host signals of the idle causes go with the windows; of a Lustre entry's snapshots
    # before the cutoff the newest stays (the next snapshot's increase is taken from it)
    assert rows(c.engine, "SELECT node, job_id, window_start_at FROM job_host_window") == [
        ("n1", "7", at("2026-11-20T10:00:00"))
    ]
    assert rows(c.engine, "SELECT snapshot_at FROM lustre_job_stat ORDER BY snapshot_at") == [
        (at("2026-10-21T10:00:00"),),
        (at("2026-11-20T10:00:00"),),
    ]
    schedule.run_job("maintenance")  # again: nothing more to do
    assert metrics.partitions.labels(action="created")._value.get() == len(missing)
    assert metrics.partitions.labels(action="dropped")._value.get() == len(expired)


def test_the_chargeback_job_closes_the_previous_month_once_sacct_is_past_it(ctx: RunContext) -> None:
    from slurmtel.store.chargeback import closed_months
    from slurmtel.store.jobs import write_attempts
    from slurmtel.store.runs import set_cursor
    from tests.factories import attempt

    config = config_from_dict({"chargeback": {"close_day_of_month": 5}})
    c = replace(ctx, config=config, clock=lambda: at("2026-12-06T03:00:00"))
    november = at("2026-11-10T08:00:00")
    with c.engine.begin() as conn:
        write_attempts(
            conn,
            [
                attempt(
                    job_id_raw=7, submit_at=november, start_at=november, end_at=november + timedelta(hours=1)
                )
            ],
        )
    metrics = DaemonMetrics(["sacct"])
    schedule = Schedule(c, metrics)
    schedule.run_job("chargeback")
    with c.engine.connect() as conn:
        assert closed_months(conn) == []  # sacct has collected nothing yet: wait
    with c.engine.begin() as conn:
        set_cursor(conn, "sacct", "local", at("2026-12-06T02:55:00"))
    schedule.run_job("chargeback")
    schedule.run_job("chargeback")
    with c.engine.connect() as conn:
        assert closed_months(conn) == ["2026-11"]
    assert metrics.chargeback_closed._value.get() == 1
    assert metrics.job_runs.labels(job="chargeback", result="ok")._value.get() == 3


def test_the_chargeback_job_leaves_a_month_without_usage_to_a_person(
    ctx: RunContext, caplog: pytest.LogCaptureFixture
) -> None:
    from slurmtel.store.chargeback import audit_entries, closed_months
    from slurmtel.store.runs import set_cursor

    config = config_from_dict({"chargeback": {"close_day_of_month": 5}})
    c = replace(ctx, config=config, clock=lambda: at("2026-12-06T03:00:00"))
    with c.engine.begin() as conn:
        set_cursor(conn, "sacct", "local", at("2026-12-06T02:55:00"))
    metrics = DaemonMetrics(["sacct"])
    schedule = Schedule(c, metrics)
    with caplog.at_level(logging.WARNING, logger="slurmtel"):
        schedule.run_job("chargeback")
        schedule.run_job("chargeback")
    with c.engine.connect() as conn:
        assert closed_months(conn) == [] and audit_entries(conn) == []
    refused = [r for r in caplog.records if getattr(r, "event", "") == "chargeback_close_refused"]
    assert len(refused) == 1  # once per daemon run, not every pass
    assert "2026-11 has no usage" in refused[0].fields["reason"]  # type: ignore[attr-defined]
    assert metrics.job_runs.labels(job="chargeback", result="ok")._value.get() == 2


def test_config_defaults_for_the_daemon() -> None:
    daemon = Config().daemon
    assert (daemon.listen_address, daemon.port, daemon.backoff_max_seconds) == ("0.0.0.0", 9768, 300)


def test_a_job_end_pulls_telemetry_now_and_after_its_last_window_then_attributes(ctx: RunContext) -> None:
    """In process, a hand-moved monotonic clock, the jobs' work replaced by no-ops: which runs
    the hook's post and the runs after it ask for (docs/daemon.md: Freshness)."""
    config = config_from_dict(
        {
            "sources": {
                "slurmctld": {"enabled": False},
                "agent": {"enabled": True, "targets": ["gpu01"], "interval_seconds": 60},
            },
            "agent": {"summary_window_seconds": 30},
            "daemon": {"job_end_delay_seconds": 5.0},
        }
    )
    clock = [1000.0]
    schedule = Schedule(
        replace(ctx, config=config), DaemonMetrics(["sacct", "agent"]), monotonic=lambda: clock[0]
    )
    for job in schedule.states:
        schedule._work[job] = lambda: None
    states = schedule.states

    def due_in(job: str) -> float:
        scheduled = schedule.scheduler.get_job(job)
        return (scheduled.next_run_time - datetime.now(UTC)).total_seconds()

    for job in ("source:sacct", "source:agent", "attribution"):
        schedule.scheduler.get_job(job).modify(next_run_time=datetime.now(UTC) + timedelta(hours=1))
    schedule.job_ended("42")
    # sacct and the agents, after the delay; attribution not yet
    assert states["source:sacct"].poked_at == states["source:agent"].poked_at == 1000.0
    assert 3 < due_in("source:sacct") <= 5 and 3 < due_in("source:agent") <= 5
    assert states["attribution"].poked_at is None
    clock[0] = 1005.0
    schedule.run_job("source:sacct")
    assert states["attribution"].poked_at == 1005.0 and due_in("attribution") <= 0.5
    # as the scheduler does when it starts the run: the next one an interval later
    schedule.scheduler.get_job("source:agent").modify(next_run_time=datetime.now(UTC) + timedelta(seconds=60))
    schedule.run_job("source:agent")
    # the job's last 30 s window closes by 1030: the agents again at 1035, then attribution
    assert 28 < due_in("source:agent") <= 30
    clock[0] = 1035.0
    schedule.run_job("source:agent")
    assert states["attribution"].poked_at == 1035.0
    assert states["source:agent"].poked_at == 1005.0  # no more follow-ups
    # a run long after the job end is a periodic one: no attribution of its own
    clock[0] = 1200.0
    schedule.run_job("source:agent")
    assert states["attribution"].poked_at == 1035.0
