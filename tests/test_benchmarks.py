"""Every benchmark still runs (at toy sizes, against the tests' PostgreSQL) and prints what
its issue asks for: a rate, a ratio measured in the same run, and the target. The figures
themselves are not checked here: speed is measured by running the benchmarks, not in tests."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from sqlalchemy import Engine, text

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"

CASES = {
    "sacct_ingest.py": (["--jobs", "3000", "--batch", "1000"], ["jobs/s", "ratio", "target"]),
    "telemetry_ingest.py": (
        ["--gpus", "16", "--hours", "1"],
        ["rows/s", "prometheus_client", "ratio", "target", "agent CPU per GPU-second"],
    ),
    "attribution.py": (
        ["--gpus", "16", "--hours", "3"],
        ["samples/s", "target", "full recompute", "idle causes", "ratio", "planted causes", "exact: met"],
    ),
    "window_storage.py": (
        ["--gpus", "8", "--days", "1"],
        ["bytes/window", "ratio", "target", "40 GB", "added bytes per stored GPU-window"],
    ),
    "agent_host_cpu.py": (["--seconds", "60"], ["us CPU per GPU-second", "ratio after/before", "target"]),
    "scale.py": (
        # two and a half hours: the runs at 01:10 and 02:10 pack the hour before
        ["--gpus", "16", "--hours", "2.5"],
        [
            "rows/s",
            "ratio to COPY",
            "early",
            "late",
            "runs that pack nothing (",
            "runs that pack (",
            "windows packed a run",
            "lag",
            "bytes per GPU-day",
            "usage",
            "target",
        ],
    ),
    "reports.py": (["--jobs", "3000", "--batch", "1000", "--pending", "50", "--repeat", "1"], ["target"]),
    "chargeback.py": (["--jobs", "3000", "--batch", "1000", "--repeat", "1"], ["target"]),
    "api.py": (
        ["--jobs", "500", "--requests", "20", "--threads", "2", "--cli-repeat", "1"],
        ["req/s", "p95", "direct query", "login-node CLI", "slurmtel job", "report usage", "target"],
    ),
    "actions.py": (
        ["--gpus", "16", "--jobs", "4", "--hours", "1.2", "--steps", "1"],
        ["attribution", "action round", "ratio", "where", "target"],
    ),
    "slowloris.py": (
        ["--connections", "100", "--addresses", "4", "--requests", "30", "--seconds", "20"],
        ["slow connections", "idle median", "agent", "serve", "x idle", "target"],
    ),
    "dcgm_scrape.py": (["--gpus", "80,160"], ["GPUs", "ms/GPU", "ratio", "linear", "target"]),
    "pages.py": (
        ["--jobs", "500", "--hours", "2", "--requests", "5", "--cli-repeat", "1"],
        [
            "GET /jobs/",
            "as its user",
            "as an admin",
            "p95",
            "KB",
            "slurmtel job",
            "the page's p95 / the CLI's median",
            "target",
        ],
    ),
    "peers.py": (
        ["--nodes", "1", "--hours", "2", "--repeat", "1"],
        [
            "promtool backfill",
            "ratio backfill",
            "ratio job SQL",
            "ratio job SQL as the API serves it",
            "ratio job end to end",
            "ratio report idle",
            "target",
        ],
    ),
    "job_sql.py": (
        ["--nodes", "1", "--hours", "2", "--repeat", "1", "--rounds", "1", "--partitions", "3"],
        ["job_document", "as the API serves it", "statements", "planning", "execution"],
    ),
    "sacct_store_statements.py": (
        ["--jobs", "2000", "--batch", "1000"],
        ["write_attempts", "client", "backend"],
    ),
    "tsdb_replay.py": (
        ["--gpus", "64", "--hours", "0.25"],
        ["attribution per step", "target", "B per sample", "PostgreSQL: grew", "reports over"],
    ),
    "cli_start.py": (
        ["--jobs", "300", "--repeat", "1"],
        [
            "bare interpreter",
            "slurmtel --version",
            "floor",
            "slurmtel job",
            "report usage",
            "report idle",
            "the API path",
            "target",
        ],
    ),
}


@pytest.mark.parametrize("script", sorted(CASES))
def test_the_benchmark_runs_and_prints_its_measures(script: str, server_url: str) -> None:
    args, expected = CASES[script]
    proc = subprocess.run(
        [sys.executable, str(BENCHMARKS / script), *args, "--dsn", server_url],
        capture_output=True,
        text=True,
        check=False,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for word in expected:
        assert word in proc.stdout, f"{script} printed no '{word}':\n{proc.stdout}"
    # CPU seconds beside wall seconds (benchmarks/cputime.py), the backends' read from /proc: the
    # tests' server runs on this machine
    assert "s CPU (client " in proc.stdout or "CPU s" in proc.stdout, f"{script} printed no CPU seconds"
    assert "backend CPU not measured" not in proc.stdout or script == "slowloris.py", proc.stdout


def test_every_benchmark_is_run_here() -> None:
    helpers = {"scratch.py", "cputime.py", "dcgm_parse.py", "agent_cpu.py"}  # run by telemetry_ingest.py
    helpers.add("served.py")  # run by job_sql.py and peers.py
    # needs the Slurm lab: run by tests/integration/test_slurm_freshness.py
    helpers.add("freshness.py")
    assert {p.name for p in BENCHMARKS.glob("*.py")} - helpers == set(CASES)


def _cputime():  # type: ignore[no-untyped-def]
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import cputime
    finally:
        sys.path.remove(str(BENCHMARKS))
    return cputime


def test_the_cpu_meter_measures_a_busy_loop_in_the_client_and_in_the_backend(engine: Engine) -> None:
    cputime = _cputime()
    meter = cputime.Meter(engine)
    # the client: a loop that spins until this process has used 0.3 s of CPU
    with meter.measure() as client_loop:
        t0 = time.process_time()
        while time.process_time() - t0 < 0.3:
            pass
    assert 0.3 <= client_loop.usage.client < 0.3 + client_loop.usage.wall
    # the backend: a loop in PL/pgSQL spinning for 0.5 s of wall, against one sleeping as long
    busy = "DO $$ DECLARE t0 timestamptz := clock_timestamp(); BEGIN WHILE clock_timestamp() - t0 < interval '0.5 s' LOOP END LOOP; END $$"
    with meter.measure() as backend_loop, engine.connect() as conn:
        conn.execute(text(busy))
    with meter.measure() as sleeping, engine.connect() as conn:
        conn.execute(text("SELECT pg_sleep(0.5)"))
    busy_cpu, idle_cpu = backend_loop.usage.backend, sleeping.usage.backend
    assert busy_cpu is not None and idle_cpu is not None, "the tests' server runs here: its backends are read"
    # on a shared 2-CPU machine a spinning backend gets at least a fifth of a core; a sleeping
    # one almost nothing; neither is counted as the client's
    assert 0.1 <= busy_cpu <= backend_loop.usage.wall + 0.05, backend_loop.usage
    assert idle_cpu < 0.05, sleeping.usage
    assert backend_loop.usage.client < busy_cpu, backend_loop.usage
    assert "backend" in str(backend_loop.usage) and "not measured" not in str(backend_loop.usage)
    line = cputime.ratios("busy / sleeping", backend_loop.usage, sleeping.usage)
    assert line.startswith("busy / sleeping: wall ") and ", CPU " in line


def test_the_cpu_meter_says_so_when_the_backends_are_not_on_this_machine(
    engine: Engine, tmp_path: Path
) -> None:
    cputime = _cputime()
    # a /proc without the backends' pids: what a client sees of a server on another machine
    meter = cputime.Meter(engine, proc=tmp_path)
    with meter.measure() as section, engine.connect() as conn:
        conn.execute(text("SELECT 1"))
    assert section.usage.backend is None
    assert "backend CPU not measured" in str(section.usage)
