"""Cancellation against real Slurm 22.05, 24.11 and 26.05: a GPU job whose agent windows show
its GPUs idle is warned, warned a final time and cancelled with the real `scancel`, after the
re-check (its state from the real squeue, its GPUs' windows); a job of an excluded user, just as
idle, is never cancelled.

The jobs are real (sbatch with fake GPUs); their GPU indices come from the real controller
(the slurmctld source), their accounting from sacct. The lab's GPUs are fake, so their windows
are synthesised (idle, as tests/integration/test_slurm_telemetry.py does for its pattern), and
the evaluations run at the times the rule's minutes fall at after the job's real start: the
windows are written up to each of those times before it (the site clock of a demo, moved on).

Runs after the other real-Slurm tests (RUNS_LAST): its jobs must not be in the hour the sreport
comparison rolled up.
"""

from __future__ import annotations

import os
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, text

from slurmtel.actions.cycle import run_cycle
from slurmtel.actions.recipients import Recipients
from slurmtel.attribution import run_attribution
from slurmtel.config import Config
from slurmtel.records import GpuInventory, GpuSummary
from slurmtel.sources.base import RunContext, utc_now
from slurmtel.store.telemetry import resolve_allocation_uuids, write_inventory, write_summaries
from tests.integration.freshness import wait_idle
from tests.integration.lab import SlurmLab
from tests.integration.test_slurm_sacct import collect, live_ctx, wait_for
from tests.integration.test_slurm_telemetry import NODES, collect_controller, uuid_of
from tests.mail_server import smtp_server

pytestmark = pytest.mark.slurm
RUNS_LAST = True

WINDOW = 60


def lab_config(lab: SlurmLab, server: Any) -> Config:
    rule = {
        "name": "idle-gpus",
        "kind": "gpus_idle",
        "warn_minutes": 60,
        "final_warning_minutes": 105,
        "cancel_minutes": 120,
        "cancel": True,
        "grace_minutes": 15,
        "exclude_users": ["bob"],
    }
    actions = {
        "enabled": True,
        "scancel_command": lab.spec.client("scancel"),
        "recipients": {"domain": "example.org", "coordinators": False},
        "email": {"smtp_host": server.host, "smtp_port": server.port},
        "rules": [rule],
    }
    return lab.config({"actions": actions})


def idle_windows(
    node: str, uuid: str, job: int, start: datetime, end: datetime, *, busy: bool = False
) -> list[GpuSummary]:
    """Idle 60 s windows of UUID for JOB from START until one reaches END (the job's process on
    the GPU, at 0 %); with BUSY, at 90 % with 40 GiB in use."""
    out = []
    t = start
    while t < end:
        out.append(
            GpuSummary(
                source="agent",
                node=node,
                gpu_uuid=uuid,
                window_start_at=t,
                window_seconds=float(WINDOW),
                util_metric="gr_engine_active",
                sample_count=WINDOW,
                covered_seconds=float(WINDOW),
                util_mean_percent=90.0 if busy else 0.0,
                util_max_percent=95.0 if busy else 0.0,
                idle_seconds=0.0 if busy else float(WINDOW),
                no_process_seconds=0.0,
                memory_used_max_bytes=(40 * 2**30) if busy else 512 * 2**20,
                job_ids=(str(job),),
            )
        )
        t += timedelta(seconds=WINDOW)
    return out


def held_gpus(engine: Engine, cluster: str, job: int) -> list[tuple[str, str]]:
    with engine.connect() as conn:
        return [
            (r[0], r[1])
            for r in conn.execute(
                text(
                    "SELECT DISTINCT node, gpu_uuid FROM gpu_allocation WHERE cluster = :c AND job_id_raw = :j"
                ),
                {"c": cluster, "j": job},
            )
        ]


def state(lab: SlurmLab, job: int) -> str:
    return lab.run(["squeue", "-h", "-j", str(job), "-o", "%T"], check=False).strip()


class Rig:
    """Real jobs in the lab, stored as the daemon stores them (sacct, the controller's GPU
    indices), and their GPUs' windows synthesised minute by minute after the jobs' start."""

    def __init__(self, lab: SlurmLab, engine: Engine, config: Config, jobs: list[int]) -> None:
        self.lab, self.engine, self.config = lab, engine, config
        wait_for("the jobs RUNNING", lambda: all(state(lab, job) == "RUNNING" for job in jobs))
        # slurmdbd learns of a start a moment after slurmctld
        wait_for(
            "the jobs RUNNING in sacct",
            lambda: (
                lab.sacct("-n", "-X", "-P", "-j", ",".join(map(str, jobs)), "-o", "State").split()
                == ["RUNNING"] * len(jobs)
            ),
        )
        ctx: RunContext = live_ctx(config, engine)
        started = utc_now()
        collect(ctx, started - timedelta(minutes=10), started + timedelta(minutes=1))
        outcome = collect_controller(ctx)
        assert outcome.status == "ok", outcome.message
        with engine.begin() as conn:
            for node, gpus in NODES.items():
                inventory = [
                    GpuInventory(node=node, gpu_uuid=uuid_of(node, i), index=i, model="NVIDIA H100",
                                 observed_at=started - timedelta(hours=1))
                    for i in range(gpus)
                ]  # fmt: skip
                write_inventory(conn, inventory, source="agent")
            resolve_allocation_uuids(conn)
            starts = dict(
                conn.execute(
                    text(
                        "SELECT job_id_raw, start_at FROM job_attempt WHERE cluster = :c "
                        "AND job_id_raw = ANY(CAST(:jobs AS bigint[]))"
                    ),
                    {"c": lab.cluster, "jobs": jobs},
                ).all()
            )
        assert set(starts) == set(jobs)
        self.gpus = {job: held_gpus(engine, lab.cluster, job) for job in jobs}
        self.start = min(starts.values())
        self.written = {job: starts[job].replace(microsecond=0) for job in jobs}

    def at(self, minutes: float) -> datetime:
        return self.start + timedelta(minutes=minutes, seconds=30)

    def windows_to(self, now: datetime, busy: tuple[int, ...] = ()) -> None:
        """Each job's windows up to NOW: idle, or busy for the jobs in BUSY."""
        with self.engine.begin() as conn:
            for job, held in self.gpus.items():
                for node, uuid in held:
                    windows = idle_windows(node, uuid, job, self.written[job], now, busy=job in busy)
                    write_summaries(conn, windows, source="agent", node=node)
                # the next windows follow on
                self.written[job] = windows[-1].window_start_at + timedelta(seconds=WINDOW)

    def round(self, now: datetime, *, deliver: bool = True) -> Any:
        """Attribution, then one action round (evaluation and delivery) at NOW."""
        run_attribution(self.engine, self.config, now=now)
        return run_cycle(
            self.engine,
            self.config,
            now=now,
            clock=lambda: now,
            recipients=Recipients(self.config, coordinators=dict),
            deliver=deliver,
        )

    def at_minute(self, minutes: float) -> Any:
        now = self.at(minutes)
        self.windows_to(now)
        return self.round(now)


def test_an_idle_job_is_warned_twice_and_cancelled_an_excluded_one_is_not(
    slurm_lab: SlurmLab, engine: Engine, tmp_path: Path
) -> None:
    lab = slurm_lab
    wait_idle(lab)
    tag = f"{tmp_path.name}-{os.getpid()}"
    idle = lab.sbatch("alice", "--gres=gpu:2", "-t", "30", "-J", f"idle-{tag}", wrap="sleep 1500")
    excluded = lab.sbatch("bob", "--gres=gpu:1", "-t", "30", "-J", f"bob-{tag}", wrap="sleep 1500")
    try:
        with smtp_server(tmp_path) as server:
            config = lab_config(lab, server)
            rig = Rig(lab, engine, config, [idle, excluded])
            assert len(rig.gpus[idle]) == 2 and len(rig.gpus[excluded]) == 1, rig.gpus
            at_minute = rig.at_minute
            first = at_minute(61)
            assert [(d.step, d.job_id) for d in first.decisions] == [("warning", str(idle))]
            assert any(
                s.job_id == str(excluded) and "bob is in exclude_users" in s.reason for s in first.skipped
            )
            final = at_minute(106)
            assert [d.step for d in final.decisions] == ["final_warning"]
            assert [o.state for o in final.deliveries] == ["sent"]
            waiting = at_minute(115)
            assert waiting.decisions == [] and state(lab, idle) == "RUNNING"
            cancel = at_minute(122)
            assert [(d.step, d.kind) for d in cancel.decisions] == [("cancel", "cancel")]
            outcomes = {o.channel: o for o in cancel.deliveries}
            assert outcomes["scancel"].state == "sent", outcomes["scancel"].detail
            assert (
                "re-checked at" in outcomes["scancel"].detail
                and "RUNNING, 2 of 2 GPUs" in outcomes["scancel"].detail
            )
            assert outcomes["email"].state == "sent"
            wait_for(f"job {idle} cancelled", lambda: state(lab, idle) in ("", "CANCELLED", "COMPLETING"))
            wait_for(
                f"sacct says job {idle} CANCELLED",
                lambda: (
                    lab.sacct("-n", "-X", "-P", "-j", str(idle), "-o", "State").split()[:1] == ["CANCELLED"]
                ),
            )
            # the excluded job, just as idle, still runs
            assert state(lab, excluded) == "RUNNING"
            messages = server.mailbox.wait_for(3)
        subjects = [m.message["Subject"] for m in messages]
        assert all(m.rcpt_tos == ["alice@example.org"] for m in messages)
        assert subjects[0].startswith(f"[slurmtel] Job {idle} (idle-{tag}): 2 of 2 GPUs idle for 1 h 0")
        assert (
            subjects[1].startswith(f"[slurmtel] Final warning: job {idle}")
            and "will be cancelled" in subjects[1]
        )
        assert subjects[2].startswith(f"[slurmtel] Job {idle} (idle-{tag}) was cancelled")
        with engine.connect() as conn:
            log = conn.execute(text("SELECT step, status FROM action_log ORDER BY id")).all()
        assert [tuple(r) for r in log] == [("warning", "sent"), ("final_warning", "sent"), ("cancel", "done")]
    finally:
        lab.run(["scancel", str(idle), str(excluded)], check=False)
    wait_for("the lab's jobs gone", lambda: state(lab, idle) == "" and state(lab, excluded) == "")


def test_the_check_before_scancel_stops_a_cancel_that_no_longer_holds(
    slurm_lab: SlurmLab, engine: Engine, tmp_path: Path
) -> None:
    """Two idle jobs of alice reach the cancel: between the decision and the scancel one of
    them starts to work and the other is ended by alice herself. Neither is cancelled by
    slurmtel, the one that works still runs, and no "cancelled" mail goes out."""
    lab = slurm_lab
    wait_idle(lab)
    tag = f"{tmp_path.name}-{os.getpid()}"
    works = lab.sbatch("alice", "--gres=gpu:1", "-t", "30", "-J", f"works-{tag}", wrap="sleep 1500")
    ended = lab.sbatch("alice", "--gres=gpu:1", "-t", "30", "-J", f"ended-{tag}", wrap="sleep 1500")
    try:
        with smtp_server(tmp_path) as server:
            config = lab_config(lab, server)
            rig = Rig(lab, engine, config, [works, ended])
            rig.at_minute(106)
            decided_at = rig.at(122)
            rig.windows_to(decided_at)
            decided = rig.round(decided_at, deliver=False)
            assert sorted((d.job_id, d.kind) for d in decided.decisions) == [
                (str(works), "cancel"),
                (str(ended), "cancel"),
            ]
            # meanwhile: one job's GPUs work again, alice ends the other
            lab.run(["runuser", "-u", "alice", "--", "scancel", str(ended)])
            wait_for(f"job {ended} gone", lambda: state(lab, ended) in ("", "CANCELLED", "COMPLETING"))
            later = rig.at(124)
            rig.windows_to(later, busy=(works,))
            report = rig.round(later)
            outcomes = {(o.channel, o.target): o for o in report.deliveries}
            assert outcomes[("scancel", str(works))].state == "not_done"
            assert "the GPUs no longer meet the rule" in outcomes[("scancel", str(works))].detail
            assert outcomes[("scancel", str(ended))].state == "not_done"
            assert f"job {ended} is" in outcomes[("scancel", str(ended))].detail
            assert state(lab, works) == "RUNNING"
            mails = server.mailbox.wait_for(2)  # the two final warnings, nothing after
            time.sleep(1)
            assert len(server.mailbox.messages) == 2
            assert all("Final warning" in m.message["Subject"] for m in mails)
        with engine.connect() as conn:
            cancels = (
                conn.execute(text("SELECT status FROM action_log WHERE step = 'cancel' ORDER BY id"))
                .scalars()
                .all()
            )
            notices = (
                conn.execute(
                    text(
                        "SELECT d.state FROM action_delivery d JOIN action_log l ON l.id = d.action_id "
                        "WHERE l.step = 'cancel' AND d.channel = 'email'"
                    )
                )
                .scalars()
                .all()
            )
        assert cancels == ["not_done", "not_done"] and notices == ["not_done", "not_done"]
    finally:
        lab.run(["scancel", str(works), str(ended)], check=False)
    wait_for("the lab's jobs gone", lambda: state(lab, works) == "" and state(lab, ended) == "")
