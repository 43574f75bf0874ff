"""The host side of each Slurm job on the node: its cgroup's counters, per summary window.

Finding the jobs (`agent.cgroup_root`, default /sys/fs/cgroup; tests point it at trees built
from real captures, tests/sysfs_trees.py):

- cgroup v2 (the root has `cgroup.controllers`): `system.slice/slurmstepd.scope/job_<id>/`,
  or `system.slice/<node>_slurmstepd.scope/job_<id>/` where several slurmd share a host;
- cgroup v1: `<controller>/slurm/uid_<uid>/job_<id>/` for cpuacct (or cpu,cpuacct), memory,
  blkio and cpuset.

The agent needs no new privilege: these files are world-readable (Slurm creates the
directories 0755, the kernel the files 0444/0644).

Every `agent.cgroup_read_seconds` (5 s by default: the counters are cumulative, so reading
them more often changes no window; only a job that ends loses at most that much of its last
window) the agent reads each job's files (slurmtel.parsers.cgroup) and keeps the newest
reading; when a summary window ends, the increase of each cumulative counter between the last
reading of the previous window and the newest one becomes a JobHostWindow. A job whose cgroup
vanished (it ended) gets its last window from its last reading. A counter that went
backwards (the cgroup was recreated: a requeue onto the same node) counts from zero.
`memory_peak_bytes` and `cpus` are levels, not increases: the newest reading's.

A job first seen in the agent's first round has no baseline (its counters since it started
would land in one window): that round only sets the baseline. A job that appears later started
meanwhile: its baseline is zero, so its start-up reads count in its first window.
"""

from __future__ import annotations

import logging
import math
import os
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from slurmtel.parsers.cgroup import V1_FILES, V2_FILES, parse_job_cgroup
from slurmtel.records import GpuHostWindow, JobCgroupReading, JobHostWindow, Rejected

log = logging.getLogger(__name__)

_V1_CONTROLLERS = {
    "blkio": ("blkio",),
    "cpuacct": ("cpuacct", "cpu,cpuacct", "cpuacct,cpu"),
    "memory": ("memory",),
    "cpuset": ("cpuset",),
}
# the cumulative counters of a reading (the others are levels)
COUNTERS = (
    "read_bytes",
    "write_bytes",
    "read_ops",
    "write_ops",
    "cpu_usage_seconds",
    "io_some_stall_seconds",
    "io_full_stall_seconds",
    "cpu_some_stall_seconds",
    "memory_some_stall_seconds",
    "memory_full_stall_seconds",
)
# a job's file larger than this is not a cgroup file (a hostile tree): not read
MAX_FILE_BYTES = 65536


def _read(path: Path) -> str | None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        data = os.read(fd, MAX_FILE_BYTES)
    except OSError:
        return None
    finally:
        os.close(fd)
    return data.decode("utf-8", "replace")


def job_directories(cgroup_root: str | Path) -> tuple[int, dict[str, dict[str, Path]]]:
    """(cgroup version, job id -> {file name in V2_FILES / V1_FILES -> path})."""
    root = Path(cgroup_root)
    jobs: dict[str, dict[str, Path]] = {}
    if (root / "cgroup.controllers").exists() or (root / "system.slice").is_dir():
        for scope in sorted(root.glob("system.slice/*slurmstepd.scope")):
            for job in sorted(scope.glob("job_*")):
                job_id = job.name.removeprefix("job_")
                if job_id.isdigit() and job.is_dir():
                    jobs[job_id] = {name: job / name for name in V2_FILES}
        return 2, jobs
    for controller, names in _V1_CONTROLLERS.items():
        for name in names:
            for job in sorted(root.glob(f"{name}/slurm/uid_*/job_*")):
                job_id = job.name.removeprefix("job_")
                if not job_id.isdigit():
                    continue
                files = jobs.setdefault(job_id, {})
                for file in V1_FILES:
                    if file.startswith(controller + "/"):
                        files[file] = job / file.split("/", 1)[1]
    return 1, jobs


def read_jobs(cgroup_root: str | Path, origin: str = "") -> list[JobCgroupReading | Rejected]:
    """One reading of every Slurm job's cgroup on the node (Rejected for bad files)."""
    version, jobs = job_directories(cgroup_root)
    out: list[JobCgroupReading | Rejected] = []
    for job_id, files in jobs.items():
        texts = {name: _read(path) for name, path in files.items()}
        out.extend(parse_job_cgroup(texts, job_id=job_id, version=version, origin=origin or str(cgroup_root)))
    return out


@dataclass
class _Job:
    base: JobCgroupReading
    last: JobCgroupReading


def _zero(reading: JobCgroupReading) -> JobCgroupReading:
    """A baseline of zeros where READING has a figure (a job that started after the agent)."""
    zeros: dict[str, Any] = {name: 0 for name in COUNTERS if getattr(reading, name) is not None}
    return replace(reading, **zeros)


def _increase(before: float | None, after: float | None) -> float | None:
    if after is None:
        return None
    if before is None or after < before:
        return after
    return after - before


class HostWindows:
    """Per-job baselines and newest readings; closes JobHostWindow records at window ends."""

    def __init__(self, node: str, window_seconds: float) -> None:
        self.node = node
        self.window_seconds = float(window_seconds)
        self.jobs: dict[str, _Job] = {}
        self.window_start: float | None = None
        self._first_round = True
        # the jobs the last round read (a job missing from it has ended)
        self._seen: set[str] = set()

    def window_start_of(self, t: float) -> float:
        return math.floor(t / self.window_seconds) * self.window_seconds

    def add(self, now: float, readings: list[JobCgroupReading]) -> list[JobHostWindow]:
        """Account one round of readings taken at NOW; returns the windows this round closed."""
        closed: list[JobHostWindow] = []
        start = self.window_start_of(now)
        if self.window_start is not None and start != self.window_start:
            closed = self.close(self.window_start)
        self.window_start = start
        for reading in readings:
            job = self.jobs.get(reading.job_id)
            if job is None:
                base = reading if self._first_round else _zero(reading)
                self.jobs[reading.job_id] = _Job(base, reading)
            else:
                if reading.cgroup_version != job.last.cgroup_version:
                    job.base = _zero(reading)
                job.last = reading
        self._first_round = False
        self._seen = {r.job_id for r in readings}
        # a job gone whose last window was sent already: done
        for job_id in [j for j, job in self.jobs.items() if j not in self._seen and job.base is job.last]:
            del self.jobs[job_id]
        return closed

    def close(self, window_start: float) -> list[JobHostWindow]:
        closed = []
        for job_id in list(self.jobs):
            job = self.jobs[job_id]
            closed.append(self._window(job, window_start))
            if job_id in self._seen:
                job.base = job.last
            else:
                del self.jobs[job_id]
        return closed

    def _window(self, job: _Job, window_start: float) -> JobHostWindow:
        last, base = job.last, job.base
        values: dict[str, Any] = {
            name: _increase(getattr(base, name), getattr(last, name)) for name in COUNTERS
        }
        for name in ("read_bytes", "write_bytes", "read_ops", "write_ops"):
            if values[name] is not None:
                values[name] = int(values[name])
        for name in COUNTERS:
            if isinstance(values[name], float):
                values[name] = round(values[name], 6)
        return JobHostWindow(
            node=self.node,
            job_id=last.job_id,
            window_start_at=datetime.fromtimestamp(window_start, UTC),
            window_seconds=self.window_seconds,
            cgroup_version=last.cgroup_version,
            cpus=last.cpus,
            memory_peak_bytes=last.memory_peak_bytes,
            **values,
        )

    # restart --------------------------------------------------------------------------------

    def export_state(self) -> dict[str, Any]:
        return {
            "window_start": self.window_start,
            "jobs": {
                job_id: {"base": asdict(j.base), "last": asdict(j.last)} for job_id, j in self.jobs.items()
            },
        }

    def restore_state(self, state: Any) -> None:
        try:
            self.window_start = state.get("window_start")
            self.jobs = {
                job_id: _Job(JobCgroupReading(**saved["base"]), JobCgroupReading(**saved["last"]))
                for job_id, saved in state.get("jobs", {}).items()
            }
            self._first_round = False
        except (AttributeError, TypeError, KeyError) as exc:
            log.warning("saved job cgroup state unreadable, starting afresh: %s", exc)
            self.jobs = {}
            self.window_start = None


def with_pcie(windows: list[JobHostWindow], gpus: list[GpuHostWindow]) -> list[JobHostWindow]:
    """WINDOWS with the PCIe bytes of the GPUs the job held in the same window (a GPU shared by
    several jobs counts for each): None where no GPU of the job had PCIe readings."""
    sums: dict[tuple[str, datetime], tuple[int, int]] = {}
    for g in gpus:
        if g.pcie_tx_bytes is None or g.pcie_rx_bytes is None:
            continue
        for job in g.job_ids:
            tx, rx = sums.get((job, g.window_start_at), (0, 0))
            sums[(job, g.window_start_at)] = (tx + g.pcie_tx_bytes, rx + g.pcie_rx_bytes)
    out = []
    for w in windows:
        pcie = sums.get((w.job_id, w.window_start_at))
        out.append(replace(w, pcie_tx_bytes=pcie[0], pcie_rx_bytes=pcie[1]) if pcie else w)
    return out
