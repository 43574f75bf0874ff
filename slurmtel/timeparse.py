"""Times the way Slurm's commands read them (-S/-E), as pure functions of (text, now, zone)."""

from __future__ import annotations

import re
from datetime import UTC, date, datetime, time, timedelta, tzinfo

_NAMED = {"midnight": time(0), "noon": time(12), "elevenses": time(11), "fika": time(15), "teatime": time(16)}
_UNITS = {
    "": 1,
    "s": 1,
    "sec": 1,
    "secs": 1,
    "second": 1,
    "seconds": 1,
    "m": 60,
    "min": 60,
    "mins": 60,
    "minute": 60,
    "minutes": 60,
    "h": 3600,
    "hour": 3600,
    "hours": 3600,
    "d": 86400,
    "day": 86400,
    "days": 86400,
    "w": 604800,
    "week": 604800,
    "weeks": 604800,
}
_NOW = re.compile(r"now(?:([+-])(\d+)([a-z]*))?$")
_CLOCK = re.compile(r"(\d{1,2}):(\d{2})(?::(\d{2}))?\s*(am|pm)?$")
_ISO = re.compile(r"(\d{4})-(\d{2})-(\d{2})(?:[t ](\d{2}):(\d{2})(?::(\d{2}))?)?$")
_MDY = re.compile(r"(\d{2})([./]?)(\d{2})(?:\2(\d{2}))?(?:-(\d{2}):(\d{2})(?::(\d{2}))?)?$")


def parse_slurm_time(value: str, *, now: datetime, zone: tzinfo) -> datetime:
    """Parse a sacct/sreport time in ZONE, relative to NOW; return an aware UTC datetime.

    Accepts YYYY-MM-DD[THH:MM[:SS]], MMDD[YY][-HH:MM[:SS]], MM/DD[/YY], MM.DD[.YY],
    HH:MM[:SS][AM|PM], now[+-N[units]], today, midnight, noon, elevenses, fika, teatime,
    and ISO 8601 with an explicit offset (2026-11-01T00:00:00+01:00, ...Z).
    """
    text = value.strip().lower()
    if not text:
        raise ValueError("empty time")
    local_now = now.astimezone(zone)
    if m := _NOW.match(text):
        sign, count, unit = m.groups()
        if sign is None:
            return now.astimezone(UTC)
        if unit not in _UNITS:
            raise ValueError(f"unknown time unit '{unit}' in '{value}'")
        delta = timedelta(seconds=int(count) * _UNITS[unit])
        return (now + delta if sign == "+" else now - delta).astimezone(UTC)
    if text == "today":
        return _at(local_now.date(), time(0), zone)
    if text in _NAMED:
        day = local_now.date()
        # like Slurm: a named hour that has passed today means tomorrow
        if datetime.combine(day, _NAMED[text], zone) <= local_now:
            day += timedelta(days=1)
        return _at(day, _NAMED[text], zone)
    if m := _ISO.match(text):
        y, mo, d, hh, mm, ss = m.groups()
        return _at(_date(int(y), int(mo), int(d), value), _time(hh, mm, ss, value), zone)
    if text.endswith("z") or re.search(r"[+-]\d{2}:?\d{2}$", text):
        try:
            parsed = datetime.fromisoformat(value.strip().replace("Z", "+00:00").replace("z", "+00:00"))
        except ValueError:
            pass
        else:
            if parsed.tzinfo is not None:
                return parsed.astimezone(UTC)
    if m := _CLOCK.match(text):
        hh, mm, ss, half = m.groups()
        hour = int(hh)
        if half:
            if not 1 <= hour <= 12:
                raise ValueError(f"invalid hour in '{value}'")
            hour = hour % 12 + (12 if half == "pm" else 0)
        clock = _time(str(hour), mm, ss, value)
        day = local_now.date()
        if datetime.combine(day, clock, zone) <= local_now:
            day += timedelta(days=1)
        return _at(day, clock, zone)
    if m := _MDY.match(text):
        mo, _sep, d, yy, hh, mm, ss = m.groups()
        year = 2000 + int(yy) if yy else local_now.year
        return _at(_date(year, int(mo), int(d), value), _time(hh, mm, ss, value), zone)
    raise ValueError(f"cannot read time '{value}' (try 2026-11-01 or 2026-11-01T10:00:00)")


def _date(year: int, month: int, day: int, value: str) -> date:
    try:
        return date(year, month, day)
    except ValueError as exc:
        raise ValueError(f"invalid date '{value}': {exc}") from None


def _time(hh: str | None, mm: str | None, ss: str | None, value: str) -> time:
    try:
        return time(int(hh or 0), int(mm or 0), int(ss or 0))
    except ValueError:
        raise ValueError(f"invalid time of day in '{value}'") from None


def _at(day: date, clock: time, zone: tzinfo) -> datetime:
    return datetime.combine(day, clock, zone).astimezone(UTC)


def month_bounds(month: str, zone: tzinfo) -> tuple[datetime, datetime]:
    """'2026-11' -> the month's start and end in ZONE, as UTC datetimes."""
    m = re.fullmatch(r"(\d{4})-(\d{2})", month.strip())
    if not m or not 1 <= int(m.group(2)) <= 12:
        raise ValueError(f"month must be YYYY-MM, not '{month}'")
    year, mon = int(m.group(1)), int(m.group(2))
    start = datetime(year, mon, 1, tzinfo=zone)
    end = datetime(year + (mon == 12), mon % 12 + 1, 1, tzinfo=zone)
    return start.astimezone(UTC), end.astimezone(UTC)
