"""The sacct source's ingest pipeline: several sacct outputs, each stored in its own transaction.

store_documents parses the next document while a writer thread stores the previous one; a
`collect sacct` window longer than sources.sacct.chunk_seconds is read in several sacct calls
and goes through it. Real captures (the lab's sacct -a -D --json, split into documents in
memory) and real commands (scripts that print the capture); synthetic documents in the real
format (slurmtel.simulate) only where volume is the point (the kill test).
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import orjson
import psycopg
import pytest
from sqlalchemy import Engine, text

from slurmtel.config import config_from_dict
from slurmtel.errors import ConfigError, ParseError, SourceUnavailable
from slurmtel.sources import default_options, get_source
from slurmtel.sources.base import RunContext, RunResult
from slurmtel.sources.runner import run_recorded
from slurmtel.sources.sacct import SacctDocument, store_documents
from tests.conftest import fixture_path
from tests.factories import at

LAB = fixture_path("sacct", "slurm-22.05", "sacct-a-D.json")
LAB_JOBS = 22


def lab_documents(parts: int) -> list[bytes]:
    """The lab capture as PARTS sacct outputs (its 22 jobs dealt out in order, same meta)."""
    doc = orjson.loads(LAB.read_bytes())
    jobs = doc["jobs"]
    size = -(-len(jobs) // parts)
    return [orjson.dumps({**doc, "jobs": jobs[i : i + size]}) for i in range(0, len(jobs), size)]


def job_ids(raw: bytes) -> set[int]:
    return {job["job_id"] for job in orjson.loads(raw)["jobs"]}


def stored_ids(engine: Engine) -> list[int]:
    with engine.connect() as conn:
        return sorted(conn.execute(text("SELECT job_id_raw FROM job_attempt")).scalars())


def cursor(engine: Engine) -> datetime | None:
    with engine.connect() as conn:
        return conn.execute(text("SELECT cursor_at FROM source_cursor WHERE scope = 'local'")).scalar()


def documents(raws: list[bytes], first_end: datetime) -> list[SacctDocument]:
    return [
        SacctDocument(f"part {i}", raw, cursor_scope="local", cursor_at=first_end + timedelta(hours=i))
        for i, raw in enumerate(raws)
    ]


def test_documents_are_stored_in_order_each_moving_the_cursor(ctx: RunContext) -> None:
    raws = lab_documents(4)
    assert len(raws) == 4
    result = RunResult()
    store_documents(ctx, documents(raws, at("2026-12-02T10:00:00")), result)
    assert result.notes == [
        f"{LAB_JOBS} attempts read in 4 sacct calls: 22 new, 0 changed, 0 unchanged; 0 quarantined"
    ]
    assert (result.rows_read, result.rows_written, result.rows_quarantined) == (22, 22, 0)
    assert len(stored_ids(ctx.engine)) == LAB_JOBS
    assert cursor(ctx.engine) == at("2026-12-02T13:00:00")
    # the same documents again: not a row changes
    with ctx.engine.connect() as conn:
        before = [tuple(r) for r in conn.execute(text("SELECT * FROM job_attempt ORDER BY 1, 2, 3"))]
    again = RunResult()
    store_documents(ctx, documents(raws, at("2026-12-02T10:00:00")), again)
    assert again.notes == ["22 attempts read in 4 sacct calls: 0 new, 0 changed, 22 unchanged; 0 quarantined"]
    with ctx.engine.connect() as conn:
        assert [tuple(r) for r in conn.execute(text("SELECT * FROM job_attempt ORDER BY 1, 2, 3"))] == before


def test_requeued_attempts_in_different_documents_are_linked(ctx: RunContext) -> None:
    # job 19's NODE_FAIL and COMPLETED attempts (and job 2's two) land in separate documents
    raws = lab_documents(LAB_JOBS)
    store_documents(ctx, documents(raws, at("2026-12-02T10:00:00")), RunResult())
    with ctx.engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT job_id_raw, state, attempt_number, job_submit_at = min(submit_at) OVER w "
                "FROM job_attempt WHERE job_id_raw IN (2, 19) "
                "WINDOW w AS (PARTITION BY job_id_raw) ORDER BY job_id_raw, submit_at"
            )
        ).all()
    assert [tuple(r) for r in rows] == [
        (2, "REQUEUED", 1, True),
        (2, "COMPLETED", 2, True),
        (19, "NODE_FAIL", 1, True),
        (19, "COMPLETED", 2, True),
    ]


def test_an_unreadable_document_stops_after_the_ones_before_it(ctx: RunContext) -> None:
    raws = lab_documents(4)
    docs = documents([raws[0], raws[1], b"{ not json", raws[3]], at("2026-12-02T10:00:00"))
    with pytest.raises(ParseError, match="part 2"):
        store_documents(ctx, docs, RunResult())
    assert set(stored_ids(ctx.engine)) == job_ids(raws[0]) | job_ids(raws[1])
    assert cursor(ctx.engine) == at("2026-12-02T11:00:00")


POISON = 4_000_000_000


@pytest.fixture
def poisoned_writes(monkeypatch: pytest.MonkeyPatch) -> None:
    """A write of attempts fails (as a database would) when its batch holds job POISON: one
    bad record no longer fails its batch, so a failed write is made, not found."""
    import slurmtel.sources.sacct as sacct_source

    real = sacct_source.write_attempts

    def write_attempts(conn, attempts, **kwargs):  # type: ignore[no-untyped-def]
        attempts = list(attempts)
        if any(a.job_id_raw == POISON for a in attempts):
            raise psycopg.DataError("the database refused the write")
        return real(conn, attempts, **kwargs)

    monkeypatch.setattr(sacct_source, "write_attempts", write_attempts)


def poison(raw: bytes) -> bytes:
    doc = orjson.loads(raw)
    doc["jobs"][0]["job_id"] = POISON
    return orjson.dumps(doc)


@pytest.mark.usefixtures("poisoned_writes")
def test_after_a_failed_write_no_later_document_is_written(ctx: RunContext) -> None:
    raws = lab_documents(4)
    # the second document's transaction fails
    docs = documents([raws[0], poison(raws[1]), raws[2], raws[3]], at("2026-12-02T10:00:00"))
    with pytest.raises(psycopg.DataError):
        store_documents(ctx, docs, RunResult())
    assert set(stored_ids(ctx.engine)) == job_ids(raws[0])
    assert cursor(ctx.engine) == at("2026-12-02T10:00:00")


@pytest.mark.usefixtures("poisoned_writes")
def test_a_fetch_failure_after_a_write_failure_reports_the_write_first(ctx: RunContext) -> None:
    (raw,) = lab_documents(1)

    def fetched() -> Iterator[SacctDocument]:
        yield SacctDocument("part 0", poison(raw), cursor_scope="local", cursor_at=at("2026-12-02T10:00:00"))
        raise SourceUnavailable("sacct failed: slurmdbd down")

    # the write of part 0 fails whether before or after the next sacct call does: the
    # earlier document's error is the one raised, the other one is noted
    with pytest.raises(psycopg.DataError) as failure:
        store_documents(ctx, fetched(), RunResult())
    assert failure.value.__notes__ == [
        "then, reading a later document: SourceUnavailable: sacct failed: slurmdbd down"
    ]
    assert stored_ids(ctx.engine) == []
    assert cursor(ctx.engine) is None


# ---------------------------------------------------------------- collect sacct, in chunks


def fake_sacct(tmp_path: Path, *, fail_on: str = "") -> tuple[str, Path]:
    """A sacct that logs its arguments and prints the lab capture (or fails for one -S)."""
    log = tmp_path / "sacct-argv.log"
    script = tmp_path / "sacct"
    fail = (
        f'case "$*" in *"-S {fail_on} "*) echo "sacct: error: slurmdbd down" >&2; exit 1;; esac\n'
        if fail_on
        else ""
    )
    script.write_text(f'#!/bin/sh\necho "$@" >> {log}\n{fail}cat {LAB}\n')
    script.chmod(0o755)
    return str(script), log


def sacct_ctx(ctx: RunContext, command: str, **sacct: object) -> RunContext:
    return replace(ctx, config=config_from_dict({"sources": {"sacct": {"command": command, **sacct}}}))


def test_a_long_window_is_read_in_chunks(ctx: RunContext, tmp_path: Path) -> None:
    command, log = fake_sacct(tmp_path)
    source = get_source("sacct")
    options = default_options(source)
    options.start, options.end = "2026-12-02T10:00:00", "2026-12-02T12:30:00"
    c = sacct_ctx(ctx, command, chunk_seconds=3600)
    outcome = run_recorded(c, "sacct", "once", lambda: source.collect(c, options))
    assert log.read_text().splitlines() == [
        "-a -D -S 2026-12-02T10:00:00 -E 2026-12-02T11:00:00 --json",
        "-a -D -S 2026-12-02T11:00:00 -E 2026-12-02T12:00:00 --json",
        "-a -D -S 2026-12-02T12:00:00 -E 2026-12-02T12:30:00 --json",
    ]
    assert outcome.status == "ok"
    # the fake prints the same 22 jobs for every chunk: upserts, not duplicates
    assert outcome.result.notes == [
        "66 attempt records read in 3 sacct calls (22 distinct attempts: 22 new, 0 changed, 0 unchanged); "
        "0 quarantined"
    ]
    assert (outcome.result.window_start_at, outcome.result.window_end_at) == (
        at("2026-12-02T10:00:00"),
        at("2026-12-02T12:30:00"),
    )
    assert len(stored_ids(ctx.engine)) == LAB_JOBS
    assert cursor(ctx.engine) is None  # an explicit window leaves the cursor alone


def test_chunk_seconds_zero_is_one_call(ctx: RunContext, tmp_path: Path) -> None:
    command, log = fake_sacct(tmp_path)
    source = get_source("sacct")
    options = default_options(source)
    options.start, options.end = "2026-11-01T00:00:00", "2026-12-01T00:00:00"
    c = sacct_ctx(ctx, command, chunk_seconds=0)
    run_recorded(c, "sacct", "once", lambda: source.collect(c, options))
    assert log.read_text().splitlines() == ["-a -D -S 2026-11-01T00:00:00 -E 2026-12-01T00:00:00 --json"]


def test_a_failed_chunk_keeps_the_chunks_before_it_and_their_cursor(ctx: RunContext, tmp_path: Path) -> None:
    command, log = fake_sacct(tmp_path, fail_on="2026-12-02T13:00:00")
    source = get_source("sacct")
    # no cursor yet: the first poll reaches back 2 hours from 14:00, in 1-hour calls
    c = sacct_ctx(ctx, command, chunk_seconds=3600, initial_lookback_seconds=7200)
    outcome = run_recorded(c, "sacct", "once", lambda: source.collect(c, default_options(source)))
    assert (outcome.status, outcome.error_kind) == ("error", "source_unavailable")
    assert "slurmdbd down" in outcome.message
    assert len(log.read_text().splitlines()) == 2
    assert len(stored_ids(ctx.engine)) == LAB_JOBS
    # the next poll starts from the end of the stored chunk (minus rescan_seconds)
    assert cursor(ctx.engine) == at("2026-12-02T13:00:00")
    # the failed run's record counts what it stored before the failure
    assert (outcome.result.rows_read, outcome.result.rows_written) == (LAB_JOBS, LAB_JOBS)
    with ctx.engine.connect() as conn:
        recorded = conn.execute(text("SELECT status, rows_read, rows_written FROM collect_run")).one()
    assert tuple(recorded) == ("error", LAB_JOBS, LAB_JOBS)


def test_chunk_seconds_must_not_be_negative() -> None:
    with pytest.raises(ConfigError, match="chunk_seconds"):
        config_from_dict({"sources": {"sacct": {"chunk_seconds": -1}}})


# ---------------------------------------------------------------- a crash at any point

CHILD = """
import sys
from datetime import UTC, datetime, timedelta
from slurmtel.config import Config
from slurmtel.simulate import render_sacct_json, synthetic_jobs
from slurmtel.sources.base import RunContext, RunResult
from slurmtel.sources.sacct import SacctDocument, store_documents
from slurmtel.store.engine import make_engine

url, parts, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
start = datetime(2026, 11, 1, tzinfo=UTC)
docs = [
    SacctDocument(
        f"part {i}",
        render_sacct_json(synthetic_jobs(size, start=start, first_job_id=1_000_000 * (i + 1))),
        cursor_scope="local",
        cursor_at=start + timedelta(hours=i),
    )
    for i in range(parts)
]
print("ready", flush=True)
store_documents(RunContext(config=Config(), engine=make_engine(Config(), url)), docs, RunResult())
print("done", flush=True)
"""
PARTS, SIZE = 8, 4000


def part_counts(engine: Engine) -> dict[int, int]:
    with engine.connect() as conn:
        rows = conn.execute(
            text("SELECT job_id_raw / 1000000 - 1, count(*) FROM job_attempt GROUP BY 1")
        ).all()
    return {int(part): int(count) for part, count in rows}


def test_a_killed_ingest_leaves_whole_documents_and_a_cursor_that_matches(
    ctx: RunContext, database_url: str
) -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, database_url, str(PARTS), str(SIZE)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None and child.stdout.readline() == "ready\n"
        # kill it once the first document is committed: the writer is in the next one's
        # transaction, or between two, or the main thread is parsing
        while cursor(ctx.engine) is None and child.poll() is None:
            time.sleep(0.005)
        child.send_signal(signal.SIGKILL)
    finally:
        child.wait()
    assert child.returncode == -signal.SIGKILL, "the ingest finished before it could be killed"
    counts = part_counts(ctx.engine)
    stored = sorted(counts)
    # whole documents only, a prefix of them, and the cursor at the end of the last one
    assert all(counts[part] == SIZE for part in stored), counts
    assert stored == list(range(len(stored))) and len(stored) < PARTS
    assert cursor(ctx.engine) == datetime(2026, 11, 1, tzinfo=UTC) + timedelta(hours=len(stored) - 1)
    # running it again to the end: every job once
    subprocess.run(
        [sys.executable, "-c", CHILD, database_url, str(PARTS), str(SIZE)],
        check=True,
        capture_output=True,
    )
    assert part_counts(ctx.engine) == dict.fromkeys(range(PARTS), SIZE)


def test_the_summary_counts_records_and_distinct_attempts_apart() -> None:
    # a cursor window and a trailing rescan read attempt A twice; B changed in the rescan
    from slurmtel.sources.sacct import _Totals
    from slurmtel.store.jobs import WriteStats

    a = ("c", 1, at("2026-12-02T10:00:00"))
    b = ("c", 2, at("2026-12-02T10:00:00"))
    c = ("c", 3, at("2026-12-02T10:00:00"))
    # the first write began at t1 (A's first_seen_at), the second at t2; B was stored before, at t0
    t0, t1, t2 = at("2026-12-01T00:00:00"), at("2026-12-02T11:00:00"), at("2026-12-02T11:00:01")
    totals = _Totals()
    totals.add(3, 3, WriteStats(3, 1, 0, written_at=t1), [], [], [a, b, c])
    totals.add(2, 2, WriteStats(2, 0, 2, updated_keys={a: t1, b: t0}, written_at=t2), [], [], [a, b])
    # 5 records, 3 attempts: A new (changed again later: still new), B changed, C unchanged
    assert totals.summary() == (
        "5 attempt records read in 2 sacct calls (3 distinct attempts: 1 new, 1 changed, 1 unchanged); "
        "0 quarantined"
    )
    once = _Totals()
    once.add(2, 2, WriteStats(2, 2, 0, written_at=t1), [], [], [a, b])
    assert once.summary() == "2 attempts read: 2 new, 0 changed, 0 unchanged; 0 quarantined"


def test_an_attempt_the_run_inserted_then_updated_is_new_and_one_stored_before_is_changed(
    ctx: RunContext,
) -> None:
    # the database's side of the summary: an update tells whose insert it follows by the
    # attempt's first_seen_at (the writes return only the keys they updated, not the inserted)
    from slurmtel.simulate import render_sacct_json, synthetic_jobs

    before, a, b = (
        replace(j, state="RUNNING", end_at=None)
        for j in synthetic_jobs(3, start=datetime(2026, 12, 1, tzinfo=UTC))
    )
    ended = [replace(j, state="COMPLETED", end_at=j.start_at + timedelta(hours=1)) for j in (before, a, b)]
    captured = at("2026-12-02T10:00:00")
    store_documents(ctx, [SacctDocument("earlier", render_sacct_json([before]), captured)], RunResult())
    result = RunResult()
    later = captured + timedelta(minutes=1)
    store_documents(
        ctx,
        [
            # A and B new; then A ended (an update of what this run inserted), B unchanged,
            # and the attempt stored before the run ended (a change)
            SacctDocument("one", render_sacct_json([a, b]), later),
            SacctDocument("two", render_sacct_json([ended[1], b, ended[0]]), later + timedelta(minutes=1)),
        ],
        result,
    )
    assert result.notes[0] == (
        "5 attempt records read in 2 sacct calls (3 distinct attempts: 2 new, 1 changed, 0 unchanged); "
        "0 quarantined"
    )
    assert result.rows_written == 4
