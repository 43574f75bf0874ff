"""Driving the Slurm labs of tests/slurm_lab from Python: their scripts, manifests and clients.

Three labs, one per Slurm release, each with the same cluster (`lab`: gpu01/gpu02 with 4 fake
H100 each, the same accounts and users) and the same job scenario (tests/slurm_lab/scenario.sh):

- 22.05: the host's own Slurm (Debian 12 packages), tests/slurm_lab/{up,down,force-rollup}.sh;
- 24.11 and 26.05: Debian trixie and sid chroots under /srv, each in network, mount and UTS
  namespaces of its own, tests/slurm_lab/newer/ (the chroot is built once and reused).

They never share a port, socket or file, so they come up at the same time (LabRunner). Used by
the `slurm_lab` fixture (conftest.py here) and by the tests that get its SlurmLab.
"""

from __future__ import annotations

import fcntl
import glob
import json
import os
import re
import shutil
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import IO, Any

import pytest

from slurmtel.config import Config, config_from_dict

LAB_SCRIPTS = Path(__file__).resolve().parents[1] / "slurm_lab"
NEWER_SCRIPTS = LAB_SCRIPTS / "newer"
STATE_DIR = Path("/var/tmp/slurmtel-lab")
# Debian's libfaketime (in the multiarch dir); force-rollup.sh explains why sreport runs under it
FAKETIME_GLOB = "/usr/lib/*/faketime/libfaketime.so.1"
SREPORT_FAKETIME = "+61m"
ENV_REQUIRE = "SLURMTEL_REQUIRE_SLURM"
ENV_REUSE = "SLURMTEL_SLURM_LAB_REUSE"
# how many labs come up at once (1: one after the other)
ENV_CONCURRENCY = "SLURMTEL_SLURM_LAB_CONCURRENCY"
# where tests/slurm_lab/newer/lab.sh keeps its chroots (the same variable, the same default)
ENV_CHROOT_DIR = "SLURMTEL_CHROOT_DIR"


class LabUnavailable(Exception):
    """Slurm cannot be brought up here: the tests skip (or fail when Slurm is required)."""


@dataclass(frozen=True)
class LabSpec:
    """One of the labs: the Slurm release it runs and where it lives."""

    version: str
    # the Debian suite of its chroot; None for the host's own Slurm
    suite: str | None

    @property
    def root(self) -> Path:
        """The lab's filesystem root as the host sees it."""
        if self.suite is None:
            return Path("/")
        return Path(os.environ.get(ENV_CHROOT_DIR, "/srv")) / f"slurmtel-{self.suite}"

    @property
    def state_dir(self) -> Path:
        return STATE_DIR / self.version

    @property
    def run_dir(self) -> Path:
        return self.state_dir / "last-run"

    @property
    def log_dir(self) -> Path:
        return self.state_dir / "logs"

    def path(self, inside: str) -> Path:
        """A path inside the lab (/run/slurm/slurmdbd.pid) as the host sees it."""
        return self.root / inside.lstrip("/")

    def command(self, argv: Sequence[str]) -> list[str]:
        """ARGV as run in the lab: on the host as it is, in a chroot lab through inlab.sh."""
        if self.suite is None:
            return list(argv)
        return [str(NEWER_SCRIPTS / "inlab.sh"), self.version, *argv]

    def client(self, name: str) -> str:
        """What slurmtel is configured with to run the Slurm client NAME of this lab:
        the client itself on the host, the one-line wrapper newer/up.sh writes for a chroot lab."""
        if self.suite is None:
            return name
        return str(self.path(f"/run/newslurm/bin/{name}"))

    def script(self, name: str, *args: str) -> list[str]:
        """The lab's own copy of the harness script NAME (up.sh, down.sh, force-rollup.sh)."""
        if self.suite is None:
            return [str(LAB_SCRIPTS / name), *args]
        return [str(NEWER_SCRIPTS / name), self.version, *args]

    def scenario(self, out: Path) -> list[str]:
        if self.suite is None:
            return [str(LAB_SCRIPTS / "scenario.sh"), str(out)]
        return [
            str(NEWER_SCRIPTS / "run-in-lab.sh"),
            self.version,
            str(LAB_SCRIPTS / "scenario.sh"),
            str(out),
        ]


LABS: dict[str, LabSpec] = {
    spec.version: spec
    for spec in (LabSpec("22.05", None), LabSpec("24.11", "trixie"), LabSpec("26.05", "sid"))
}


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
    spec: LabSpec
    run_dir: Path
    cluster: str
    window_start: datetime
    window_end: datetime
    task_plugin: str
    cgroup: bool
    jobs: tuple[ManifestJob, ...]
    # what `sinfo -V` says, e.g. "slurm-wlm 24.11.5"
    slurm_version: str = ""
    reused: bool = False
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def version(self) -> str:
        return self.spec.version

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

    def client_settings(self) -> dict[str, Any]:
        """The config keys that point slurmtel at this lab's Slurm clients."""
        c = self.spec.client
        return {
            "sources": {
                "sacct": {"command": c("sacct")},
                "slurmctld": {"squeue_command": c("squeue"), "scontrol_command": c("scontrol")},
                "dcgm": {"sinfo_command": c("sinfo")},
                "agent": {"sinfo_command": c("sinfo")},
            },
            "access": {"sacctmgr_command": c("sacctmgr")},
        }

    def config(self, settings: Mapping[str, Any] | None = None) -> Config:
        """slurmtel's config for this lab: SETTINGS plus the lab's client commands."""
        return config_from_dict(merge(dict(settings or {}), self.client_settings()))

    def config_toml(self, settings: Mapping[str, Any] | None = None) -> str:
        """The same config as TOML, for a slurmtel run as a separate process."""
        lines: list[str] = []

        def table(name: str, values: Mapping[str, Any]) -> None:
            scalars = {k: v for k, v in values.items() if not isinstance(v, Mapping)}
            if scalars:
                lines.append(f"[{name}]")
                lines.extend(f"{k} = {json.dumps(v)}" for k, v in scalars.items())
            for key, value in values.items():
                if isinstance(value, Mapping):
                    table(f"{name}.{key}", value)

        for section, values in merge(
            {"site": {"timezone": "UTC"}, **(settings or {})}, self.client_settings()
        ).items():
            table(section, values)
        return "\n".join(lines) + "\n"

    def run(self, argv: Sequence[str], *, faketime: bool = False, check: bool = True, tz: str = "UTC") -> str:
        """Run a command in the lab (times in TZ, UTC unless said) and return its stdout; with
        CHECK, fail the test when it fails."""
        env = dict(os.environ, TZ=tz)
        env.pop("SLURM_TIME_FORMAT", None)
        if faketime and self.spec.suite is None:
            libs = sorted(glob.glob(FAKETIME_GLOB))
            assert libs, f"no {FAKETIME_GLOB}: is libfaketime installed?"
            env.update(LD_PRELOAD=libs[0], FAKETIME=SREPORT_FAKETIME)
        elif faketime:
            # inlab.sh preloads the chroot's own libfaketime inside the lab, never on the host
            env["SLURMTEL_LAB_FAKETIME"] = SREPORT_FAKETIME
        command = self.spec.command(argv)
        proc = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
        if check and proc.returncode != 0:
            pytest.fail(
                f"[{self.version}] {' '.join(argv)} failed ({proc.returncode}): {proc.stderr.strip()}",
                pytrace=False,
            )
        return proc.stdout

    def succeeds(self, argv: Sequence[str]) -> bool:
        """Whether ARGV exits 0 in the lab (its output is dropped)."""
        proc = subprocess.run(
            self.spec.command(argv), capture_output=True, env=dict(os.environ, TZ="UTC"), check=False
        )
        return proc.returncode == 0

    def sacct(self, *args: str) -> str:
        return self.run(["sacct", *args])

    def sreport(self, *args: str, tz: str = "UTC") -> str:
        """sreport under libfaketime +61 min: sreport cuts end= back to the start of the client's
        current hour, which would hide the hour force-rollup.sh rolled up. It reads and prints
        times in TZ (the local zone of the process, as on a head node)."""
        return self.run(["sreport", *args], faketime=True, tz=tz)

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

    def release_file(self, name: str) -> tuple[str, Path]:
        """A file a job can wait for: (its path in the lab, the same file seen from the host)."""
        inside = f"/tmp/{name}"
        return inside, self.spec.path(inside)

    def slurmdbd_pid(self) -> int:
        return int(self.spec.path("/run/slurm/slurmdbd.pid").read_text().strip())

    def start_slurmdbd(self) -> None:
        self.run(["/usr/sbin/slurmdbd"])


def merge(base: dict[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    """BASE with EXTRA's keys added, tables merged key by key (BASE wins on a conflict)."""
    out = dict(extra)
    for key, value in base.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merge(dict(value), out[key])
        else:
            out[key] = value
    return out


def utc(iso: str) -> datetime:
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).astimezone(UTC)


def load_manifest(spec: LabSpec, run_dir: Path) -> SlurmLab:
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
        spec=spec,
        run_dir=run_dir,
        cluster=data["cluster"],
        window_start=utc(data["window"]["start"]),
        window_end=utc(data["window"]["end"]),
        task_plugin=data["task_plugin"],
        cgroup=bool(data["cgroup"]),
        jobs=jobs,
    )


def check_prerequisites(spec: LabSpec) -> None:
    if os.geteuid() != 0:
        raise LabUnavailable("the Slurm labs need root (they install packages and start daemons)")
    if not Path("/etc/debian_version").is_file() or shutil.which("apt-get") is None:
        raise LabUnavailable("the Slurm labs need Debian (12) with apt-get")
    if shutil.which("bash") is None:
        raise LabUnavailable("the Slurm lab scripts need bash")
    if spec.suite is not None:
        for tool in ("ip", "nsenter", "unshare"):
            if shutil.which(tool) is None:
                raise LabUnavailable(f"the chroot labs need {tool} (iproute2, util-linux)")
        return
    # the host lab purges the accounting DB and restarts the daemons: never on a real cluster
    # (the chroot labs touch nothing of the host's Slurm)
    conf = Path("/etc/slurm/slurm.conf")
    if conf.exists() and not re.search(
        r"^# slurmtel (integration )?lab", conf.read_text(errors="replace"), re.M
    ):
        raise LabUnavailable(f"{conf} is not a slurmtel lab config: a real Slurm lives here")


def run_script(
    spec: LabSpec, name: str, argv: list[str], *, timings: dict[str, float]
) -> subprocess.CompletedProcess[str]:
    """Run the lab script NAME as ARGV, keep its output in the lab's log dir and its duration
    in TIMINGS."""
    spec.log_dir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    proc = subprocess.run(argv, capture_output=True, text=True, check=False, env=dict(os.environ, TZ="UTC"))
    timings[name] = round(time.monotonic() - started, 1)
    (spec.log_dir / f"{Path(name).stem}.log").write_text(proc.stdout + proc.stderr)
    return proc


def script_failure(spec: LabSpec, name: str, proc: subprocess.CompletedProcess[str]) -> str:
    tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-25:])
    return f"[{spec.version}] {name} exited {proc.returncode} (log: {spec.log_dir / Path(name).stem}.log):\n{tail}"


class ScenarioFailed(Exception):
    """The lab came up but its scenario or rollup did not work: a failure, never a skip."""


def cluster_is_up(spec: LabSpec) -> bool:
    def ok(*argv: str) -> str | None:
        try:
            proc = subprocess.run(spec.command(argv), capture_output=True, text=True, check=False)
        except FileNotFoundError:
            return None
        return proc.stdout if proc.returncode == 0 else None

    if spec.suite is not None and not spec.path("/run/newslurm/holder.pid").exists():
        return False
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


def bring_up_lab(spec: LabSpec, timings: dict[str, float]) -> SlurmLab:
    """Purge and start the lab, run the scenario, roll up its hours: the SlurmLab of that run.
    LabUnavailable when it cannot come up here, ScenarioFailed when it came up and did not work."""
    check_prerequisites(spec)
    if (
        os.environ.get(ENV_REUSE) == "1"
        and (spec.run_dir / "manifest.json").is_file()
        and cluster_is_up(spec)
    ):
        lab = load_manifest(spec, spec.run_dir)
        lab.reused = True
    else:
        # down.sh only ever signals the pids in the lab's own pidfiles
        run_script(spec, "down.sh", spec.script("down.sh", "--purge"), timings=timings)
        proc = run_script(spec, "up.sh", spec.script("up.sh"), timings=timings)
        if proc.returncode != 0:
            raise LabUnavailable(script_failure(spec, "up.sh", proc))
        shutil.rmtree(spec.run_dir, ignore_errors=True)
        proc = run_script(spec, "scenario.sh", spec.scenario(spec.run_dir), timings=timings)
        if proc.returncode != 0:
            raise ScenarioFailed(script_failure(spec, "scenario.sh", proc))
        lab = load_manifest(spec, spec.run_dir)
    # roll up the open hour, and recompute every hour since the scenario started
    proc = run_script(
        spec,
        "force-rollup.sh",
        spec.script("force-rollup.sh", "1", lab.window_start.isoformat()),
        timings=timings,
    )
    if proc.returncode != 0:
        raise ScenarioFailed(script_failure(spec, "force-rollup.sh", proc))
    lab.slurm_version = lab.run(["sinfo", "-V"]).strip()
    lab.timings = timings
    return lab


class LabRunner:
    """Brings the labs up in the background, at most CONCURRENCY at a time, each once per
    pytest session; `get` waits for one. Each lab is locked (flock) from its start to the end
    of the session, so a second session waits for the first instead of purging its lab."""

    def __init__(self, versions: Sequence[str], concurrency: int) -> None:
        self.timings: dict[str, dict[str, float]] = {v: {} for v in versions}
        self.total_seconds: dict[str, float] = {}
        self._locks: list[IO[str]] = []
        self._guard = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=max(1, concurrency), thread_name_prefix="slurm-lab")
        self._started = time.monotonic()
        self._futures: dict[str, Future[SlurmLab]] = {
            v: self._pool.submit(self._bring_up, LABS[v]) for v in versions
        }

    def _bring_up(self, spec: LabSpec) -> SlurmLab:
        spec.state_dir.mkdir(parents=True, exist_ok=True)
        lock = (spec.state_dir / "lock").open("w")
        with self._guard:
            self._locks.append(lock)
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            return bring_up_lab(spec, self.timings[spec.version])
        finally:
            self.total_seconds[spec.version] = round(time.monotonic() - self._started, 1)

    def get(self, version: str) -> SlurmLab:
        return self._futures[version].result()

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
        for lock in self._locks:
            lock.close()


def concurrency_from_env() -> int:
    return int(os.environ.get(ENV_CONCURRENCY, str(len(LABS))))


# sources.sacct.format values: the tests that check what slurmtel makes of sacct read both
SACCT_FORMATS = ("json", "parsable")
