"""Driving the Slurm lab in tests/slurm_lab from Python: its scripts, manifest and clients.

Used by the `slurm_lab` fixture (conftest.py here) and by the tests that get its SlurmLab.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

LAB_SCRIPTS = Path(__file__).resolve().parents[1] / "slurm_lab"
STATE_DIR = Path("/var/tmp/slurmtel-lab")
RUN_DIR = STATE_DIR / "last-run"
LOG_DIR = STATE_DIR / "logs"
# Debian's libfaketime (in the multiarch dir); force-rollup.sh explains why sreport runs under it
FAKETIME_GLOB = "/usr/lib/*/faketime/libfaketime.so.1"
SREPORT_FAKETIME = "+61m"
ENV_REQUIRE = "SLURMTEL_REQUIRE_SLURM"
ENV_REUSE = "SLURMTEL_SLURM_LAB_REUSE"


class LabUnavailable(Exception):
    """Slurm cannot be brought up here: the tests skip (or fail when Slurm is required)."""


@dataclass(frozen=True)
class ManifestJob:
    label: str
    job_id: int
    user: str
    account: str
    # the final state of each attempt, in order (a requeued job has two)
    expected: tuple[str, ...]
    # allocated GPUs and nodes per attempt (0 GPUs and 0 nodes for a job that never started)
    gpus: int
    nodes: int
    # number of array tasks, None when the job is not an array
    array_tasks: int | None
    # the scenario makes this job wait for GPUs
    queue_wait: bool


@dataclass
class SlurmLab:
    run_dir: Path
    cluster: str
    window_start: datetime
    window_end: datetime
    task_plugin: str
    cgroup: bool
    jobs: tuple[ManifestJob, ...]
    reused: bool = False
    timings: dict[str, float] = field(default_factory=dict)

    def job(self, label: str) -> ManifestJob:
        for job in self.jobs:
            if job.label == label:
                return job
        raise KeyError(f"no job labelled {label} in {self.run_dir / 'manifest.json'}")

    def hour_window(self) -> tuple[datetime, datetime]:
        """The whole hours that contain the scenario: [floor(start), ceil(end))."""
        start = self.window_start.replace(minute=0, second=0, microsecond=0)
        end = self.window_end.replace(minute=0, second=0, microsecond=0)
        if end < self.window_end:
            end += timedelta(hours=1)
        return start, end

    def run(self, argv: Sequence[str], *, faketime: bool = False) -> str:
        """Run a Slurm client (times in UTC) and return its stdout; fail the test on an error."""
        env = dict(os.environ, TZ="UTC")
        env.pop("SLURM_TIME_FORMAT", None)
        if faketime:
            libs = sorted(glob.glob(FAKETIME_GLOB))
            assert libs, f"no {FAKETIME_GLOB}: is libfaketime installed?"
            env.update(LD_PRELOAD=libs[0], FAKETIME=SREPORT_FAKETIME)
        proc = subprocess.run(list(argv), capture_output=True, text=True, env=env, check=False)
        if proc.returncode != 0:
            pytest.fail(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr.strip()}", pytrace=False)
        return proc.stdout

    def sacct(self, *args: str) -> str:
        return self.run(["sacct", *args])

    def sreport(self, *args: str) -> str:
        """sreport under libfaketime +61 min: sreport cuts end= back to the start of the client's
        current hour, which would hide the hour force-rollup.sh rolled up."""
        return self.run(["sreport", *args], faketime=True)

    def sbatch(self, user: str, *args: str, wrap: str) -> int:
        """Submit WRAP as USER from their home directory; returns the job id."""
        out = self.run(
            [
                "runuser",
                "-u",
                user,
                "--",
                "sbatch",
                "--parsable",
                "-D",
                f"/home/{user}",
                "-o",
                "/dev/null",
                *args,
                "--wrap",
                wrap,
            ]
        )
        return int(out.strip().split(";")[0])


def utc(iso: str) -> datetime:
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).astimezone(UTC)


def load_manifest(run_dir: Path) -> SlurmLab:
    data = json.loads((run_dir / "manifest.json").read_text())
    jobs = tuple(
        ManifestJob(
            label=j["label"],
            job_id=int(j["job_id"]),
            user=j["user"],
            account=j["account"],
            expected=tuple(j["expected"]),
            gpus=int(j["gpus"]),
            nodes=int(j["nodes"]),
            array_tasks=j["array_tasks"],
            queue_wait=bool(j["queue_wait"]),
        )
        for j in data["jobs"]
    )
    return SlurmLab(
        run_dir=run_dir,
        cluster=data["cluster"],
        window_start=utc(data["window"]["start"]),
        window_end=utc(data["window"]["end"]),
        task_plugin=data["task_plugin"],
        cgroup=bool(data["cgroup"]),
        jobs=jobs,
    )


def check_prerequisites() -> None:
    if os.geteuid() != 0:
        raise LabUnavailable("the Slurm lab needs root (it installs packages and starts daemons)")
    if not Path("/etc/debian_version").is_file() or shutil.which("apt-get") is None:
        raise LabUnavailable("the Slurm lab needs Debian (12) with apt-get")
    if shutil.which("bash") is None:
        raise LabUnavailable("the Slurm lab scripts need bash")
    # the fixture purges the accounting DB and restarts the daemons: never on a real cluster
    conf = Path("/etc/slurm/slurm.conf")
    if conf.exists() and not re.search(
        r"^# slurmtel (integration )?lab", conf.read_text(errors="replace"), re.M
    ):
        raise LabUnavailable(f"{conf} is not a slurmtel lab config: a real Slurm lives here")


def run_script(name: str, *args: str, timings: dict[str, float]) -> subprocess.CompletedProcess[str]:
    """Run a lab script, keep its output in LOG_DIR/NAME.log and its duration in TIMINGS."""
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    proc = subprocess.run(
        [str(LAB_SCRIPTS / name), *args],
        capture_output=True,
        text=True,
        check=False,
        env=dict(os.environ, TZ="UTC"),
    )
    timings[name] = round(time.monotonic() - started, 1)
    (LOG_DIR / f"{Path(name).stem}.log").write_text(proc.stdout + proc.stderr)
    return proc


def script_failure(name: str, proc: subprocess.CompletedProcess[str]) -> str:
    tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-25:])
    return f"{name} exited {proc.returncode} (log: {LOG_DIR / Path(name).stem}.log):\n{tail}"


def cluster_is_up() -> bool:
    def ok(*argv: str) -> str | None:
        try:
            proc = subprocess.run(list(argv), capture_output=True, text=True, check=False)
        except FileNotFoundError:
            return None
        return proc.stdout if proc.returncode == 0 else None

    ping = ok("scontrol", "ping")
    nodes = ok("sinfo", "-h", "-N", "-o", "%N %T")
    return (
        ping is not None
        and "is UP" in ping
        and ok("sacctmgr", "-n", "show", "cluster") is not None
        and nodes is not None
        and len(
            {
                line.split()[0]
                for line in nodes.splitlines()
                if line.split()[-1] in ("idle", "mixed", "allocated")
            }
        )
        == 2
    )


def bring_up_lab(timings: dict[str, float]) -> SlurmLab:
    if os.environ.get(ENV_REUSE) == "1" and (RUN_DIR / "manifest.json").is_file() and cluster_is_up():
        lab = load_manifest(RUN_DIR)
        lab.reused = True
    else:
        # down.sh only ever signals the pids in the lab's own pidfiles
        run_script("down.sh", "--purge", timings=timings)
        proc = run_script("up.sh", timings=timings)
        if proc.returncode != 0:
            raise LabUnavailable(script_failure("up.sh", proc))
        shutil.rmtree(RUN_DIR, ignore_errors=True)
        proc = run_script("scenario.sh", str(RUN_DIR), timings=timings)
        if proc.returncode != 0:
            pytest.fail(script_failure("scenario.sh", proc), pytrace=False)
        lab = load_manifest(RUN_DIR)
    # roll up the open hour, and recompute every hour since the scenario started
    proc = run_script("force-rollup.sh", "1", lab.window_start.isoformat(), timings=timings)
    if proc.returncode != 0:
        pytest.fail(script_failure("force-rollup.sh", proc), pytrace=False)
    lab.timings = timings
    return lab
