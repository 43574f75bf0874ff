"""Truth on known data: the simulator plants five jobs with known idle causes (a data-loader-
bound job, a storage stall, periodic checkpoints, a two-node job on a slow link, a job with no
process), sacct JSON through the real parser, the agent's windows through the real writers;
the attribution run and `report idle --by cause` recover each planted cause within 1 % of its
idle GPU-seconds, and each job's checkpoint episodes and start-up exactly."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import Engine, text

from slurmtel.access import EVERYTHING
from slurmtel.attribution import run_attribution
from slurmtel.config import Config
from slurmtel.parsers.sacct_json import parse_sacct_json
from slurmtel.records import JobAttempt
from slurmtel.simulate import PLANTED_CAUSES, idle_cause_scenario, render_sacct_json
from slurmtel.store.fabric import write_port_counters
from slurmtel.store.hostside import write_job_host_windows
from slurmtel.store.jobs import write_attempts
from slurmtel.store.reports_idle import attempt_idle_causes, idle_cause_rows, idle_report
from slurmtel.store.telemetry import write_inventory, write_summaries

START = datetime(2026, 11, 3, 8, 0, tzinfo=UTC)
TOLERANCE = 0.01


def test_report_recovers_every_planted_cause(engine: Engine, config: Config) -> None:
    scenario = idle_cause_scenario(START)
    attempts = [r for r in parse_sacct_json(render_sacct_json(scenario.jobs)) if isinstance(r, JobAttempt)]
    assert len(attempts) == len(PLANTED_CAUSES)
    with engine.begin() as conn:
        write_attempts(conn, attempts)
        write_inventory(conn, scenario.inventory, source="agent")
        for node in sorted({s.node for s in scenario.summaries}):
            write_summaries(
                conn, [s for s in scenario.summaries if s.node == node], source="agent", node=node
            )
        write_job_host_windows(conn, scenario.job_hosts)
        write_port_counters(conn, scenario.ports)
    now = START + timedelta(hours=3)
    run_attribution(engine, config, now=now)
    keys = [(a.cluster, a.job_id_raw, a.submit_at) for a in attempts]
    with engine.connect() as conn:
        causes = attempt_idle_causes(conn, keys)
        checkpoints = {str(r.job_id_raw): r for r in conn.execute(text("SELECT * FROM job_checkpoint")).all()}
        site = idle_cause_rows(conn, first_day=START.date(), last_day=START.date(), scope=EVERYTHING)
        idle = idle_report(conn, first_day=START.date(), last_day=START.date(), scope=EVERYTHING)
    for key in keys:
        job = str(key[1])
        got = {c["idle_cause"]: c["idle_gpu_seconds"] for c in causes[key]}
        planted = scenario.planted[job]
        for cause in got:
            assert got[cause] == pytest.approx(planted.get(cause, 0.0), rel=TOLERANCE, abs=1e-6), (job, cause)
        assert checkpoints[job].episodes == scenario.checkpoints[job], job
        assert checkpoints[job].startup_seconds == scenario.startup_seconds[job], job
    # the site's causes add up to the idle GPU-hours report idle prints
    total = sum(r["idle_gpu_seconds"] for r in site["by_cause"])
    assert total == sum(g["idle_gpu_seconds"] for g in idle["by_account"])
    planted_total = sum(sum(p.values()) for p in scenario.planted.values())
    assert total == pytest.approx(planted_total)
