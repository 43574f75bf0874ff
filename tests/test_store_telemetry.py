from __future__ import annotations

import threading
import time
from dataclasses import replace
from datetime import date, timedelta
from typing import Any

from sqlalchemy import Engine, text

from slurmtel.records import GpuAllocation, GpuEvent, GpuInventory, GpuSummary, NodeState, PendingJob
from slurmtel.store.locks import PARTITION_LOCK_KEY
from slurmtel.store.telemetry import (
    PartitionBudget,
    drop_partitions_before,
    ensure_partitions,
    existing_partitions,
    partition_name,
    resolve_allocation_uuids,
    write_allocations,
    write_events,
    write_inventory,
    write_node_states,
    write_pending,
    write_summaries,
    write_summary_groups,
)
from tests.factories import at


def summary(uuid: str = "GPU-a", start: str = "2026-11-01T10:00:00", **kw) -> GpuSummary:  # type: ignore[no-untyped-def]
    values = dict(
        source="agent",
        node="gpu01",
        gpu_uuid=uuid,
        window_start_at=at(start),
        window_seconds=30.0,
        util_metric="gr_engine_active",
        sample_count=30,
        covered_seconds=30.0,
        util_mean_percent=50.0,
        util_max_percent=90.0,
        idle_seconds=10.0,
        no_process_seconds=0.0,
        job_ids=("17",),
    )
    values.update(kw)
    return GpuSummary(**values)  # type: ignore[arg-type]


def count(engine: Engine, sql: str) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text(sql)).scalar_one())


def test_summaries_are_stored_once_even_when_a_pull_is_retried(engine: Engine) -> None:
    day_one = [summary(f"GPU-{g}", f"2026-11-01T23:59:{s:02d}") for g in range(4) for s in (0, 30)]
    day_two = [summary(f"GPU-{g}", "2026-11-02T00:00:00") for g in range(4)]
    with engine.begin() as conn:
        first = write_summaries(conn, day_one + day_two, source="agent", node="gpu01")
    assert (first.received, first.inserted) == (12, 12)
    with engine.begin() as conn:
        retried = write_summaries(conn, [*day_two, summary("GPU-9", "2026-11-02T00:00:30")], source="agent")
    assert (retried.received, retried.inserted, retried.duplicates) == (5, 1, 4)
    with engine.begin() as conn:
        again = write_summaries(conn, day_two, source="agent")
    assert (again.inserted, again.batch_id) == (0, None)
    assert count(engine, "SELECT count(*) FROM gpu_summary") == 13
    # one batch per write that stored something, with the number of rows it stored
    with engine.connect() as conn:
        batches = conn.execute(text("SELECT rows FROM ingest_batch ORDER BY id")).scalars().all()
    assert batches == [12, 1]
    names = existing_partitions_now(engine)
    assert {"gpu_window_20261101", "gpu_window_20261102"} <= names
    assert count(engine, "SELECT count(*) FROM gpu_window_20261101") == 8


def test_a_window_repeated_within_one_write_is_stored_once_the_first_kept(engine: Engine) -> None:
    first = summary("GPU-r", "2026-11-03T10:00:00", util_mean_percent=20.0)
    repeat = replace(first, util_mean_percent=80.0)
    other = summary("GPU-r", "2026-11-03T10:00:30")
    with engine.begin() as conn:
        stats = write_summaries(conn, [first, other, repeat], source="agent", node="gpu01")
    assert (stats.received, stats.inserted, stats.duplicates) == (3, 2, 1)
    with engine.connect() as conn:
        stored = conn.execute(
            text(
                "SELECT window_start_at, util_mean_percent FROM gpu_summary WHERE gpu_uuid = 'GPU-r' ORDER BY 1"
            )
        ).all()
        batch_rows = conn.execute(
            text("SELECT rows FROM ingest_batch WHERE id = :id"), {"id": stats.batch_id}
        )
        assert batch_rows.scalar_one() == 2
    assert [(row[0], row[1]) for row in stored] == [
        (first.window_start_at, 20.0),
        (other.window_start_at, 50.0),
    ]


def test_several_nodes_windows_in_one_write_each_its_own_batch(engine: Engine) -> None:
    """write_summary_groups: one COPY for all, one ingest batch per node with its node and window
    range (attribution reads them), stats in the order given; a node with nothing storable gets
    no batch."""
    a = [summary(f"GPU-a{g}", f"2026-11-04T10:00:{s:02d}", node="gpu01") for g in range(2) for s in (0, 30)]
    b = [
        summary("GPU-b0", "2026-11-05T23:59:30", node="gpu02"),
        summary("GPU-b0", "2026-11-06T00:00:00", node="gpu02"),
    ]
    with engine.begin() as conn:
        stats = write_summary_groups(conn, [("gpu01", a), ("gpu03", []), ("gpu02", b)], source="agent")
    assert [(s.received, s.inserted) for s in stats] == [(4, 4), (0, 0), (2, 2)]
    assert stats[1].batch_id is None and stats[0].batch_id != stats[2].batch_id
    with engine.connect() as conn:
        batches = conn.execute(
            text("SELECT id, node, window_min_at, window_max_at, rows FROM ingest_batch ORDER BY id")
        ).all()
        by_batch = dict(conn.execute(text("SELECT batch_id, count(*) FROM gpu_window GROUP BY 1")).all())
    assert [(r.id, r.node, r.window_min_at, r.window_max_at, r.rows) for r in batches] == [
        (stats[0].batch_id, "gpu01", at("2026-11-04T10:00:00"), at("2026-11-04T10:00:30"), 4),
        (stats[2].batch_id, "gpu02", at("2026-11-05T23:59:30"), at("2026-11-06T00:00:00"), 2),
    ]
    assert by_batch == {stats[0].batch_id: 4, stats[2].batch_id: 2}
    assert {"gpu_window_20261104", "gpu_window_20261105", "gpu_window_20261106"} <= existing_partitions_now(
        engine
    )


def test_a_retried_node_in_a_group_costs_the_others_nothing(engine: Engine) -> None:
    """One node's windows were stored already (a retried pull): the group's COPY fails on them,
    and each node's windows are written alone in the same transaction; the new ones of both are
    stored, the repeats are not, and a window no column holds is refused by name."""
    old = [summary("GPU-r0", f"2026-11-07T10:00:{s:02d}", node="gpu01") for s in (0, 30)]
    with engine.begin() as conn:
        write_summaries(conn, old, source="agent", node="gpu01")
    new = summary("GPU-r0", "2026-11-07T10:01:00", node="gpu01")
    other = [summary("GPU-s0", f"2026-11-07T10:00:{s:02d}", node="gpu02") for s in (0, 30)]
    unfit = summary("GPU-t0", "2026-11-07T10:00:00", node="gpu03", sample_count=2**40)
    fine = summary("GPU-t0", "2026-11-07T10:00:30", node="gpu03")
    with engine.begin() as conn:
        stats = write_summary_groups(
            conn, [("gpu01", [*old, new]), ("gpu02", other), ("gpu03", [unfit, fine])], source="agent"
        )
    assert [(s.received, s.inserted, s.duplicates) for s in stats] == [(3, 1, 2), (2, 2, 0), (2, 1, 0)]
    assert [(s.gpu_uuid, reason.split(" ")[0]) for s, reason in stats[2].refused] == [
        ("GPU-t0", "sample_count")
    ]
    assert count(engine, "SELECT count(*) FROM gpu_summary WHERE window_start_at >= '2026-11-07'") == 6
    with engine.connect() as conn:
        rows = dict(
            conn.execute(
                text("SELECT id, rows FROM ingest_batch WHERE id = ANY(:ids)"),
                {"ids": [s.batch_id for s in stats]},
            ).all()
        )
    assert rows == {stats[0].batch_id: 1, stats[1].batch_id: 2, stats[2].batch_id: 1}
    # the whole group again: nothing new, no batch left behind
    with engine.begin() as conn:
        again = write_summary_groups(conn, [("gpu01", [*old, new]), ("gpu02", other)], source="agent")
    assert [(s.inserted, s.batch_id) for s in again] == [(0, None), (0, None)]
    assert count(engine, "SELECT count(*) FROM ingest_batch") == 4


def existing_partitions_now(engine: Engine) -> set[str]:
    with engine.connect() as conn:
        return set(existing_partitions(conn))


def test_partitions_are_created_ahead_and_dropped_past_retention(engine: Engine) -> None:
    with engine.begin() as conn:
        created = ensure_partitions(conn, date(2025, 1, 1), date(2025, 1, 3))
        assert created == ["gpu_window_20250101", "gpu_window_20250102", "gpu_window_20250103"]
        assert ensure_partitions(conn, date(2025, 1, 2), date(2025, 1, 3)) == []
        write_summaries(conn, [summary(start="2025-01-01T12:00:00")], source="agent")
        dropped = drop_partitions_before(conn, date(2025, 1, 3))
    assert dropped == ["gpu_window_20250101", "gpu_window_20250102"]
    assert "gpu_window_20250103" in existing_partitions_now(engine)
    assert count(engine, "SELECT count(*) FROM gpu_summary WHERE window_start_at < '2025-01-02'") == 0


def inventory(index: int, uuid: str, seen: str, driver: str = "550.54.15") -> GpuInventory:
    return GpuInventory(
        node="gpu01",
        gpu_uuid=uuid,
        index=index,
        model="NVIDIA H100 80GB HBM3",
        observed_at=at(seen),
        driver_version=driver,
        cuda_version="12.4",
    )


def test_allocations_get_the_uuid_the_index_had_at_that_time(engine: Engine) -> None:
    with engine.begin() as conn:
        # index 0 was GPU-old until the node was re-cabled, then GPU-new
        write_inventory(conn, [inventory(0, "GPU-old", "2026-11-01T00:00:00")], source="agent")
        write_inventory(conn, [inventory(0, "GPU-old", "2026-11-05T00:00:00")], source="agent")
        write_inventory(
            conn, [inventory(0, "GPU-new", "2026-11-10T00:00:00", driver="560.35.03")], source="agent"
        )
        write_allocations(
            conn,
            [
                GpuAllocation("lab", 5, at("2026-11-03T00:00:00"), "gpu01", 0, at("2026-11-03T01:00:00")),
                GpuAllocation("lab", 6, at("2026-11-10T00:00:00"), "gpu01", 0, at("2026-11-10T00:00:00")),
                # a node without inventory yet
                GpuAllocation("lab", 7, at("2026-11-10T00:00:00"), "gpu02", 1, at("2026-11-10T00:00:00")),
            ],
        )
    with engine.connect() as conn:
        rows = dict(conn.execute(text("SELECT job_id_raw, gpu_uuid FROM gpu_allocation")).all())
    assert rows == {5: "GPU-old", 6: "GPU-new", 7: ""}
    with engine.begin() as conn:
        write_inventory(
            conn, [replace(inventory(1, "GPU-g2-1", "2026-11-10T00:00:00"), node="gpu02")], source="agent"
        )
        assert resolve_allocation_uuids(conn) == 1
    with engine.connect() as conn:
        assert (
            conn.execute(text("SELECT gpu_uuid FROM gpu_allocation WHERE job_id_raw = 7")).scalar_one()
            == "GPU-g2-1"
        )


def test_allocation_seen_again_extends_its_interval(engine: Engine) -> None:
    first = GpuAllocation("lab", 5, at("2026-11-03T00:00:00"), "gpu01", 2, at("2026-11-03T01:00:00"))
    with engine.begin() as conn:
        write_allocations(conn, [first, replace(first, observed_at=at("2026-11-03T01:00:30"))])
        write_allocations(conn, [replace(first, observed_at=at("2026-11-03T01:00:15"))])
    with engine.connect() as conn:
        row = conn.execute(text("SELECT first_seen_at, last_seen_at FROM gpu_allocation")).one()
    assert tuple(row) == (at("2026-11-03T01:00:00"), at("2026-11-03T01:00:30"))


def test_node_states_become_intervals(engine: Engine) -> None:
    t0 = at("2026-11-01T00:00:00")
    idle = NodeState("lab", "gpu02", t0, ("IDLE",), 4, 0, ("gpu", "debug"), "h100")
    with engine.begin() as conn:
        for minutes, states, alloc in [
            (0, ("IDLE",), 0),
            (1, ("MIXED",), 2),
            (2, ("MIXED",), 3),
            (3, ("DOWN", "DRAIN"), 0),
            (4, ("DOWN", "DRAIN"), 0),
        ]:
            write_node_states(
                conn,
                [
                    replace(
                        idle, observed_at=t0 + timedelta(minutes=minutes), states=states, gpus_allocated=alloc
                    )
                ],
            )
    with engine.connect() as conn:
        rows = [
            tuple(r)
            for r in conn.execute(
                text(
                    "SELECT states, gpus_allocated, first_seen_at, last_seen_at FROM node_state ORDER BY first_seen_at"
                )
            )
        ]
    assert rows == [
        (["IDLE"], 0, t0, t0),
        (["MIXED"], 3, t0 + timedelta(minutes=1), t0 + timedelta(minutes=2)),
        (["DOWN", "DRAIN"], 0, t0 + timedelta(minutes=3), t0 + timedelta(minutes=4)),
    ]


def test_events_and_pending_jobs_are_idempotent(engine: Engine) -> None:
    xid = GpuEvent("gpu01", "GPU-a", at("2026-11-01T10:00:00"), "xid", 79, "GPU has fallen off the bus")
    pend = PendingJob(
        "lab",
        9,
        "9",
        at("2026-11-01T10:00:00"),
        at("2026-11-01T10:01:00"),
        "bob",
        "chemistry",
        "gpu",
        "AssocGrpGRES",
        4,
    )
    with engine.begin() as conn:
        assert write_events(conn, [xid, xid]) == 1
        assert write_events(conn, [xid]) == 0
        write_pending(conn, [pend], cluster="lab", observed_at=pend.observed_at)
        write_pending(
            conn,
            [replace(pend, observed_at=at("2026-11-01T10:02:00"))],
            cluster="lab",
            observed_at=at("2026-11-01T10:02:00"),
        )
    with engine.connect() as conn:
        row = conn.execute(text("SELECT reason, first_seen_at, last_seen_at FROM pending_job")).one()
        snapshot = conn.execute(text("SELECT observed_at FROM controller_snapshot")).scalar_one()
    assert tuple(row) == ("AssocGrpGRES", at("2026-11-01T10:01:00"), at("2026-11-01T10:02:00"))
    assert snapshot == at("2026-11-01T10:02:00")


def test_a_window_longer_than_an_hour_is_refused_by_name_and_the_rest_stored(engine: Engine) -> None:
    """The window reads look back an hour and attribution sums hour slices: a longer window
    (a hostile or misconfigured source) would be counted short, so it is refused with its reason."""
    long = summary("GPU-l0", "2026-11-08T10:00:00", node="gpu01", window_seconds=7200.0)
    hour = summary("GPU-l0", "2026-11-08T12:00:00", node="gpu01", window_seconds=3600.0)
    with engine.begin() as conn:
        stats = write_summaries(conn, [long, hour], source="agent", node="gpu01")
    assert (stats.received, stats.inserted) == (2, 1)
    assert [(s.window_start_at.hour, reason) for s, reason in stats.refused] == [
        (10, "window_seconds (7200.0) is longer than a window may be (3600 s)")
    ]


def test_a_new_day_costs_a_run_one_partition_however_many_nodes_and_tries_bring_it() -> None:
    """The budget counts the days a run may create, not the pages asking for them: at midnight
    every node's page brings the new day, and a page retried after a failed group asks again."""
    budget = PartitionBudget(2)
    new_day, next_day, third_day = date(2026, 11, 2), date(2026, 11, 3), date(2026, 11, 4)
    for _ in range(3):
        assert budget.grant([new_day]) == {new_day}
    assert budget.grant([third_day, next_day]) == {third_day}  # newest first, as far as it goes
    assert budget.grant([next_day, new_day]) == {new_day}


def test_at_midnight_every_node_of_a_group_stores_the_new_days_windows(engine: Engine) -> None:
    """The nodes of one group all ask for the new day's partition, each in turn; a budget of one
    partition covers them all."""
    groups = [
        (
            f"gpu{n:02d}",
            [summary(f"GPU-{n}", "2029-05-17T23:59:30"), summary(f"GPU-{n}", "2029-05-18T00:00:00")],
        )
        for n in range(5)
    ]
    with engine.begin() as conn:
        ensure_partitions(conn, date(2029, 5, 17), date(2029, 5, 17))
        stats = write_summary_groups(conn, groups, source="agent", partition_budget=PartitionBudget(1))
    assert [(s.inserted, s.refused) for s in stats] == [(2, ())] * 5
    assert count(engine, "SELECT count(*) FROM gpu_window") == 10


def test_an_inventory_written_at_once_is_what_writing_it_row_by_row_leaves(engine: Engine) -> None:
    """One statement for a whole inventory (a configuration given twice merged first): the
    same rows as upserting each GPU alone, in order. A new driver is a new configuration."""

    def gpu(
        uuid: str, hour: int, *, model: str = "H100", driver: str = "550.54", index: int = 0
    ) -> GpuInventory:
        return GpuInventory(
            node="gpu01",
            gpu_uuid=uuid,
            index=index,
            model=model,
            observed_at=at(f"2026-11-01T{hour:02d}:00:00"),
            memory_total_bytes=80 * 2**30,
            driver_version=driver,
        )

    batches = [
        [gpu("GPU-a", 10), gpu("GPU-b", 10, index=1)],
        # GPU-a twice in one call (the later one renamed, the earlier one earlier than any),
        # GPU-b on a new driver, GPU-c new
        [
            gpu("GPU-a", 12, model="H100 80GB HBM3"),
            gpu("GPU-a", 8),
            gpu("GPU-b", 11, index=1, driver="560.28"),
            gpu("GPU-c", 9, index=2),
        ],
        [gpu("GPU-a", 11)],
    ]

    def table() -> list[tuple[Any, ...]]:
        with engine.connect() as conn:
            return [
                tuple(r)
                for r in conn.execute(
                    text(
                        "SELECT node, gpu_uuid, gpu_index, model, driver_version, first_seen_at, last_seen_at "
                        "FROM gpu_inventory ORDER BY gpu_uuid, driver_version"
                    )
                )
            ]

    for batch in batches:
        with engine.begin() as conn:
            for g in batch:
                assert write_inventory(conn, [g], source="agent") == 1
    one_by_one = table()
    with engine.begin() as conn:
        conn.execute(text("TRUNCATE gpu_inventory"))
    for batch in batches:
        with engine.begin() as conn:
            assert write_inventory(conn, batch, source="agent") == len(batch)
    assert table() == one_by_one
    # what JSON could mangle: quotes, a backslash, non-ASCII text; a float4 fraction (read back
    # as psycopg reads a real), infinity
    odd = replace(
        gpu("GPU-d", 9, index=3), model='H100 "SXM5" \\ \u2603', gpu_fraction=1 / 7, memory_total_bytes=None
    )
    inf = replace(gpu("GPU-e", 9, index=4), gpu_fraction=float("inf"), minor_number=2**31 - 1)
    with engine.begin() as conn:
        write_inventory(conn, [odd, inf], source="agent")
        stored = conn.execute(
            text(
                "SELECT model, gpu_fraction, memory_total_bytes, minor_number, source FROM gpu_inventory "
                "WHERE gpu_uuid IN ('GPU-d', 'GPU-e') ORDER BY gpu_uuid"
            )
        ).all()
    assert [tuple(r) for r in stored] == [
        ('H100 "SXM5" \\ \u2603', 0.14285715, None, None, "agent"),
        ("H100", float("inf"), 80 * 2**30, 2**31 - 1, "agent"),
    ]
    assert [(r[1], r[3], r[4], r[5].hour, r[6].hour) for r in one_by_one] == [
        ("GPU-a", "H100", "550.54", 8, 12),
        ("GPU-b", "H100", "550.54", 10, 10),
        ("GPU-b", "H100", "560.28", 11, 11),
        ("GPU-c", "H100", "550.54", 9, 9),
    ]


def test_a_writer_waiting_for_the_partition_lock_holds_no_lock_its_creator_needs(engine: Engine) -> None:
    """Creating a day's partitions takes the partition lock, then an exclusive lock on
    gpu_window and gpu_window_hour. A writer waiting for the partition lock must not hold a lock
    on either (it did once: the packed-hours check read gpu_window_hour first, and two writers of
    a new day deadlocked in `slurmtel demo`)."""
    day = date(2026, 11, 3)
    windows = [summary(f"GPU-{g}", "2026-11-03T00:00:00") for g in range(4)]
    stored: list[int] = []
    with engine.begin() as conn:  # the day has no partition yet, whatever ran before
        conn.execute(text("SELECT slurmtel_drop_summary_partition(:day)"), {"day": day})
    with engine.connect() as holder:
        holder.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": PARTITION_LOCK_KEY})

        def write() -> None:
            with engine.begin() as conn:
                stored.append(write_summaries(conn, windows, source="agent", node="gpu01").inserted)

        writer = threading.Thread(target=write)
        writer.start()
        waited = 0.0
        while not count(
            engine, "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
        ):  # the writer is waiting for the partition lock
            assert writer.is_alive() and waited < 60, "the writer never waited for the partition lock"
            time.sleep(0.05)
            waited += 0.05
        # what the writer holds meanwhile: no lock on the tables the creator locks
        holder.execute(text("SET LOCAL lock_timeout = '5s'"))
        assert holder.execute(
            text("SELECT slurmtel_create_summary_partition(:day)"), {"day": day}
        ).scalar_one()
        holder.commit()
        writer.join(timeout=60)
    assert stored == [4]
    with engine.connect() as conn:
        assert partition_name(day) in existing_partitions(conn)
