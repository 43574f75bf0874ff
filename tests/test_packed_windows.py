"""Packed windows (migration 0012): closed, attributed hours move from one row per window to one
row per GPU and hour, and every reader sees the same windows, to the precision the packed
types keep, with nothing lost, nothing counted twice and late data merged."""

from __future__ import annotations

import math
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import Connection, Engine, text

from slurmtel.attribution import run_attribution
from slurmtel.config import Config
from slurmtel.records import GpuSummary
from slurmtel.simulate import sampled_windows
from slurmtel.store.attribution import mark_batches
from slurmtel.store.jobs import write_attempts
from slurmtel.store.jobview import gpu_figures, util_windows
from slurmtel.store.telemetry import (
    PACK_DELAY,
    PACK_GPUS_PER_RUN,
    PACK_RUNS,
    pack_budget,
    pack_windows,
    window_store_size,
    write_inventory,
    write_summaries,
)
from tests.factories import attempt, inventory, windows

HOUR = datetime(2026, 11, 3, 10, 0, tzinfo=UTC)
LATER = HOUR + timedelta(hours=5)  # the hours from HOUR on are closed and past the delay
FIELDS = (
    "window_seconds", "util_metric", "sample_count", "covered_seconds", "util_mean_percent",
    "util_max_percent", "idle_seconds", "no_process_seconds", "memory_used_mean_bytes",
    "memory_used_max_bytes", "memory_total_bytes", "power_mean_watts", "energy_joules",
    "energy_method", "temperature_max_celsius", "sm_clock_max_mhz", "job_ids",
)  # fmt: skip
# what each packed type keeps (migration 0012); other fields come back exactly
PRECISION = {
    "covered_seconds": 0.0005, "idle_seconds": 0.0005, "no_process_seconds": 0.0005,
    "util_mean_percent": 0.005, "util_max_percent": 0.005, "memory_used_mean_bytes": 512,
    "memory_used_max_bytes": 512, "power_mean_watts": 0.05, "energy_joules": 0.01,
    "temperature_max_celsius": 0.05, "sm_clock_max_mhz": 0.5,
}  # fmt: skip


def stored(conn: Connection) -> dict[tuple[str, datetime], dict]:
    result = conn.execute(text("SELECT * FROM gpu_summary")).mappings()
    return {(r["gpu_uuid"], r["window_start_at"]): dict(r) for r in result}


def assert_same_windows(before: dict, after: dict) -> None:
    assert after.keys() == before.keys()
    for key, row in before.items():
        for field in FIELDS:
            old, new = row[field], after[key][field]
            if field in PRECISION and old is not None:
                assert new == pytest.approx(old, abs=PRECISION[field]), (key, field)
            else:
                assert new == old, (key, field)


def fold_and_pack(engine: Engine, config: Config, now: datetime = LATER) -> int:
    return run_attribution(engine, config, now=now).packed_windows


def packed_rows(engine: Engine) -> list[tuple[str, datetime, int]]:
    with engine.connect() as conn:
        return [
            (r[0], r[1], r[2])
            for r in conn.execute(
                text(
                    "SELECT gpu_uuid, hour_at, cardinality(sample_counts) FROM gpu_window_hour ORDER BY 1, 2"
                )
            )
        ]


def test_closed_attributed_hours_are_packed_and_read_back_the_same(engine: Engine, config: Config) -> None:
    summaries = [w for g in range(3) for w in sampled_windows("gpu01", f"GPU-p{g}", HOUR, 240)]
    with engine.begin() as conn:
        write_summaries(conn, summaries, source="agent", node="gpu01")
        before = stored(conn)
    assert fold_and_pack(engine, config) == 3 * 240
    # one row per GPU and hour, 120 windows each, and none left one row each
    assert packed_rows(engine) == [
        (f"GPU-p{g}", HOUR + timedelta(hours=h), 120) for g in range(3) for h in (0, 1)
    ]
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM gpu_window")).scalar_one() == 0
        assert_same_windows(before, stored(conn))
        size, count = window_store_size(conn)
    assert count == 3 * 240 and size > 0
    # a second run has nothing to move and changes nothing
    assert fold_and_pack(engine, config) == 0
    assert packed_rows(engine) == [
        (f"GPU-p{g}", HOUR + timedelta(hours=h), 120) for g in range(3) for h in (0, 1)
    ]


def test_the_current_hour_and_unattributed_windows_stay_unpacked(engine: Engine, config: Config) -> None:
    with engine.begin() as conn:
        write_summaries(conn, windows("GPU-q", HOUR, 180), source="agent", node="gpu01")
    # the hour 10:00 ended less than PACK_DELAY before: kept for late data
    assert fold_and_pack(engine, config, HOUR + timedelta(hours=1) + PACK_DELAY / 2) == 0
    assert fold_and_pack(engine, config, HOUR + timedelta(hours=1) + PACK_DELAY) == 120
    assert packed_rows(engine) == [("GPU-q", HOUR, 120)]
    # windows no attribution run has folded in are never packed
    with engine.begin() as conn:
        write_summaries(conn, windows("GPU-r", HOUR, 10), source="agent", node="gpu01")
        assert pack_windows(conn, now=LATER) == 60  # GPU-q's 11:00 hour, closed by now
        assert (
            conn.execute(text("SELECT count(*) FROM gpu_window WHERE gpu_uuid = 'GPU-r'")).scalar_one() == 10
        )


def test_a_late_window_is_merged_into_its_packed_row_and_a_repeat_is_refused(
    engine: Engine, config: Config
) -> None:
    hour = windows("GPU-s", HOUR, 120, busy=set(range(60)), job="41")
    late = hour.pop(77)
    with engine.begin() as conn:
        write_summaries(conn, hour, source="agent", node="gpu01")
    fold_and_pack(engine, config)
    assert packed_rows(engine) == [("GPU-s", HOUR, 119)]
    # a retried pull brings the packed windows again, and the one that was missing
    with engine.begin() as conn:
        again = write_summaries(conn, [*hour[:5], late], source="agent", node="gpu01")
    assert (again.inserted, again.duplicates) == (1, 5)
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM gpu_summary")).scalar_one() == 120
    fold_and_pack(engine, config)
    assert packed_rows(engine) == [("GPU-s", HOUR, 120)]
    with engine.connect() as conn:
        rows = stored(conn)
    assert len(rows) == 120
    assert rows[("GPU-s", late.window_start_at)]["idle_seconds"] == 30.0
    assert rows[("GPU-s", HOUR)]["job_ids"] == ["41"]


def test_windows_the_packed_types_cannot_hold_stay_one_row_each(engine: Engine, config: Config) -> None:
    base = windows("GPU-t", HOUR, 4)
    odd = [
        replace(base[0], util_mean_percent=1e6),  # beyond 1/100 percent in an int2
        replace(base[1], power_mean_watts=math.nan),
        replace(base[2], job_ids=("7\x1f8",)),  # the separator of packed job-id sets
        base[3],
    ]
    with engine.begin() as conn:
        write_summaries(conn, odd, source="agent", node="gpu01")
    assert fold_and_pack(engine, config) == 1
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM gpu_window")).scalar_one() == 3
        rows = stored(conn)
    assert len(rows) == 4
    assert rows[("GPU-t", base[0].window_start_at)]["util_mean_percent"] == 1e6
    assert math.isnan(rows[("GPU-t", base[1].window_start_at)]["power_mean_watts"])
    assert rows[("GPU-t", base[2].window_start_at)]["job_ids"] == ["7\x1f8"]


def test_attribution_and_the_job_plot_are_the_same_after_packing(engine: Engine, config: Config) -> None:
    job = attempt(
        job_id_raw=90,
        nodes=("gpu01",),
        alloc_gpus=2,
        submit_at=HOUR,
        start_at=HOUR + timedelta(minutes=7, seconds=10),
        end_at=HOUR + timedelta(hours=2, minutes=3, seconds=20),
    )
    summaries = [
        replace(w, job_ids=("90",) if job.start_at <= w.window_start_at < job.end_at else w.job_ids)  # type: ignore[operator]
        for g in (0, 1)
        for w in sampled_windows("gpu01", f"GPU-u{g}", HOUR, 300)
    ]
    with engine.begin() as conn:
        write_attempts(conn, [job])
        write_inventory(conn, inventory("gpu01", ["GPU-u0", "GPU-u1"], HOUR), source="agent")
        write_summaries(conn, summaries, source="agent", node="gpu01")
    # attributed from one row per window (no packing yet: the hours are too recent)
    run_attribution(engine, config, now=HOUR + timedelta(hours=2, minutes=30), full=True)
    unpacked = attribution(engine)
    with engine.connect() as conn:
        plot = util_windows(conn, ["GPU-u0", "GPU-u1"], start=job.start_at, end=job.end_at)  # type: ignore[arg-type]
    assert fold_and_pack(engine, config) > 0 and packed_rows(engine)
    run_attribution(engine, config, now=LATER, full=True)
    packed = attribution(engine)
    assert packed.keys() == unpacked.keys() and len(packed) == 2
    for key, row in unpacked.items():
        for field, value in row.items():
            if isinstance(value, float):
                assert packed[key][field] == pytest.approx(value, rel=1e-4, abs=0.05), (key, field)
            else:
                assert packed[key][field] == value, (key, field)
    with engine.connect() as conn:
        plot_after = util_windows(conn, ["GPU-u0", "GPU-u1"], start=job.start_at, end=job.end_at)  # type: ignore[arg-type]
    assert [(w.gpu_uuid, w.window_start_at) for w in plot_after] == [
        (w.gpu_uuid, w.window_start_at) for w in plot
    ]
    for old, new in zip(plot, plot_after, strict=True):
        assert new.util_mean_percent == pytest.approx(old.util_mean_percent, abs=0.005)


def test_the_job_views_power_reads_packed_hours_as_their_windows(engine: Engine, config: Config) -> None:
    """`slurmtel job`'s highest window power reads of a packed hour inside the job only its power
    array, of an hour at an edge the offsets too (gpu_figures, samples.power_max_sql): the same
    figure as every window of the job read through slurmtel_gpu_windows, packed or not, a gap
    in the windows (offsets kept) and a job's edges inside a window included."""
    job = attempt(
        job_id_raw=91,
        nodes=("gpu01",),
        alloc_gpus=2,
        submit_at=HOUR,
        start_at=HOUR + timedelta(minutes=7, seconds=10),
        end_at=HOUR + timedelta(hours=2, minutes=3, seconds=20),
    )
    summaries = [
        # the GPU's hottest windows: one before the job (left out), one at its first edge, one in
        # the hour it holds whole; a gap in the second GPU's windows of that hour
        replace(w, power_mean_watts={10: 990.0, 14: 914.0, 150: 950.0}.get(i, w.power_mean_watts))
        for g in (0, 1)
        for i, w in enumerate(sampled_windows("gpu01", f"GPU-u{g}", HOUR, 300))
        if not (g == 1 and 130 <= i < 140)
    ]
    with engine.begin() as conn:
        write_attempts(conn, [job])
        write_inventory(conn, inventory("gpu01", ["GPU-u0", "GPU-u1"], HOUR), source="agent")
        write_summaries(conn, summaries, source="agent", node="gpu01")
    run_attribution(engine, config, now=HOUR + timedelta(hours=2, minutes=30), full=True)

    def figures() -> tuple[dict[str, float | None], dict[str, float | None]]:
        with engine.connect() as conn:
            key = ("lab", 91, HOUR)
            shown = {g.gpu_uuid: g.power_max_watts for g in gpu_figures(conn, [key], now=LATER)[key]}
            # planned for the partitions of the job's time only: the same figures
            span = (job.start_at, job.end_at)
            planned = gpu_figures(conn, [key], now=LATER, span=span)[key]  # type: ignore[arg-type]
            assert {g.gpu_uuid: g.power_max_watts for g in planned} == shown
            read = {
                uuid: conn.execute(
                    text("SELECT max(power_mean_watts) FROM slurmtel_gpu_windows(ARRAY[:u], :lo, :hi)"),
                    {"u": uuid, "lo": job.start_at, "hi": job.end_at},
                ).scalar_one()
                for uuid in ("GPU-u0", "GPU-u1")
            }
        return shown, read

    unpacked, read_unpacked = figures()
    assert unpacked == read_unpacked == {"GPU-u0": 950.0, "GPU-u1": 950.0}
    assert fold_and_pack(engine, config) > 0 and packed_rows(engine)
    with engine.connect() as conn:
        gapped = conn.execute(
            text(
                "SELECT count(*) FROM gpu_window_hour WHERE gpu_uuid = 'GPU-u1' AND window_offsets_ms IS NOT NULL"
            )
        ).scalar_one()
    assert gapped == 1
    packed, read_packed = figures()
    assert packed == read_packed == unpacked
    # a window of an edge hour decides when it holds more
    with engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE gpu_window_hour SET power_mean_deciwatts[15] = 9990 "
                "WHERE gpu_uuid = 'GPU-u1' AND hour_at = :h"
            ),
            {"h": HOUR},
        )
    shown, read = figures()
    assert shown == read and shown == {"GPU-u0": 950.0, "GPU-u1": 999.0}
    # and one of the hour held whole
    with engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE gpu_window_hour SET power_mean_deciwatts[5] = 9990 "
                "WHERE gpu_uuid = 'GPU-u0' AND hour_at = :h"
            ),
            {"h": HOUR + timedelta(hours=1)},
        )
    shown, read = figures()
    assert shown == read and shown["GPU-u0"] == 999.0


def test_a_packed_hours_highest_power_follows_late_windows(engine: Engine, config: Config) -> None:
    """gpu_window_hour.power_max_deciwatts (migration 0026) is the maximum of the row's power
    array however the row is written: a late window that lands in a packed hour the job holds
    whole is packed into it, and the job view's figure (which reads that column for such an
    hour) is the windows' own, after the run and after a full recompute."""
    job = attempt(
        job_id_raw=92,
        nodes=("gpu01",),
        alloc_gpus=1,
        submit_at=HOUR,
        start_at=HOUR + timedelta(minutes=5),
        end_at=HOUR + timedelta(hours=2, minutes=50),
    )
    summaries = list(sampled_windows("gpu01", "GPU-v0", HOUR, 360))
    late = replace(summaries[155], power_mean_watts=990.0)  # 11:17:30, in the hour held whole
    with engine.begin() as conn:
        write_attempts(conn, [job])
        write_inventory(conn, inventory("gpu01", ["GPU-v0"], HOUR), source="agent")
        write_summaries(conn, summaries[:155] + summaries[156:], source="agent", node="gpu01")
    assert fold_and_pack(engine, config) > 0

    def figures() -> tuple[float | None, float | None, bool]:
        with engine.connect() as conn:
            key = ("lab", 92, HOUR)
            (shown,) = gpu_figures(conn, [key], now=LATER, span=(job.start_at, job.end_at))[key]  # type: ignore[arg-type]
            read = conn.execute(
                text("SELECT max(power_mean_watts) FROM slurmtel_gpu_windows(ARRAY['GPU-v0'], :lo, :hi)"),
                {"lo": job.start_at, "hi": job.end_at},
            ).scalar_one()
            kept = conn.execute(
                text(
                    "SELECT bool_and(power_max_deciwatts IS NOT DISTINCT FROM "
                    "(SELECT max(p) FROM unnest(power_mean_deciwatts) AS p)) FROM gpu_window_hour"
                )
            ).scalar_one()
        return shown.power_max_watts, read, kept

    before, read_before, kept = figures()
    assert before == read_before and kept
    assert before is not None and before < 990.0
    with engine.begin() as conn:
        write_summaries(conn, [late], source="agent", node="gpu01")
    fold_and_pack(engine, config)
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM gpu_window")).scalar_one() == 0  # packed in
    assert figures() == (990.0, 990.0, True)
    run_attribution(engine, config, now=LATER, full=True)
    assert figures() == (990.0, 990.0, True)


def attribution(engine: Engine) -> dict[tuple, dict]:
    with engine.connect() as conn:
        result = conn.execute(
            text(
                "SELECT gpu_uuid, day, mapping, allocated_seconds, covered_seconds, busy_seconds, idle_seconds, "
                "no_process_seconds, unmeasured_seconds, util_weighted_sum, util_max_percent, "
                "memory_used_max_bytes, energy_joules FROM gpu_attribution WHERE job_id_raw = 90"
            )
        ).mappings()
        return {(r["gpu_uuid"], r["day"]): {k: _plain(v) for k, v in r.items()} for r in result}


def _plain(value: object) -> object:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else value


def test_a_read_takes_a_packed_hour_only_when_its_windows_reach_the_read(
    engine: Engine, config: Config
) -> None:
    """slurmtel_gpu_windows leaves out a packed hour none of whose windows can end after the
    read's start (migration 0028: each starts in the hour and lasts the row's window_seconds)
    and keeps one whose last window reaches into it: windows of half an hour and of an hour,
    packed, read from moments of the next hour."""

    def long(uuid: str, start: datetime, seconds: float) -> GpuSummary:
        (w,) = windows(uuid, start, 1)
        return replace(w, window_seconds=seconds, covered_seconds=seconds, idle_seconds=seconds)

    half = [long("GPU-h", HOUR, 1800.0), long("GPU-h", HOUR + timedelta(minutes=30), 1800.0)]
    whole = [long("GPU-o", HOUR + timedelta(minutes=30), 3600.0)]
    with engine.begin() as conn:
        write_summaries(conn, half + whole, source="agent", node="gpu01")
    assert fold_and_pack(engine, config) == 3

    def read(uuid: str, lo: datetime) -> list[datetime]:
        with engine.connect() as conn:
            return list(
                conn.execute(
                    text(
                        "SELECT window_start_at FROM slurmtel_gpu_windows(ARRAY[CAST(:uuid AS text)], :lo, :hi) "
                        "ORDER BY window_start_at"
                    ),
                    {"uuid": uuid, "lo": lo, "hi": lo + timedelta(hours=1)},
                ).scalars()
            )

    def packed_rows_read(uuid: str, lo: datetime) -> int:
        with engine.connect() as conn:
            (plan,) = conn.execute(
                text(
                    "EXPLAIN (ANALYZE, FORMAT JSON) SELECT * FROM "
                    "slurmtel_gpu_windows(ARRAY[CAST(:uuid AS text)], :lo, :hi)"
                ),
                {"uuid": uuid, "lo": lo, "hi": lo + timedelta(hours=1)},
            ).scalar_one()

        def rows(node: dict) -> int:  # type: ignore[type-arg]
            own = node["Actual Rows"] * node["Actual Loops"]
            packed = node.get("Relation Name", "").startswith("gpu_window_hour")
            return (own if packed else 0) + sum(rows(n) for n in node.get("Plans", ()))

        return rows(plan["Plan"])

    eleven = HOUR + timedelta(hours=1)
    assert read("GPU-h", eleven - timedelta(seconds=1)) == [HOUR + timedelta(minutes=30)]
    assert read("GPU-h", eleven) == []
    # a row of half-hour windows can reach 11:30 (one starting at 10:59): from then on it is
    # not even read, let alone unpacked
    assert packed_rows_read("GPU-h", eleven + timedelta(minutes=29)) == 1
    assert packed_rows_read("GPU-h", eleven + timedelta(minutes=30)) == 0
    assert read("GPU-o", eleven + timedelta(minutes=29, seconds=59)) == [HOUR + timedelta(minutes=30)]
    assert read("GPU-o", eleven + timedelta(minutes=30)) == []
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM gpu_window")).scalar_one() == 0


def test_hours_are_utc_whatever_the_session_time_zone(engine: Engine) -> None:
    # India is 5:30 from UTC: date_trunc('hour') in that zone would cut hours at :30
    with engine.begin() as conn:
        write_summaries(conn, windows("GPU-v", HOUR, 120), source="agent", node="gpu01")
    with engine.begin() as conn:
        conn.execute(text("SET LOCAL timezone = 'Asia/Kolkata'"))
        mark_batches(conn, list(conn.execute(text("SELECT id FROM ingest_batch")).scalars()))
        assert pack_windows(conn, now=LATER) == 120
        assert len(stored(conn)) == 120
    assert packed_rows(engine) == [("GPU-v", HOUR, 120)]


def test_a_run_packs_at_most_so_many_gpus_and_the_next_runs_take_the_rest(
    engine: Engine, config: Config
) -> None:
    with engine.begin() as conn:
        write_summaries(conn, [w for g in range(5) for w in windows(f"GPU-w{g}", HOUR, 120)], source="agent")
        mark_batches(conn, list(conn.execute(text("SELECT id FROM ingest_batch")).scalars()))
    packed = []
    for _ in range(4):
        with engine.begin() as conn:
            packed.append(pack_windows(conn, now=LATER, max_gpus=2))
    assert packed == [240, 240, 120, 0]
    assert packed_rows(engine) == [(f"GPU-w{g}", HOUR, 120) for g in range(5)]


def test_a_run_packs_a_share_of_a_large_clusters_gpus(engine: Engine) -> None:
    """The budget is PACK_GPUS_PER_RUN, or the GPUs seen in the last day over PACK_RUNS when
    that is more: a closed hour is packed within PACK_RUNS runs however many GPUs there are."""
    gpus = PACK_GPUS_PER_RUN * PACK_RUNS + 7
    with engine.begin() as conn:
        assert pack_budget(conn, now=LATER) == PACK_GPUS_PER_RUN
        write_inventory(conn, inventory("gpu01", [f"GPU-x{g}" for g in range(gpus)], LATER), source="agent")
        # seen more than a day ago: not counted
        write_inventory(conn, inventory("gpu02", ["GPU-old"], LATER - timedelta(days=2)), source="agent")
        assert pack_budget(conn, now=LATER) == PACK_GPUS_PER_RUN + 1  # ceil((8,000 + 7) / 8)


def test_runs_take_the_oldest_day_first_and_step_over_gpus_that_cannot_be_packed(
    engine: Engine, config: Config
) -> None:
    """A GPU whose windows the packed types cannot hold is never picked, so it takes no place of
    another's in a run; a GPU with windows to pack on two days is picked once."""
    day_before = HOUR - timedelta(days=1)
    unfit = [replace(w, util_mean_percent=1e6) for w in windows("GPU-a", HOUR, 10)]
    with engine.begin() as conn:
        write_summaries(conn, windows("GPU-z", day_before, 10), source="agent", node="gpu01")
        write_summaries(conn, unfit + windows("GPU-b", HOUR, 10), source="agent", node="gpu02")
        write_summaries(conn, windows("GPU-c", day_before, 5) + windows("GPU-c", HOUR, 5), source="agent")
        mark_batches(conn, list(conn.execute(text("SELECT id FROM ingest_batch")).scalars()))
    packed, gpus = [], []
    for _ in range(4):
        with engine.begin() as conn:
            packed.append(pack_windows(conn, now=LATER, max_gpus=1))
        gpus.append(sorted({uuid for uuid, _, _ in packed_rows(engine)}))
    # the day before: GPU-c (both its days at once), then GPU-z; then GPU-b, stepping over GPU-a
    assert packed == [10, 10, 10, 0]
    assert gpus == [["GPU-c"], ["GPU-c", "GPU-z"], ["GPU-b", "GPU-c", "GPU-z"], ["GPU-b", "GPU-c", "GPU-z"]]
    assert [(uuid, hour) for uuid, hour, _ in packed_rows(engine)] == [
        ("GPU-b", HOUR), ("GPU-c", day_before), ("GPU-c", HOUR), ("GPU-z", day_before),
    ]  # fmt: skip
    with engine.connect() as conn:
        left = conn.execute(text("SELECT DISTINCT gpu_uuid FROM gpu_window")).scalars().all()
    assert left == ["GPU-a"]
