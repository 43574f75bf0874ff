"""The report rollups of migration 0013 (attempt_node_day, node_day_allocation) always equal what
they sum: gpu_attribution and the attempts' partition and state, whatever writes them.

Each check recomputes both from gpu_attribution and job_attempt and compares row for row:
after an attribution run, a re-run, an attempt that ends (its state changes) or moves
partition, rows deleted, an attempt deleted, gpu_attribution truncated.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine, text

from slurmtel.attribution import run_attribution
from slurmtel.config import Config
from tests.factories import at, load_admin_day

ATTEMPT_NODE_DAY = """
    SELECT g.cluster, g.job_id_raw, g.submit_at, g.node, g.day, a.account, a.user_name, a.partition,
           a.state, sum(g.allocated_seconds * g.gpu_fraction), sum(g.covered_seconds * g.gpu_fraction),
           sum(g.busy_seconds * g.gpu_fraction), sum(g.idle_seconds * g.gpu_fraction),
           sum(g.no_process_seconds * g.gpu_fraction), sum(g.unmeasured_seconds * g.gpu_fraction),
           sum(g.util_weighted_sum * g.gpu_fraction),
           sum(greatest(0, g.idle_seconds - g.no_process_seconds) * g.gpu_fraction),
           sum(greatest(0, g.covered_seconds - greatest(g.idle_seconds, g.no_process_seconds)) * g.gpu_fraction),
           coalesce(sum(g.allocated_seconds) FILTER (WHERE g.mapping = 'unmapped'), 0)
    FROM gpu_attribution g JOIN job_attempt a USING (cluster, job_id_raw, submit_at)
    GROUP BY 1, 2, 3, 4, 5, 6, 7, 8, 9
"""
STORED_ATTEMPT_NODE_DAY = """
    SELECT cluster, job_id_raw, submit_at, node, day, account, user_name, partition, state, allocated_seconds,
           covered_seconds, busy_seconds, idle_seconds, no_process_seconds, unmeasured_seconds,
           util_weighted_sum, idle_with_process_seconds, active_seconds, unmapped_seconds
    FROM attempt_node_day
"""
NODE_DAY = """
    SELECT g.cluster, g.node, g.day, a.partition, a.state,
           sum(g.no_process_seconds * g.gpu_fraction),
           sum(greatest(0, g.idle_seconds - g.no_process_seconds) * g.gpu_fraction),
           sum(greatest(0, g.covered_seconds - greatest(g.idle_seconds, g.no_process_seconds)) * g.gpu_fraction),
           sum(g.unmeasured_seconds * g.gpu_fraction)
    FROM gpu_attribution g JOIN job_attempt a USING (cluster, job_id_raw, submit_at)
    GROUP BY 1, 2, 3, 4, 5
"""
STORED_NODE_DAY = """
    SELECT cluster, node, day, partition, state, no_process_seconds, idle_with_process_seconds,
           active_seconds, unmeasured_seconds
    FROM node_day_allocation
"""


def rows(engine: Engine, sql: str) -> list[tuple[Any, ...]]:
    with engine.connect() as conn:
        # float sums in another order may differ in the last bits: compare to 1e-9 s
        return sorted(
            tuple(round(v, 9) if isinstance(v, float) else v for v in r) for r in conn.execute(text(sql))
        )


def assert_current(engine: Engine) -> None:
    assert rows(engine, STORED_ATTEMPT_NODE_DAY) == rows(engine, ATTEMPT_NODE_DAY)
    assert rows(engine, STORED_NODE_DAY) == rows(engine, NODE_DAY)


def test_the_rollups_follow_attribution_and_the_attempts(engine: Engine, config: Config) -> None:
    load_admin_day(engine, config)
    stored = rows(engine, STORED_ATTEMPT_NODE_DAY)
    assert stored and rows(engine, STORED_NODE_DAY)
    assert_current(engine)
    # fewer rows than gpu_attribution: one per attempt, node and day, not per GPU
    with engine.connect() as conn:
        assert len(stored) < conn.execute(text("SELECT count(*) FROM gpu_attribution")).scalar_one()

    # a full re-run replaces every attempt's rows: the same rollups
    run_attribution(engine, config, now=at("2026-11-02T06:00:00"), full=True)
    assert rows(engine, STORED_ATTEMPT_NODE_DAY) == stored
    assert_current(engine)

    # an attempt ends, another moves partition, a third account: their rows move with them at once
    with engine.begin() as conn:
        key = conn.execute(
            text("SELECT cluster, job_id_raw, submit_at FROM attempt_node_day ORDER BY 1, 2, 3 LIMIT 1")
        ).one()
        conn.execute(
            text(
                "UPDATE job_attempt SET state = 'NODE_FAIL' "
                "WHERE cluster = :c AND job_id_raw = :j AND submit_at = :s"
            ),
            {"c": key[0], "j": key[1], "s": key[2]},
        )
        conn.execute(
            text(
                "UPDATE job_attempt SET partition = 'elsewhere' WHERE (cluster, job_id_raw, submit_at) = "
                "(SELECT cluster, job_id_raw, submit_at FROM attempt_node_day ORDER BY 1, 2 DESC, 3 LIMIT 1)"
            )
        )
        conn.execute(
            text(
                "UPDATE job_attempt SET account = 'moved', user_name = 'mallory' "
                "WHERE (cluster, job_id_raw, submit_at) = (SELECT cluster, job_id_raw, submit_at "
                "FROM attempt_node_day ORDER BY 1, 2 DESC, 3 OFFSET 1 LIMIT 1)"
            )
        )
    assert_current(engine)
    with engine.connect() as conn:
        assert conn.execute(
            text("SELECT count(*) FROM node_day_allocation WHERE state = 'NODE_FAIL'")
        ).scalar()
        assert conn.execute(
            text("SELECT count(*) FROM node_day_allocation WHERE partition = 'elsewhere'")
        ).scalar()

    # rows changed and deleted by hand, an attempt deleted (cascading), in one transaction
    with engine.begin() as conn:
        conn.execute(
            text("UPDATE gpu_attribution SET idle_seconds = idle_seconds + 1 WHERE mapping <> 'unmapped'")
        )
        conn.execute(text("DELETE FROM gpu_attribution WHERE mapping = 'unmapped'"))
        conn.execute(
            text(
                "DELETE FROM job_attempt WHERE (cluster, job_id_raw, submit_at) = "
                "(SELECT cluster, job_id_raw, submit_at FROM attempt_node_day ORDER BY 1, 2, 3 LIMIT 1)"
            )
        )
    assert_current(engine)

    # a truncate empties both
    with engine.begin() as conn:
        conn.execute(text("TRUNCATE gpu_attribution"))
    assert rows(engine, STORED_ATTEMPT_NODE_DAY) == [] and rows(engine, STORED_NODE_DAY) == []


def test_the_requeue_index_lists_the_requeue_states(engine: Engine) -> None:
    """`report retries` finds the attempts of multi-attempt jobs through a partial index whose
    predicate must be the one the report spells (slurmtel.store.jobs.REQUEUE_STATES)."""
    from slurmtel.vocabulary import REQUEUE_STATES

    with engine.connect() as conn:
        definition = conn.execute(
            text("SELECT indexdef FROM pg_indexes WHERE indexname = 'job_attempt_requeue_or_later'")
        ).scalar_one()
    listed = definition.split("ARRAY[", 1)[1].split("]", 1)[0]
    assert [s.split("'")[1] for s in listed.split(",")] == list(REQUEUE_STATES)
