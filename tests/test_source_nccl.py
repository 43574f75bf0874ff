"""The nccl source end to end: real nccl-tests logs and real sacct records into PostgreSQL.

`collect nccl --input` stores a log (linked to a job with --job); `--once` finds ended
acceptance jobs in job_attempt (written from the real Slurm 22.05 lab capture), derives each
one's StdOut path as Slurm does and reads it. Job records are the real ones; only their work
directory is moved into the test's tmp_path (in memory), since the lab's /home/carol is not here.
"""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import Engine, text

from slurmtel.cli import main
from slurmtel.config import config_from_dict
from slurmtel.parsers.sacct_json import parse_sacct_json
from slurmtel.parsers.sacct_parsable import parse_sacct_parsable
from slurmtel.records import GpuInventory, JobAttempt
from slurmtel.sources import default_options, get_source
from slurmtel.sources.base import RunContext
from slurmtel.sources.nccl import stdout_path_of
from slurmtel.sources.runner import run_recorded
from slurmtel.store.fabric import JobRef, find_job
from slurmtel.store.jobs import sync_outcome_classes, write_attempts
from slurmtel.store.telemetry import write_inventory
from tests.conftest import fixture_path
from tests.factories import at

NCCL_CASES = fixture_path("nccl_tests", "cases")
# sacct -a -D -P with SubmitLine and WorkDir (22.05's JSON has no submit line)
LAB_SACCT = fixture_path("sacct", "slurm-22.05", "sacct-a-D-P.psv")
GOOD_LOG = NCCL_CASES / "cscs_alps_gh200_2node_srun_v2.17.1_cxi_hook" / "input.txt"
SLOW_LOG = NCCL_CASES / "cscs_alps_gh200_2node_srun_v2.17.1_no_cxi_hook_slow" / "input.txt"
CORRUPT_LOG = NCCL_CASES / "nris_olivia_gh200_4node_slingshot_corrupted_wrong_nonzero" / "input.txt"


@pytest.fixture
def cli_env(monkeypatch: pytest.MonkeyPatch, database_url: str, engine: Engine) -> Engine:
    monkeypatch.setenv("SLURMTEL_DATABASE_URL", database_url)
    monkeypatch.delenv("SLURMTEL_CONFIG", raising=False)
    monkeypatch.setattr("slurmtel.config.DEFAULT_CONFIG_PATH", Path("/nonexistent/slurmtel.toml"))
    return engine


def rows(engine: Engine, sql: str) -> list[tuple]:
    with engine.connect() as conn:
        return [tuple(r) for r in conn.execute(text(sql))]


def lab_attempts(work_dir: Path | None = None) -> list[JobAttempt]:
    attempts = [r for r in parse_sacct_parsable(LAB_SACCT.read_text()) if isinstance(r, JobAttempt)]
    if work_dir is not None:
        attempts = [dataclasses.replace(a, work_dir=str(work_dir)) for a in attempts]
    return attempts


def store_attempts(engine: Engine, attempts: list[JobAttempt]) -> None:
    with engine.begin() as conn:
        sync_outcome_classes(conn, {"COMPLETED": "completed"})
        write_attempts(conn, attempts)


def test_input_stores_a_run_with_its_rows(cli_env: Engine, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["collect", "nccl", "--input", str(GOOD_LOG), "--label", "cxi-hook"]) == 0
    out = capsys.readouterr().out
    assert "all_reduce on 8 ranks, 19.7866 GB/s, ok" in out
    assert rows(
        cli_env,
        "SELECT collective, status, ranks, hosts, nodes, node_set, label, avg_busbw_gbps, sizes, "
        "jsonb_array_length(results), data_type FROM nccl_run",
    ) == [
        (
            "all_reduce",
            "ok",
            8,
            ["nid005471", "nid005487"],
            ["nid005471", "nid005487"],
            "nid005471,nid005487",
            "cxi-hook",
            19.7866,
            25,
            25,
            "float",
        )
    ]
    assert rows(cli_env, "SELECT node, host, ranks FROM nccl_run_node ORDER BY node") == [
        ("nid005471", "nid005471", 4),
        ("nid005487", "nid005487", 4),
    ]
    # the same file again: nothing new
    assert main(["collect", "nccl", "--input", str(GOOD_LOG)]) == 0
    assert "already stored" in capsys.readouterr().out
    assert rows(cli_env, "SELECT count(*) FROM nccl_run") == [(1,)]


def test_input_that_is_not_an_nccl_log_is_quarantined(
    cli_env: Engine, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "slurm-5.out"
    # a real Slurm job's StdOut (the lab's jobs print their GPU environment), not nccl-tests
    log.write_text("host=vm node=gpu01 CUDA_VISIBLE_DEVICES=0 SLURM_JOB_GPUS=0 GPU_DEVICE_ORDINAL=0\n")
    assert main(["collect", "nccl", "--input", str(log)]) == 3
    assert rows(cli_env, "SELECT source, origin, reason FROM quarantine") == [
        (
            "nccl",
            str(log),
            "no nccl-tests or rccl-tests output: no '# nThread' header, rank lines or results table",
        )
    ]
    assert rows(cli_env, "SELECT count(*) FROM nccl_run") == [(0,)]


def test_input_linked_to_a_job_takes_its_nodes_and_their_inventory(cli_env: Engine) -> None:
    store_attempts(cli_env, lab_attempts())
    # job 13 ran on gpu[01-02]; the agents' inventory then
    during = at("2026-12-02T13:01:00")
    with cli_env.begin() as conn:
        write_inventory(
            conn,
            [
                GpuInventory("gpu01", "GPU-1", 0, "NVIDIA H100", during, driver_version="550.54.15", cuda_version="12.4"),
                GpuInventory("gpu02", "GPU-2", 0, "NVIDIA H100", during, driver_version="535.129.03", cuda_version="12.2"),
            ],
            source="agent",
        )  # fmt: skip
    assert main(["collect", "nccl", "--input", str(SLOW_LOG), "--job", "13"]) == 0
    (run,) = rows(cli_env, "SELECT cluster, job_id_raw, job_id, nodes, node_set, run_at FROM nccl_run")
    assert run[:5] == ("lab", 13, "13", ["gpu01", "gpu02"], "gpu01,gpu02")
    job = next(a for a in lab_attempts() if a.job_id == "13")
    assert run[5] == job.end_at
    # the log's hosts (nid*) are not the job's nodes: no host, no ranks, the inventory's versions
    assert rows(
        cli_env,
        "SELECT node, host, ranks, gpu_model, driver_version, cuda_version FROM nccl_run_node ORDER BY node",
    ) == [
        ("gpu01", "", 0, "NVIDIA H100", "550.54.15", "12.4"),
        ("gpu02", "", 0, "NVIDIA H100", "535.129.03", "12.2"),
    ]
    # the same log for another job is another run
    assert main(["collect", "nccl", "--input", str(SLOW_LOG), "--job", "3"]) == 0
    assert rows(cli_env, "SELECT count(*) FROM nccl_run") == [(2,)]


def test_input_for_an_unknown_job_is_a_usage_error(
    cli_env: Engine, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["collect", "nccl", "--input", str(GOOD_LOG), "--job", "999"]) == 2
    assert "config_error: --job 999: no such job" in capsys.readouterr().err
    assert rows(cli_env, "SELECT count(*) FROM nccl_log") == [(0,)]


# ---------------------------------------------------------------- StdOut paths, as Slurm names them


def job_ref(attempt: JobAttempt) -> JobRef:
    return JobRef(
        cluster=attempt.cluster,
        job_id_raw=attempt.job_id_raw,
        submit_at=attempt.submit_at,
        job_id=attempt.job_id,
        start_at=attempt.start_at,
        end_at=attempt.end_at,
        nodes=attempt.nodes,
        name=attempt.name,
        user=attempt.user,
        work_dir=attempt.work_dir,
        stdout_path=attempt.stdout_path,
        stdout_pattern=attempt.stdout_pattern,
        submit_line=attempt.submit_line,
        array_job_id=attempt.array_job_id,
        array_task_id=attempt.array_task_id,
    )


def only_attempt(*parts: str) -> JobAttempt:
    (attempt,) = [r for r in parse_sacct_json(fixture_path(*parts).read_bytes()) if isinstance(r, JobAttempt)]
    return attempt


def test_stdout_path_from_every_kind_of_sacct_record() -> None:
    # 24.05+: Slurm's own expansion
    expanded = only_attempt("sacct", "slurm_web", "25.11", "0.0.44", "slurmdb-job-completed.json")
    assert stdout_path_of(job_ref(expanded)) == Path("/home/vhartman/slurm-5749.out")
    # without it, the pattern, relative to the work dir
    pattern = dataclasses.replace(expanded, stdout_path="")
    assert pattern.stdout_pattern == "slurm-%j.out"
    assert stdout_path_of(job_ref(pattern)) == Path("/home/vhartman/slurm-5749.out")
    # 22.05: no stdout in sacct; the submit line's -o (`sbatch ... -o slurm-%j-%x.out`)
    lab = {a.job_id: a for a in lab_attempts()}
    assert stdout_path_of(job_ref(lab["13"])) == Path("/home/carol/slurm-13-multinode-gpu.out")
    # an array task: %j is the task's own job id (10_1 is job 15)
    assert stdout_path_of(job_ref(lab["10_1"])) == Path("/home/alice/slurm-15-gpu1-array.out")
    # no hint at all: Slurm's default, slurm-%A_%a.out for an array task
    bare = dataclasses.replace(lab["10_1"], submit_line="")
    assert stdout_path_of(job_ref(bare)) == Path("/home/alice/slurm-10_1.out")
    assert stdout_path_of(job_ref(dataclasses.replace(lab["13"], submit_line=""))) == Path(
        "/home/carol/slurm-13.out"
    )


# ---------------------------------------------------------------- the daemon's pickup


def nccl_ctx(ctx: RunContext, **overrides: object) -> RunContext:
    config = config_from_dict(
        {"sources": {"nccl": {"enabled": True, "job_name_pattern": "^multinode-gpu$", **overrides}}}
    )
    return dataclasses.replace(ctx, config=config)


def collect_once(ctx: RunContext):  # type: ignore[no-untyped-def]
    source = get_source("nccl")
    return run_recorded(ctx, "nccl", "once", lambda: source.collect(ctx, default_options(source)))


def test_once_reads_the_stdout_of_ended_acceptance_jobs(ctx: RunContext, tmp_path: Path) -> None:
    attempts = lab_attempts(tmp_path)
    store_attempts(ctx.engine, attempts)
    job = next(a for a in attempts if a.name == "multinode-gpu")
    (tmp_path / "slurm-13-multinode-gpu.out").write_bytes(GOOD_LOG.read_bytes())
    c = dataclasses.replace(nccl_ctx(ctx), clock=lambda: job.end_at + timedelta(minutes=5))
    outcome = collect_once(c)
    assert outcome.status == "ok", outcome.message
    assert rows(ctx.engine, "SELECT job_id, status, avg_busbw_gbps, nodes FROM nccl_run") == [
        ("13", "ok", 19.7866, ["gpu01", "gpu02"])
    ]
    assert rows(ctx.engine, "SELECT job_id_raw, status, path, tries FROM nccl_pickup") == [
        (13, "stored", str(tmp_path / "slurm-13-multinode-gpu.out"), 1)
    ]
    # the next cycle does not read it again
    assert collect_once(c).status == "ok"
    assert rows(ctx.engine, "SELECT count(*), max(tries) FROM nccl_pickup") == [(1, 1)]
    assert rows(ctx.engine, "SELECT count(*) FROM nccl_run") == [(1,)]


def test_once_waits_for_a_late_file_then_quarantines(ctx: RunContext, tmp_path: Path) -> None:
    attempts = lab_attempts(tmp_path)
    store_attempts(ctx.engine, attempts)
    job = next(a for a in attempts if a.name == "multinode-gpu")
    soon = dataclasses.replace(
        nccl_ctx(ctx, wait_seconds=600), clock=lambda: job.end_at + timedelta(seconds=30)
    )
    assert collect_once(soon).status == "ok"
    assert rows(ctx.engine, "SELECT status, tries FROM nccl_pickup") == [("waiting", 1)]
    # it appears: the next cycle reads it
    (tmp_path / "slurm-13-multinode-gpu.out").write_bytes(CORRUPT_LOG.read_bytes())
    assert collect_once(soon).status == "ok"
    assert rows(ctx.engine, "SELECT status, tries FROM nccl_pickup") == [("stored", 2)]
    assert rows(ctx.engine, "SELECT status, wrong_values FROM nccl_run") == [("failed", 3935945)]


def test_once_quarantines_a_file_that_never_came(ctx: RunContext, tmp_path: Path) -> None:
    attempts = lab_attempts(tmp_path)
    store_attempts(ctx.engine, attempts)
    job = next(a for a in attempts if a.name == "multinode-gpu")
    late = dataclasses.replace(nccl_ctx(ctx, wait_seconds=600), clock=lambda: job.end_at + timedelta(hours=1))
    outcome = collect_once(late)
    assert outcome.status == "partial"
    ((reason,),) = rows(ctx.engine, "SELECT reason FROM quarantine WHERE source = 'nccl'")
    assert "not found" in reason and "slurm-13-multinode-gpu.out" in reason
    assert rows(ctx.engine, "SELECT status FROM nccl_pickup") == [("quarantined",)]
    assert collect_once(late).status == "ok"  # not looked at again


def test_once_with_a_pattern_postgresql_refuses_is_a_config_error(ctx: RunContext) -> None:
    store_attempts(ctx.engine, lab_attempts())
    c = dataclasses.replace(
        nccl_ctx(ctx, job_name_pattern="(unclosed"), clock=lambda: at("2026-12-02T14:00:00")
    )
    outcome = collect_once(c)
    assert (outcome.status, outcome.error_kind) == ("error", "config_error")
    assert "job_name_pattern" in outcome.message


def test_find_job_by_id_or_raw_id(engine: Engine) -> None:
    store_attempts(engine, lab_attempts())
    with engine.connect() as conn:
        assert [j.job_id for j in find_job(conn, "10_4")] == ["10_4"]
        assert [j.job_id for j in find_job(conn, "17")] == ["10_3"]
        # a requeued job: the newest attempt first
        assert [j.submit_at for j in find_job(conn, "19")] == sorted(
            (j.submit_at for j in find_job(conn, "19")), reverse=True
        )
        assert find_job(conn, "13", cluster="other") == []


def test_the_daemon_runs_the_pickup_when_enabled(ctx: RunContext) -> None:
    from slurmtel.metrics import DaemonMetrics
    from slurmtel.scheduler import Schedule, enabled_sources

    c = nccl_ctx(ctx, interval_seconds=120)
    schedule = Schedule(c, DaemonMetrics([s.name for s in enabled_sources(c)]))
    jobs = {job.id: job.trigger.interval.total_seconds() for job in schedule.scheduler.get_jobs()}
    assert jobs["source:nccl"] == 120
    off = Schedule(ctx, DaemonMetrics([s.name for s in enabled_sources(ctx)]))
    assert "source:nccl" not in {job.id for job in off.scheduler.get_jobs()}
