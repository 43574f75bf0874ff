"""Advice for a researcher about one job attempt, from its per-GPU figures (pure).

Like Princeton's jobstats: a few plain lines that say what to ask for next time. Where the
telemetry is missing or too thin, the advice says so instead of guessing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

# a GPU idle at least this share of its measured time counts as unused
IDLE_GPU_SHARE = 0.90
# below this share of allocated time measured, utilisation advice would be a guess
MIN_COVERAGE = 0.50
# mean utilisation of the GPUs in use below this (percent) is low
LOW_UTIL_PERCENT = 30.0
# peak memory below this share of the GPU's memory means a smaller GPU would do
LOW_MEMORY_SHARE = 0.25
# a job shorter than this (seconds) on at least MANY_GPUS GPUs is a short job on many GPUs
SHORT_JOB_SECONDS = 600
MANY_GPUS = 4

GIB = 2**30


@dataclass(frozen=True)
class GpuFigures:
    """What one GPU did for one attempt (gpu_attribution summed over days).

    mapping 'unmapped' (gpu_uuid '') is the part of the allocation no GPU could be mapped to.
    """

    gpu_uuid: str
    node: str
    mapping: str
    allocated_seconds: float
    covered_seconds: float
    idle_seconds: float
    no_process_seconds: float
    unmeasured_seconds: float
    util_weighted_sum: float
    util_max_percent: float | None
    memory_used_max_bytes: int | None
    energy_joules: float | None
    memory_total_bytes: int | None = None
    gpu_fraction: float = 1.0
    model: str = ""

    @property
    def mapped(self) -> bool:
        return self.mapping != "unmapped"

    @property
    def mean_util_percent(self) -> float | None:
        return self.util_weighted_sum / self.covered_seconds if self.covered_seconds > 0 else None

    @property
    def idle_share(self) -> float | None:
        """Idle seconds / measured (covered) seconds."""
        return self.idle_seconds / self.covered_seconds if self.covered_seconds > 0 else None

    @property
    def coverage(self) -> float | None:
        """Measured seconds / allocated seconds."""
        return self.covered_seconds / self.allocated_seconds if self.allocated_seconds > 0 else None


@dataclass(frozen=True)
class JobFacts:
    alloc_gpus: int
    # None: the attempt has not started
    elapsed_seconds: float | None
    state: str = ""


def _percent(share: float) -> str:
    return f"{share * 100:.0f} %"


def _gpus(n: int) -> str:
    return f"{n} GPU" if n == 1 else f"{n} GPUs"


def advise(job: JobFacts, gpus: Sequence[GpuFigures]) -> list[str]:
    """Advice lines for one attempt; [] for an attempt without GPUs."""
    if job.alloc_gpus <= 0:
        return []
    if job.elapsed_seconds is None:
        return ["The job has not started: no GPU figures yet."]
    allocated = sum(g.allocated_seconds for g in gpus)
    covered = sum(g.covered_seconds for g in gpus)
    if allocated <= 0 or covered <= 0:
        return [
            "No GPU telemetry covers this job (no node agent or dcgm-exporter data for its GPUs): "
            "slurmtel cannot judge how it used them."
        ]
    advice = []
    unmapped = sum(g.allocated_seconds for g in gpus if not g.mapped)
    if unmapped > 0:
        advice.append(
            f"{unmapped / 3600:.2f} GPU-hours of the allocation could not be matched to a GPU "
            "(no process, slurmctld or whole-node mapping): they are unmeasured."
        )
    if covered / allocated < MIN_COVERAGE:
        advice.append(
            f"Telemetry covers only {_percent(covered / allocated)} of the allocated GPU time: "
            "too little to advise on utilisation."
        )
        return advice
    n = job.alloc_gpus
    judged = [g for g in gpus if g.mapped and (g.coverage or 0) >= MIN_COVERAGE]
    idle = [g for g in judged if (g.idle_share or 0) >= IDLE_GPU_SHARE]
    in_use = [g for g in judged if g not in idle]
    if idle:
        share = sum(g.idle_seconds for g in idle) / sum(g.covered_seconds for g in idle)
        if len(idle) >= n:
            subject = (
                f"The GPU was idle {_percent(share)}" if n == 1 else f"All {n} GPUs idle {_percent(share)}"
            )
            advice.append(
                f"{subject} of the time: the job did not use its GPU{'s' if n > 1 else ''}; "
                "check that the code runs on the GPU, or submit it without GPUs."
            )
        else:
            advice.append(
                f"{len(idle)} of {n} GPUs idle {_percent(share)} of the time: ask for {_gpus(n - len(idle))}."
            )
    mean = None
    if in_use:
        mean = sum(g.util_weighted_sum for g in in_use) / sum(g.covered_seconds for g in in_use)
        if mean < LOW_UTIL_PERCENT:
            advice.append(
                f"Mean utilisation of the GPUs in use is {mean:.0f} %: they often wait for data or the "
                "CPU; more data-loader workers, a larger batch or fewer GPUs may help."
            )
        with_memory = [g for g in in_use if g.memory_used_max_bytes is not None and g.memory_total_bytes]
        if with_memory and len(with_memory) == len(in_use):
            peak = max(g.memory_used_max_bytes or 0 for g in with_memory)
            capacity = min(g.memory_total_bytes or 0 for g in with_memory)
            if peak < LOW_MEMORY_SHARE * capacity:
                advice.append(
                    f"Peak GPU memory {peak / GIB:.1f} GiB of {capacity / GIB:.0f} GiB "
                    f"({_percent(peak / capacity)}): a GPU with less memory, or a MIG slice, would do."
                )
    if job.elapsed_seconds < SHORT_JOB_SECONDS and n >= MANY_GPUS:
        advice.append(
            f"The job ran {job.elapsed_seconds / 60:.0f} min on {n} GPUs: a short run on many GPUs spends "
            "much of its time starting up; test on 1 GPU, then scale out for long runs."
        )
    if not judged:
        advice.append("No single GPU of the job is measured well enough to advise on it.")
    elif not advice and mean is not None:
        advice.append(f"GPU use looks good: mean utilisation {mean:.0f} % on {_gpus(n)}.")
    return advice
