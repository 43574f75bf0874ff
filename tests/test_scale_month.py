"""A generated month at scale: a 16-GPU cluster's 30 days, end to end, with the invariants.

Jobs go through the real sacct JSON parser, controller snapshots through the real scontrol
parser, telemetry (5-minute windows, to keep the suite quick) through the real store; then
attribution, the taxonomy, usage and chargeback must agree with each other exactly.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from sqlalchemy import Engine, text

from slurmtel.access import EVERYTHING
from slurmtel.attribution import run_attribution
from slurmtel.chargeback import build_statement
from slurmtel.config import Config, config_from_dict
from slurmtel.parsers.sacct_json import parse_sacct_json
from slurmtel.parsers.slurmctld import parse_scontrol_nodes
from slurmtel.records import JobAttempt
from slurmtel.simulate import (
    Simulation,
    sim_inventory,
    sim_sacct_json,
    sim_scontrol_nodes,
    sim_summaries,
    simulate_cluster,
)
from slurmtel.store.jobs import sync_outcome_classes, write_attempts
from slurmtel.store.reports_taxonomy import taxonomy_report
from slurmtel.store.telemetry import write_inventory, write_node_states, write_summaries
from slurmtel.store.usage import usage_report

START = datetime(2026, 10, 1, tzinfo=UTC)
DAYS = 30
PARTS = ("unavailable", "unallocated", "allocated_no_process", "allocated_idle", "active", "unmeasured")


@pytest.fixture(scope="module")
def month() -> Simulation:
    return simulate_cluster(start=START, days=DAYS, seed=3)


@pytest.fixture
def loaded(engine: Engine, month: Simulation) -> Config:
    config = config_from_dict(
        {
            "chargeback": {
                "rates": [
                    {
                        "partition": "*",
                        "gpu_model": "*",
                        "price_per_gpu_hour": "2.00",
                        "valid_from": "2026-01-01",
                    }
                ]
            }
        }
    )
    records = parse_sacct_json(sim_sacct_json(month, until=month.end_at), origin="simulated month")
    attempts = [r for r in records if isinstance(r, JobAttempt)]
    assert len(attempts) == len(records)
    with engine.begin() as conn:
        sync_outcome_classes(conn, config.outcomes.mapping())
        write_attempts(conn, attempts)
        write_inventory(conn, sim_inventory(month, at=START), source="agent")
        at = START
        while at <= month.end_at:
            write_node_states(
                conn, parse_scontrol_nodes(sim_scontrol_nodes(month, at=at), cluster="demo", at=at)
            )
            at += timedelta(hours=1)
        for node in month.nodes:
            write_summaries(
                conn,
                list(sim_summaries(month, node.name, window_seconds=300)),
                source="agent",
                node=node.name,
            )
    run_attribution(engine, config, now=month.end_at)
    return config


def snapshot(engine: Engine) -> list[tuple]:
    with engine.connect() as conn:
        return [
            tuple(r)
            for r in conn.execute(
                text(
                    "SELECT cluster, job_id_raw, submit_at, node, gpu_uuid, day, mapping, allocated_seconds, "
                    "covered_seconds, busy_seconds, idle_seconds, no_process_seconds, unmeasured_seconds "
                    "FROM gpu_attribution ORDER BY 1, 2, 3, 4, 5, 6"
                )
            )
        ]


def test_every_allocated_gpu_second_is_attributed_once(
    engine: Engine, loaded: Config, month: Simulation
) -> None:
    with engine.connect() as conn:
        attributed = conn.execute(text("SELECT sum(allocated_seconds) FROM gpu_attribution")).scalar_one()
        mappings = dict(conn.execute(text("SELECT mapping, count(*) FROM gpu_attribution GROUP BY 1")).all())
    expected = sum(
        a.job.gpus * ((a.job.end_at or month.end_at) - a.job.start_at).total_seconds()
        for a in month.attempts
        if a.job.start_at is not None
    )
    assert attributed == pytest.approx(expected, rel=1e-12)
    # the agents saw the processes of nearly every job; a job shorter than one 5-minute window
    # after its setup shows none: whole-node mapping when it held a whole node, else unmapped
    assert set(mappings) <= {"process", "whole_node", "unmapped"}
    assert mappings["process"] > 10 * (mappings.get("whole_node", 0) + mappings.get("unmapped", 0))
    assert len(month.attempts) > 2000


def test_a_full_recompute_gives_the_same_rows(engine: Engine, loaded: Config, month: Simulation) -> None:
    before = snapshot(engine)
    result = run_attribution(engine, loaded, now=month.end_at, full=True)
    assert result.attempts == len({(r[1], r[2]) for r in before})
    assert snapshot(engine) == before


def test_the_taxonomy_adds_up_every_day(engine: Engine, loaded: Config, month: Simulation) -> None:
    with engine.connect() as conn:
        rows = taxonomy_report(
            conn, first_day=START.date(), last_day=(month.end_at - timedelta(days=1)).date(), now=month.end_at,
            timezone="UTC", scope=EVERYTHING, poll_interval_seconds=3600,
        )  # fmt: skip
    assert len({r["day"] for r in rows}) == DAYS
    for row in rows:
        assert sum(row[f"{p}_gpu_seconds"] for p in PARTS) == row["installed_gpu_seconds"]
    by_day: dict[object, Decimal] = {}
    for row in rows:
        by_day[row["day"]] = by_day.get(row["day"], Decimal(0)) + row["installed_gpu_seconds"]
    # 16 GPUs installed all day, every day (the outage is unavailable, not missing)
    assert set(by_day.values()) == {Decimal(16 * 86400)}


def test_chargeback_and_usage_agree_on_the_month(engine: Engine, loaded: Config, month: Simulation) -> None:
    end = datetime(2026, 11, 1, tzinfo=UTC)
    with engine.connect() as conn:
        usage = usage_report(conn, start=START, end=end, now=month.end_at, by="account", scope=EVERYTHING)
        statement = build_statement(conn, loaded, "2026-10", month.end_at)
    usage_seconds = Decimal(str(sum(r["allocated_gpu_seconds"] for r in usage)))
    (gpu,) = statement.totals.by_unit
    assert gpu.billed_unit == "gpu_hour"
    # each line's seconds are rounded once to the hundredth and the total is the sum of the lines
    assert abs(gpu.allocated_tres_seconds - usage_seconds) <= Decimal("0.005") * len(statement.lines)
    assert gpu.allocated_tres_seconds == sum(line.allocated_tres_seconds for line in statement.lines)
    assert gpu.billed_quantity == sum(line.billed_quantity for line in statement.lines)
    assert statement.totals.amount == sum(line.amount for line in statement.lines if line.amount is not None)
