"""Advice lines from per-GPU figures (pure): exact strings for hand-made jobs."""

from __future__ import annotations

from slurmtel.reports.advice import JobFacts, advise
from slurmtel.rows import GpuFigures

HOUR = 3600.0
GIB = 2**30


def gpu(
    uuid: str,
    *,
    allocated: float = HOUR,
    covered: float = HOUR,
    idle: float = 0.0,
    mean: float = 80.0,
    mapping: str = "process",
    memory: int | None = None,
    total: int | None = None,
) -> GpuFigures:
    return GpuFigures(
        gpu_uuid=uuid,
        node="gpu01",
        mapping=mapping,
        allocated_seconds=allocated,
        covered_seconds=covered,
        idle_seconds=idle,
        no_process_seconds=0.0,
        unmeasured_seconds=allocated - covered,
        util_weighted_sum=mean * covered,
        util_max_percent=95.0,
        memory_used_max_bytes=memory,
        energy_joules=None,
        memory_total_bytes=total,
    )


def idle_gpu(uuid: str, idle_share: float) -> GpuFigures:
    # busy seconds at 80 %, the rest idle at 0 %
    return gpu(uuid, idle=idle_share * HOUR, mean=80.0 * (1 - idle_share))


def test_three_of_four_idle_gpus_ask_for_one() -> None:
    gpus = [gpu("GPU-0"), idle_gpu("GPU-1", 0.92), idle_gpu("GPU-2", 0.92), idle_gpu("GPU-3", 0.92)]
    assert advise(JobFacts(4, 2 * HOUR), gpus) == ["3 of 4 GPUs idle 92 % of the time: ask for 1 GPU."]


def test_two_of_four_idle_ask_for_two_gpus_and_the_idle_share_is_pooled() -> None:
    gpus = [gpu("GPU-0"), gpu("GPU-1"), idle_gpu("GPU-2", 0.90), idle_gpu("GPU-3", 1.0)]
    assert advise(JobFacts(4, HOUR), gpus) == ["2 of 4 GPUs idle 95 % of the time: ask for 2 GPUs."]


def test_a_gpu_idle_89_percent_is_not_an_unused_gpu_but_low_utilisation() -> None:
    gpus = [gpu("GPU-0"), idle_gpu("GPU-1", 0.89)]
    # in use: GPU-0 at 80 %, GPU-1 at 8.8 % -> mean 44.4 %: not low
    assert advise(JobFacts(2, HOUR), gpus) == ["GPU use looks good: mean utilisation 44 % on 2 GPUs."]


def test_every_gpu_idle() -> None:
    assert advise(JobFacts(1, HOUR), [idle_gpu("GPU-0", 1.0)]) == [
        "The GPU was idle 100 % of the time: the job did not use its GPU; check that the code runs "
        "on the GPU, or submit it without GPUs."
    ]
    assert advise(JobFacts(2, HOUR), [idle_gpu("GPU-0", 0.95), idle_gpu("GPU-1", 0.97)]) == [
        "All 2 GPUs idle 96 % of the time: the job did not use its GPUs; check that the code runs "
        "on the GPU, or submit it without GPUs."
    ]


def test_low_mean_utilisation() -> None:
    assert advise(JobFacts(2, HOUR), [gpu("GPU-0", mean=20.0), gpu("GPU-1", mean=30.0)]) == [
        "Mean utilisation of the GPUs in use is 25 %: they often wait for data or the CPU; more "
        "data-loader workers, a larger batch or fewer GPUs may help."
    ]


def test_memory_far_below_capacity() -> None:
    gpus = [gpu("GPU-0", memory=6 * GIB, total=80 * GIB), gpu("GPU-1", memory=4 * GIB, total=80 * GIB)]
    assert advise(JobFacts(2, HOUR), gpus) == [
        "Peak GPU memory 6.0 GiB of 80 GiB (8 %): a GPU with less memory, or a MIG slice, would do."
    ]
    # one GPU near a quarter of its memory: no advice on memory
    gpus = [gpu("GPU-0", memory=20 * GIB, total=80 * GIB), gpu("GPU-1", memory=4 * GIB, total=80 * GIB)]
    assert advise(JobFacts(2, HOUR), gpus) == ["GPU use looks good: mean utilisation 80 % on 2 GPUs."]


def test_memory_capacity_unknown_gives_no_memory_advice() -> None:
    assert advise(JobFacts(1, HOUR), [gpu("GPU-0", memory=1 * GIB)]) == [
        "GPU use looks good: mean utilisation 80 % on 1 GPU."
    ]


def test_short_job_on_many_gpus() -> None:
    gpus = [gpu(f"GPU-{i}", allocated=300, covered=300) for i in range(4)]
    assert advise(JobFacts(4, 300), gpus) == [
        "The job ran 5 min on 4 GPUs: a short run on many GPUs spends much of its time starting up; "
        "test on 1 GPU, then scale out for long runs."
    ]
    # on 2 GPUs a short run is fine
    assert advise(JobFacts(2, 300), gpus[:2]) == ["GPU use looks good: mean utilisation 80 % on 2 GPUs."]


def test_missing_telemetry_is_said_not_advised_on() -> None:
    unmeasured = [gpu("", covered=0.0, mapping="unmapped", allocated=2 * HOUR)]
    assert advise(JobFacts(2, HOUR), unmeasured) == [
        "No GPU telemetry covers this job (no node agent or dcgm-exporter data for its GPUs): "
        "slurmtel cannot judge how it used them."
    ]
    assert advise(JobFacts(2, HOUR), []) == advise(JobFacts(2, HOUR), unmeasured)


def test_thin_coverage_stops_the_advice() -> None:
    # idle while measured, but only 30 % of the allocation is measured
    thin = [gpu("GPU-0", covered=0.3 * HOUR, idle=0.3 * HOUR, mean=0.0)]
    assert advise(JobFacts(1, HOUR), thin) == [
        "Telemetry covers only 30 % of the allocated GPU time: too little to advise on utilisation."
    ]


def test_unmapped_part_is_reported_and_the_rest_judged() -> None:
    gpus = [idle_gpu("GPU-0", 1.0), gpu("", covered=0.0, mapping="unmapped")]
    assert advise(JobFacts(2, HOUR), gpus) == [
        "1.00 GPU-hours of the allocation could not be matched to a GPU (no process, slurmctld or "
        "whole-node mapping): they are unmeasured.",
        "1 of 2 GPUs idle 100 % of the time: ask for 1 GPU.",
    ]


def test_no_gpus_and_not_started() -> None:
    assert advise(JobFacts(0, HOUR), []) == []
    assert advise(JobFacts(2, None), []) == ["The job has not started: no GPU figures yet."]


def test_several_findings_together() -> None:
    gpus = [
        gpu("GPU-0", allocated=240, covered=240, mean=10.0, memory=2 * GIB, total=80 * GIB),
        *[idle_gpu(f"GPU-{i}", 1.0) for i in (1, 2, 3)],
    ]
    gpus = [gpus[0]] + [
        GpuFigures(
            **{**g.__dict__, "allocated_seconds": 240.0, "covered_seconds": 240.0, "idle_seconds": 240.0}
        )
        for g in gpus[1:]
    ]
    assert advise(JobFacts(4, 240), gpus) == [
        "3 of 4 GPUs idle 100 % of the time: ask for 1 GPU.",
        "Mean utilisation of the GPUs in use is 10 %: they often wait for data or the CPU; more "
        "data-loader workers, a larger batch or fewer GPUs may help.",
        "Peak GPU memory 2.0 GiB of 80 GiB (2 %): a GPU with less memory, or a MIG slice, would do.",
        "The job ran 4 min on 4 GPUs: a short run on many GPUs spends much of its time starting up; "
        "test on 1 GPU, then scale out for long runs.",
    ]
