"""Reads NVML through the seam: inventory, one sample per GPU per round, XID/ECC events.

Failure isolation: each NVML call is tried on its own. NotSupported leaves that metric None
and the call is not made again on that device. Any other error is recorded (metric counter by
call and error, the device's last error, one log line per device, call and error) and never
stops the other devices. A device whose utilisation or memory read fails, or that reports
GpuIsLost, yields no sample that round: its time is unmeasured, not guessed.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

from slurmtel.agent.metrics import AgentMetrics
from slurmtel.agent.nvml import (
    AGENT_EVENT_TYPES,
    EVENT_DOUBLE_BIT_ECC,
    EVENT_SINGLE_BIT_ECC,
    EVENT_XID_CRITICAL,
    GPU_IS_LOST,
    NOT_FOUND,
    DeviceHandle,
    NvmlApi,
    NvmlError,
)
from slurmtel.agent.procmap import JobMapper
from slurmtel.agent.summarize import GpuSample
from slurmtel.records import GpuEvent, GpuInventory

log = logging.getLogger(__name__)

GR_ENGINE_ACTIVE = "gr_engine_active"
GPU_UTIL = "gpu_util"
MIG_SLICES = 7
_MIG_PROFILE_IN_NAME = re.compile(r"\bMIG (\S+)\s*$")
_PROFILE_SLICES = re.compile(r"^(?:(\d+)c\.)?(\d+)g\.")

T = TypeVar("T")


class _DeviceLost(Exception):
    pass


@dataclass(eq=False)
class TrackedDevice:
    uuid: str
    handle: DeviceHandle
    index: int
    parent_uuid: str = ""
    # a GPU in MIG mode with instances: NVML lists their processes on it too, but they run on
    # the instances, which carry the job (the parent is never counted beside them)
    mig_parent: bool = False
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None
    util_metric: str = GPU_UTIL
    # seam calls that answered NotSupported on this device: not asked again
    unsupported: set[str] = field(default_factory=set)
    ecc_events_registered: bool = False
    last_ecc: tuple[int, int] | None = None
    # sampling rounds so far and the last PCIe reading (read every Sampler.pcie_every rounds)
    rounds: int = 0
    last_pcie: tuple[int, int] | None = None


def mig_fraction(
    compute_slices: int | None, profile: str, memory_bytes: int | None, parent_memory_bytes: int | None
) -> float:
    """Share of the parent GPU a MIG device is (DESIGN §4): compute slices / 7.

    Slices come from NVML's device attributes, else from the profile name ("3g.40gb",
    "1c.3g.71gb": 1 compute slice); when neither is known, the memory share.
    """
    if compute_slices:
        return compute_slices / MIG_SLICES
    match = _PROFILE_SLICES.match(profile)
    if match:
        return int(match.group(1) or match.group(2)) / MIG_SLICES
    if memory_bytes and parent_memory_bytes:
        return memory_bytes / parent_memory_bytes
    return 1.0


class Sampler:
    def __init__(
        self,
        nvml: NvmlApi,
        node: str,
        proc_root: str | Path = "/proc",
        metrics: AgentMetrics | None = None,
        clock: Callable[[], float] = time.time,
        pcie_every: int = 5,
        host_signals: bool = True,
    ) -> None:
        self.nvml = nvml
        self.pcie_every = max(1, int(pcie_every))
        # read throttle reasons and PCIe throughput (agent.host_signals)
        self.host_signals = host_signals
        self.node = node
        self.jobs = JobMapper(Path(proc_root))
        self.metrics = metrics
        self.clock = clock
        self.devices: list[TrackedDevice] = []
        # (uuid, NVML call, error name) -> count
        self.error_counts: dict[tuple[str, str, str], int] = {}
        self.last_error: dict[str, str] = {}
        self._logged: set[tuple[str, str, int]] = set()
        self._event_set: Any = None
        self._counter_events: list[GpuEvent] = []

    # errors -------------------------------------------------------------------------------

    def record_error(self, uuid: str, exc: NvmlError) -> None:
        key = (uuid, exc.call, exc.name)
        self.error_counts[key] = self.error_counts.get(key, 0) + 1
        self.last_error[uuid] = str(exc)
        if self.metrics is not None:
            self.metrics.nvml_errors.labels(call=exc.call, error=exc.name).inc()
        if (uuid, exc.call, exc.code) not in self._logged:
            self._logged.add((uuid, exc.call, exc.code))
            level = logging.DEBUG if exc.not_supported else logging.WARNING
            log.log(level, "NVML %s on %s: %s", exc.call, uuid or "the system", exc.message)

    def _read(self, device: TrackedDevice, call: str, func: Callable[[DeviceHandle], T]) -> T | None:
        if call in device.unsupported:
            return None
        try:
            return func(device.handle)
        except NvmlError as exc:
            self.record_error(device.uuid, exc)
            if exc.not_supported:
                device.unsupported.add(call)
                return None
            if exc.code == GPU_IS_LOST:
                raise _DeviceLost from exc
            raise

    def _optional(self, device: TrackedDevice, call: str, func: Callable[[DeviceHandle], T]) -> T | None:
        """A metric whose failure leaves it None (GpuIsLost still ends the device's round)."""
        try:
            return self._read(device, call, func)
        except NvmlError:
            return None

    # inventory ----------------------------------------------------------------------------

    def discover(self) -> list[GpuInventory]:
        """Enumerate GPUs and MIG instances; (re)builds the device list. Raises NvmlError only
        when the system-level calls fail (no driver): a failing device is skipped."""
        now = datetime.fromtimestamp(self.clock(), UTC)
        driver = self._system_call(self.nvml.driver_version, "")
        cuda = self._system_call(self.nvml.cuda_driver_version, "")
        count = self.nvml.device_count()
        devices: list[TrackedDevice] = []
        inventory: list[GpuInventory] = []
        for index in range(count):
            try:
                handle = self.nvml.device_handle(index)
                uuid = self.nvml.uuid(handle)
            except NvmlError as exc:
                self.record_error(f"index {index}", exc)
                continue
            device = TrackedDevice(uuid=uuid, handle=handle, index=index)
            try:
                record, migs = self._describe_gpu(device, now, driver, cuda)
            except (_DeviceLost, NvmlError):
                continue
            device.mig_parent = bool(migs)
            devices.append(device)
            inventory.append(record)
            for mig_device, mig_record in migs:
                devices.append(mig_device)
                inventory.append(mig_record)
        previous = {d.uuid: d for d in self.devices}
        for device in devices:
            self._choose_util_metric(device)
            known = previous.get(device.uuid)
            if known is not None:
                # what rounds learnt about the device survives a re-scan of an unchanged GPU
                device.unsupported |= known.unsupported
                device.ecc_events_registered = known.ecc_events_registered
                device.last_ecc = known.last_ecc
        self.devices = devices
        if self.metrics is not None:
            self.metrics.gpus.set(len(devices))
        return inventory

    def _system_call(self, func: Callable[[], str], default: str) -> str:
        try:
            return func()
        except NvmlError as exc:
            self.record_error("", exc)
            return default

    def _describe_gpu(
        self, device: TrackedDevice, now: datetime, driver: str, cuda: str
    ) -> tuple[GpuInventory, list[tuple[TrackedDevice, GpuInventory]]]:
        nv = self.nvml
        name = self._optional(device, "name", nv.name) or ""
        memory = self._optional(device, "memory_info", nv.memory_info)
        mig_enabled = self._optional(device, "mig_mode", nv.mig_mode)
        pci_bus_id = self._optional(device, "pci_bus_id", nv.pci_bus_id) or ""
        vbios = self._optional(device, "vbios_version", nv.vbios_version) or ""
        power_limit = self._optional(device, "power_limit_milliwatts", nv.power_limit_milliwatts)
        record = GpuInventory(
            node=self.node,
            gpu_uuid=device.uuid,
            index=device.index,
            model=name,
            observed_at=now,
            memory_total_bytes=memory[1] if memory else None,
            minor_number=self._optional(device, "minor_number", nv.minor_number),
            pci_bus_id=pci_bus_id,
            driver_version=driver,
            cuda_version=cuda,
            vbios_version=vbios,
            mig_mode="" if mig_enabled is None else ("enabled" if mig_enabled else "disabled"),
            power_limit_watts=None if power_limit is None else power_limit / 1000,
        )
        migs: list[tuple[TrackedDevice, GpuInventory]] = []
        if mig_enabled:
            slots = self._optional(device, "max_mig_device_count", nv.max_mig_device_count) or 0
            for slot in range(slots):
                try:
                    handle = nv.mig_device_handle(device.handle, slot)
                    mig_uuid = nv.uuid(handle)
                except NvmlError as exc:
                    if exc.code != NOT_FOUND:  # an empty slot is normal
                        self.record_error(device.uuid, exc)
                    continue
                mig = TrackedDevice(uuid=mig_uuid, handle=handle, index=slot, parent_uuid=device.uuid)
                ids = self._optional(mig, "mig_instance_ids", nv.mig_instance_ids)
                if ids is not None:
                    mig.gpu_instance_id, mig.compute_instance_id = ids
                migs.append((mig, self._describe_mig(mig, record, now)))
        return record, migs

    def _describe_mig(self, mig: TrackedDevice, parent: GpuInventory, now: datetime) -> GpuInventory:
        nv = self.nvml
        name = self._optional(mig, "name", nv.name) or parent.model
        memory = self._optional(mig, "memory_info", nv.memory_info)
        attributes = self._optional(mig, "mig_attributes", nv.mig_attributes)
        match = _MIG_PROFILE_IN_NAME.search(name)
        profile = match.group(1) if match else ""
        memory_total = memory[1] if memory else (attributes.memory_bytes if attributes else None)
        return GpuInventory(
            node=self.node,
            gpu_uuid=mig.uuid,
            index=mig.index,
            model=name,
            observed_at=now,
            memory_total_bytes=memory_total,
            minor_number=None,
            pci_bus_id=parent.pci_bus_id,
            driver_version=parent.driver_version,
            cuda_version=parent.cuda_version,
            vbios_version=parent.vbios_version,
            mig_mode="",
            parent_gpu_uuid=parent.gpu_uuid,
            mig_profile=profile,
            gpu_fraction=mig_fraction(
                attributes.compute_instance_slice_count if attributes else None,
                profile,
                memory_total,
                parent.memory_total_bytes,
            ),
        )

    def _choose_util_metric(self, device: TrackedDevice) -> None:
        try:
            supported = self._read(device, "supports_gr_engine_active", self.nvml.supports_gr_engine_active)
        except (_DeviceLost, NvmlError):
            supported = None
        device.util_metric = GR_ENGINE_ACTIVE if supported else GPU_UTIL
        if supported:
            # GPM needs a previous sample: take it now so the first round has a value
            self._optional(device, "gr_engine_active_percent", self.nvml.gr_engine_active_percent)

    # sampling -----------------------------------------------------------------------------

    def sample(self) -> list[GpuSample]:
        """One round: a GpuSample per device that answered."""
        samples = []
        on_gpus: set[int] = set()
        for device in self.devices:
            try:
                sample = self._sample_device(device, on_gpus)
            except _DeviceLost:
                sample = None
                if self.metrics is not None:
                    self.metrics.dropped_samples.labels(reason="gpu_lost").inc()
            except NvmlError:
                sample = None
                if self.metrics is not None:
                    self.metrics.dropped_samples.labels(reason="nvml_error").inc()
            if sample is not None:
                samples.append(sample)
        self.jobs.retain(on_gpus)
        if self.metrics is not None:
            self.metrics.samples.inc(len(samples))
            self.metrics.last_sample.set(self.clock())
        return samples

    def _utilisation(self, device: TrackedDevice) -> tuple[str, float | None]:
        nv = self.nvml
        if device.util_metric == GR_ENGINE_ACTIVE:
            value = self._read(device, "gr_engine_active_percent", nv.gr_engine_active_percent)
            if "gr_engine_active_percent" not in device.unsupported:
                return GR_ENGINE_ACTIVE, value
            log.info("%s: GPM stopped answering; utilisation falls back to gpu_util", device.uuid)
            device.util_metric = GPU_UTIL
        value = self._read(device, "gpu_utilization_percent", nv.gpu_utilization_percent)
        if value is not None and not 0 <= value <= 100:
            # out-of-range readings (4294967295 on some drivers) are not utilisation
            return GPU_UTIL, None
        return (GPU_UTIL, value) if value is not None else ("", None)

    def _sample_device(self, device: TrackedDevice, on_gpus: set[int]) -> GpuSample:
        nv = self.nvml
        metric, util = self._utilisation(device)
        memory = self._read(device, "memory_info", nv.memory_info)
        power = self._optional(device, "power_usage_milliwatts", nv.power_usage_milliwatts)
        energy = self._optional(device, "total_energy_millijoules", nv.total_energy_millijoules)
        temperature = self._optional(device, "temperature_celsius", nv.temperature_celsius)
        sm_clock = self._optional(device, "sm_clock_mhz", nv.sm_clock_mhz)
        ecc = self._optional(device, "ecc_volatile_counts", nv.ecc_volatile_counts)
        processes = self._optional(device, "running_processes", nv.running_processes)
        reasons = pcie = None
        if self.host_signals:
            reasons = self._optional(device, "clocks_event_reasons", nv.clocks_event_reasons)
            # NVML samples PCIe over 20 ms per call: read every pcie_every rounds, held between
            device.rounds += 1
            if device.rounds % self.pcie_every == 1 or self.pcie_every == 1:
                pcie = self._optional(
                    device, "pcie_throughput_kib_per_second", nv.pcie_throughput_kib_per_second
                )
                device.last_pcie = pcie
            elif "pcie_throughput_kib_per_second" not in device.unsupported:
                pcie = device.last_pcie
        job_ids: set[str] = set()
        if processes is not None:
            for proc in processes:
                on_gpus.add(proc.pid)
                job = None if device.mig_parent else self.jobs.job_id(proc.pid)
                if job is not None:
                    job_ids.add(job)
        if ecc is not None:
            self._ecc_from_counters(device, ecc)
        return GpuSample(
            gpu_uuid=device.uuid,
            util_metric=metric if util is not None else "",
            util_percent=util,
            memory_used_bytes=memory[0] if memory else None,
            memory_total_bytes=memory[1] if memory else None,
            power_watts=power / 1000 if power is not None else None,
            energy_counter_joules=energy / 1000 if energy is not None else None,
            temperature_celsius=float(temperature) if temperature is not None else None,
            sm_clock_mhz=float(sm_clock) if sm_clock is not None else None,
            ecc_corrected_volatile=ecc[0] if ecc else None,
            ecc_uncorrected_volatile=ecc[1] if ecc else None,
            process_count=len(processes) if processes is not None else None,
            job_ids=tuple(sorted(job_ids)),
            clocks_event_reasons=reasons,
            pcie_tx_kib_per_second=pcie[0] if pcie else None,
            pcie_rx_kib_per_second=pcie[1] if pcie else None,
        )

    # events -------------------------------------------------------------------------------

    def start_events(self) -> bool:
        """Register XID and ECC events on every GPU; False when NVML offers no event set."""
        self.stop_events()
        try:
            self._event_set = self.nvml.event_set_create()
        except NvmlError as exc:
            self.record_error("", exc)
            self._event_set = None
            return False
        for device in self.devices:
            if device.parent_uuid:
                continue  # events are registered on the GPU; MIG events carry instance ids
            try:
                supported = self.nvml.supported_event_types(device.handle)
            except NvmlError as exc:
                self.record_error(device.uuid, exc)
                supported = AGENT_EVENT_TYPES
            mask = AGENT_EVENT_TYPES & supported
            if not mask:
                continue
            try:
                self.nvml.register_events(device.handle, mask, self._event_set)
            except NvmlError as exc:
                self.record_error(device.uuid, exc)
                continue
            device.ecc_events_registered = bool(mask & (EVENT_SINGLE_BIT_ECC | EVENT_DOUBLE_BIT_ECC))
        return True

    @property
    def events_enabled(self) -> bool:
        return self._event_set is not None

    def stop_events(self) -> None:
        if self._event_set is not None:
            try:
                self.nvml.event_set_free(self._event_set)
            except NvmlError as exc:
                self.record_error("", exc)
            self._event_set = None
        for device in self.devices:
            device.ecc_events_registered = False

    def wait_events(self, timeout_ms: int) -> list[GpuEvent]:
        """Wait up to TIMEOUT_MS for an event, then take whatever else is queued."""
        if self._event_set is None:
            return []
        events: list[GpuEvent] = []
        wait = timeout_ms
        while len(events) < 1000:
            try:
                raw = self.nvml.event_wait(self._event_set, wait)
            except NvmlError as exc:
                self.record_error("", exc)
                break
            if raw is None:
                break
            wait = 0
            event = self._event_record(
                raw.gpu_uuid, raw.event_type, raw.data, raw.gpu_instance_id, raw.compute_instance_id
            )
            if event is not None:
                events.append(event)
        return events

    def _event_record(
        self, uuid: str, event_type: int, data: int, gi: int | None, ci: int | None
    ) -> GpuEvent | None:
        at = datetime.fromtimestamp(self.clock(), UTC)
        target = uuid
        detail = ""
        if gi is not None:
            detail = f"gpu_instance_id={gi} compute_instance_id={ci}"
            for device in self.devices:
                if (
                    device.parent_uuid == uuid
                    and device.gpu_instance_id == gi
                    and (ci is None or device.compute_instance_id in (None, ci))
                ):
                    target = device.uuid
                    break
        if event_type & EVENT_XID_CRITICAL:
            return GpuEvent(self.node, target, at, "xid", int(data), detail)
        if event_type & EVENT_DOUBLE_BIT_ECC:
            return GpuEvent(self.node, target, at, "ecc_double_bit", 1, detail or "nvml event")
        if event_type & EVENT_SINGLE_BIT_ECC:
            return GpuEvent(self.node, target, at, "ecc_single_bit", 1, detail or "nvml event")
        return None

    def _ecc_from_counters(self, device: TrackedDevice, ecc: tuple[int, int]) -> None:
        previous, device.last_ecc = device.last_ecc, ecc
        if previous is None or device.ecc_events_registered:
            return
        # no ECC events from NVML on this device: a growing volatile counter is the event
        corrected, uncorrected = ecc[0] - previous[0], ecc[1] - previous[1]
        at = datetime.fromtimestamp(self.clock(), UTC)
        if corrected > 0:
            self._counter_events.append(
                GpuEvent(self.node, device.uuid, at, "ecc_single_bit", corrected, "volatile ECC counter")
            )
        if uncorrected > 0:
            self._counter_events.append(
                GpuEvent(self.node, device.uuid, at, "ecc_double_bit", uncorrected, "volatile ECC counter")
            )

    def take_counter_events(self) -> list[GpuEvent]:
        """ECC events derived from counters during sample() (devices without ECC events)."""
        events, self._counter_events = self._counter_events, []
        return events
