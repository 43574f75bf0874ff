"""Advice for a researcher about one job attempt, from its per-GPU figures and its host-side
usage (CPU efficiency, peak memory, time used; pure).

Like Princeton's jobstats and seff: a few plain lines that say what to ask for next time. Where
the telemetry is missing or too thin, the advice says so instead of guessing.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    # figures read from the store (slurmtel.rows): only annotated here, so that printing a job
    # the API sent does not build the store's row types
    from slurmtel.jobrows import GpuFigures

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
# host memory: a peak below this share of the memory requested is over-requested; the advice
# asks for the peak times MEMORY_HEADROOM, rounded up to whole GiB
LOW_HOST_MEMORY_SHARE = 0.50
MEMORY_HEADROOM = 1.2
# a completed attempt that used less than this share of its time limit asked for too much time;
# the advice asks for the time used times TIME_HEADROOM, rounded up to TIME_STEP_SECONDS
LOW_TIME_LIMIT_SHARE = 0.25
TIME_HEADROOM = 1.5
TIME_STEP_SECONDS = 900
# CPU efficiency (TotalCPU / (CPUs x elapsed), percent) below this on more than one CPU is low
LOW_CPU_EFFICIENCY_PERCENT = 25.0

GIB = 2**30


@dataclass(frozen=True)
class JobFacts:
    alloc_gpus: int
    # None: the attempt has not started
    elapsed_seconds: float | None
    state: str = ""
    # host side (slurmtel.store.efficiency); None: not known (no steps read, no limit, running)
    alloc_cpus: int = 0
    cpu_efficiency_percent: float | None = None
    mem_requested_bytes: int | None = None
    mem_peak_bytes: int | None = None
    nodes: int = 1
    time_limit_seconds: int | None = None
    # started and not ended: what the advice says is so far
    running: bool = False


def _percent(share: float) -> str:
    return f"{share * 100:.0f} %"


def _gpus(n: int) -> str:
    return f"{n} GPU" if n == 1 else f"{n} GPUs"


def duration_text(seconds: float) -> str:
    """Slurm's [D-]HH:MM:SS (as --time takes it)."""
    total = round(seconds)
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    clock = f"{hours:02d}:{minutes:02d}:{secs:02d}"
    return f"{days}-{clock}" if days else clock


def advise(job: JobFacts, gpus: Sequence[GpuFigures]) -> list[str]:
    """Advice lines for one attempt: its GPUs (none for an attempt without GPUs), then its host
    side (memory, time limit, CPUs)."""
    if job.elapsed_seconds is None:
        return ["The job has not started: no GPU figures yet."] if job.alloc_gpus > 0 else []
    advice = gpu_advice(job, gpus) + host_advice(job)
    return [so_far(line) for line in advice] if job.running else advice


def so_far(line: str) -> str:
    """LINE about a running job: "So far, the GPU was idle ...", "So far, 3 of 4 GPUs ..." (a
    first word in capitals, GPU, stays as it is)."""
    first = line.split(" ", 1)[0]
    if first[:1].isupper() and first[1:2].islower():
        line = line[0].lower() + line[1:]
    return f"So far, {line}"


def host_advice(job: JobFacts) -> list[str]:
    """Time limit hit or over-requested, host memory over-requested, low CPU efficiency.

    Usage of a running attempt is partial: only a finished attempt is judged on its usage."""
    elapsed = job.elapsed_seconds
    if elapsed is None:
        return []
    advice = []
    limit = job.time_limit_seconds
    if job.state == "TIMEOUT":
        of = f" ({duration_text(limit)})" if limit else ""
        advice.append(
            f"The job hit its time limit{of}: save checkpoints and resume from them, "
            "or ask for a longer --time."
        )
    finished = job.state not in ("RUNNING", "PENDING", "REQUEUED", "SUSPENDED", "")
    if job.state == "COMPLETED" and limit and elapsed < LOW_TIME_LIMIT_SHARE * limit:
        suggested = math.ceil(max(elapsed, 1) * TIME_HEADROOM / TIME_STEP_SECONDS) * TIME_STEP_SECONDS
        if suggested < limit:
            advice.append(
                f"The job used {duration_text(elapsed)} of its {duration_text(limit)} time limit "
                f"({_percent(elapsed / limit)}): --time={duration_text(suggested)} would let it start "
                "earlier (backfill)."
            )
    requested, peak = job.mem_requested_bytes, job.mem_peak_bytes
    if finished and requested and peak is not None and peak < LOW_HOST_MEMORY_SHARE * requested:
        nodes = max(job.nodes, 1)
        per_node = max(1, math.ceil(peak * MEMORY_HEADROOM / nodes / GIB))
        if per_node * nodes * GIB < requested:
            where = "" if nodes == 1 else " per node"
            advice.append(
                f"Peak host memory {peak / GIB:.1f} GiB of {requested / GIB:.1f} GiB requested "
                f"({_percent(peak / requested)}): ask for --mem={per_node}G{where}."
            )
    efficiency = job.cpu_efficiency_percent
    if finished and efficiency is not None and job.alloc_cpus > 1 and efficiency < LOW_CPU_EFFICIENCY_PERCENT:
        used = max(1, math.ceil(job.alloc_cpus * efficiency / 100 * 1.25))
        if used < job.alloc_cpus:
            advice.append(
                f"CPU efficiency {efficiency:.0f} % of {job.alloc_cpus} CPUs: about {used} "
                f"CPU{'s' if used > 1 else ''} would do (fewer --cpus-per-task), "
                "or put the rest to work (data-loader workers)."
            )
    return advice


def gpu_advice(job: JobFacts, gpus: Sequence[GpuFigures]) -> list[str]:
    """Advice lines about an attempt's GPUs; [] for an attempt without GPUs."""
    if job.alloc_gpus <= 0 or job.elapsed_seconds is None:
        return []
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
