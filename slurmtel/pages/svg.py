"""A GPU's timeline as inline SVG, drawn on the server: no JavaScript, no chart library, nothing
fetched by the browser.

One row per GPU with three panels side by side (utilisation 0–100 %, memory 0–capacity,
power 0–limit), sharing the attempt's time axis; each window holds its value until it ends,
and a missing window leaves a gap. An idle GPU's row is shaded and labelled `idle NN %` (the
job page's eye goes to it first). Hardware events on the GPU are red ticks at their time.

A long job has thousands of windows per GPU: each panel draws at most MAX_POINTS points, the
windows grouped into equal slices of the attempt with the slice's highest value (a spike stays
visible); the figures themselves are the timeline's JSON and CSV, unreduced.

Every text drawn (GPU names, node names) is escaped: the result is Markup safe to embed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, tzinfo
from typing import Any

from markupsafe import Markup, escape

GIB = 2**30
# points per panel at most; a page of many GPUs draws fewer each (chart_points)
MAX_POINTS = 240
# points per panel over all the GPUs of an attempt: the charts of a page stay near 200 KB
PAGE_POINTS = 1920
MIN_POINTS = 24


def chart_points(gpus: int) -> int:
    """Points per panel for an attempt of GPUS charted GPUs: MAX_POINTS up to 8 GPUs, then
    fewer so that all of them together draw about PAGE_POINTS, never below MIN_POINTS."""
    return max(MIN_POINTS, min(MAX_POINTS, PAGE_POINTS // max(gpus, 1)))


PANEL_WIDTH = 300
PANEL_HEIGHT = 70
GAP = 16
TOP = 30
BOTTOM = 16


def _instant(value: Any) -> datetime:
    return value if isinstance(value, datetime) else datetime.fromisoformat(str(value))


def _slices(
    points: Sequence[Mapping[str, Any]],
    values: Sequence[Callable[[Mapping[str, Any]], float | None]],
    start: datetime,
    end: datetime,
    max_points: int = MAX_POINTS,
) -> list[list[tuple[float, float | None]]]:
    """Per value of VALUES, (x in 0..1, y or None for a gap) per slice of [START, END) (at most
    MAX_POINTS slices): the highest value of the windows that start in it; a slice with no
    window is a gap."""
    span = max((end - start).total_seconds(), 1.0)
    slices = min(max_points, max(len(points), 1))
    best: list[list[float | None]] = [[None] * slices for _ in values]
    seen = [False] * slices
    scale = slices / span
    for p in points:
        at = (_instant(p["window_start_at"]) - start).total_seconds()
        first = min(int(max(0.0, at) * scale), slices - 1)
        last = min(int(max(0.0, at + float(p["window_seconds"]) - 1e-9) * scale), slices - 1)
        got = [value(p) for value in values]
        for i in range(first, last + 1):
            seen[i] = True
            for row, v in zip(best, got, strict=True):
                if v is not None:
                    current = row[i]
                    if current is None or v > current:
                        row[i] = v
    return [[((i + 0.5) / slices, row[i] if seen[i] else None) for i in range(slices)] for row in best]


def _path(samples: list[tuple[float, float | None]], top: float, x0: float) -> str:
    """An SVG path through SAMPLES scaled to the panel (0..TOP), broken at gaps."""
    parts: list[str] = []
    pen_down = False
    for x, y in samples:
        if y is None:
            pen_down = False
            continue
        px = x0 + x * PANEL_WIDTH
        py = (
            TOP + PANEL_HEIGHT - min(max(y / top, 0.0), 1.0) * PANEL_HEIGHT if top > 0 else TOP + PANEL_HEIGHT
        )
        parts.append(f"{'L' if pen_down else 'M'}{px:.1f} {py:.1f}")
        pen_down = True
    return " ".join(parts)


def _time_label(moment: datetime, zone: tzinfo) -> str:
    return moment.astimezone(zone).strftime("%m-%d %H:%M")


def gpu_timeline_svg(
    gpu: Mapping[str, Any],
    *,
    start: datetime,
    end: datetime,
    zone: tzinfo,
    events: Sequence[Mapping[str, Any]] = (),
    max_points: int = MAX_POINTS,
) -> Markup:
    """GPU's row (a GPU of `/v1/jobs/{id}/timeline`) over [START, END) as an <svg> element, each
    panel at most MAX_POINTS points."""
    points = gpu["points"]
    memory_total = gpu.get("memory_total_bytes")
    power_limit = gpu.get("power_limit_watts")
    memory_top = (memory_total or max((p["memory_used_bytes"] or 0 for p in points), default=0) or GIB) / GIB
    power_top = power_limit or max((p["power_watts"] or 0 for p in points), default=0) or 1.0
    panels: list[tuple[str, Callable[[Mapping[str, Any]], float | None], float, str]] = [
        (
            "utilisation",
            lambda p: None if p["util_share"] is None else float(p["util_share"]) * 100,
            100.0,
            "100 %",
        ),
        (
            "GPU memory",
            lambda p: None if p["memory_used_bytes"] is None else p["memory_used_bytes"] / GIB,
            float(memory_top),
            f"{memory_top:.0f} GiB",
        ),
        (
            "power",
            lambda p: None if p["power_watts"] is None else float(p["power_watts"]),
            float(power_top),
            f"{power_top:.0f} W",
        ),
    ]
    width = 3 * PANEL_WIDTH + 2 * GAP
    height = TOP + PANEL_HEIGHT + BOTTOM
    idle = bool(gpu.get("idle_gpu"))
    label = f"{gpu['gpu']}" + (
        f" — idle {100 * float(gpu['idle_share']):.0f} %"
        if idle and gpu.get("idle_share") is not None
        else ""
    )
    span = max((end - start).total_seconds(), 1.0)
    out = [
        f'<svg class="timeline{" idle" if idle else ""}" viewBox="0 0 {width} {height}" '
        f'width="{width}" height="{height}" role="img" aria-label="{escape(label)}">',
        f'<text x="0" y="11" class="{"gi" if idle else "g"}">{escape(label)}</text>',
    ]
    drawn = _slices(points, [value for _, value, _, _ in panels], start, end, max_points)
    for i, (title, _, top, top_text) in enumerate(panels):
        x0 = i * (PANEL_WIDTH + GAP)
        fill = "#fde8e8" if idle else "#f6f8fa"
        out.append(
            f'<rect x="{x0}" y="{TOP}" width="{PANEL_WIDTH}" height="{PANEL_HEIGHT}" fill="{fill}" stroke="#d0d7de"/>'
        )
        out.append(f'<text x="{x0}" y="{TOP - 4}" class="t">{escape(title)} (top {escape(top_text)})</text>')
        for e in events:
            ex = (
                x0
                + min(max((_instant(e["event_at"]) - start).total_seconds() / span, 0.0), 1.0) * PANEL_WIDTH
            )
            out.append(
                f'<line x1="{ex:.1f}" y1="{TOP}" x2="{ex:.1f}" y2="{TOP + PANEL_HEIGHT}" class="ev">'
                f"<title>{escape(e['event_kind'])} {escape(str(e['event_value']))}</title></line>"
            )
        d = _path(drawn[i], top, x0)
        if d:
            out.append(f'<path d="{d}" class="l{i}"/>')
        out.append(f'<text x="{x0}" y="{height - 3}" class="t">{escape(_time_label(start, zone))}</text>')
        out.append(
            f'<text x="{x0 + PANEL_WIDTH}" y="{height - 3}" class="t" text-anchor="end">'
            f"{escape(_time_label(end, zone))}</text>"
        )
    out.append("</svg>")
    return Markup("".join(out))
