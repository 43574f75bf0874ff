"""GPU topology from NVML (the fake built from real topo -m and nvlink captures), worded as the
`nvidia-smi topo -m` parser words the same capture."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from slurmtel.agent.fake_nvml import FakeNvml
from slurmtel.agent.main import Agent
from slurmtel.agent.nvml import NvmlError
from slurmtel.agent.protocol import record_from_dict
from slurmtel.agent.topology import discover_nvlinks, nvml_topology
from slurmtel.config import config_from_dict
from slurmtel.parsers.topology import parse_topo_matrix
from slurmtel.records import NodeTopology
from tests.conftest import fixture_path

TOPO = fixture_path("nvidia_smi_topo")
NVLINK = fixture_path("nvlink")
AT = datetime(2026, 12, 2, 13, 0, tzinfo=UTC)


def from_nvml(fake: FakeNvml) -> tuple[NodeTopology, list[str]]:
    fake.init()
    errors: list[str] = []

    def record(uuid: str, exc: NvmlError) -> None:
        errors.append(f"{uuid}: {exc}")

    gpus = [discover_nvlinks(fake, d.uuid, d, d.index, d.pci_bus_id, record) for d in fake.devices]
    return nvml_topology(fake, "n1", gpus, AT, record), errors


def matrix(name: str) -> NodeTopology:
    (record,) = parse_topo_matrix((TOPO / f"{name}.txt").read_text(), node="n1", observed_at=AT)
    assert isinstance(record, NodeTopology)
    return record


def gpu_links(topology: NodeTopology) -> tuple[str, ...]:
    return tuple(x for x in topology.links if x.count("GPU") == 2)


def test_hpe_h100_pcie_bridge_from_nvlink_status_and_remote() -> None:
    fake = FakeNvml.from_nvlink(
        (NVLINK / "hpe_dl380a_gen11_2x_h100pcie_nvlink_s_bridge_inactive_links.txt").read_text(),
        (NVLINK / "hpe_dl380a_gen11_2x_h100pcie_nvlink_R_remote.txt").read_text(),
    )
    first, second = fake.devices
    # -R names each GPU's far end: the other GPU's bus
    assert (first.pci_bus_id, second.pci_bus_id) == ("00000000:C2:00.0", "00000000:D5:00.0")
    assert sorted(n for n, link in first.nvlinks.items() if link.active) == [
        0,
        1,
        2,
        3,
        6,
        7,
        8,
        9,
        12,
        13,
        14,
        15,
    ]
    topology, errors = from_nvml(fake)
    expected = matrix("hpe_dl380a_gen11_2x_h100pcie_nvlink_bridge_nv12")
    assert gpu_links(topology) == gpu_links(expected) == ("GPU0-GPU1:NV12",)
    assert topology.summary == expected.summary
    assert topology.gpu_uuids == (first.uuid, second.uuid)
    assert topology.source == "nvml" and errors == []


@pytest.mark.parametrize(
    "name",
    [
        "gh_nccl-tests-37_dgx1_v100_hybrid_cube_mesh_tabs",
        "llmaction_8x_h800_nv8_4nic_terminal_truncated",
        "gh_nccl-428_4x_t4_sys_node_spaces_nolegend",
        "xuesongtap_2x_gtx1080ti_desktop_phb_spaces",
        "xuesongtap_4x_a10_pcie_sys_2nic_spaces",
        "princeton_della_a100_2gpu_2nic_pcie_sys",
    ],
)
def test_nvml_words_each_capture_as_topo_m_does(name: str) -> None:
    fake = FakeNvml.from_topology((TOPO / f"{name}.txt").read_text())
    topology, errors = from_nvml(fake)
    expected = matrix(name)
    assert gpu_links(topology) == gpu_links(expected)
    assert topology.summary == expected.summary
    assert errors == []


def test_nvswitch_links_make_every_pair_nvlinked() -> None:
    fake = FakeNvml.from_topology((TOPO / "llmaction_8x_h800_nv8_4nic_terminal_truncated.txt").read_text())
    assert {link.remote_type for d in fake.devices for link in d.nvlinks.values()} == {"switch"}
    topology, _ = from_nvml(fake)
    assert topology.summary == "8 GPUs; every pair NV8 (8 bonded NVLinks)"


def test_p2p_reads_per_ordered_pair() -> None:
    fake = FakeNvml.from_topology((TOPO / "gh_nccl-428_4x_t4_sys_node_spaces_nolegend.txt").read_text())
    fake.p2p_read[(0, 1)] = 5  # not supported one way
    topology, _ = from_nvml(fake)
    assert len(topology.p2p) == 12
    assert "GPU0-GPU1:not_supported" in topology.p2p and "GPU1-GPU0:ok" in topology.p2p


def test_a_gpu_without_nvlink_or_topology_answers() -> None:
    fake = FakeNvml.from_capture(fixture_path("nvidia_smi", "linux-x86_64__nvidia-l40s__595.80.txt"))
    topology, errors = from_nvml(fake)
    assert (topology.devices, topology.links, topology.summary) == (("GPU0",), (), "1 GPU")
    assert errors == []


def test_the_agent_spools_its_topology_and_a_change(tmp_path: Path) -> None:
    config = config_from_dict(
        {
            "agent": {
                "spool_path": str(tmp_path / "spool.sqlite"),
                "port": 0,
                "listen_address": "127.0.0.1",
                "node_name": "gpu01",
                "sysfs_root": str(tmp_path / "sys"),
                "proc_root": str(tmp_path / "proc"),
            }
        }
    )
    fake = FakeNvml.from_nvlink(
        (NVLINK / "hpe_dl380a_gen11_2x_h100pcie_nvlink_s_bridge_inactive_links.txt").read_text(),
        (NVLINK / "hpe_dl380a_gen11_2x_h100pcie_nvlink_R_remote.txt").read_text(),
    )
    agent = Agent(config, fake, clock=lambda: AT.timestamp())
    fake.init()
    agent.rediscover(force=True)
    agent.rediscover()  # unchanged: not spooled again
    assert [i.kind for i in agent.spool.read(0, 100)].count("topology") == 1
    # a bridge comes loose: two links of GPU0 go down
    for n in (0, 1):
        fake.devices[0].nvlinks[n].active = False
    agent.rediscover()
    spooled = [
        record_from_dict("topology", json.loads(i.payload))
        for i in agent.spool.read(0, 100)
        if i.kind == "topology"
    ]
    assert [t.links for t in spooled if isinstance(t, NodeTopology)] == [
        ("GPU0-GPU1:NV12",),
        ("GPU0-GPU1:NV10",),
    ]
    agent.spool.close()
