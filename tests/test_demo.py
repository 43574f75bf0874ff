"""`slurmtel demo` end to end: a simulated cluster through the real daemon jobs and commands.

Runs a 2-day simulation (the demo's default is a week) in its own embedded PostgreSQL, like a
new user's first command, and checks the numbers the views print against the simulation.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import text

from slurmtel.cli import main
from slurmtel.config import Config
from slurmtel.demo import DemoRun, build_demo, show_views


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[DemoRun, str]]:
    out = io.StringIO()
    run = build_demo(Config(), out, days=2, directory=tmp_path_factory.mktemp("demo"))
    show_views(run, out)
    yield run, out.getvalue()
    run.engine.dispose()


def expected_gpu_seconds(run: DemoRun) -> int:
    sim = run.simulation
    total = 0.0
    for attempt in sim.attempts:
        job = attempt.job
        if job.start_at is None:
            continue
        end = min(job.end_at or sim.end_at, sim.end_at)
        total += job.gpus * max(0.0, (end - max(job.start_at, sim.start_at)).total_seconds())
    return round(total)


def cli_json(run: DemoRun, capsys: pytest.CaptureFixture[str], *argv: str) -> object:
    capsys.readouterr()
    assert main(["--config", str(run.directory / "slurmtel.toml"), "--log-level", "WARNING", *argv]) == 0
    return json.loads(capsys.readouterr().out)


def window(run: DemoRun) -> list[str]:
    sim = run.simulation
    return ["-S", f"{sim.start_at:%Y-%m-%dT%H:%M:%S}", "-E", f"{sim.end_at:%Y-%m-%dT%H:%M:%S}"]


def test_every_step_and_view_ran(demo: tuple[DemoRun, str]) -> None:
    _, output = demo
    for step in range(1, 8):
        assert f"[{step}/7]" in output
    assert "(exit status" not in output, output
    for title in ("failed GPU-hours", "allocated but idle", "installed GPU-hour", "the queue", "with advice",
                  "my month", "monthly statement"):  # fmt: skip
        assert title in output
    assert "Advice:" in output


def test_the_plot_and_the_statement_were_written(demo: tuple[DemoRun, str]) -> None:
    run, _ = demo
    plot = run.outputs["plot"].read_bytes()
    assert plot[:8] == b"\x89PNG\r\n\x1a\n" and len(plot) > 10_000
    statement = run.outputs["chargeback"].read_text()
    rows = list(csv.reader(io.StringIO(statement.split("\n\n")[0])))
    assert rows[0][:4] == ["month", "kind", "for_month", "cluster"]
    assert any(r[1] == "total" for r in rows[1:])


def test_allocated_gpu_hours_equal_the_simulation(demo: tuple[DemoRun, str], capsys: pytest.CaptureFixture[str]) -> None:
    run, _ = demo
    rows = cli_json(run, capsys, "report", "usage", *window(run), "--format", "json")
    assert isinstance(rows, list)
    assert sum(r["allocated_gpu_seconds"] for r in rows) == expected_gpu_seconds(run)


def test_the_agents_delivered_every_window_once(demo: tuple[DemoRun, str]) -> None:
    run, _ = demo
    sim = run.simulation
    down = sum((o.end_at - o.start_at) // timedelta(seconds=30) for o in sim.outages if o.end_at <= sim.end_at)
    windows_per_gpu = (sim.end_at - sim.start_at) // timedelta(seconds=30)
    expected = sum(n.gpus for n in sim.nodes) * windows_per_gpu - 4 * down
    with run.engine.connect() as conn:
        stored = conn.execute(text("SELECT count(*) FROM gpu_summary")).scalar_one()
        spooled = conn.execute(text("SELECT sum(spool_items) FROM agent_cursor")).scalar_one()
    assert stored == expected
    assert spooled == 0


def test_taxonomy_parts_add_up_to_installed(demo: tuple[DemoRun, str], capsys: pytest.CaptureFixture[str]) -> None:
    run, _ = demo
    result = cli_json(run, capsys, "report", "taxonomy", *window(run), "--format", "json")
    rows = result["taxonomy"] if isinstance(result, dict) else result
    assert rows
    parts = ("unavailable", "unallocated", "allocated_no_process", "allocated_idle", "active", "unmeasured")
    for row in rows:
        total = sum(float(row[f"{p}_gpu_hours"]) for p in parts)
        assert total == pytest.approx(float(row["installed_gpu_hours"]), abs=1e-6)


def test_the_demo_config_is_a_real_config(demo: tuple[DemoRun, str]) -> None:
    run, _ = demo
    path = run.directory / "slurmtel.toml"
    assert main(["check-config", str(path)]) == 0
    assert Path(run.config.state_dir()) == run.directory
