"""`slurmtel job JOBID`: per-GPU figures, advice, plot and scope, on hand-built telemetry.

Job 42 runs 25 windows (12.5 min) on 4 GPUs of gpu01 with its processes on all four: GPU-0
busy (80 %) throughout, GPU-1..3 busy in 2 windows of 25 (idle 92 %).
"""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import Engine

from slurmtel.access import EVERYTHING, Identity, Role, Scope
from slurmtel.attribution import run_attribution
from slurmtel.cli import main
from slurmtel.config import Config
from slurmtel.records import GpuSummary, JobAttempt
from slurmtel.reports.plot import UtilWindow, utilisation_series
from slurmtel.store.jobs import sync_outcome_classes, write_attempts
from slurmtel.store.jobview import find_attempts, util_windows
from slurmtel.store.telemetry import write_inventory, write_summaries
from tests.factories import T0, attempt, inventory, windows

UUIDS = ["GPU-0", "GPU-1", "GPU-2", "GPU-3"]
NOW = T0 + timedelta(days=2)
ALICE = Identity("alice", Role.USER)
BOB = Identity("bob", Role.USER)
PHYSICS_COORDINATOR = Identity("carol", Role.USER, frozenset({"physics"}))
ADMIN = Identity("root", Role.ADMIN)
FINANCE = Identity("fiona", Role.FINANCE)


def job_42() -> JobAttempt:
    return attempt(
        job_id_raw=42,
        submit_at=T0 - timedelta(minutes=5),
        eligible_at=T0 - timedelta(minutes=3),
        start_at=T0,
        end_at=T0 + timedelta(seconds=750),
        alloc_gpus=4,
        gpu_model="h100",
        nodes=("gpu01",),
        nodelist="gpu01",
        exit_code="0:0",
    )


def telemetry_42() -> list[GpuSummary]:
    summaries = windows("GPU-0", T0, 25, busy=set(range(25)), job="42")
    for uuid in UUIDS[1:]:
        summaries += windows(uuid, T0, 25, busy={0, 1}, job="42")
    return summaries


def store(engine: Engine, config: Config, attempts: list[JobAttempt], summaries: list[GpuSummary]) -> None:
    with engine.begin() as conn:
        sync_outcome_classes(conn, config.outcomes.mapping())
        write_attempts(conn, attempts)
        write_inventory(conn, inventory("gpu01", UUIDS), source="agent")
        write_summaries(conn, summaries, source="agent", node="gpu01")
    run_attribution(engine, config, now=NOW)


def other_jobs() -> list[JobAttempt]:
    return [
        # requeued: a node failure, then a completed second attempt; no telemetry
        attempt(
            job_id_raw=43, submit_at=T0, start_at=T0, end_at=T0 + timedelta(minutes=2), state="NODE_FAIL"
        ),
        attempt(
            job_id_raw=43,
            submit_at=T0 + timedelta(minutes=3),
            eligible_at=T0 + timedelta(minutes=3),
            start_at=T0 + timedelta(minutes=4),
            end_at=T0 + timedelta(minutes=10),
            exit_code="0:0",
        ),
        # array task 10_4 (its own raw id 15) and het job component 123+1 (raw id 124)
        attempt(job_id_raw=15, job_id="10_4", array_job_id=10, array_task_id=4, user="bob", account="chem"),
        attempt(job_id_raw=124, job_id="123+1", het_job_id=123, het_job_offset=1),
    ]


@pytest.fixture
def cli(engine: Engine, database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys):
    config_file = tmp_path / "slurmtel.toml"
    config_file.write_text("")
    monkeypatch.setenv("SLURMTEL_DATABASE_URL", database_url)
    monkeypatch.setattr("slurmtel.commands.common.utc_now", lambda: NOW)

    def run(identity: Identity, *argv: str) -> tuple[int, str, str]:
        monkeypatch.setattr("slurmtel.commands.common.current_identity", lambda config: identity)
        code = main(["--config", str(config_file), "--log-level", "WARNING", *argv])
        out, err = capsys.readouterr()
        return code, out, err

    return run


def test_per_gpu_figures_and_advice(cli, engine: Engine, config: Config) -> None:
    store(engine, config, [job_42()], telemetry_42())
    code, out, _ = cli(ALICE, "job", "42", "--format", "json")
    assert code == 0
    (report,) = json.loads(out)
    assert {k: report[k] for k in ("job_id", "user", "account", "state", "exit_code", "gpus", "nodes")} == {
        "job_id": "42",
        "user": "alice",
        "account": "physics",
        "state": "COMPLETED",
        "exit_code": "0:0",
        "gpus": 4,
        "nodes": ["gpu01"],
    }
    assert (report["elapsed_seconds"], report["queue_wait_seconds"]) == (750, 180)
    rows = {r["gpu_uuid"]: r for r in report["gpu_figures"]}
    assert rows["GPU-0"] == {
        "gpu": "gpu01/0",
        "gpu_uuid": "GPU-0",
        "node": "gpu01",
        "mapping": "process",
        "allocated_gpu_seconds": 750.0,
        "mean_util_share": 0.8,
        "max_util_share": 0.95,
        "idle_share": 0.0,
        "covered_share": 1.0,
        "memory_used_max_bytes": 40 * 2**30,
        "memory_total_bytes": None,
        "power_mean_watts": 10.0,  # 300 J per 30 s window
        "power_max_watts": None,  # the windows carry no power
        "power_limit_watts": None,  # nor the inventory its cap
        "energy_joules": 7500.0,  # 25 windows x 300 J
    }
    for uuid in UUIDS[1:]:
        # 2 of 25 windows at 80 %: mean 6.4 %, idle 23 of 25
        assert (rows[uuid]["mean_util_share"], rows[uuid]["idle_share"]) == (0.064, 0.92)
    assert report["advice"] == ["3 of 4 GPUs idle 92 % of the time: ask for 1 GPU."]

    code, text_out, _ = cli(ALICE, "job", "42")
    assert code == 0
    assert text_out.startswith("Job 42 (train) on cluster lab\n  user        alice\n")
    assert "  queue wait  00:03:00\n" in text_out
    assert "  GPUs        4 x h100\n" in text_out
    assert text_out.endswith("Advice:\n  * 3 of 4 GPUs idle 92 % of the time: ask for 1 GPU.\n")


def test_requeued_job_lists_attempts_newest_first(cli, engine: Engine, config: Config) -> None:
    store(engine, config, other_jobs(), [])
    code, out, _ = cli(ADMIN, "job", "43", "--format", "json")
    assert code == 0
    reports = json.loads(out)
    assert [(r["attempt"], r["attempts"], r["state"], r["outcome"]) for r in reports] == [
        (2, 2, "COMPLETED", "completed"),
        (1, 2, "NODE_FAIL", "system_failure"),
    ]
    assert reports[0]["queue_wait_seconds"] == 60
    # no telemetry: said, not guessed
    assert reports[0]["advice"] == [
        "No GPU telemetry covers this job (no node agent or dcgm-exporter data for its GPUs): "
        "slurmtel cannot judge how it used them."
    ]
    code, out, _ = cli(ADMIN, "job", "43")
    assert "Job 43 (train) on cluster lab, attempt 2 of 2\n" in out
    assert "Job 43 (train) on cluster lab, attempt 1 of 2\n" in out


def test_array_and_het_job_ids(engine: Engine, config: Config) -> None:
    store(engine, config, other_jobs(), [])
    with engine.connect() as conn:
        assert [a.job_id for a in find_attempts(conn, "10_4", scope=EVERYTHING)] == ["10_4"]
        assert [a.job_id for a in find_attempts(conn, "15", scope=EVERYTHING)] == ["10_4"]
        assert [a.job_id for a in find_attempts(conn, "123+1", scope=EVERYTHING)] == ["123+1"]
        assert find_attempts(conn, "123", scope=EVERYTHING) == []
        assert find_attempts(conn, "10_4", scope=EVERYTHING, clusters=("other",)) == []
        with pytest.raises(ValueError, match="not a job id"):
            find_attempts(conn, "10_[1-3]", scope=EVERYTHING)


def test_a_job_outside_the_scope_answers_like_a_missing_job(cli, engine: Engine, config: Config) -> None:
    store(engine, config, [job_42(), *other_jobs()], telemetry_42())
    hidden = cli(BOB, "job", "42")
    missing = cli(BOB, "job", "99999")
    assert hidden[0] == missing[0] == 1
    assert hidden[1] == missing[1] == ""
    assert hidden[2] == missing[2].replace("99999", "42") == "slurmtel: job 42 not found\n"
    code, out, err = cli(BOB, "job", "99999", "--format", "json")
    assert cli(BOB, "job", "42", "--format", "json") == hidden == (code, out, err.replace("99999", "42"))
    # bob sees his own array task; the physics coordinator sees alice's job, not bob's
    assert cli(BOB, "job", "10_4")[0] == 0
    assert cli(PHYSICS_COORDINATOR, "job", "42")[0] == 0
    assert cli(PHYSICS_COORDINATOR, "job", "10_4")[2] == "slurmtel: job 10_4 not found\n"


def test_finance_sees_no_job_and_bad_ids_are_usage_errors(cli, engine: Engine) -> None:
    code, out, err = cli(FINANCE, "job", "42")
    assert (code, out) == (1, "")
    assert "fiona (finance) may not view jobs" in err
    code, _, err = cli(ADMIN, "job", "42;DROP")
    assert code == 2 and "not a job id" in err


def test_plot_is_a_png_of_the_windows(cli, engine: Engine, config: Config, tmp_path: Path) -> None:
    summaries = telemetry_42()
    # another GPU of the node and windows outside the job are not plotted
    summaries += windows("GPU-X", T0, 25, busy={1}, job="")
    summaries += windows("GPU-0", T0 + timedelta(hours=1), 2)
    store(engine, config, [job_42()], summaries)
    plot = tmp_path / "job42.png"
    code, _, err = cli(ALICE, "job", "42", "--plot", str(plot))
    assert code == 0 and f"wrote {plot}" in err
    data = plot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    assert len(data) > 10_000
    # the plotted series are the job's windows of its four GPUs, exactly
    job = job_42()
    with engine.connect() as conn:
        series = utilisation_series(util_windows(conn, UUIDS, start=job.start_at, end=job.end_at))  # type: ignore[arg-type]
    assert sorted(series) == UUIDS
    for uuid in UUIDS:
        expected = [
            (s.window_start_at, s.window_seconds, s.util_mean_percent)
            for s in summaries
            if s.gpu_uuid == uuid and T0 <= s.window_start_at < job.end_at  # type: ignore[operator]
        ]
        assert [(p.start_at, p.seconds, p.util_percent) for p in series[uuid]] == expected
        assert len(expected) == 25


def test_series_prefer_the_agent_and_are_in_time_order() -> None:
    def w(uuid: str, minute: int, util: float, source: str = "agent") -> UtilWindow:
        return UtilWindow(uuid, T0 + timedelta(minutes=minute), 30.0, util, source)

    series = utilisation_series(
        [w("B", 1, 10.0), w("A", 2, 20.0, "dcgm"), w("A", 2, 25.0), w("A", 1, 5.0, "dcgm"), w("B", 0, 1.0)]
    )
    assert {k: [(p.start_at.minute, p.util_percent) for p in v] for k, v in series.items()} == {
        "A": [(1, 5.0), (2, 25.0)],
        "B": [(0, 1.0), (1, 10.0)],
    }


def test_a_running_attempt_counts_up_to_now_and_thin_telemetry_is_said(
    cli, engine: Engine, config: Config
) -> None:
    running = replace(job_42(), state="RUNNING", end_at=None)
    store(engine, config, [running], telemetry_42())
    with engine.connect() as conn:
        (found,) = find_attempts(conn, "42", scope=Scope(users=frozenset({"alice"})))
    assert (found.state, found.outcome, found.end_at) == ("RUNNING", "running", None)
    code, out, _ = cli(ALICE, "job", "42", "--format", "json")
    (report,) = json.loads(out)
    assert (code, report["elapsed_seconds"]) == (0, 2 * 86400)
    # 750 s measured of 2 days: 0.4 %; a running job's advice is so far, and it has no exit code
    assert report["advice"] == [
        "So far, telemetry covers only 0 % of the allocated GPU time: too little to advise on utilisation."
    ]
    assert (report["exit_code"], report["so_far"], report["so_far_at"]) == (None, True, NOW.isoformat())


def test_gpus_are_listed_as_nvidia_smi_numbers_them(cli, engine: Engine, config: Config) -> None:
    """Issue 22 item 8: per node, by index, not by UUID (gpu04/3, gpu04/2, gpu04/0, gpu04/1 before)."""
    # UUIDs whose order is not the index order, on two nodes
    gpu04 = ["GPU-d", "GPU-c", "GPU-a", "GPU-b"]  # indices 0..3
    gpu05 = ["GPU-9", "GPU-8", "GPU-7", "GPU-6"]
    job = replace(job_42(), alloc_gpus=8, nodes=("gpu04", "gpu05"), nodelist="gpu04,gpu05")
    summaries = [
        replace(w, node=node)
        for node, uuids in (("gpu04", gpu04), ("gpu05", gpu05))
        for uuid in uuids
        for w in windows(uuid, T0, 25, busy={0}, job="42")
    ]
    with engine.begin() as conn:
        sync_outcome_classes(conn, config.outcomes.mapping())
        write_attempts(conn, [job])
        write_inventory(conn, inventory("gpu04", gpu04) + inventory("gpu05", gpu05), source="agent")
        for node, uuids in (("gpu04", gpu04), ("gpu05", gpu05)):
            write_summaries(conn, [s for s in summaries if s.gpu_uuid in uuids], source="agent", node=node)
    run_attribution(engine, config, now=NOW)
    code, out, _ = cli(ALICE, "job", "42", "--format", "json")
    assert code == 0
    (report,) = json.loads(out)
    expected = ["gpu04/0", "gpu04/1", "gpu04/2", "gpu04/3", "gpu05/0", "gpu05/1", "gpu05/2", "gpu05/3"]
    assert [r["gpu"] for r in report["gpu_figures"]] == expected
    code, text_out, _ = cli(ALICE, "job", "42")
    listed = [line.split()[0] for line in text_out.splitlines() if line.startswith(("gpu04/", "gpu05/"))]
    assert listed == expected


def test_a_running_job_shows_no_exit_code_and_says_so_far(cli, engine: Engine, config: Config) -> None:
    """Issue 22 item 8: sacct's 0:0 of a running job is no exit code; its figures and advice are
    so far. Its steps have reported no usage yet (slurmdbd records it when a step ends)."""
    running = replace(
        job_42(), state="RUNNING", end_at=None, exit_code="0:0", time_limit_seconds=3600,
        alloc_cpus=8, alloc_tres={"cpu": 8, "mem": 32768, "gres/gpu": 4},
        cpu_time_seconds=0.0, usage_steps=2,
    )  # fmt: skip
    now = T0 + timedelta(seconds=750)
    with engine.begin() as conn:
        sync_outcome_classes(conn, config.outcomes.mapping())
        write_attempts(conn, [running])
        write_inventory(conn, inventory("gpu01", UUIDS), source="agent")
        write_summaries(conn, telemetry_42(), source="agent", node="gpu01")
    run_attribution(engine, config, now=now)
    code, text_out, _ = cli(ALICE, "job", "42")
    assert code == 0
    assert "exit code" not in text_out
    assert "  state       RUNNING (still running: every figure below is so far, to " in text_out
    assert (
        "  elapsed     " in text_out and " so far\n" in text_out.split("  elapsed")[1].split("\n")[0] + "\n"
    )
    not_yet = "not known yet (sacct reports a step's usage when the step ends)"
    assert f"  CPUs        8 CPUs, efficiency {not_yet}\n" in text_out
    assert f"  host memory 32.0 GiB requested, peak {not_yet}\n" in text_out
    assert "\nPer GPU, so far (the job is still running)\n" in text_out
    assert (
        "\nAdvice so far (the job is still running):\n  * So far, 3 of 4 GPUs idle 92 % of the time"
        in text_out
    )


def test_the_power_limit_comes_from_the_inventory(cli, engine: Engine, config: Config) -> None:
    store(engine, config, [job_42()], telemetry_42())
    with engine.begin() as conn:
        capped = [replace(g, power_limit_watts=700.0) for g in inventory("gpu01", UUIDS)]
        write_inventory(conn, capped, source="agent")
        # a later sighting by a source that does not know the cap (dcgm without the field) keeps it
        later = [replace(g, observed_at=T0 + timedelta(hours=1)) for g in inventory("gpu01", UUIDS)]
        write_inventory(conn, later, source="dcgm")
    code, out, _ = cli(ALICE, "job", "42", "--format", "json")
    (report,) = json.loads(out)
    assert code == 0 and [r["power_limit_watts"] for r in report["gpu_figures"]] == [700.0] * 4
