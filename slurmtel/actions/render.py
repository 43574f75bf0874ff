"""Messages from templates (Jinja2): a plain-text and an HTML form of each.

Templates are files named `<template>.txt` and `<template>.html` (the template names are the
keys of slurmtel.actions.figures.TEMPLATE_FIGURES); those in actions.templates_dir replace the
shipped ones (slurmtel/actions/templates/) of the same name. The text form's first line is
`Subject: ...`, then an empty line, then the body; the HTML form is the body only.

The HTML environment escapes every value (autoescape): a job name is user input. Both forms
undefined names fail (StrictUndefined), so a site template with a typo fails when it is first
rendered, in `slurmtel act --dry-run`, not silently in a user's mailbox. Every value a message
shows is one of the declared figures (slurmtel.actions.figures), printed by the filters below:
the one place that turns seconds, bytes, shares and money into text.

Job names and other user-given text are passed with their control characters shown as `\\xNN`
(as `slurmtel job` prints them); a subject is one line whatever it holds.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, tzinfo
from decimal import Decimal
from functools import lru_cache
from pathlib import Path
from typing import Any

SHIPPED = Path(__file__).parent / "templates"
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
MAX_SUBJECT = 200


@dataclass(frozen=True)
class Message:
    title: str
    text: str
    html: str


def one_line(value: str, limit: int = MAX_SUBJECT) -> str:
    """VALUE as one header-safe line: control characters (CR and LF among them) become spaces."""
    line = " ".join(_CONTROL.sub(" ", value).split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


def duration(seconds: Any) -> str:
    """1 h 05 min, 12 min, 40 s; '-' for none."""
    if seconds is None:
        return "-"
    total = round(float(seconds))
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days} d {hours} h {minutes:02d} min"
    if hours:
        return f"{hours} h {minutes:02d} min"
    if minutes:
        return f"{minutes} min"
    return f"{secs} s"


def gib(value: Any) -> str:
    return "-" if value is None else f"{float(value) / 2**30:.1f} GiB"


def share(value: Any) -> str:
    return "-" if value is None else f"{float(value) * 100:.0f} %"


def percent(value: Any) -> str:
    return "-" if value is None else f"{float(value):.1f} %"


def number(value: Any, digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, int):
        return str(value)
    return f"{float(value):.{digits}f}"


def money(value: Any, currency: str = "") -> str:
    if value is None:
        return "not priced (no rate)"
    return f"{Decimal(str(value)):,} {currency}".strip()


def gpu_hours(seconds: Any) -> str:
    """GPU time (registered in seconds) as GPU-hours, the unit budgets are set in."""
    return "-" if seconds is None else f"{float(seconds) / 3600:,.1f} GPU-hours"


def energy(joules: Any) -> str:
    if joules is None:
        return "-"
    wh = float(joules) / 3600
    return f"{wh / 1000:.2f} kWh" if wh >= 1000 else f"{wh:.1f} Wh"


class Renderer:
    """The site's templates over the shipped ones, rendered in ZONE."""

    def __init__(self, templates_dir: str, zone: tzinfo) -> None:
        self.zone = zone
        self.text_env, self.html_env = _environments(templates_dir)
        for env in (self.text_env, self.html_env):
            env.filters.update(
                duration=duration,
                gib=gib,
                share=share,
                percent=percent,
                number=number,
                money=money,
                energy=energy,
                gpu_hours=gpu_hours,
                when=self.when,
                controls=safe_text,
            )

    def when(self, moment: Any) -> str:
        if not isinstance(moment, datetime):
            return "-" if moment is None else str(moment)
        return moment.astimezone(self.zone).strftime("%Y-%m-%d %H:%M %Z")

    def render(self, template: str, context: Mapping[str, Any]) -> Message:
        text = self.text_env.get_template(f"{template}.txt").render(**context)
        head, sep, body = text.partition("\n\n")
        if not sep or not head.startswith("Subject:"):
            raise ValueError(f"template {template}.txt must start with 'Subject: ...' and an empty line")
        html = self.html_env.get_template(f"{template}.html").render(**context)
        return Message(one_line(head.removeprefix("Subject:")), body.strip() + "\n", html)


@lru_cache(maxsize=8)
def _environments(templates_dir: str) -> tuple[Any, Any]:
    import jinja2

    paths = [templates_dir, str(SHIPPED)] if templates_dir else [str(SHIPPED)]
    common: dict[str, Any] = {
        "loader": jinja2.FileSystemLoader(paths),
        "undefined": jinja2.StrictUndefined,
        "trim_blocks": True,
        "lstrip_blocks": True,
        "keep_trailing_newline": True,
    }
    return jinja2.Environment(autoescape=False, **common), jinja2.Environment(autoescape=True, **common)


def safe_text(value: Any) -> str:
    """User-given text with its control characters shown as \\xNN (tabs and newlines too)."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", str(value))
