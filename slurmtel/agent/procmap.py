"""Map a process on a GPU to its Slurm job: /proc/PID/cgroup first, then SLURM_JOB_ID.

The cgroup path is the authority: slurmstepd puts every task (and, with pam_slurm_adopt,
every adopted ssh session) in the job's cgroup, and a user cannot move a process out of it.
The environment is only a fallback for processes outside a job cgroup (no task/cgroup
plugin); a user could set SLURM_JOB_ID by hand, so it never overrides the cgroup.

Cgroup paths Slurm creates (SchedMD/slurm source):
- cgroup v1: `<prepend>/uid_<uid>/job_<jobid>/step_<stepid>/task_<n>` in every controller
  hierarchy, one line per hierarchy in /proc/PID/cgroup, e.g.
  `4:devices:/slurm/uid_1000/job_123/step_0/task_0`. `<prepend>` is `/slurm`, or
  `/slurm_<nodename>` when slurmd is built with --enable-multiple-slurmd
  (src/common/cgroup.c: `cgroup_prepend = "/slurm"` / `"/slurm_%n"`; plugins
  task/cgroup and cgroup/v1: `"%s/uid_%u"`, `"%s/job_%u"`, `"%s/step_%u"`, `step_batch`,
  `step_extern`).
- cgroup v2: one line `0::<path>` with the job under slurmstepd's scope,
  `/system.slice/slurmstepd.scope/job_<jobid>/step_<stepid>/user/task_<n>`, or
  `/system.slice/<nodename>_slurmstepd.scope/...` with multiple slurmd
  (src/plugins/cgroup/v2/cgroup_v2.c: `"%s/%s/%s.scope"` / `"%s/%s/%s_%s.scope"` with
  SYSTEM_CGSLICE "system.slice" and SYSTEM_CGSCOPE "slurmstepd").

The job id in the path is the raw job id (an array task or a het component has its own), the
same number `SLURM_JOB_ID` holds.
"""

from __future__ import annotations

import re
from pathlib import Path

# the job directory right below a Slurm root: the v1 prepend and uid directory
# (/slurm/uid_1000/job_123, /slurm_gpu01/uid_0/job_5) or the v2 slurmstepd scope, wherever
# systemd placed it (/system.slice/slurmstepd.scope/job_123, .../gpu01_slurmstepd.scope/job_7)
_CGROUP_JOB = re.compile(
    r"(?:/slurm(?:_[^/]+)?/uid_\d+|(?:^|/)(?:[^/]+_)?slurmstepd\.scope)/job_(\d+)(?:/|$)"
)


def job_id_from_cgroup(text: str) -> str | None:
    """The Slurm job id in /proc/PID/cgroup content, or None when the process is in no job."""
    for line in text.splitlines():
        # "hierarchy-ID:controller-list:cgroup-path"; the path may itself contain ':'
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        match = _CGROUP_JOB.search(parts[2].strip())
        if match:
            return match.group(1)
    return None


def job_id_from_environ(raw: bytes) -> str | None:
    """SLURM_JOB_ID from /proc/PID/environ content (NUL-separated NAME=value entries)."""
    for entry in raw.split(b"\0"):
        if entry.startswith(b"SLURM_JOB_ID="):
            value = entry[len(b"SLURM_JOB_ID=") :].decode("ascii", "replace").strip()
            if value.isdigit():
                return value
    return None


def job_id_for_pid(proc_root: Path, pid: int) -> str | None:
    """The Slurm job of process PID under PROC_ROOT (normally /proc), or None.

    A process that has exited or cannot be read maps to None.
    """
    base = proc_root / str(pid)
    try:
        job = job_id_from_cgroup((base / "cgroup").read_text(errors="replace"))
    except OSError:
        job = None
    if job is not None:
        return job
    try:
        return job_id_from_environ((base / "environ").read_bytes())
    except OSError:
        return None


class JobMapper:
    """job_id_for_pid with a cache for the pids currently on a GPU.

    A pid keeps its job for its lifetime; entries for pids that left every GPU are dropped
    each sampling round (`retain`), so a reused pid is looked up again.
    """

    def __init__(self, proc_root: Path) -> None:
        self.proc_root = proc_root
        self._cache: dict[int, str | None] = {}

    def job_id(self, pid: int) -> str | None:
        if pid not in self._cache:
            self._cache[pid] = job_id_for_pid(self.proc_root, pid)
        return self._cache[pid]

    def retain(self, pids: set[int]) -> None:
        for pid in list(self._cache):
            if pid not in pids:
                del self._cache[pid]
