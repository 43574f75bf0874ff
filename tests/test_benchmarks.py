"""Every benchmark still runs (at toy sizes, against the tests' PostgreSQL) and prints what
its issue asks for: a rate, a ratio measured in the same run, and the target. The figures
themselves are not checked here: speed is measured by running the benchmarks, not in tests."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"

CASES = {
    "sacct_ingest.py": (["--jobs", "3000", "--batch", "1000"], ["jobs/s", "ratio", "target"]),
    "telemetry_ingest.py": (
        ["--gpus", "16", "--hours", "1"],
        ["rows/s", "prometheus_client", "ratio", "target", "agent CPU per GPU-second"],
    ),
    "attribution.py": (
        ["--gpus", "16", "--hours", "3"],
        ["samples/s", "target", "full recompute", "idle causes", "ratio"],
    ),
    "window_storage.py": (
        ["--gpus", "8", "--days", "1"],
        ["bytes/window", "ratio", "target", "40 GB", "added bytes per stored GPU-window"],
    ),
    "agent_host_cpu.py": (["--seconds", "60"], ["us CPU per GPU-second", "ratio after/before", "target"]),
    "scale.py": (
        ["--gpus", "16", "--hours", "1"],
        ["rows/s", "ratio to COPY", "early", "late", "lag", "bytes per GPU-day", "usage", "target"],
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
    "cli_start.py": (
        ["--jobs", "300", "--repeat", "1"],
        ["bare interpreter", "slurmtel --version", "floor", "slurmtel job", "report usage", "target"],
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


def test_every_benchmark_is_run_here() -> None:
    helpers = {"scratch.py", "dcgm_parse.py", "agent_cpu.py"}  # run by telemetry_ingest.py
    # needs the Slurm lab: run by tests/integration/test_slurm_freshness.py
    helpers.add("freshness.py")
    assert {p.name for p in BENCHMARKS.glob("*.py")} - helpers == set(CASES)
