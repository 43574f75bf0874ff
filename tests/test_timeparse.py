from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from slurmtel.timeparse import month_bounds, parse_slurm_time

NOW = datetime(2026, 11, 15, 13, 30, 0, tzinfo=UTC)
BERLIN = ZoneInfo("Europe/Berlin")


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


@pytest.mark.parametrize(
    ("text", "zone", "expected"),
    [
        ("2026-11-01", UTC, utc(2026, 11, 1)),
        ("2026-11-01T10:00:00", UTC, utc(2026, 11, 1, 10)),
        ("2026-11-01T10:00", UTC, utc(2026, 11, 1, 10)),
        ("2026-11-01T10:00:00", BERLIN, utc(2026, 11, 1, 9)),
        ("2026-07-01", BERLIN, utc(2026, 6, 30, 22)),  # summer time
        ("2026-11-01T10:00:00+02:00", UTC, utc(2026, 11, 1, 8)),
        ("2026-11-01T10:00:00Z", BERLIN, utc(2026, 11, 1, 10)),
        ("110126", UTC, utc(2026, 11, 1)),
        ("1101", UTC, utc(2026, 11, 1)),
        ("11/01/26", UTC, utc(2026, 11, 1)),
        ("11.01", UTC, utc(2026, 11, 1)),
        ("110126-10:30", UTC, utc(2026, 11, 1, 10, 30)),
        ("now", UTC, NOW),
        ("now-2hours", UTC, utc(2026, 11, 15, 11, 30)),
        ("now+30", UTC, utc(2026, 11, 15, 13, 30, 30)),
        ("now-1days", UTC, utc(2026, 11, 14, 13, 30)),
        ("now-1weeks", UTC, utc(2026, 11, 8, 13, 30)),
        ("today", UTC, utc(2026, 11, 15)),
        ("today", BERLIN, utc(2026, 11, 14, 23)),
        # sacct reads -S/-E in parse_time()'s "past" mode: a time of day alone is today's
        ("midnight", UTC, utc(2026, 11, 15)),
        ("midnight", BERLIN, utc(2026, 11, 14, 23)),
        ("noon", UTC, utc(2026, 11, 15, 12)),
        ("elevenses", UTC, utc(2026, 11, 15, 11)),
        ("teatime", UTC, utc(2026, 11, 15, 16)),
        ("fika", UTC, utc(2026, 11, 15, 15)),
        ("14:00", UTC, utc(2026, 11, 15, 14)),
        ("2:00pm", UTC, utc(2026, 11, 15, 14)),
        ("2:00 PM", UTC, utc(2026, 11, 15, 14)),
        ("12:00am", UTC, utc(2026, 11, 15, 0)),
        ("10:00", UTC, utc(2026, 11, 15, 10)),
        ("10:00:30", UTC, utc(2026, 11, 15, 10, 0, 30)),
        ("tomorrow", UTC, utc(2026, 11, 16)),
        ("today noon", UTC, utc(2026, 11, 15, 12)),
        ("tomorrow 10:00", UTC, utc(2026, 11, 16, 10)),
        ("NOW-2HOURS", UTC, utc(2026, 11, 15, 11, 30)),
        ("now-90minutes", UTC, utc(2026, 11, 15, 12)),
        ("now-1day", UTC, utc(2026, 11, 14, 13, 30)),
        ("now-45seconds", UTC, utc(2026, 11, 15, 13, 29, 15)),
        ("now - 2 hours", UTC, utc(2026, 11, 15, 11, 30)),
        ("now-2h", UTC, utc(2026, 11, 15, 11, 30)),
        ("now-10min", UTC, utc(2026, 11, 15, 13, 20)),
        # a month and day without a year: this year's, or last year's when the month is to come
        ("1201", UTC, utc(2025, 12, 1)),
        ("12/01", UTC, utc(2025, 12, 1)),
        ("11/15", UTC, utc(2026, 11, 15)),
        ("120125", UTC, utc(2025, 12, 1)),
        ("11/01/26-10:30:15", UTC, utc(2026, 11, 1, 10, 30, 15)),
        ("11.01.26", UTC, utc(2026, 11, 1)),
        ("2026-11-01T10:00:00.5+00:00", UTC, utc(2026, 11, 1, 10, 0, 0) + timedelta(microseconds=500000)),
        ("2026-11-01T10:00:00-05:00", BERLIN, utc(2026, 11, 1, 15)),
        ("uts1793880000", UTC, utc(2026, 11, 5, 12)),
        # Feb 29 without a year: this year's, normalised to Mar 1 in a year without one (Slurm)
        ("0229", UTC, utc(2026, 3, 1)),
        ("02/29", UTC, utc(2026, 3, 1)),
    ],
)
def test_sacct_time_forms(text: str, zone: ZoneInfo, expected: datetime) -> None:
    assert parse_slurm_time(text, now=NOW, zone=zone) == expected


@pytest.mark.parametrize(
    "text",
    [
        "",
        "yesterday-ish",
        "2026-13-01",
        "2026-02-30",
        "now-3fortnights",
        "25:00",
        "13:00pm",
        "10:61",
        "1301",
        "now+99999999999days",
        "9999-12-31T23:59:59",
        "1969-12-31",
        "uts99999999999999999999",
        "midnight!",
        # a four-digit year after MM/DD: Slurm refuses it; read as 11/01/20 then 26 it was Feb 6
        "11/01/2026",
        "11.01.2026",
        "1101202",
    ],
)
def test_bad_times_are_rejected_with_the_text(text: str) -> None:
    with pytest.raises(ValueError, match=re.escape(text) if text else "empty"):
        parse_slurm_time(text, now=NOW, zone=UTC)


def test_feb_29_without_a_year_in_a_leap_year_stays_feb_29() -> None:
    now = datetime(2028, 11, 15, tzinfo=UTC)
    assert parse_slurm_time("0229", now=now, zone=UTC) == utc(2028, 2, 29)
    # in January, February is still to come: last year's, Mar 1 2027
    assert parse_slurm_time("0229", now=datetime(2028, 1, 15, tzinfo=UTC), zone=UTC) == utc(2027, 3, 1)


def test_month_bounds_in_the_site_zone() -> None:
    assert month_bounds("2026-11", UTC) == (utc(2026, 11, 1), utc(2026, 12, 1))
    assert month_bounds("2026-12", BERLIN) == (utc(2026, 11, 30, 23), utc(2026, 12, 31, 23))
    with pytest.raises(ValueError):
        month_bounds("2026-13", UTC)
    with pytest.raises(ValueError, match="out of range"):
        month_bounds("9999-12", UTC)


def test_month_arithmetic_wraps_the_year_and_reads_the_site_zone() -> None:
    from datetime import UTC, date, datetime
    from zoneinfo import ZoneInfo

    from slurmtel.timeparse import month_first_day, month_of, next_month, previous_month

    assert month_first_day("2024-02") == date(2024, 2, 1)
    assert next_month("2024-12") == "2025-01" and next_month("2024-01") == "2024-02"
    assert previous_month("2025-01") == "2024-12" and previous_month("2024-03") == "2024-02"
    # 23:30 UTC on 31 January is already February in Berlin
    moment = datetime(2024, 1, 31, 23, 30, tzinfo=UTC)
    assert month_of(moment, UTC) == "2024-01"
    assert month_of(moment, ZoneInfo("Europe/Berlin")) == "2024-02"
