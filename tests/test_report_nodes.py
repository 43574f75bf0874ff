"""`report nodes` on tests.factories.admin_day (window: 2026-11-01, UTC).

gpu01 ran 101, 102 (failed) and 103's retry, logged XID 79 twice and 48 once that day (13 the
day before); gpu02 ran 102 and 103's NODE_FAIL attempt and is down now; gpu04 ran 104
(NODE_FAIL) and logged a double-bit ECC error; gpu05 runs driver 535 / CUDA 12.2 where gpu01 and
gpu03 run 550 / 12.4.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine

from slurmtel.access import EVERYTHING, Scope
from slurmtel.config import Config
from slurmtel.store.reports_nodes import nodes_report
from slurmtel.store.usage import JobFilter
from tests.factories import at, load_admin_day, with_hours

START, END, NOW = at("2026-11-01T00:00:00"), at("2026-11-02T00:00:00"), at("2026-12-02T14:00:00")


def report(engine: Engine, scope: Scope = EVERYTHING, **kwargs) -> list[dict[str, Any]]:
    kwargs.setdefault("start", START)
    with engine.connect() as conn:
        return with_hours(nodes_report(conn, end=END, now=NOW, scope=scope, **kwargs))


def test_nodes_failures_events_and_drift(engine: Engine, config: Config) -> None:
    load_admin_day(engine, config)
    rows = report(engine)
    assert [r["node"] for r in rows] == ["gpu02", "gpu01", "gpu04", "gpu03", "gpu05", "gpu06"]
    by_node = {r["node"]: r for r in rows}
    assert by_node["gpu01"] == {
        "cluster": "lab",
        "node": "gpu01",
        "state": "MIXED",
        "reason": None,
        "partitions": ["gpu"],
        "attempts": 3,
        "failed_attempts": 1,
        "node_fail_attempts": 0,
        "failed_gpu_seconds": 4 * 3600,
        "failed_gpu_hours": 4.0,
        "allocated_gpu_seconds": 7 * 3600,
        "allocated_gpu_hours": 7.0,
        "xid_events": 3,
        "xid_codes": "79:2 48:1",
        "ecc_single_bit_errors": 0,
        "ecc_double_bit_errors": 0,
        "gpu_model": "NVIDIA H100",
        "gpus": 2,
        "driver_version": "550.54.15",
        "cuda_version": "12.4",
        "driver_drift": False,
        "cuda_drift": False,
    }
    fields = (
        "state",
        "attempts",
        "failed_attempts",
        "node_fail_attempts",
        "failed_gpu_hours",
        "ecc_double_bit_errors",
        "gpus",
    )
    assert {n: tuple(by_node[n][f] for f in fields) for n in ("gpu02", "gpu03", "gpu04", "gpu06")} == {
        "gpu02": ("DOWN+NOT_RESPONDING", 2, 2, 1, 6.0, 0, 2),
        "gpu03": ("IDLE+DRAIN", 0, 0, 0, 0.0, 0, 1),
        "gpu04": ("IDLE", 1, 1, 1, 10.0, 1, 1),
        "gpu06": (None, 1, 0, 0, 0.0, 0, None),
    }
    assert by_node["gpu02"]["partitions"] == ["debug", "gpu"]
    # MIG instances are not GPUs of their own; the drifted node stands out
    assert {
        n: (r["gpus"], r["driver_drift"], r["cuda_drift"]) for n, r in by_node.items() if r["driver_version"]
    } == {
        "gpu01": (2, False, False),
        "gpu03": (1, False, False),
        "gpu05": (1, True, True),
    }


def test_events_outside_the_window_do_not_count(engine: Engine, config: Config) -> None:
    load_admin_day(engine, config)
    rows = {r["node"]: r for r in report(engine, start=at("2026-10-30T00:00:00"))}
    assert (rows["gpu01"]["xid_events"], rows["gpu01"]["xid_codes"]) == (4, "79:2 13:1 48:1")


def test_partition_and_cluster_filters(engine: Engine, config: Config) -> None:
    load_admin_day(engine, config)
    assert [r["node"] for r in report(engine, job_filter=JobFilter(partitions=("debug",)))] == ["gpu02"]
    assert report(engine, job_filter=JobFilter(clusters=("other",))) == []


def test_nodes_are_cluster_wide(engine: Engine, config: Config) -> None:
    load_admin_day(engine, config)
    assert report(engine, scope=Scope(users=frozenset({"alice"}))) == []
    assert report(engine, scope=Scope(accounts=frozenset({"physics"}))) == []
    assert report(engine, scope=Scope()) == []
