from __future__ import annotations

from sqlalchemy import Engine, text

from slurmtel.records import Rejected
from slurmtel.store.jobs import sync_outcome_classes, write_attempts
from slurmtel.store.quarantine import list_quarantine, quarantine
from slurmtel.store.runs import get_cursor, set_cursor
from tests.factories import at, attempt


def snapshot(engine: Engine) -> list[tuple]:
    with engine.connect() as conn:
        return [
            tuple(r)
            for r in conn.execute(text("SELECT * FROM job_attempt ORDER BY cluster, job_id_raw, submit_at"))
        ]


def test_write_is_idempotent_on_the_natural_key(engine: Engine) -> None:
    batch = [attempt(job_id_raw=1), attempt(job_id_raw=2, alloc_gpus=4)]
    with engine.begin() as conn:
        first = write_attempts(conn, batch)
    before = snapshot(engine)
    with engine.begin() as conn:
        second = write_attempts(conn, batch)
    assert (first.inserted, first.updated) == (2, 0)
    assert (second.inserted, second.updated, second.unchanged) == (0, 0, 2)
    # not a single column changed, updated_at included
    assert snapshot(engine) == before


def test_a_changed_record_updates_the_same_row(engine: Engine) -> None:
    running = attempt(job_id_raw=7, state="RUNNING", end_at=None)
    with engine.begin() as conn:
        write_attempts(conn, [running])
    done = attempt(job_id_raw=7, state="TIMEOUT", end_at=at("2026-11-01T10:30:00"))
    with engine.begin() as conn:
        stats = write_attempts(conn, [done])
    assert (stats.inserted, stats.updated) == (0, 1)
    rows = snapshot(engine)
    assert len(rows) == 1
    with engine.connect() as conn:
        state, end = conn.execute(text("SELECT state, end_at FROM job_attempt")).one()
    assert (state, end) == ("TIMEOUT", at("2026-11-01T10:30:00"))


def test_duplicates_inside_one_batch_keep_the_last(engine: Engine) -> None:
    with engine.begin() as conn:
        stats = write_attempts(
            conn,
            [attempt(job_id_raw=3, state="RUNNING", end_at=None), attempt(job_id_raw=3, state="COMPLETED")],
        )
    assert stats.received == 1
    with engine.connect() as conn:
        assert conn.execute(text("SELECT state FROM job_attempt")).scalar_one() == "COMPLETED"


def test_requeued_attempts_are_linked_into_one_job_and_a_reused_id_is_not(engine: Engine) -> None:
    first = attempt(
        job_id_raw=19,
        submit_at=at("2026-11-01T10:00:00"),
        state="NODE_FAIL",
        start_at=at("2026-11-01T10:00:00"),
        end_at=at("2026-11-01T10:05:00"),
    )
    second = attempt(
        job_id_raw=19,
        submit_at=at("2026-11-01T10:05:00"),
        state="COMPLETED",
        start_at=at("2026-11-01T10:06:00"),
        end_at=at("2026-11-01T10:10:00"),
    )
    # the controller state was wiped weeks later: id 19 again, a different job
    reused = attempt(
        job_id_raw=19,
        submit_at=at("2026-11-20T09:00:00"),
        user="bob",
        name="other",
        start_at=at("2026-11-20T09:00:00"),
        end_at=at("2026-11-20T10:00:00"),
    )
    with engine.begin() as conn:
        write_attempts(conn, [second, reused])
    with engine.begin() as conn:
        write_attempts(conn, [first])
    with engine.connect() as conn:
        rows = conn.execute(
            text("SELECT submit_at, job_submit_at, attempt_number FROM job_attempt ORDER BY submit_at")
        ).all()
    assert [tuple(r) for r in rows] == [
        (at("2026-11-01T10:00:00"), at("2026-11-01T10:00:00"), 1),
        (at("2026-11-01T10:05:00"), at("2026-11-01T10:00:00"), 2),
        (at("2026-11-20T09:00:00"), at("2026-11-20T09:00:00"), 1),
    ]


def test_outcome_classes_follow_the_config(engine: Engine) -> None:
    with engine.begin() as conn:
        write_attempts(conn, [attempt(job_id_raw=1, state="FOO"), attempt(job_id_raw=2, state="TIMEOUT")])
        sync_outcome_classes(conn, {"TIMEOUT": "user_failure", "COMPLETED": "completed"})
    with engine.connect() as conn:
        rows = dict(conn.execute(text("SELECT state, outcome FROM job_attempt_outcome")).all())
    assert rows == {"FOO": "unknown", "TIMEOUT": "user_failure"}


def test_quarantine_keeps_reason_and_raw_and_counts_repeats(engine: Engine) -> None:
    bad = Rejected("sacct", "dump.json", "job 5", "end precedes start", '{"job_id": 5}')
    with engine.begin() as conn:
        quarantine(conn, [bad])
        quarantine(conn, [bad])
    with engine.connect() as conn:
        (record,) = list_quarantine(conn)
    assert (record.source, record.record_key, record.reason, record.raw, record.seen_count) == (
        "sacct",
        "job 5",
        "end precedes start",
        '{"job_id": 5}',
        2,
    )


def test_cursor_never_moves_back(engine: Engine) -> None:
    with engine.begin() as conn:
        set_cursor(conn, "sacct", "local", at("2026-11-02T00:00:00"))
        set_cursor(conn, "sacct", "local", at("2026-11-01T00:00:00"))
    with engine.connect() as conn:
        assert get_cursor(conn, "sacct", "local") == at("2026-11-02T00:00:00")
        assert get_cursor(conn, "sacct", "other") is None


def test_a_nul_in_a_job_name_keeps_the_attempt(engine: Engine) -> None:
    # sacct --json escapes it as \u0000; PostgreSQL text cannot hold it
    with engine.begin() as conn:
        stats = write_attempts(conn, [attempt(job_id_raw=1, name="train\x00v2"), attempt(job_id_raw=2)])
    assert stats.inserted == 2
    with engine.connect() as conn:
        names = conn.execute(text("SELECT name FROM job_attempt ORDER BY job_id_raw")).scalars().all()
    assert names == ["train\ufffdv2", "train"]
