"""`report idle` on tests.factories.admin_day (2026-11-01), from the real attribution run.

Physical GPU-hours (the MIG job counts half). By account:
  physics  J1: 2 allocated, 2 covered, 1 busy, 1 idle of which 0.5 no process;
           105 (MIG): 0.5 allocated, 0.5 busy at 80 %; 104: 10 unmapped (gpu04 has no inventory)
  chem     102: 8 (4 whole_node without telemetry on gpu01, 4 unmapped on gpu02), 106: 1 unmapped
  bio      103: 2 + 1 unmapped
"""

from __future__ import annotations

from datetime import date
from typing import Any

from sqlalchemy import Engine

from slurmtel.access import EVERYTHING, NOTHING, Scope
from slurmtel.config import Config
from slurmtel.store.reports_idle import idle_report
from slurmtel.store.usage import JobFilter
from tests.factories import load_admin_day, with_hours

DAY = date(2026, 11, 1)
GROUP = ("allocated_gpu_hours", "covered_gpu_hours", "busy_gpu_hours", "idle_gpu_hours", "no_process_gpu_hours",
         "unmeasured_gpu_hours", "idle_share", "covered_share", "mean_util_share")  # fmt: skip


def report(engine: Engine, scope: Scope = EVERYTHING, **kwargs) -> dict[str, list[dict[str, Any]]]:
    with engine.connect() as conn:
        return with_hours(idle_report(conn, first_day=DAY, last_day=DAY, scope=scope, **kwargs))


def test_idle_busy_unmeasured_by_account(engine: Engine, config: Config) -> None:
    load_admin_day(engine, config)
    result = report(engine)
    by_account = {r["account"]: tuple(r[f] for f in GROUP) for r in result["by_account"]}
    assert by_account == {
        # mean util: (1 h x 80 % + 0.5 h x 80 %) / 2.5 covered hours
        "physics": (12.5, 2.5, 1.5, 1.0, 0.5, 10.0, 0.4, 0.2, 0.48),
        # nothing covered: no idle share to speak of, and unmeasured is not idle
        "bio": (3.0, 0.0, 0.0, 0.0, 0.0, 3.0, None, 0.0, None),
        "chem": (9.0, 0.0, 0.0, 0.0, 0.0, 9.0, None, 0.0, None),
    }
    assert [r["account"] for r in result["by_account"]] == ["physics", "bio", "chem"]
    for row in result["by_account"]:
        assert row["busy_gpu_hours"] + row["idle_gpu_hours"] == row["covered_gpu_hours"]
        assert row["covered_gpu_hours"] + row["unmeasured_gpu_hours"] == row["allocated_gpu_hours"]
    by_user = {
        r["user"]: (r["idle_gpu_hours"], r["idle_share"], r["mean_util_share"]) for r in result["by_user"]
    }
    assert by_user["alice"] == (1.0, 0.5, 0.4)
    assert by_user["erin"] == (0.0, 0.0, 0.8)
    (partition,) = result["by_partition"]
    assert tuple(partition[f] for f in GROUP) == (
        24.5,
        2.5,
        1.5,
        1.0,
        0.5,
        22.0,
        0.4,
        round(2.5 / 24.5, 4),
        0.48,
    )


def test_top_jobs_and_unmapped(engine: Engine, config: Config) -> None:
    load_admin_day(engine, config)
    result = report(engine)
    assert result["top_jobs"] == [
        {
            "cluster": "lab",
            "job_id": "101",
            "user": "alice",
            "account": "physics",
            "partition": "gpu",
            "state": "COMPLETED",
            "gpus": 1,
            "allocated_gpu_seconds": 7200,
            "allocated_gpu_hours": 2.0,
            "idle_gpu_seconds": 3600,
            "idle_gpu_hours": 1.0,
            "no_process_gpu_seconds": 1800,
            "no_process_gpu_hours": 0.5,
            "idle_share": 0.5,
            "covered_share": 1.0,
            "mean_util_share": 0.4,
        }
    ]
    assert [(u["account"], u["unmapped_gpu_hours"], u["unmapped_share"]) for u in result["unmapped"]] == [
        ("physics", 10.0, 0.8),
        ("chem", 5.0, round(5 / 9, 4)),
        ("bio", 3.0, 1.0),
    ]


def test_scope_and_filters(engine: Engine, config: Config) -> None:
    load_admin_day(engine, config)
    alice = report(engine, scope=Scope(users=frozenset({"alice"})))
    assert [r["user"] for r in alice["by_user"]] == ["alice"]
    assert alice["by_account"][0]["allocated_gpu_hours"] == 2.0  # only her own jobs of physics
    assert alice["unmapped"] == []
    coordinator = report(engine, scope=Scope(users=frozenset({"frank"}), accounts=frozenset({"physics"})))
    assert sorted(r["user"] for r in coordinator["by_user"]) == ["alice", "dave", "erin", "frank"]
    assert all(rows == [] for rows in report(engine, scope=NOTHING).values())
    assert report(engine, job_scope=NOTHING)["top_jobs"] == []
    assert [r["user"] for r in report(engine, job_filter=JobFilter(users=("bob",)))["by_user"]] == ["bob"]


def test_days_outside_the_rollup_are_empty(engine: Engine, config: Config) -> None:
    load_admin_day(engine, config)
    with engine.connect() as conn:
        result = idle_report(conn, first_day=date(2026, 11, 2), last_day=date(2026, 11, 30), scope=EVERYTHING)
    assert all(rows == [] for rows in result.values())
