"""`slurmtel-agent` as a process: fake NVML from a real capture, a fake /proc, SIGTERM.

Deadlines below only stop a hung test; nothing asserts how fast anything is.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import stat
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

from slurmtel.agent.protocol import (
    SummariesPage,
    decode_ack_response,
    decode_summaries_response,
    encode_ack_request,
    summaries_query,
)
from slurmtel.agent.token import ensure_token
from tests.conftest import fixture_path
from tests.test_agent_procmap import CGROUP_V2, write_proc
from tests.test_daemon import NotifySocket

CAPTURE = fixture_path("nvidia_smi", "linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01.txt")
GPU0 = "GPU-00000000-0000-0000-0000-000000000000"
HANG_GUARD_SECONDS = 60


def write_config(tmp_path: Path, port: int = 0) -> Path:
    proc = tmp_path / "proc"
    # gpu_burn, pid 11345 in the H100 capture, runs in job 4242
    write_proc(proc, 11345, CGROUP_V2.replace("job_123", "job_4242"))
    config = tmp_path / "slurmtel.toml"
    config.write_text(
        f"""
[site]
state_dir = "{tmp_path / "state"}"

[logging]
level = "INFO"

[agent]
listen_address = "127.0.0.1"
port = {port}
sample_interval_seconds = 0.2
summary_window_seconds = 1
node_name = "gpu01"
proc_root = "{proc}"
"""
    )
    return config


class AgentProcess:
    def __init__(self, tmp_path: Path, config: Path, *extra: str, env: dict[str, str] | None = None) -> None:
        # no agent.token_file in write_config: the agent makes its own token in its state dir
        self.token_path = tmp_path / "state" / "agent-token"
        self.log = tmp_path / f"agent-{time.monotonic_ns()}.log"
        self.log_file = self.log.open("w")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "slurmtel.agent.main", "--config", str(config), *extra],
            stdout=self.log_file,
            stderr=subprocess.STDOUT,
            cwd=Path(__file__).resolve().parents[1],
            env={**os.environ, **(env or {})},
        )
        self.base = ""

    def wait_listening(self) -> str:
        deadline = time.monotonic() + HANG_GUARD_SECONDS
        while time.monotonic() < deadline:
            match = re.search(r"listening on (http://127\.0\.0\.1:\d+)", self.log.read_text())
            if match:
                self.base = match.group(1)
                return self.base
            assert self.process.poll() is None, self.log.read_text()
            time.sleep(0.05)
        raise AssertionError("agent did not start listening")

    def headers(self, path: str) -> dict[str, str]:
        if not path.startswith("/v1/"):
            return {}
        return {"Authorization": f"Bearer {self.token_path.read_text().strip()}"}

    def get(self, path: str) -> bytes:
        request = urllib.request.Request(self.base + path, headers=self.headers(path))
        with urllib.request.urlopen(request, timeout=30) as response:
            return bytes(response.read())

    def post(self, path: str, body: bytes) -> bytes:
        request = urllib.request.Request(self.base + path, data=body, headers=self.headers(path))
        with urllib.request.urlopen(request, timeout=30) as response:
            return bytes(response.read())

    def pull_until(self, predicate: Callable[[SummariesPage], bool], after: int = 0) -> SummariesPage:
        deadline = time.monotonic() + HANG_GUARD_SECONDS
        while time.monotonic() < deadline:
            page = decode_summaries_response(self.get(summaries_query(after, 1000)))
            if predicate(page):
                return page
            time.sleep(0.1)
        raise AssertionError(f"no matching page; log:\n{self.log.read_text()}")

    def stop(self) -> int:
        self.process.send_signal(signal.SIGTERM)
        code = self.process.wait(timeout=HANG_GUARD_SECONDS)
        self.log_file.close()
        return code


def covered_job_summary(page: SummariesPage) -> bool:
    return any(s.job_ids == ("4242",) and s.covered_seconds == 1.0 for s in page.summaries)


def test_agent_samples_serves_and_stops_on_sigterm(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    agent = AgentProcess(tmp_path, config, "--fake-nvml", str(CAPTURE))
    try:
        agent.wait_listening()
        page = agent.pull_until(covered_job_summary)
        assert page.node == "gpu01"
        first = page.items[0]
        assert (first.seq, first.kind) == (1, "inventory")
        assert page.inventory[0].gpu_uuid == GPU0
        full = next(s for s in page.summaries if s.covered_seconds == 1.0)
        assert (full.util_metric, full.util_mean_percent, full.idle_seconds) == (
            "gr_engine_active",
            100.0,
            0.0,
        )
        assert full.energy_method == "counter"
        assert full.power_mean_watts == 629.45
        seqs = [i.seq for i in page.items]
        assert seqs == list(range(1, len(seqs) + 1))
        acked = decode_ack_response(agent.post("/v1/ack", encode_ack_request(page.next_cursor))).acked_cursor
        assert acked == page.next_cursor
        metrics = agent.get("/metrics").decode()
        assert "slurmtel_agent_samples_total" in metrics
    finally:
        code = agent.stop()
    assert code == 0, agent.log.read_text()
    assert "stopped at" in agent.log.read_text()

    # a restart continues the same spool: nothing acked comes back, sequence numbers go on
    again = AgentProcess(tmp_path, config, "--fake-nvml", str(CAPTURE))
    try:
        again.wait_listening()
        later = again.pull_until(lambda p: any(i.seq > acked and i.kind == "summary" for i in p.items))
        assert later.items[0].seq == acked + 1
        assert later.spool_id == page.spool_id
        assert all(i.seq > acked for i in later.items)
    finally:
        assert again.stop() == 0


def test_first_start_makes_a_private_token_and_serves_v1_only_with_it(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    agent = AgentProcess(tmp_path, config, "--fake-nvml", str(CAPTURE))
    try:
        agent.wait_listening()
        token = agent.token_path.read_text().strip()
        assert len(token) >= 32
        assert stat.S_IMODE(agent.token_path.stat().st_mode) == 0o600
        log = agent.log.read_text()
        assert f"made a token in {agent.token_path} (mode 0600)" in log and token not in log
        for headers in ({}, {"Authorization": "Bearer wrong-token-wrong-token"}):
            for request in (
                urllib.request.Request(agent.base + summaries_query(0), headers=headers),
                urllib.request.Request(
                    agent.base + "/v1/ack", data=encode_ack_request(10**9), headers=headers
                ),
            ):
                with pytest.raises(urllib.error.HTTPError) as refused:
                    urllib.request.urlopen(request, timeout=30)
                assert refused.value.code == 401
        assert decode_summaries_response(agent.get(summaries_query(0))).node == "gpu01"
        # open to Prometheus without a token
        with urllib.request.urlopen(agent.base + "/metrics", timeout=30) as response:
            assert response.status == 200
    finally:
        assert agent.stop() == 0
    # the next start keeps the same token (the head holds a copy)
    again = AgentProcess(tmp_path, config, "--fake-nvml", str(CAPTURE))
    try:
        again.wait_listening()
        assert again.token_path.read_text().strip() == token
        assert "made a token" not in again.log.read_text()
    finally:
        assert again.stop() == 0


def test_a_configured_token_file_must_exist_and_be_private(tmp_path: Path) -> None:
    token = tmp_path / "token"
    base = write_config(tmp_path).read_text()
    config = tmp_path / "with-token.toml"
    config.write_text(base + f'token_file = "{token}"\n')
    argv = [sys.executable, "-m", "slurmtel.agent.main", "--config", str(config), "--fake-nvml", str(CAPTURE)]
    run = subprocess.run(argv, capture_output=True, text=True, timeout=HANG_GUARD_SECONDS)
    assert run.returncode == 2 and "does not exist" in run.stderr
    token.write_text("a-token-everyone-can-read\n")
    token.chmod(0o644)
    run = subprocess.run(argv, capture_output=True, text=True, timeout=HANG_GUARD_SECONDS)
    assert run.returncode == 2 and "lets every user read or write it" in run.stderr
    token.chmod(0o600)
    token.write_text("short\n")
    run = subprocess.run(argv, capture_output=True, text=True, timeout=HANG_GUARD_SECONDS)
    assert run.returncode == 2 and "at least 16 characters" in run.stderr
    assert not (tmp_path / "state" / "agent-token").exists()


def test_a_token_file_others_may_write_or_a_token_with_nul_or_space_is_refused(tmp_path: Path) -> None:
    from slurmtel.agent.token import read_token
    from slurmtel.errors import ConfigError

    token = tmp_path / "token"
    token.write_text("a-good-token-0123456789\n")
    for mode, said in ((0o620, "its group write"), (0o660, "its group write"), (0o602, "every user")):
        token.chmod(mode)
        with pytest.raises(ConfigError, match=said):
            read_token(token)
    token.chmod(0o640)  # group-readable, owner-writable: the group may read it, nobody may change it
    assert read_token(token) == "a-good-token-0123456789"
    token.chmod(0o600)
    for bad in (
        "a-good-token\x000123456789",
        "a-good-token 0123456789",
        "a-good-token\t0123456789",
        "a-good\x1b-token-0123",
    ):
        token.write_text(bad + "\n")
        with pytest.raises(ConfigError, match="no space, NUL or control character"):
            read_token(token)


def test_ensure_token_is_atomic_and_keeps_an_existing_token(tmp_path: Path) -> None:
    path = tmp_path / "state" / "agent-token"
    made, created = ensure_token(path)
    assert created and path.read_text() == made + "\n"
    assert ensure_token(path) == (made, False)
    assert sorted(p.name for p in path.parent.iterdir()) == ["agent-token"]  # no partial file left


def test_agent_tells_systemd_it_is_ready_alive_and_stopping(tmp_path: Path) -> None:
    notify = NotifySocket(tmp_path / "notify")
    env = {"NOTIFY_SOCKET": str(notify.path), "WATCHDOG_USEC": "400000"}
    agent = AgentProcess(tmp_path, write_config(tmp_path), "--fake-nvml", str(CAPTURE), env=env)
    try:
        deadline = time.monotonic() + HANG_GUARD_SECONDS
        while notify.states().count("WATCHDOG=1") < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "READY=1" in notify.states(), agent.log.read_text()
        assert notify.states().count("WATCHDOG=1") >= 2
    finally:
        assert agent.stop() == 0
        notify.close()
    assert "STOPPING=1" in notify.states()
    assert notify.states().index("READY=1") < notify.states().index("STOPPING=1")


def test_usage_errors_exit_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[agent]\nsample_interval_seconds = 0\n")
    run = subprocess.run(
        [sys.executable, "-m", "slurmtel.agent.main", "--config", str(bad), "--fake-nvml", str(CAPTURE)],
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_SECONDS,
    )
    assert run.returncode == 2
    assert "agent.sample_interval_seconds must be positive" in run.stderr

    config = write_config(tmp_path)
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "slurmtel.agent.main",
            "--config",
            str(config),
            "--fake-nvml",
            str(tmp_path / "no"),
        ],
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_SECONDS,
    )
    assert run.returncode == 2
    assert "--fake-nvml" in run.stderr

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        config = write_config(tmp_path, port=busy.getsockname()[1])
        run = subprocess.run(
            [
                sys.executable,
                "-m",
                "slurmtel.agent.main",
                "--config",
                str(config),
                "--fake-nvml",
                str(CAPTURE),
            ],
            capture_output=True,
            text=True,
            timeout=HANG_GUARD_SECONDS,
        )
    assert run.returncode == 2
    assert "Address already in use" in run.stderr


def test_without_a_gpu_the_real_nvml_fails_cleanly(tmp_path: Path) -> None:
    """No --fake-nvml: the real seam. Here (no driver) NVML init fails with exit 1 and a message;
    on a GPU machine the agent starts and stops like with the fake."""
    config = write_config(tmp_path)
    agent = AgentProcess(tmp_path, config)
    deadline = time.monotonic() + HANG_GUARD_SECONDS
    while agent.process.poll() is None and time.monotonic() < deadline:
        if "listening on" in agent.log.read_text():
            break
        time.sleep(0.05)
    if agent.process.poll() is None:
        agent.base = re.search(r"listening on (\S+)", agent.log.read_text()).group(1)  # type: ignore[union-attr]
        assert decode_summaries_response(agent.get(summaries_query(0))).inventory
        assert agent.stop() == 0
    else:
        agent.log_file.close()
        assert agent.process.returncode == 1
        assert "NVML unavailable: nvmlInit" in agent.log.read_text()
