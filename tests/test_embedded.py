"""The embedded PostgreSQL: it refuses, with one clear line, a data directory of another user;
and it stops with the last command that uses it, whatever signal ends that command."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from slurmtel.errors import DatabaseUnavailable
from slurmtel.store.embedded import HANDLES_FILE, _check_owner, forget_gone_handles, process_running


def test_another_users_data_directory_is_refused_by_name(tmp_path: Path) -> None:
    pgdata = tmp_path / "pgdata"
    pgdata.mkdir()
    if os.getuid() == 0:
        os.chown(pgdata, 65534, 65534)
        owner = 65534
        caller = 1000
    else:
        owner = os.getuid()
        caller = owner + 1
    with pytest.raises(DatabaseUnavailable, match=r"belongs to .*site\.state_dir.*database\.url"):
        _check_owner(pgdata, uid=caller)
    _check_owner(pgdata, uid=owner)  # its owner may
    _check_owner(pgdata, uid=0)  # and root (pgserver runs root's server as its own user)
    _check_owner(tmp_path / "absent", uid=caller)  # nothing there yet: it will be created


# ------------------------------------------------------------------ the server's life, real processes
#
# `slurmtel` in processes of its own, on an embedded PostgreSQL (pgserver) of their own: a signal
# (SIGTERM from systemd or kill, SIGINT from ^C) ends a command that runs on it, and the server
# stops once no process uses it, with no stale handle left in .handle_pids.json.

SAFETY_SECONDS = 60


@dataclass(frozen=True)
class Site:
    config: Path
    pgdata: Path
    sacct_started: Path  # the stand-in sacct writes it, then sleeps: a command caught mid-run
    api_port: int

    def handles(self) -> list[int]:
        return list(json.loads((self.pgdata / HANDLES_FILE).read_text()))

    def postmaster_pid(self) -> int | None:
        """The server's pid while it runs (postmaster.pid, and a live process), else None."""
        try:
            pid = int((self.pgdata / "postmaster.pid").read_text().splitlines()[0])
        except (FileNotFoundError, IndexError, ValueError):
            return None
        return pid if alive(pid) else None


def alive(pid: int) -> bool:
    """PID runs (a zombie does not: an ended server whose parent, gone, cannot reap it)."""
    return process_running(pid)


def slurmtel(site: Site, *words: str) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("SLURMTEL_DATABASE_URL", "SLURMTEL_CONFIG")}
    return subprocess.Popen(
        [sys.executable, "-m", "slurmtel", "--config", str(site.config), *words],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def wait_for(condition: Callable[[], bool], what: str, proc: subprocess.Popen[str] | None = None) -> None:
    deadline = time.monotonic() + SAFETY_SECONDS
    while not condition():
        if proc is not None and proc.poll() is not None:
            out, err = proc.communicate()
            raise AssertionError(f"{what}: the command ended first (exit {proc.returncode}): {out}{err}")
        assert time.monotonic() < deadline, f"{what}: not within {SAFETY_SECONDS} s"
        time.sleep(0.05)


def threads_taking(pid: int, signum: int) -> list[int]:
    """The threads of PID that do not block SIGNUM (/proc's SigBlk: bit signum - 1)."""
    taking = []
    for task in sorted(Path(f"/proc/{pid}/task").iterdir(), key=lambda path: int(path.name)):
        status = dict(
            line.split(":\t", 1) for line in (task / "status").read_text().splitlines() if ":\t" in line
        )
        if not int(status["SigBlk"], 16) & (1 << (signum - 1)):
            taking.append(int(task.name))
    return taking


def assert_server_gone(site: Site) -> None:
    """No process uses the server, and it has stopped: none running, no handle left."""
    wait_for(lambda: site.postmaster_pid() is None, "the embedded PostgreSQL stopped")
    assert site.handles() == []


@pytest.fixture(scope="module")
def embedded_site() -> Iterator[Site]:
    """A config with no database URL (the embedded PostgreSQL under its state_dir), the schema
    made once with `slurmtel db upgrade`, and a stand-in sacct that never answers. Not under
    pytest's own temporary folder: as root, pgserver runs the server as the user "pgserver",
    and every pytest session makes /tmp/pytest-of-root unreadable to others again."""
    with tempfile.TemporaryDirectory(prefix="slurmtel-test-embedded-") as tmp:
        yield _site(Path(tmp))


def _site(root: Path) -> Site:
    started = root / "sacct-started"
    sacct = root / "sacct"
    sacct.write_text(f"#!/bin/sh\ntouch {started}\nexec sleep {SAFETY_SECONDS * 2}\n")
    sacct.chmod(0o755)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    config = root / "slurmtel.toml"
    config.write_text(
        f'[site]\nstate_dir = "{root / "state"}"\ncluster = "lab"\n'
        f'[sources.sacct]\ncommand = "{sacct}"\n[api]\nport = {port}\n'
    )
    site = Site(config, root / "state" / "pgdata", started, port)
    upgrade = slurmtel(site, "db", "upgrade")
    out, err = upgrade.communicate(timeout=SAFETY_SECONDS * 2)
    assert upgrade.returncode == 0, out + err
    assert_server_gone(site)
    return site


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_ends_a_command_and_its_embedded_server(embedded_site: Site, signum: int) -> None:
    site = embedded_site
    site.sacct_started.unlink(missing_ok=True)
    proc = slurmtel(site, "collect", "sacct", "--once")
    try:
        # the command has started the server, recorded its run and waits on sacct
        wait_for(site.sacct_started.exists, "the command waits on sacct", proc)
        assert site.handles() == [proc.pid] and site.postmaster_pid() is not None
        # the kernel gives a process's signal to any thread not blocking it, and Python's
        # handler waits for the main thread (asleep on sacct): only the main thread may take it
        assert threads_taking(proc.pid, signum) == [proc.pid]
        t0 = time.monotonic()
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=SAFETY_SECONDS)
        seconds = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
    word = "terminated" if signum == signal.SIGTERM else "interrupted"
    # (a run an earlier test cut short may be named as interrupted first: a log line)
    assert (proc.returncode, err.strip().splitlines()[-1]) == (1, f"slurmtel: {word}"), out + err
    assert "Traceback" not in err
    assert_server_gone(site)
    # nothing lingers on the server's account: it stopped with the command, not later
    assert seconds < SAFETY_SECONDS


def test_sigterm_stops_serve_and_its_embedded_server(embedded_site: Site) -> None:
    site = embedded_site
    proc = slurmtel(site, "serve")
    try:

        def answers() -> bool:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{site.api_port}/healthz", timeout=5) as r:
                    return bool(r.status == 200)
            except OSError:
                return False

        wait_for(answers, "serve answers /healthz", proc)
        assert site.handles() == [proc.pid]
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=SAFETY_SECONDS)
    finally:
        if proc.poll() is None:
            proc.kill()
    # a SIGTERM is how systemd stops the API: a clean stop, exit 0
    assert proc.returncode == 0, out + err
    assert "Traceback" not in err
    assert_server_gone(site)


def test_a_handle_left_by_a_killed_process_is_forgotten(embedded_site: Site) -> None:
    """kill -9 leaves the server running with the dead pid in its handles (no atexit ran): the
    next command forgets it, and the server stops when that command ends."""
    site = embedded_site
    site.sacct_started.unlink(missing_ok=True)
    proc = slurmtel(site, "collect", "sacct", "--once")
    try:
        wait_for(site.sacct_started.exists, "the command waits on sacct", proc)
    finally:
        proc.kill()
        proc.communicate(timeout=SAFETY_SECONDS)
    server = site.postmaster_pid()
    assert server is not None and site.handles() == [proc.pid]
    runs = slurmtel(site, "runs", "--format", "csv")
    _, err = runs.communicate(timeout=SAFETY_SECONDS)
    assert runs.returncode == 0, err
    assert_server_gone(site)
    assert not alive(server)


def test_forget_gone_handles_keeps_the_living(tmp_path: Path) -> None:
    living = subprocess.Popen(["sleep", "30"])
    gone = subprocess.Popen(["true"])
    gone.wait()
    zombie = subprocess.Popen(["true"])  # ended, not reaped yet: gone too
    wait_for(lambda: not process_running(zombie.pid), "the zombie")
    try:
        (tmp_path / HANDLES_FILE).write_text(json.dumps([living.pid, gone.pid, zombie.pid, os.getpid()]))
        assert forget_gone_handles(tmp_path) == [gone.pid, zombie.pid]
        assert json.loads((tmp_path / HANDLES_FILE).read_text()) == [living.pid, os.getpid()]
        assert forget_gone_handles(tmp_path) == []
        assert forget_gone_handles(tmp_path / "absent") == []
    finally:
        living.kill()
        living.wait()
        zombie.wait()
