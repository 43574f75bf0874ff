"""The agent's extra CPU for the host signals of issue 26, as a ratio, on an 8-GPU node at 1 s.

    .venv/bin/python benchmarks/agent_host_cpu.py [--gpus 8] [--seconds 600]

One run, two agents on the same synthetic node (benchmarks/agent_cpu.py's: the real H100
`nvidia-smi -q` capture repeated GPUS times into the fake NVML, two processes of its own job
per GPU behind a fake /proc), each driven through the same simulated seconds:

  before: agent.host_signals = false (the sampling round as before issue 26);
  after:  host signals on: NVML throttle reasons every round and PCIe throughput every
          agent.pcie_sample_every rounds, and each job's cgroup files (a tree built from the
          real Slurm cgroup v2 capture, tests/fixtures/cgroup, one job per GPU, with io.stat
          and the three PSI files) read and parsed every agent.cgroup_read_seconds (5 s) and
          at each window's first round, closed into job windows.

Printed: CPU microseconds per GPU-second sampled, before and after, their ratio, and a core's
share for the node. Target: the host signals add at most 0.1 % of one core to an 8-GPU node
at 1 s. The fake NVML is Python and cheap: its calls stand in for the real library's ioctls,
so the ratio against a real agent is lower than printed here; the cgroup reads and parsing
are what the agent really adds.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agent_cpu import T0, Clock, node_query, processes_of, sawtooth  # noqa: E402

from slurmtel.agent.fake_nvml import FakeNvml  # noqa: E402
from slurmtel.agent.host import HostWindows, read_jobs  # noqa: E402
from slurmtel.agent.sampler import Sampler  # noqa: E402
from slurmtel.agent.summarize import WindowSummarizer  # noqa: E402
from slurmtel.records import JobCgroupReading  # noqa: E402
from tests.sysfs_trees import slurm_v2_cgroup, v2_job  # noqa: E402

TARGET_EXTRA_CORE_PERCENT = 0.1
# agent.cgroup_read_seconds' default
READ_SECONDS = 5
IO = "259:0 rbytes={n} wbytes={n} rios={n} wios={n} dbytes=0 dios=0\n"
PSI = "some avg10=0.00 avg60=0.00 avg300=0.00 total={n}\nfull avg10=0.00 avg60=0.00 avg300=0.00 total={n}\n"


def build(tmp: Path, gpus: int) -> tuple[FakeNvml, Path, Path, Clock]:
    clock = Clock()
    fake = FakeNvml.from_text(node_query(gpus), clock=clock)
    fake.init()
    proc = tmp / "proc"
    cgroup = slurm_v2_cgroup(tmp / "cgroup")
    template = v2_job(cgroup, "4")
    for i, gpu in enumerate(fake.devices):
        pids = [20000 + 10 * i, 20001 + 10 * i]
        for pid in pids:
            (proc / str(pid)).mkdir(parents=True)
            (proc / str(pid) / "cgroup").write_text(
                f"0::/system.slice/slurmstepd.scope/job_{5000 + i}/step_0/user/task_0\n"
            )
        fake.set_processes(gpu.uuid, processes_of(pids))
        fake.set_utilization(gpu.uuid, sawtooth(i + 3))
        job = v2_job(cgroup, str(5000 + i))
        shutil.copytree(template, job)
        (job / "io.stat").write_text(IO.format(n=1000 * i))
        for name in ("io", "cpu", "memory"):
            (job / f"{name}.pressure").write_text(PSI.format(n=10 * i))
    shutil.rmtree(template)
    return fake, proc, cgroup, clock


def run(
    fake: FakeNvml, proc: Path, cgroup: Path, clock: Clock, seconds: int, host: bool
) -> tuple[float, float, int]:
    """CPU seconds of the agent's rounds, their wall seconds and the job windows made."""
    sampler = Sampler(fake, "bench01", proc, clock=clock, host_signals=host)
    sampler.discover()
    summarizer = WindowSummarizer("bench01", 30, 1, 5)
    windows = HostWindows("bench01", 30)
    jobs = 0
    cpu = 0.0
    wall = time.perf_counter()
    for second in range(seconds):
        clock.t = T0 + second
        a = time.process_time()
        for sample in sampler.sample():
            summarizer.add(clock.t, sample)
        summarizer.flush(clock.t)
        if host:
            # as Agent.read_host: every cgroup_read_seconds and at a window's first round
            if second % READ_SECONDS == 0 or windows.window_start != windows.window_start_of(clock.t):
                readings = [r for r in read_jobs(cgroup) if isinstance(r, JobCgroupReading)]
                jobs += len(windows.add(clock.t, readings))
            summarizer.take_host_windows()
        cpu += time.process_time() - a
    return cpu, time.perf_counter() - wall, jobs


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--seconds", type=int, default=600)
    parser.add_argument("--dsn", default=None, help="not used (no database): accepted like every benchmark's")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="slurmtel-host-bench-") as tmp:
        fake, proc, cgroup, clock = build(Path(tmp), args.gpus)
        before, before_wall, _ = run(fake, proc, cgroup, clock, args.seconds, host=False)
        after, after_wall, job_windows = run(fake, proc, cgroup, clock, args.seconds, host=True)
    gpu_seconds = args.gpus * args.seconds
    print(f"node: {args.gpus} GPUs, {args.gpus} jobs' cgroups, {args.seconds} simulated seconds at 1 Hz")
    print(f"before (host_signals off): {before / gpu_seconds * 1e6:.1f} us CPU per GPU-second")
    print(
        f"after  (host_signals on):  {after / gpu_seconds * 1e6:.1f} us CPU per GPU-second ({job_windows} job windows)"
    )
    # the agent has no database: its CPU is this process's (process_time), no backend
    print(
        f"rounds: before {before_wall:.2f} s wall, {before:.2f} CPU s; after {after_wall:.2f} s wall, {after:.2f} CPU s"
    )
    print(f"ratio after/before: {after / before:.2f}")
    print(
        f"one core's share for the node: before {before / args.seconds * 100:.3f} %, "
        f"after {after / args.seconds * 100:.3f} %"
    )
    extra = (after - before) / args.seconds * 100
    met = "met" if extra <= TARGET_EXTRA_CORE_PERCENT else "NOT met"
    print(f"=> host signals add {extra:.3f} % of one core (target <= {TARGET_EXTRA_CORE_PERCENT:g} %: {met})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
