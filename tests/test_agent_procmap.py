"""GPU process -> Slurm job through /proc/PID/cgroup and /proc/PID/environ.

The cgroup lines are in the formats Slurm creates (SchedMD/slurm source):
- cgroup v1, src/common/cgroup.c: `cgroup_prepend = "/slurm"`, or `"/slurm_%n"` when built
  with MULTIPLE_SLURMD; plugins task/cgroup and cgroup/v1 build `"%s/uid_%u"`, `"%s/job_%u"`,
  `"%s/step_%u"` (and `step_batch`, `step_extern`) below it, one line per controller hierarchy;
- cgroup v2, src/plugins/cgroup/v2/cgroup_v2.c: the stepd scope `"%s/%s/%s.scope"` with
  SYSTEM_CGSLICE "system.slice" and SYSTEM_CGSCOPE "slurmstepd", `"%s/%s/%s_%s.scope"`
  (`<nodename>_slurmstepd.scope`) with MULTIPLE_SLURMD, then `job_<id>/step_<id>/user/task_<n>`
  (the cgroup v2 README: "Adding a pid to a step adds it to a special task directory,
  task_special"). /proc/PID/cgroup on v2 is one line, "0::$PATH".
"""

from __future__ import annotations

from pathlib import Path

import pytest

from slurmtel.agent.procmap import JobMapper, job_id_for_pid, job_id_from_cgroup, job_id_from_environ

CGROUP_V1 = """\
12:pids:/slurm/uid_1000/job_123/step_0/task_0
11:hugetlb:/
10:memory:/slurm/uid_1000/job_123/step_0/task_0
9:devices:/slurm/uid_1000/job_123/step_0
8:freezer:/slurm/uid_1000/job_123/step_0
7:cpu,cpuacct:/slurm/uid_1000/job_123/step_0/task_0
6:cpuset:/slurm/uid_1000/job_123/step_0
1:name=systemd:/system.slice/slurmd.service
"""

CGROUP_V1_BATCH = """\
10:memory:/slurm/uid_1000/job_124/step_batch/task_0
9:devices:/slurm/uid_1000/job_124/step_batch
1:name=systemd:/system.slice/slurmd.service
"""

CGROUP_V1_MULTIPLE_SLURMD = """\
9:devices:/slurm_gpu01/uid_0/job_5/step_0
8:freezer:/slurm_gpu01/uid_0/job_5/step_0
1:name=systemd:/system.slice/slurmd-gpu01.service
"""

CGROUP_V2 = "0::/system.slice/slurmstepd.scope/job_123/step_0/user/task_0\n"
CGROUP_V2_MULTIPLE_SLURMD = "0::/system.slice/gpu01_slurmstepd.scope/job_77/step_extern/user/task_special\n"
CGROUP_V2_NOT_A_JOB = "0::/user.slice/user-1000.slice/session-3.scope\n"
CGROUP_V1_NOT_A_JOB = "10:memory:/user.slice\n1:name=systemd:/user.slice/user-1000.slice/session-3.scope\n"


def write_proc(
    root: Path, pid: int, cgroup: str | None = None, environ: dict[str, str] | None = None
) -> None:
    """A /proc/PID directory as the agent reads it: cgroup text, NUL-separated environ."""
    directory = root / str(pid)
    directory.mkdir(parents=True, exist_ok=True)
    if cgroup is not None:
        (directory / "cgroup").write_text(cgroup)
    if environ is not None:
        (directory / "environ").write_bytes(b"".join(f"{k}={v}".encode() + b"\0" for k, v in environ.items()))


@pytest.mark.parametrize(
    ("cgroup", "job"),
    [
        (CGROUP_V1, "123"),
        (CGROUP_V1_BATCH, "124"),
        (CGROUP_V1_MULTIPLE_SLURMD, "5"),
        (CGROUP_V2, "123"),
        (CGROUP_V2_MULTIPLE_SLURMD, "77"),
        (CGROUP_V2_NOT_A_JOB, None),
        (CGROUP_V1_NOT_A_JOB, None),
        # a unit or directory that merely contains "job_" is not a Slurm job
        ("0::/system.slice/backup-job_9.service\n", None),
        ("0::/system.slice/slurmstepd.scope/system\n", None),
        ("", None),
    ],
)
def test_job_from_cgroup(cgroup: str, job: str | None) -> None:
    assert job_id_from_cgroup(cgroup) == job


def test_job_from_environ() -> None:
    raw = b"PATH=/usr/bin\0OLD_SLURM_JOB_ID=7\0SLURM_JOB_ID=4242\0SLURM_JOBID=4242\0"
    assert job_id_from_environ(raw) == "4242"
    assert job_id_from_environ(b"PATH=/usr/bin\0HOME=/root\0") is None
    assert job_id_from_environ(b"SLURM_JOB_ID=\0") is None


def test_pid_lookup_prefers_cgroup_then_environ(tmp_path: Path) -> None:
    write_proc(tmp_path, 100, CGROUP_V2, {"SLURM_JOB_ID": "999"})  # a user can fake the environment
    write_proc(tmp_path, 101, CGROUP_V2_NOT_A_JOB, {"SLURM_JOB_ID": "555", "HOME": "/home/a"})
    write_proc(tmp_path, 102, CGROUP_V1_NOT_A_JOB, {"HOME": "/home/a"})
    write_proc(tmp_path, 103, None, {"SLURM_JOB_ID": "556"})
    assert job_id_for_pid(tmp_path, 100) == "123"
    assert job_id_for_pid(tmp_path, 101) == "555"
    assert job_id_for_pid(tmp_path, 102) is None
    assert job_id_for_pid(tmp_path, 103) == "556"
    # exited process
    assert job_id_for_pid(tmp_path, 104) is None


def test_mapper_forgets_pids_that_left_the_gpus(tmp_path: Path) -> None:
    write_proc(tmp_path, 200, CGROUP_V1)
    mapper = JobMapper(tmp_path)
    assert mapper.job_id(200) == "123"
    # the pid is reused by another job while it is off the GPUs
    mapper.retain(set())
    write_proc(tmp_path, 200, CGROUP_V1_MULTIPLE_SLURMD)
    assert mapper.job_id(200) == "5"
    # while it stays on a GPU the cached answer is used (no re-read)
    mapper.retain({200})
    write_proc(tmp_path, 200, CGROUP_V2)
    assert mapper.job_id(200) == "5"
