"""Inventory the agent reports, through the NVML seam, for fakes built from real captures.

Expected values read by hand from tests/fixtures/nvidia_smi (see PROVENANCE.md).
"""

from __future__ import annotations

from datetime import UTC, datetime

from slurmtel.agent.fake_nvml import FakeNvml
from slurmtel.agent.sampler import Sampler
from slurmtel.parsers.nvidia_smi import MIB
from slurmtel.records import GpuInventory
from tests.conftest import fixture_path

NOW = 1_800_000_000.0
AT = datetime.fromtimestamp(NOW, UTC)
ZERO = "GPU-00000000-0000-0000-0000-000000000000"


def inventory(name: str) -> list[GpuInventory]:
    fake = FakeNvml.from_capture(fixture_path("nvidia_smi", name), clock=lambda: NOW)
    fake.init()
    return Sampler(fake, "gpu01", clock=lambda: NOW).discover()


def test_h100() -> None:
    assert inventory("linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01.txt") == [
        GpuInventory(
            node="gpu01",
            gpu_uuid=ZERO,
            index=0,
            model="NVIDIA H100 80GB HBM3",
            observed_at=AT,
            memory_total_bytes=81559 * MIB,
            minor_number=0,
            pci_bus_id="00000000:00:09.0",
            driver_version="590.48.01",
            cuda_version="13.1",
            vbios_version="96.00.A5.00.01",
            mig_mode="disabled",
            # GPU Power Readings: Current Power Limit (the enforced cap; nvmlDeviceGetEnforcedPowerLimit)
            power_limit_watts=700.0,
        )
    ]


def test_h200_from_the_extracted_query() -> None:
    (gpu,) = inventory("linux-x86_64__nvidia-h200__590.48.01__load__q.txt")
    assert gpu == GpuInventory(
        node="gpu01",
        gpu_uuid=ZERO,
        index=0,
        model="NVIDIA H200",
        observed_at=AT,
        memory_total_bytes=143771 * MIB,
        minor_number=0,
        pci_bus_id="00000000:83:00.0",
        driver_version="590.48.01",
        cuda_version="13.1",
        vbios_version="96.00.A5.00.03",
        mig_mode="disabled",
        power_limit_watts=700.0,
    )


def test_l40s_has_no_mig() -> None:
    (gpu,) = inventory("linux-x86_64__nvidia-l40s__595.80.txt")
    assert (gpu.model, gpu.driver_version, gpu.cuda_version) == ("NVIDIA L40S", "595.80", "13.2")
    assert (gpu.pci_bus_id, gpu.vbios_version, gpu.minor_number) == ("00000000:01:00.0", "95.02.66.00.02", 0)
    assert gpu.memory_total_bytes == 46068 * MIB
    assert gpu.mig_mode == ""
    assert (gpu.parent_gpu_uuid, gpu.gpu_fraction) == ("", 1.0)
    assert gpu.power_limit_watts == 350.0


def test_h100_mig_instances_with_their_uuids_and_profiles() -> None:
    parent, *migs = inventory("linux-x86_64__nvidia-h100-mig__590.48.01.txt")
    assert parent.gpu_uuid == ZERO
    assert parent.mig_mode == "enabled"
    assert parent.memory_total_bytes == 81559 * MIB
    # nvidia-smi -L: "MIG 3g.40gb Device 0: (UUID: MIG-00000000-...)"; -q: Shared FB Memory Total
    assert [(m.gpu_uuid, m.index, m.mig_profile, m.memory_total_bytes, m.gpu_fraction) for m in migs] == [
        ("MIG-00000000-0000-0000-0000-000000000000", 0, "3g.40gb", 40448 * MIB, 3 / 7),
        ("MIG-00000001-0000-0000-0000-000000000001", 1, "2g.20gb", 20096 * MIB, 2 / 7),
        ("MIG-00000002-0000-0000-0000-000000000002", 2, "1g.10gb", 9984 * MIB, 1 / 7),
        ("MIG-00000003-0000-0000-0000-000000000003", 3, "1g.10gb", 9984 * MIB, 1 / 7),
    ]
    for mig in migs:
        assert mig.parent_gpu_uuid == ZERO
        assert mig.model == f"NVIDIA H100 80GB HBM3 MIG {mig.mig_profile}"
        assert (mig.pci_bus_id, mig.driver_version, mig.cuda_version) == (
            "00000000:00:09.0",
            "590.48.01",
            "13.1",
        )
        assert mig.minor_number is None
        assert mig.mig_mode == ""
        # NVML answers the cap for the GPU, not for an instance
        assert mig.power_limit_watts is None
    assert parent.power_limit_watts == 700.0


def test_h200_mig_compute_instances_count_their_compute_slices() -> None:
    parent, *migs = inventory("linux-x86_64__nvidia-h200-mig__590.48.01.txt")
    assert parent.model == "NVIDIA H200"
    assert [(m.index, m.mig_profile, m.gpu_fraction) for m in migs] == [
        (0, "1c.3g.71gb", 1 / 7),
        (1, "2c.3g.71gb", 2 / 7),
        (2, "2g.35gb", 2 / 7),
        (3, "1g.18gb", 1 / 7),
        (4, "1g.18gb", 1 / 7),
    ]


def test_a100_mig_from_xml() -> None:
    parent, *migs = inventory("a100-sxm4-v12.xml")
    assert parent == GpuInventory(
        node="gpu01",
        gpu_uuid="GPU-513536b6-7d19-9063-b049-1e69664bb298",
        index=0,
        model="NVIDIA A100-SXM4-80GB",
        observed_at=AT,
        memory_total_bytes=81920 * MIB,
        minor_number=1,
        pci_bus_id="00000000:01:00.0",
        driver_version="535.54.03",
        cuda_version="12.2",
        vbios_version="92.00.36.00.02",
        mig_mode="enabled",
        # <gpu_power_readings><current_power_limit>
        power_limit_watts=500.0,
    )
    # nvidia-smi -q -x names no MIG UUID: the fake gives the legacy form MIG-<GPU UUID>/<GI>/<CI>;
    # 14 SMs = one A100 compute slice
    assert [(m.gpu_uuid, m.index, m.memory_total_bytes, m.gpu_fraction, m.mig_profile) for m in migs] == [
        (f"MIG-GPU-513536b6-7d19-9063-b049-1e69664bb298/{gi}/0", i, 19968 * MIB, 1 / 7, "")
        for i, gi in enumerate((3, 4, 5, 6))
    ]
    assert {m.parent_gpu_uuid for m in migs} == {parent.gpu_uuid}


def test_the_older_power_readings_name_the_enforced_limit() -> None:
    """Before the GPU Power Readings section (driver 530), `nvidia-smi -q -x` printed
    <power_readings> with <power_limit> and <enforced_power_limit> (the Tesla T4 capture)."""
    (gpu,) = inventory("tesla-t4.xml")
    assert gpu.power_limit_watts == 70.0


def test_multi_gpu_node_keeps_nvml_order() -> None:
    """Two GPU sections in one `nvidia-smi -q`, as on a multi-GPU node (built from the H100 capture)."""
    raw = fixture_path(
        "nvidia_smi", "linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01__load__q.txt"
    ).read_text()
    head, body = raw.split("GPU 00000000:00:09.0\n", 1)
    second = body.replace(ZERO, "GPU-00000000-0000-0000-0000-000000000001").replace(
        "Minor Number                                       : 0",
        "Minor Number                                       : 1",
    )
    fake = FakeNvml.from_text(head + "GPU 00000000:00:09.0\n" + body + "GPU 00000000:00:0A.0\n" + second)
    fake.init()
    gpus = Sampler(fake, "gpu01", clock=lambda: NOW).discover()
    assert [(g.index, g.gpu_uuid, g.minor_number) for g in gpus] == [
        (0, ZERO, 0),
        (1, "GPU-00000000-0000-0000-0000-000000000001", 1),
    ]
