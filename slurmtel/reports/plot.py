"""`slurmtel job --plot FILE.png`: GPU utilisation, memory and power over time, one row per GPU.

`utilisation_series` (pure) turns telemetry windows into the plotted series; `plot_job` draws
them with matplotlib (no pyplot, no global backend state) into a PNG, SVG or PDF.

One row of three small panels (utilisation, memory, power) per GPU, all sharing the time axis
and each column its scale: GPUs never draw over each other. Drawn in one panel, the idle GPUs
of a job lie exactly on top of each other at 0 % (3 listed, 1 visible), and offsetting them
would draw values they never had; in rows, each GPU's line is its own and true, an idle one is a
flat line in a shaded row labelled `idle NN %`, and the rows compare at a glance because their
scales are the same. Each GPU's memory capacity and power limit are dashed reference lines in
its row (from the inventory, where a source gave them). The time axis is in the site's zone and
names the date at its first tick and wherever the day changes. A job with more GPUs than
MAX_GPU_ROWS gets one row per node instead: the mean of the node's GPUs as a line, the lowest
and highest as a band, and how many of them were idle.

Titles hold user input (job names): plot_title shows them literally (control characters as
`\\xNN`, never read as mathtext) and shortened to a line.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, tzinfo
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from slurmtel.jobrows import UtilWindow

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

GIB = 2**30
# more GPUs than this get one row per node (a row per GPU would be taller than a screen)
MAX_GPU_ROWS = 16
# the longest job name a title shows whole
TITLE_NAME_CHARS = 48


@dataclass(frozen=True)
class SeriesPoint:
    start_at: datetime
    seconds: float
    util_percent: float | None
    memory_used_bytes: int | None = None
    power_watts: float | None = None


@dataclass(frozen=True)
class GpuSeries:
    """One GPU's row: LABEL (`node/index`), its points, its idle share of the measured time
    (IDLE: at or above the idle threshold) and its memory capacity and power limit."""

    label: str
    points: Sequence[SeriesPoint]
    idle: bool = False
    idle_share: float | None = None
    memory_total_bytes: int | None = None
    power_limit_watts: float | None = None
    # the node the GPU is in (rows per node when a job has more than MAX_GPU_ROWS GPUs)
    node: str = ""


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


@dataclass(frozen=True)
class Panel:
    """One column: its heading, a point's value in its unit, the row's reference line (value,
    label) and the line's colour."""

    heading: str
    value: Callable[[SeriesPoint], float | None]
    reference: Callable[[GpuSeries], tuple[float, str] | None]
    color: str
    fixed_limits: tuple[float, float] | None = None


def _memory_reference(gpu: GpuSeries) -> tuple[float, str] | None:
    if not gpu.memory_total_bytes:
        return None
    gib = gpu.memory_total_bytes / GIB
    return gib, f"{gib:.0f} GiB"


def _power_reference(gpu: GpuSeries) -> tuple[float, str] | None:
    if not gpu.power_limit_watts:
        return None
    return gpu.power_limit_watts, f"limit {gpu.power_limit_watts:.0f} W"


PANELS: tuple[Panel, ...] = (
    Panel("utilisation (%)", lambda p: p.util_percent, lambda g: None, "C0", (-4.0, 105.0)),
    Panel(
        "memory used (GiB)",
        lambda p: None if p.memory_used_bytes is None else p.memory_used_bytes / GIB,
        _memory_reference,
        "C2",
    ),
    Panel("power (W)", lambda p: p.power_watts, _power_reference, "C3"),
)


@dataclass
class _Row:
    """What one row draws: one GPU, or (many GPUs) one node's GPUs as a band around their mean."""

    label: str
    gpus: list[GpuSeries] = field(default_factory=list)
    idle_note: str = ""

    @property
    def idle(self) -> bool:
        return bool(self.idle_note)


def _rows(series: Sequence[GpuSeries]) -> list[_Row]:
    if len(series) <= MAX_GPU_ROWS:
        return [
            _Row(
                g.label,
                [g],
                f"idle {g.idle_share * 100:.0f} %" if g.idle and g.idle_share is not None else "",
            )
            for g in series
        ]
    rows: dict[str, _Row] = {}
    for g in series:
        node = g.node or g.label.split("/")[0]
        rows.setdefault(node, _Row(node)).gpus.append(g)
    for row in rows.values():
        idle = sum(g.idle for g in row.gpus)
        row.label = f"{row.label}\n{len(row.gpus)} GPUs"
        row.idle_note = f"{idle} of {len(row.gpus)} idle" if idle else ""
    return list(rows.values())


def _day_time_formatter(zone: tzinfo) -> Any:
    """Tick labels `HH:MM` in ZONE, with the date (`YYYY-MM-DD`) under the first tick and every
    tick where the day changes: the axis says which day it shows, not only the time of day."""
    from matplotlib.dates import num2date
    from matplotlib.ticker import Formatter

    def label(x: float, with_date: bool) -> str:
        moment = num2date(x, tz=zone)
        return f"{moment:%H:%M}\n{moment:%Y-%m-%d}" if with_date else f"{moment:%H:%M}"

    class DayTimeFormatter(Formatter):
        def __call__(self, x: float, pos: int | None = None) -> str:
            return label(x, True)

        def format_ticks(self, values: Sequence[float]) -> list[str]:
            labels, last = [], None
            for x in values:
                day = num2date(x, tz=zone).date()
                labels.append(label(x, day != last))
                last = day
            return labels

    return DayTimeFormatter()


def plot_job(
    series: Sequence[GpuSeries],
    path: Path | BinaryIO,
    *,
    title: str,
    zone: tzinfo,
    fmt: str | None = None,
    so_far: bool = False,
) -> Figure:
    """Write SERIES to PATH as its extension names (.png, .svg or .pdf), or as FMT to a binary
    file object; times shown in ZONE. Above: TITLE (plot_title), then what the rows show (SO_FAR:
    the job still runs). The figure is returned (for tests)."""
    if fmt is None:
        if not isinstance(path, Path):
            raise ValueError("plotting to a file object needs its format")
        fmt = path.suffix.lower().lstrip(".")
    if fmt not in ("png", "svg", "pdf"):
        raise ValueError(f"cannot plot to {path}: the file name must end in .png, .svg or .pdf")
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.dates import AutoDateLocator, date2num
    from matplotlib.figure import Figure
    from matplotlib.transforms import blended_transform_factory

    rows = _rows(series) or [_Row("")]
    row_inches = 1.15 if len(rows) <= 4 else 0.85
    top_inches, bottom_inches = 1.0, 0.9
    height = top_inches + bottom_inches + row_inches * len(rows)
    figure = Figure(figsize=(11, max(height, 3.5)), dpi=100)
    FigureCanvasAgg(figure)
    axes = figure.subplots(len(rows), len(PANELS), sharex=True, sharey="col", squeeze=False)
    has_data = any(g.points for g in series)
    for r, row in enumerate(rows):
        for c, panel in enumerate(PANELS):
            ax = axes[r][c]
            _draw(ax, row, panel)
            ax.grid(True, alpha=0.3)
            ax.tick_params(labelsize="x-small")
            if row.idle:
                ax.set_facecolor("#fdf0ec")
            if r == 0:
                ax.set_title(panel.heading, fontsize="small", parse_math=False)
        label = row.label + (f"\n{row.idle_note}" if row.idle_note else "")
        axes[r][0].set_ylabel(
            label, rotation=0, ha="right", va="center", fontsize="small", labelpad=8, parse_math=False,
            color="#b03a2e" if row.idle else "black",
        )  # fmt: skip
    for c, panel in enumerate(PANELS):
        column = [axes[r][c] for r in range(len(rows))]
        if panel.fixed_limits:
            column[0].set_ylim(*panel.fixed_limits)
        else:
            # from a little below 0 (an idle GPU's line at 0 stays clear of the axis) to above
            # the highest value or reference line of the column
            high = max([1.0, *(_highest(row, panel) for row in rows)])
            column[0].set_ylim(-0.04 * high, high * 1.25)
    if not has_data:
        axes[0][1].text(
            0.5,
            0.5,
            "no GPU telemetry for this job",
            ha="center",
            va="center",
            transform=axes[0][1].transAxes,
        )
    bottom = axes[-1]
    locator = AutoDateLocator(tz=zone, minticks=3, maxticks=7)
    days = _day_time_formatter(zone)
    for ax in bottom:
        ax.xaxis.set_major_locator(locator)
        ax.xaxis.set_major_formatter(days)
    bottom[1].set_xlabel(f"time ({zone})", fontsize="small", parse_math=False)
    per = (
        "GPU"
        if len(series) <= MAX_GPU_ROWS
        else "node (its GPUs' mean, and thin lines at their lowest and highest)"
    )
    legend = (
        f"one row per {per}: utilisation, memory and power{' so far' if so_far else ''}; "
        f"dashed: memory capacity, power limit; times in {zone}"
    )
    figure.suptitle(f"{title}\n{legend}", fontsize="medium", parse_math=False, x=0.02, ha="left")
    height_inches = figure.get_figheight()
    figure.subplots_adjust(
        left=0.14, right=0.97, top=1 - top_inches / height_inches, bottom=bottom_inches / height_inches,
        hspace=0.18, wspace=0.22,
    )  # fmt: skip
    for r, row in enumerate(rows):
        for c, panel in enumerate(PANELS):
            reference = _reference(row, panel)
            if reference is not None:
                value, text = reference
                ax = axes[r][c]
                ax.axhline(value, linestyle="--", linewidth=0.9, color="0.35", zorder=1)
                ax.text(
                    0.99, value, text, transform=blended_transform_factory(ax.transAxes, ax.transData),
                    ha="right", va="bottom", fontsize="x-small", color="0.3", parse_math=False,
                )  # fmt: skip
    # the x range: every point of every GPU (empty: matplotlib's default)
    starts = [p.start_at for g in series for p in g.points]
    if starts:
        ends = [p.start_at + timedelta(seconds=p.seconds) for g in series for p in g.points]
        bottom[0].set_xlim(date2num(min(starts)), date2num(max(ends)))
    figure.savefig(path, format=fmt)
    return figure


def _draw(ax: Axes, row: _Row, panel: Panel) -> None:
    from matplotlib.dates import date2num

    if len(row.gpus) == 1:
        xs, ys = _with_gaps(row.gpus[0].points, panel.value)
        ax.step(date2num(xs), ys, where="post", color=panel.color, linewidth=1.1)
        return
    if not row.gpus:
        return
    # a node of many GPUs: at each window, the mean of its GPUs and their lowest and highest
    by_start: dict[datetime, list[float]] = {}
    seconds: dict[datetime, float] = {}
    for gpu in row.gpus:
        for p in gpu.points:
            v = panel.value(p)
            if v is not None:
                by_start.setdefault(p.start_at, []).append(v)
                seconds[p.start_at] = p.seconds
    starts = sorted(by_start)
    summaries: tuple[tuple[Callable[[list[float]], float], float, float], ...] = (
        (lambda vs: sum(vs) / len(vs), 1.1, 1.0),  # the mean, bold
        (min, 0.5, 0.6),  # the lowest and the highest, thin
        (max, 0.5, 0.6),
    )
    for summary, width, alpha in summaries:
        line = [SeriesPoint(t, seconds[t], summary(by_start[t])) for t in starts]
        xs, ys = _with_gaps(line, lambda p: p.util_percent)
        ax.step(date2num(xs), ys, where="post", color=panel.color, linewidth=width, alpha=alpha)


def _reference(row: _Row, panel: Panel) -> tuple[float, str] | None:
    """The row's reference line: its GPU's, or the one all its GPUs share."""
    references = {panel.reference(g) for g in row.gpus}
    if len(references) != 1:
        return None
    return next(iter(references))


def _highest(row: _Row, panel: Panel) -> float:
    values = [v for g in row.gpus for p in g.points if (v := panel.value(p)) is not None and math.isfinite(v)]
    reference = _reference(row, panel)
    return max([0.0, *values, *([reference[0]] if reference else [])])


def plot_title(
    *,
    job_id: str,
    name: str,
    user: str,
    cluster: str,
    state: str,
    elapsed: str,
    running: bool,
    gpus: int,
    gpu_model: str,
    attempts: int,
) -> str:
    """One line: whose job, its name, state, elapsed time (so far, while it runs) and GPUs. Job
    and user names come from users: control characters as `\\xNN`, a long name shortened."""
    from slurmtel.reports.render import escape_controls

    shown = escape_controls(name)
    if len(shown) > TITLE_NAME_CHARS:
        shown = shown[: TITLE_NAME_CHARS - 1] + "…"
    model = f" ({escape_controls(gpu_model)})" if gpu_model else ""
    elapsed_text = f"{elapsed} so far" if running else f"{elapsed} elapsed"
    of = f", latest of {attempts} attempts" if attempts > 1 else ""
    return (
        f"Job {escape_controls(job_id)} “{shown}” of {escape_controls(user)} on {escape_controls(cluster)}: "
        f"{escape_controls(state)}{of}, {elapsed_text}, {gpus} GPU{'s' if gpus != 1 else ''}{model}"
    )
