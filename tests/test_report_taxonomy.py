"""`report taxonomy`: every installed GPU-second of a day in exactly one category, exactly.

The day is tests.factories.admin_day (read its docstring). Expected seconds, by hand:

  node   capacity                      unavailable        allocated (GPU-s)             unallocated
  gpu01  2 GPUs x 86400 = 172800       0                  J1 7200 + 102 14400 + 103 3600  147600
  gpu02  2 x 86400 = 172800 (debug)    DOWN 12-24: 86400  102 14400 + 103 7200            64800
  gpu03  86400                         drained: 86400     -                               0
  gpu04  86400                         DOWN 0-18: 64800   104 36000 > 21600 -> 21600      0
  gpu05  86400                         0                  105: 3600 x 0.5 (MIG) = 1800    84600
  gpu06  no node_state                 -                  106 3600 (installed := this)    -

J1's 7200 s: 3600 active, 1800 idle, 1800 no process. 105's 1800 s active. The rest unmeasured.
"""

from __future__ import annotations

from datetime import date, timedelta
from decimal import Decimal
from typing import Any

import pytest
from sqlalchemy import Engine

from slurmtel.access import EVERYTHING, Scope
from slurmtel.config import Config
from slurmtel.records import GpuInventory, NodeState
from slurmtel.store.reports_taxonomy import CATEGORIES, DOWN_STATES, taxonomy_report
from slurmtel.store.usage import JobFilter
from tests.factories import AdminDay, admin_day, at, attempt, load_admin_day, node_state, windows, with_hours

NOW = at("2026-12-02T14:00:00")
DAY = date(2026, 11, 1)
HOUR = Decimal(3600)


def report(engine: Engine, scope: Scope = EVERYTHING, **kwargs) -> list[dict[str, Any]]:
    kwargs.setdefault("first_day", DAY)
    kwargs.setdefault("last_day", DAY)
    kwargs.setdefault("timezone", "UTC")
    with engine.connect() as conn:
        return taxonomy_report(conn, now=NOW, scope=scope, **kwargs)


def seconds(row: dict, part: str) -> Decimal:
    return row[f"{part}_gpu_seconds"]


def test_day_by_partition_exact(engine: Engine, config: Config) -> None:
    load_admin_day(engine, config)
    rows = {r["partition"]: r for r in report(engine)}
    assert set(rows) == {"debug", "gpu"}
    gpu, debug = rows["gpu"], rows["debug"]
    assert {c: seconds(gpu, c) for c in CATEGORIES} == {
        "unavailable": 42 * HOUR,  # gpu03 all day, gpu04 until 18:00
        "unallocated": Decimal(147600 + 84600),
        "allocated_no_process": Decimal(1800),
        "allocated_idle": Decimal(1800),
        "active": Decimal(3600 + 1800),
        # 102: 28800, 103: 7200 + 3600, 104 fitted into gpu04's 6 available hours, 106: 3600
        "unmeasured": Decimal(28800 + 7200 + 3600 + 21600 + 3600),
    }
    assert seconds(gpu, "installed") == 127 * HOUR
    assert seconds(gpu, "capacity_unknown") == 1 * HOUR  # gpu06 has no node_state
    # gpu02 lists debug first: its down and unallocated time is debug's; jobs on it are gpu's
    assert {c: seconds(debug, c) for c in CATEGORIES} == {
        "unavailable": 24 * HOUR,
        "unallocated": 18 * HOUR,
        "allocated_no_process": 0,
        "allocated_idle": 0,
        "active": 0,
        "unmeasured": 0,
    }
    assert gpu["installed_gpu_seconds"] == 127 * HOUR
    assert with_hours(gpu)["unallocated_gpu_hours"] == 64.5
    assert gpu["unavailable_share"] == round(42 / 127, 4)
    assert debug["unavailable_share"] == round(24 / 42, 4)


def test_parts_sum_to_installed_exactly_and_installed_to_node_capacity(
    engine: Engine, config: Config
) -> None:
    day = load_admin_day(engine, config)
    rows = report(engine)
    for row in rows:
        # exact: no tolerance
        assert sum((seconds(row, c) for c in CATEGORIES), Decimal(0)) == seconds(row, "installed")
        # rounded to milliseconds, the parts still add up (largest remainder)
        assert all(seconds(row, c) == seconds(row, c).quantize(Decimal("0.001")) for c in CATEGORIES)
        assert all(seconds(row, c) >= 0 for c in CATEGORIES)
    # per cluster and day: installed over partitions = node capacity, computed here from the
    # node_state observations with the interval rule (+ allocation of nodes without a state)
    capacity = node_capacity_seconds(day.node_states, poll_seconds=60)
    installed = sum((seconds(r, "installed") for r in rows), Decimal(0))
    unknown = sum((seconds(r, "capacity_unknown") for r in rows), Decimal(0))
    assert capacity == Decimal(604800)
    assert installed == capacity + unknown == Decimal(608400)


def node_capacity_seconds(observations: list[NodeState], *, poll_seconds: int) -> Decimal:
    """Σ gpus_total x validity of each state row, rows as write_node_states makes them."""
    by_node: dict[str, list[NodeState]] = {}
    for o in sorted(observations, key=lambda o: o.observed_at):
        by_node.setdefault(o.node, []).append(o)
    total = Decimal(0)
    for states in by_node.values():
        rows: list[list[NodeState]] = []
        for o in states:
            if rows and (rows[-1][-1].states, rows[-1][-1].gpus_total) == (o.states, o.gpus_total):
                rows[-1].append(o)
            else:
                rows.append([o])
        for i, row in enumerate(rows):
            since = row[0].observed_at
            until = (
                rows[i + 1][0].observed_at
                if i + 1 < len(rows)
                else row[-1].observed_at + timedelta(seconds=poll_seconds)
            )
            total += row[0].gpus_total * Decimal((until - since).total_seconds())
    return total


def test_over_allocated_node_day_is_scaled_to_fit_exactly(engine: Engine, config: Config) -> None:
    # gpu04 only: 1 GPU, DOWN until 18:00, 104 ran 10:00-20:00 on it
    day = admin_day()
    day.node_states = [s for s in day.node_states if s.node == "gpu04"]
    day.attempts = [a for a in day.attempts if a.job_id_raw == 104]
    load_admin_day(engine, config, day)
    (row,) = report(engine)
    assert seconds(row, "installed") == Decimal(86400)
    assert seconds(row, "unavailable") == Decimal(64800)
    assert seconds(row, "unmeasured") == Decimal(21600)  # 36000 scaled by 21600/36000
    assert seconds(row, "unallocated") == 0


def test_proportional_fit_keeps_the_parts_in_proportion_and_exact(engine: Engine, config: Config) -> None:
    # a 1-GPU node up 4 hours that day carries 2 + 4 allocated hours: scaled by 4/6 = 2/3
    day = AdminDay(
        attempts=[
            attempt(job_id_raw=1, nodes=("n1",), alloc_gpus=1, start_at=at("2026-11-01T00:00:00"),
                    end_at=at("2026-11-01T02:00:00"), submit_at=at("2026-11-01T00:00:00")),
            attempt(job_id_raw=2, nodes=("n1",), alloc_gpus=1, start_at=at("2026-11-01T00:00:00"),
                    end_at=at("2026-11-01T04:00:00"), submit_at=at("2026-11-01T00:00:00"), partition="long"),
        ],
        node_states=[
            node_state("n1", "2026-11-01T00:00:00", ("MIXED",), 1),
            node_state("n1", "2026-11-01T03:59:00", ("MIXED",), 1),
        ],
    )  # fmt: skip
    load_admin_day(engine, config, day)
    rows = {r["partition"]: r for r in report(engine)}
    assert seconds(rows["gpu"], "unmeasured") == Decimal(4800)  # 7200 x 2/3
    assert seconds(rows["long"], "unmeasured") == Decimal(9600)  # 14400 x 2/3
    assert seconds(rows["gpu"], "unallocated") == 0
    assert seconds(rows["gpu"], "installed") + seconds(rows["long"], "installed") == Decimal(14400)


def test_thirds_still_add_up_exactly(engine: Engine, config: Config) -> None:
    # 3 allocated hours on 1 available hour: each part is a third, not a finite decimal
    day = AdminDay(
        attempts=[
            attempt(job_id_raw=j, nodes=("n1",), alloc_gpus=1, start_at=at("2026-11-01T00:00:00"),
                    end_at=at("2026-11-01T01:00:00"), submit_at=at("2026-11-01T00:00:00"), partition=p)
            for j, p in ((1, "a"), (2, "b"), (3, "c"))
        ],
        node_states=[
            node_state("n1", "2026-11-01T00:00:00", ("MIXED",), 1),
            node_state("n1", "2026-11-01T00:59:00", ("MIXED",), 1),
        ],
    )  # fmt: skip
    load_admin_day(engine, config, day)
    rows = {r["partition"]: r for r in report(engine)}
    # the node's own partition (gpu) keeps its zero unallocated time
    assert set(rows) == {"a", "b", "c", "gpu"}
    assert sum((seconds(r, "unmeasured") for r in rows.values()), Decimal(0)) == Decimal(3600)
    assert [seconds(rows[p], "unmeasured") for p in "abc"] == [
        Decimal("1200.000000000"),
        Decimal("1200.000000000"),
        Decimal("1200.000000000"),
    ]
    assert all(seconds(r, "unallocated") == 0 for r in rows.values())


def test_days_are_site_days_and_capacity_is_cut_at_midnight(engine: Engine) -> None:
    config = Config()
    # observed 22:00 .. 01:59 UTC = 23:00 .. 02:59 in Berlin: 1 h on Nov 1st, 3 h on Nov 2nd
    day = AdminDay(
        node_states=[
            node_state("n1", "2026-11-01T22:00:00", ("IDLE",), 2),
            node_state("n1", "2026-11-02T01:59:00", ("IDLE",), 2),
        ]
    )
    load_admin_day(engine, config, day)
    utc = {r["day"]: seconds(r, "installed") for r in report(engine, last_day=date(2026, 11, 2))}
    assert utc == {date(2026, 11, 1): Decimal(2 * 7200), date(2026, 11, 2): Decimal(2 * 7200)}
    berlin = {
        r["day"]: seconds(r, "installed")
        for r in report(engine, last_day=date(2026, 11, 2), timezone="Europe/Berlin")
    }
    assert berlin == {date(2026, 11, 1): Decimal(2 * 3600), date(2026, 11, 2): Decimal(2 * 3 * 3600)}


def test_a_gap_in_observations_is_held_by_the_row_before_it(engine: Engine, config: Config) -> None:
    # seen at 00:00, then not until 06:00 in another state: the first row holds until 06:00
    day = AdminDay(
        node_states=[
            node_state("n1", "2026-11-01T00:00:00", ("IDLE",), 1),
            node_state("n1", "2026-11-01T06:00:00", ("DOWN",), 1),
            node_state("n1", "2026-11-01T06:59:00", ("DOWN",), 1),
        ]
    )
    load_admin_day(engine, config, day)
    (row,) = report(engine)
    assert (seconds(row, "unallocated"), seconds(row, "unavailable")) == (Decimal(21600), Decimal(3600))


def test_partition_and_cluster_filters(engine: Engine, config: Config) -> None:
    load_admin_day(engine, config)
    assert [r["partition"] for r in report(engine, job_filter=JobFilter(partitions=("debug",)))] == ["debug"]
    assert report(engine, job_filter=JobFilter(clusters=("other",))) == []
    with pytest.raises(ValueError, match="-A/-u"):
        report(engine, job_filter=JobFilter(accounts=("physics",)))


def test_capacity_is_nobodys_own_data(engine: Engine, config: Config) -> None:
    load_admin_day(engine, config)
    assert report(engine, scope=Scope(users=frozenset({"alice"}))) == []
    assert report(engine, scope=Scope(users=frozenset({"bob"}), accounts=frozenset({"chem"}))) == []
    assert report(engine, scope=Scope()) == []


def test_down_states_cover_scontrol_and_json_spellings() -> None:
    assert {"DOWN", "DRAIN", "DRAINED", "FAIL", "NOT_RESPONDING", "POWERED_DOWN", "POWER_DOWN"} <= set(
        DOWN_STATES
    )
    assert {"MAINT", "MAINTENANCE", "INVAL", "INVALID"} <= set(DOWN_STATES)


def test_a_mig_node_counts_its_physical_gpus(engine: Engine, config: Config) -> None:
    """lcrownover's real Slurm 23.11 nodes: n0161 is `gpu:1g.10gb:21` (MIG slices of three A100
    80 GB, like n0164's `gpu:nvidia_a100_80gb_pcie:3`): installed is 3 GPUs x time, not 21."""
    from slurmtel.parsers.slurmctld import parse_sinfo_json
    from slurmtel.sources.base import RunContext
    from slurmtel.sources.slurmctld import store_controller_view
    from tests.conftest import fixture_path

    raw = fixture_path("slurmctld", "lcrownover_slurm_exporter", "V0040OpenapiNodesResp.json").read_bytes()
    ctx = RunContext(config, engine)
    for hour in (0, 6, 12, 23):
        observed = at(f"2026-11-01T{hour:02d}:00:00")
        records = [
            r
            for r in parse_sinfo_json(raw, cluster="lab", at=observed)
            if getattr(r, "node", "") in ("n0161", "n0164")
        ]
        store_controller_view(ctx, records, cluster="lab", at=observed)
    # one job on one 1g.10gb slice of n0161 from 06:00 to 12:00, busy all along: the node
    # agent sees the MIG instance, 1/7 of its A100 (14 of 98 SMs)
    seen = at("2026-11-01T00:00:00")
    mig_day = AdminDay(
        attempts=[
            attempt(job_id_raw=301, name="slice", user="erin", account="physics", partition="interactivegpu",
                    submit_at=at("2026-11-01T06:00:00"), eligible_at=at("2026-11-01T06:00:00"),
                    start_at=at("2026-11-01T06:00:00"), end_at=at("2026-11-01T12:00:00"),
                    alloc_gpus=1, alloc_tres={"cpu": 1, "gres/gpu": 1, "gres/gpu:1g.10gb": 1},
                    nodes=("n0161",), nodelist="n0161"),
        ],
        inventory=[
            GpuInventory("n0161", "GPU-N0", 0, "NVIDIA A100 80GB PCIe", seen, mig_mode="enabled"),
            GpuInventory("n0161", "MIG-N0-0", 0, "NVIDIA A100 80GB PCIe", seen, mig_mode="enabled",
                         parent_gpu_uuid="GPU-N0", mig_profile="1g.10gb", gpu_fraction=1 / 7),
        ],
        summaries={
            "n0161": windows("MIG-N0-0", at("2026-11-01T06:00:00"), 720, busy=set(range(720)),
                             job="301", node="n0161"),
        },
    )  # fmt: skip
    load_admin_day(engine, config, mig_day)
    rows = {r["partition"]: r for r in report(engine)}
    installed = sum(seconds(r, "installed") for r in rows.values())
    # n0161 and n0164, 3 GPUs each, from 00:00 to 23:00 plus one poll interval (60 s)
    assert installed == 2 * 3 * (23 * HOUR + 60)
    # n0161's time is interactivegpu's (its first partition), n0164's gpu's (drained: unavailable)
    mig, drained = rows["interactivegpu"], rows["gpu"]
    assert seconds(drained, "unavailable") == seconds(drained, "installed") == 3 * (23 * HOUR + 60)
    # allocated in physical GPUs: 6 h x 1/7 of a GPU, not 6 GPU-hours for the one slice (nor
    # anything for the 20 other slices); unallocated is the rest of 3 GPUs' time, not 21 slices'
    allocated = sum(
        (seconds(mig, c) for c in ("allocated_no_process", "allocated_idle", "active", "unmeasured")),
        Decimal(0),
    )
    # (the fraction is stored as a float: within a millisecond)
    assert abs(allocated - 6 * HOUR / 7) < Decimal("0.001")
    assert seconds(mig, "active") == allocated
    assert seconds(mig, "unavailable") == 0
    assert seconds(mig, "unallocated") == 3 * (23 * HOUR + 60) - allocated
    assert seconds(mig, "installed") == 3 * (23 * HOUR + 60)
    assert with_hours(mig)["unallocated_gpu_hours"] == 68.1929  # (3 x 82860 s - 3085.714... s) / 3600
    assert with_hours(mig)["active_gpu_hours"] == 0.8571  # 6/7
