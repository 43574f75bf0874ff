"""Freshness against the real Slurm 22.05 lab (DESIGN §3: a finished job is queryable within
about a minute): `slurmtel run`, a node agent per lab node and the EpilogSlurmctld hook that
tests/slurm_lab/up.sh installs, as a site runs them (tests/integration/freshness.py); a GPU
job ends and `slurmtel job JOBID --format json`, the real CLI, shows its final state, its
GPU-hours and its GPUs' utilisation. How soon is measured by benchmarks/freshness.py, never
asserted here: the only limits are hang guards.

Only the 22.05 lab has the hook (the newer labs run in network namespaces of their own, where
127.0.0.1:9768 is not the host's). Runs after every other real-Slurm test (RUNS_LAST, see
conftest.py): its jobs must not be in the hour the sreport comparison rolled up.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import Engine

from tests.integration.freshness import (
    ROOT,
    Rig,
    Watched,
    gpu_uuid,
    sacct_ends,
    submit,
    wait_idle,
    watch,
)
from tests.integration.lab import SlurmLab
from tests.test_daemon import rows, wait_for

pytestmark = pytest.mark.slurm
RUNS_LAST = True

HOST_LAB = pytest.mark.parametrize("slurm_lab", ["22.05"], indirect=True, ids=["slurm-22.05"])


@HOST_LAB
def test_a_finished_gpu_job_is_shown_by_slurmtel_job_with_its_gpu_hours_and_utilisation(
    slurm_lab: SlurmLab, engine: Engine, database_url: str, tmp_path: Path
) -> None:
    lab = slurm_lab
    wait_idle(lab)
    with Rig(lab, tmp_path, database_url) as rig:
        wait_for(
            lambda: rows(engine, "SELECT 1 FROM collect_run WHERE source = 'sacct'"),
            "the daemon's first sacct run",
        )
        job = Watched(submit(lab, 40, gpus=2), gpus=2)
        watch(rig, [job])
        notified = rig.job_end_notifications()
        log = rig.daemon.log()
    state, end = sacct_ends(lab, [job.job_id])[job.job_id]
    report = job.report
    assert (report["job_id"], report["state"], state) == (str(job.job_id), "COMPLETED", "COMPLETED")
    assert end is not None and report["end_at"] == end.isoformat()
    assert report["gpus"] == 2 and len(report["nodes"]) == 1
    node = report["nodes"][0]
    elapsed = report["elapsed_seconds"]
    assert elapsed >= 40
    figures = report["gpu_figures"]
    # the GPUs the controller saw the job on, by the UUIDs that node's agent reported
    assert len({g["gpu_uuid"] for g in figures}) == 2
    assert {g["gpu_uuid"] for g in figures} <= {gpu_uuid(int(node[-2:]), i) for i in range(4)}
    assert {(g["node"], g["mapping"]) for g in figures} == {(node, "slurmctld")}
    # GPU time: every allocated GPU-second, on a GPU (to the millisecond)
    assert sum(g["allocated_gpu_seconds"] for g in figures) == pytest.approx(2 * elapsed, abs=0.01)
    for g in figures:
        # the capture is of a GPU under load
        assert g["mean_util_share"] is not None and 0 < g["mean_util_share"] <= 1
        # how much the agents' 1 s samples cover depends on how busy the host is
        assert g["covered_share"] is not None and 0 < g["covered_share"] <= 1
    assert job.shown_after is not None and job.complete_after is not None
    # the job's end came through the hook: slurmctld ran it as SlurmUser, MUNGE let it in
    assert notified >= 1
    assert f"event=job_ended job_id={job.job_id} " in log


@HOST_LAB
def test_the_freshness_benchmark_runs_and_prints_its_measures(slurm_lab: SlurmLab, server_url: str) -> None:
    """benchmarks/freshness.py at a toy size (tests/test_benchmarks.py runs the others): that it
    works and prints what it is for, never how fast."""
    wait_idle(slurm_lab)
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "freshness.py"), "--jobs", "2", "--dsn", server_url],
        capture_output=True,
        text=True,
        check=False,
        timeout=1800,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for word in ("hook on", "p50", "p95", "max", "target"):
        assert word in proc.stdout, f"freshness.py printed no '{word}':\n{proc.stdout}"
