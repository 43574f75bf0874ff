"""The NVML seam: every NVML call the agent makes goes through `NvmlApi`.

`Nvml` implements it with nvidia-ml-py (`pynvml`), imported lazily in `init()` so that
importing slurmtel.agent needs neither the package nor a GPU; it is the only place in
slurmtel that imports pynvml. `slurmtel.agent.fake_nvml.FakeNvml` implements the same
interface from real nvidia-smi captures for tests and demos.

Every failure surfaces as `NvmlError(call, code)`, where `call` is the NVML function name and
`code` NVML's nvmlReturn_t value, so the agent handles real and fake errors alike.

Utilisation. DCGM's GR_ENGINE_ACTIVE has no NVML field value: nvidia-ml-py 13.615 has no
`NVML_FI_PROF_GR_ENGINE_ACTIVE` (its field ids end at NVML_FI_MAX = 308 without one). NVML
exposes the same counter through GPM (GPU Performance Monitoring, Hopper and newer):
`NVML_GPM_METRIC_GRAPHICS_UTIL`, "percentage of time any compute/graphics app was active on
the GPU", computed from two GPM samples (`nvmlGpmSampleGet`, `nvmlGpmMigSampleGet` for a MIG
GPU instance, `nvmlGpmMetricsGet`). `gr_engine_active_percent` returns it; devices without GPM
fall back to `nvmlDeviceGetUtilizationRates().gpu`.
"""

from __future__ import annotations

import contextlib
import ctypes
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

# nvmlReturn_t values (nvml.h); the fake raises the same codes
UNINITIALIZED = 1
INVALID_ARGUMENT = 2
NOT_SUPPORTED = 3
NO_PERMISSION = 4
NOT_FOUND = 6
DRIVER_NOT_LOADED = 9
TIMEOUT = 10
LIBRARY_NOT_FOUND = 12
FUNCTION_NOT_FOUND = 13
GPU_IS_LOST = 15
NO_DATA = 21
UNKNOWN = 999

ERROR_NAMES = {
    UNINITIALIZED: "Uninitialized",
    INVALID_ARGUMENT: "InvalidArgument",
    NOT_SUPPORTED: "NotSupported",
    NO_PERMISSION: "NoPermission",
    NOT_FOUND: "NotFound",
    DRIVER_NOT_LOADED: "DriverNotLoaded",
    TIMEOUT: "Timeout",
    LIBRARY_NOT_FOUND: "LibraryNotFound",
    FUNCTION_NOT_FOUND: "FunctionNotFound",
    GPU_IS_LOST: "GpuIsLost",
    NO_DATA: "NoData",
    UNKNOWN: "Unknown",
}

# nvmlEventType* bits (nvml.h)
EVENT_SINGLE_BIT_ECC = 0x1
EVENT_DOUBLE_BIT_ECC = 0x2
EVENT_XID_CRITICAL = 0x8
AGENT_EVENT_TYPES = EVENT_XID_CRITICAL | EVENT_SINGLE_BIT_ECC | EVENT_DOUBLE_BIT_ECC

# NVML reports "no MIG instance" in event data as 0xFFFFFFFF
_NO_INSTANCE = 0xFFFFFFFF

# NVLink (nvml.h): links a device can have (36 in nvidia-ml-py 13; a device answers
# InvalidArgument or NotSupported for links it does not have), the DL error counters, the
# remote device types, field ids of the throughput counters (KiB)
NVLINK_MAX_LINKS = 36
NVLINK_ERROR_COUNTERS = {"replay": 0, "recovery": 1, "crc_flit": 2, "crc_data": 3, "ecc_data": 4}
NVLINK_REMOTE_TYPES = {0: "gpu", 1: "ibmnpu", 2: "switch"}
FI_NVLINK_THROUGHPUT_DATA_TX = 138
FI_NVLINK_THROUGHPUT_DATA_RX = 139
# nvmlGpuTopologyLevel_t and how `nvidia-smi topo -m` words each level
TOPOLOGY_WORDS = {0: "X", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}
P2P_CAPS_INDEX_READ = 0
P2P_STATUS_WORDS = {
    0: "ok",
    1: "chipset_not_supported",
    2: "gpu_not_supported",
    3: "topology_not_supported",
    4: "disabled_by_regkey",
    5: "not_supported",
}

DeviceHandle = Any
EventSet = Any


# nvmlClocksEventReason* bits (formerly nvmlClocksThrottleReason*)
CLOCKS_EVENT_SW_POWER_CAP = 0x4
CLOCKS_EVENT_HW_SLOWDOWN = 0x8
CLOCKS_EVENT_SW_THERMAL = 0x20
CLOCKS_EVENT_HW_THERMAL = 0x40
CLOCKS_EVENT_HW_POWER_BRAKE = 0x80
CLOCKS_EVENT_POWER = CLOCKS_EVENT_SW_POWER_CAP | CLOCKS_EVENT_HW_POWER_BRAKE
CLOCKS_EVENT_THERMAL = CLOCKS_EVENT_SW_THERMAL | CLOCKS_EVENT_HW_THERMAL
# nvmlPcieUtilCounter_t
_PCIE_TX_BYTES = 0
_PCIE_RX_BYTES = 1


class NvmlError(Exception):
    """An NVML call failed; `code` is NVML's nvmlReturn_t."""

    def __init__(self, call: str, code: int, message: str = "") -> None:
        self.call = call
        self.code = code
        self.message = message or ERROR_NAMES.get(code, f"NVML error {code}")
        super().__init__(f"{call}: {self.message}")

    @property
    def name(self) -> str:
        return ERROR_NAMES.get(self.code, f"Code{self.code}")

    @property
    def not_supported(self) -> bool:
        """The device cannot do this at all: the metric stays None, nothing is wrong."""
        return self.code in (NOT_SUPPORTED, FUNCTION_NOT_FOUND)


@dataclass(frozen=True, slots=True)
class GpuProcess:
    pid: int
    used_memory_bytes: int | None = None
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None


@dataclass(frozen=True, slots=True)
class MigAttributes:
    """nvmlDeviceGetAttributes_v2 of a MIG device."""

    gpu_instance_slice_count: int
    compute_instance_slice_count: int
    multiprocessor_count: int
    memory_bytes: int


@dataclass(frozen=True, slots=True)
class NvmlEvent:
    gpu_uuid: str
    event_type: int
    # XID number for EVENT_XID_CRITICAL
    data: int
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None


class NvmlApi(Protocol):
    """What the agent needs from NVML. Each method raises NvmlError on failure."""

    def init(self) -> None: ...
    def shutdown(self) -> None: ...
    def driver_version(self) -> str: ...
    # "12.4" (nvmlSystemGetCudaDriverVersion_v2)
    def cuda_driver_version(self) -> str: ...
    def device_count(self) -> int: ...
    def device_handle(self, index: int) -> DeviceHandle: ...
    def uuid(self, handle: DeviceHandle) -> str: ...
    def name(self, handle: DeviceHandle) -> str: ...
    def minor_number(self, handle: DeviceHandle) -> int: ...
    def pci_bus_id(self, handle: DeviceHandle) -> str: ...
    def vbios_version(self, handle: DeviceHandle) -> str: ...
    # current MIG mode: True enabled, False disabled; NotSupported on GPUs without MIG
    def mig_mode(self, handle: DeviceHandle) -> bool: ...
    def max_mig_device_count(self, handle: DeviceHandle) -> int: ...
    # NotFound for an empty slot
    def mig_device_handle(self, handle: DeviceHandle, index: int) -> DeviceHandle: ...
    def mig_attributes(self, handle: DeviceHandle) -> MigAttributes: ...
    # (GPU instance id, compute instance id) of a MIG device
    def mig_instance_ids(self, handle: DeviceHandle) -> tuple[int, int]: ...
    def supports_gr_engine_active(self, handle: DeviceHandle) -> bool: ...
    # None until two GPM samples exist (the first call only takes a sample)
    def gr_engine_active_percent(self, handle: DeviceHandle) -> float | None: ...
    def gpu_utilization_percent(self, handle: DeviceHandle) -> float: ...
    # (used, total)
    def memory_info(self, handle: DeviceHandle) -> tuple[int, int]: ...
    def power_usage_milliwatts(self, handle: DeviceHandle) -> int: ...
    def power_limit_milliwatts(self, handle: DeviceHandle) -> int: ...
    def total_energy_millijoules(self, handle: DeviceHandle) -> int: ...
    def temperature_celsius(self, handle: DeviceHandle) -> int: ...
    def sm_clock_mhz(self, handle: DeviceHandle) -> int: ...
    # volatile (since driver load) ECC error counts: (corrected, uncorrected)
    def ecc_volatile_counts(self, handle: DeviceHandle) -> tuple[int, int]: ...
    # compute and graphics processes, each pid once
    def running_processes(self, handle: DeviceHandle) -> list[GpuProcess]: ...
    # the clocks-event (throttle) reason bits active now (CLOCKS_EVENT_*)
    def clocks_event_reasons(self, handle: DeviceHandle) -> int: ...
    # PCIe (tx, rx) throughput in KiB/s over NVML's last 20 ms sample
    def pcie_throughput_kib_per_second(self, handle: DeviceHandle) -> tuple[int, int]: ...
    def supported_event_types(self, handle: DeviceHandle) -> int: ...
    def event_set_create(self) -> EventSet: ...
    def register_events(self, handle: DeviceHandle, event_types: int, event_set: EventSet) -> None: ...
    # None when nothing arrived within timeout_ms
    def event_wait(self, event_set: EventSet, timeout_ms: int) -> NvmlEvent | None: ...
    def event_set_free(self, event_set: EventSet) -> None: ...
    # NVLink, per link: InvalidArgument or NotSupported for a link the device does not have
    def nvlink_state(self, handle: DeviceHandle, link: int) -> bool: ...
    # PCI bus id of the device at the other end ("00000000:D5:00.0"; an NVSwitch's own id)
    def nvlink_remote_pci_bus_id(self, handle: DeviceHandle, link: int) -> str: ...
    # "gpu", "switch", "ibmnpu" or "unknown"
    def nvlink_remote_device_type(self, handle: DeviceHandle, link: int) -> str: ...
    # the DL error counters the link supports (NVLINK_ERROR_COUNTERS names -> count)
    def nvlink_error_counters(self, handle: DeviceHandle, link: int) -> dict[str, int]: ...
    # payload KiB sent and received since the driver loaded (NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_*)
    def nvlink_throughput_kib(self, handle: DeviceHandle, link: int) -> tuple[int, int]: ...
    # nvmlGpuTopologyLevel_t of the closest common ancestor of two GPUs (TOPOLOGY_WORDS)
    def topology_common_ancestor(self, first: DeviceHandle, second: DeviceHandle) -> int: ...
    # nvmlGpuP2PStatus_t of peer-to-peer reads from FIRST to SECOND
    def p2p_read_status(self, first: DeviceHandle, second: DeviceHandle) -> int: ...


T = TypeVar("T")


def cuda_version_string(version: int) -> str:
    """NVML's CUDA driver version integer (12040) as "12.4"."""
    return f"{version // 1000}.{(version % 1000) // 10}"


class Nvml:
    """NvmlApi on the real library (nvidia-ml-py)."""

    def __init__(self) -> None:
        self._nv: Any = None
        # previous GPM sample per device, keyed by handle address
        self._gpm_previous: dict[int, Any] = {}

    def _call(self, call: str, func: Callable[..., T], *args: Any) -> T:
        nv = self._nv
        if nv is None:
            raise NvmlError(call, UNINITIALIZED)
        try:
            return func(*args)
        except nv.NVMLError as exc:
            raise NvmlError(call, int(exc.value), str(exc)) from exc
        except AttributeError as exc:
            # an nvidia-ml-py older than the call (e.g. no GPM before 12.535): not supported
            raise NvmlError(call, FUNCTION_NOT_FOUND, f"not in this nvidia-ml-py: {exc}") from exc

    def init(self) -> None:
        try:
            import pynvml
        except ImportError as exc:  # the [nvml] extra is not installed
            raise NvmlError(
                "import pynvml", LIBRARY_NOT_FOUND, f"nvidia-ml-py is not installed: {exc}"
            ) from exc
        self._nv = pynvml
        self._call("nvmlInit", pynvml.nvmlInit)

    def shutdown(self) -> None:
        nv = self._nv
        if nv is None:
            return
        for sample in self._gpm_previous.values():
            with contextlib.suppress(nv.NVMLError):
                nv.nvmlGpmSampleFree(sample)
        self._gpm_previous.clear()
        self._call("nvmlShutdown", nv.nvmlShutdown)
        self._nv = None

    def driver_version(self) -> str:
        return str(self._call("nvmlSystemGetDriverVersion", lambda: self._nv.nvmlSystemGetDriverVersion()))

    def cuda_driver_version(self) -> str:
        version = self._call(
            "nvmlSystemGetCudaDriverVersion_v2", lambda: self._nv.nvmlSystemGetCudaDriverVersion_v2()
        )
        return cuda_version_string(int(version))

    def device_count(self) -> int:
        return int(self._call("nvmlDeviceGetCount", lambda: self._nv.nvmlDeviceGetCount()))

    def device_handle(self, index: int) -> DeviceHandle:
        return self._call("nvmlDeviceGetHandleByIndex", lambda: self._nv.nvmlDeviceGetHandleByIndex(index))

    def uuid(self, handle: DeviceHandle) -> str:
        return str(self._call("nvmlDeviceGetUUID", lambda: self._nv.nvmlDeviceGetUUID(handle)))

    def name(self, handle: DeviceHandle) -> str:
        return str(self._call("nvmlDeviceGetName", lambda: self._nv.nvmlDeviceGetName(handle)))

    def minor_number(self, handle: DeviceHandle) -> int:
        return int(self._call("nvmlDeviceGetMinorNumber", lambda: self._nv.nvmlDeviceGetMinorNumber(handle)))

    def pci_bus_id(self, handle: DeviceHandle) -> str:
        info = self._call("nvmlDeviceGetPciInfo", lambda: self._nv.nvmlDeviceGetPciInfo(handle))
        return str(info.busId)

    def vbios_version(self, handle: DeviceHandle) -> str:
        return str(
            self._call("nvmlDeviceGetVbiosVersion", lambda: self._nv.nvmlDeviceGetVbiosVersion(handle))
        )

    def mig_mode(self, handle: DeviceHandle) -> bool:
        current, _pending = self._call("nvmlDeviceGetMigMode", lambda: self._nv.nvmlDeviceGetMigMode(handle))
        return bool(current == self._nv.NVML_DEVICE_MIG_ENABLE)

    def max_mig_device_count(self, handle: DeviceHandle) -> int:
        return int(
            self._call(
                "nvmlDeviceGetMaxMigDeviceCount", lambda: self._nv.nvmlDeviceGetMaxMigDeviceCount(handle)
            )
        )

    def mig_device_handle(self, handle: DeviceHandle, index: int) -> DeviceHandle:
        return self._call(
            "nvmlDeviceGetMigDeviceHandleByIndex",
            lambda: self._nv.nvmlDeviceGetMigDeviceHandleByIndex(handle, index),
        )

    def mig_attributes(self, handle: DeviceHandle) -> MigAttributes:
        attrs = self._call("nvmlDeviceGetAttributes_v2", lambda: self._nv.nvmlDeviceGetAttributes_v2(handle))
        return MigAttributes(
            gpu_instance_slice_count=int(attrs.gpuInstanceSliceCount),
            compute_instance_slice_count=int(attrs.computeInstanceSliceCount),
            multiprocessor_count=int(attrs.multiprocessorCount),
            memory_bytes=int(attrs.memorySizeMB) * 1024 * 1024,
        )

    def mig_instance_ids(self, handle: DeviceHandle) -> tuple[int, int]:
        nv = self._nv
        gi = self._call("nvmlDeviceGetGpuInstanceId", lambda: nv.nvmlDeviceGetGpuInstanceId(handle))
        ci = self._call("nvmlDeviceGetComputeInstanceId", lambda: nv.nvmlDeviceGetComputeInstanceId(handle))
        return int(gi), int(ci)

    def _is_mig(self, handle: DeviceHandle) -> bool:
        try:
            return bool(self._nv.nvmlDeviceIsMigDeviceHandle(handle))
        except self._nv.NVMLError:
            return False

    def _gpm_sample(self, handle: DeviceHandle, sample: Any) -> None:
        nv = self._nv
        if self._is_mig(handle):
            parent = self._call(
                "nvmlDeviceGetDeviceHandleFromMigDeviceHandle",
                lambda: nv.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(handle),
            )
            instance = self._call("nvmlDeviceGetGpuInstanceId", lambda: nv.nvmlDeviceGetGpuInstanceId(handle))
            self._call("nvmlGpmMigSampleGet", lambda: nv.nvmlGpmMigSampleGet(parent, instance, sample))
        else:
            self._call("nvmlGpmSampleGet", lambda: nv.nvmlGpmSampleGet(handle, sample))

    def supports_gr_engine_active(self, handle: DeviceHandle) -> bool:
        nv = self._nv
        target = handle
        if self._is_mig(handle):
            target = self._call(
                "nvmlDeviceGetDeviceHandleFromMigDeviceHandle",
                lambda: nv.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(handle),
            )
        support = self._call("nvmlGpmQueryDeviceSupport", lambda: nv.nvmlGpmQueryDeviceSupport(target))
        return bool(support.isSupportedDevice)

    def gr_engine_active_percent(self, handle: DeviceHandle) -> float | None:
        nv = self._nv
        key = int(ctypes.cast(handle, ctypes.c_void_p).value or 0)
        sample = self._call("nvmlGpmSampleAlloc", lambda: nv.nvmlGpmSampleAlloc())
        try:
            self._gpm_sample(handle, sample)
        except NvmlError:
            self._free_gpm_sample(sample)
            raise
        previous = self._gpm_previous.get(key)
        self._gpm_previous[key] = sample
        if previous is None:
            return None
        try:
            return self._call("nvmlGpmMetricsGet", self._graphics_util, previous, sample)
        finally:
            self._free_gpm_sample(previous)

    def _graphics_util(self, first: Any, second: Any) -> float:
        nv = self._nv
        request = nv.c_nvmlGpmMetricsGet_t()
        request.version = nv.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = 1
        request.sample1 = first
        request.sample2 = second
        request.metrics[0].metricId = nv.NVML_GPM_METRIC_GRAPHICS_UTIL
        nv.nvmlGpmMetricsGet(request)
        metric = request.metrics[0]
        if metric.nvmlReturn != 0:
            raise NvmlError("nvmlGpmMetricsGet", int(metric.nvmlReturn))
        return float(metric.value)

    def _free_gpm_sample(self, sample: Any) -> None:
        with contextlib.suppress(self._nv.NVMLError, AttributeError):
            self._nv.nvmlGpmSampleFree(sample)

    def gpu_utilization_percent(self, handle: DeviceHandle) -> float:
        rates = self._call(
            "nvmlDeviceGetUtilizationRates", lambda: self._nv.nvmlDeviceGetUtilizationRates(handle)
        )
        return float(rates.gpu)

    def memory_info(self, handle: DeviceHandle) -> tuple[int, int]:
        info = self._call("nvmlDeviceGetMemoryInfo", lambda: self._nv.nvmlDeviceGetMemoryInfo(handle))
        return int(info.used), int(info.total)

    def power_usage_milliwatts(self, handle: DeviceHandle) -> int:
        return int(self._call("nvmlDeviceGetPowerUsage", lambda: self._nv.nvmlDeviceGetPowerUsage(handle)))

    def power_limit_milliwatts(self, handle: DeviceHandle) -> int:
        """The power cap in force (what nvidia-smi shows as Current Power Limit)."""
        return int(
            self._call(
                "nvmlDeviceGetEnforcedPowerLimit", lambda: self._nv.nvmlDeviceGetEnforcedPowerLimit(handle)
            )
        )

    def total_energy_millijoules(self, handle: DeviceHandle) -> int:
        return int(
            self._call(
                "nvmlDeviceGetTotalEnergyConsumption",
                lambda: self._nv.nvmlDeviceGetTotalEnergyConsumption(handle),
            )
        )

    def temperature_celsius(self, handle: DeviceHandle) -> int:
        nv = self._nv
        return int(
            self._call(
                "nvmlDeviceGetTemperature",
                lambda: nv.nvmlDeviceGetTemperature(handle, nv.NVML_TEMPERATURE_GPU),
            )
        )

    def sm_clock_mhz(self, handle: DeviceHandle) -> int:
        nv = self._nv
        return int(
            self._call("nvmlDeviceGetClockInfo", lambda: nv.nvmlDeviceGetClockInfo(handle, nv.NVML_CLOCK_SM))
        )

    def ecc_volatile_counts(self, handle: DeviceHandle) -> tuple[int, int]:
        nv = self._nv

        def count(kind: int) -> int:
            return int(
                self._call(
                    "nvmlDeviceGetTotalEccErrors",
                    lambda: nv.nvmlDeviceGetTotalEccErrors(handle, kind, nv.NVML_VOLATILE_ECC),
                )
            )

        return count(nv.NVML_MEMORY_ERROR_TYPE_CORRECTED), count(nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED)

    def running_processes(self, handle: DeviceHandle) -> list[GpuProcess]:
        nv = self._nv
        found: dict[int, GpuProcess] = {}
        for call, func in (
            ("nvmlDeviceGetComputeRunningProcesses", nv.nvmlDeviceGetComputeRunningProcesses),
            ("nvmlDeviceGetGraphicsRunningProcesses", nv.nvmlDeviceGetGraphicsRunningProcesses),
        ):
            for proc in self._call(call, func, handle):
                gi = getattr(proc, "gpuInstanceId", _NO_INSTANCE)
                ci = getattr(proc, "computeInstanceId", _NO_INSTANCE)
                found.setdefault(
                    int(proc.pid),
                    GpuProcess(
                        pid=int(proc.pid),
                        used_memory_bytes=None if proc.usedGpuMemory is None else int(proc.usedGpuMemory),
                        gpu_instance_id=None if gi == _NO_INSTANCE else int(gi),
                        compute_instance_id=None if ci == _NO_INSTANCE else int(ci),
                    ),
                )
        return list(found.values())

    def supported_event_types(self, handle: DeviceHandle) -> int:
        return int(
            self._call(
                "nvmlDeviceGetSupportedEventTypes", lambda: self._nv.nvmlDeviceGetSupportedEventTypes(handle)
            )
        )

    def event_set_create(self) -> EventSet:
        return self._call("nvmlEventSetCreate", lambda: self._nv.nvmlEventSetCreate())

    def register_events(self, handle: DeviceHandle, event_types: int, event_set: EventSet) -> None:
        self._call(
            "nvmlDeviceRegisterEvents",
            lambda: self._nv.nvmlDeviceRegisterEvents(handle, event_types, event_set),
        )

    def event_wait(self, event_set: EventSet, timeout_ms: int) -> NvmlEvent | None:
        nv = self._nv
        try:
            data = self._call("nvmlEventSetWait_v2", lambda: nv.nvmlEventSetWait_v2(event_set, timeout_ms))
        except NvmlError as exc:
            if exc.code == TIMEOUT:
                return None
            raise
        uuid = self.uuid(data.device)
        gi = int(data.gpuInstanceId)
        ci = int(data.computeInstanceId)
        return NvmlEvent(
            gpu_uuid=uuid,
            event_type=int(data.eventType),
            data=int(data.eventData),
            gpu_instance_id=None if gi == _NO_INSTANCE else gi,
            compute_instance_id=None if ci == _NO_INSTANCE else ci,
        )

    def event_set_free(self, event_set: EventSet) -> None:
        self._call("nvmlEventSetFree", lambda: self._nv.nvmlEventSetFree(event_set))

    def nvlink_state(self, handle: DeviceHandle, link: int) -> bool:
        nv = self._nv
        state = self._call("nvmlDeviceGetNvLinkState", lambda: nv.nvmlDeviceGetNvLinkState(handle, link))
        return bool(state == nv.NVML_FEATURE_ENABLED)

    def nvlink_remote_pci_bus_id(self, handle: DeviceHandle, link: int) -> str:
        info = self._call(
            "nvmlDeviceGetNvLinkRemotePciInfo_v2",
            lambda: self._nv.nvmlDeviceGetNvLinkRemotePciInfo(handle, link),
        )
        bus = info.busId
        return (bus.decode() if isinstance(bus, bytes) else str(bus)).upper()

    def nvlink_remote_device_type(self, handle: DeviceHandle, link: int) -> str:
        kind = self._call(
            "nvmlDeviceGetNvLinkRemoteDeviceType",
            lambda: self._nv.nvmlDeviceGetNvLinkRemoteDeviceType(handle, link),
        )
        return NVLINK_REMOTE_TYPES.get(int(kind), "unknown")

    def nvlink_error_counters(self, handle: DeviceHandle, link: int) -> dict[str, int]:
        nv = self._nv
        counts: dict[str, int] = {}
        for name, counter in NVLINK_ERROR_COUNTERS.items():
            try:
                counts[name] = int(
                    self._call(
                        "nvmlDeviceGetNvLinkErrorCounter",
                        nv.nvmlDeviceGetNvLinkErrorCounter,
                        handle,
                        link,
                        counter,
                    )
                )
            except NvmlError as exc:
                if not exc.not_supported:
                    raise
        if not counts:
            raise NvmlError("nvmlDeviceGetNvLinkErrorCounter", NOT_SUPPORTED)
        return counts

    def clocks_event_reasons(self, handle: DeviceHandle) -> int:
        nv = self._nv
        current = (
            getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None)
            or nv.nvmlDeviceGetCurrentClocksThrottleReasons
        )
        return int(self._call("nvmlDeviceGetCurrentClocksEventReasons", lambda: current(handle)))

    def pcie_throughput_kib_per_second(self, handle: DeviceHandle) -> tuple[int, int]:
        nv = self._nv
        tx = self._call(
            "nvmlDeviceGetPcieThroughput", lambda: nv.nvmlDeviceGetPcieThroughput(handle, _PCIE_TX_BYTES)
        )
        rx = self._call(
            "nvmlDeviceGetPcieThroughput", lambda: nv.nvmlDeviceGetPcieThroughput(handle, _PCIE_RX_BYTES)
        )
        return int(tx), int(rx)

    def nvlink_throughput_kib(self, handle: DeviceHandle, link: int) -> tuple[int, int]:
        nv = self._nv
        values = self._call(
            "nvmlDeviceGetFieldValues",
            lambda: nv.nvmlDeviceGetFieldValues(
                handle, [(FI_NVLINK_THROUGHPUT_DATA_TX, link), (FI_NVLINK_THROUGHPUT_DATA_RX, link)]
            ),
        )
        result = []
        for value in values:
            if int(value.nvmlReturn) != 0:
                raise NvmlError("nvmlDeviceGetFieldValues", int(value.nvmlReturn))
            result.append(int(value.value.ullVal))
        return result[0], result[1]

    def topology_common_ancestor(self, first: DeviceHandle, second: DeviceHandle) -> int:
        return int(
            self._call(
                "nvmlDeviceGetTopologyCommonAncestor",
                lambda: self._nv.nvmlDeviceGetTopologyCommonAncestor(first, second),
            )
        )

    def p2p_read_status(self, first: DeviceHandle, second: DeviceHandle) -> int:
        # nvidia-ml-py 13 defines NVML_P2P_CAPS_INDEX_READ as a tuple: the number is used
        return int(
            self._call(
                "nvmlDeviceGetP2PStatus",
                lambda: self._nv.nvmlDeviceGetP2PStatus(first, second, P2P_CAPS_INDEX_READ),
            )
        )
