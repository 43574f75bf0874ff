"""Agent CPU cost: process CPU time per GPU-second sampled, with the fake NVML.

    .venv/bin/python benchmarks/agent_cpu.py [--gpus 8] [--seconds 3600]

The node is synthetic for scale: the real H100 `nvidia-smi -q` capture's GPU section repeated
GPUS times with distinct UUIDs, bus ids and minor numbers, fed through the real parser into
the fake NVML. Each GPU runs two processes of its own job (a fake /proc with cgroup v2
lines). The clock is driven, not slept: each simulated second is one sampling round
(Sampler.sample, every sample into WindowSummarizer.add, closed windows into the spool).

Printed: CPU seconds per GPU-second for the whole round and for its parts. The fake NVML is
Python, so the NVML share here stands in for the real library's C calls (which cost ioctls
instead); the summariser and /proc parts are what the agent itself adds.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from slurmtel.agent.fake_nvml import FakeNvml  # noqa: E402
from slurmtel.agent.nvml import GpuProcess  # noqa: E402
from slurmtel.agent.sampler import Sampler  # noqa: E402
from slurmtel.agent.spool import Spool  # noqa: E402
from slurmtel.agent.summarize import GpuSample, WindowSummarizer  # noqa: E402

CAPTURE = ROOT / "tests/fixtures/nvidia_smi/linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01__load__q.txt"
ZERO_UUID = "GPU-00000000-0000-0000-0000-000000000000"
T0 = 1_800_000_000.0


def node_query(gpus: int) -> str:
    """An nvidia-smi -q of GPUS H100s, from the single-GPU capture."""
    raw = CAPTURE.read_text()
    head, body = raw.split("GPU 00000000:00:09.0\n", 1)
    sections = []
    for i in range(gpus):
        bus = f"00000000:{0x10 + i:02X}:00.0"
        section = (
            body.replace(ZERO_UUID, f"GPU-00000000-0000-0000-0000-{i:012d}")
            .replace("00000000:00:09.0", bus)
            .replace("Minor Number                                       : 0", f"Minor Number{' ' * 39}: {i}")
        )
        sections.append(f"GPU {bus}\n{section}")
    return head.replace(
        "Attached GPUs                                          : 1", f"Attached GPUs{' ' * 42}: {gpus}"
    ) + "".join(sections)


def processes_of(pids: list[int]) -> Callable[[float], list[GpuProcess]]:
    return lambda t: [GpuProcess(p, 1 << 30) for p in pids]


def sawtooth(step: int) -> Callable[[float], float | None]:
    """Utilisation that moves every second, idle now and then."""
    return lambda t: float((int(t) * step) % 100)


class Clock:
    t = T0 - 1

    def __call__(self) -> float:
        return self.t


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--seconds", type=int, default=3600)
    args = parser.parse_args()

    clock = Clock()
    fake = FakeNvml.from_text(node_query(args.gpus), clock=clock)
    fake.init()
    with tempfile.TemporaryDirectory(prefix="slurmtel-agent-bench-") as tmp:
        proc = Path(tmp) / "proc"
        for i, gpu in enumerate(fake.devices):
            pids = [20000 + 10 * i, 20001 + 10 * i]
            for pid in pids:
                (proc / str(pid)).mkdir(parents=True)
                (proc / str(pid) / "cgroup").write_text(
                    f"0::/system.slice/slurmstepd.scope/job_{5000 + i}/step_0/user/task_0\n"
                )
            fake.set_processes(gpu.uuid, processes_of(pids))
            fake.set_utilization(gpu.uuid, sawtooth(i + 3))
        sampler = Sampler(fake, "bench01", proc, clock=clock)
        sampler.discover()
        summarizer = WindowSummarizer("bench01", 30, 1, 5)
        spool = Spool(Path(tmp) / "spool.sqlite")

        recorded: list[tuple[float, GpuSample]] = []
        sample_cpu = summarize_cpu = spool_cpu = 0.0
        summaries = 0
        wall = time.perf_counter()
        for second in range(args.seconds):
            clock.t = T0 + second
            a = time.process_time()
            samples = sampler.sample()
            b = time.process_time()
            closed = []
            for sample in samples:
                closed += summarizer.add(clock.t, sample)
            closed += summarizer.flush(clock.t)
            c = time.process_time()
            if closed:
                spool.append_records(closed)
                summaries += len(closed)
            d = time.process_time()
            sample_cpu += b - a
            summarize_cpu += c - b
            spool_cpu += d - c
            if second < 600:
                recorded.extend((clock.t, s) for s in samples)
        wall = time.perf_counter() - wall
        spool.close()

    # the summariser alone, on the recorded samples (no NVML, no /proc)
    alone = WindowSummarizer("bench01", 30, 1, 5)
    a = time.process_time()
    for t, sample in recorded:
        alone.add(t, sample)
    summarizer_alone = (time.process_time() - a) / len(recorded)

    gpu_seconds = args.gpus * args.seconds
    total = sample_cpu + summarize_cpu + spool_cpu
    print(
        f"node: {args.gpus} GPUs (H100 capture), {args.seconds} simulated seconds = {gpu_seconds} GPU-seconds"
    )
    print(f"summaries spooled: {summaries}; wall {wall:.2f} s")
    print(f"agent CPU per GPU-second sampled: {total / gpu_seconds * 1e6:.1f} us")
    print(f"  sampling (fake NVML + /proc job mapping): {sample_cpu / gpu_seconds * 1e6:.1f} us")
    print(f"  summariser:                               {summarize_cpu / gpu_seconds * 1e6:.1f} us")
    print(f"  spool (one fsync'd commit per window):    {spool_cpu / gpu_seconds * 1e6:.1f} us")
    print(f"  summariser alone on recorded samples:     {summarizer_alone * 1e6:.1f} us per sample")
    print(f"=> one core's share for a {args.gpus}-GPU node at 1 Hz: {total / args.seconds * 100:.3f} %")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
