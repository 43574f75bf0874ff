"""The job page's charts (slurmtel.pages.svg) on their own: a job of many GPUs stays light, a
spike inside a slice stays visible, the text drawn is escaped."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from slurmtel.pages.svg import MAX_POINTS, MIN_POINTS, chart_points, gpu_timeline_svg

START = datetime(2026, 11, 1, tzinfo=UTC)


def gpu(name: str, windows: int, spike_at: int | None = None) -> dict:
    return {
        "gpu": name,
        "idle_gpu": False,
        "idle_share": 0.0,
        "memory_total_bytes": 80 * 2**30,
        "power_limit_watts": 700.0,
        "points": [
            {
                "window_start_at": START + timedelta(seconds=30 * i),
                "window_seconds": 30.0,
                "util_share": 1.0 if i == spike_at else 0.5,
                "memory_used_bytes": 2**30,
                "power_watts": 300.0,
            }
            for i in range(windows)
        ],
    }


def test_points_per_gpu_fall_as_the_gpus_grow() -> None:
    assert chart_points(1) == chart_points(8) == MAX_POINTS
    assert chart_points(16) == MAX_POINTS // 2
    assert chart_points(1024) == MIN_POINTS


def test_the_charts_of_a_64_gpu_job_stay_light() -> None:
    end = START + timedelta(hours=24)
    charts = [
        gpu_timeline_svg(gpu(f"n{i // 8}/{i % 8}", MAX_POINTS), start=START, end=end, zone=ZoneInfo("UTC"),
                         max_points=chart_points(64))
        for i in range(64)
    ]  # fmt: skip
    assert sum(len(c) for c in charts) < 200_000


def test_a_spike_inside_a_slice_is_drawn_at_its_height() -> None:
    end = START + timedelta(seconds=30 * 2880)
    chart = gpu_timeline_svg(gpu("g/0", 2880, spike_at=1000), start=START, end=end, zone=ZoneInfo("UTC"))
    # utilisation's panel: 100 % is the top of the panel (y = TOP), 50 % half-way down
    found = re.search(r'<path d="([^"]*)" class="l0"/>', chart)
    assert found
    heights = {float(step.split()[1]) for step in found.group(1).replace("M", "L").split("L") if step.strip()}
    assert min(heights) == 30.0 and len(heights) == 2


def test_names_are_escaped() -> None:
    chart = gpu_timeline_svg(
        gpu("<b>&", 2), start=START, end=START + timedelta(minutes=1), zone=ZoneInfo("UTC")
    )
    assert "<b>" not in chart and "&lt;b&gt;&amp;" in chart
