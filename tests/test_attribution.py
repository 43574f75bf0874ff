"""Attribution on hand-built telemetry whose expected seconds are exact.

Every synthetic window is wholly busy (util 80 %) or wholly idle (util 0 %), so pro-rating a
window cut by a job's start or end is exact, and the expected figures follow by counting.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta

import pytest
from sqlalchemy import Engine, text

from slurmtel.attribution import run_attribution
from slurmtel.config import Config, config_from_dict
from slurmtel.records import GpuAllocation
from slurmtel.store.jobs import write_attempts
from slurmtel.store.telemetry import write_allocations, write_inventory, write_summaries
from tests.factories import T0, at, attempt, inventory, windows


def rows(engine: Engine, job_id_raw: int | None = None) -> list[dict]:
    with engine.connect() as conn:
        result = conn.execute(
            text(
                "SELECT * FROM gpu_attribution WHERE CAST(:job AS bigint) IS NULL OR job_id_raw = :job "
                "ORDER BY job_id_raw, node, gpu_uuid, day"
            ),
            {"job": job_id_raw},
        ).mappings()
        return [dict(r) for r in result]


def store(engine: Engine, *, attempts=(), summaries=(), inv=(), allocations=()) -> None:  # type: ignore[no-untyped-def]
    with engine.begin() as conn:
        write_attempts(conn, attempts)
        write_inventory(conn, inv, source="agent")
        write_summaries(conn, list(summaries), source="agent", node="gpu01")
        write_allocations(conn, allocations)


def test_slurmctld_mapping_idle_busy_and_edges_exact(engine: Engine, config: Config) -> None:
    # job runs 10:00:10 .. 10:05:10 on GPU index 1 of gpu01; windows 3..5 busy
    job = attempt(
        job_id_raw=5,
        nodes=("gpu01",),
        alloc_gpus=1,
        start_at=T0 + timedelta(seconds=10),
        end_at=T0 + timedelta(minutes=5, seconds=10),
        submit_at=T0,
    )
    store(
        engine,
        attempts=[job],
        inv=inventory("gpu01", ["GPU-0", "GPU-1"]),
        summaries=windows("GPU-1", T0, 12, busy={3, 4, 5}) + windows("GPU-0", T0, 12, busy=set(range(12))),
        allocations=[GpuAllocation("lab", 5, T0, "gpu01", 1, T0 + timedelta(seconds=40))],
    )
    result = run_attribution(engine, config, now=T0 + timedelta(hours=1))
    assert result.attempts == 1
    (row,) = rows(engine, 5)
    assert (row["gpu_uuid"], row["mapping"], row["day"].isoformat()) == ("GPU-1", "slurmctld", "2026-11-01")
    assert row["allocated_seconds"] == 300
    # windows 0..10 cover the job; window 0 and 10 only 20 s and 10 s of it
    assert row["covered_seconds"] == pytest.approx(300)
    assert row["busy_seconds"] == pytest.approx(90)
    assert row["idle_seconds"] == pytest.approx(210)
    assert row["unmeasured_seconds"] == pytest.approx(0)
    assert row["util_weighted_sum"] / row["covered_seconds"] == pytest.approx(24.0)  # 90 s of 300 at 80 %
    assert row["util_max_percent"] == 95.0
    assert row["memory_used_max_bytes"] == 40 * 2**30
    assert row["energy_joules"] == pytest.approx(10 * 300.0)  # 300 J per window, 10 windows' worth


def test_process_mapping_wins_and_unmapped_gpus_stay_unmeasured(engine: Engine, config: Config) -> None:
    # 2 GPUs allocated; processes seen on GPU-2 only; slurmctld never saw the job
    job = attempt(
        job_id_raw=7,
        nodes=("gpu01",),
        alloc_gpus=2,
        start_at=T0,
        end_at=T0 + timedelta(minutes=2),
        submit_at=T0,
    )
    store(
        engine,
        attempts=[job],
        inv=inventory("gpu01", ["GPU-0", "GPU-1", "GPU-2", "GPU-3"]),
        summaries=windows("GPU-2", T0, 4, busy={0, 1, 2, 3}, job="7") + windows("GPU-3", T0, 4),
    )
    run_attribution(engine, config, now=T0 + timedelta(hours=1))
    got = {
        (r["gpu_uuid"], r["mapping"]): (r["allocated_seconds"], r["covered_seconds"], r["unmeasured_seconds"])
        for r in rows(engine, 7)
    }
    assert got == {("GPU-2", "process"): (120, 120, 0), ("", "unmapped"): (120, 0, 120)}


def test_whole_node_mapping_and_gaps_are_unmeasured(engine: Engine, config: Config) -> None:
    job = attempt(
        job_id_raw=8,
        nodes=("gpu02",),
        alloc_gpus=2,
        start_at=T0,
        end_at=T0 + timedelta(minutes=5),
        submit_at=T0,
    )
    # a 2-GPU node, wholly held; GPU-B reports only the first 2 minutes
    summaries = [replace(s, node="gpu02") for s in windows("GPU-A", T0, 10, busy={0})]
    summaries += [replace(s, node="gpu02") for s in windows("GPU-B", T0, 4)]
    store(engine, attempts=[job], inv=inventory("gpu02", ["GPU-A", "GPU-B"]), summaries=summaries)
    run_attribution(engine, config, now=T0 + timedelta(hours=1))
    got = {
        r["gpu_uuid"]: (
            r["mapping"],
            r["covered_seconds"],
            r["busy_seconds"],
            r["idle_seconds"],
            r["unmeasured_seconds"],
        )
        for r in rows(engine, 8)
    }
    assert got == {
        "GPU-A": ("whole_node", 300, 30, 270, 0),
        "GPU-B": ("whole_node", 120, 0, 120, 180),
    }


def test_no_process_time_is_counted_apart(engine: Engine, config: Config) -> None:
    job = attempt(
        job_id_raw=9,
        nodes=("gpu01",),
        alloc_gpus=1,
        start_at=T0,
        end_at=T0 + timedelta(minutes=2),
        submit_at=T0,
    )
    store(
        engine,
        attempts=[job],
        inv=inventory("gpu01", ["GPU-0"]),
        summaries=windows("GPU-0", T0, 4, busy={2, 3}, no_process={0}, job="9"),
    )
    run_attribution(engine, config, now=T0 + timedelta(hours=1))
    (row,) = rows(engine, 9)
    assert (
        row["mapping"],
        row["covered_seconds"],
        row["busy_seconds"],
        row["idle_seconds"],
        row["no_process_seconds"],
    ) == ("process", 120, 60, 60, 30)


def test_rerun_is_identical_and_late_data_is_absorbed(engine: Engine, config: Config) -> None:
    job = attempt(
        job_id_raw=11,
        nodes=("gpu01",),
        alloc_gpus=1,
        start_at=T0,
        end_at=T0 + timedelta(minutes=4),
        submit_at=T0,
    )
    store(
        engine, attempts=[job], inv=inventory("gpu01", ["GPU-0"]), summaries=windows("GPU-0", T0, 4, job="11")
    )
    now = T0 + timedelta(hours=1)
    run_attribution(engine, config, now=now)
    first = rows(engine, 11)
    assert first[0]["unmeasured_seconds"] == 120
    # jobs written within attribution.overlap_seconds of the watermark are recomputed: same rows
    run_attribution(engine, config, now=now)
    assert strip(rows(engine, 11)) == strip(first)
    # the node's last two minutes arrive late (the agent was unreachable)
    store(engine, summaries=windows("GPU-0", T0 + timedelta(minutes=2), 4, busy={0, 1, 2, 3}, job="11"))
    late = run_attribution(engine, config, now=now)
    assert (late.attempts, late.batches) == (1, 1)
    (row,) = rows(engine, 11)
    assert (row["covered_seconds"], row["busy_seconds"], row["unmeasured_seconds"]) == (240, 120, 0)
    full = run_attribution(engine, config, now=now, full=True)
    assert full.attempts == 1
    assert strip(rows(engine, 11)) == strip([row])


def strip(result: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k != "computed_at"} for r in result]


def test_days_are_cut_in_the_site_time_zone(engine: Engine) -> None:
    config = config_from_dict({"site": {"timezone": "Europe/Berlin"}})
    # 22:30 .. 23:30 UTC on Nov 1st = 23:30 .. 00:30 in Berlin
    start = at("2026-11-01T22:30:00")
    job = attempt(
        job_id_raw=12,
        nodes=("gpu01",),
        alloc_gpus=1,
        start_at=start,
        end_at=start + timedelta(hours=1),
        submit_at=start,
    )
    store(
        engine,
        attempts=[job],
        inv=inventory("gpu01", ["GPU-0"]),
        summaries=windows("GPU-0", start, 120, job="12"),
    )
    run_attribution(engine, config, now=start + timedelta(hours=2))
    got = {r["day"].isoformat(): (r["allocated_seconds"], r["covered_seconds"]) for r in rows(engine, 12)}
    assert got == {"2026-11-01": (1800, 1800), "2026-11-02": (1800, 1800)}


def test_running_attempts_grow_with_now(engine: Engine, config: Config) -> None:
    job = attempt(
        job_id_raw=13, nodes=("gpu01",), alloc_gpus=1, start_at=T0, end_at=None, state="RUNNING", submit_at=T0
    )
    store(
        engine,
        attempts=[job],
        inv=inventory("gpu01", ["GPU-0"]),
        summaries=windows("GPU-0", T0, 10, job="13"),
    )
    run_attribution(engine, config, now=T0 + timedelta(minutes=2))
    assert rows(engine, 13)[0]["allocated_seconds"] == 120
    run_attribution(engine, config, now=T0 + timedelta(minutes=5))
    (row,) = rows(engine, 13)
    assert (row["allocated_seconds"], row["covered_seconds"]) == (300, 300)


def test_multi_node_attempt_splits_its_gpus_per_node(engine: Engine, config: Config) -> None:
    job = attempt(
        job_id_raw=14,
        nodes=("gpu01", "gpu02"),
        alloc_gpus=2,
        start_at=T0,
        end_at=T0 + timedelta(minutes=1),
        submit_at=T0,
    )
    store(
        engine,
        attempts=[job],
        inv=inventory("gpu01", ["GPU-0", "GPU-1"]),
        summaries=windows("GPU-0", T0, 2, busy={0, 1}, job="14"),
    )
    run_attribution(engine, config, now=T0 + timedelta(hours=1))
    got = {(r["node"], r["gpu_uuid"], r["mapping"]): r["allocated_seconds"] for r in rows(engine, 14)}
    assert got == {("gpu01", "GPU-0", "process"): 60, ("gpu02", "", "unmapped"): 60}
    # every allocated GPU-second of the attempt is in exactly one row
    assert sum(got.values()) == 2 * 60


def _varied(summaries: list) -> list:  # type: ignore[type-arg]
    """Windows with utilisation that does not add up exactly in floating point."""
    return [
        replace(s, util_mean_percent=(i * 37 % 100) + 0.1, energy_joules=250.0 + i / 3)
        for i, s in enumerate(summaries)
    ]


def test_incremental_runs_keep_unchanged_days_and_equal_a_full_recompute(engine: Engine) -> None:
    """A run recomputes an unchanged attempt only from the last day it has rows for (or the
    first day of new telemetry on its nodes); its earlier days' rows are kept as they are. A
    sequence of such runs - a job running over several days, late data for an old day, a GPU
    whose process evidence appears later (the mapping changes) - gives exactly the rows of a
    full recompute."""
    # no overlap: an attempt not written since the watermark is unchanged in the next run
    config = config_from_dict({"attribution": {"overlap_seconds": 0}})
    start = T0 - timedelta(days=1, hours=2)  # 08:00 on Oct 31st
    job = attempt(
        job_id_raw=21, nodes=("gpu01",), alloc_gpus=2, start_at=start, end_at=None, state="RUNNING",
        submit_at=start,
    )  # fmt: skip
    done = attempt(
        job_id_raw=22, nodes=("gpu01",), alloc_gpus=1, start_at=start, end_at=start + timedelta(hours=30),
        submit_at=start - timedelta(minutes=1),
    )  # fmt: skip
    gpu0 = _varied(windows("GPU-0", start, 120 * 40, busy=set(range(0, 4800, 3)), job="21"))
    gpu2 = _varied(windows("GPU-2", start, 120 * 30, busy=set(range(0, 3600, 2)), job="22"))
    store(engine, attempts=[job, done], inv=inventory("gpu01", ["GPU-0", "GPU-1", "GPU-2"]))

    def feed(lo: datetime, hi: datetime, *, gpu: list | None = None) -> None:  # type: ignore[type-arg]
        chosen = [s for s in (gpu if gpu is not None else gpu0 + gpu2) if lo <= s.window_start_at < hi]
        store(engine, summaries=chosen)

    def computed(day: str) -> set[datetime]:
        return {r["computed_at"] for r in rows(engine, 21) if r["day"].isoformat() == day}

    # the first 10 hours, but a gap of an hour on Oct 31st that arrives late
    gap = (start + timedelta(hours=3), start + timedelta(hours=4))
    feed(start, gap[0])
    feed(gap[1], start + timedelta(hours=10))
    run_attribution(engine, config, now=start + timedelta(hours=10))
    first = computed("2026-10-31")
    # on through midnight, a run every 2 h: Oct 31st is computed again up to midnight, then kept
    for hours in range(12, 26, 2):
        feed(start + timedelta(hours=hours - 2), start + timedelta(hours=hours))
        run_attribution(engine, config, now=start + timedelta(hours=hours))
    kept = computed("2026-10-31")
    assert kept != first
    feed(start + timedelta(hours=26), start + timedelta(hours=27))
    run_attribution(engine, config, now=start + timedelta(hours=27))
    assert computed("2026-10-31") == kept, "an unchanged past day was recomputed"
    # the gap's windows arrive late: Oct 31st is recomputed
    feed(*gap)
    run_attribution(engine, config, now=start + timedelta(hours=28))
    assert computed("2026-10-31") != kept
    # GPU-1 shows the job's processes from now on: the mapping changes, all days are recomputed
    gpu1 = _varied(windows("GPU-1", start + timedelta(hours=28), 240, busy={1, 2, 3}, job="21"))
    store(engine, summaries=gpu1)
    feed(start + timedelta(hours=27), start + timedelta(hours=30))
    run_attribution(engine, config, now=start + timedelta(hours=30))
    assert {r["gpu_uuid"] for r in rows(engine, 21) if r["day"].isoformat() == "2026-10-31"} == {
        "GPU-0",
        "GPU-1",
    }
    incremental = strip(rows(engine))
    assert {r["job_id_raw"] for r in incremental} == {21, 22}

    run_attribution(engine, config, now=start + timedelta(hours=30), full=True)
    assert strip(rows(engine)) == incremental
