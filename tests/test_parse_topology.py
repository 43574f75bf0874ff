"""`nvidia-smi topo -m` and `nvidia-smi nvlink` captures: every capture, and its variants."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from slurmtel.parsers.nvlink import parse_nvlink
from slurmtel.parsers.topology import parse_topo_matrix, topology_summary
from slurmtel.records import NodeTopology, Rejected
from tests.conftest import fixture_path

TOPO = fixture_path("nvidia_smi_topo")
NVLINK = fixture_path("nvlink")
AT = datetime(2026, 12, 2, 13, 0, tzinfo=UTC)

# per capture: devices, the summary in words, a few links, CPU affinity of the GPUs, NIC names
EXPECTED = {
    "gh_nccl-428_4x_t4_sys_node_spaces_nolegend": (
        ("GPU0", "GPU1", "GPU2", "GPU3"),
        "4 GPUs; pairs: 3 NODE (PCIe host bridges within a NUMA node), 3 SYS (the SMP interconnect between NUMA nodes)",
        {"GPU0-GPU1:SYS", "GPU1-GPU2:NODE", "GPU2-GPU3:NODE"},
        ("0-15,32-47", "16-31,48-63", "16-31,48-63", "16-31,48-63"),
        (),
    ),
    "gh_nccl-tests-37_dgx1_v100_hybrid_cube_mesh_tabs": (
        tuple(f"GPU{i}" for i in range(8)),
        "8 GPUs; pairs: 12 SYS (the SMP interconnect between NUMA nodes), 8 NV1 (1 bonded NVLink), "
        "8 NV2 (2 bonded NVLinks)",
        {"GPU0-GPU1:NV1", "GPU0-GPU3:NV2", "GPU0-GPU4:SYS", "GPU6-GPU7:NV1"},
        ("0-95",) * 8,
        (),
    ),
    "hpe_dl380a_gen11_2x_h100pcie_nvlink_bridge_nv12": (
        ("GPU0", "GPU1"),
        "2 GPUs; every pair NV12 (12 bonded NVLinks)",
        {"GPU0-GPU1:NV12"},
        ("32-63,96-127", "32-63,96-127"),
        (),
    ),
    "llmaction_8x_h800_nv8_4nic_terminal_truncated": (
        (*(f"GPU{i}" for i in range(8)), "NIC0", "NIC1", "NIC2", "NIC3"),
        "8 GPUs; every pair NV8 (8 bonded NVLinks)",
        {"GPU0-GPU1:NV8", "GPU1-NIC0:PIX", "GPU3-NIC1:PIX", "GPU7-NIC3:PIX", "GPU0-NIC2:SYS"},
        # as the author's terminal damaged it
        ("-31,64-95",) * 4 + ("32-63,96-127",) * 3 + ("2-63,96-127",),
        ("mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"),
    ),
    "nvgpuexporter_1x_h100_vm_590.48.01_ansi_underline": (("GPU0",), "1 GPU", set(), ("0-19",), ()),
    "nvgpuexporter_1x_l40s_vm_595.80_ansi_underline": (("GPU0",), "1 GPU", set(), ("0-7",), ()),
    "princeton_della_a100_2gpu_2nic_pcie_sys": (
        ("GPU0", "GPU1", "mlx5_0", "mlx5_1"),
        "2 GPUs; every pair SYS (the SMP interconnect between NUMA nodes)",
        {"GPU0-GPU1:SYS", "GPU0-mlx5_0:NODE", "GPU1-mlx5_1:NODE", "mlx5_0-mlx5_1:SYS"},
        ("0-63", "64-127"),
        ("mlx5_0", "mlx5_1"),
    ),
    "xuesongtap_2x_gtx1080ti_desktop_phb_spaces": (
        ("GPU0", "GPU1"),
        "2 GPUs; every pair PHB (a PCIe host bridge)",
        {"GPU0-GPU1:PHB"},
        ("0-11", "0-11"),
        (),
    ),
    "xuesongtap_4x_a10_pcie_sys_2nic_spaces": (
        ("GPU0", "GPU1", "GPU2", "GPU3", "NIC0", "NIC1"),
        "4 GPUs; every pair SYS (the SMP interconnect between NUMA nodes)",
        {"GPU0-NIC0:SYS", "NIC0-NIC1:PIX"},
        ("0-127",) * 4,
        ("mlx5_0", "mlx5_1"),
    ),
}


def topo(raw: str | bytes, name: str = "n1") -> NodeTopology:
    (record,) = parse_topo_matrix(raw, node=name, observed_at=AT)
    assert isinstance(record, NodeTopology), record
    return record


def test_every_topology_capture_is_expected() -> None:
    assert {p.stem for p in TOPO.glob("*.txt")} == set(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_topology_capture(name: str) -> None:
    devices, summary, some_links, cpu, nics = EXPECTED[name]
    record = topo((TOPO / f"{name}.txt").read_bytes())
    assert record.devices == devices
    assert record.summary == summary
    assert some_links <= set(record.links)
    n = len(devices)
    # the damaged header lost its NIC columns: NIC-NIC pairs are not known (4 NICs: 6 pairs)
    unknown = 6 if name.startswith("llmaction") else 0
    assert len(record.links) == n * (n - 1) // 2 - unknown
    assert record.cpu_affinity == cpu
    assert record.nic_names == nics
    assert (record.node, record.observed_at, record.source) == ("n1", AT, "topo-matrix")


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_tabs_spaces_and_crlf_read_the_same(name: str) -> None:
    raw = (TOPO / f"{name}.txt").read_text()
    plain = topo(raw)
    assert topo(raw.replace("\n", "\r\n")) == plain
    spaced = raw.replace("\t", "    ")
    assert topo(spaced).links == plain.links
    assert topo(spaced).summary == plain.summary


def test_numa_affinity_and_the_ansi_header() -> None:
    record = topo((TOPO / "nvgpuexporter_1x_h100_vm_590.48.01_ansi_underline.txt").read_bytes())
    assert record.numa_affinity == ("0",)
    hpe = topo((TOPO / "hpe_dl380a_gen11_2x_h100pcie_nvlink_bridge_nv12.txt").read_bytes())
    assert hpe.numa_affinity == ("1", "1")


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        ("", "no `nvidia-smi topo -m` header"),
        ("GPU 0: NVIDIA H100 (UUID: GPU-1)\n", "no `nvidia-smi topo -m` header"),
        ("\tGPU0\tGPU1\tCPU Affinity\n", "no matrix rows"),
        ("\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \tFOO\t0-3\n", "unreadable matrix row"),
    ],
)
def test_text_that_is_not_a_matrix_is_rejected(raw: str, reason: str) -> None:
    (record,) = parse_topo_matrix(raw, node="n1", observed_at=AT)
    assert isinstance(record, Rejected) and reason in record.reason


def test_summary_of_unknown_pairs() -> None:
    assert topology_summary(3, ["GPU0-GPU1:NV4"]) == "3 GPUs; pairs: 1 NV4 (4 bonded NVLinks), 2 unknown"
    assert topology_summary(0, []) == "0 GPUs"


# ---------------------------------------------------------------- nvidia-smi nvlink


def nvlink(name: str) -> list:  # type: ignore[type-arg]
    return parse_nvlink((NVLINK / f"{name}.txt").read_bytes())


def test_nvlink_status_both_indent_styles() -> None:
    spaces = nvlink("gpud_8x_a100_sxm4_80gb_nvlink_status")
    assert [g.index for g in spaces] == list(range(8))
    assert spaces[0].uuid == "GPU-5269b708-678a-b1a8-60f0-c90406537486"
    assert {len(g.links) for g in spaces} == {12}
    assert all(link.active and link.speed_gbps == 25.0 for link in spaces[0].links.values())
    tabs = nvlink("nvgpuexporter_1x_h100_590.48.01_nvlink_s_tab_indent")
    assert len(tabs[0].links) == 18 and tabs[0].links[17].speed_gbps == 26.562


def test_nvlink_inactive_links_and_no_nvlink() -> None:
    bridge = nvlink("hpe_dl380a_gen11_2x_h100pcie_nvlink_s_bridge_inactive_links")
    assert sorted(n for n, link in bridge[0].links.items() if not link.active) == [4, 5, 10, 11, 16, 17]
    v100 = nvlink("gh_azhpc-diagnostics-73_v100_nvlink_s_inactive_links_trimmed")
    assert [(g.index, sorted(n for n, x in g.links.items() if not x.active)) for g in v100] == [(3, [3, 5])]
    none_active = nvlink("hpe_dl380_gen11_2x_a100pcie_nvlink_s_all_inactive_nvml")
    assert [(g.supported, g.links) for g in none_active] == [(True, {}), (True, {})]
    (l40s,) = nvlink("nvgpuexporter_1x_l40s_595.80_nvlink_s_unsupported")
    assert l40s.supported is False
    assert nvlink("gpud_a10_nvlink_status_empty") == []


def test_nvlink_remote_ends_and_counters() -> None:
    remote = nvlink("hpe_dl380a_gen11_2x_h100pcie_nvlink_R_remote")
    assert remote[0].links[4].remote_pci_bus_id == "00000000:D5:00.0" and remote[0].links[4].remote_link == 6
    throughput = nvlink("llmaction_h800_nvlink_gt_r_throughput")
    assert throughput[0].links[0].raw_tx_kib == 25305739 and throughput[0].links[0].raw_rx_kib == 25554089
    caps = nvlink("llmaction_h800_nvlink_capabilities")
    assert caps[0].links[0].capabilities["P2P is supported"] is True


@pytest.mark.parametrize("path", sorted(NVLINK.glob("*.txt")), ids=lambda p: Path(p).stem)
def test_every_nvlink_capture_reads(path: Path) -> None:
    gpus = parse_nvlink(path.read_bytes())
    for gpu in gpus:
        assert gpu.name and all(link.link == n for n, link in gpu.links.items())
