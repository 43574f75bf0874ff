"""Fabric counters on the agent: InfiniBand/RoCE from sysfs trees built from the real captures,
NVLink through the fake NVML built from real nvlink captures; per-window increases with
counter widths, saturation, wraps and resets; the agent spools them with their baseline."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from slurmtel.agent.fabric import FabricWindows, counter_increase, read_infiniband, read_nvlinks
from slurmtel.agent.fake_nvml import FakeDevice, FakeNvml
from slurmtel.agent.main import Agent
from slurmtel.agent.protocol import record_from_dict
from slurmtel.config import Config, config_from_dict
from slurmtel.records import NvlinkCounters, PortCounters
from tests.conftest import fixture_path
from tests.sysfs_trees import NODE_EXPORTER_TTAR, PROCFS_TTAR, counter, gpud_sysfs, set_counter, untar

NVLINK = fixture_path("nvlink")
T0 = datetime(2026, 12, 2, 13, 0, 0, tzinfo=UTC).timestamp()


# ---------------------------------------------------------------- counter arithmetic


@pytest.mark.parametrize(
    ("name", "previous", "current", "expected"),
    [
        ("port_xmit_data", 100, 250, (150, False, False)),
        # 16-bit symbol errors saturate at 65535: the increase is a floor
        ("symbol_error", 65000, 65535, (535, False, True)),
        ("symbol_error", 65535, 65535, (0, False, True)),
        # 8-bit link_downed pinned at 255 (mlx5_1 in the gpud capture)
        ("link_downed", 255, 255, (0, False, True)),
        # cleared (perfquery -R, driver reload): counts from zero
        ("link_downed", 255, 2, (2, True, False)),
        ("port_rcv_errors", 14, 0, (0, True, False)),
        # a 32-bit data counter (no extended counters) saturated
        ("port_xmit_data", 4294967000, 4294967295, (295, False, True)),
        # a 32-bit hw counter wrapped
        ("out_of_buffer", 2**32 - 10, 5, (15, False, False)),
        # a 64-bit one wrapped
        ("port_rcv_data", 2**64 - 100, 50, (150, False, False)),
        # lower and far from the top of any width: a reset
        ("roce_adp_retrans", 3000, 3, (3, True, False)),
        ("port_xmit_data", 230442669431839, 1000, (1000, True, False)),
    ],
)
def test_counter_increase(name: str, previous: int, current: int, expected: tuple[int, bool, bool]) -> None:
    got = counter_increase(name, previous, current)
    assert (got.value, got.reset, got.saturated) == expected


# ---------------------------------------------------------------- sysfs trees from the captures


def test_reads_every_port_of_the_gpud_h100_tree(tmp_path: Path) -> None:
    ports = read_infiniband(gpud_sysfs(tmp_path))
    assert [(p.device, p.port) for p in ports] == [
        ("mlx5_0", 1), ("mlx5_1", 1), ("mlx5_4", 1), ("mlx5_5", 1), ("mlx5_6", 1),
        ("mlx5_7", 1), ("mlx5_8", 1), ("mlx5_9", 1), ("mlx5_bond_0", 1),
    ]  # fmt: skip
    first = ports[0]
    assert (first.link_layer, first.state, first.phys_state, first.rate_gbps) == (
        "InfiniBand",
        "ACTIVE",
        "LinkUp",
        400.0,
    )
    assert first.counters["port_xmit_data"] == 230442669431839
    assert first.counters["port_xmit_wait"] == 2489603687
    assert first.counters["roce_adp_retrans"] == 3  # hw_counters
    assert "lifespan" not in first.counters  # a setting, not a counter
    assert ports[1].counters["link_downed"] == 255
    bond = ports[-1]
    assert (bond.link_layer, bond.rate_gbps) == ("Ethernet", 200.0)


def test_reads_the_node_exporter_tree_na_counters_and_counters_ext(tmp_path: Path) -> None:
    ports = {(p.device, p.port): p for p in read_infiniband(untar(NODE_EXPORTER_TTAR, tmp_path, "sys/"))}
    # Intel iWARP without a PMA: every counter "N/A (no PMA)"
    assert ports[("i40iw0", 1)].counters == {}
    mlx4 = ports[("mlx4_0", 1)]
    # the 64-bit counters_ext values win over the 32-bit counters/ ones
    assert mlx4.counters["port_xmit_data"] == 3733440
    assert mlx4.counters["port_rcv_packets"] == 0
    assert mlx4.counters["port_xmit_wait"] == 4294967295
    assert mlx4.rate_gbps == 40.0


def test_reads_the_procfs_tree(tmp_path: Path) -> None:
    ports = {(p.device, p.port): p for p in read_infiniband(untar(PROCFS_TTAR, tmp_path, "fixtures/sys/"))}
    assert set(ports) == {("hfi1_0", 1), ("mlx4_0", 1), ("mlx4_0", 2), ("mlx5_0", 1)}
    assert ports[("mlx5_0", 1)].counters["req_cqe_error"] > 0


def test_no_infiniband_at_all_is_no_ports(tmp_path: Path) -> None:
    assert read_infiniband(tmp_path) == []


def test_window_increases_between_two_reads(tmp_path: Path) -> None:
    root = gpud_sysfs(tmp_path)
    windows = FabricWindows("gpu01", 30.0)
    assert windows.port_windows(read_infiniband(root), T0 + 1) == []  # a baseline, no window yet
    base = counter(root, "mlx5_0", 1, "port_xmit_data")
    set_counter(root, "mlx5_0", 1, "port_xmit_data", base + 250_000_000)
    set_counter(root, "mlx5_0", 1, "symbol_error", 7)
    set_counter(root, "mlx5_0", 1, "port_xmit_wait", counter(root, "mlx5_0", 1, "port_xmit_wait") + 1000)
    set_counter(root, "mlx5_1", 1, "link_downed", 1)  # was 255: cleared
    set_counter(root, "mlx5_4", 1, "symbol_error", 65535)  # was 0: saturated
    set_counter(root, "mlx5_5", 1, "out_of_buffer", 12, group="hw_counters")
    records = {r.device: r for r in windows.port_windows(read_infiniband(root), T0 + 31)}
    assert len(records) == 9
    first = records["mlx5_0"]
    assert isinstance(first, PortCounters)
    assert (first.window_start_at, first.window_seconds) == (datetime.fromtimestamp(T0, UTC), 30.0)
    assert first.deltas["port_xmit_data"] == 250_000_000
    assert first.deltas["symbol_error"] == 7 and first.deltas["port_xmit_wait"] == 1000
    assert first.deltas["port_rcv_errors"] == 0
    # the capture's excessive_buffer_overrun_errors is 15: that 4-bit counter is pinned
    assert first.resets == () and first.saturated == ("excessive_buffer_overrun_errors",)
    assert records["mlx5_1"].deltas["link_downed"] == 1 and records["mlx5_1"].resets == ("link_downed",)
    assert records["mlx5_4"].saturated == ("excessive_buffer_overrun_errors", "symbol_error")
    assert records["mlx5_5"].deltas["out_of_buffer"] == 12


def test_a_gap_longer_than_an_hour_is_not_one_window(tmp_path: Path) -> None:
    root = gpud_sysfs(tmp_path)
    windows = FabricWindows("gpu01", 30.0)
    windows.port_windows(read_infiniband(root), T0)
    assert windows.port_windows(read_infiniband(root), T0 + 7200) == []
    assert len(windows.port_windows(read_infiniband(root), T0 + 7230)) == 9


def test_state_round_trip_keeps_the_baseline(tmp_path: Path) -> None:
    root = gpud_sysfs(tmp_path)
    before = FabricWindows("gpu01", 30.0)
    before.port_windows(read_infiniband(root), T0)
    after = FabricWindows("gpu01", 30.0)
    after.restore_state(before.export_state())
    set_counter(root, "mlx5_0", 1, "symbol_error", 3)
    (record, *_) = after.port_windows(read_infiniband(root), T0 + 60)
    assert record.deltas["symbol_error"] == 3 and record.window_seconds == 60.0
    broken = FabricWindows("gpu01", 30.0)
    broken.restore_state({"ports": {"x": {"at": "never"}}})
    assert broken.ports == {}


# ---------------------------------------------------------------- NVLink through the fake NVML


def h800_gpu0() -> FakeNvml:
    """GPU 0 of the llmaction H800 node: its nvlink status, and its data counters idle, then
    during LLaMA-13B training (two reads of the same GPU in the capture)."""
    status = (NVLINK / "llmaction_h800_nvlink_status_8gpu_trimmed.txt").read_text()
    reads = (NVLINK / "llmaction_h800_nvlink_gt_d_r_gpu0_idle_vs_training.txt").read_text()
    idle_text, training_text = reads.split("# 模型训练时")
    fake = FakeNvml(
        [FakeDevice("GPU-34bf77d1-c686-6821-79a8-32d326c5039c", "NVIDIA H800", 0)], clock=lambda: 0.0
    )
    fake.init()
    fake.load_nvlink(status)
    from slurmtel.parsers.nvlink import parse_nvlink

    (idle,) = parse_nvlink(idle_text)
    training = parse_nvlink(training_text)[0]
    for n in range(8):
        i, t = idle.links[n], training.links[n]
        fake.set_nvlink_throughput(
            idle.uuid,
            n,
            lambda now, i=i, t=t: (i.data_tx_kib, i.data_rx_kib) if now < T0 + 15 else (t.data_tx_kib, t.data_rx_kib),
        )  # fmt: skip
    return fake


def test_nvlink_windows_from_the_h800_idle_and_training_reads() -> None:
    fake = h800_gpu0()
    device = fake.devices[0]
    gpus = [(device.uuid, device, sorted(device.nvlinks), len(device.nvlinks))]
    errors: list[str] = []
    windows = FabricWindows("h800", 30.0)
    fake.clock = lambda: T0
    assert windows.nvlink_windows(read_nvlinks(fake, gpus, lambda u, e: errors.append(str(e))), T0) == []
    fake.clock = lambda: T0 + 30
    (record,) = windows.nvlink_windows(read_nvlinks(fake, gpus, lambda u, e: errors.append(str(e))), T0 + 30)
    assert isinstance(record, NvlinkCounters)
    assert (record.links_active, record.links_total) == (8, 8)
    # Σ over the 8 links of (training - idle) KiB, in bytes
    assert record.tx_bytes == 1024 * (
        (1390774681 - 5863784) + (1390715554 - 5864084) + (1390689916 - 5864630) + (1390772616 - 5863784)
        + (1391305436 - 5861984) + (1391288579 - 5861984) + (1391348992 - 5861984) + (1391348007 - 5861984)
    )  # fmt: skip
    assert record.errors == {"replay": 0, "recovery": 0, "crc_flit": 0, "crc_data": 0}
    assert record.link_errors == {} and errors == []


def test_nvlink_errors_that_grow_are_named_by_link() -> None:
    fake = h800_gpu0()
    device = fake.devices[0]
    counts = {"replay": 0, "recovery": 0, "crc_flit": 0, "crc_data": 0}
    fake.set_nvlink_errors(device.uuid, 3, lambda t: dict(counts))
    gpus = [(device.uuid, device, sorted(device.nvlinks), len(device.nvlinks))]
    windows = FabricWindows("h800", 30.0)
    windows.nvlink_windows(read_nvlinks(fake, gpus, lambda u, e: None), T0)
    counts.update(replay=4, crc_flit=2)
    (record,) = windows.nvlink_windows(read_nvlinks(fake, gpus, lambda u, e: None), T0 + 30)
    assert record.errors == {"replay": 4, "recovery": 0, "crc_flit": 2, "crc_data": 0}
    assert record.link_errors == {"3:replay": 4, "3:crc_flit": 2}


# ---------------------------------------------------------------- the agent: read once a window, spool with the baseline


def agent_config(tmp_path: Path, sysfs: Path) -> Config:
    return config_from_dict(
        {
            "agent": {
                "spool_path": str(tmp_path / "spool.sqlite"),
                "port": 0,
                "listen_address": "127.0.0.1",
                "node_name": "gpu01",
                "sysfs_root": str(sysfs),
                "proc_root": str(tmp_path / "proc"),
            }
        }
    )


def fake_hpe() -> FakeNvml:
    """The HPE DL380a's two H100 PCIe joined by NVLink bridges (its nvlink -s and -R captures)."""
    return FakeNvml.from_nvlink(
        (NVLINK / "hpe_dl380a_gen11_2x_h100pcie_nvlink_s_bridge_inactive_links.txt").read_text(),
        (NVLINK / "hpe_dl380a_gen11_2x_h100pcie_nvlink_R_remote.txt").read_text(),
    )


def spooled(agent: Agent, kind: str) -> list[object]:
    return [
        record_from_dict(kind, json.loads(i.payload)) for i in agent.spool.read(0, 10000) if i.kind == kind
    ]


def test_agent_spools_windows_with_their_baseline_and_resumes_after_a_restart(tmp_path: Path) -> None:
    sysfs = gpud_sysfs(tmp_path / "sys")
    config = agent_config(tmp_path, sysfs)
    now = [T0 + 1]
    agent = Agent(config, fake_hpe(), clock=lambda: now[0])
    agent.start()
    agent.read_fabric(now[0])
    assert spooled(agent, "port_counters") == [] and spooled(agent, "nvlink_counters") == []
    set_counter(sysfs, "mlx5_0", 1, "symbol_error", 5)
    now[0] = T0 + 31
    agent.read_fabric(now[0])
    agent.read_fabric(now[0] + 1)  # the same window: nothing more
    assert len(spooled(agent, "port_counters")) == 9
    # both GPUs' 12 active bridge links: error counters read (the capture shows no throughput)
    nvlinks = spooled(agent, "nvlink_counters")
    assert [(r.links_active, r.links_total, r.tx_bytes) for r in nvlinks] == [(12, 18, None), (12, 18, None)]  # type: ignore[attr-defined]
    assert len(spooled(agent, "topology")) == 1
    agent.close()
    # a new process (after a clean stop or kill -9 alike): the baseline comes from the spool
    set_counter(sysfs, "mlx5_0", 1, "symbol_error", 9)
    later = Agent(config, fake_hpe(), clock=lambda: T0 + 95)
    later.start()
    later.read_fabric(T0 + 95)
    ports = [
        r for r in spooled(later, "port_counters") if isinstance(r, PortCounters) and r.device == "mlx5_0"
    ]
    assert [(p.window_start_at, p.window_seconds, p.deltas["symbol_error"]) for p in ports] == [
        (datetime.fromtimestamp(T0, UTC), 30.0, 5),
        (datetime.fromtimestamp(T0 + 30, UTC), 64.0, 4),
    ]
    later.close()


def test_nvlink_counters_of_a_gpu_without_nvlink_are_not_read() -> None:
    fake = FakeNvml.from_capture(fixture_path("nvidia_smi", "linux-x86_64__nvidia-l40s__595.80.txt"))
    fake.init()
    fake.load_nvlink((NVLINK / "nvgpuexporter_1x_l40s_595.80_nvlink_s_unsupported.txt").read_text())
    device = fake.devices[0]
    assert device.nvlinks == {}
    assert read_nvlinks(fake, [], lambda u, e: None) == []


def test_agent_spools_node_fs_windows_from_mountstats(tmp_path: Path) -> None:
    """prometheus/procfs' real /proc/PID/mountstats (one NFSv4 mount among local ones) read once
    a window: the first reading is the baseline, the next the increase (the test's copy with
    100 MB more read), across a restart; a remount (counters lower) counts from zero."""
    capture = fixture_path("mountstats", "procfs_proc_26231_mountstats").read_text()
    mountstats = tmp_path / "mountstats"
    mountstats.write_text(capture)
    config = config_from_dict(
        {
            "agent": {
                "spool_path": str(tmp_path / "spool.sqlite"), "port": 0, "listen_address": "127.0.0.1",
                "node_name": "gpu01", "sysfs_root": str(tmp_path / "nosys"), "proc_root": str(tmp_path / "proc"),
                "mountstats_path": str(mountstats),
            }
        }
    )  # fmt: skip
    agent = Agent(config, fake_hpe(), clock=lambda: T0 + 1)
    agent.start()
    agent.read_fabric(T0 + 1)
    assert spooled(agent, "node_fs") == []
    mountstats.write_text(capture.replace("bytes:\t1207640230 0 0 0", "bytes:\t1307640230 0 0 0"))
    agent.read_fabric(T0 + 31)
    (window,) = spooled(agent, "node_fs")
    assert (window.node, window.filesystem, window.fstype, window.device) == (
        "gpu01",
        "/mnt/nfs/test",
        "nfs4",
        "192.168.1.1:/srv/test",
    )  # type: ignore[attr-defined]
    assert (window.window_start_at, window.window_seconds) == (datetime.fromtimestamp(T0, UTC), 30.0)  # type: ignore[attr-defined]
    assert (window.read_bytes, window.write_bytes, window.read_ops) == (100_000_000, 0, 0)  # type: ignore[attr-defined]
    agent.close()
    # restarted: the baseline comes from the spool; remounted meanwhile (1 kB read since)
    mountstats.write_text(capture.replace("bytes:\t1207640230 0 0 0", "bytes:\t1000 0 0 0"))
    later = Agent(config, fake_hpe(), clock=lambda: T0 + 61)
    later.start()
    later.read_fabric(T0 + 61)
    windows = spooled(later, "node_fs")
    assert [w.read_bytes for w in windows] == [100_000_000, 1000]  # type: ignore[attr-defined]
    later.close()


def test_agent_spools_gpfs_windows_from_mmpmon(tmp_path: Path) -> None:
    """agent.mmpmon_command printing the real fs_io_s answer (treydock/gpfs_exporter's, OSC's
    Pitzer), then the test's copy with 3 GB more read from scratch: one window per file system;
    the node's NFS mounts in the same spool (procfs' real mountstats)."""
    capture = fixture_path("mmpmon", "gpfs_exporter_mmpmon_fs_io_s.txt").read_text()
    answer = tmp_path / "fs_io_s"
    answer.write_text(capture)
    mountstats = tmp_path / "mountstats"
    mountstats.write_text(fixture_path("mountstats", "procfs_proc_26231_mountstats").read_text())
    config = config_from_dict(
        {
            "agent": {
                "spool_path": str(tmp_path / "spool.sqlite"), "port": 0, "listen_address": "127.0.0.1",
                "node_name": "gpu01", "sysfs_root": str(tmp_path / "nosys"), "proc_root": str(tmp_path / "proc"),
                "mountstats_path": str(mountstats), "mmpmon_command": ["cat", str(answer)],
            }
        }
    )  # fmt: skip
    agent = Agent(config, fake_hpe(), clock=lambda: T0 + 1)
    agent.start()
    agent.read_fabric(T0 + 1)
    answer.write_text(capture.replace("_br_ 205607400434", f"_br_ {205607400434 + 3 * 10**9}"))
    agent.read_fabric(T0 + 31)
    windows = sorted(spooled(agent, "node_fs"), key=lambda w: w.filesystem)  # type: ignore[attr-defined]
    assert [(w.fstype, w.filesystem, w.device, w.read_bytes, w.write_bytes) for w in windows] == [  # type: ignore[attr-defined]
        ("nfs4", "/mnt/nfs/test", "192.168.1.1:/srv/test", 0, 0),
        ("gpfs", "project", "gpfs.domain", 0, 0),
        ("gpfs", "scratch", "gpfs.domain", 3 * 10**9, 0),
    ]
    agent.close()
