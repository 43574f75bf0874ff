"""Resubmission links kept by the attribution run (retry_link): rules, incremental upkeep.

Jobs here are hand-built on cluster "lab", user alice, account physics, partition gpu, name
"train" unless a test says otherwise; the resubmission window is 6 h unless a test says
otherwise. Runs use overlap_seconds = 0, so that an incremental run re-reads only the jobs
written since the run before it (the default overlap would re-read every job of a test and
hide a missed neighbour).
"""

from __future__ import annotations

import random
from dataclasses import replace
from datetime import timedelta
from typing import Any

from sqlalchemy import Engine, text

from slurmtel.access import EVERYTHING, Scope
from slurmtel.attribution import run_attribution
from slurmtel.config import Config
from slurmtel.records import JobAttempt
from slurmtel.store.jobs import sync_outcome_classes, write_attempts
from slurmtel.store.reports_failures import failures_report
from slurmtel.store.reports_retries import retries_report
from slurmtel.store.reports_taxonomy import capacity_report
from slurmtel.store.retry_links import FULL_LINKS_MIN_REGIONS, refresh_retry_links, retry_links_current
from slurmtel.store.usage import JobFilter
from slurmtel.vocabulary import REQUEUE_STATES
from tests.factories import at, attempt

NOW = at("2026-12-02T14:00:00")
HOUR = timedelta(hours=1)


def settings(window_seconds: int = 21600) -> Config:
    config = Config()
    return replace(
        config,
        attribution=replace(
            config.attribution, overlap_seconds=0, resubmission_window_seconds=window_seconds
        ),
    )


def job(job_id: int, state: str, submit: str, end: str | None, **overrides: Any) -> JobAttempt:
    """An attempt submitted at SUBMIT that started then and ended at END (None: still running)."""
    values: dict[str, Any] = {
        "job_id_raw": job_id,
        "state": state,
        "submit_at": at(submit),
        "eligible_at": at(submit),
        "start_at": at(submit),
        "end_at": at(end) if end else None,
        "nodes": ("n1",),
    }
    values.update(overrides)
    return attempt(**values)


def write(engine: Engine, *attempts: JobAttempt, config: Config | None = None) -> None:
    with engine.begin() as conn:
        sync_outcome_classes(conn, (config or Config()).outcomes.mapping())
        write_attempts(conn, attempts)


def links(engine: Engine) -> set[tuple[int, int]]:
    """(resubmission, failed job it follows) job ids."""
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT job_id_raw, prev_job_id_raw FROM retry_link"))
        return {(r.job_id_raw, r.prev_job_id_raw) for r in rows}


def link_rows(engine: Engine) -> list[tuple[Any, ...]]:
    with engine.connect() as conn:
        return [
            tuple(r)
            for r in conn.execute(
                text(
                    "SELECT cluster, job_id_raw, job_submit_at, prev_job_id_raw, prev_job_submit_at, "
                    "prev_end_at, user_name, account, partition, name FROM retry_link ORDER BY 1, 2, 3"
                )
            )
        ]


def test_the_rules(engine: Engine) -> None:
    config = settings()
    write(
        engine,
        # 2 follows the latest failed job to end before it (12, not 11); 3 came later: 12 is
        # followed by its first resubmission only, and 3 follows nothing else
        job(11, "FAILED", "2026-11-01T08:00:00", "2026-11-01T09:00:00"),
        job(12, "TIMEOUT", "2026-11-01T08:30:00", "2026-11-01T09:30:00"),
        job(2, "COMPLETED", "2026-11-01T10:00:00", "2026-11-01T11:00:00"),
        job(3, "COMPLETED", "2026-11-01T10:05:00", "2026-11-01T11:00:00"),
        # exactly the window after the end still counts, a second more does not
        job(20, "OUT_OF_MEMORY", "2026-11-02T00:00:00", "2026-11-02T01:00:00", name="edge"),
        job(21, "PENDING", "2026-11-02T07:00:00", None, start_at=None, name="edge"),
        job(30, "FAILED", "2026-11-02T00:00:00", "2026-11-02T01:00:00", name="late"),
        job(31, "COMPLETED", "2026-11-02T07:00:01", "2026-11-02T08:00:00", name="late"),
        # another partition, account, user or name: no link; cancelled is not failed
        job(40, "FAILED", "2026-11-03T00:00:00", "2026-11-03T01:00:00", name="x"),
        job(41, "COMPLETED", "2026-11-03T01:10:00", "2026-11-03T02:00:00", name="x", partition="debug"),
        job(42, "COMPLETED", "2026-11-03T01:10:00", "2026-11-03T02:00:00", name="x", account="chem"),
        job(43, "COMPLETED", "2026-11-03T01:10:00", "2026-11-03T02:00:00", name="x", user="bob"),
        job(44, "COMPLETED", "2026-11-03T01:10:00", "2026-11-03T02:00:00", name="y"),
        job(50, "CANCELLED", "2026-11-04T00:00:00", "2026-11-04T01:00:00", name="c"),
        job(51, "COMPLETED", "2026-11-04T01:10:00", "2026-11-04T02:00:00", name="c"),
        # a requeued attempt does not end its job: the job failed only if its last attempt did
        job(60, "NODE_FAIL", "2026-11-05T00:00:00", "2026-11-05T01:00:00", name="rq"),
        job(60, "COMPLETED", "2026-11-05T01:00:30", "2026-11-05T02:00:00", name="rq"),
        job(61, "COMPLETED", "2026-11-05T01:30:00", "2026-11-05T03:00:00", name="rq"),
        job(70, "NODE_FAIL", "2026-11-06T00:00:00", "2026-11-06T01:00:00", name="nf"),
        job(71, "COMPLETED", "2026-11-06T02:00:00", "2026-11-06T03:00:00", name="nf"),
        config=config,
    )
    run_attribution(engine, config, now=NOW)
    assert links(engine) == {(2, 12), (21, 20), (71, 70)}
    (row,) = [r for r in link_rows(engine) if r[1] == 71]
    assert row == ("lab", 71, at("2026-11-06T02:00:00"), 70, at("2026-11-06T00:00:00"),
                   at("2026-11-06T01:00:00"), "alice", "physics", "gpu", "nf")  # fmt: skip


def test_a_late_failed_job_becomes_the_predecessor(engine: Engine) -> None:
    config = settings()
    write(
        engine,
        job(1, "FAILED", "2026-11-01T08:00:00", "2026-11-01T09:00:00"),
        job(3, "COMPLETED", "2026-11-01T10:00:00", "2026-11-01T11:00:00"),
        job(9, "COMPLETED", "2026-11-01T12:00:00", "2026-11-01T13:00:00", name="other"),
    )
    run_attribution(engine, config, now=NOW)
    assert links(engine) == {(3, 1)}
    # sacct delivers 2 late (submitted before 1 ended, so it follows nothing): it failed after
    # 1 and before 3 was submitted, so 3 follows it now and 1 has no resubmission
    write(engine, job(2, "FAILED", "2026-11-01T08:30:00", "2026-11-01T09:40:00"))
    result = run_attribution(engine, config, now=NOW)
    assert links(engine) == {(3, 2)}
    assert result.retry_links == 1
    # 4, also late, was submitted after 1 ended and before 2 did
    write(engine, job(4, "COMPLETED", "2026-11-01T09:20:00", "2026-11-01T09:30:00"))
    run_attribution(engine, config, now=NOW)
    assert links(engine) == {(3, 2), (4, 1)}
    # a late job submitted before 3, after 2 ended, takes 2's resubmission from 3
    write(engine, job(5, "COMPLETED", "2026-11-01T09:50:00", "2026-11-01T10:30:00"))
    run_attribution(engine, config, now=NOW)
    assert links(engine) == {(5, 2), (4, 1)}
    assert link_rows(engine) == full_links(engine, config)


def test_a_job_that_stops_being_failed(engine: Engine) -> None:
    config = settings()
    write(
        engine,
        job(1, "FAILED", "2026-11-01T06:00:00", "2026-11-01T07:00:00"),
        job(2, "NODE_FAIL", "2026-11-01T08:00:00", "2026-11-01T09:00:00"),
        job(3, "COMPLETED", "2026-11-01T10:00:00", "2026-11-01T11:00:00"),
    )
    run_attribution(engine, config, now=NOW)
    assert links(engine) == {(3, 2), (2, 1)}
    # 2 was requeued and completed: no longer a failed job, 3 follows 1 now (within 6 h), but
    # 1 has one resubmission, the first submitted: 2
    write(engine, job(2, "COMPLETED", "2026-11-01T09:00:30", "2026-11-01T09:30:00"))
    run_attribution(engine, config, now=NOW)
    assert links(engine) == {(2, 1)}
    # sacct corrects 1 to COMPLETED: nothing is a resubmission any more
    write(engine, job(1, "COMPLETED", "2026-11-01T06:00:00", "2026-11-01T07:00:00"))
    run_attribution(engine, config, now=NOW)
    assert links(engine) == set()
    assert link_rows(engine) == full_links(engine, config)


def test_a_job_that_moves_to_another_partition_or_name(engine: Engine) -> None:
    config = settings()
    write(
        engine,
        job(1, "FAILED", "2026-11-01T06:00:00", "2026-11-01T07:00:00"),
        job(2, "COMPLETED", "2026-11-01T08:00:00", "2026-11-01T09:00:00"),
        job(3, "FAILED", "2026-11-01T06:00:00", "2026-11-01T07:30:00", partition="debug"),
    )
    run_attribution(engine, config, now=NOW)
    assert links(engine) == {(2, 1)}
    write(engine, job(2, "COMPLETED", "2026-11-01T08:00:00", "2026-11-01T09:00:00", partition="debug"))
    run_attribution(engine, config, now=NOW)
    assert links(engine) == {(2, 3)}
    write(engine, job(2, "COMPLETED", "2026-11-01T08:00:00", "2026-11-01T09:00:00", name="eval"))
    run_attribution(engine, config, now=NOW)
    assert links(engine) == set()


def test_attempts_relinked_into_one_job(engine: Engine) -> None:
    config = settings()
    # the second attempt of 5 arrives first: alone, it is a job of its own that follows 1
    write(
        engine,
        job(1, "FAILED", "2026-11-01T06:00:00", "2026-11-01T07:00:00"),
        job(5, "FAILED", "2026-11-01T09:00:30", "2026-11-01T10:00:00"),
        job(6, "COMPLETED", "2026-11-01T11:00:00", "2026-11-01T12:00:00"),
    )
    run_attribution(engine, config, now=NOW)
    assert links(engine) == {(5, 1), (6, 5)}
    # then its first attempt: the job is (5, 08:00), submitted 08:00, and follows 1 as that
    write(engine, job(5, "PREEMPTED", "2026-11-01T08:00:00", "2026-11-01T09:00:00"))
    run_attribution(engine, config, now=NOW)
    rows = link_rows(engine)
    assert [(r[1], r[2], r[3]) for r in rows] == [
        (5, at("2026-11-01T08:00:00"), 1),
        (6, at("2026-11-01T11:00:00"), 5),
    ]
    assert rows[1][4] == at("2026-11-01T08:00:00")  # 6 follows the whole job 5
    assert rows == full_links(engine, config)


def test_only_links_near_a_change_are_rewritten(engine: Engine) -> None:
    config = settings()
    write(
        engine,
        job(10, "FAILED", "2026-11-01T10:00:00", "2026-11-01T11:00:00"),
        job(11, "FAILED", "2026-11-01T10:30:00", "2026-11-01T13:00:00"),
        job(12, "COMPLETED", "2026-11-01T15:00:00", "2026-11-01T16:00:00"),
    )
    run_attribution(engine, config, now=NOW)
    assert links(engine) == {(12, 11)}
    # two changes of the same key, a day apart: 12 lies between their neighbourhoods, and of
    # the failed jobs before it only 10 is near one of them; 12 still follows 11
    write(
        engine,
        job(1, "COMPLETED", "2026-11-01T00:00:00", "2026-11-01T00:00:00"),
        job(2, "COMPLETED", "2026-11-02T02:00:00", "2026-11-02T03:00:00"),
    )
    run_attribution(engine, config, now=NOW)
    assert links(engine) == {(12, 11)}
    assert link_rows(engine) == full_links(engine, config)


def test_a_run_with_nothing_new_changes_nothing(engine: Engine) -> None:
    config = settings()
    write(
        engine,
        job(1, "FAILED", "2026-11-01T06:00:00", "2026-11-01T07:00:00"),
        job(2, "COMPLETED", "2026-11-01T08:00:00", "2026-11-01T09:00:00"),
    )
    first = run_attribution(engine, config, now=NOW)
    before = link_rows(engine)
    second = run_attribution(engine, config, now=NOW)
    assert (first.retry_links, second.retry_links) == (1, 0)
    assert link_rows(engine) == before == full_links(engine, config)
    # writing the same records again changes no attempt, so no link either
    write(
        engine,
        job(1, "FAILED", "2026-11-01T06:00:00", "2026-11-01T07:00:00"),
        job(2, "COMPLETED", "2026-11-01T08:00:00", "2026-11-01T09:00:00"),
    )
    assert run_attribution(engine, config, now=NOW).retry_links == 0
    assert link_rows(engine) == before


def test_a_new_window_or_new_outcome_classes_recompute_every_link(engine: Engine) -> None:
    six_hours = settings()
    write(
        engine,
        job(1, "FAILED", "2026-11-01T06:00:00", "2026-11-01T07:00:00"),
        job(2, "COMPLETED", "2026-11-01T08:00:00", "2026-11-01T09:00:00"),
        job(3, "TIMEOUT", "2026-11-02T06:00:00", "2026-11-02T07:00:00"),
        job(4, "COMPLETED", "2026-11-02T07:20:00", "2026-11-02T09:00:00"),
    )
    run_attribution(engine, six_hours, now=NOW)
    assert links(engine) == {(2, 1), (4, 3)}
    with engine.connect() as conn:
        assert retry_links_current(conn, 21600)
        assert not retry_links_current(conn, 1800)
    # nothing was written since, yet the links follow the new window
    half_hour = settings(1800)
    run_attribution(engine, half_hour, now=NOW)
    assert links(engine) == {(4, 3)}
    with engine.connect() as conn:
        assert retry_links_current(conn, 1800)
        assert not retry_links_current(conn, 21600)
    # TIMEOUT is not a failure at this site any more
    outcomes = replace(
        half_hour.outcomes, user_failure=["FAILED", "OUT_OF_MEMORY"], completed=["COMPLETED", "TIMEOUT"]
    )
    reclassed = replace(half_hour, outcomes=outcomes)
    write(engine, config=reclassed)
    with engine.connect() as conn:
        assert not retry_links_current(conn, 1800)
    run_attribution(engine, reclassed, now=NOW)
    assert links(engine) == set()
    with engine.connect() as conn:
        assert retry_links_current(conn, 1800)


def test_reports_read_links_as_of_the_last_run_and_fall_back_without_them(engine: Engine) -> None:
    config = settings()
    write(
        engine,
        job(1, "FAILED", "2026-11-01T06:00:00", "2026-11-01T07:00:00"),
        job(2, "FAILED", "2026-11-01T08:00:00", "2026-11-01T09:00:00"),
    )

    def resubmissions() -> int:
        with engine.connect() as conn:
            report = retries_report(conn, start=at("2026-11-01T00:00:00"), end=at("2026-11-02T00:00:00"),
                                    now=NOW, scope=EVERYTHING)  # fmt: skip
        return sum(r["resubmissions"] for r in report["by_account"])

    # never computed: the report computes the links itself
    assert resubmissions() == 1
    run_attribution(engine, config, now=NOW)
    assert resubmissions() == 1
    # a resubmission sacct delivered after the run counts from the next run on
    write(engine, job(3, "COMPLETED", "2026-11-01T10:00:00", "2026-11-01T11:00:00"))
    assert resubmissions() == 1
    run_attribution(engine, config, now=NOW)
    assert resubmissions() == 2
    # a job whose key changed since the run (its first attempt arrived late) links nothing
    # until the next run, and breaks nothing
    write(engine, job(3, "NODE_FAIL", "2026-11-01T09:30:00", "2026-11-01T09:59:00"))
    with engine.connect() as conn:
        chains = retries_report(conn, start=at("2026-11-01T00:00:00"), end=at("2026-11-02T00:00:00"),
                                now=NOW, scope=EVERYTHING)["chains"]  # fmt: skip
    assert [c["job_ids"] for c in chains] == [["1", "2"]]
    run_attribution(engine, config, now=NOW)
    assert resubmissions() == 2


# ---------------------------------------------------------------- against the rules, at random


def oracle_links(engine: Engine, config: Config) -> set[tuple[Any, ...]]:
    """The links by the rules, computed here in Python from the stored attempts."""
    outcome = config.outcomes.mapping()
    failed_classes = {"user_failure", "system_failure"}
    window = timedelta(seconds=config.attribution.resubmission_window_seconds)
    with engine.connect() as conn:
        attempts = conn.execute(
            text(
                "SELECT cluster, job_id_raw, submit_at, job_submit_at, attempt_number, state, end_at, "
                "user_name, account, partition, name FROM job_attempt"
            )
        ).all()
    numbers: dict[tuple[Any, ...], list[int]] = {}
    for a in attempts:
        numbers.setdefault((a.cluster, a.job_id_raw, a.job_submit_at), []).append(a.attempt_number)
    starts, failed = [], []
    for a in attempts:
        job_key = (a.cluster, a.job_id_raw, a.job_submit_at)
        key = (a.cluster, a.user_name, a.account, a.partition, a.name)
        if a.attempt_number == 1:
            starts.append((job_key, key, a.submit_at))
        requeued = a.state in REQUEUE_STATES and max(numbers[job_key]) > a.attempt_number
        if outcome.get(a.state) in failed_classes and a.end_at is not None and not requeued:
            failed.append((job_key, key, a.end_at))
    follows: dict[tuple[Any, ...], tuple[Any, ...]] = {}
    for s_job, s_key, submit in starts:
        candidates = [
            (end, p_job[1], p_job[2], p_job)
            for p_job, p_key, end in failed
            if p_key == s_key and p_job != s_job and end <= submit <= end + window
        ]
        if candidates:
            follows[s_job] = max(candidates)[3] + (max(candidates)[0],)
    submits = {s_job: submit for s_job, _, submit in starts}
    keys = {s_job: key for s_job, key, _ in starts}
    first: dict[tuple[Any, ...], tuple[Any, ...]] = {}
    for s_job, p in follows.items():
        if p not in first or (submits[s_job], s_job[1]) < (submits[first[p]], first[p][1]):
            first[p] = s_job
    return {(*s_job, p[1], p[2], p[3], *keys[s_job][1:]) for p, s_job in first.items()}


def full_links(engine: Engine, config: Config) -> list[tuple[Any, ...]]:
    """The links a full recomputation gives (computed in a transaction that is rolled back)."""
    with engine.connect() as conn, conn.begin() as tx:
        refresh_retry_links(
            conn,
            window_seconds=config.attribution.resubmission_window_seconds,
            job_mark=None,
            overlap_seconds=0,
            full=True,
        )
        rows = [
            tuple(r)
            for r in conn.execute(
                text(
                    "SELECT cluster, job_id_raw, job_submit_at, prev_job_id_raw, prev_job_submit_at, "
                    "prev_end_at, user_name, account, partition, name FROM retry_link ORDER BY 1, 2, 3"
                )
            )
        ]
        tx.rollback()
    return rows


def random_history(rng: random.Random, jobs: int) -> list[list[JobAttempt]]:
    """Batches of attempts as sacct might deliver them: new jobs, jobs that end, requeues,
    corrections and late arrivals, all over two days, two users, two names, two partitions."""
    base = at("2026-11-01T00:00:00")
    states = ["COMPLETED", "FAILED", "FAILED", "TIMEOUT", "NODE_FAIL", "CANCELLED", "OUT_OF_MEMORY"]
    current: dict[int, list[JobAttempt]] = {}
    batches: list[list[JobAttempt]] = []
    for batch in range(8):
        written: list[JobAttempt] = []
        for job_id in range(batch * jobs // 8, (batch + 1) * jobs // 8):
            submit = base + timedelta(minutes=rng.randrange(0, 48 * 60))
            first = job(job_id, "RUNNING", "2026-11-01T00:00:00", None, submit_at=submit, eligible_at=submit,
                        start_at=submit, user=rng.choice(["alice", "bob"]), name=rng.choice(["a", "b"]),
                        partition=rng.choice(["gpu", "gpu", "debug"]))  # fmt: skip
            current[job_id] = [first]
            written.append(first)
        # some jobs end, some of those are requeued, some are corrected or move
        for job_id in rng.sample(sorted(current), k=len(current) // 3):
            chain = current[job_id]
            last = chain[-1]
            if last.end_at is None:
                ended = replace(last, state=rng.choice(states),
                                end_at=last.submit_at + timedelta(minutes=rng.randrange(0, 8 * 60)))  # fmt: skip
                chain[-1] = ended
                written.append(ended)
            elif last.state == "NODE_FAIL" and rng.random() < 0.5:
                again = last.end_at + timedelta(seconds=30)
                requeued = replace(last, submit_at=again, eligible_at=again, start_at=again, end_at=None,
                                   state="RUNNING")  # fmt: skip
                chain.append(requeued)
                written.append(requeued)
            elif rng.random() < 0.3:
                moved = replace(last, state=rng.choice(states), partition=rng.choice(["gpu", "debug"]))
                chain[-1] = moved
                written.append(moved)
        rng.shuffle(written)
        batches.append(written)
    return batches


def test_incremental_runs_agree_with_the_rules_and_a_full_recomputation(engine: Engine) -> None:
    config = settings(3 * 3600)
    rng = random.Random(7)
    for batch in random_history(rng, 400):
        write(engine, *batch)
        result = run_attribution(engine, config, now=NOW)
        assert result.retry_links >= 0
    rows = link_rows(engine)
    assert len(rows) > 40, "the history should hold many links"
    assert set(rows) == oracle_links(engine, config)
    assert rows == full_links(engine, config)
    assert run_attribution(engine, config, now=NOW, full=True).retry_links == len(rows)
    assert link_rows(engine) == rows


def test_reports_give_the_same_figures_from_stored_links_and_without_them(engine: Engine) -> None:
    config = settings()
    rng = random.Random(11)
    for batch in random_history(rng, 300):
        write(engine, *batch)
        run_attribution(engine, config, now=NOW)
    windows = [
        (at("2026-11-01T00:00:00"), at("2026-11-03T00:00:00")),
        (at("2026-11-01T10:00:00"), at("2026-11-01T14:00:00")),
    ]
    scopes: list[tuple[Scope, JobFilter | None]] = [
        (EVERYTHING, None),
        (Scope(users=frozenset({"bob"})), None),
        (EVERYTHING, JobFilter(partitions=("debug",))),
    ]

    def reports() -> list[Any]:
        result: list[Any] = []
        with engine.connect() as conn:
            for start, end in windows:
                for scope, job_filter in scopes:
                    kwargs: dict[str, Any] = {"start": start, "end": end, "now": NOW, "scope": scope}
                    result.append(retries_report(conn, job_filter=job_filter, **kwargs))
                    result.append(failures_report(conn, job_filter=job_filter, **kwargs))
            day = at("2026-11-01T00:00:00").date()
            result.append(capacity_report(conn, first_day=day, last_day=day, now=NOW, timezone="UTC",
                                          scope=EVERYTHING))  # fmt: skip
        return result

    stored = reports()
    chains = stored[0]["chains"]
    assert len(chains) > 10 and any(c["jobs"] > 2 for c in chains)
    assert any(r["retry_gpu_seconds"] > 0 for r in stored[0]["by_user"])
    with engine.begin() as conn:
        conn.execute(text("DELETE FROM retry_link_state"))
    assert reports() == stored


def test_a_backfill_recomputes_every_link(engine: Engine) -> None:
    config = settings()
    write(engine, job(1, "FAILED", "2026-11-01T06:00:00", "2026-11-01T07:00:00"))
    run_attribution(engine, config, now=NOW)
    # more changed neighbourhoods than the threshold: one full recomputation instead of a
    # region each (pairs of jobs of one name: a failed one, resubmitted an hour later)
    pairs = FULL_LINKS_MIN_REGIONS + 1
    start = at("2026-10-01T00:00:00")
    backfill = []
    for k in range(pairs):
        failed_at = start + 2 * k * HOUR
        backfill += [
            job(1000 + 2 * k, "FAILED", "2026-10-01T00:00:00", None, submit_at=failed_at, start_at=failed_at,
                end_at=failed_at + HOUR / 2, name=f"b{k}"),
            job(1001 + 2 * k, "COMPLETED", "2026-10-01T00:00:00", None, submit_at=failed_at + HOUR,
                start_at=failed_at + HOUR, end_at=failed_at + 2 * HOUR, name=f"b{k}"),
        ]  # fmt: skip
    write(engine, *backfill)
    with engine.connect() as conn, conn.begin() as tx:
        mark = conn.execute(
            text("SELECT value_at FROM attribution_watermark WHERE name = 'jobs'")
        ).scalar_one()
        refresh = refresh_retry_links(conn, window_seconds=21600, job_mark=mark, overlap_seconds=0)
        tx.rollback()
    assert (refresh.full, refresh.links) == (True, pairs)
    run_attribution(engine, config, now=NOW)
    assert links(engine) == {(1001 + 2 * k, 1000 + 2 * k) for k in range(pairs)}
    assert link_rows(engine) == full_links(engine, config)
