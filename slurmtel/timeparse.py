"""Times the way Slurm's commands read them (-S/-E), as pure functions of (text, now, zone).

`sacct` reads -S/-E with Slurm's parse_time() in its "past" mode: a time of day without a date
is today's (`midnight` is the midnight that began today, `noon` today's noon even before noon),
and a month and day without a year is this year's unless that month is still to come, then
last year's. The same words and forms are accepted here with the same meaning, plus ISO 8601
with an explicit offset (`2026-11-01T10:00:00+01:00`, `...Z`), which sacct does not know.
"""

from __future__ import annotations

import re
from calendar import isleap
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
# the years a time may fall in: datetime's own range, with room for a day's arithmetic
_EARLIEST = datetime(1970, 1, 1, tzinfo=UTC)
_LATEST = datetime(9999, 1, 1, tzinfo=UTC)

# one piece of a Slurm time; pieces are separated by blanks, "-" or "T" as in parse_time()
_TOKEN = re.compile(
    r"""
      (?P<now>now)(?:\s*(?P<sign>[+-])\s*(?P<count>\d+)\s*(?P<unit>[a-z]*))?
    | (?P<word>today|tomorrow|midnight|noon|elevenses|fika|teatime)
    | (?P<uts>uts)(?P<epoch>\d+)
    | (?P<year>\d{4})-(?P<ymonth>\d{1,2})-(?P<yday>\d{1,2})
    | (?P<hh>\d{1,2}):(?P<mm>\d{2})(?::(?P<ss>\d{2}))?(?:\s*(?P<half>am|pm))?
    | (?P<month>\d{1,2})(?P<sep>[./]?)(?P<day>\d{1,2})(?:(?P=sep)(?P<yy>\d{2}))?(?!\d)
    """,
    re.VERBOSE,
)
# "T" only before a digit: "today", "tomorrow" and "teatime" begin with a t too
_SEPARATORS = re.compile(r"(?:\s|-|t(?=\d))*")
_OFFSET = re.compile(r".*(?:z|[+-]\d{2}:?\d{2})$")


def parse_slurm_time(value: str, *, now: datetime, zone: tzinfo) -> datetime:
    """Parse a sacct/sreport time in ZONE, relative to NOW; return an aware UTC datetime.

    Accepts YYYY-MM-DD[THH:MM[:SS]], MMDD[YY], MM/DD[/YY], MM.DD[.YY] (each optionally followed
    by -HH:MM[:SS]), HH:MM[:SS] [AM|PM], now[{+|-}N[seconds|minutes|hours|days|weeks]] (and the
    short units s, min, h, d, w), today, tomorrow, midnight, noon, elevenses, fika, teatime,
    combinations such as "today 10:00" or "tomorrow noon", uts<epoch seconds>, and ISO 8601
    with an explicit offset. Raises ValueError with the text for anything else, and for a time
    outside 1970 .. 9998.
    """
    text = value.strip().lower()
    if not text:
        raise ValueError("empty time")
    if _OFFSET.match(text) and (aware := _iso_with_offset(value)) is not None:
        return _checked(aware.astimezone(UTC), value)
    local_now = now.astimezone(zone)
    day: date | None = None
    clock: time | None = None
    # "now[+-N]" alone is an exact instant, not a wall-clock time to convert back
    instant: datetime | None = None
    year_given = True
    pos = 0
    while True:
        pos = _SEPARATORS.match(text, pos).end()  # type: ignore[union-attr]
        if pos >= len(text):
            break
        m = _TOKEN.match(text, pos)
        if m is None:
            raise ValueError(
                f"cannot read time '{value}' at '{value.strip()[pos:]}' (try 2026-11-01 or now-2hours)"
            )
        pos = m.end()
        if m["now"]:
            instant = _now_plus(now, m["sign"], m["count"], m["unit"], value)
            moment = instant.astimezone(zone)
            day, clock = moment.date(), moment.time()
        elif word := m["word"]:
            if word == "today":
                day = local_now.date()
            elif word == "tomorrow":
                day = (local_now + timedelta(days=1)).date()
            else:
                clock = _NAMED[word]
        elif m["uts"]:
            return _checked(_from_epoch(m["epoch"], value), value)
        elif m["year"]:
            day = _date(int(m["year"]), int(m["ymonth"]), int(m["yday"]), value)
        elif m["hh"] is not None:
            clock = _clock(m["hh"], m["mm"], m["ss"], m["half"], value)
        else:
            year_given = m["yy"] is not None
            year = 2000 + int(m["yy"]) if year_given else local_now.year
            day = _date(year, int(m["month"]), int(m["day"]), value, leap_year_ok=not year_given)
    if instant is not None and (day, clock) == _local_parts(instant, zone):
        return _checked(instant.astimezone(UTC), value)
    if day is None and clock is None:
        raise ValueError(f"cannot read time '{value}'")
    if day is None:
        # "past" mode: a time of day alone is today's, even one still to come
        day = local_now.date()
    elif not year_given:
        # this year's, or last year's when the month is still to come; Feb 29 of a year without
        # one is Mar 1, as Slurm's mktime() normalises it
        year = local_now.year - (day.month > local_now.month)
        leap_day_lost = (day.month, day.day) == (2, 29) and not isleap(year)
        day = date(year, 3, 1) if leap_day_lost else day.replace(year=year)
    return _checked(_at(day, clock or time(0), zone), value)


def _local_parts(at: datetime, zone: tzinfo) -> tuple[date, time]:
    local = at.astimezone(zone)
    return local.date(), local.time()


def _now_plus(now: datetime, sign: str | None, count: str | None, unit: str | None, value: str) -> datetime:
    if sign is None:
        return now
    if unit not in _UNITS:
        raise ValueError(f"unknown time unit '{unit}' in '{value}' (seconds, minutes, hours, days, weeks)")
    seconds = int(count or 0) * _UNITS[unit]
    try:
        delta = timedelta(seconds=seconds)
        return now + delta if sign == "+" else now - delta
    except OverflowError:
        raise ValueError(f"time '{value}' is out of range") from None


def _iso_with_offset(value: str) -> datetime | None:
    try:
        parsed = datetime.fromisoformat(value.strip().replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo is not None else None


def _from_epoch(digits: str, value: str) -> datetime:
    try:
        return datetime.fromtimestamp(int(digits), UTC)
    except (OverflowError, OSError, ValueError):
        raise ValueError(f"time '{value}' is out of range") from None


def _date(year: int, month: int, day: int, value: str, *, leap_year_ok: bool = False) -> date:
    try:
        return date(year, month, day)
    except ValueError as exc:
        if leap_year_ok and (month, day) == (2, 29):
            # 02/29 without a year: the year is decided later (this or last year)
            return date(2024, 2, 29)
        raise ValueError(f"invalid date '{value}': {exc}") from None


def _clock(hh: str, mm: str, ss: str | None, half: str | None, value: str) -> time:
    hour = int(hh)
    if half:
        if not 1 <= hour <= 12:
            raise ValueError(f"invalid hour in '{value}'")
        hour = hour % 12 + (12 if half == "pm" else 0)
    try:
        return time(hour, int(mm), int(ss or 0))
    except ValueError:
        raise ValueError(f"invalid time of day in '{value}'") from None


def _at(day: date, clock: time, zone: tzinfo) -> datetime:
    return datetime.combine(day, clock, zone).astimezone(UTC)


def _checked(at: datetime, value: str) -> datetime:
    if not _EARLIEST <= at < _LATEST:
        raise ValueError(f"time '{value}' is out of range (1970 .. 9998)")
    return at


def month_bounds(month: str, zone: tzinfo) -> tuple[datetime, datetime]:
    """'2026-11' -> the month's start and end in ZONE, as UTC datetimes."""
    m = re.fullmatch(r"(\d{4})-(\d{2})", month.strip())
    if not m or not 1 <= int(m.group(2)) <= 12:
        raise ValueError(f"month must be YYYY-MM, not '{month}'")
    year, mon = int(m.group(1)), int(m.group(2))
    if not 1970 <= year <= 9998:
        raise ValueError(f"month '{month}' is out of range (1970 .. 9998)")
    start = datetime(year, mon, 1, tzinfo=zone)
    end = datetime(year + (mon == 12), mon % 12 + 1, 1, tzinfo=zone)
    return start.astimezone(UTC), end.astimezone(UTC)


# --- calendar months, as YYYY-MM ---------------------------------------------------------------


def month_first_day(month: str) -> date:
    year, mon = month.split("-")
    return date(int(year), int(mon), 1)


def next_month(month: str) -> str:
    first = month_first_day(month)
    return f"{first.year + (first.month == 12):04d}-{first.month % 12 + 1:02d}"


def previous_month(month: str) -> str:
    first = month_first_day(month)
    return f"{first.year - (first.month == 1):04d}-{(first.month - 2) % 12 + 1:02d}"


def month_of(moment: datetime, zone: tzinfo) -> str:
    """The month MOMENT falls in, in ZONE (the site's time zone)."""
    local = moment.astimezone(zone)
    return f"{local.year:04d}-{local.month:02d}"


def report_window(
    start: str | None, end: str | None, *, now: datetime, zone: tzinfo
) -> tuple[datetime, datetime]:
    """A report's window from -S/-E as typed (sacct forms, read in ZONE): by default from the
    start of NOW's month in ZONE to NOW. ValueError for a form Slurm refuses or an empty window."""
    if start:
        begin = parse_slurm_time(start, now=now, zone=zone)
    else:
        local = now.astimezone(zone)
        begin = local.replace(day=1, hour=0, minute=0, second=0, microsecond=0).astimezone(now.tzinfo)
    finish = parse_slurm_time(end, now=now, zone=zone) if end else now
    if finish <= begin:
        raise ValueError(f"empty window: -E {finish.isoformat()} is not after -S {begin.isoformat()}")
    return begin, finish
