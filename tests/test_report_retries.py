"""`report retries`: requeues, resubmission chains and retry GPU-hours, on hand-built jobs.

Window 2026-11-01 (UTC), resubmission window 6 h unless a test says otherwise:
  alice  "train" 10 FAILED 10-11 (1 GPU) -> 11 FAILED 12-13 (2 GPUs) -> 12 COMPLETED 14-16: a chain
  erin   "y"     50 FAILED 08-09 -> 51 (submitted 09:10) and 52 (09:20): 50 is followed by 51 only
  frank  "z"     60 FAILED Oct 31 20-22 -> 61 submitted 23:00, FAILED 23:30-01:00: chain across -S
  bob    "sim"   20 FAILED 00-01; 21 submitted 08:00: 7 h later, not a resubmission
  carol  "x"     30 FAILED 02-03 on gpu; 31 on debug 03:30: another partition
  grace  "c"     70 CANCELLED 01-02; 71 at 02:30: cancelled is not failed
  dave   "long"  40 PREEMPTED 05-06 (2 GPUs), requeued, COMPLETED 06:10-07:00
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime
from typing import Any

from sqlalchemy import Engine, text

from slurmtel.access import EVERYTHING, NOTHING, Scope
from slurmtel.attribution import run_attribution
from slurmtel.config import Config
from slurmtel.records import JobAttempt
from slurmtel.store.jobs import sync_outcome_classes, write_attempts
from slurmtel.store.reports_failures import failures_report
from slurmtel.store.reports_retries import retries_report
from slurmtel.store.usage import JobFilter
from tests.factories import at, attempt, with_hours

START, END, NOW = at("2026-11-01T00:00:00"), at("2026-11-02T00:00:00"), at("2026-12-02T14:00:00")


def job(job_id: int, user: str, account: str, name: str, state: str, submit: str, start: str, end: str,
        gpus: int = 1, partition: str = "gpu") -> JobAttempt:  # fmt: skip
    return attempt(job_id_raw=job_id, user=user, account=account, name=name, state=state, partition=partition,
                   submit_at=at(submit), eligible_at=at(submit), start_at=at(start), end_at=at(end),
                   alloc_gpus=gpus, nodes=("n1",))  # fmt: skip


JOBS = [
    job(10, "alice", "physics", "train", "FAILED", "2026-11-01T09:55:00", "2026-11-01T10:00:00", "2026-11-01T11:00:00"),
    job(11, "alice", "physics", "train", "FAILED", "2026-11-01T12:00:00", "2026-11-01T12:00:00", "2026-11-01T13:00:00", 2),
    job(12, "alice", "physics", "train", "COMPLETED", "2026-11-01T14:00:00", "2026-11-01T14:00:00", "2026-11-01T16:00:00"),
    job(50, "erin", "physics", "y", "FAILED", "2026-11-01T08:00:00", "2026-11-01T08:00:00", "2026-11-01T09:00:00"),
    job(51, "erin", "physics", "y", "COMPLETED", "2026-11-01T09:10:00", "2026-11-01T09:10:00", "2026-11-01T09:40:00"),
    job(52, "erin", "physics", "y", "COMPLETED", "2026-11-01T09:20:00", "2026-11-01T09:20:00", "2026-11-01T09:50:00"),
    job(60, "frank", "chem", "z", "FAILED", "2026-10-31T19:00:00", "2026-10-31T20:00:00", "2026-10-31T22:00:00"),
    job(61, "frank", "chem", "z", "FAILED", "2026-10-31T23:00:00", "2026-10-31T23:30:00", "2026-11-01T01:00:00"),
    job(20, "bob", "chem", "sim", "FAILED", "2026-11-01T00:00:00", "2026-11-01T00:00:00", "2026-11-01T01:00:00"),
    job(21, "bob", "chem", "sim", "COMPLETED", "2026-11-01T08:00:00", "2026-11-01T08:00:00", "2026-11-01T09:00:00"),
    job(30, "carol", "bio", "x", "FAILED", "2026-11-01T02:00:00", "2026-11-01T02:00:00", "2026-11-01T03:00:00"),
    job(31, "carol", "bio", "x", "COMPLETED", "2026-11-01T03:30:00", "2026-11-01T03:30:00", "2026-11-01T04:00:00",
        partition="debug"),
    job(70, "grace", "bio", "c", "CANCELLED", "2026-11-01T01:00:00", "2026-11-01T01:00:00", "2026-11-01T02:00:00"),
    job(71, "grace", "bio", "c", "COMPLETED", "2026-11-01T02:30:00", "2026-11-01T02:30:00", "2026-11-01T03:00:00"),
    job(40, "dave", "physics", "long", "PREEMPTED", "2026-11-01T04:50:00", "2026-11-01T05:00:00", "2026-11-01T06:00:00", 2),
    job(40, "dave", "physics", "long", "COMPLETED", "2026-11-01T06:00:30", "2026-11-01T06:10:00", "2026-11-01T07:00:00", 2),
]  # fmt: skip


def load(engine: Engine) -> None:
    with engine.begin() as conn:
        sync_outcome_classes(conn, Config().outcomes.mapping())
        write_attempts(conn, JOBS)
    # reports read resubmission links as of the last attribution run
    run_attribution(engine, Config(), now=NOW)


def report(engine: Engine, scope: Scope = EVERYTHING, **kwargs) -> dict[str, list[dict[str, Any]]]:
    kwargs.setdefault("start", START)
    kwargs.setdefault("end", END)
    with engine.connect() as conn:
        return with_hours(retries_report(conn, now=NOW, scope=scope, **kwargs))


def test_chains(engine: Engine) -> None:
    load(engine)
    chains = report(engine)["chains"]
    assert [(c["user"], c["job_ids"], c["outcomes"], c["retry_gpu_hours"], c["failed_gpu_hours"]) for c in chains] == [
        ("alice", ["10", "11", "12"], ["user_failure", "user_failure", "completed"], 3.0, 3.0),
        ("erin", ["50", "51"], ["user_failure", "completed"], 1.0, 1.0),
        # 60 failed the day before: only 61's hour inside the window counts
        ("frank", ["60", "61"], ["user_failure", "user_failure"], 1.0, 1.0),
    ]  # fmt: skip
    alice = chains[0]
    assert alice == {
        "cluster": "lab",
        "user": "alice",
        "account": "physics",
        "partition": "gpu",
        "name": "train",
        "jobs": 3,
        "job_ids": ["10", "11", "12"],
        "outcomes": ["user_failure", "user_failure", "completed"],
        "failed_jobs": 2,
        "requeues": 0,
        "resubmissions": 2,
        "first_submit_at": datetime.fromisoformat("2026-11-01T09:55:00+00:00"),
        "last_end_at": datetime.fromisoformat("2026-11-01T16:00:00+00:00"),
        "retry_gpu_seconds": 3 * 3600,
        "retry_gpu_hours": 3.0,
        "failed_gpu_seconds": 3 * 3600,
        "failed_gpu_hours": 3.0,
    }


def test_counts_and_retry_gpu_hours_by_account_and_user(engine: Engine) -> None:
    load(engine)
    result = report(engine)
    fields = ("jobs", "requeues", "resubmissions", "chains", "retry_gpu_hours", "failed_gpu_hours")
    assert {r["account"]: tuple(r[f] for f in fields) for r in result["by_account"]} == {
        # retry: 10 (1) + 11 (2) + 50 (1) + 40's preempted attempt (2); failed: 10, 11, 50
        "physics": (7, 1, 3, 2, 6.0, 4.0),
        # 60 ended before the window: its job is not counted, 61 is a resubmission
        "chem": (3, 0, 1, 1, 1.0, 2.0),
        "bio": (4, 0, 0, 0, 0.0, 1.0),
    }
    assert {r["user"]: tuple(r[f] for f in fields) for r in result["by_user"]}["dave"] == (
        1,
        1,
        0,
        0,
        2.0,
        0.0,
    )


def test_the_failures_report_counts_the_same_retry_gpu_hours(engine: Engine) -> None:
    load(engine)
    with engine.connect() as conn:
        failures = failures_report(conn, start=START, end=END, now=NOW, scope=EVERYTHING)
    retries = report(engine)
    assert {r["account"]: r["retry_gpu_seconds"] for r in failures["by_account"]} == {
        r["account"]: r["retry_gpu_seconds"] for r in retries["by_account"]
    }


def test_a_chain_reaching_out_of_the_window(engine: Engine) -> None:
    load(engine)
    result = report(engine, start=at("2026-11-01T12:30:00"), end=at("2026-11-01T13:30:00"))
    (chain,) = result["chains"]
    # 10 ended before, 12 was submitted after: the chain is whole, only 11's half hour counts
    assert (chain["job_ids"], chain["retry_gpu_hours"]) == (["10", "11", "12"], 1.0)
    (physics,) = result["by_account"]
    assert (physics["jobs"], physics["resubmissions"], physics["chains"], physics["retry_gpu_hours"]) == (
        1,
        1,
        1,
        1.0,
    )


def test_the_resubmission_window_is_configurable(engine: Engine) -> None:
    load(engine)
    result = report(engine, resubmission_window_seconds=1800)
    assert [c["job_ids"] for c in result["chains"]] == [["50", "51"]]


def test_scope_and_job_scope(engine: Engine) -> None:
    load(engine)
    erin = report(engine, scope=Scope(users=frozenset({"erin"})))
    assert [r["user"] for r in erin["by_user"]] == ["erin"]
    assert [c["user"] for c in erin["chains"]] == ["erin"]
    coordinator = report(engine, scope=Scope(users=frozenset({"grace"}), accounts=frozenset({"chem"})))
    assert sorted(r["user"] for r in coordinator["by_user"]) == ["bob", "frank", "grace"]
    assert [c["user"] for c in coordinator["chains"]] == ["frank"]
    assert all(rows == [] for rows in report(engine, scope=NOTHING).values())
    finance = report(engine, job_scope=NOTHING)
    assert finance["chains"] == []
    assert len(finance["by_account"]) == 3
    only_bio = report(engine, job_filter=JobFilter(accounts=("bio",)))
    assert (only_bio["chains"], [r["account"] for r in only_bio["by_account"]]) == ([], ["bio"])


def test_stored_links_and_links_computed_at_query_time_agree(engine: Engine) -> None:
    load(engine)
    windows = [(START, END), (at("2026-11-01T12:30:00"), at("2026-11-01T13:30:00"))]
    with engine.connect() as conn:
        stored = [retries_report(conn, start=s, end=e, now=NOW, scope=EVERYTHING) for s, e in windows]
        stored_failures = failures_report(conn, start=START, end=END, now=NOW, scope=EVERYTHING)
    # without the attribution run's record of how the links were computed, reports compute them
    with engine.begin() as conn:
        conn.execute(text("DELETE FROM retry_link_state"))
    with engine.connect() as conn:
        assert [retries_report(conn, start=s, end=e, now=NOW, scope=EVERYTHING) for s, e in windows] == stored
        assert failures_report(conn, start=START, end=END, now=NOW, scope=EVERYTHING) == stored_failures
    assert [c["job_ids"] for c in stored[0]["chains"]] == [["10", "11", "12"], ["50", "51"], ["60", "61"]]


def _stored_and_from_scratch(engine: Engine) -> None:
    """The report reading retry_link (as the last attribution run left it) equals the report
    computing every link at query time, for every scope and window below."""
    scopes = [
        EVERYTHING,
        Scope(users=frozenset({"alice"})),  # a researcher
        Scope(users=frozenset({"grace"}), accounts=frozenset({"chem"})),  # a coordinator
        NOTHING,
    ]
    windows = [(START, END), (at("2026-11-01T12:30:00"), at("2026-11-01T13:30:00"))]
    cases = [(scope, s, e) for scope in scopes for s, e in windows]
    with engine.connect() as conn:
        stored = [retries_report(conn, start=s, end=e, now=NOW, scope=scope) for scope, s, e in cases]
    with engine.begin() as conn:
        conn.execute(text("DELETE FROM retry_link_state"))
    with engine.connect() as conn:
        scratch = [retries_report(conn, start=s, end=e, now=NOW, scope=scope) for scope, s, e in cases]
    assert stored == scratch
    # the next run recomputes every link, as the first run did
    run_attribution(engine, Config(), now=NOW)


def test_the_report_equals_the_from_scratch_computation_as_jobs_change(engine: Engine) -> None:
    load(engine)
    _stored_and_from_scratch(engine)
    # a resubmission arriving later, still running: a chain that has not ended
    running = attempt(job_id_raw=32, user="carol", account="bio", name="x", state="RUNNING",
                      submit_at=at("2026-11-01T03:40:00"), eligible_at=at("2026-11-01T03:40:00"),
                      start_at=at("2026-11-01T03:45:00"), end_at=None, nodes=("n1",))  # fmt: skip
    with engine.begin() as conn:
        write_attempts(conn, [running])
    run_attribution(engine, Config(), now=NOW)
    carol = [c for c in report(engine)["chains"] if c["user"] == "carol"]
    assert [(c["job_ids"], c["last_end_at"]) for c in carol] == [(["30", "32"], None)]
    _stored_and_from_scratch(engine)
    # a record updated: the chain's last job failed after all; a job linked after the fact:
    # grace's cancelled job is recorded as failed, and the job after it becomes its resubmission
    updated = [replace(j, state="FAILED") for j in JOBS if j.job_id_raw in (12, 70)]
    with engine.begin() as conn:
        write_attempts(conn, updated)
    run_attribution(engine, Config(), now=NOW)
    chains = {c["user"]: c for c in report(engine)["chains"]}
    assert chains["alice"]["outcomes"] == ["user_failure", "user_failure", "user_failure"]
    assert chains["grace"]["job_ids"] == ["70", "71"]
    _stored_and_from_scratch(engine)
    # the running job ends
    with engine.begin() as conn:
        write_attempts(conn, [replace(running, state="COMPLETED", end_at=at("2026-11-01T05:00:00"))])
    run_attribution(engine, Config(), now=NOW)
    carol = [c for c in report(engine)["chains"] if c["user"] == "carol"]
    assert [c["last_end_at"] for c in carol] == [at("2026-11-01T05:00:00")]
    _stored_and_from_scratch(engine)
