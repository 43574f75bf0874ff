"""`report queue` on tests.factories.admin_day.

Waits (start - eligible) of the attempts that started on 2026-11-01, in seconds:
  physics 101: 120 (eligible 23:58 the day before), 104: 600, 105: 0
  chem    102: 3600, 106: 3600
  bio     103: 3600, then 7170 (requeued 12:00:30, started 14:00)
Pending in the last snapshot (23:59): 202 AssocGrpGRES (physics, 4 GPUs, eligible 20:00),
203 QOSMaxGRESPerUser (chem, 2, 22:00), 204 Resources (bio, 8, 23:00), 205 Priority on debug
(physics, 1, 23:30), 206 Resources (physics, 2, 23:29). 201 was seen only at 22:00: not pending now.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Engine

from slurmtel.access import EVERYTHING, NOTHING, Scope
from slurmtel.config import Config
from slurmtel.store.reports_queue import is_quota_reason, queue_report
from slurmtel.store.usage import JobFilter, usage_report
from tests.factories import at, load_admin_day

START, END, NOW = at("2026-11-01T00:00:00"), at("2026-11-02T00:00:00"), at("2026-12-02T14:00:00")
WAIT = (
    "queue_wait_count",
    "queue_wait_p50_seconds",
    "queue_wait_p95_seconds",
    "queue_wait_max_seconds",
    "queue_wait_mean_seconds",
)


def report(engine: Engine, scope: Scope = EVERYTHING, **kwargs) -> dict[str, list[dict[str, Any]]]:
    with engine.connect() as conn:
        return queue_report(conn, start=START, end=END, now=NOW, scope=scope, **kwargs)


def test_wait_percentiles_by_partition_and_account(engine: Engine, config: Config) -> None:
    load_admin_day(engine, config)
    result = report(engine)
    # sorted: 0 120 600 3600 3600 3600 7170; p95 at rank 5.7: 3600 + 0.7 x 3570
    assert [tuple(r[f] for f in ("partition", *WAIT)) for r in result["wait_by_partition"]] == [
        ("gpu", 7, 3600.0, 6099.0, 7170.0, 2670.0)
    ]
    assert {r["account"]: tuple(r[f] for f in WAIT) for r in result["wait_by_account"]} == {
        "bio": (2, 5385.0, 6991.5, 7170.0, 5385.0),
        "chem": (2, 3600.0, 3600.0, 3600.0, 3600.0),
        "physics": (3, 120.0, 552.0, 600.0, 240.0),
    }


def test_waits_agree_with_report_usage(engine: Engine, config: Config) -> None:
    load_admin_day(engine, config)
    result = report(engine)
    for by, section in (("partition", "wait_by_partition"), ("account", "wait_by_account")):
        with engine.connect() as conn:
            usage = usage_report(conn, start=START, end=END, now=NOW, by=by, scope=EVERYTHING)
        assert {
            u[by]: (u["queue_wait_count"], u["queue_wait_p50_seconds"], u["queue_wait_p95_seconds"],
                    u["queue_wait_max_seconds"])
            for u in usage
        } == {
            q[by]: (q["queue_wait_count"], q["queue_wait_p50_seconds"], q["queue_wait_p95_seconds"], q["queue_wait_max_seconds"]) for q in result[section]
        }  # fmt: skip


def test_pending_now_by_reason_with_quota_refusals_apart(engine: Engine, config: Config) -> None:
    load_admin_day(engine, config)
    result = report(engine)
    snapshot = datetime.fromisoformat("2026-11-01T23:59:00+00:00")
    assert result["pending"] == [
        {"cluster": "lab", "partition": "gpu", "reason": "Resources", "jobs": 2, "users": 2, "gpus_requested": 10,
         "oldest_pending_seconds": 3540.0, "mean_pending_seconds": 2670.0, "observed_at": snapshot},
        {"cluster": "lab", "partition": "debug", "reason": "Priority", "jobs": 1, "users": 1, "gpus_requested": 1,
         "oldest_pending_seconds": 1740.0, "mean_pending_seconds": 1740.0, "observed_at": snapshot},
    ]  # fmt: skip
    assert [(q["account"], q["reason"], q["jobs"], q["gpus_requested"], q["oldest_pending_seconds"])
            for q in result["quota"]] == [
        ("physics", "AssocGrpGRES", 1, 4, 14340.0),
        ("chem", "QOSMaxGRESPerUser", 1, 2, 7140.0),
    ]  # fmt: skip


def test_quota_reasons() -> None:
    for reason in (
        "AssocGrpGRES",
        "AssocGrpGRESRunMinutes",
        "AssocMaxJobsLimit",
        "QOSGrpGRES",
        "QOSMaxGRESPerUser",
    ):
        assert is_quota_reason(reason)
    for reason in ("Resources", "Priority", "Dependency", "ReqNodeNotAvail", "JobHeldUser", "QOSNotAllowed"):
        assert not is_quota_reason(reason)


def test_scope_and_filters(engine: Engine, config: Config) -> None:
    load_admin_day(engine, config)
    alice = report(engine, scope=Scope(users=frozenset({"alice"})))
    assert [r["account"] for r in alice["wait_by_account"]] == ["physics"]
    assert alice["wait_by_account"][0]["queue_wait_count"] == 1
    assert alice["pending"] == []
    assert [q["reason"] for q in alice["quota"]] == ["AssocGrpGRES"]
    bio = report(engine, scope=Scope(accounts=frozenset({"bio"})))
    assert [(p["reason"], p["jobs"]) for p in bio["pending"]] == [("Resources", 1)]
    assert all(rows == [] for rows in report(engine, scope=NOTHING).values())
    debug = report(engine, job_filter=JobFilter(partitions=("debug",)))
    assert (debug["wait_by_partition"], [p["reason"] for p in debug["pending"]]) == ([], ["Priority"])
