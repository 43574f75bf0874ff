"""Parsers for `nvidia-smi` output: `-q -x` (XML), `-q` (text) and `-L` (list).

Pure: text in, typed values out. The node agent reads NVML directly; these parsers exist so
the fake NVML (slurmtel.agent.fake_nvml) can be built from real captures, and so a site can
feed a saved `nvidia-smi -q` to slurmtel for an inventory.

Unit handling: nvidia-smi prints "81559 MiB", "432.21 W", "53 C", "1980 MHz", "100 %"; a
value that is "N/A", "[N/A]", "Not Supported" or "Requested functionality has been
deprecated" is None.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from dataclasses import dataclass, field

from slurmtel.errors import ParseError

MIB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class NvidiaSmiProcess:
    pid: int
    # "C" (compute), "G" (graphics), "C+G"
    type: str
    name: str
    used_memory_bytes: int | None = None
    # the MIG instance the process runs in; None on a GPU without MIG
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None


@dataclass(frozen=True, slots=True)
class NvidiaSmiMigDevice:
    index: int
    gpu_instance_id: int
    compute_instance_id: int
    multiprocessor_count: int | None = None
    memory_total_bytes: int | None = None
    memory_used_bytes: int | None = None
    # only `nvidia-smi -L` shows these two; "" when the source did not
    uuid: str = ""
    # "3g.40gb", "1c.3g.71gb"
    profile: str = ""


@dataclass(frozen=True, slots=True)
class NvidiaSmiGpu:
    # position in the output: nvidia-smi lists GPUs in NVML index order
    index: int
    uuid: str
    name: str
    pci_bus_id: str = ""
    minor_number: int | None = None
    product_architecture: str = ""
    vbios_version: str = ""
    driver_version: str = ""
    cuda_version: str = ""
    memory_total_bytes: int | None = None
    memory_used_bytes: int | None = None
    gpu_util_percent: float | None = None
    power_draw_watts: float | None = None
    # the enforced power cap (Current Power Limit; Enforced Power Limit before driver 530)
    power_limit_watts: float | None = None
    energy_consumption_joules: float | None = None
    temperature_celsius: float | None = None
    sm_clock_mhz: float | None = None
    ecc_corrected_volatile: int | None = None
    ecc_uncorrected_volatile: int | None = None
    # "enabled", "disabled", "" (not supported)
    mig_mode: str = ""
    mig_devices: tuple[NvidiaSmiMigDevice, ...] = ()
    processes: tuple[NvidiaSmiProcess, ...] = ()
    # NVML's clocks-event (throttle) reason bits active at capture time (CLOCKS_EVENT_*)
    clocks_event_reasons: int | None = None
    # PCIe throughput as nvidia-smi shows it (NVML samples 20 ms), KiB/s
    pcie_tx_kib_per_second: int | None = None
    pcie_rx_kib_per_second: int | None = None


@dataclass(frozen=True, slots=True)
class NvidiaSmiListedGpu:
    """One GPU line of `nvidia-smi -L`, with its MIG device lines."""

    index: int
    name: str
    uuid: str
    # (mig device index, profile, MIG UUID)
    mig_devices: tuple[tuple[int, str, str], ...] = ()


# ---------------------------------------------------------------------------------------------
# values

# NVML's clocks-event reason bits (nvmlClocksEventReason*, formerly ClocksThrottleReason*) by the
# name nvidia-smi -q prints and the tag suffix -q -x uses
CLOCKS_EVENT_BITS = {
    "Idle": ("gpu_idle", 0x1),
    "Applications Clocks Setting": ("applications_clocks_setting", 0x2),
    "SW Power Cap": ("sw_power_cap", 0x4),
    "HW Slowdown": ("hw_slowdown", 0x8),
    "Sync Boost": ("sync_boost", 0x10),
    "SW Thermal Slowdown": ("sw_thermal_slowdown", 0x20),
    "HW Thermal Slowdown": ("hw_thermal_slowdown", 0x40),
    "HW Power Brake Slowdown": ("hw_power_brake_slowdown", 0x80),
    "Display Clock Setting": ("display_clock_setting", 0x100),
}
_KIB_PER_SECOND = re.compile(r"^\s*(\d+)\s*KB/s\s*$")


def _kib_per_second(text: str | None) -> int | None:
    match = _KIB_PER_SECOND.match(text or "")
    return int(match.group(1)) if match else None


_NUMBER = re.compile(r"^\s*(-?\d+(?:\.\d+)?)\s*(MiB|GiB|KiB|W|C|MHz|%|mW|J|mJ)?\s*$")


def _number(text: str | None) -> float | None:
    if text is None:
        return None
    match = _NUMBER.match(text)
    if not match:
        return None
    return float(match.group(1))


def _int(text: str | None) -> int | None:
    value = _number(text)
    return None if value is None else int(value)


def _mib_bytes(text: str | None) -> int | None:
    if text is None:
        return None
    match = _NUMBER.match(text)
    if not match:
        return None
    scale = {"KiB": 1024, "MiB": MIB, "GiB": 1024 * MIB, None: MIB}.get(match.group(2))
    if scale is None:
        return None
    return int(float(match.group(1)) * scale)


def _text(text: str | None) -> str:
    if text is None:
        return ""
    value = text.strip()
    if value in ("N/A", "[N/A]", "None") or value.startswith(("Not Supported", "[Not Supported")):
        return ""
    if value.startswith("Requested functionality"):
        return ""
    return value


def _mig_mode(text: str | None) -> str:
    value = _text(text).lower()
    return value if value in ("enabled", "disabled") else ""


# ---------------------------------------------------------------------------------------------
# nvidia-smi -q (text)


@dataclass(slots=True)
class _Node:
    key: str
    value: str | None
    children: list[_Node] = field(default_factory=list)

    def child(self, *path: str) -> _Node | None:
        node: _Node | None = self
        for key in path:
            if node is None:
                return None
            node = next((c for c in node.children if c.key == key), None)
        return node

    def get(self, *path: str) -> str | None:
        node = self.child(*path)
        return None if node is None else node.value

    def all(self, key: str) -> Iterator[_Node]:
        return (c for c in self.children if c.key == key)


# "    Product Name                  : NVIDIA H100 80GB HBM3"; a section header has no " : "
# ("GPU 00000000:00:09.0" has colons but no whitespace before one)
_KEY_VALUE = re.compile(r"^(?P<key>\S.*?)\s+:(?:\s(?P<value>.*))?$")


def _tree(raw: str) -> _Node:
    root = _Node("", None)
    stack: list[tuple[int, _Node]] = [(-1, root)]
    for line in raw.splitlines():
        if not line.strip() or line.lstrip().startswith("===="):
            continue
        indent = len(line) - len(line.lstrip(" "))
        body = line.strip()
        match = _KEY_VALUE.match(body)
        node = (
            _Node(match.group("key").strip(), (match.group("value") or "").strip())
            if match
            else _Node(body, None)
        )
        while stack[-1][0] >= indent:
            stack.pop()
        stack[-1][1].children.append(node)
        stack.append((indent, node))
    return root


def _text_ecc(gpu: _Node) -> tuple[int | None, int | None]:
    volatile = gpu.child("ECC Errors", "Volatile")
    if volatile is None:
        return None, None
    single = volatile.child("Single Bit")
    if single is not None:  # drivers before R510: Single Bit / Double Bit sections with a Total
        return _int(single.get("Total")), _int(volatile.get("Double Bit", "Total"))
    corrected: int | None = None
    uncorrected: int | None = None
    for node in volatile.children:
        value = _int(node.value)
        if value is None:
            continue
        if "Uncorrectable" in node.key:
            uncorrected = (uncorrected or 0) + value
        elif "Correctable" in node.key:
            corrected = (corrected or 0) + value
    return corrected, uncorrected


def _text_processes(gpu: _Node) -> tuple[NvidiaSmiProcess, ...]:
    section = gpu.child("Processes")
    if section is None:
        return ()
    result: list[NvidiaSmiProcess] = []
    gpu_instance: int | None = None
    compute_instance: int | None = None
    for node in section.children:
        if node.key == "GPU instance ID":
            gpu_instance = _int(node.value)
        elif node.key == "Compute instance ID":
            compute_instance = _int(node.value)
        elif node.key == "Process ID":
            pid = _int(node.value)
            if pid is None:
                continue
            result.append(
                NvidiaSmiProcess(
                    pid=pid,
                    type=_text(node.get("Type")),
                    name=_text(node.get("Name")),
                    used_memory_bytes=_mib_bytes(node.get("Used GPU Memory")),
                    gpu_instance_id=gpu_instance,
                    compute_instance_id=compute_instance,
                )
            )
    return tuple(result)


def _text_mig_devices(gpu: _Node) -> tuple[NvidiaSmiMigDevice, ...]:
    result = []
    for node in gpu.all("MIG Device"):
        index = _int(node.get("Index"))
        gi = _int(node.get("GPU Instance ID"))
        ci = _int(node.get("Compute Instance ID"))
        if index is None or gi is None or ci is None:
            continue
        memory = node.child("Shared FB Memory Usage") or node.child("FB Memory Usage")
        result.append(
            NvidiaSmiMigDevice(
                index=index,
                gpu_instance_id=gi,
                compute_instance_id=ci,
                multiprocessor_count=_int(node.get("Device Attributes", "Shared", "Multiprocessor count")),
                memory_total_bytes=_mib_bytes(memory.get("Total")) if memory else None,
                memory_used_bytes=_mib_bytes(memory.get("Used")) if memory else None,
            )
        )
    return tuple(result)


def _text_power(gpu: _Node) -> float | None:
    for section in ("GPU Power Readings", "Power Readings"):
        node = gpu.child(section)
        if node is None:
            continue
        for key in ("Average Power Draw", "Power Draw", "Instantaneous Power Draw"):
            value = _number(node.get(key))
            if value is not None:
                return value
    return None


def _text_power_limit(gpu: _Node) -> float | None:
    for section in ("GPU Power Readings", "Power Readings"):
        node = gpu.child(section)
        if node is None:
            continue
        for key in ("Current Power Limit", "Enforced Power Limit", "Power Limit"):
            value = _number(node.get(key))
            if value is not None:
                return value
    return None


def _text_clocks_events(node: _Node) -> int | None:
    section = node.child("Clocks Event Reasons") or node.child("Clocks Throttle Reasons")
    if section is None:
        return None
    bits, seen = 0, False
    stack = list(section.children)
    while stack:
        child = stack.pop()
        stack.extend(child.children)
        known = CLOCKS_EVENT_BITS.get(child.key)
        if known is not None and child.value in ("Active", "Not Active"):
            seen = True
            if child.value == "Active":
                bits |= known[1]
    return bits if seen else None


def parse_nvidia_smi_query(raw: str) -> list[NvidiaSmiGpu]:
    """`nvidia-smi -q` text output -> one NvidiaSmiGpu per GPU section."""
    if "Attached GPUs" not in raw and "NVSMI LOG" not in raw:
        raise ParseError("nvidia-smi -q: no 'NVSMI LOG' header or 'Attached GPUs' line")
    root = _tree(raw)
    driver = _text(root.get("Driver Version"))
    cuda = _text(root.get("CUDA Version"))
    gpus: list[NvidiaSmiGpu] = []
    for node in root.children:
        if not node.key.startswith("GPU ") or node.value is not None:
            continue
        corrected, uncorrected = _text_ecc(node)
        gpus.append(
            NvidiaSmiGpu(
                index=len(gpus),
                uuid=_text(node.get("GPU UUID")),
                name=_text(node.get("Product Name")),
                pci_bus_id=_text(node.get("PCI", "Bus Id")) or node.key.removeprefix("GPU ").strip(),
                minor_number=_int(node.get("Minor Number")),
                product_architecture=_text(node.get("Product Architecture")),
                vbios_version=_text(node.get("VBIOS Version")),
                driver_version=driver,
                cuda_version=cuda,
                memory_total_bytes=_mib_bytes(node.get("FB Memory Usage", "Total")),
                memory_used_bytes=_mib_bytes(node.get("FB Memory Usage", "Used")),
                gpu_util_percent=_number(node.get("Utilization", "GPU")),
                power_draw_watts=_text_power(node),
                power_limit_watts=_text_power_limit(node),
                temperature_celsius=_number(node.get("Temperature", "GPU Current Temp")),
                sm_clock_mhz=_number(node.get("Clocks", "SM")),
                ecc_corrected_volatile=corrected,
                ecc_uncorrected_volatile=uncorrected,
                mig_mode=_mig_mode(node.get("MIG Mode", "Current")),
                mig_devices=_text_mig_devices(node),
                processes=_text_processes(node),
                clocks_event_reasons=_text_clocks_events(node),
                pcie_tx_kib_per_second=_kib_per_second(node.get("PCI", "Tx Throughput")),
                pcie_rx_kib_per_second=_kib_per_second(node.get("PCI", "Rx Throughput")),
            )
        )
    if not gpus:
        raise ParseError("nvidia-smi -q: no GPU section")
    return gpus


# ---------------------------------------------------------------------------------------------
# nvidia-smi -q -x (XML)


def _xml_text(element: ET.Element | None, path: str) -> str | None:
    if element is None:
        return None
    found = element.find(path)
    if found is None or found.text is None:
        return None
    return found.text.strip()


def _xml_ecc(gpu: ET.Element) -> tuple[int | None, int | None]:
    volatile = gpu.find("ecc_errors/volatile")
    if volatile is None:
        return None, None
    if volatile.find("single_bit") is not None:  # DTD v10/v11 before R510
        return _int(_xml_text(volatile, "single_bit/total")), _int(_xml_text(volatile, "double_bit/total"))
    corrected: int | None = None
    uncorrected: int | None = None
    for child in volatile:
        value = _int(child.text)
        if value is None:
            continue
        if "uncorrectable" in child.tag:
            uncorrected = (uncorrected or 0) + value
        elif "correctable" in child.tag:
            corrected = (corrected or 0) + value
    return corrected, uncorrected


def _xml_power(gpu: ET.Element) -> float | None:
    for section in ("gpu_power_readings", "power_readings"):
        for key in ("average_power_draw", "power_draw", "instant_power_draw"):
            value = _number(_xml_text(gpu, f"{section}/{key}"))
            if value is not None:
                return value
    return None


def _xml_power_limit(gpu: ET.Element) -> float | None:
    for section in ("gpu_power_readings", "power_readings"):
        for key in ("current_power_limit", "enforced_power_limit", "power_limit"):
            value = _number(_xml_text(gpu, f"{section}/{key}"))
            if value is not None:
                return value
    return None


def _xml_mig_devices(gpu: ET.Element) -> tuple[NvidiaSmiMigDevice, ...]:
    result = []
    for node in gpu.findall("mig_devices/mig_device"):
        index = _int(_xml_text(node, "index"))
        gi = _int(_xml_text(node, "gpu_instance_id"))
        ci = _int(_xml_text(node, "compute_instance_id"))
        if index is None or gi is None or ci is None:
            continue
        result.append(
            NvidiaSmiMigDevice(
                index=index,
                gpu_instance_id=gi,
                compute_instance_id=ci,
                multiprocessor_count=_int(_xml_text(node, "device_attributes/shared/multiprocessor_count")),
                memory_total_bytes=_mib_bytes(_xml_text(node, "fb_memory_usage/total")),
                memory_used_bytes=_mib_bytes(_xml_text(node, "fb_memory_usage/used")),
            )
        )
    return tuple(result)


def _xml_processes(gpu: ET.Element) -> tuple[NvidiaSmiProcess, ...]:
    result = []
    for node in gpu.findall("processes/process_info"):
        pid = _int(_xml_text(node, "pid"))
        if pid is None:
            continue
        result.append(
            NvidiaSmiProcess(
                pid=pid,
                type=_text(_xml_text(node, "type")),
                name=_text(_xml_text(node, "process_name")),
                used_memory_bytes=_mib_bytes(_xml_text(node, "used_memory")),
                gpu_instance_id=_int(_xml_text(node, "gpu_instance_id")),
                compute_instance_id=_int(_xml_text(node, "compute_instance_id")),
            )
        )
    return tuple(result)


def _xml_clocks_events(gpu: ET.Element) -> int | None:
    for section, prefix in (
        ("clocks_event_reasons", "clocks_event_reason_"),
        ("clocks_throttle_reasons", "clocks_throttle_reason_"),
    ):
        element = gpu.find(section)
        if element is None:
            continue
        bits, seen = 0, False
        for tag, bit in CLOCKS_EVENT_BITS.values():
            value = _xml_text(element, prefix + tag)
            if value in ("Active", "Not Active"):
                seen = True
                if value == "Active":
                    bits |= bit
        return bits if seen else None
    return None


def parse_nvidia_smi_xml(raw: str | bytes) -> list[NvidiaSmiGpu]:
    """`nvidia-smi -q -x` output (DTD v10 to v13) -> one NvidiaSmiGpu per <gpu> element."""
    try:
        root = ET.fromstring(raw)
    except (ET.ParseError, UnicodeError, ValueError) as exc:
        # ValueError/UnicodeError: text the XML parser cannot even take (unpaired surrogates)
        raise ParseError(f"nvidia-smi -q -x: not well-formed XML: {exc}") from exc
    if root.tag != "nvidia_smi_log":
        raise ParseError(f"nvidia-smi -q -x: root element is <{root.tag}>, not <nvidia_smi_log>")
    driver = _text(_xml_text(root, "driver_version"))
    cuda = _text(_xml_text(root, "cuda_version"))
    gpus: list[NvidiaSmiGpu] = []
    for gpu in root.findall("gpu"):
        corrected, uncorrected = _xml_ecc(gpu)
        gpus.append(
            NvidiaSmiGpu(
                index=len(gpus),
                uuid=_text(_xml_text(gpu, "uuid")),
                name=_text(_xml_text(gpu, "product_name")),
                pci_bus_id=_text(_xml_text(gpu, "pci/pci_bus_id")) or gpu.get("id", ""),
                minor_number=_int(_xml_text(gpu, "minor_number")),
                product_architecture=_text(_xml_text(gpu, "product_architecture")),
                vbios_version=_text(_xml_text(gpu, "vbios_version")),
                driver_version=driver,
                cuda_version=cuda,
                memory_total_bytes=_mib_bytes(_xml_text(gpu, "fb_memory_usage/total")),
                memory_used_bytes=_mib_bytes(_xml_text(gpu, "fb_memory_usage/used")),
                gpu_util_percent=_number(_xml_text(gpu, "utilization/gpu_util")),
                power_draw_watts=_xml_power(gpu),
                power_limit_watts=_xml_power_limit(gpu),
                energy_consumption_joules=_number(_xml_text(gpu, "total_energy_consumption")),
                temperature_celsius=_number(_xml_text(gpu, "temperature/gpu_temp")),
                sm_clock_mhz=_number(_xml_text(gpu, "clocks/sm_clock")),
                ecc_corrected_volatile=corrected,
                ecc_uncorrected_volatile=uncorrected,
                mig_mode=_mig_mode(_xml_text(gpu, "mig_mode/current_mig")),
                mig_devices=_xml_mig_devices(gpu),
                processes=_xml_processes(gpu),
                clocks_event_reasons=_xml_clocks_events(gpu),
                pcie_tx_kib_per_second=_kib_per_second(_xml_text(gpu, "pci/tx_util")),
                pcie_rx_kib_per_second=_kib_per_second(_xml_text(gpu, "pci/rx_util")),
            )
        )
    if not gpus:
        raise ParseError("nvidia-smi -q -x: no <gpu> element")
    return gpus


# ---------------------------------------------------------------------------------------------
# nvidia-smi -L

_LIST_GPU = re.compile(r"^GPU (?P<index>\d+): (?P<name>.+?) \(UUID: (?P<uuid>[^)]+)\)\s*$")
_LIST_MIG = re.compile(r"^\s+MIG (?P<profile>\S+)\s+Device\s+(?P<index>\d+): \(UUID: (?P<uuid>[^)]+)\)\s*$")


def parse_nvidia_smi_list(raw: str) -> list[NvidiaSmiListedGpu]:
    """`nvidia-smi -L` -> GPUs with their MIG devices (the only output that names MIG UUIDs)."""
    gpus: list[NvidiaSmiListedGpu] = []
    for number, line in enumerate(raw.splitlines(), start=1):
        if not line.strip():
            continue
        gpu = _LIST_GPU.match(line)
        if gpu:
            gpus.append(NvidiaSmiListedGpu(int(gpu["index"]), gpu["name"], gpu["uuid"]))
            continue
        mig = _LIST_MIG.match(line)
        if mig and gpus:
            last = gpus[-1]
            gpus[-1] = NvidiaSmiListedGpu(
                last.index,
                last.name,
                last.uuid,
                (*last.mig_devices, (int(mig["index"]), mig["profile"], mig["uuid"])),
            )
            continue
        raise ParseError(f"nvidia-smi -L: line {number} is neither a GPU nor a MIG device: {line!r}")
    if not gpus:
        raise ParseError("nvidia-smi -L: no GPU line")
    return gpus
