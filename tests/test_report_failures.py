"""`report failures` on tests.factories.admin_day (window: 2026-11-01, UTC).

GPU-hours here are allocated GPUs x time as in `report usage` (no MIG fraction, no fitting):
  102 bob/chem     FAILED     4 GPUs x 2 h = 8  (gpu01 4, gpu02 4)
  103 carol/bio    NODE_FAIL  1 x 2 h = 2 (gpu02), requeued: a retry; its 2nd attempt 1 h
  104 dave/physics NODE_FAIL  1 x 10 h = 10 (gpu04)
  completed: 101 alice 2 h (gpu01), 105 erin 1 h (gpu05), 106 frank 1 h (gpu06)
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine

from slurmtel.access import EVERYTHING, NOTHING, Scope
from slurmtel.config import Config
from slurmtel.store.jobs import sync_outcome_classes, write_attempts
from slurmtel.store.reports_failures import failures_report
from slurmtel.store.usage import JobFilter, usage_report
from tests.factories import at, attempt, load_admin_day, with_hours

START, END, NOW = at("2026-11-01T00:00:00"), at("2026-11-02T00:00:00"), at("2026-12-02T14:00:00")


def report(engine: Engine, scope: Scope = EVERYTHING, **kwargs) -> dict[str, list[dict[str, Any]]]:
    kwargs.setdefault("start", START)
    kwargs.setdefault("end", END)
    with engine.connect() as conn:
        return with_hours(failures_report(conn, now=NOW, scope=scope, **kwargs))


def pick(rows: list[dict], key: str, *fields: str) -> dict:
    return {r[key]: tuple(r[f] for f in fields) for r in rows}


def test_failed_gpu_hours_by_account_user_partition(engine: Engine, config: Config) -> None:
    load_admin_day(engine, config)
    result = report(engine)
    fields = ("failed_attempts", "failed_gpu_hours", "user_failure_gpu_hours", "system_failure_gpu_hours",
              "allocated_gpu_hours", "failed_share", "retry_gpu_hours")  # fmt: skip
    assert pick(result["by_account"], "account", *fields) == {
        "physics": (1, 10.0, 0.0, 10.0, 13.0, round(10 / 13, 4), 0.0),
        "chem": (1, 8.0, 8.0, 0.0, 9.0, round(8 / 9, 4), 0.0),
        "bio": (1, 2.0, 0.0, 2.0, 3.0, round(2 / 3, 4), 2.0),
    }
    assert [r["account"] for r in result["by_account"]] == ["physics", "chem", "bio"]
    assert pick(result["by_user"], "user", "failed_gpu_hours", "allocated_gpu_hours") == {
        "dave": (10.0, 10.0),
        "bob": (8.0, 8.0),
        "carol": (2.0, 3.0),
        "alice": (0.0, 2.0),
        "erin": (0.0, 1.0),
        "frank": (0.0, 1.0),
    }
    assert pick(result["by_partition"], "partition", *fields) == {"gpu": (3, 20.0, 8.0, 12.0, 25.0, 0.8, 2.0)}


def test_nodes_share_a_multi_node_attempt_evenly(engine: Engine, config: Config) -> None:
    load_admin_day(engine, config)
    by_node = pick(report(engine)["by_node"], "node", "failed_attempts", "failed_gpu_hours",
                   "user_failure_gpu_hours", "allocated_gpu_hours", "retry_gpu_hours")  # fmt: skip
    assert by_node == {
        "gpu04": (1, 10.0, 0.0, 10.0, 0.0),
        "gpu02": (2, 6.0, 4.0, 6.0, 2.0),
        "gpu01": (1, 4.0, 4.0, 7.0, 0.0),
        "gpu05": (0, 0.0, 0.0, 1.0, 0.0),
        "gpu06": (0, 0.0, 0.0, 1.0, 0.0),
    }
    assert sum(v[1] for v in by_node.values()) == 20.0


def test_top_attempts(engine: Engine, config: Config) -> None:
    load_admin_day(engine, config)
    top = report(engine)["top_attempts"]
    assert [(t["job_id"], t["failed_gpu_hours"], t["state"], t["retry"]) for t in top] == [
        ("104", 10.0, "NODE_FAIL", False),
        ("102", 8.0, "FAILED", False),
        ("103", 2.0, "NODE_FAIL", True),
    ]
    assert top[1] == {
        "cluster": "lab",
        "job_id": "102",
        "user": "bob",
        "account": "chem",
        "partition": "gpu",
        "state": "FAILED",
        "outcome": "user_failure",
        "exit_code": "1:0",
        "nodes": "gpu[01-02]",
        "gpus": 4,
        "elapsed_seconds": 7200,
        "failed_gpu_seconds": 28800,
        "failed_gpu_hours": 8.0,
        "retry": False,
    }
    assert [t["job_id"] for t in report(engine, top=1)["top_attempts"]] == ["104"]
    assert report(engine, top=0)["top_attempts"] == []


def test_cancelled_and_preempted_for_context_and_the_window_cuts_exactly(engine: Engine) -> None:
    with engine.begin() as conn:
        sync_outcome_classes(conn, Config().outcomes.mapping())
        write_attempts(conn, [
            attempt(job_id_raw=1, state="CANCELLED", alloc_gpus=2, nodes=("n1",)),  # 10:00-11:00
            attempt(job_id_raw=2, state="PREEMPTED", alloc_gpus=1, nodes=("n1",)),
            attempt(job_id_raw=3, state="TIMEOUT", alloc_gpus=4, nodes=("n1",)),
            attempt(job_id_raw=4, state="FAILED", alloc_gpus=0, nodes=("n1",)),  # no GPUs: not listed
        ])  # fmt: skip
    (row,) = report(engine, start=at("2026-11-01T10:30:00"), end=at("2026-11-01T12:00:00"))["by_account"]
    assert (row["cancelled_gpu_hours"], row["preempted_gpu_hours"], row["user_failure_gpu_hours"]) == (
        1.0,
        0.5,
        2.0,
    )
    assert (row["failed_attempts"], row["allocated_gpu_hours"]) == (1, 3.5)


def test_allocated_agrees_with_report_usage(engine: Engine, config: Config) -> None:
    load_admin_day(engine, config)
    with engine.connect() as conn:
        usage = usage_report(conn, start=START, end=END, now=NOW, by="account", scope=EVERYTHING)
    failures = report(engine)["by_account"]
    assert {u["account"]: (u["allocated_gpu_seconds"], u["failed_gpu_seconds"]) for u in usage} == {
        f["account"]: (f["allocated_gpu_seconds"], f["failed_gpu_seconds"]) for f in failures
    }


def test_scope_user_coordinator_nobody_and_job_detail(engine: Engine, config: Config) -> None:
    load_admin_day(engine, config)
    dave = report(engine, scope=Scope(users=frozenset({"dave"})))
    assert [r["user"] for r in dave["by_user"]] == ["dave"]
    assert [r["node"] for r in dave["by_node"]] == ["gpu04"]
    assert [t["job_id"] for t in dave["top_attempts"]] == ["104"]
    coordinator = report(engine, scope=Scope(users=frozenset({"bob"}), accounts=frozenset({"bio"})))
    assert sorted(r["account"] for r in coordinator["by_account"]) == ["bio", "chem"]
    assert sorted(t["job_id"] for t in coordinator["top_attempts"]) == ["102", "103"]
    assert all(rows == [] for rows in report(engine, scope=NOTHING).values())
    # finance: aggregates over everything, but no single jobs
    finance = report(engine, scope=EVERYTHING, job_scope=NOTHING)
    assert len(finance["by_account"]) == 3
    assert finance["top_attempts"] == []


def test_filters(engine: Engine, config: Config) -> None:
    load_admin_day(engine, config)
    chem = report(engine, job_filter=JobFilter(accounts=("chem",)))
    assert [r["account"] for r in chem["by_account"]] == ["chem"]
    assert [t["job_id"] for t in chem["top_attempts"]] == ["102"]
    assert report(engine, job_filter=JobFilter(clusters=("other",)))["by_account"] == []
