"""A real munged of the test session's own: its own key, socket, pid, log and seed files in a
temporary directory, so nothing of the machine's MUNGE (if any) is used or touched.

    mungekey -c -k DIR/munge.key
    munged --force --socket=DIR/munge.socket --pid-file=DIR/munged.pid \\
        --log-file=DIR/munged.log --seed-file=DIR/munged.seed --key-file=DIR/munge.key

Debian's `munge` package provides munge, unmunge, munged and mungekey. When they are missing
and we are root on Debian, scripts/ci-slurm-deps.sh installs it. Otherwise the tests skip with
the reason - except in CI (SLURMTEL_REQUIRE_MUNGE=1, SLURMTEL_REQUIRE_SLURM=1 or $CI set),
where that is a failure: no test skips itself in CI.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TOOLS = ("munge", "unmunge", "munged", "mungekey")
# munged's directories: /usr/sbin is often not on a test runner's PATH
SEARCH_PATH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin", "/usr/bin"])


def required() -> bool:
    return (
        os.environ.get("SLURMTEL_REQUIRE_MUNGE") == "1"
        or os.environ.get("SLURMTEL_REQUIRE_SLURM") == "1"
        or bool(os.environ.get("CI"))
    )


def _missing() -> list[str]:
    return [t for t in TOOLS if shutil.which(t, path=SEARCH_PATH) is None]


def tool(name: str) -> str:
    path = shutil.which(name, path=SEARCH_PATH)
    assert path is not None, f"{name} not found"
    return path


def ensure_munge() -> None:
    """Install Debian's munge when missing and we may; else skip (fail in CI)."""
    missing = _missing()
    if missing and os.geteuid() == 0 and shutil.which("apt-get"):
        subprocess.run(
            ["bash", str(ROOT / "scripts" / "ci-slurm-deps.sh"), "munge"], check=False, timeout=600
        )
        missing = _missing()
    if missing:
        message = f"MUNGE is not installed ({', '.join(missing)} missing; Debian: apt-get install munge)"
        if required():
            pytest.fail(message + " and this is CI (SLURMTEL_REQUIRE_MUNGE / SLURMTEL_REQUIRE_SLURM / CI)")
        pytest.skip(message + "; in CI this is a failure")


def require_root(what: str) -> None:
    if os.geteuid() != 0:
        message = f"{what} needs root (useradd, runuser)"
        if required():
            pytest.fail(message + " and this is CI")
        pytest.skip(message + "; in CI this is a failure")


class Munged:
    """One munged with a key of its own (or KEY_FROM's key: two daemons sharing a key)."""

    def __init__(self, directory: Path, key_from: Munged | None = None) -> None:
        self.dir = directory
        directory.mkdir(parents=True, exist_ok=True)
        # others must reach the socket (runuser -u USER -- munge ...): execute on the directory
        directory.chmod(0o711)
        self.key = directory / "munge.key"
        self.socket = str(directory / "munge.socket")
        self.pid_file = directory / "munged.pid"
        self.log = directory / "munged.log"
        if key_from is not None:
            shutil.copyfile(key_from.key, self.key)
            self.key.chmod(0o600)
        else:
            subprocess.run([tool("mungekey"), "-c", "-k", str(self.key)], check=True, timeout=60)
        self.key.chmod(0o600)

    def start(self) -> Munged:
        args = [
            tool("munged"),
            f"--socket={self.socket}",
            f"--pid-file={self.pid_file}",
            f"--log-file={self.log}",
            f"--seed-file={self.dir / 'munged.seed'}",
            f"--key-file={self.key}",
        ]
        if os.geteuid() == 0:
            args.insert(1, "--force")  # root-owned /tmp files are fine for a test daemon
        subprocess.run(args, check=True, timeout=60, capture_output=True)
        deadline = time.monotonic() + 30
        while not Path(self.socket).exists():
            if time.monotonic() > deadline:
                raise AssertionError(f"munged did not create {self.socket}: {self.log.read_text()}")
            time.sleep(0.05)
        return self

    def stop(self) -> None:
        if self.pid_file.exists():
            subprocess.run([tool("munged"), f"--socket={self.socket}", "--stop"], check=False, timeout=60)

    def credential(self, payload: str, *, user: str | None = None, ttl_seconds: int = 0) -> str:
        """`munge -s PAYLOAD` against this munged, as USER (runuser) or as ourselves."""
        args = [tool("munge"), "-S", self.socket, "-s", payload]
        if ttl_seconds:
            args += ["-t", str(ttl_seconds)]
        if user is not None:
            args = [tool("runuser"), "-u", user, "--", *args]
        done = subprocess.run(args, check=True, timeout=60, capture_output=True)
        return done.stdout.decode().strip()


@contextmanager
def running(key_from: Munged | None = None) -> Iterator[Munged]:
    """A started munged in a directory of its own under the system's temporary directory
    (pytest's is mode 0700, which other users' `munge` could not pass), removed afterwards."""
    directory = Path(tempfile.mkdtemp(prefix="slurmtel-munged-"))
    daemon = Munged(directory, key_from=key_from)
    try:
        yield daemon.start()
    finally:
        daemon.stop()
        shutil.rmtree(directory, ignore_errors=True)


def add_user(prefix: str = "stauth") -> str:
    """A throwaway unix user (no home, no shell); remove it with remove_user."""
    name = f"{prefix}{secrets.token_hex(3)}"
    subprocess.run(
        ["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", "--user-group", name],
        check=True,
        timeout=60,
    )
    return name


def remove_user(name: str) -> None:
    subprocess.run(["userdel", name], check=False, timeout=60)
