"""The head stores the agent's host windows (job cgroups, GPU throttle/PCIe) once each and
quarantines the cgroup files the agent could not read, with their reason."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from pathlib import Path

from sqlalchemy import Engine, text

from slurmtel.agent.spool import Spool
from slurmtel.config import config_from_dict
from slurmtel.records import GpuHostWindow, JobHostWindow, Rejected
from slurmtel.sources import default_options, get_source
from slurmtel.sources.base import RunContext
from slurmtel.sources.runner import run_recorded
from slurmtel.store.hostside import write_gpu_host_windows, write_job_host_windows
from tests.factories import T0
from tests.test_agent_protocol_fabric import TOKEN, served  # noqa: F401  (fixture)

JOB = JobHostWindow(
    node="gpu01", job_id="4242", window_start_at=T0, window_seconds=30.0, cgroup_version=2,
    read_bytes=4000, write_bytes=9_000_000, read_ops=2, write_ops=40, cpu_usage_seconds=30.0, cpus=8,
    memory_peak_bytes=7229440, io_some_stall_seconds=2.0, io_full_stall_seconds=1.0,
)  # fmt: skip
GPU = GpuHostWindow(
    node="gpu01", gpu_uuid="GPU-00000000-0000-0000-0000-000000000000", window_start_at=T0,
    window_seconds=30.0, pcie_tx_bytes=30 * 1024 * 1000, pcie_rx_bytes=None,
    throttle_power_seconds=10.0, throttle_thermal_seconds=0.0, throttle_hw_slowdown_seconds=10.0,
)  # fmt: skip
BAD = Rejected(
    "cgroup",
    "/sys/fs/cgroup",
    "job 4242 io.stat",
    "line 1 rbytes: 'twelve' is not a counter",
    "259:0 rbytes=twelve",
)


def test_host_windows_stored_once_bad_files_quarantined(
    ctx: RunContext,
    served: tuple[Spool, int],  # noqa: F811
    engine: Engine,
    tmp_path: Path,
) -> None:
    spool, port = served
    token = tmp_path / "agent-token"
    token.write_text(TOKEN)
    later = replace(JOB, window_start_at=T0 + timedelta(seconds=30), read_bytes=None)
    spool.append_records([JOB, later, GPU, BAD])
    config = config_from_dict(
        {"sources": {"agent": {"targets": [f"gpu01=127.0.0.1:{port}"], "token_file": str(token)}}}
    )
    c = replace(ctx, config=config)
    source = get_source("agent")
    outcome = run_recorded(c, "agent", "once", lambda: source.collect(c, default_options(source)))
    # the cgroup file the agent could not read makes the run partial (quarantined rows)
    assert outcome.status == "partial", outcome.message
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT job_id, read_bytes, io_some_stall_seconds, cpus FROM job_host_window ORDER BY window_start_at"
            )
        ).all()
        # a figure the node did not give stays NULL, never 0
        assert [tuple(r) for r in rows] == [("4242", 4000, 2.0, 8), ("4242", None, 2.0, 8)]
        gpu = conn.execute(
            text("SELECT pcie_tx_bytes, pcie_rx_bytes, throttle_hw_slowdown_seconds FROM gpu_host_window")
        ).one()
        assert tuple(gpu) == (30 * 1024 * 1000, None, 10.0)
        quarantined = conn.execute(
            text("SELECT source, record_key, reason FROM quarantine WHERE source = 'cgroup'")
        ).one()
        assert quarantined.record_key == "job 4242 io.stat" and "not a counter" in quarantined.reason
    assert spool.stats().items == 0
    with engine.begin() as conn:
        assert write_job_host_windows(conn, [JOB, later]) == 0
        assert write_gpu_host_windows(conn, [GPU]) == 0


def test_host_windows_with_their_gpu_windows_record_no_host_batch(
    ctx: RunContext,
    served: tuple[Spool, int],  # noqa: F811
    engine: Engine,
    tmp_path: Path,
) -> None:
    """A page that brings the job's cgroup windows with its GPU windows (the normal case) adds
    no work for the attribution run: the GPU windows' ingest batch marks the attempt already.
    Cgroup windows of windows whose GPU windows came in an earlier pull (a replayed spool)
    record a host batch, so the next run recomputes that job's causes."""
    from tests.factories import windows

    spool, port = served
    token = tmp_path / "agent-token"
    token.write_text(TOKEN)
    config = config_from_dict(
        {"sources": {"agent": {"targets": [f"gpu01=127.0.0.1:{port}"], "token_file": str(token)}}}
    )
    c = replace(ctx, config=config)
    source = get_source("agent")
    gpu = windows("GPU-00000000-0000-0000-0000-000000000000", T0, 2, job="4242")
    spool.append_records([*gpu, JOB, replace(JOB, window_start_at=T0 + timedelta(seconds=30)), GPU])
    outcome = run_recorded(c, "agent", "once", lambda: source.collect(c, default_options(source)))
    assert outcome.status == "ok", outcome.message
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM job_host_window")).scalar_one() == 2
        assert conn.execute(text("SELECT count(*) FROM ingest_batch")).scalar_one() == 1
        assert conn.execute(text("SELECT count(*) FROM host_batch")).scalar_one() == 0
    # job 4243's cgroup window of the first window, replayed late: the GPU windows of that
    # window came in the pull before
    spool.append_records([replace(JOB, job_id="4243")])
    outcome = run_recorded(c, "agent", "once", lambda: source.collect(c, default_options(source)))
    assert outcome.status == "ok", outcome.message
    with engine.connect() as conn:
        batch = conn.execute(text("SELECT source, node, job_id, window_min_at FROM host_batch")).one()
    assert tuple(batch) == ("job_host", "gpu01", "4243", T0)
