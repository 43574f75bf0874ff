"""Calendar months of the site's zone as a measure of time: what monthly costs are multiplied
by (report cost) and what "per GPU-month" means (report capacity and report cost's
`useful_gpu_seconds_per_gpu_month`, one definition for both)."""

from __future__ import annotations

import calendar
from datetime import datetime, timedelta, tzinfo
from decimal import Decimal, localcontext

PRECISION = 50


def months_in(start: datetime, end: datetime, zone: tzinfo) -> Decimal:
    """[START, END) in calendar months of ZONE: for each month it touches, the seconds of the
    period in it / the month's seconds (a whole month is exactly 1, a 30-day month's day 1/30)."""
    if end <= start:
        return Decimal(0)
    total = Decimal(0)
    with localcontext() as ctx:
        ctx.prec = PRECISION
        local = start.astimezone(zone)
        month_start = local.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
        while month_start < end:
            days = calendar.monthrange(month_start.year, month_start.month)[1]
            next_month = (month_start.replace(day=1) + timedelta(days=days)).replace(tzinfo=zone)
            lo, hi = max(start, month_start), min(end, next_month)
            if hi > lo:
                total += exact_seconds(hi - lo) / exact_seconds(next_month - month_start)
            month_start = next_month
    return total


def exact_seconds(delta: timedelta) -> Decimal:
    # exact: datetime differences are whole microseconds
    return Decimal(delta.days * 86400 + delta.seconds) + Decimal(delta.microseconds).scaleb(-6)


def per_gpu_month(
    useful: Decimal, basis: Decimal, window_seconds: Decimal, months: Decimal
) -> Decimal | None:
    """Useful GPU-seconds one GPU of BASIS delivers in a calendar month, over a window of
    WINDOW_SECONDS that is MONTHS calendar months long (months_in): useful / basis × the window's
    seconds / its months, i.e. × the mean length of the months it covers (a window inside
    November gives November's 30 days). None when BASIS or MONTHS is 0."""
    if not basis or not months:
        return None
    with localcontext() as ctx:
        ctx.prec = PRECISION
        return Decimal(useful) / Decimal(basis) * window_seconds / months
