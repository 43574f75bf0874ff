"""Runs cut short by a kill are marked `interrupted` at the next start; a truncated capture is
recovered in memory bounded by its largest job, not by the file; a run's duration is the time
it took, whatever site.clock says."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time
import tracemalloc
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy import Engine, text

from slurmtel.access import Identity, Role
from slurmtel.cli import main
from slurmtel.config import config_from_dict
from slurmtel.parsers.sacct_json import parse_sacct_json
from slurmtel.records import JobAttempt, Rejected
from slurmtel.simulate import render_sacct_json, synthetic_jobs
from slurmtel.sources.base import RunContext, RunResult
from slurmtel.sources.runner import run_recorded
from slurmtel.store.runs import INTERRUPTED_MESSAGE, mark_interrupted_runs, start_run


def statuses(engine: Engine) -> list[tuple[int, str]]:
    with engine.connect() as conn:
        return [(int(i), s) for i, s in conn.execute(text("SELECT id, status FROM collect_run ORDER BY id"))]


def killed_run(database_url: str, tmp_path: Path) -> None:
    """Another process records a run and is killed -9 in the middle of it."""
    script = tmp_path / "victim.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import os, signal
            from datetime import UTC, datetime
            from sqlalchemy import create_engine
            from slurmtel.store.runs import start_run
            start_run(create_engine({database_url!r}), "sacct", "once", datetime.now(UTC))
            os.kill(os.getpid(), signal.SIGKILL)
            """
        )
    )
    proc = subprocess.run([sys.executable, str(script)], cwd=Path(__file__).parents[1], timeout=60)
    assert proc.returncode == -signal.SIGKILL


def test_a_run_whose_process_was_killed_is_marked_interrupted_at_the_next_start(
    ctx: RunContext, database_url: str, tmp_path: Path
) -> None:
    killed_run(database_url, tmp_path)
    assert [s for _, s in statuses(ctx.engine)] == ["running"]
    outcome = run_recorded(ctx, "dcgm", "once", RunResult)
    assert outcome.status == "ok"
    assert [s for _, s in statuses(ctx.engine)] == ["interrupted", "ok"]
    with ctx.engine.connect() as conn:
        assert conn.execute(text("SELECT message FROM collect_run ORDER BY id LIMIT 1")).scalar_one() == (
            INTERRUPTED_MESSAGE
        )


def test_a_run_still_running_elsewhere_is_left_alone(engine: Engine) -> None:
    # its lock is held by a live session (another process, another host): it is not touched
    lock = start_run(engine, "sacct", "scheduled", datetime.now(UTC))
    try:
        assert mark_interrupted_runs(engine) == []
        assert statuses(engine) == [(lock.run_id, "running")]
    finally:
        lock.release()
    # released without an end recorded (a crash between the two): interrupted
    assert mark_interrupted_runs(engine) == [lock.run_id]


def test_runs_shows_interrupted_runs(
    engine: Engine, database_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    killed_run(database_url, tmp_path)
    config = tmp_path / "slurmtel.toml"
    config.write_text(f'[database]\nurl = "{database_url}"\n')
    scrape = tmp_path / "empty-scrape.txt"  # any run will do: the next one marks the killed one
    scrape.write_text("")
    capsys.readouterr()
    assert (
        main(
            ["--config", str(config), "collect", "dcgm", "--input", str(scrape), "--node", "n", "--at", "now"]
        )
        == 0
    )
    assert main(["--config", str(config), "runs", "--format", "json"]) == 0
    out = capsys.readouterr().out
    assert '"status": "interrupted"' in out and INTERRUPTED_MESSAGE in out


def test_a_truncated_capture_is_recovered_in_memory_bounded_by_its_largest_job() -> None:
    """Python allocations while parsing a cut capture (the general path) against the same
    jobs complete (the job-by-job path): about the same, where reading the cut document whole
    took ten times its size (1.8 GB for a 150 MB capture)."""
    jobs = list(synthetic_jobs(1500, start=datetime(2026, 11, 1, tzinfo=UTC)))
    raw = render_sacct_json(jobs)
    cut = raw[: len(raw) * 99 // 100]

    def peak(data: bytes) -> tuple[int, list[object]]:
        tracemalloc.start()
        try:
            records = parse_sacct_json(data, origin="memory")
            return tracemalloc.get_traced_memory()[1], list(records)
        finally:
            tracemalloc.stop()

    peak_cut, salvaged = peak(cut)
    assert isinstance(salvaged[-1], Rejected) and salvaged[-1].record_key == "truncated input"
    kept = [r for r in salvaged if isinstance(r, JobAttempt)]
    assert len(kept) > 1400
    peak_complete, whole = peak(render_sacct_json(jobs[: len(kept)]))
    assert kept == [r for r in whole if isinstance(r, JobAttempt)]
    # the cut document's text (one str of its size) is the only extra; no tree of every job
    assert peak_cut < peak_complete + 1.5 * len(cut), (peak_cut, peak_complete, len(cut))


def test_runs_shows_how_long_a_run_took_when_the_clock_stands_still(
    engine: Engine,
    monkeypatch: pytest.MonkeyPatch,
    database_url: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """site.clock holds still while a run works (a fixed instant; the demo's clock file between
    moves): its duration is still the time it took."""
    fixed = datetime(2026, 12, 2, 14, 0, tzinfo=UTC)
    ctx = RunContext(
        config=config_from_dict({"site": {"clock": fixed.isoformat()}}), engine=engine, clock=lambda: fixed
    )

    def slow() -> RunResult:
        time.sleep(0.4)
        return RunResult(rows_read=1)

    run_recorded(ctx, "agent", "once", slow)
    config = tmp_path / "slurmtel.toml"
    config.write_text(f'[site]\nclock = "{fixed.isoformat()}"\n')
    monkeypatch.setenv("SLURMTEL_DATABASE_URL", database_url)
    monkeypatch.setattr(
        "slurmtel.commands.common.current_identity", lambda config: Identity("root", Role.ADMIN)
    )
    assert main(["--config", str(config), "runs", "--format", "json"]) == 0
    out = capsys.readouterr().out
    (row,) = json.loads(out)
    assert row["started_at"].startswith("2026-12-02T14:00:00")
    assert 0.4 <= float(row["duration_seconds"]) < 30
