"""The rules on real telemetry in the real database: idle stretches folded from the windows,
the GPU rules' steps, exclusions, and `act --dry-run`'s decisions with their evidence.

Windows are 30 s (tests.factories.windows): busy at 80 % with 40 GiB in use, idle at 0 % with
1 GiB (at actions.idle_memory_max_bytes, so idle).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import Engine, text

from slurmtel.actions.cycle import run_cycle
from slurmtel.actions.recipients import Recipients
from slurmtel.attribution import run_attribution
from slurmtel.config import Config, config_from_dict
from slurmtel.records import GpuAllocation
from slurmtel.store.actions import add_exclusion
from slurmtel.store.jobs import write_attempts
from slurmtel.store.telemetry import write_allocations, write_inventory, write_summaries
from tests.factories import T0, attempt, inventory, windows

NODE = "gpu01"
GPUS = ["GPU-a0", "GPU-a1", "GPU-a2", "GPU-a3"]


def actions_config(**actions: Any) -> Config:
    settings: dict[str, Any] = {
        "recipients": {"domain": "example.org"},
    }
    settings.update(actions)
    return config_from_dict({"actions": settings})


def running_job(job_id_raw: int = 7, *, gpus: int = 2, user: str = "alice", **overrides: Any) -> Any:
    return attempt(
        job_id_raw=job_id_raw,
        submit_at=T0 - timedelta(minutes=1),
        start_at=T0,
        end_at=None,
        state="RUNNING",
        nodes=(NODE,),
        alloc_gpus=gpus,
        user=user,
        time_limit_seconds=8 * 3600,
        **overrides,
    )


def load(engine: Engine, job: Any, summaries: list[Any], indices: list[int], now: datetime) -> None:
    """JOB on GPUs INDICES of gpu01 (slurmctld's indices), SUMMARIES stored, attribution run."""
    with engine.begin() as conn:
        write_attempts(conn, [job])
        write_inventory(conn, inventory(NODE, GPUS), source="agent")
        write_allocations(
            conn, [GpuAllocation("lab", job.job_id_raw, job.submit_at, NODE, i, T0) for i in indices]
        )
        from slurmtel.store.telemetry import resolve_allocation_uuids

        resolve_allocation_uuids(conn)
        if summaries:
            write_summaries(conn, summaries, source="agent", node=NODE)
    run_attribution(engine, Config(), now=now)


def more(engine: Engine, summaries: list[Any], now: datetime) -> None:
    with engine.begin() as conn:
        write_summaries(conn, summaries, source="agent", node=NODE)
    run_attribution(engine, Config(), now=now)


def no_coordinators(config: Config) -> Recipients:
    return Recipients(config, coordinators=dict)


def dry(engine: Engine, config: Config, now: datetime) -> Any:
    return run_cycle(engine, config, now=now, dry_run=True, recipients=no_coordinators(config))


def by_rule(report: Any) -> dict[str, list[Any]]:
    found: dict[str, list[Any]] = {}
    for d in report.decisions:
        found.setdefault(d.rule.name, []).append(d)
    return found


def after(minutes: float, seconds: float = 10) -> datetime:
    return T0 + timedelta(minutes=minutes, seconds=seconds)


# ------------------------------------------------------------------ idle stretches


def test_an_idle_gpu_is_warned_with_its_evidence(engine: Engine) -> None:
    config = actions_config()
    # 70 minutes: GPU 0 busy, GPU 1 idle with the job's process on it
    load(
        engine,
        running_job(),
        windows("GPU-a0", T0, 140, busy=set(range(140)), job="7") + windows("GPU-a1", T0, 140, job="7"),
        [0, 1],
        after(70),
    )
    report = dry(engine, config, after(70))
    rules = by_rule(report)
    assert set(rules) == {"idle-gpus"}, [d.reason for d in report.decisions]
    (warning,) = rules["idle-gpus"]
    assert (warning.step, warning.kind, warning.job_id, warning.user) == ("warning", "message", "7", "alice")
    assert warning.recipients == [("alice@example.org", "owner")]
    evidence = warning.evidence
    assert evidence["figures"]["matched_gpus"] == 1 and evidence["figures"]["gpus"] == 2
    assert evidence["figures"]["stretch_seconds"] == pytest.approx(70 * 60)
    shown = {g["gpu"]: g for g in evidence["gpus"]}
    assert shown["gpu01/1"]["matched"] and not shown["gpu01/0"]["matched"]
    assert shown["gpu01/1"]["idle_stretch_seconds"] == pytest.approx(4200)
    assert shown["gpu01/1"]["idle_stretch_util_max_share"] == 0.0
    assert shown["gpu01/1"]["idle_stretch_memory_used_max_bytes"] == 2**30
    assert shown["gpu01/0"]["idle_stretch_seconds"] == 0.0
    # nothing recorded by a dry run
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM action_log")).scalar_one() == 0
        assert conn.execute(text("SELECT count(*) FROM action_gpu_streak")).scalar_one() == 0
    message = report.rendered[0]
    assert "gpu01/1" in message.text and "1 h 10 min" in message.text
    assert message.title.startswith("Job 7 (train): 1 of 2 GPUs idle for 1 h 10 min")


def test_no_process_gpus_are_told_after_30_minutes(engine: Engine) -> None:
    config = actions_config()
    load(
        engine,
        running_job(),
        windows("GPU-a0", T0, 80, busy=set(range(80)), job="7")
        + windows("GPU-a1", T0, 80, no_process=set(range(80)), job="7"),
        [0, 1],
        after(40),
    )
    rules = by_rule(dry(engine, config, after(40)))
    assert set(rules) == {"no-process-gpus"}
    (decision,) = rules["no-process-gpus"]
    assert decision.evidence["figures"]["stretch_seconds"] == pytest.approx(40 * 60)
    assert decision.template == "gpus_no_process-warning"


def test_a_busy_window_or_a_gap_starts_a_new_stretch(engine: Engine) -> None:
    config = actions_config()
    busy_at_100 = windows("GPU-a1", T0, 140, busy={100}, job="7")
    load(engine, running_job(), busy_at_100, [1], after(70))
    assert dry(engine, config, after(70)).decisions == []
    # the same for a gap of three windows (unmeasured time is never idle time)
    engine_rows = [w for i, w in enumerate(windows("GPU-a1", T0, 140, job="7")) if not 97 <= i <= 99]
    with engine.begin() as conn:
        conn.execute(text("TRUNCATE gpu_window, gpu_window_hour, action_batch, action_gpu_streak CASCADE"))
        write_summaries(conn, engine_rows, source="agent", node=NODE)
    report = dry(engine, config, after(70))
    assert report.decisions == [], [d.reason for d in report.decisions]


def test_stretches_grow_across_evaluations_and_batches(engine: Engine) -> None:
    config = actions_config()
    job = running_job(gpus=1)
    load(engine, job, windows("GPU-a1", T0, 50, job="7"), [1], after(25))
    report = run_cycle(engine, config, now=after(25), recipients=no_coordinators(config), deliver=False)
    assert report.decisions == [] and report.fold.batches == 1
    more(engine, windows("GPU-a1", T0 + timedelta(minutes=25), 80, job="7"), after(65))
    report = run_cycle(engine, config, now=after(65), recipients=no_coordinators(config), deliver=False)
    assert report.fold.batches == 1
    assert [(d.rule.name, d.step) for d in report.decisions] == [("idle-gpus", "warning")]
    assert report.decisions[0].evidence["figures"]["stretch_seconds"] == pytest.approx(65 * 60)
    # recorded once: the next evaluation decides nothing new
    again = run_cycle(engine, config, now=after(66), recipients=no_coordinators(config), deliver=False)
    assert again.decisions == []
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT rule, step, status, user_name FROM action_log")).all()
    assert [tuple(r) for r in rows] == [("idle-gpus", "warning", "pending", "alice")]


def test_stale_telemetry_acts_on_nothing(engine: Engine) -> None:
    config = actions_config()
    load(engine, running_job(gpus=1), windows("GPU-a1", T0, 140, job="7"), [1], after(70))
    assert len(dry(engine, config, after(70)).decisions) == 1
    # the newest window ended 16 minutes ago (telemetry_max_age_seconds 900)
    assert dry(engine, config, after(86)).decisions == []


def test_memory_in_use_is_not_idle(engine: Engine) -> None:
    config = actions_config(idle_memory_max_bytes=2**29)
    load(engine, running_job(gpus=1), windows("GPU-a1", T0, 140, job="7"), [1], after(70))
    # 1 GiB in use on a GPU at 0 %: a loaded model, not an idle GPU
    assert dry(engine, config, after(70)).decisions == []


def test_gpus_all_needs_every_gpu(engine: Engine) -> None:
    rules = [{"name": "all-idle", "kind": "gpus_idle", "warn_minutes": 60, "gpus": "all"}]
    config = actions_config(rules=rules)
    summaries = windows("GPU-a0", T0, 140, busy=set(range(140)), job="7") + windows(
        "GPU-a1", T0, 140, job="7"
    )
    load(engine, running_job(), summaries, [0, 1], after(70))
    assert dry(engine, config, after(70)).decisions == []
    with engine.begin() as conn:
        later = T0 + timedelta(minutes=70)
        write_summaries(
            conn, windows("GPU-a0", later, 130, job="7") + windows("GPU-a1", later, 130, job="7"), source="agent",
            node=NODE,
        )  # fmt: skip
    # GPU 0 idle for 65 minutes now, GPU 1 for 135: both past 60
    report = dry(engine, config, after(135))
    assert [d.step for d in report.decisions] == ["warning"]
    assert report.decisions[0].evidence["figures"]["stretch_seconds"] == pytest.approx(65 * 60)


# ------------------------------------------------------------------ steps


def test_a_job_first_seen_late_gets_the_final_warning_only(engine: Engine) -> None:
    config = actions_config()
    load(engine, running_job(gpus=1), windows("GPU-a1", T0, 220, job="7"), [1], after(110))
    report = dry(engine, config, after(110))
    assert [(d.rule.name, d.step) for d in report.decisions] == [("idle-gpus", "final_warning")]


def test_cancel_false_never_cancels(engine: Engine) -> None:
    config = actions_config()
    load(engine, running_job(gpus=1), windows("GPU-a1", T0, 260, job="7"), [1], after(130))
    report = run_cycle(engine, config, now=after(130), recipients=no_coordinators(config), deliver=False)
    assert [d.step for d in report.decisions] == ["final_warning"]
    assert any("cancel = false" in s.reason for s in report.skipped)
    later = dry(engine, config, after(130, 40))
    assert later.decisions == []


def test_cancel_waits_for_the_delivered_final_warning_and_the_grace(engine: Engine) -> None:
    rules = [
        {"name": "idle-cancel", "kind": "gpus_idle", "warn_minutes": 60, "final_warning_minutes": 105,
         "cancel_minutes": 120, "cancel": True, "grace_minutes": 15},
    ]  # fmt: skip
    config = actions_config(rules=rules)
    load(engine, running_job(gpus=1), windows("GPU-a1", T0, 250, job="7"), [1], after(106))
    report = run_cycle(engine, config, now=after(106), recipients=no_coordinators(config), deliver=False)
    assert [d.step for d in report.decisions] == ["final_warning"]
    # 125 minutes idle, the final warning not delivered yet: no cancel
    report = dry(engine, config, after(125))
    assert report.decisions == []
    assert [s.reason for s in report.skipped] == ["cancel waits: the final warning has not reached the owner"]
    # delivered at 110: the grace runs to 125
    with engine.begin() as conn:
        conn.execute(text("UPDATE action_delivery SET state = 'sent', sent_at = :at"), {"at": after(110, 0)})
    report = dry(engine, config, after(120, 0))
    assert report.decisions == [] and "grace until" in report.skipped[0].reason
    report = dry(engine, config, after(125))
    assert [(d.step, d.kind) for d in report.decisions] == [("cancel", "cancel")]
    assert report.decisions[0].evidence["threshold_minutes"] == 120


def test_exclusions_of_the_rule_and_the_exclusion_list(engine: Engine) -> None:
    base = {"name": "idle", "kind": "gpus_idle", "warn_minutes": 60}
    summaries = windows("GPU-a1", T0, 140, job="7")
    load(engine, running_job(gpus=1, name="interactive", qos="debug"), summaries, [1], after(70))
    cases: list[tuple[dict[str, Any], str]] = [
        ({"exclude_users": ["alice"]}, "user alice is in exclude_users"),
        ({"exclude_accounts": ["physics"]}, "account physics is in exclude_accounts"),
        ({"exclude_partitions": ["gpu"]}, "partition gpu is in exclude_partitions"),
        ({"exclude_qos": ["debug"]}, "QOS debug is in exclude_qos"),
        ({"exclude_job_names": ["inter*"]}, "the job name matches exclude_job_names 'inter*'"),
        ({"exclude_shorter_than_minutes": 600}, "the job is shorter than exclude_shorter_than_minutes (600)"),
        ({"exclude_interactive": True}, "an interactive job (exclude_interactive)"),
    ]
    for extra, reason in cases:
        report = dry(engine, actions_config(rules=[{**base, **extra}]), after(70))
        assert report.decisions == [], extra
        assert [s.reason for s in report.skipped] == [f"excluded: {reason}"], extra
    # only the rule's partitions
    assert dry(engine, actions_config(rules=[{**base, "partitions": ["other"]}]), after(70)).skipped == []
    with engine.begin() as conn:
        add_exclusion(
            conn, user="alice", starts_at=T0, ends_at=T0 + timedelta(days=7), reason="thesis deadline",
            created_by="root", now=T0,
        )  # fmt: skip
    report = dry(engine, actions_config(rules=[base]), after(70))
    assert report.decisions == []
    assert "alice is on the exclusion list until" in report.skipped[0].reason
    assert "(thesis deadline)" in report.skipped[0].reason
    assert (
        len(dry(engine, actions_config(rules=[base]), T0 + timedelta(days=8)).decisions) == 0
    )  # stale by then


def test_a_rule_that_would_act_on_too_many_acts_on_none(engine: Engine) -> None:
    rules = [{"name": "idle", "kind": "gpus_idle", "warn_minutes": 60, "max_jobs_per_run": 2}]
    config = actions_config(rules=rules, recipients={"domain": "example.org", "admins": ["hpc@example.org"]})
    jobs = [running_job(10 + i, gpus=1, user=f"user{i}") for i in range(3)]
    with engine.begin() as conn:
        write_attempts(conn, jobs)
        write_inventory(conn, inventory(NODE, GPUS), source="agent")
        summaries = []
        for i in range(3):
            summaries += windows(GPUS[i], T0, 140, job=str(10 + i))
        write_summaries(conn, summaries, source="agent", node=NODE)
    run_attribution(engine, Config(), now=after(70))
    report = run_cycle(engine, config, now=after(70), recipients=no_coordinators(config), deliver=False)
    assert [(d.kind, d.step) for d in report.decisions] == [("alert", f"too_many:{T0:%Y-%m-%d}")]
    assert report.decisions[0].recipients == [("hpc@example.org", "admins")]
    assert len([s for s in report.skipped if "would act on 3 jobs" in s.reason]) == 3
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM action_log WHERE kind = 'message'")).scalar_one() == 0
    # the alert once a day
    assert (
        run_cycle(engine, config, now=after(71), recipients=no_coordinators(config), deliver=False).recorded
        == 0
    )
