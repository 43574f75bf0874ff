"""`slurmtel job --plot FILE.png`: GPU utilisation, memory and power over time, one line per GPU.

`utilisation_series` (pure) turns telemetry windows into the plotted series; `plot_job` draws
them with matplotlib (no pyplot, no global backend state) into a PNG, SVG or PDF: three small
panels sharing the time axis (in the site zone), each GPU named `node/index`, idle GPUs drawn
dashed with markers above the busy ones (so a flat line at 0 stays visible), the legend to the
right of the panels, outside the data.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, tzinfo
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from slurmtel.rows import UtilWindow

if TYPE_CHECKING:
    from matplotlib.figure import Figure

GIB = 2**30


@dataclass(frozen=True)
class SeriesPoint:
    start_at: datetime
    seconds: float
    util_percent: float | None
    memory_used_bytes: int | None = None
    power_watts: float | None = None


@dataclass(frozen=True)
class GpuSeries:
    """One GPU's line in every panel: LABEL (`node/index`), its points, whether it sat idle."""

    label: str
    points: Sequence[SeriesPoint]
    idle: bool = False


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
            SeriesPoint(
                w.window_start_at,
                w.window_seconds,
                w.util_mean_percent,
                w.memory_used_max_bytes,
                w.power_mean_watts,
            )
        )
    return series


def _with_gaps(
    points: Sequence[SeriesPoint], value: Callable[[SeriesPoint], float | None]
) -> tuple[list[datetime], list[float]]:
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
        v = value(p)
        ys.append(float("nan") if v is None else float(v))
    if points:
        last = points[-1]
        xs.append(last.start_at + timedelta(seconds=last.seconds))
        ys.append(float("nan"))
    return xs, ys


# (panel's y label, the value of a point); one panel each, top to bottom
PANELS: tuple[tuple[str, Callable[[SeriesPoint], float | None]], ...] = (
    ("utilisation (%)", lambda p: p.util_percent),
    ("memory used (GiB)", lambda p: None if p.memory_used_bytes is None else p.memory_used_bytes / GIB),
    ("power (W)", lambda p: p.power_watts),
)
IDLE_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")


def plot_job(
    series: Sequence[GpuSeries], path: Path | BinaryIO, *, title: str, zone: tzinfo, fmt: str | None = None
) -> Figure:
    """Write SERIES to PATH as its extension names (.png, .svg or .pdf), or as FMT to a binary
    file object; times shown in ZONE. The figure is returned (for tests)."""
    if fmt is None:
        if not isinstance(path, Path):
            raise ValueError("plotting to a file object needs its format")
        fmt = path.suffix.lower().lstrip(".")
    if fmt not in ("png", "svg", "pdf"):
        raise ValueError(f"cannot plot to {path}: the file name must end in .png, .svg or .pdf")
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.dates import AutoDateLocator, ConciseDateFormatter, date2num
    from matplotlib.figure import Figure

    figure = Figure(figsize=(11, 7.5), dpi=100)
    FigureCanvasAgg(figure)
    axes = figure.subplots(len(PANELS), 1, sharex=True)
    idle_seen = 0
    for i, gpu in enumerate(series):
        style: dict[str, object] = {"color": f"C{i % 10}", "label": gpu.label}
        if gpu.idle:
            # dashed, marked and drawn over the busy lines: an idle GPU's flat line stays visible
            every = max(1, len(gpu.points) // 12)
            style.update(
                linestyle="--",
                linewidth=1.6,
                marker=IDLE_MARKERS[idle_seen % len(IDLE_MARKERS)],
                markersize=4,
                markevery=(idle_seen % every, every),
                zorder=3,
            )
            idle_seen += 1
        else:
            style.update(linewidth=1.2, zorder=2)
        for ax, (_, value) in zip(axes, PANELS, strict=True):
            xs, ys = _with_gaps(gpu.points, value)
            ax.step(date2num(xs), ys, where="post", **style)
    has_data = any(gpu.points for gpu in series)
    for ax, (label, _) in zip(axes, PANELS, strict=True):
        ax.set_ylabel(label, fontsize="small")
        ax.grid(True, alpha=0.3)
        # a little room below 0: an idle GPU's line is not hidden by the axis
        ax.set_ylim(bottom=-0.04 * max(ax.get_ylim()[1], 1.0))
        if not has_data:
            ax.text(
                0.5, 0.5, "no GPU telemetry for this job", ha="center", va="center", transform=ax.transAxes
            )
    axes[0].set_ylim(-4, 105)
    locator = AutoDateLocator(tz=zone)
    axes[-1].xaxis.set_major_locator(locator)
    axes[-1].xaxis.set_major_formatter(ConciseDateFormatter(locator, tz=zone))
    axes[-1].set_xlabel(f"time ({zone})")
    axes[0].set_title(title)
    figure.subplots_adjust(left=0.08, right=0.76, top=0.94, bottom=0.08, hspace=0.12)
    if series:
        # outside the data: to the right of the panels
        axes[0].legend(
            loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0, fontsize="small", title="GPU"
        )
    figure.savefig(path, format=fmt)
    return figure
