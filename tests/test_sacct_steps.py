"""What an attempt's steps used (sacct without -X), kept per attempt for the researcher view:
TotalCPU summed over the steps and the peak memory (largest task, largest step), from the real
Slurm 22.05 lab captures (JSON and -P) and every JSON schema's step shape."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from pathlib import Path

from sqlalchemy import Engine, text

from slurmtel.parsers import sacct_json
from slurmtel.parsers.sacct_json import parse_sacct_json
from slurmtel.parsers.sacct_parsable import SACCT_FIELDS, cpu_time_seconds, parse_sacct_parsable, size_bytes
from slurmtel.records import JobAttempt
from slurmtel.simulate import render_sacct_json, synthetic_jobs
from slurmtel.sources.base import RunContext
from slurmtel.store.jobs import write_attempts
from tests.conftest import fixture_path

LAB = fixture_path("sacct", "slurm-22.05")


def by_id(records: list) -> dict[str, JobAttempt]:  # type: ignore[type-arg]
    return {r.job_id: r for r in records if isinstance(r, JobAttempt)}


def test_json_steps_give_cpu_time_and_peak_memory() -> None:
    jobs = by_id(parse_sacct_json((LAB / "sacct-a-D.json").read_bytes()))
    # job 3: batch (0.017975 s) + srun step 3.0 (0.004286 s); batch peak RSS 10444 KiB
    three = jobs["3"]
    assert (three.cpu_time_seconds, three.usage_steps) == (0.022261, 2)
    assert (three.mem_peak_task_bytes, three.mem_peak_step_bytes) == (10694656, 10694656)
    assert three.alloc_cpus == 2 and three.alloc_tres["mem"] == 512
    # job 13 on two nodes: step 13.0 ran a task on each, 1640 KiB at most, 3280 KiB together
    thirteen = jobs["13"]
    assert (thirteen.mem_peak_task_bytes, thirteen.mem_peak_step_bytes) == (11096064, 11096064)
    # the OOM-killed job's batch step recorded CPU time but no memory
    oom = jobs["14"]
    assert (oom.cpu_time_seconds, oom.mem_peak_task_bytes, oom.usage_steps) == (0.076351, None, 1)
    # cancelled while pending: no step, nothing measured (not zero)
    assert (jobs["9"].cpu_time_seconds, jobs["9"].usage_steps) == (None, None)


def test_parsable_steps_give_the_same_figures() -> None:
    json_jobs = by_id(parse_sacct_json((LAB / "sacct-a-D.json").read_bytes()))
    psv = parse_sacct_parsable((LAB / "sacct-a-D-P.psv").read_text(), timezone=UTC)
    assert len([r for r in psv if isinstance(r, JobAttempt)]) == 22
    for job_id, attempt in by_id(psv).items():
        other = json_jobs[job_id]
        assert attempt.mem_peak_task_bytes == other.mem_peak_task_bytes, job_id
        assert attempt.mem_peak_step_bytes == other.mem_peak_step_bytes, job_id
        assert attempt.usage_steps == other.usage_steps, job_id
        if attempt.cpu_time_seconds is not None:
            # -P prints TotalCPU to the millisecond
            assert abs(attempt.cpu_time_seconds - (other.cpu_time_seconds or 0)) < 0.002, job_id
    # -X: allocations only, nothing measured
    allocations = parse_sacct_parsable((LAB / "sacct-a-D-X-P.psv").read_text(), timezone=UTC)
    assert {(r.cpu_time_seconds, r.usage_steps) for r in allocations if isinstance(r, JobAttempt)} == {
        (None, None)
    }


def test_job_by_job_and_whole_document_reads_agree_with_steps() -> None:
    jobs = list(synthetic_jobs(300, start=datetime(2026, 11, 1, tzinfo=UTC)))
    for steps in (0, 1, 3):
        raw = render_sacct_json(jobs, usage_steps=steps)
        fast = parse_sacct_json(raw)
        assert fast == sacct_json._parse_whole(raw, "<input>")
        started = [r for r in fast if isinstance(r, JobAttempt) and r.start_at is not None]
        assert {r.usage_steps for r in started} == ({steps} if steps else {None})
    for path in sorted(fixture_path("sacct").rglob("*.json")):
        try:
            records = parse_sacct_json(path.read_bytes())
        except Exception:
            continue  # the documents that are refused as a whole, tested elsewhere
        assert records == sacct_json._parse_whole(path.read_bytes(), "<input>"), path


def test_parsable_field_list_and_helpers() -> None:
    assert SACCT_FIELDS[-1] == "JobName"
    assert {"TotalCPU", "TRESUsageInTot", "TRESUsageInMax"} <= set(SACCT_FIELDS)
    assert cpu_time_seconds("00:00.017") == 0.017
    assert cpu_time_seconds("1-02:03:04.5") == 93784.5
    assert cpu_time_seconds("") is None
    assert (
        size_bytes("10444K") == 10444 * 1024 and size_bytes("1.5G") == 1610612736 and size_bytes("") is None
    )


def test_a_later_record_without_steps_keeps_the_usage(engine: Engine) -> None:
    (job,) = [
        a for a in by_id(parse_sacct_json((LAB / "sacct-a-D.json").read_bytes())).values() if a.job_id == "3"
    ]
    bare = dataclasses.replace(
        job, cpu_time_seconds=None, mem_peak_task_bytes=None, mem_peak_step_bytes=None, usage_steps=None
    )
    with engine.begin() as conn:
        write_attempts(conn, [job])
    with engine.begin() as conn:
        stats = write_attempts(conn, [bare])
    assert stats.updated == 0
    with engine.connect() as conn:
        row = conn.execute(
            text(
                "SELECT cpu_time_seconds, mem_peak_task_bytes, usage_steps, stdout_path FROM job_attempt_outcome"
            )
        ).one()
    assert tuple(row) == (0.022261, 10694656, 2, "")


def test_steps_false_reads_allocations_only(ctx: RunContext, tmp_path: Path) -> None:
    from slurmtel.config import config_from_dict
    from slurmtel.sources import default_options, get_source
    from slurmtel.sources.runner import run_recorded

    log = tmp_path / "argv"
    script = tmp_path / "sacct"
    script.write_text(f'#!/bin/sh\necho "$@" >> {log}\ncat {LAB / "sacct-a-D.json"}\n')
    script.chmod(0o755)
    c = dataclasses.replace(
        ctx, config=config_from_dict({"sources": {"sacct": {"command": str(script), "steps": False}}})
    )
    source = get_source("sacct")
    assert run_recorded(c, "sacct", "once", lambda: source.collect(c, default_options(source))).status == "ok"
    assert log.read_text().split()[:3] == ["-a", "-D", "-X"]


def test_efficiency_figures_for_the_researcher_view(engine: Engine) -> None:
    from slurmtel.access import EVERYTHING, Scope
    from slurmtel.store.efficiency import attempt_efficiency
    from slurmtel.store.jobs import sync_outcome_classes

    jobs = by_id(parse_sacct_json((LAB / "sacct-a-D.json").read_bytes()))
    with engine.begin() as conn:
        sync_outcome_classes(conn, {"COMPLETED": "completed"})
        write_attempts(conn, list(jobs.values()))
    three = jobs["3"]
    with engine.connect() as conn:
        (row,) = attempt_efficiency(
            conn,
            cluster="lab",
            job_id_raw=3,
            job_submit_at=three.submit_at,
            scope=EVERYTHING,
            now=three.end_at,
        )
        # job 3: 2 CPUs for 40 s, 0.022261 CPU-seconds; 10444 KiB of 512 MiB; 40 s of a 5 min limit
        assert (row.elapsed_seconds, row.cpu_time_seconds, row.cpu_efficiency_percent) == (
            40.0,
            0.022261,
            0.03,
        )
        assert (row.mem_requested_bytes, row.mem_peak_bytes, row.mem_efficiency_percent) == (
            512 * 2**20,
            10694656,
            1.99,
        )
        assert (row.time_limit_seconds, row.time_limit_used_percent) == (300, 13.33)
        # the TIMEOUT job used its whole limit (77 s of 60: Slurm's grace)
        timeout = jobs["6"]
        (late,) = attempt_efficiency(
            conn,
            cluster="lab",
            job_id_raw=6,
            job_submit_at=timeout.submit_at,
            scope=EVERYTHING,
            now=timeout.end_at,
        )
        assert (late.state, late.time_limit_used_percent) == ("TIMEOUT", 128.33)
        assert attempt_efficiency(
            conn, cluster="lab", job_id_raw=3, job_submit_at=three.submit_at, scope=Scope(users=frozenset({"bob"})),
            now=three.end_at,
        ) == []  # fmt: skip
