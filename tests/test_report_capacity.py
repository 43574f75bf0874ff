"""`report capacity` on tests.factories.admin_day: where the 169 installed GPU-hours went.

By hand (GPU-hours, see test_report_taxonomy for the per-node arithmetic):
  useful 1.5 (J1 active 1 + the MIG job's 0.5; 103's completed retry is unmeasured)
  failed 16 (102: 8, 103's first attempt: 2, 104: 6 after fitting into gpu04's available time)
  allocated_idle 0.5, allocated_no_process 0.5 (J1), unmeasured 2 (103's retry 1, 106 1)
  active_not_completed 0, unallocated 64.5 + 18 = 82.5, unavailable 42 + 24 = 66
  retry 2 (103's requeued first attempt)
"""

from __future__ import annotations

import math
from datetime import date
from decimal import Decimal
from typing import Any

from sqlalchemy import Engine

from slurmtel.access import EVERYTHING, Scope
from slurmtel.config import Config
from slurmtel.store.reports_taxonomy import CAPACITY_CATEGORIES, capacity_report, gpus_installed_now
from slurmtel.store.usage import JobFilter
from tests.factories import at, load_admin_day

NOW = at("2026-12-02T14:00:00")
DAY = date(2026, 11, 1)


def report(engine: Engine, scope: Scope = EVERYTHING, **kwargs) -> dict[str, list[dict[str, Any]]]:
    with engine.connect() as conn:
        return capacity_report(
            conn, first_day=DAY, last_day=DAY, now=NOW, timezone="UTC", scope=scope, **kwargs
        )


def test_breakdown_adds_up_to_installed(engine: Engine, config: Config) -> None:
    load_admin_day(engine, config)
    result = report(engine, target_gpu_hours=1000)
    breakdown = {r["category"]: r["gpu_hours"] for r in result["breakdown"]}
    assert list(breakdown) == list(CAPACITY_CATEGORIES)
    assert breakdown == {
        "useful": Decimal("1.5000"),
        "failed": Decimal("16.0000"),
        "allocated_idle": Decimal("0.5000"),
        "allocated_no_process": Decimal("0.5000"),
        "unmeasured": Decimal("2.0000"),
        "active_not_completed": Decimal("0.0000"),
        "unallocated": Decimal("82.5000"),
        "unavailable": Decimal("66.0000"),
    }
    (summary,) = result["summary"]
    assert sum(breakdown.values(), Decimal(0)) == summary["installed_gpu_hours"] == Decimal("169.0000")
    assert {r["category"]: r["share"] for r in result["breakdown"]}["unavailable"] == round(66 / 169, 4)


def test_useful_work_per_gpu_month_and_required_gpus(engine: Engine, config: Config) -> None:
    load_admin_day(engine, config)
    (summary,) = report(engine, target_gpu_hours=1000)["summary"]
    per_gpu_month = 1.5 / 169 * 720
    assert summary["useful_share"] == round(1.5 / 169, 4)
    assert summary["useful_work_per_gpu_month"] == round(per_gpu_month, 2) == 6.39
    assert summary["required_gpus"] == round(1000 / per_gpu_month, 2) == 156.48
    # every node was in the last poll: 2 + 2 + 1 + 1 + 1 GPUs; gpu02 is down, gpu03 drained
    assert (summary["gpus_installed_now"], summary["gpus_available_now"]) == (7, 4)
    assert summary["additional_gpus_needed"] == math.ceil(1000 / per_gpu_month) - 7 == 150
    assert summary["retry_gpu_hours"] == Decimal("2.0000")
    assert summary["failed_gpu_hours"] == Decimal("16.0000")
    assert summary["capacity_unknown_gpu_hours"] == Decimal("1.0000")
    assert summary["average_gpus_installed"] == round(169 / 24, 2)


def test_without_a_target_there_is_no_requirement(engine: Engine, config: Config) -> None:
    load_admin_day(engine, config)
    (summary,) = report(engine)["summary"]
    assert (summary["required_gpus"], summary["additional_gpus_needed"]) == (None, None)
    assert summary["useful_work_per_gpu_month"] == 6.39


def test_partition_filter_and_gpus_now(engine: Engine, config: Config) -> None:
    load_admin_day(engine, config)
    debug = report(engine, job_filter=JobFilter(partitions=("debug",)))
    breakdown = {r["category"]: r["gpu_hours"] for r in debug["breakdown"]}
    assert (breakdown["unavailable"], breakdown["unallocated"], breakdown["useful"]) == (
        Decimal("24.0000"),
        Decimal("18.0000"),
        Decimal("0.0000"),
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
