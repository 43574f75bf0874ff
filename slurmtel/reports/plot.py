"""`slurmtel job --plot FILE.png`: GPU utilisation over time, one line per GPU.

`utilisation_series` (pure) turns telemetry windows into the plotted series; `plot_utilisation`
draws them with matplotlib's Agg canvas (no pyplot, no global backend state) into a PNG.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, tzinfo
from pathlib import Path


@dataclass(frozen=True)
class UtilWindow:
    """One telemetry window of one GPU (a gpu_summary row)."""

    gpu_uuid: str
    window_start_at: datetime
    window_seconds: float
    util_mean_percent: float | None
    source: str = "agent"


@dataclass(frozen=True)
class SeriesPoint:
    start_at: datetime
    seconds: float
    util_percent: float | None


def utilisation_series(windows: Iterable[UtilWindow]) -> dict[str, list[SeriesPoint]]:
    """Per GPU, one point per window in time order; where the agent and DCGM both report a
    window, the agent's (as attribution does)."""
    chosen: dict[tuple[str, datetime], UtilWindow] = {}
    for w in windows:
        key = (w.gpu_uuid, w.window_start_at)
        current = chosen.get(key)
        if current is None or (current.source != "agent" and w.source == "agent"):
            chosen[key] = w
    series: dict[str, list[SeriesPoint]] = {}
    for (uuid, _), w in sorted(chosen.items()):
        series.setdefault(uuid, []).append(
            SeriesPoint(w.window_start_at, w.window_seconds, w.util_mean_percent)
        )
    return series


def _with_gaps(points: Sequence[SeriesPoint]) -> tuple[list[datetime], list[float]]:
    """x, y for a post-step line: each window holds its value until it ends; a missing window
    between two points leaves a gap (NaN), never a line across it."""
    xs: list[datetime] = []
    ys: list[float] = []
    for i, p in enumerate(points):
        if i:
            previous = points[i - 1]
            end = previous.start_at + timedelta(seconds=previous.seconds)
            if p.start_at > end:
                xs.append(end)
                ys.append(float("nan"))
        xs.append(p.start_at)
        ys.append(float("nan") if p.util_percent is None else float(p.util_percent))
    if points:
        last = points[-1]
        xs.append(last.start_at + timedelta(seconds=last.seconds))
        ys.append(float("nan"))
    return xs, ys


def plot_utilisation(
    series: Mapping[str, Sequence[SeriesPoint]], path: Path, *, title: str, zone: tzinfo
) -> None:
    """Write a PNG of SERIES (label -> points) to PATH, times shown in ZONE."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.dates import AutoDateLocator, ConciseDateFormatter, date2num
    from matplotlib.figure import Figure

    figure = Figure(figsize=(10, 4.5), dpi=100)
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    for label, points in series.items():
        xs, ys = _with_gaps(points)
        axes.step(date2num(xs), ys, where="post", label=label, linewidth=1.2)
    if not any(series.values()):
        axes.text(
            0.5, 0.5, "no GPU telemetry for this job", ha="center", va="center", transform=axes.transAxes
        )
    axes.set_ylim(0, 105)
    axes.set_ylabel("GPU utilisation (%)")
    locator = AutoDateLocator(tz=zone)
    axes.xaxis.set_major_locator(locator)
    axes.xaxis.set_major_formatter(ConciseDateFormatter(locator, tz=zone))
    axes.set_xlabel(f"time ({zone})")
    axes.set_title(title)
    axes.grid(True, alpha=0.3)
    if series:
        axes.legend(loc="upper right", fontsize="small")
    figure.tight_layout()
    figure.savefig(path, format="png")
