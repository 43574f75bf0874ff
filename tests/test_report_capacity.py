"""`report capacity` on tests.factories.admin_day: where the 169 installed GPU-hours went.

By hand (GPU-hours, see test_report_taxonomy for the per-node arithmetic): the taxonomy's
parts over the day, active split by outcome:
  useful 1.5 (J1 active 1 + the MIG job's 0.5; 103's completed retry is unmeasured)
  active_failed 0, active_other 0
  allocated_idle 0.5, allocated_no_process 0.5 (J1), unmeasured 2 + 16 (103's retry 1, 106 1;
  the failed 102: 8, 103's first attempt: 2, 104: 6 after fitting into gpu04's available time)
  unallocated 64.5 + 18 = 82.5, unavailable 42 + 24 = 66
  failed 16 (overlapping: all of it unmeasured), retry 2 (103's requeued first attempt)
"""

from __future__ import annotations

import math
from datetime import date
from decimal import Decimal
from typing import Any

from sqlalchemy import Engine

from slurmtel.access import EVERYTHING, Scope
from slurmtel.config import Config
from slurmtel.store.reports_taxonomy import (
    CAPACITY_CATEGORIES,
    capacity_report,
    gpus_installed_now,
    taxonomy_report,
)
from slurmtel.store.usage import JobFilter
from tests.factories import at, load_admin_day, with_hours

NOW = at("2026-12-02T14:00:00")
DAY = date(2026, 11, 1)


def report(engine: Engine, scope: Scope = EVERYTHING, **kwargs) -> dict[str, list[dict[str, Any]]]:
    with engine.connect() as conn:
        return with_hours(
            capacity_report(conn, first_day=DAY, last_day=DAY, now=NOW, timezone="UTC", scope=scope, **kwargs)
        )


def test_breakdown_adds_up_to_installed(engine: Engine, config: Config) -> None:
    load_admin_day(engine, config)
    result = report(engine, target_gpu_hours=1000)
    breakdown = {r["category"]: r["category_gpu_seconds"] for r in result["breakdown"]}
    assert list(breakdown) == list(CAPACITY_CATEGORIES)
    assert breakdown == {
        "unavailable": 66 * 3600,
        "unallocated": Decimal("82.5") * 3600,
        "allocated_no_process": 1800,
        "allocated_idle": 1800,
        "unmeasured": 18 * 3600,
        "useful": Decimal("1.5") * 3600,
        "active_failed": 0,
        "active_other": 0,
    }
    (summary,) = result["summary"]
    assert sum(breakdown.values(), Decimal(0)) == summary["installed_gpu_seconds"] == 169 * 3600
    assert {r["category"]: r["category_share"] for r in result["breakdown"]}["unavailable"] == round(
        66 / 169, 4
    )


def test_breakdown_is_the_taxonomy_over_the_same_days(engine: Engine, config: Config) -> None:
    """One definition: capacity's unavailable, unallocated, idle, no-process and unmeasured are
    the taxonomy's sums over the same days and partitions, and useful + active_failed +
    active_other is its active."""
    load_admin_day(engine, config)
    breakdown = {r["category"]: r["category_gpu_seconds"] for r in report(engine)["breakdown"]}
    with engine.connect() as conn:
        rows = taxonomy_report(conn, first_day=DAY, last_day=DAY, now=NOW, timezone="UTC", scope=EVERYTHING)
    for part in ("unavailable", "unallocated", "allocated_no_process", "allocated_idle", "unmeasured"):
        assert breakdown[part] == sum(r[f"{part}_gpu_seconds"] for r in rows), part
    active = sum(r["active_gpu_seconds"] for r in rows)
    assert breakdown["useful"] + breakdown["active_failed"] + breakdown["active_other"] == active


def test_useful_work_per_gpu_month_and_required_gpus(engine: Engine, config: Config) -> None:
    load_admin_day(engine, config)
    (summary,) = report(engine, target_gpu_hours=1000)["summary"]
    # November has 30 days: the day's useful share x 720 h
    per_gpu_month = 1.5 / 169 * 720
    assert summary["useful_share"] == round(1.5 / 169, 4)
    assert summary["useful_gpu_hours_per_gpu_month"] == round(per_gpu_month, 4) == 6.3905
    assert summary["target_gpu_seconds_per_month"] == 1000 * 3600
    assert summary["required_gpus"] == round(1000 / per_gpu_month, 2) == 156.48
    # every node was in the last poll: 2 + 2 + 1 + 1 + 1 GPUs; gpu02 is down, gpu03 drained
    assert (summary["gpus_installed_now"], summary["gpus_available_now"]) == (7, 4)
    assert summary["additional_gpus_needed"] == math.ceil(1000 / per_gpu_month) - 7 == 150
    assert summary["retry_gpu_seconds"] == 2 * 3600
    assert summary["failed_gpu_seconds"] == 16 * 3600
    assert summary["capacity_unknown_gpu_seconds"] == 3600
    assert summary["average_gpus_installed"] == round(169 / 24, 2)


def test_without_a_target_there_is_no_requirement(engine: Engine, config: Config) -> None:
    load_admin_day(engine, config)
    (summary,) = report(engine)["summary"]
    assert (summary["required_gpus"], summary["additional_gpus_needed"]) == (None, None)
    assert summary["useful_gpu_hours_per_gpu_month"] == 6.3905


def test_partition_filter_and_gpus_now(engine: Engine, config: Config) -> None:
    load_admin_day(engine, config)
    debug = report(engine, job_filter=JobFilter(partitions=("debug",)))
    breakdown = {r["category"]: r["category_gpu_seconds"] for r in debug["breakdown"]}
    assert (breakdown["unavailable"], breakdown["unallocated"], breakdown["useful"]) == (
        24 * 3600,
        18 * 3600,
        0,
    )
    # gpu02 is in debug (and gpu), down now
    assert debug["summary"][0]["gpus_installed_now"] == 2
    with engine.connect() as conn:
        assert gpus_installed_now(conn) == {"lab": (7, 4)}
        assert gpus_installed_now(conn, job_filter=JobFilter(clusters=("other",))) == {}


def test_only_a_scope_over_everything_sees_capacity(engine: Engine, config: Config) -> None:
    load_admin_day(engine, config)
    empty: dict[str, list[dict[str, Any]]] = {"summary": [], "breakdown": []}
    assert report(engine, scope=Scope(users=frozenset({"alice"}))) == empty
    assert report(engine, scope=Scope(accounts=frozenset({"physics"}))) == empty
    assert report(engine, scope=Scope()) == empty
