"""A fake NVML (the `NvmlApi` seam) built from real nvidia-smi captures.

`FakeNvml.from_capture(path)` reads one of:
- `nvidia-smi -q -x` XML,
- `nvidia-smi -q` text,
- an nvidia_gpu_exporter capture file (many nvidia-smi sections in one file): its `-q` of the
  chosen state ("load" or "idle") plus its `-L` section, which names the MIG UUIDs and
  profiles that `-q` does not show.

The values the capture shows are what the fake returns (UUID, names, bus id, memory,
utilisation, power, temperature, SM clock, ECC, MIG layout, processes). What a capture
cannot show is derived and documented here:
- the total-energy counter integrates the (scripted or captured) power over the fake clock;
- GR engine activity (GPM) is supported on Hopper and newer architectures, as in NVML, and
  reads the captured GPU utilisation unless scripted; with MIG enabled the parent reports no
  utilisation (nvidia-smi shows N/A), the MIG instances 0 % unless scripted;
- a MIG device whose UUID the capture does not name (XML, `-q` without `-L`) gets the
  legacy form `MIG-<parent GPU UUID>/<GPU instance id>/<compute instance id>`;
- MIG slice counts come from the profile ("3g.40gb": 3, "1c.3g.71gb": 1 compute of 3), or
  for an Ampere capture without profiles from the SM count (14 SMs per A100 slice).

Tests and demos script it per device: `set_utilization(uuid, fn)`, `set_processes`,
`set_power`, `set_energy` take callables of the fake clock's time, `inject_error(uuid, call,
code)` makes one seam method fail with an NVML error code, `push_event` queues an XID/ECC
event.
"""

from __future__ import annotations

import re
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from slurmtel.agent.nvml import (
    EVENT_DOUBLE_BIT_ECC,
    EVENT_SINGLE_BIT_ECC,
    EVENT_XID_CRITICAL,
    GPU_IS_LOST,
    INVALID_ARGUMENT,
    NOT_FOUND,
    NOT_SUPPORTED,
    TOPOLOGY_WORDS,
    GpuProcess,
    MigAttributes,
    NvmlError,
    NvmlEvent,
)
from slurmtel.errors import ParseError
from slurmtel.parsers.nvidia_smi import (
    NvidiaSmiGpu,
    parse_nvidia_smi_list,
    parse_nvidia_smi_query,
    parse_nvidia_smi_xml,
)
from slurmtel.records import NodeTopology

# NVML function each seam method stands for (NvmlError.call, the agent's error metric label)
NVML_CALLS = {
    "driver_version": "nvmlSystemGetDriverVersion",
    "cuda_driver_version": "nvmlSystemGetCudaDriverVersion_v2",
    "device_count": "nvmlDeviceGetCount",
    "device_handle": "nvmlDeviceGetHandleByIndex",
    "uuid": "nvmlDeviceGetUUID",
    "name": "nvmlDeviceGetName",
    "minor_number": "nvmlDeviceGetMinorNumber",
    "pci_bus_id": "nvmlDeviceGetPciInfo",
    "vbios_version": "nvmlDeviceGetVbiosVersion",
    "mig_mode": "nvmlDeviceGetMigMode",
    "max_mig_device_count": "nvmlDeviceGetMaxMigDeviceCount",
    "mig_device_handle": "nvmlDeviceGetMigDeviceHandleByIndex",
    "mig_attributes": "nvmlDeviceGetAttributes_v2",
    "mig_instance_ids": "nvmlDeviceGetGpuInstanceId",
    "supports_gr_engine_active": "nvmlGpmQueryDeviceSupport",
    "gr_engine_active_percent": "nvmlGpmMetricsGet",
    "gpu_utilization_percent": "nvmlDeviceGetUtilizationRates",
    "memory_info": "nvmlDeviceGetMemoryInfo",
    "power_usage_milliwatts": "nvmlDeviceGetPowerUsage",
    "power_limit_milliwatts": "nvmlDeviceGetEnforcedPowerLimit",
    "total_energy_millijoules": "nvmlDeviceGetTotalEnergyConsumption",
    "temperature_celsius": "nvmlDeviceGetTemperature",
    "sm_clock_mhz": "nvmlDeviceGetClockInfo",
    "ecc_volatile_counts": "nvmlDeviceGetTotalEccErrors",
    "running_processes": "nvmlDeviceGetComputeRunningProcesses",
    "clocks_event_reasons": "nvmlDeviceGetCurrentClocksEventReasons",
    "pcie_throughput_kib_per_second": "nvmlDeviceGetPcieThroughput",
    "supported_event_types": "nvmlDeviceGetSupportedEventTypes",
    "event_set_create": "nvmlEventSetCreate",
    "register_events": "nvmlDeviceRegisterEvents",
    "event_wait": "nvmlEventSetWait_v2",
    "nvlink_state": "nvmlDeviceGetNvLinkState",
    "nvlink_remote_pci_bus_id": "nvmlDeviceGetNvLinkRemotePciInfo_v2",
    "nvlink_remote_device_type": "nvmlDeviceGetNvLinkRemoteDeviceType",
    "nvlink_error_counters": "nvmlDeviceGetNvLinkErrorCounter",
    "nvlink_throughput_kib": "nvmlDeviceGetFieldValues",
    "topology_common_ancestor": "nvmlDeviceGetTopologyCommonAncestor",
    "p2p_read_status": "nvmlDeviceGetP2PStatus",
}
# `nvidia-smi topo -m` words -> nvmlGpuTopologyLevel_t
_TOPOLOGY_LEVELS = {word: level for level, word in TOPOLOGY_WORDS.items()}
# NVLinks a GPU of these generations has (a GPU with NV# pairs adding up to more talks to NVSwitches)
_MAX_NVLINKS = 18

# architectures with GPM (nvmlGpmQueryDeviceSupport: "Hopper or newer")
_GPM_ARCHITECTURES = ("Hopper", "Blackwell", "Rubin")
# A100 MIG: one compute slice is 14 SMs (NVIDIA MIG user guide, A100 profiles)
_SMS_PER_SLICE = {"Ampere": 14}
_PROFILE = re.compile(r"^(?:(?P<ci>\d+)c\.)?(?P<gi>\d+)g\.")

TimeFunction = Callable[[float], float | None]
ProcessFunction = Callable[[float], list[GpuProcess]]
# fake clock time -> (data tx KiB, data rx KiB), or error counter -> count
ThroughputFunction = Callable[[float], tuple[int, int] | None]
ErrorsFunction = Callable[[float], dict[str, int]]
# fake clock time -> clocks-event reason bits
ReasonsFunction = Callable[[float], int | None]


@dataclass(eq=False)
class FakeNvLink:
    """One NVLink of a fake GPU."""

    link: int
    active: bool
    # the PCI bus id of the far end: a GPU's, or an NVSwitch's
    remote_pci_bus_id: str = ""
    # "gpu", "switch", "ibmnpu", "unknown"
    remote_type: str = "gpu"
    throughput_kib: ThroughputFunction = lambda t: None
    errors: ErrorsFunction = lambda t: {}


@dataclass(eq=False)
class FakeDevice:
    """One GPU or MIG device of the fake; handles are these objects."""

    uuid: str
    name: str
    index: int
    architecture: str = ""
    pci_bus_id: str = ""
    minor_number: int | None = None
    vbios_version: str = ""
    memory_total_bytes: int | None = None
    memory_used_bytes: int | None = None
    # None: MIG not supported (nvmlDeviceGetMigMode raises NotSupported)
    mig_enabled: bool | None = None
    parent: FakeDevice | None = None
    mig_devices: list[FakeDevice] = field(default_factory=list)
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None
    attributes: MigAttributes | None = None
    gr_engine_supported: bool = False
    utilization: TimeFunction = lambda t: None
    power_watts: TimeFunction = lambda t: None
    power_limit_watts: float | None = None
    energy_millijoules: TimeFunction | None = None
    temperature_celsius: float | None = None
    sm_clock_mhz: float | None = None
    ecc: tuple[int, int] | None = None
    processes: ProcessFunction = lambda t: []
    # clocks-event reason bits and PCIe (tx, rx) KiB/s: the capture's, unless scripted
    clocks_event_reasons: ReasonsFunction = lambda t: None
    pcie_kib_per_second: ThroughputFunction = lambda t: None
    # NVLinks by link number (none: a GPU without NVLink answers NotSupported)
    nvlinks: dict[int, FakeNvLink] = field(default_factory=dict)
    # running energy integral when no energy function is scripted
    energy_integral_mj: float = field(default=0.0, repr=False)
    energy_integral_t: float | None = field(default=None, repr=False)


def _constant(value: float | None) -> TimeFunction:
    return lambda t: value


def _pcie_of(gpu: NvidiaSmiGpu) -> ThroughputFunction:
    tx, rx = gpu.pcie_tx_kib_per_second, gpu.pcie_rx_kib_per_second
    if tx is None or rx is None:
        return lambda t: None
    return _constant_reading((tx, rx))


def _constant_bits(value: int | None) -> ReasonsFunction:
    return lambda t: value


def _constant_reading(reading: tuple[int, int]) -> ThroughputFunction:
    return lambda t: reading


def _constant_errors(errors: dict[str, int]) -> ErrorsFunction:
    return lambda t: dict(errors)


def _processes_of(gpu: NvidiaSmiGpu, gi: int | None = None, ci: int | None = None) -> ProcessFunction:
    procs = [
        GpuProcess(p.pid, p.used_memory_bytes, p.gpu_instance_id, p.compute_instance_id)
        for p in gpu.processes
        if gi is None or (p.gpu_instance_id == gi and p.compute_instance_id == ci)
    ]
    return lambda t: list(procs)


def _slices(profile: str, sm_count: int | None, architecture: str) -> tuple[int, int] | None:
    """(GPU instance slices, compute instance slices) from a profile or the SM count."""
    match = _PROFILE.match(profile)
    if match:
        gi = int(match["gi"])
        return gi, int(match["ci"]) if match["ci"] else gi
    per_slice = _SMS_PER_SLICE.get(architecture)
    if per_slice and sm_count:
        count = max(1, round(sm_count / per_slice))
        return count, count
    return None


def _device_from_gpu(gpu: NvidiaSmiGpu, mig_names: dict[int, tuple[str, str]]) -> FakeDevice:
    hopper_or_newer = gpu.product_architecture in _GPM_ARCHITECTURES
    device = FakeDevice(
        uuid=gpu.uuid,
        name=gpu.name,
        index=gpu.index,
        architecture=gpu.product_architecture,
        pci_bus_id=gpu.pci_bus_id,
        minor_number=gpu.minor_number,
        vbios_version=gpu.vbios_version,
        memory_total_bytes=gpu.memory_total_bytes,
        memory_used_bytes=gpu.memory_used_bytes,
        mig_enabled={"enabled": True, "disabled": False}.get(gpu.mig_mode),
        gr_engine_supported=hopper_or_newer and gpu.mig_mode != "enabled",
        utilization=_constant(gpu.gpu_util_percent),
        power_watts=_constant(gpu.power_draw_watts),
        power_limit_watts=gpu.power_limit_watts,
        temperature_celsius=gpu.temperature_celsius,
        sm_clock_mhz=gpu.sm_clock_mhz,
        ecc=(
            (gpu.ecc_corrected_volatile, gpu.ecc_uncorrected_volatile)
            if gpu.ecc_corrected_volatile is not None and gpu.ecc_uncorrected_volatile is not None
            else None
        ),
        processes=_processes_of(gpu),
        clocks_event_reasons=_constant_bits(gpu.clocks_event_reasons),
        pcie_kib_per_second=_pcie_of(gpu),
    )
    if gpu.mig_mode == "enabled":
        for mig in gpu.mig_devices:
            profile, uuid = mig_names.get(mig.index, ("", ""))
            slices = _slices(profile, mig.multiprocessor_count, gpu.product_architecture)
            device.mig_devices.append(
                FakeDevice(
                    uuid=uuid or f"MIG-{gpu.uuid}/{mig.gpu_instance_id}/{mig.compute_instance_id}",
                    name=f"{gpu.name} MIG {profile}" if profile else f"{gpu.name} MIG",
                    index=mig.index,
                    architecture=gpu.product_architecture,
                    pci_bus_id=gpu.pci_bus_id,
                    vbios_version=gpu.vbios_version,
                    memory_total_bytes=mig.memory_total_bytes,
                    memory_used_bytes=mig.memory_used_bytes,
                    parent=device,
                    gpu_instance_id=mig.gpu_instance_id,
                    compute_instance_id=mig.compute_instance_id,
                    attributes=MigAttributes(
                        gpu_instance_slice_count=slices[0],
                        compute_instance_slice_count=slices[1],
                        multiprocessor_count=mig.multiprocessor_count or 0,
                        memory_bytes=mig.memory_total_bytes or 0,
                    )
                    if slices
                    else None,
                    gr_engine_supported=hopper_or_newer,
                    utilization=_constant(0.0),
                    processes=_processes_of(gpu, mig.gpu_instance_id, mig.compute_instance_id),
                )
            )
    return device


def split_exporter_capture(raw: str) -> dict[str, str]:
    """Sections of an nvidia_gpu_exporter capture file, keyed by their title line.

    A section is a banner of '#' lines holding "# <state> :: <title>" and "# $ <command>",
    then the command's output up to the next banner: {"load :: query (-q)": "...", ...}.
    """
    sections: dict[str, str] = {}
    lines = raw.splitlines()
    i = 0
    banner = "#" * 80
    while i < len(lines):
        if lines[i] != banner:
            i += 1
            continue
        header = []
        i += 1
        while i < len(lines) and lines[i] != banner:
            header.append(lines[i])
            i += 1
        i += 1  # closing banner
        body = []
        while i < len(lines) and lines[i] != banner:
            body.append(lines[i])
            i += 1
        title = next((h[2:].strip() for h in header if h.startswith("# ") and "::" in h), None)
        if title:
            sections[title] = "\n".join(body) + "\n"
    return sections


class FakeNvml:
    """NvmlApi over FakeDevice objects. Methods take a FakeDevice as the handle."""

    def __init__(
        self,
        devices: list[FakeDevice],
        driver_version: str = "",
        cuda_version: str = "",
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.devices = devices
        self._driver_version = driver_version
        self._cuda_version = cuda_version
        self.clock = clock
        self.sleep = sleep
        self.initialized = False
        # (uuid, seam method) -> (NVML error code, remaining count or None for always)
        self._errors: dict[tuple[str, str], tuple[int, int | None]] = {}
        self._events: deque[NvmlEvent] = deque()
        self._registered: dict[str, int] = {}
        # (GPU index, GPU index) -> nvmlGpuTopologyLevel_t / nvmlGpuP2PStatus_t, both orders
        self.topology_levels: dict[tuple[int, int], int] = {}
        self.p2p_read: dict[tuple[int, int], int] = {}
        # seam method -> number of calls, for tests and the CPU benchmark
        self.calls: dict[str, int] = {}

    # construction -------------------------------------------------------------------------

    @classmethod
    def from_gpus(
        cls,
        gpus: list[NvidiaSmiGpu],
        mig_names: dict[str, dict[int, tuple[str, str]]] | None = None,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
    ) -> FakeNvml:
        """Build from parsed GPUs; MIG_NAMES maps a GPU UUID to {MIG index: (profile, MIG UUID)}."""
        names = mig_names or {}
        devices = [_device_from_gpu(gpu, names.get(gpu.uuid, {})) for gpu in gpus]
        return cls(devices, gpus[0].driver_version, gpus[0].cuda_version, clock=clock, sleep=sleep)

    @classmethod
    def from_text(
        cls,
        raw: str,
        state: str = "load",
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
    ) -> FakeNvml:
        """Build from capture content (XML, `-q` text, or an nvidia_gpu_exporter capture)."""
        head = raw.lstrip()[:200]
        if head.startswith("<?xml") or "<nvidia_smi_log" in head:
            return cls.from_gpus(parse_nvidia_smi_xml(raw), clock=clock, sleep=sleep)
        if "# $ nvidia-smi -q" in raw:
            sections = split_exporter_capture(raw)
            query = sections.get(f"{state} :: query (-q)")
            if query is None:
                raise ParseError(f"capture has no '{state} :: query (-q)' section")
            gpus = parse_nvidia_smi_query(query)
            listing = sections.get("capabilities :: list (-L)")
            names: dict[str, dict[int, tuple[str, str]]] = {}
            if listing and listing.strip():
                for listed in parse_nvidia_smi_list(listing):
                    names[listed.uuid] = {
                        index: (profile, uuid) for index, profile, uuid in listed.mig_devices
                    }
            return cls.from_gpus(gpus, names, clock=clock, sleep=sleep)
        return cls.from_gpus(parse_nvidia_smi_query(raw), clock=clock, sleep=sleep)

    @classmethod
    def from_nvlink(
        cls,
        *captures: str,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
    ) -> FakeNvml:
        """GPUs as `nvidia-smi nvlink` captures of one node list them (index, name, UUID), with
        the links the captures show (load_nvlink). The captures show no PCI bus ids; `-R`
        names the far ends, which on a two-GPU node are the two GPUs' own ids; elsewhere each
        GPU gets a made-up one."""
        from slurmtel.parsers.nvlink import parse_nvlink

        listed: dict[int, tuple[str, str]] = {}
        remotes: dict[int, set[str]] = {}
        for capture in captures:
            for gpu in parse_nvlink(capture):
                listed.setdefault(gpu.index, (gpu.name, gpu.uuid))
                remotes.setdefault(gpu.index, set()).update(
                    link.remote_pci_bus_id for link in gpu.links.values() if link.remote_pci_bus_id
                )
        if not listed:
            raise ParseError("the nvlink captures name no GPU")
        indexes = sorted(listed)
        buses = {i: f"00000000:{0x18 + 0x10 * i:02X}:00.0" for i in indexes}
        if len(indexes) == 2 and all(len(remotes.get(i, ())) == 1 for i in indexes):
            first, second = indexes
            buses[second] = next(iter(remotes[first]))
            buses[first] = next(iter(remotes[second]))
        devices = [
            FakeDevice(uuid=listed[i][1], name=listed[i][0], index=n, pci_bus_id=buses[i])
            for n, i in enumerate(indexes)
        ]
        fake = cls(devices, clock=clock, sleep=sleep)
        for capture in captures:
            fake.load_nvlink(capture)
        return fake

    @classmethod
    def from_topology(
        cls,
        raw: str,
        name: str = "",
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
    ) -> FakeNvml:
        """The GPUs of an `nvidia-smi topo -m` capture (GPU0 ... with made-up UUIDs and PCI bus
        ids: the matrix shows neither), connected as it shows (load_topology)."""
        from slurmtel.parsers.topology import parse_topo_matrix

        (topology,) = parse_topo_matrix(raw, node="fake", observed_at=datetime.now(UTC))
        if not isinstance(topology, NodeTopology):
            raise ParseError(f"not a topology matrix: {topology.reason}")
        gpus = [d for d in topology.devices if d.startswith("GPU")]
        devices = [
            FakeDevice(
                uuid=f"GPU-{index:08x}-0000-0000-0000-000000000000",
                name=name,
                index=index,
                pci_bus_id=f"00000000:{0x18 + 0x10 * index:02X}:00.0",
            )
            for index in range(len(gpus))
        ]
        fake = cls(devices, clock=clock, sleep=sleep)
        fake.load_topology(raw)
        return fake

    @classmethod
    def from_capture(
        cls,
        path: str | Path,
        state: str = "load",
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
    ) -> FakeNvml:
        return cls.from_text(Path(path).read_text(errors="replace"), state=state, clock=clock, sleep=sleep)

    # scripting ----------------------------------------------------------------------------

    def device(self, uuid: str) -> FakeDevice:
        for gpu in self.devices:
            if gpu.uuid == uuid:
                return gpu
            for mig in gpu.mig_devices:
                if mig.uuid == uuid:
                    return mig
        raise KeyError(uuid)

    def all_devices(self) -> list[FakeDevice]:
        return [d for gpu in self.devices for d in (gpu, *gpu.mig_devices)]

    def set_utilization(self, uuid: str, fn: TimeFunction) -> None:
        self.device(uuid).utilization = fn

    def set_power(self, uuid: str, fn: TimeFunction) -> None:
        self.device(uuid).power_watts = fn

    def set_energy(self, uuid: str, fn: TimeFunction | None) -> None:
        """Script the total-energy counter (millijoules) directly, e.g. to test a reset."""
        self.device(uuid).energy_millijoules = fn

    def set_processes(self, uuid: str, fn: ProcessFunction) -> None:
        self.device(uuid).processes = fn

    def set_clocks_event_reasons(self, uuid: str, fn: ReasonsFunction) -> None:
        """Script the active clocks-event (throttle) reason bits (nvml.CLOCKS_EVENT_*)."""
        self.device(uuid).clocks_event_reasons = fn

    def set_pcie_throughput(self, uuid: str, fn: ThroughputFunction) -> None:
        """Script PCIe (tx, rx) KiB/s as a function of the fake clock."""
        self.device(uuid).pcie_kib_per_second = fn

    def set_nvlink_throughput(self, uuid: str, link: int, fn: ThroughputFunction) -> None:
        """Script a link's (data tx, data rx) KiB counters as a function of the fake clock."""
        self.device(uuid).nvlinks[link].throughput_kib = fn

    def set_nvlink_errors(self, uuid: str, link: int, fn: ErrorsFunction) -> None:
        self.device(uuid).nvlinks[link].errors = fn

    def load_nvlink(self, raw: str) -> None:
        """Give the GPUs the NVLinks an `nvidia-smi nvlink -s` / `-R` / `-gt d` / `-e` capture
        shows. A capture GPU is matched by UUID, else by index. Remote ends come from `-R`;
        without it, a 2-GPU node's links join the two GPUs (the only possible peer). Counters
        in the capture are the links' constant readings until scripted."""
        from slurmtel.parsers.nvlink import parse_nvlink

        by_uuid = {d.uuid: d for d in self.devices}
        for gpu in parse_nvlink(raw):
            device = by_uuid.get(gpu.uuid) or (
                self.devices[gpu.index] if gpu.index < len(self.devices) else None
            )
            if device is None:
                continue
            listed = [gpu.links[n] for n in sorted(gpu.links)]
            known_active = sorted(n for n, fake in device.nvlinks.items() if fake.active)
            remote_only = bool(listed) and all(x.remote_pci_bus_id and x.speed_gbps is None for x in listed)
            if remote_only and known_active and len(known_active) == len(listed):
                # `-R` numbers the active links 0, 1, ... in order, whatever their numbers
                for number, link in zip(known_active, listed, strict=True):
                    device.nvlinks[number].remote_pci_bus_id = link.remote_pci_bus_id
                continue
            for link in listed:
                fake = device.nvlinks.setdefault(link.link, FakeNvLink(link.link, link.active is not False))
                if link.active is not None:
                    fake.active = link.active
                if link.remote_pci_bus_id:
                    fake.remote_pci_bus_id = link.remote_pci_bus_id
                if link.data_tx_kib is not None or link.data_rx_kib is not None:
                    fake.throughput_kib = _constant_reading((link.data_tx_kib or 0, link.data_rx_kib or 0))
                if link.errors:
                    fake.errors = _constant_errors(dict(link.errors))
        if len(self.devices) == 2:
            first, second = self.devices
            for device, peer in ((first, second), (second, first)):
                for fake in device.nvlinks.values():
                    if fake.active and not fake.remote_pci_bus_id:
                        fake.remote_pci_bus_id = peer.pci_bus_id

    def load_topology(self, raw: str) -> None:
        """Answer topology questions as an `nvidia-smi topo -m` capture shows the GPUs.

        PCIe pairs (PIX ... SYS) become common-ancestor levels. NV<n> pairs become NVLinks
        where the GPUs have none yet: n links to the peer, or, when a GPU's NV pairs add up to
        more links than a GPU has, links to NVSwitches (then every pair is NV<n>). The capture
        does not say which PCIe path an NV pair also has: such pairs answer SYS.
        """
        from slurmtel.parsers.topology import parse_topo_matrix

        (topology,) = parse_topo_matrix(raw, node="fake", observed_at=datetime.now(UTC))
        if not isinstance(topology, NodeTopology):
            raise ParseError(f"not a topology matrix: {topology.reason}")
        gpus = [d for d in topology.devices if d.startswith("GPU")]
        nv_pairs: dict[int, list[tuple[int, int]]] = {}
        for link in topology.links:
            pair, kind = link.rsplit(":", 1)
            a, b = pair.split("-", 1)
            if a not in gpus or b not in gpus:
                continue
            i, j = int(a[3:]), int(b[3:])
            if kind.startswith("NV") and kind[2:].isdigit():
                level = _TOPOLOGY_LEVELS["SYS"]
                nv_pairs.setdefault(i, []).append((j, int(kind[2:])))
                nv_pairs.setdefault(j, []).append((i, int(kind[2:])))
            else:
                level = _TOPOLOGY_LEVELS.get(kind, _TOPOLOGY_LEVELS["SYS"])
            self.topology_levels[(i, j)] = self.topology_levels[(j, i)] = level
            self.p2p_read.setdefault((i, j), 0)
            self.p2p_read.setdefault((j, i), 0)
        for index, peers in nv_pairs.items():
            if index >= len(self.devices) or self.devices[index].nvlinks:
                continue
            device = self.devices[index]
            if sum(n for _, n in peers) > _MAX_NVLINKS:
                count = max(n for _, n in peers)
                device.nvlinks = {
                    n: FakeNvLink(n, True, f"00000000:{0xE0 + n % 16:02X}:00.0", "switch")
                    for n in range(count)
                }
                continue
            number = 0
            for peer, n in sorted(peers):
                bus = self.devices[peer].pci_bus_id if peer < len(self.devices) else ""
                for _ in range(n):
                    device.nvlinks[number] = FakeNvLink(number, True, bus, "gpu")
                    number += 1

    def inject_error(self, uuid: str, call: str, code: int = GPU_IS_LOST, count: int | None = None) -> None:
        """Make seam method CALL on device UUID raise NVML error CODE (COUNT times, or always)."""
        if call not in NVML_CALLS:
            raise ValueError(f"unknown NVML seam call {call!r}")
        self._errors[(uuid, call)] = (code, count)

    def clear_errors(self) -> None:
        self._errors.clear()

    def push_event(
        self,
        uuid: str,
        event_type: int,
        data: int = 0,
        gpu_instance_id: int | None = None,
        compute_instance_id: int | None = None,
    ) -> None:
        self._events.append(NvmlEvent(uuid, event_type, data, gpu_instance_id, compute_instance_id))

    # the seam -----------------------------------------------------------------------------

    def _check(self, call: str, device: FakeDevice | None = None) -> None:
        self.calls[call] = self.calls.get(call, 0) + 1
        if not self.initialized:
            raise NvmlError(NVML_CALLS[call], 1)
        if device is None:
            return
        injected = self._errors.get((device.uuid, call))
        if injected is None:
            return
        code, count = injected
        if count is not None:
            if count <= 1:
                del self._errors[(device.uuid, call)]
            else:
                self._errors[(device.uuid, call)] = (code, count - 1)
        raise NvmlError(NVML_CALLS[call], code)

    def _unsupported(self, call: str) -> NvmlError:
        return NvmlError(NVML_CALLS[call], NOT_SUPPORTED)

    def init(self) -> None:
        self.initialized = True

    def shutdown(self) -> None:
        self.initialized = False

    def driver_version(self) -> str:
        self._check("driver_version")
        return self._driver_version

    def cuda_driver_version(self) -> str:
        self._check("cuda_driver_version")
        return self._cuda_version

    def device_count(self) -> int:
        self._check("device_count")
        return len(self.devices)

    def device_handle(self, index: int) -> FakeDevice:
        self._check("device_handle")
        if not 0 <= index < len(self.devices):
            raise NvmlError(NVML_CALLS["device_handle"], INVALID_ARGUMENT)
        return self.devices[index]

    def uuid(self, handle: FakeDevice) -> str:
        self._check("uuid", handle)
        return handle.uuid

    def name(self, handle: FakeDevice) -> str:
        self._check("name", handle)
        return handle.name

    def minor_number(self, handle: FakeDevice) -> int:
        self._check("minor_number", handle)
        if handle.minor_number is None:
            raise self._unsupported("minor_number")
        return handle.minor_number

    def pci_bus_id(self, handle: FakeDevice) -> str:
        self._check("pci_bus_id", handle)
        return handle.pci_bus_id

    def vbios_version(self, handle: FakeDevice) -> str:
        self._check("vbios_version", handle)
        return handle.vbios_version

    def mig_mode(self, handle: FakeDevice) -> bool:
        self._check("mig_mode", handle)
        if handle.mig_enabled is None or handle.parent is not None:
            raise self._unsupported("mig_mode")
        return handle.mig_enabled

    def max_mig_device_count(self, handle: FakeDevice) -> int:
        self._check("max_mig_device_count", handle)
        if handle.mig_enabled is None:
            raise self._unsupported("max_mig_device_count")
        return 7

    def mig_device_handle(self, handle: FakeDevice, index: int) -> FakeDevice:
        self._check("mig_device_handle", handle)
        for mig in handle.mig_devices:
            if mig.index == index:
                return mig
        raise NvmlError(NVML_CALLS["mig_device_handle"], NOT_FOUND)

    def mig_attributes(self, handle: FakeDevice) -> MigAttributes:
        self._check("mig_attributes", handle)
        if handle.attributes is None:
            raise self._unsupported("mig_attributes")
        return handle.attributes

    def mig_instance_ids(self, handle: FakeDevice) -> tuple[int, int]:
        self._check("mig_instance_ids", handle)
        if handle.gpu_instance_id is None or handle.compute_instance_id is None:
            raise NvmlError(NVML_CALLS["mig_instance_ids"], INVALID_ARGUMENT)
        return handle.gpu_instance_id, handle.compute_instance_id

    def supports_gr_engine_active(self, handle: FakeDevice) -> bool:
        self._check("supports_gr_engine_active", handle)
        return handle.gr_engine_supported

    def gr_engine_active_percent(self, handle: FakeDevice) -> float | None:
        self._check("gr_engine_active_percent", handle)
        if not handle.gr_engine_supported:
            raise self._unsupported("gr_engine_active_percent")
        return handle.utilization(self.clock())

    def gpu_utilization_percent(self, handle: FakeDevice) -> float:
        self._check("gpu_utilization_percent", handle)
        # nvidia-smi shows N/A for a MIG-enabled GPU and its instances: NVML says NotSupported
        if handle.parent is not None or handle.mig_enabled:
            raise self._unsupported("gpu_utilization_percent")
        value = handle.utilization(self.clock())
        if value is None:
            raise self._unsupported("gpu_utilization_percent")
        return value

    def memory_info(self, handle: FakeDevice) -> tuple[int, int]:
        self._check("memory_info", handle)
        if handle.memory_total_bytes is None or handle.memory_used_bytes is None:
            raise self._unsupported("memory_info")
        return handle.memory_used_bytes, handle.memory_total_bytes

    def power_usage_milliwatts(self, handle: FakeDevice) -> int:
        self._check("power_usage_milliwatts", handle)
        watts = None if handle.parent is not None else handle.power_watts(self.clock())
        if watts is None:
            raise self._unsupported("power_usage_milliwatts")
        return round(watts * 1000)

    def power_limit_milliwatts(self, handle: FakeDevice) -> int:
        self._check("power_limit_milliwatts", handle)
        if handle.parent is not None or handle.power_limit_watts is None:
            raise self._unsupported("power_limit_milliwatts")
        return round(handle.power_limit_watts * 1000)

    def total_energy_millijoules(self, handle: FakeDevice) -> int:
        self._check("total_energy_millijoules", handle)
        if handle.parent is not None:
            raise self._unsupported("total_energy_millijoules")
        now = self.clock()
        if handle.energy_millijoules is not None:
            value = handle.energy_millijoules(now)
            if value is None:
                raise self._unsupported("total_energy_millijoules")
            return round(value)
        # integrate power (trapezoid) between reads
        watts = handle.power_watts(now)
        if watts is None:
            raise self._unsupported("total_energy_millijoules")
        if handle.energy_integral_t is not None and now > handle.energy_integral_t:
            before = handle.power_watts(handle.energy_integral_t)
            mean = watts if before is None else (before + watts) / 2
            handle.energy_integral_mj += mean * 1000 * (now - handle.energy_integral_t)
        handle.energy_integral_t = now
        return round(handle.energy_integral_mj)

    def temperature_celsius(self, handle: FakeDevice) -> int:
        self._check("temperature_celsius", handle)
        if handle.temperature_celsius is None or handle.parent is not None:
            raise self._unsupported("temperature_celsius")
        return round(handle.temperature_celsius)

    def sm_clock_mhz(self, handle: FakeDevice) -> int:
        self._check("sm_clock_mhz", handle)
        if handle.sm_clock_mhz is None or handle.parent is not None:
            raise self._unsupported("sm_clock_mhz")
        return round(handle.sm_clock_mhz)

    def ecc_volatile_counts(self, handle: FakeDevice) -> tuple[int, int]:
        self._check("ecc_volatile_counts", handle)
        if handle.ecc is None or handle.parent is not None:
            raise self._unsupported("ecc_volatile_counts")
        return handle.ecc

    def running_processes(self, handle: FakeDevice) -> list[GpuProcess]:
        self._check("running_processes", handle)
        now = self.clock()
        if handle.parent is None and handle.mig_devices:
            # a MIG-enabled GPU lists the processes of all its instances
            seen: dict[int, GpuProcess] = {p.pid: p for p in handle.processes(now)}
            for mig in handle.mig_devices:
                for proc in mig.processes(now):
                    seen.setdefault(proc.pid, proc)
            return list(seen.values())
        return handle.processes(now)

    def clocks_event_reasons(self, handle: FakeDevice) -> int:
        self._check("clocks_event_reasons", handle)
        value = None if handle.parent is not None else handle.clocks_event_reasons(self.clock())
        if value is None:
            raise self._unsupported("clocks_event_reasons")
        return value

    def pcie_throughput_kib_per_second(self, handle: FakeDevice) -> tuple[int, int]:
        self._check("pcie_throughput_kib_per_second", handle)
        value = None if handle.parent is not None else handle.pcie_kib_per_second(self.clock())
        if value is None:
            raise self._unsupported("pcie_throughput_kib_per_second")
        return value

    def supported_event_types(self, handle: FakeDevice) -> int:
        self._check("supported_event_types", handle)
        return EVENT_XID_CRITICAL | (EVENT_SINGLE_BIT_ECC | EVENT_DOUBLE_BIT_ECC if handle.ecc else 0)

    def event_set_create(self) -> object:
        self._check("event_set_create")
        return object()

    def register_events(self, handle: FakeDevice, event_types: int, event_set: object) -> None:
        self._check("register_events", handle)
        self._registered[handle.uuid] = event_types

    def event_wait(self, event_set: object, timeout_ms: int) -> NvmlEvent | None:
        self._check("event_wait")
        while self._events:
            event = self._events.popleft()
            if self._registered.get(event.gpu_uuid, 0) & event.event_type:
                return event
        if timeout_ms > 0:
            self.sleep(timeout_ms / 1000)
        return None

    def event_set_free(self, event_set: object) -> None:
        self._registered.clear()

    def _nvlink(self, call: str, handle: FakeDevice, link: int) -> FakeNvLink:
        self._check(call, handle)
        if not handle.nvlinks or handle.parent is not None:
            raise self._unsupported(call)
        fake = handle.nvlinks.get(link)
        if fake is None:
            raise NvmlError(NVML_CALLS[call], INVALID_ARGUMENT)
        return fake

    def nvlink_state(self, handle: FakeDevice, link: int) -> bool:
        return self._nvlink("nvlink_state", handle, link).active

    def nvlink_remote_pci_bus_id(self, handle: FakeDevice, link: int) -> str:
        fake = self._nvlink("nvlink_remote_pci_bus_id", handle, link)
        if not fake.active or not fake.remote_pci_bus_id:
            raise self._unsupported("nvlink_remote_pci_bus_id")
        return fake.remote_pci_bus_id

    def nvlink_remote_device_type(self, handle: FakeDevice, link: int) -> str:
        return self._nvlink("nvlink_remote_device_type", handle, link).remote_type

    def nvlink_error_counters(self, handle: FakeDevice, link: int) -> dict[str, int]:
        fake = self._nvlink("nvlink_error_counters", handle, link)
        counts = fake.errors(self.clock())
        if not counts:
            # what every NVLink GPU supports, at zero when the capture shows no counts
            return {"replay": 0, "recovery": 0, "crc_flit": 0, "crc_data": 0}
        return counts

    def nvlink_throughput_kib(self, handle: FakeDevice, link: int) -> tuple[int, int]:
        fake = self._nvlink("nvlink_throughput_kib", handle, link)
        reading = fake.throughput_kib(self.clock())
        if reading is None:
            raise self._unsupported("nvlink_throughput_kib")
        return reading

    def topology_common_ancestor(self, first: FakeDevice, second: FakeDevice) -> int:
        self._check("topology_common_ancestor", first)
        level = self.topology_levels.get((first.index, second.index))
        if level is None or first.parent is not None or second.parent is not None:
            raise self._unsupported("topology_common_ancestor")
        return level

    def p2p_read_status(self, first: FakeDevice, second: FakeDevice) -> int:
        self._check("p2p_read_status", first)
        status = self.p2p_read.get((first.index, second.index))
        if status is None:
            raise self._unsupported("p2p_read_status")
        return status
