from __future__ import annotations

from datetime import UTC, datetime
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
        ("midnight", UTC, utc(2026, 11, 16)),  # passed today -> tomorrow, like Slurm
        ("teatime", UTC, utc(2026, 11, 15, 16)),
        ("fika", UTC, utc(2026, 11, 15, 15)),
        ("14:00", UTC, utc(2026, 11, 15, 14)),
        ("2:00pm", UTC, utc(2026, 11, 15, 14)),
        ("10:00", UTC, utc(2026, 11, 16, 10)),
    ],
)
def test_sacct_time_forms(text: str, zone: ZoneInfo, expected: datetime) -> None:
    assert parse_slurm_time(text, now=NOW, zone=zone) == expected


@pytest.mark.parametrize(
    "text", ["", "yesterday-ish", "2026-13-01", "2026-02-30", "now-3fortnights", "25:00"]
)
def test_bad_times_are_rejected_with_the_text(text: str) -> None:
    with pytest.raises(ValueError):
        parse_slurm_time(text, now=NOW, zone=UTC)


def test_month_bounds_in_the_site_zone() -> None:
    assert month_bounds("2026-11", UTC) == (utc(2026, 11, 1), utc(2026, 12, 1))
    assert month_bounds("2026-12", BERLIN) == (utc(2026, 11, 30, 23), utc(2026, 12, 31, 23))
    with pytest.raises(ValueError):
        month_bounds("2026-13", UTC)
