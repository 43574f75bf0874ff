"""Freshness on the real Slurm 22.05 lab: from a job's end to `slurmtel job JOBID` showing it.

Shared by tests/integration/test_slurm_freshness.py and benchmarks/freshness.py. A `Rig` is
what a site runs, as processes:

- `slurmtel run` (the daemon) on the lab's Slurm clients and a PostgreSQL database, with the
  sacct source at its defaults (every 300 s, plus the runs the hook asks for), the slurmctld
  source (GPU indices of running jobs; every CONTROLLER_SECONDS, see there), the agent source
  pulling both nodes' agents (its default 60 s) and attribution (its default 300 s);
- one `slurmtel-agent` per lab node (gpu01, gpu02), each driving a fake NVML (`--fake-nvml`)
  from the real H100 `nvidia-smi -q` capture repeated for the node's 4 GPUs with UUIDs of its
  own (the lab's GPUs are /dev/null clones), with the site's shared agent token;
- the EpilogSlurmctld hook systemd/slurmtel-epilog.sh, which tests/slurm_lab/up.sh installs in
  the lab's slurm.conf as a site does: slurmctld runs it as SlurmUser at each job's end and it
  posts `POST /v1/job-ended` with a MUNGE credential of SlurmUser to 127.0.0.1:9768, the
  daemon's default port (no /etc/slurmtel/epilog.conf). A rig with `hook=False` puts its
  daemon on another port: the posts then reach nothing, and only the periodic runs remain.

`watch` polls sacct for each job's End and, once it has one, the real CLI (`slurmtel job
JOBID --format json`, a subprocess) until the job is `shown`: its final state, its GPU-hours
(every allocated GPU-second attributed to a mapped GPU) and a utilisation for every GPU; and
`complete`: that utilisation covers the whole allocation (the job's last telemetry window is
in). Each is timed from Slurm's End.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tests.integration.lab import SlurmLab, merge
from tests.test_agent_main import AgentProcess
from tests.test_daemon import DaemonProcess, free_port, wait_for

ROOT = Path(__file__).resolve().parents[2]
CAPTURE = ROOT / "tests/fixtures/nvidia_smi/linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01__load__q.txt"
CAPTURE_UUID = "GPU-00000000-0000-0000-0000-000000000000"
CAPTURE_BUS = "00000000:00:09.0"
NODES = {"gpu01": 4, "gpu02": 4}
# what EpilogSlurmctld posts to without /etc/slurmtel/epilog.conf: daemon.port's default
HOOK_PORT = 9768
HOOK_PATH = "/usr/local/libexec/slurmtel-epilog.sh"
# The lab's jobs run about a minute, so the controller is polled every 15 s (default 60 s) to
# see each job's GPU indices while it runs; everything after a job's end is at the defaults.
CONTROLLER_SECONDS = 15
# a hang guard for one job, never a speed assertion
HANG_GUARD_SECONDS = 900.0
# once a job is shown, its answers are followed this often until this long after its End: by
# then its last agent window (agent.summary_window_seconds) has long been pulled and attributed
FOLLOW_SECONDS = 5.0
FINAL_SECONDS = 120.0


def node_capture(node_number: int, gpus: int) -> str:
    """`nvidia-smi -q` of GPUS H100s for lab node NODE_NUMBER, from the single-GPU capture:
    its GPU section repeated with UUIDs, bus ids and minor numbers of that node's own
    (benchmarks/agent_cpu.py does the same for one synthetic node)."""
    raw = CAPTURE.read_text()
    head, body = raw.split(f"GPU {CAPTURE_BUS}\n", 1)
    sections = []
    for i in range(gpus):
        bus = f"00000000:{0x10 + i:02X}:00.0"
        section = (
            body.replace(CAPTURE_UUID, gpu_uuid(node_number, i))
            .replace(CAPTURE_BUS, bus)
            .replace("Minor Number                                       : 0", f"Minor Number{' ' * 39}: {i}")
        )
        sections.append(f"GPU {bus}\n{section}")
    return head.replace(
        "Attached GPUs                                          : 1", f"Attached GPUs{' ' * 42}: {gpus}"
    ) + "".join(sections)


def gpu_uuid(node_number: int, index: int) -> str:
    return f"GPU-{node_number:08d}-0000-0000-0000-{index:012d}"


def hook_installed(lab: SlurmLab) -> bool:
    """Whether the lab's slurmctld runs slurmtel's hook as EpilogSlurmctld (tests/slurm_lab/up.sh)."""
    for line in lab.run(["scontrol", "show", "config"]).splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "EpilogSlurmctld":
            return value.strip() == HOOK_PATH
    return False


def port_is_free(port: int) -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


class Rig:
    """The daemon and both node agents, as processes, for LAB and the database at DATABASE_URL."""

    def __init__(self, lab: SlurmLab, directory: Path, database_url: str, *, hook: bool = True) -> None:
        self.lab = lab
        self.directory = directory
        self.hook = hook
        self.agents: list[AgentProcess] = []
        token = directory / "agent.token"
        token.write_text(os.urandom(16).hex() + "\n")
        token.chmod(0o600)
        self.targets: list[str] = []
        self._agent_configs: list[tuple[Path, Path, Path]] = []
        empty_proc = directory / "no-proc"
        empty_proc.mkdir(exist_ok=True)
        for number, (node, gpus) in enumerate(NODES.items(), start=1):
            home = directory / node
            home.mkdir(exist_ok=True)
            capture = home / "nvidia-smi-q.txt"
            capture.write_text(node_capture(number, gpus))
            port = free_port()
            config = home / "agent.toml"
            # proc_root: the capture's processes are no job's; the controller maps GPUs to jobs
            config.write_text(
                f'[site]\nstate_dir = "{home / "state"}"\n[logging]\nlevel = "INFO"\n'
                f'[agent]\nlisten_address = "127.0.0.1"\nport = {port}\nnode_name = "{node}"\n'
                f'token_file = "{token}"\nproc_root = "{empty_proc}"\n'
            )
            self._agent_configs.append((home, config, capture))
            self.targets.append(f"{node}=127.0.0.1:{port}")
        settings = merge(
            {
                "sources": {
                    "slurmctld": {"enabled": True, "interval_seconds": CONTROLLER_SECONDS},
                    "agent": {"enabled": True, "targets": self.targets, "token_file": str(token)},
                },
                "attribution": {"enabled": True},
                "site": {"timezone": "UTC"},
            },
            lab.client_settings(),
        )
        port = HOOK_PORT if hook else free_port()
        settings["daemon"] = {"port": port}
        self.daemon = DaemonProcess(directory, settings, database_url)
        self.daemon.port = port

    def start(self) -> Rig:
        if self.hook:
            assert hook_installed(self.lab), (
                f"the lab's slurmctld does not run {HOOK_PATH} as EpilogSlurmctld: run tests/slurm_lab/up.sh"
            )
            assert port_is_free(HOOK_PORT), (
                f"127.0.0.1:{HOOK_PORT}, where the lab's hook posts, is taken by another process"
            )
        for home, config, capture in self._agent_configs:
            agent = AgentProcess(home, config, "--fake-nvml", str(capture))
            self.agents.append(agent)
            agent.wait_listening()
        self.daemon.start()
        self.daemon.wait_serving()
        return self

    def stop(self) -> None:
        if self.daemon.alive():
            self.daemon.terminate()
        for agent in self.agents:
            if agent.process.poll() is None:
                agent.stop()

    def __enter__(self) -> Rig:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def job(self, job_id: int) -> list[dict[str, Any]]:
        """`slurmtel job JOB_ID --format json`, the real CLI in a process of its own ([] when
        it says the job is not found)."""
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "slurmtel",
                "--config",
                str(self.daemon.config_path),
                "job",
                str(job_id),
                "--format",
                "json",
            ],
            capture_output=True,
            text=True,
            cwd=ROOT,
            env=self.daemon.env,
            check=False,
            timeout=120,
        )
        if proc.returncode == 1 and "not found" in proc.stderr:
            return []
        assert proc.returncode == 0, f"slurmtel job {job_id} exited {proc.returncode}: {proc.stderr}"
        document: list[dict[str, Any]] = json.loads(proc.stdout)
        return document

    def job_end_notifications(self) -> float:
        from tests.test_daemon import metric

        return metric(self.daemon.metrics(), "slurmtel_job_end_notifications_total") or 0.0


def submit(lab: SlurmLab, seconds: int, *, gpus: int = 1, name: str = "slurmtel-fresh") -> int:
    """A GPU job of alice's that runs SECONDS."""
    return lab.sbatch("alice", f"--gres=gpu:{gpus}", "-t", "10", "-J", name, wrap=f"sleep {seconds}")


def shown(report: dict[str, Any], gpus: int) -> bool:
    """Final state, GPU-hours (all allocated time on mapped GPUs) and a utilisation per GPU."""
    if report["state"] != "COMPLETED" or report["end_at"] is None or report["elapsed_seconds"] is None:
        return False
    rows = report["gpu_figures"]
    if len(rows) != gpus or any(r["gpu_uuid"] == "(unmapped)" for r in rows):
        return False
    gpu_seconds = sum(r["allocated_gpu_seconds"] for r in rows)
    return abs(gpu_seconds - gpus * report["elapsed_seconds"]) < 3.6 and all(
        r["mean_util_share"] is not None for r in rows
    )


def coverage(report: dict[str, Any]) -> tuple[float | None, ...]:
    return tuple(r["covered_share"] for r in report["gpu_figures"])


@dataclass
class Watched:
    job_id: int
    gpus: int
    end: datetime | None = None
    state: str = ""
    # seconds from Slurm's End to the CLI's answer that first showed it so
    shown_after: float | None = None
    complete_after: float | None = None
    report: dict[str, Any] = field(default_factory=dict)
    # (seconds after End, coverage per GPU) of every answer since it was shown
    history: list[tuple[float, tuple[float | None, ...]]] = field(default_factory=list)

    def settle(self) -> None:
        """complete_after: the first answer whose coverage is the final one (the last answer's)."""
        final = self.history[-1][1]
        self.complete_after = min(after for after, seen in self.history if seen == final)


def sacct_ends(lab: SlurmLab, job_ids: Sequence[int]) -> dict[int, tuple[str, datetime | None]]:
    """(State, End) of each job as sacct has it now; End None while it runs."""
    out = lab.sacct("-X", "-n", "-P", "-j", ",".join(map(str, job_ids)), "-o", "JobIDRaw,State,End")
    ends: dict[int, tuple[str, datetime | None]] = {}
    for line in out.splitlines():
        raw, state, end = line.split("|")
        ended = end not in ("", "Unknown", "None")
        ends[int(raw)] = (
            state.split()[0],
            datetime.fromisoformat(end).replace(tzinfo=UTC) if ended else None,
        )
    return ends


def watch(rig: Rig, jobs: Sequence[Watched], *, poll_seconds: float = 1.0) -> None:
    """Poll the CLI for each ended job every POLL_SECONDS until it is shown, then every
    FOLLOW_SECONDS until FINAL_SECONDS after its End (and at least FOLLOW_SECONDS x 6 after it
    was shown): its last answer is final, and complete_after the first with that coverage."""
    pending = {j.job_id: j for j in jobs}
    deadline = time.monotonic() + HANG_GUARD_SECONDS * max(1, len(jobs) // 8)
    next_poll: dict[int, float] = {}
    while pending:
        assert time.monotonic() < deadline, f"gave up waiting for jobs {sorted(pending)}"
        assert rig.daemon.alive(), f"the daemon exited:\n{rig.daemon.log()}"
        unended = [j for j in pending.values() if j.end is None]
        if unended:
            for job_id, (state, end) in sacct_ends(rig.lab, [j.job_id for j in unended]).items():
                pending[job_id].state, pending[job_id].end = state, end
        for job in sorted(pending.values(), key=lambda j: j.end or datetime.max.replace(tzinfo=UTC)):
            if job.end is None or next_poll.get(job.job_id, 0.0) > time.monotonic():
                continue
            reports = rig.job(job.job_id)
            answered = datetime.now(UTC)
            if not reports:
                continue
            job.report = reports[0]
            after = (answered - job.end).total_seconds()
            if job.shown_after is None and shown(job.report, job.gpus):
                job.shown_after = after
            if job.shown_after is None:
                continue
            job.history.append((after, coverage(job.report)))
            next_poll[job.job_id] = time.monotonic() + FOLLOW_SECONDS
            if after >= max(FINAL_SECONDS, job.shown_after + 6 * FOLLOW_SECONDS):
                job.settle()
                del pending[job.job_id]
        time.sleep(poll_seconds)


def wait_idle(lab: SlurmLab) -> None:
    """Until the lab runs no job (the other tests' jobs hold GPUs the rig's jobs need)."""
    wait_for(lambda: lab.run(["squeue", "-h", "-o", "%i"]).strip() == "", "the lab to be idle", 600)


def host_lab() -> SlurmLab:
    """The 22.05 lab for a run outside pytest (benchmarks/freshness.py): brought up with
    tests/slurm_lab/up.sh unless its cluster is up already (no purge, no scenario)."""
    from tests.integration.lab import (
        LABS,
        LabUnavailable,
        check_prerequisites,
        cluster_is_up,
        run_script,
        script_failure,
    )

    spec = LABS["22.05"]
    check_prerequisites(spec)
    timings: dict[str, float] = {}
    if not cluster_is_up(spec):
        proc = run_script(spec, "up.sh", spec.script("up.sh"), timings=timings)
        if proc.returncode != 0:
            raise LabUnavailable(script_failure(spec, "up.sh", proc))
    now = datetime.now(UTC)
    lab = SlurmLab(
        spec=spec,
        run_dir=spec.run_dir,
        cluster="lab",
        window_start=now,
        window_end=now,
        task_plugin="",
        cgroup=False,
        jobs=(),
        timings=timings,
    )
    lab.slurm_version = lab.run(["sinfo", "-V"]).strip()
    return lab
