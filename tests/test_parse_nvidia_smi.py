"""nvidia-smi parsers on real captures (tests/fixtures/nvidia_smi, see PROVENANCE.md).

Expected values were read by hand from the files.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from slurmtel.agent.fake_nvml import split_exporter_capture
from slurmtel.errors import ParseError
from slurmtel.parsers.nvidia_smi import (
    MIB,
    NvidiaSmiMigDevice,
    NvidiaSmiProcess,
    parse_nvidia_smi_list,
    parse_nvidia_smi_query,
    parse_nvidia_smi_xml,
)
from tests.conftest import fixture_path

ZERO_UUID = "GPU-00000000-0000-0000-0000-000000000000"


def read(name: str) -> str:
    return fixture_path("nvidia_smi", name).read_text()


def test_h100_query_load() -> None:
    (gpu,) = parse_nvidia_smi_query(read("linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01__load__q.txt"))
    assert gpu.index == 0
    assert gpu.uuid == ZERO_UUID
    assert gpu.name == "NVIDIA H100 80GB HBM3"
    assert gpu.product_architecture == "Hopper"
    assert gpu.pci_bus_id == "00000000:00:09.0"
    assert gpu.minor_number == 0
    assert gpu.vbios_version == "96.00.A5.00.01"
    assert (gpu.driver_version, gpu.cuda_version) == ("590.48.01", "13.1")
    assert gpu.memory_total_bytes == 81559 * MIB
    assert gpu.memory_used_bytes == 19818 * MIB
    assert gpu.gpu_util_percent == 100.0
    # "Average Power Draw : 629.45 W" under "GPU Power Readings" (not the memory's 85.83 W)
    assert gpu.power_draw_watts == 629.45
    assert gpu.temperature_celsius == 59.0
    assert gpu.sm_clock_mhz == 1980.0
    assert (gpu.ecc_corrected_volatile, gpu.ecc_uncorrected_volatile) == (0, 0)
    assert gpu.mig_mode == "disabled"
    assert gpu.mig_devices == ()
    assert gpu.processes == (
        NvidiaSmiProcess(11327, "C", "/root/tools/memhog", 2566 * MIB, None, None),
        NvidiaSmiProcess(11328, "C", "/root/tools/memhog", 1542 * MIB, None, None),
        NvidiaSmiProcess(11345, "C", "./gpu_burn", 15690 * MIB, None, None),
    )


def test_h100_query_idle_has_no_processes() -> None:
    (gpu,) = parse_nvidia_smi_query(read("linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01__idle__q.txt"))
    assert gpu.processes == ()
    assert gpu.gpu_util_percent == 0.0
    assert gpu.memory_used_bytes == 0
    assert gpu.power_draw_watts == 69.85
    assert gpu.temperature_celsius == 41.0


def test_h100_mig_query() -> None:
    (gpu,) = parse_nvidia_smi_query(read("linux-x86_64__nvidia-h100-mig__590.48.01__load__q.txt"))
    assert gpu.mig_mode == "enabled"
    # MIG hides whole-GPU utilisation: "GPU : N/A"
    assert gpu.gpu_util_percent is None
    assert gpu.power_draw_watts == 432.21
    assert gpu.mig_devices == (
        NvidiaSmiMigDevice(0, 2, 0, 60, 40448 * MIB, 11091 * MIB),
        NvidiaSmiMigDevice(1, 3, 0, 32, 20096 * MIB, 17 * MIB),
        NvidiaSmiMigDevice(2, 9, 0, 16, 9984 * MIB, 9 * MIB),
        NvidiaSmiMigDevice(3, 10, 0, 16, 9984 * MIB, 9 * MIB),
    )
    assert [(p.pid, p.gpu_instance_id, p.compute_instance_id) for p in gpu.processes] == [
        (21180, 2, 0),
        (21181, 2, 0),
        (21198, 2, 0),
    ]


def test_h200_mig_query_two_compute_instances_in_one_gpu_instance() -> None:
    (gpu,) = parse_nvidia_smi_query(read("linux-x86_64__nvidia-h200-mig__590.48.01__load__q.txt"))
    assert gpu.name == "NVIDIA H200"
    assert gpu.pci_bus_id == "00000000:83:00.0"
    assert [
        (m.index, m.gpu_instance_id, m.compute_instance_id, m.multiprocessor_count) for m in gpu.mig_devices
    ] == [
        (0, 2, 0, 16),
        (1, 2, 1, 32),
        (2, 3, 0, 32),
        (3, 9, 0, 16),
        (4, 10, 0, 16),
    ]
    assert gpu.mig_devices[0].memory_total_bytes == 71424 * MIB
    assert {(p.pid, p.gpu_instance_id, p.compute_instance_id) for p in gpu.processes} == {
        (12249, 2, 1),
        (12250, 2, 1),
        (12267, 2, 1),
    }


def test_l40s_query_without_mig() -> None:
    (gpu,) = parse_nvidia_smi_query(read("linux-x86_64__nvidia-l40s__595.80__load__q.txt"))
    assert gpu.name == "NVIDIA L40S"
    assert gpu.product_architecture == "Ada Lovelace"
    assert (gpu.driver_version, gpu.cuda_version) == ("595.80", "13.2")
    assert gpu.vbios_version == "95.02.66.00.02"
    assert gpu.pci_bus_id == "00000000:01:00.0"
    assert gpu.memory_total_bytes == 46068 * MIB
    # "MIG Mode / Current : N/A"
    assert gpu.mig_mode == ""
    assert gpu.gpu_util_percent == 9.0
    assert gpu.power_draw_watts == 110.24
    assert gpu.sm_clock_mhz == 2520.0
    assert [p.pid for p in gpu.processes] == [20037, 20038]


def test_a100_mig_xml() -> None:
    (gpu,) = parse_nvidia_smi_xml(read("a100-sxm4-v12.xml"))
    assert gpu.uuid == "GPU-513536b6-7d19-9063-b049-1e69664bb298"
    assert gpu.name == "NVIDIA A100-SXM4-80GB"
    assert gpu.product_architecture == "Ampere"
    assert gpu.minor_number == 1
    assert gpu.pci_bus_id == "00000000:01:00.0"
    assert gpu.vbios_version == "92.00.36.00.02"
    assert (gpu.driver_version, gpu.cuda_version) == ("535.54.03", "12.2")
    assert gpu.memory_total_bytes == 81920 * MIB
    assert gpu.memory_used_bytes == 50 * MIB
    assert gpu.gpu_util_percent is None
    assert gpu.power_draw_watts == 67.03
    assert gpu.temperature_celsius == 27.0
    assert gpu.sm_clock_mhz == 1275.0
    assert gpu.mig_mode == "enabled"
    assert gpu.mig_devices == tuple(
        NvidiaSmiMigDevice(i, gi, 0, 14, 19968 * MIB, 12 * MIB) for i, gi in enumerate((3, 4, 5, 6))
    )
    assert gpu.processes == ()


def test_t4_xml_v11() -> None:
    (gpu,) = parse_nvidia_smi_xml(read("tesla-t4.xml"))
    assert gpu.uuid == "GPU-d37e67a5-91dd-3774-a5cb-99096249601a"
    assert (gpu.name, gpu.minor_number, gpu.vbios_version) == ("Tesla T4", 0, "90.04.84.00.06")
    assert gpu.pci_bus_id == "00000000:00:1E.0"
    assert (gpu.driver_version, gpu.cuda_version) == ("515.105.01", "11.7")
    assert (gpu.memory_total_bytes, gpu.memory_used_bytes) == (15360 * MIB, 1032 * MIB)
    assert (gpu.gpu_util_percent, gpu.power_draw_watts, gpu.temperature_celsius) == (0.0, 26.78, 40.0)
    # <clocks><sm_clock>585 MHz, not <max_clocks><sm_clock>1590 MHz
    assert gpu.sm_clock_mhz == 585.0
    assert (gpu.ecc_corrected_volatile, gpu.ecc_uncorrected_volatile) == (0, 0)
    assert gpu.mig_mode == ""
    assert gpu.processes == (
        NvidiaSmiProcess(675, "G", "/usr/lib/xorg/Xorg", 22 * MIB),
        NvidiaSmiProcess(5762, "C", "python", 1005 * MIB),
    )


def test_xml_minor_number_not_available_and_many_processes() -> None:
    (gpu,) = parse_nvidia_smi_xml(read("rtx-3080-v12.xml"))
    assert gpu.minor_number is None
    assert [p.pid for p in gpu.processes] == [835, 1481, 2214, 4044, 42416]
    assert gpu.processes[3] == NvidiaSmiProcess(4044, "G", "/usr/lib/firefox/firefox", 541 * MIB)


def test_xml_single_bit_double_bit_ecc_layout_not_available() -> None:
    # driver 418: <volatile><single_bit>...<total>N/A</total>
    (gpu,) = parse_nvidia_smi_xml(read("quadro-p400.xml"))
    assert gpu.name == "Quadro P400"
    assert (gpu.ecc_corrected_volatile, gpu.ecc_uncorrected_volatile) == (None, None)
    assert gpu.power_draw_watts is None


def test_list_with_mig_devices() -> None:
    sections = split_exporter_capture(read("linux-x86_64__nvidia-h200-mig__590.48.01.txt"))
    (gpu,) = parse_nvidia_smi_list(sections["capabilities :: list (-L)"])
    assert (gpu.index, gpu.name, gpu.uuid) == (0, "NVIDIA H200", ZERO_UUID)
    assert gpu.mig_devices == (
        (0, "1c.3g.71gb", "MIG-00000000-0000-0000-0000-000000000000"),
        (1, "2c.3g.71gb", "MIG-00000001-0000-0000-0000-000000000001"),
        (2, "2g.35gb", "MIG-00000002-0000-0000-0000-000000000002"),
        (3, "1g.18gb", "MIG-00000003-0000-0000-0000-000000000003"),
        (4, "1g.18gb", "MIG-00000004-0000-0000-0000-000000000004"),
    )


def test_capture_sections_hold_the_same_query_as_the_extracted_file() -> None:
    sections = split_exporter_capture(read("linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01.txt"))
    from_capture = parse_nvidia_smi_query(sections["load :: query (-q)"])
    extracted = parse_nvidia_smi_query(read("linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01__load__q.txt"))
    assert from_capture == extracted
    assert "idle :: query (-q)" in sections


@pytest.mark.parametrize(
    ("parser", "raw", "reason"),
    [
        (parse_nvidia_smi_xml, "<nvidia_smi_log><gpu>", "not well-formed"),
        (parse_nvidia_smi_xml, "<other/>", "not <nvidia_smi_log>"),
        (parse_nvidia_smi_xml, "<nvidia_smi_log></nvidia_smi_log>", "no <gpu>"),
        (parse_nvidia_smi_query, "hello", "no 'NVSMI LOG'"),
        (
            parse_nvidia_smi_query,
            "==============NVSMI LOG==============\nAttached GPUs : 0\n",
            "no GPU section",
        ),
        (parse_nvidia_smi_list, "No devices found.", "line 1"),
    ],
)
def test_unreadable_input_raises_parse_error_with_reason(
    parser: Callable[[str], list[object]], raw: str, reason: str
) -> None:
    with pytest.raises(ParseError, match=reason):
        parser(raw)
