"""The window summariser on scripted timelines; expected values worked out by hand below."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from slurmtel.agent.summarize import GpuSample, WindowSummarizer
from slurmtel.records import GpuSummary

# a multiple of 30: windows start at T0, T0 + 30, ...
T0 = 1_800_000_000.0
UUID = "GPU-00000000-0000-0000-0000-000000000000"


def s(
    util: float | None,
    processes: int | None = 1,
    jobs: tuple[str, ...] = (),
    memory: int | None = None,
    energy: float | None = None,
    power: float | None = None,
    metric: str = "gpu_util",
    uuid: str = UUID,
) -> GpuSample:
    return GpuSample(
        gpu_uuid=uuid,
        util_metric=metric if util is not None else "",
        util_percent=util,
        memory_used_bytes=memory,
        memory_total_bytes=80_000 if memory is not None else None,
        power_watts=power,
        energy_counter_joules=energy,
        process_count=processes,
        job_ids=jobs,
    )


def timeline(t: int) -> GpuSample:
    """t = seconds after T0. Busy 1-10, idle 11-14, gap 15-17, idle without process 19-25, busy 26+."""
    energy = 100.0 * t  # a 100 W GPU's counter, in joules
    if t <= 10:
        return s(50.0, 1, ("123",), memory=1000, energy=energy, power=100.0)
    if t <= 14:
        return s(2.0, 1, ("123",), memory=1000, energy=energy, power=100.0)
    if t == 18:
        # first sample after the gap: stands for no interval, so its 99 % must not count
        return s(99.0, 1, ("123",), memory=2000, energy=energy, power=100.0)
    if t <= 25:
        return s(0.0, 0, (), memory=2000, energy=energy, power=100.0)
    return s(80.0, 1, ("124",), memory=2000, energy=energy, power=100.0)


def test_scripted_timeline_with_gap() -> None:
    summarizer = WindowSummarizer(
        "gpu01", window_seconds=30, sample_interval_seconds=1, idle_threshold_percent=5
    )
    closed: list[GpuSummary] = []
    for t in [*range(0, 15), *range(18, 34)]:
        closed += summarizer.add(T0 + t, timeline(t))
    # window 1 closes when the sample at T0+30 arrives (it also ends the interval (29, 30])
    (first,) = closed
    # samples stamped in [T0, T0+30): 0..14 and 18..29
    assert first.sample_count == 27
    # (0,14] = 14 s, gap (14,18] not covered, (18,30] = 12 s
    assert first.covered_seconds == 26.0
    # idle: (10,14] at 2 % and (18,25] at 0 % = 4 + 7
    assert first.idle_seconds == 11.0
    assert first.no_process_seconds == 7.0
    # (50*10 + 2*4 + 0*7 + 80*5) / 26
    assert first.util_mean_percent == pytest.approx(908 / 26, abs=1e-6)
    assert first.util_max_percent == 80.0
    assert first.util_metric == "gpu_util"
    # (1000*14 + 2000*12) / 26 = 1461.54
    assert first.memory_used_mean_bytes == 1462
    assert first.memory_used_max_bytes == 2000
    assert first.memory_total_bytes == 80_000
    # counter deltas over covered intervals only: 26 s x 100 W (the gap's 400 J is not covered)
    assert first.energy_joules == 2600.0
    assert first.energy_method == "counter"
    assert first.power_mean_watts == 100.0
    assert first.job_ids == ("123", "124")
    assert first.window_start_at == datetime.fromtimestamp(T0, UTC)
    assert first.window_seconds == 30.0
    assert (first.source, first.node, first.gpu_uuid) == ("agent", "gpu01", UUID)

    # window 2 is still open; it closes once no sample can reach it (end + 2 periods)
    assert summarizer.flush(T0 + 62) == []
    (second,) = summarizer.flush(T0 + 62.5)
    assert second.window_start_at == datetime.fromtimestamp(T0 + 30, UTC)
    assert second.sample_count == 4
    assert second.covered_seconds == 3.0
    assert second.util_mean_percent == 80.0
    assert second.idle_seconds == 0.0
    assert second.no_process_seconds == 0.0
    assert second.energy_joules == 300.0
    assert second.job_ids == ("124",)


def test_interval_across_a_boundary_is_split() -> None:
    summarizer = WindowSummarizer("gpu01", 30, 1, 5)
    closed: list[GpuSummary] = []
    for i in range(40):
        t = 0.5 + i
        closed += summarizer.add(T0 + t, s(10.0 if t < 30 else 0.0, energy=100.0 * t, power=100.0))
    first = closed[0]
    # samples 0.5 .. 29.5; intervals (0.5, 29.5] plus (29.5, 30] of the sample at 30.5
    assert first.sample_count == 30
    assert first.covered_seconds == 29.5
    # the half second (29.5, 30] carries the 0 % of the sample at 30.5
    assert first.idle_seconds == 0.5
    assert first.energy_joules == 2950.0
    (second,) = summarizer.close_all()
    assert second.covered_seconds == 9.5  # (30, 39.5]
    assert second.idle_seconds == 9.5
    assert second.energy_joules == 950.0


def test_energy_counter_reset_falls_back_to_power_for_that_interval() -> None:
    summarizer = WindowSummarizer("gpu01", 30, 1, 5)
    for t in range(11):
        # counter 200 J/s, reset (driver reload) between t=4 and t=5
        counter = 200.0 * t if t <= 4 else 50.0 + 200.0 * (t - 5)
        summarizer.add(T0 + t, s(90.0, energy=counter, power=200.0))
    (summary,) = summarizer.close_all()
    # 4 counter intervals (800 J) + (4,5] from power (200 J) + 5 counter intervals (1000 J)
    assert summary.energy_joules == 2000.0
    assert summary.energy_method == "power_integral"
    assert summary.covered_seconds == 10.0


def test_energy_without_counter_is_the_power_integral() -> None:
    summarizer = WindowSummarizer("gpu01", 30, 1, 5)
    for t in range(11):
        summarizer.add(T0 + t, s(90.0, power=100.0 + 10 * t))
    (summary,) = summarizer.close_all()
    # sum over i=1..10 of (100 + 10 i) x 1 s
    assert summary.energy_joules == 1550.0
    assert summary.energy_method == "power_integral"
    assert summary.power_mean_watts == 155.0


def test_missing_counter_reading_does_not_double_count() -> None:
    summarizer = WindowSummarizer("gpu01", 30, 1, 5)
    for t in range(6):
        summarizer.add(T0 + t, s(90.0, energy=None if t == 3 else 100.0 * t, power=100.0))
    (summary,) = summarizer.close_all()
    # (2,3] and (3,4] come from power: the counter delta from 2 to 4 is not used as well
    assert summary.energy_joules == 500.0


def test_unknown_utilisation_and_processes() -> None:
    summarizer = WindowSummarizer("gpu01", 30, 1, 5)
    for t in range(5):
        summarizer.add(T0 + t, s(None, processes=None))
    (summary,) = summarizer.close_all()
    assert summary.covered_seconds == 4.0
    assert (summary.util_metric, summary.util_mean_percent, summary.util_max_percent) == ("", None, None)
    assert summary.idle_seconds == 0.0
    assert summary.no_process_seconds is None
    assert (summary.energy_joules, summary.energy_method) == (None, "")


def test_window_keeps_one_utilisation_metric() -> None:
    summarizer = WindowSummarizer("gpu01", 30, 1, 5)
    for t in range(5):
        metric = "gr_engine_active" if t < 3 else "gpu_util"
        summarizer.add(T0 + t, s(40.0 if t < 3 else 1.0, metric=metric))
    (summary,) = summarizer.close_all()
    assert summary.util_metric == "gr_engine_active"
    assert summary.util_mean_percent == 40.0
    # (2,4] had a gpu_util reading: covered, but neither idle nor counted in the mean
    assert summary.covered_seconds == 4.0
    assert summary.idle_seconds == 0.0


def test_samples_not_after_the_previous_are_refused() -> None:
    summarizer = WindowSummarizer("gpu01", 30, 1, 5)
    summarizer.add(T0 + 5, s(50.0))
    assert summarizer.add(T0 + 5, s(0.0)) == []
    assert summarizer.add(T0 + 4, s(0.0)) == []
    assert summarizer.out_of_order == 2
    summarizer.add(T0 + 6, s(50.0))
    (summary,) = summarizer.close_all()
    assert (summary.sample_count, summary.covered_seconds, summary.idle_seconds) == (2, 1.0, 0.0)


def test_clock_set_back_restarts_the_account() -> None:
    summarizer = WindowSummarizer("gpu01", 30, 1, 5)
    for t in range(100, 105):
        summarizer.add(T0 + t, s(50.0))
    # NTP steps the clock back an hour: the open window goes out, sampling goes on
    (sent,) = summarizer.add(T0 + 100 - 3600, s(0.0))
    assert (sent.window_start_at, sent.covered_seconds) == (datetime.fromtimestamp(T0 + 90, UTC), 4.0)
    assert (summarizer.clock_resets, summarizer.out_of_order) == (1, 0)
    summarizer.add(T0 + 101 - 3600, s(0.0))
    (after,) = summarizer.close_all()
    assert (after.window_start_at, after.covered_seconds, after.idle_seconds) == (
        datetime.fromtimestamp(T0 + 90 - 3600, UTC),
        1.0,
        1.0,
    )


def test_gpus_are_independent() -> None:
    summarizer = WindowSummarizer("gpu01", 30, 1, 5)
    for t in range(3):
        summarizer.add(T0 + t, s(50.0, uuid="GPU-a"))
        if t != 1:
            summarizer.add(T0 + t, s(0.0, uuid="GPU-b"))
    by_uuid = {x.gpu_uuid: x for x in summarizer.close_all()}
    assert by_uuid["GPU-a"].covered_seconds == 2.0
    # GPU-b: 0 -> 2 is a 2 s interval, not more than 2 periods: covered
    assert by_uuid["GPU-b"].covered_seconds == 2.0
    assert by_uuid["GPU-b"].idle_seconds == 2.0


def test_windows_align_to_wall_clock_multiples() -> None:
    summarizer = WindowSummarizer("gpu01", window_seconds=60, sample_interval_seconds=1)
    assert summarizer.window_start(T0 + 59.9) == T0
    assert summarizer.window_start(T0 + 61) == T0 + 60
    other = WindowSummarizer("gpu02", window_seconds=60, sample_interval_seconds=1)
    assert other.window_start(T0 + 17.25) == summarizer.window_start(T0 + 17.25)


def test_state_survives_a_restart() -> None:
    uninterrupted = WindowSummarizer("gpu01", 30, 1, 5)
    first = WindowSummarizer("gpu01", 30, 1, 5)
    expected: list[GpuSummary] = []
    got: list[GpuSummary] = []
    for t in range(0, 15):
        expected += uninterrupted.add(T0 + t, timeline(t))
        got += first.add(T0 + t, timeline(t))
    state = first.export_state()
    second = WindowSummarizer("gpu01", 30, 1, 5)
    assert second.restore_state(state, now=T0 + 15) == []
    for t in range(18, 34):
        expected += uninterrupted.add(T0 + t, timeline(t))
        got += second.add(T0 + t, timeline(t))
    assert got == expected
    assert len(got) == 1


def test_restore_after_the_window_ended_sends_it() -> None:
    first = WindowSummarizer("gpu01", 30, 1, 5)
    for t in range(0, 15):
        first.add(T0 + t, timeline(t))
    second = WindowSummarizer("gpu01", 30, 1, 5)
    (summary,) = second.restore_state(first.export_state(), now=T0 + 3600)
    assert summary.covered_seconds == 14.0
    assert summary.sample_count == 15
    # a different window length cannot resume: the saved window goes out as it is
    third = WindowSummarizer("gpu01", 60, 1, 5)
    (resent,) = third.restore_state(first.export_state(), now=T0 + 15)
    assert (resent.window_seconds, resent.covered_seconds) == (30.0, 14.0)
