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
from slurmtel.store.attribution import delete_parts_before
from slurmtel.store.jobs import write_attempts
from slurmtel.store.samples import sample_store
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


def parts(engine: Engine) -> list[dict]:
    with engine.connect() as conn:
        result = conn.execute(
            text(
                "SELECT * FROM gpu_attribution_part ORDER BY job_id_raw, submit_at, day, node, gpu_uuid, hour_at"
            )
        ).mappings()
        return [dict(r) for r in result]


def _packable(summaries: list) -> list:  # type: ignore[type-arg]
    """_varied, but with energies a packed hour keeps exactly (it keeps them as real): the runs
    fold hours in before they are packed, a full recompute reads them packed."""
    return [replace(s, energy_joules=250.0 + (i % 13) / 8) for i, s in enumerate(_varied(summaries))]


@pytest.mark.parametrize("zone", ["UTC", "Asia/Kolkata"])
def test_runs_through_a_day_read_only_the_new_hours_and_equal_a_full_recompute(
    engine: Engine, zone: str
) -> None:
    """A run every 20 minutes for 32 hours, with windows arriving late (one chunk across the
    site's midnight, which in Kolkata (+05:30) cuts a UTC hour in two) and an attempt whose
    record changes (it ended before the last run's `now`). Each run without late data reads only
    the windows that are new since the previous run's `now`, however long the attempts have run
    (the slice holding that `now` is added to); the rows and the slices equal those of a full
    recompute."""
    config = config_from_dict({"attribution": {"overlap_seconds": 0}, "site": {"timezone": zone}})
    start = T0 - timedelta(days=1, hours=2)  # 08:00 UTC on Oct 31st
    job = attempt(
        job_id_raw=31, nodes=("gpu01",), alloc_gpus=2, start_at=start, end_at=None, state="RUNNING",
        submit_at=start,
    )  # fmt: skip
    other = attempt(
        job_id_raw=32, nodes=("gpu01",), alloc_gpus=1, start_at=start + timedelta(minutes=7), end_at=None,
        state="RUNNING", submit_at=start - timedelta(minutes=1),
    )  # fmt: skip
    feed_all = _packable(windows("GPU-0", start, 120 * 33, busy=set(range(0, 4000, 3)), job="31"))
    feed_all += _packable(windows("GPU-1", start, 120 * 33, busy=set(range(0, 4000, 5)), job="31"))
    feed_all += _packable(windows("GPU-2", start, 120 * 33, busy=set(range(0, 4000, 2)), job="32"))
    store(engine, attempts=[job, other], inv=inventory("gpu01", ["GPU-0", "GPU-1", "GPU-2"]))
    # (held back, arrives at): a chunk of hour 5, and one across 18:30 UTC (Kolkata's midnight)
    late = [
        ((start + timedelta(hours=5), start + timedelta(hours=5, minutes=10)), start + timedelta(hours=9)),
        ((start + timedelta(hours=10, minutes=20), start + timedelta(hours=10, minutes=40)), start + timedelta(hours=14)),
    ]  # fmt: skip
    ended = start + timedelta(hours=29, minutes=10)

    def held(t: datetime) -> bool:
        return any(lo <= t < hi for (lo, hi), _ in late)

    step = timedelta(minutes=20)
    now = start + step
    reads: list[int] = []
    while now <= start + timedelta(hours=32):
        new = [s for s in feed_all if now - step <= s.window_start_at < now and not held(s.window_start_at)]
        arriving = [(lo, hi) for (lo, hi), when in late if when == now]
        for lo, hi in arriving:
            new += [s for s in feed_all if lo <= s.window_start_at < hi]
        if now == start + timedelta(hours=30):  # job 32 ended 50 minutes ago
            store(engine, attempts=[replace(other, end_at=ended, state="COMPLETED")])
        store(engine, summaries=new)
        result = run_attribution(engine, config, now=now)
        if not arriving and now > start + step:
            # the slices from the previous run's `now` on (one more where a site midnight cuts
            # an hour), per GPU; only the new windows are read, added to the slice the previous
            # run left, but where job 32's record changed: its last hour is read again
            assert result.slices <= 3 * 3, now
            assert result.windows <= len(new) + (120 if now == start + timedelta(hours=30) else 0), now
            reads.append(result.windows)
        now += step
    # late in the replay a run reads no more than early in it
    assert max(reads[-20:]) <= max(reads[:20])
    incremental, incremental_parts = strip(rows(engine)), parts(engine)
    assert {r["job_id_raw"] for r in incremental} == {31, 32}
    assert max(r["hour_at"] for r in incremental_parts if r["job_id_raw"] == 32) < ended

    run_attribution(engine, config, now=now - step, full=True)
    assert strip(rows(engine)) == incremental
    assert parts(engine) == incremental_parts


def test_runs_at_any_moment_add_only_new_windows_and_equal_a_full_recompute(engine: Engine) -> None:
    """Runs at moments that are not window boundaries, some with a window that ends after the
    run's `now` already stored (counted in part), and a late window from a second source for a
    moment already counted. A run adds the new windows to the slice the previous run left only
    when that slice holds no window ending after the previous `now`; otherwise it reads the slice
    again. An ended attempt computed to its end is not read again. Either way the rows and
    slices equal a full recompute's after every run."""
    config = config_from_dict({"attribution": {"overlap_seconds": 0}})
    start = T0 - timedelta(hours=5, minutes=3)
    job = attempt(
        job_id_raw=51, nodes=("gpu01",), alloc_gpus=1, start_at=start, end_at=None, state="RUNNING",
        submit_at=start,
    )  # fmt: skip
    feed_all = _packable(windows("GPU-0", start, 120 * 5, busy=set(range(0, 600, 3)), job="51"))
    store(engine, attempts=[job], inv=inventory("gpu01", ["GPU-0"]))
    stored_to = start  # windows starting before it are stored
    cut_before = False  # the previous run counted a window that ends after its `now`
    added = 0  # runs that added the new windows to the slice left
    # (minutes after the start of the run, whether the window running at `now` is stored too)
    runs = [(7.2, False), (19.9, True), (33.0, False), (41.5, False), (58.25, True), (66.0, False),
            (71.0, False), (95.5, False), (130.0, False), (151.1, True), (177.0, False), (240.0, False)]  # fmt: skip
    for minutes, with_running in runs:
        now = start + timedelta(minutes=minutes)
        upto = now + timedelta(seconds=30) if with_running else now
        new = [s for s in feed_all if stored_to <= s.window_start_at < upto - timedelta(seconds=29.999)]
        if minutes == 130.0:
            # dcgm-exporter's reading of a window the previous run counted (the agent's is kept)
            with engine.begin() as conn:
                late = replace(feed_all[150], source="dcgm", util_mean_percent=1.0)
                write_summaries(conn, [late], source="dcgm", node="gpu01")
        store(engine, summaries=new)
        if new:
            stored_to = new[-1].window_start_at + timedelta(seconds=30)
        result = run_attribution(engine, config, now=now)
        if minutes != 130.0 and not cut_before:
            # no window ended after the previous `now`: only the new windows are read
            assert result.windows == len(new), minutes
            added += 1
        incremental, incremental_parts = strip(rows(engine)), parts(engine)
        run_attribution(engine, config, now=now, full=True)
        assert strip(rows(engine)) == incremental, minutes
        assert parts(engine) == incremental_parts, minutes
        cut_before = with_running
    assert added == 8
    # the job ends inside a window; a run that selects it again (the overlap) reads nothing
    end = now + timedelta(minutes=2, seconds=10)
    last = [s for s in feed_all if stored_to <= s.window_start_at < end]
    store(engine, attempts=[replace(job, end_at=end, state="COMPLETED")], summaries=last)
    overlapping = config_from_dict({"attribution": {"overlap_seconds": 3600}})
    assert run_attribution(engine, overlapping, now=end + timedelta(minutes=5)).windows == len(last)
    again = run_attribution(engine, overlapping, now=end + timedelta(minutes=10))
    assert (again.attempts, again.windows) == (1, 0)
    incremental, incremental_parts = strip(rows(engine)), parts(engine)
    run_attribution(engine, config, now=end + timedelta(minutes=10), full=True)
    assert strip(rows(engine)) == incremental
    assert parts(engine) == incremental_parts


def test_record_changes_requeues_and_retention_keep_runs_equal_to_a_full_recompute(engine: Engine) -> None:
    """An attempt's GPU count changes (every day's unmapped row changes), it is requeued (it
    ends, a new attempt of the job starts on the same GPU), and the windows of its first day
    are dropped by retention: each incremental run gives the rows and slices of a full
    recompute as of then, and after retention the days whose windows are gone keep their rows."""
    config = config_from_dict({"attribution": {"overlap_seconds": 0}})
    start = T0 - timedelta(days=1, hours=2)  # 08:00 UTC on Oct 31st
    first = attempt(
        job_id_raw=41, nodes=("gpu01",), alloc_gpus=1, start_at=start, end_at=None, state="RUNNING",
        submit_at=start,
    )  # fmt: skip
    feed_all = _packable(windows("GPU-0", start, 120 * 30, busy=set(range(0, 3600, 3)), job="41"))
    store(engine, attempts=[first], inv=inventory("gpu01", ["GPU-0", "GPU-1"]))
    fed = start

    def run(now: datetime) -> None:
        nonlocal fed
        store(engine, summaries=[s for s in feed_all if fed <= s.window_start_at < now])
        fed = now
        run_attribution(engine, config, now=now)

    def equals_a_full_recompute(now: datetime) -> None:
        incremental, incremental_parts = strip(rows(engine)), parts(engine)
        run_attribution(engine, config, now=now, full=True)
        assert strip(rows(engine)) == incremental, now
        assert parts(engine) == incremental_parts, now

    for hours in range(1, 20, 2):
        run(start + timedelta(hours=hours, minutes=10))
    equals_a_full_recompute(start + timedelta(hours=19, minutes=10))
    # the attempt holds 2 GPUs (one without telemetry: unmapped) from its start
    store(engine, attempts=[replace(first, alloc_gpus=2)])
    run(start + timedelta(hours=20, minutes=10))
    assert {r["mapping"] for r in rows(engine, 41)} == {"process", "unmapped"}
    equals_a_full_recompute(start + timedelta(hours=20, minutes=10))
    # requeued at 21:05 (before the last run's `now`); the job runs again from 21:20
    requeued_at = start + timedelta(hours=21, minutes=5)
    store(engine, attempts=[replace(first, alloc_gpus=2, end_at=requeued_at, state="REQUEUED")])
    again = attempt(
        job_id_raw=41, nodes=("gpu01",), alloc_gpus=1, start_at=requeued_at + timedelta(minutes=15), end_at=None,
        state="RUNNING", submit_at=requeued_at + timedelta(minutes=1),
    )  # fmt: skip
    store(engine, attempts=[again])
    for minutes in (0, 20, 40, 60, 80):
        run(start + timedelta(hours=21, minutes=30 + minutes))
    assert {r["submit_at"] for r in rows(engine, 41)} == {first.submit_at, again.submit_at}
    now = start + timedelta(hours=22, minutes=50)
    equals_a_full_recompute(now)
    # retention drops Oct 31st's windows; the runs after it keep that day's rows
    day_before = {
        (r["submit_at"], r["gpu_uuid"]): r
        for r in strip(rows(engine))
        if r["day"].isoformat() == "2026-10-31"
    }
    assert day_before
    with engine.begin() as conn:
        sample_store().maintain(conn, first_day=T0.date(), last_day=T0.date(), cutoff=T0.date())
        # the hour slices of those windows go with them (the daemon's maintenance job)
        pruned = delete_parts_before(conn, T0.replace(hour=0, minute=0, second=0, microsecond=0))
    assert pruned > 0
    assert {p["day"].isoformat() for p in parts(engine)} == {"2026-11-01"}
    for minutes in (20, 40, 60):
        run(now + timedelta(minutes=minutes))
    assert {
        (r["submit_at"], r["gpu_uuid"]): r
        for r in strip(rows(engine))
        if r["day"].isoformat() == "2026-10-31"
    } == day_before
