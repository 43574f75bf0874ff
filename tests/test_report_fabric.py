"""`report fabric` (runs vs baseline, suspects), `report fabric --nodes` (port and NVLink
counters beside failed attempts) and `report nodes --drift`, on the real NCCL logs and
counter windows built from the real sysfs capture."""

from __future__ import annotations

import csv
import io
import json
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import Engine

from slurmtel.access import EVERYTHING, NOTHING, Identity, Role
from slurmtel.cli import main
from slurmtel.parsers.nccl import parse_nccl_tests
from slurmtel.records import GpuInventory, NcclRun, NodeTopology, NvlinkCounters, PortCounters
from slurmtel.store.fabric import (
    NcclLogWrite,
    write_nccl_log,
    write_nvlink_counters,
    write_port_counters,
    write_topology,
)
from slurmtel.store.jobs import sync_outcome_classes, write_attempts
from slurmtel.store.reports_fabric import drift_report, fabric_nodes_report, fabric_report
from slurmtel.store.telemetry import write_inventory, write_node_states
from tests.conftest import fixture_path
from tests.factories import at, attempt, node_state

CASES = fixture_path("nccl_tests", "cases")
GOOD = "cscs_alps_gh200_2node_srun_v2.17.1_cxi_hook"
SLOW = "cscs_alps_gh200_2node_srun_v2.17.1_no_cxi_hook_slow"
CORRUPT = "nris_olivia_gh200_4node_slingshot_corrupted_wrong_nonzero"
RANK_FAILED = "gh_nccl-tests-219_a6000_2node_internal_error_TRUNCATED"
D0 = at("2026-11-01T00:00:00")


def runs_of(name: str) -> list[NcclRun]:
    return [r for r in parse_nccl_tests((CASES / name / "input.txt").read_bytes()) if isinstance(r, NcclRun)]


def store_run(engine: Engine, name: str, hours: float, label: str = "") -> None:
    with engine.begin() as conn:
        write_nccl_log(
            conn,
            NcclLogWrite(
                log_sha256=f"{name}@{hours}",
                origin=name,
                bytes=1,
                runs=runs_of(name),
                job=None,
                label=label,
                run_at=D0 + timedelta(hours=hours),
            ),
        )


@pytest.fixture
def acceptance(engine: Engine) -> Engine:
    """Three ok runs on nid005471+nid005487 (19.79 GB/s), then one at 1.59 GB/s (no CXI hook),
    then another ok one; a corrupted 4-node run; a run whose rank failed on `fengyun`."""
    for hours in (1, 2, 3):
        store_run(engine, GOOD, hours, label="cxi-hook")
    store_run(engine, SLOW, 4, label="no-cxi-hook")
    store_run(engine, GOOD, 5)
    store_run(engine, CORRUPT, 6)
    store_run(engine, RANK_FAILED, 7)
    return engine


def report(engine: Engine, **kwargs: object):  # type: ignore[no-untyped-def]
    values: dict[str, object] = {
        "start": D0,
        "end": D0 + timedelta(days=1),
        "scope": EVERYTHING,
        "baseline_fraction": 0.9,
        "baseline_runs": 10,
    }
    values.update(kwargs)
    with engine.connect() as conn:
        return fabric_report(conn, **values)  # type: ignore[arg-type]


def test_runs_are_compared_with_the_median_of_earlier_ok_runs(acceptance: Engine) -> None:
    runs = report(acceptance).runs
    # per node set and collective, in time order
    assert [(r.nodes, r.status, r.avg_busbw_gbytes_per_second) for r in runs] == [
        ("fengyun,fengyun416", "failed", None),
        ("gpu-1-43,gpu-1-47,gpu-1-49,gpu-1-51", "failed", 5.09875),
        ("nid005471,nid005487", "ok", 19.7866),
        ("nid005471,nid005487", "ok", 19.7866),
        ("nid005471,nid005487", "ok", 19.7866),
        ("nid005471,nid005487", "ok", 1.58767),
        ("nid005471,nid005487", "ok", 19.7866),
    ]
    rank, corrupt, first, second, third, slow, fifth = runs
    assert (second.baseline_runs, second.baseline_busbw_gbytes_per_second) == (1, 19.7866)
    assert (rank.status, rank.nodes, rank.avg_busbw_gbytes_per_second) == (
        "failed",
        "fengyun,fengyun416",
        None,
    )
    assert (first.baseline_busbw_gbytes_per_second, first.baseline_runs, first.below_baseline) == (
        None,
        0,
        False,
    )
    assert (third.baseline_busbw_gbytes_per_second, third.baseline_runs, third.busbw_ratio) == (
        19.7866,
        2,
        1.0,
    )
    # 1.58767 / 19.7866 = 0.0802 < 0.9: flagged, though nccl-tests called it fine
    assert (slow.baseline_busbw_gbytes_per_second, slow.busbw_ratio, slow.below_baseline) == (
        19.7866,
        0.0802,
        True,
    )
    # the slow run is ok, so it is in the next baseline: median of 19.79 x 3 and 1.59 is 19.79
    assert (fifth.baseline_runs, fifth.baseline_busbw_gbytes_per_second, fifth.below_baseline) == (
        4,
        19.7866,
        False,
    )
    assert corrupt.wrong_values == 3935945 and corrupt.baseline_runs == 0
    assert (
        first.nodes == "nid005471,nid005487"
        and first.node_count == 2
        and first.hosts == ("nid005471", "nid005487")
    )
    assert corrupt.nccl_version == "2.29.2"
    assert slow.label == "no-cxi-hook"
    # a baseline of at most baseline_runs runs: the latest one only
    assert report(acceptance, baseline_runs=1).runs[6].baseline_busbw_gbytes_per_second == 1.58767


def test_suspects_are_the_nodes_most_often_in_bad_runs(acceptance: Engine) -> None:
    suspects = report(acceptance).suspects
    assert [(s.node, s.runs, s.bad_runs, s.named_in_failures) for s in suspects] == [
        ("fengyun", 1, 1, 1),
        ("fengyun416", 1, 1, 0),
        ("gpu-1-43", 1, 1, 0),
        ("gpu-1-47", 1, 1, 0),
        ("gpu-1-49", 1, 1, 0),
        ("gpu-1-51", 1, 1, 0),
        ("nid005471", 5, 1, 0),
        ("nid005487", 5, 1, 0),
    ]
    nid = suspects[-1]
    assert (nid.bad_share, nid.below_baseline_runs, nid.failed_runs, nid.last_bad_at) == (
        0.2,
        1,
        0,
        D0 + timedelta(hours=4),
    )


def test_a_scope_short_of_everything_sees_nothing(acceptance: Engine) -> None:
    empty = report(acceptance, scope=NOTHING)
    assert (empty.runs, empty.suspects) == ([], [])


# ---------------------------------------------------------------- through the CLI


@pytest.fixture
def cli(
    acceptance: Engine, database_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
):  # type: ignore[no-untyped-def]
    monkeypatch.setenv("SLURMTEL_DATABASE_URL", database_url)
    monkeypatch.delenv("SLURMTEL_CONFIG", raising=False)
    monkeypatch.setattr("slurmtel.config.DEFAULT_CONFIG_PATH", Path("/nonexistent/slurmtel.toml"))

    def run(*argv: str) -> tuple[int, str, str]:
        capsys.readouterr()
        code = main(["--log-level", "WARNING", *argv])
        out, err = capsys.readouterr()
        return code, out, err

    return run


def test_fabric_json_csv_and_table(cli) -> None:  # type: ignore[no-untyped-def]
    code, out, _ = cli("report", "fabric", "-S", "2026-11-01", "-E", "2026-11-02", "--format", "json")
    assert code == 0
    document = json.loads(out)
    slow = document["runs"][5]
    for key in ("avg_busbw_gbytes_per_second", "wrong_values", "status", "hosts", "nccl_version"):
        assert key in slow
    assert (slow["avg_busbw_gbytes_per_second"], slow["below_baseline"], slow["hosts"]) == (
        1.58767,
        True,
        ["nid005471", "nid005487"],
    )
    assert document["suspects"][0]["node"] == "fengyun"
    code, out, _ = cli("report", "fabric", "-S", "2026-11-01", "-E", "2026-11-02", "--format", "csv")
    header = out.split("\n")[1]
    assert header.startswith("run_at,cluster,job_id,label,collective,ranks")
    code, out, _ = cli("report", "fabric", "-S", "2026-11-01", "-E", "2026-11-02")
    assert code == 0 and "NCCL acceptance runs" in out and "below_baseline" in out


def test_fabric_is_for_admins(cli, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(
        "slurmtel.commands.common.current_identity", lambda config: Identity("alice", Role.USER)
    )
    code, _, err = cli("report", "fabric", "-S", "2026-11-01")
    assert code == 1 and "may not view operations" in err
    monkeypatch.setattr(
        "slurmtel.commands.common.current_identity", lambda config: Identity("fin", Role.FINANCE)
    )
    assert cli("report", "nodes", "--drift")[0] == 1
    assert cli("report", "fabric", "--nodes", "-S", "2026-11-01")[0] == 1
    monkeypatch.setattr(
        "slurmtel.commands.common.current_identity", lambda config: Identity("root", Role.ADMIN)
    )
    assert cli("report", "fabric", "-A", "physics")[0] == 2


# ---------------------------------------------------------------- counters per node and port


def port_window(node: str, device: str, minute: int, **deltas: int) -> PortCounters:
    return PortCounters(
        node=node, device=device, port=1, window_start_at=D0 + timedelta(minutes=minute), window_seconds=60.0,
        link_layer="InfiniBand", state="ACTIVE", phys_state="LinkUp", rate_gbps=400.0, deltas=deltas,
        saturated=("excessive_buffer_overrun_errors",) if minute == 0 else (),
    )  # fmt: skip


def test_fabric_nodes_rates_beside_failed_attempts(engine: Engine) -> None:
    with engine.begin() as conn:
        sync_outcome_classes(
            conn, {"COMPLETED": "completed", "FAILED": "user_failure", "NODE_FAIL": "system_failure"}
        )
        write_attempts(
            conn,
            [
                attempt(job_id_raw=1, state="FAILED", nodes=("gpu01",), start_at=D0, end_at=D0 + timedelta(hours=1)),
                attempt(job_id_raw=2, state="NODE_FAIL", nodes=("gpu01", "gpu02"), start_at=D0, end_at=D0 + timedelta(hours=1)),
                attempt(job_id_raw=3, nodes=("gpu02",), start_at=D0, end_at=D0 + timedelta(hours=1)),
            ],
        )  # fmt: skip
        write_port_counters(
            conn,
            [
                port_window("gpu01", "mlx5_0", 0, symbol_error=5, port_rcv_errors=1, link_downed=1,
                            port_xmit_wait=6000, port_xmit_data=1_000_000, roce_adp_retrans=2),
                port_window("gpu01", "mlx5_0", 1, symbol_error=1, port_xmit_wait=6000, port_xmit_data=1_000_000),
                port_window("gpu02", "mlx5_0", 0, port_xmit_data=500),
            ],
        )  # fmt: skip
        write_nvlink_counters(
            conn,
            [
                NvlinkCounters("gpu01", "GPU-A", D0, 60.0, 10, 12, 2**30, 2**30,
                               {"replay": 3, "recovery": 0, "crc_flit": 1, "crc_data": 0}, {"4:replay": 3, "4:crc_flit": 1}),
                NvlinkCounters("gpu01", "GPU-A", D0 + timedelta(minutes=1), 60.0, 12, 12, 2**30, 2**30,
                               {"replay": 1}, {"4:replay": 1}),
            ],
        )  # fmt: skip
    with engine.connect() as conn:
        nodes = fabric_nodes_report(
            conn, start=D0, end=D0 + timedelta(days=1), now=D0 + timedelta(days=1), scope=EVERYTHING
        )
    first, second = nodes.ports
    assert (first.node, first.errors, first.symbol_errors, first.receive_errors, first.link_downed) == (
        "gpu01",
        8,
        6,
        1,
        1,
    )
    assert (first.windows, first.measured_seconds, first.errors_per_hour) == (2, 120.0, 240.0)
    assert (first.xmit_wait_ticks, first.xmit_wait_ticks_per_second) == (12000, 100.0)
    assert (first.xmit_bytes, first.xmit_bytes_per_second, first.retransmissions) == (
        8_000_000,
        66666.6667,
        2,
    )
    assert first.saturated_counters == ("excessive_buffer_overrun_errors",)
    assert (first.failed_attempts, first.node_fail_attempts) == (2, 1)
    assert (second.node, second.errors, second.failed_attempts, second.xmit_bytes) == ("gpu02", 0, 1, 2000)
    (gpu,) = nodes.nvlinks
    assert (gpu.links_active_min, gpu.links_active_max, gpu.replay_errors, gpu.crc_errors) == (10, 12, 4, 1)
    assert gpu.error_links == ("4:crc_flit=1", "4:replay=4")
    assert (gpu.tx_bytes, gpu.errors_per_hour, gpu.failed_attempts) == (2**31, 150.0, 2)
    with engine.connect() as conn:
        only = fabric_nodes_report(
            conn, start=D0, end=D0 + timedelta(days=1), now=D0, scope=EVERYTHING, nodes=("gpu02",)
        )
    assert [p.node for p in only.ports] == ["gpu02"] and only.nvlinks == []


# ---------------------------------------------------------------- drift


def gpus(node: str, seen: str, driver: str, *, cuda: str = "12.4", memory: int = 80 * 2**30, count: int = 2,
         model: str = "NVIDIA H100 80GB HBM3", vbios: str = "96.00.74.00.01") -> list[GpuInventory]:  # fmt: skip
    return [
        GpuInventory(node, f"GPU-{node}-{i}", i, model, at(seen), memory_total_bytes=memory,
                     driver_version=driver, cuda_version=cuda, vbios_version=vbios)
        for i in range(count)
    ]  # fmt: skip


def topology(node: str, seen: str, links: tuple[str, ...]) -> NodeTopology:
    from slurmtel.parsers.topology import topology_summary

    return NodeTopology(node, at(seen), "nvml", ("GPU0", "GPU1"), links, topology_summary(2, links))


def test_drift_names_the_nodes_that_differ_from_their_partition_since_when(engine: Engine) -> None:
    with engine.begin() as conn:
        write_node_states(
            conn,
            [
                node_state("gpu01", "2026-11-03T00:00:00", ("IDLE",), 2),
                node_state("gpu02", "2026-11-03T00:00:00", ("IDLE",), 2),
                node_state("gpu03", "2026-11-03T00:00:00", ("IDLE",), 2, partitions=("gpu", "debug")),
                node_state("gpu04", "2026-11-03T00:00:00", ("IDLE",), 2, partitions=("debug",)),
            ],
        )
        for node in ("gpu01", "gpu02", "gpu03"):
            write_inventory(conn, gpus(node, "2026-11-01T00:00:00", "550.54.15"), source="agent")
        # gpu03 was upgraded on the 2nd, and lost a GPU's worth of memory reporting on the 3rd
        write_inventory(conn, gpus("gpu03", "2026-11-02T06:00:00", "560.35.03", cuda="12.6"), source="agent")
        write_inventory(conn, gpus("gpu01", "2026-11-03T00:00:00", "550.54.15"), source="agent")
        write_inventory(conn, gpus("gpu02", "2026-11-03T00:00:00", "550.54.15"), source="agent")
        write_inventory(conn, gpus("gpu04", "2026-11-03T00:00:00", "550.54.15", count=1), source="agent")
        write_topology(
            conn,
            [
                topology("gpu01", "2026-11-01T00:00:00", ("GPU0-GPU1:NV12",)),
                topology("gpu02", "2026-11-01T00:00:00", ("GPU0-GPU1:NV12",)),
                topology("gpu02", "2026-11-02T12:00:00", ("GPU0-GPU1:SYS",)),
                topology("gpu03", "2026-11-01T00:00:00", ("GPU0-GPU1:NV12",)),
            ],
        )
    with engine.connect() as conn:
        rows = drift_report(conn, scope=EVERYTHING)
    assert [(r.partition, r.node, r.attribute, r.value, r.majority_value, r.majority_nodes, r.partition_nodes, r.since_at)
            for r in rows] == [
        # debug has two nodes, unlike in three ways: split, no majority, both listed
        ("debug", "gpu03", "driver_version", "560.35.03", "", 1, 2, at("2026-11-02T06:00:00")),
        ("debug", "gpu03", "cuda_version", "12.6", "", 1, 2, at("2026-11-02T06:00:00")),
        ("debug", "gpu03", "gpus", "2", "", 1, 2, at("2026-11-01T00:00:00")),
        ("debug", "gpu04", "driver_version", "550.54.15", "", 1, 2, at("2026-11-03T00:00:00")),
        ("debug", "gpu04", "cuda_version", "12.4", "", 1, 2, at("2026-11-03T00:00:00")),
        ("debug", "gpu04", "gpus", "1", "", 1, 2, at("2026-11-03T00:00:00")),
        ("gpu", "gpu02", "topology", "2 GPUs; every pair SYS (the SMP interconnect between NUMA nodes)",
         "2 GPUs; every pair NV12 (12 bonded NVLinks)", 2, 3, at("2026-11-02T12:00:00")),
        ("gpu", "gpu03", "driver_version", "560.35.03", "550.54.15", 2, 3, at("2026-11-02T06:00:00")),
        ("gpu", "gpu03", "cuda_version", "12.6", "12.4", 2, 3, at("2026-11-02T06:00:00")),
    ]  # fmt: skip
    with engine.connect() as conn:
        assert drift_report(conn, scope=NOTHING) == []
        from slurmtel.store.usage import JobFilter

        only_gpu = drift_report(conn, scope=EVERYTHING, job_filter=JobFilter(partitions=("gpu",)))
    assert {r.partition for r in only_gpu} == {"gpu"}


def test_drift_through_the_cli(cli, acceptance: Engine) -> None:  # type: ignore[no-untyped-def]
    with acceptance.begin() as conn:
        write_node_states(conn, [node_state(n, "2026-11-03T00:00:00", ("IDLE",), 2) for n in ("a", "b", "c")])
        for node, driver in (("a", "550"), ("b", "550"), ("c", "535")):
            write_inventory(conn, gpus(node, "2026-11-02T00:00:00", driver), source="agent")
    code, out, _ = cli("report", "nodes", "--drift", "--format", "csv")
    assert code == 0
    rows = list(csv.DictReader(io.StringIO(out.split("\n", 1)[1])))
    assert [(r["node"], r["attribute"], r["value"], r["majority_value"]) for r in rows] == [
        ("c", "driver_version", "535", "550")
    ]


def test_maintenance_forgets_counter_windows_past_the_retention(ctx) -> None:  # type: ignore[no-untyped-def]
    from dataclasses import replace

    from slurmtel.config import config_from_dict
    from slurmtel.metrics import DaemonMetrics
    from slurmtel.scheduler import Schedule

    c = replace(
        ctx,
        config=config_from_dict({"telemetry": {"retention_days": 30}}),
        clock=lambda: at("2026-12-02T14:00:00"),
    )
    old, recent = D0 - timedelta(days=10), at("2026-11-20T00:00:00")
    with c.engine.begin() as conn:
        write_port_counters(conn, [port_window("gpu01", "mlx5_0", 0), port_window("gpu01", "mlx5_1", 0)])
        write_port_counters(
            conn,
            [PortCounters("gpu01", "mlx5_0", 1, old, 30.0), PortCounters("gpu01", "mlx5_0", 1, recent, 30.0)],
        )
        write_nvlink_counters(
            conn,
            [
                NvlinkCounters("gpu01", "GPU-A", old, 30.0, 1, 1),
                NvlinkCounters("gpu01", "GPU-A", recent, 30.0, 1, 1),
            ],
        )
    Schedule(c, DaemonMetrics([])).run_job("maintenance")
    with c.engine.connect() as conn:
        from sqlalchemy import text

        # the cutoff is 2026-11-02 (30 days before): D0's windows go too
        assert conn.execute(text("SELECT window_start_at FROM fabric_port_window")).scalars().all() == [
            recent
        ]
        assert conn.execute(text("SELECT window_start_at FROM nvlink_window")).scalars().all() == [recent]
