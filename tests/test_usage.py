from __future__ import annotations

from sqlalchemy import Engine

from slurmtel.access import EVERYTHING, Scope
from slurmtel.config import Config
from slurmtel.store.jobs import sync_outcome_classes, write_attempts
from slurmtel.store.usage import JobFilter, usage_report
from tests.factories import at, attempt

NOW = at("2026-11-01T12:00:00")


def load(engine: Engine, *attempts) -> None:  # type: ignore[no-untyped-def]
    with engine.begin() as conn:
        sync_outcome_classes(conn, Config().outcomes.mapping())
        write_attempts(conn, attempts)


def report(engine: Engine, start: str, end: str, by: str = "account", scope: Scope = EVERYTHING, **filters):  # type: ignore[no-untyped-def]
    with engine.connect() as conn:
        return usage_report(
            conn, start=at(start), end=at(end), now=NOW, by=by, scope=scope, job_filter=JobFilter(**filters)
        )


def test_gpu_seconds_are_split_exactly_at_the_window_edges(engine: Engine) -> None:
    load(
        engine,
        attempt(
            job_id_raw=1, alloc_gpus=2, start_at=at("2026-11-01T10:00:00"), end_at=at("2026-11-01T11:00:00")
        ),
    )
    (before,) = report(engine, "2026-11-01T09:00:00", "2026-11-01T10:30:00")
    (after,) = report(engine, "2026-11-01T10:30:00", "2026-11-01T12:00:00")
    assert before["allocated_gpu_seconds"] == 2 * 1800
    assert after["allocated_gpu_seconds"] == 2 * 1800
    (whole,) = report(engine, "2026-11-01T00:00:00", "2026-11-02T00:00:00")
    assert whole["allocated_gpu_seconds"] == before["allocated_gpu_seconds"] + after["allocated_gpu_seconds"]
    assert whole["allocated_gpu_seconds"] == 2 * 3600


def test_outcome_classes_failures_and_running_attempts_up_to_now(engine: Engine) -> None:
    load(
        engine,
        attempt(job_id_raw=1, state="COMPLETED", alloc_gpus=1),  # 3600
        attempt(job_id_raw=2, state="TIMEOUT", alloc_gpus=2),  # 7200 user failure
        attempt(job_id_raw=3, state="NODE_FAIL", alloc_gpus=1, end_at=at("2026-11-01T10:10:00")),  # 600
        attempt(job_id_raw=4, state="RUNNING", alloc_gpus=4, start_at=at("2026-11-01T11:30:00"), end_at=None),
        attempt(job_id_raw=5, state="FOO", alloc_gpus=1, end_at=at("2026-11-01T10:00:10")),  # 10 unknown
    )
    (row,) = report(engine, "2026-11-01T00:00:00", "2026-11-02T00:00:00")
    assert row["completed_gpu_seconds"] == 3600
    assert row["user_failure_gpu_seconds"] == 7200
    assert row["system_failure_gpu_seconds"] == 600
    assert row["running_gpu_seconds"] == 4 * 1800  # 11:30 .. NOW=12:00
    assert row["unknown_gpu_seconds"] == 10
    assert row["failed_gpu_seconds"] == 7800
    assert row["allocated_gpu_seconds"] == 3600 + 7200 + 600 + 7200 + 10
    assert (row["jobs"], row["attempts"], row["requeues"]) == (5, 5, 0)


def test_requeues_and_queue_wait_from_eligible_not_submit(engine: Engine) -> None:
    load(
        engine,
        # held for an hour by choice: eligible 10:00, waited 60 s
        attempt(
            job_id_raw=1,
            submit_at=at("2026-11-01T09:00:00"),
            eligible_at=at("2026-11-01T10:00:00"),
            start_at=at("2026-11-01T10:01:00"),
        ),
        attempt(
            job_id_raw=2,
            submit_at=at("2026-11-01T10:00:00"),
            eligible_at=at("2026-11-01T10:00:00"),
            start_at=at("2026-11-01T10:02:00"),
            state="REQUEUED",
            end_at=at("2026-11-01T10:03:00"),
        ),
        attempt(
            job_id_raw=2,
            submit_at=at("2026-11-01T10:03:00"),
            eligible_at=at("2026-11-01T10:03:20"),
            start_at=at("2026-11-01T10:08:20"),
            end_at=at("2026-11-01T10:09:00"),
        ),
        # still pending: no wait figure, but a job of the window
        attempt(job_id_raw=3, state="PENDING", start_at=None, end_at=None, alloc_gpus=0),
    )
    (row,) = report(engine, "2026-11-01T00:00:00", "2026-11-02T00:00:00")
    assert (row["jobs"], row["attempts"], row["requeues"]) == (3, 4, 1)
    assert row["queue_wait_count"] == 3
    assert row["queue_wait_p50_seconds"] == 120.0
    assert row["queue_wait_max_seconds"] == 300.0
    assert row["queue_wait_p95_seconds"] == 282.0  # linear interpolation between 120 and 300


def test_group_by_user_and_partition_and_filters(engine: Engine) -> None:
    load(
        engine,
        attempt(job_id_raw=1, user="alice", account="physics", partition="gpu"),
        attempt(job_id_raw=2, user="bob", account="chemistry", partition="debug", alloc_gpus=2),
        attempt(job_id_raw=3, user="alice", account="chemistry", partition="gpu", alloc_gpus=3),
    )
    window = ("2026-11-01T00:00:00", "2026-11-02T00:00:00")
    by_user = {r["user"]: r["allocated_gpu_seconds"] for r in report(engine, *window, by="user")}
    assert by_user == {"alice": 4 * 3600, "bob": 2 * 3600}
    by_partition = {
        r["partition"]: r["allocated_gpu_seconds"] for r in report(engine, *window, by="partition")
    }
    assert by_partition == {"gpu": 4 * 3600, "debug": 2 * 3600}
    chem = report(engine, *window, by="user", accounts=("chemistry",))
    assert {r["user"]: r["allocated_gpu_seconds"] for r in chem} == {"alice": 3 * 3600, "bob": 2 * 3600}
    assert report(engine, *window, clusters=("other",)) == []


def test_scope_limits_rows_to_own_jobs_and_coordinated_accounts(engine: Engine) -> None:
    load(
        engine,
        attempt(job_id_raw=1, user="alice", account="physics"),
        attempt(job_id_raw=2, user="bob", account="chemistry"),
        attempt(job_id_raw=3, user="carol", account="biology"),
    )
    window = ("2026-11-01T00:00:00", "2026-11-02T00:00:00")
    own = report(engine, *window, by="user", scope=Scope(users=frozenset({"alice"})))
    assert [r["user"] for r in own] == ["alice"]
    coordinator = report(
        engine, *window, by="user", scope=Scope(users=frozenset({"bob"}), accounts=frozenset({"biology"}))
    )
    assert sorted(r["user"] for r in coordinator) == ["bob", "carol"]
    assert report(engine, *window, scope=Scope()) == []
