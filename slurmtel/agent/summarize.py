"""Window summaries of per-GPU samples: the pure part of the agent.

`WindowSummarizer` is fed `(timestamp, GpuSample)` tuples (timestamps in epoch seconds, from
a clock outside it) and returns a `GpuSummary` for each window that can no longer change.

Time accounting. Sample i at t_i stands for the interval (t_{i-1}, t_i] since the GPU's
previous sample: NVML's utilisation, the GPM counters and the energy counter all describe the
time since the last read. An interval longer than `2 * sample_interval_seconds` is a gap: it
is not covered, nothing is attributed to it, and the next interval starts at its end. An
interval that straddles a window boundary is split at the boundary. Windows are
[k * window, (k+1) * window) in epoch seconds, so every agent's windows line up.

Per window: sample_count counts samples whose timestamp lies in the window; covered, idle
(utilisation below the threshold) and no-process seconds are sums of interval lengths;
means are time-weighted and maxima taken over the intervals inside the window (a sample
after a gap stands for no interval: it is counted, and only starts the next interval).
Energy: the total-energy counter's delta over each interval (pro-rated when split); where the
counter is missing or went backwards (driver reload, reset) the interval uses power x length
instead, and the window's energy_method says "power_integral".
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from slurmtel.records import GpuHostWindow, GpuSummary

# nvmlClocksEventReason* bits (slurmtel.agent.nvml has the same; this module imports no NVML)
_POWER_BITS = 0x4 | 0x80  # SW power cap, HW power brake
_THERMAL_BITS = 0x20 | 0x40  # SW and HW thermal slowdown
_HW_SLOWDOWN_BIT = 0x8

SOURCE = "agent"


@dataclass(frozen=True, slots=True)
class GpuSample:
    """What the agent read from one GPU (or MIG instance) at one moment."""

    gpu_uuid: str
    # "gr_engine_active" or "gpu_util"; "" with util_percent None when neither was readable
    util_metric: str = ""
    util_percent: float | None = None
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    power_watts: float | None = None
    # the total-energy counter (nvmlDeviceGetTotalEnergyConsumption) in joules
    energy_counter_joules: float | None = None
    temperature_celsius: float | None = None
    sm_clock_mhz: float | None = None
    ecc_corrected_volatile: int | None = None
    ecc_uncorrected_volatile: int | None = None
    # processes on the GPU; None when they could not be read
    process_count: int | None = None
    job_ids: tuple[str, ...] = ()
    # NVML clocks-event (throttle) reason bits; None when not readable
    clocks_event_reasons: int | None = None
    # PCIe throughput (KiB/s); None when not read this round
    pcie_tx_kib_per_second: int | None = None
    pcie_rx_kib_per_second: int | None = None


@dataclass(slots=True)
class _Window:
    start: float
    sample_count: int = 0
    covered: float = 0.0
    util_metric: str = ""
    util_seconds: float = 0.0
    util_weighted: float = 0.0
    util_max: float | None = None
    idle: float = 0.0
    process_known_seconds: float = 0.0
    no_process: float = 0.0
    memory_seconds: float = 0.0
    memory_weighted: float = 0.0
    memory_max: int | None = None
    memory_total: int | None = None
    power_seconds: float = 0.0
    power_weighted: float = 0.0
    energy: float = 0.0
    energy_counter_used: bool = False
    energy_power_used: bool = False
    temperature_max: float | None = None
    sm_clock_max: float | None = None
    job_ids: set[str] = field(default_factory=set)
    # host side of the GPU: seconds with known throttle reasons, and of those throttled by each
    reasons_seconds: float = 0.0
    throttle_power: float = 0.0
    throttle_thermal: float = 0.0
    throttle_hw_slowdown: float = 0.0
    pcie_seconds: float = 0.0
    pcie_tx_bytes: float = 0.0
    pcie_rx_bytes: float = 0.0

    def to_state(self) -> dict[str, Any]:
        state = {name: getattr(self, name) for name in self.__slots__}
        state["job_ids"] = sorted(self.job_ids)
        return state

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> _Window:
        values = dict(state)
        values["job_ids"] = set(values.get("job_ids", ()))
        return cls(**values)


@dataclass(slots=True)
class _Gpu:
    last_t: float | None = None
    last_energy: float | None = None
    window: _Window | None = None


def _max(current: float | None, value: float | None) -> float | None:
    if value is None:
        return current
    return value if current is None or value > current else current


class WindowSummarizer:
    """Per-GPU window accumulators. Not thread-safe: one sampling loop feeds it."""

    def __init__(
        self,
        node: str,
        window_seconds: float = 30.0,
        sample_interval_seconds: float = 1.0,
        idle_threshold_percent: float = 5.0,
    ) -> None:
        if window_seconds <= 0 or sample_interval_seconds <= 0:
            raise ValueError("window and sample interval must be positive")
        self.node = node
        self.window_seconds = float(window_seconds)
        self.max_gap_seconds = 2.0 * sample_interval_seconds
        self.idle_threshold_percent = idle_threshold_percent
        self._gpus: dict[str, _Gpu] = {}
        # GpuHostWindow of windows closed since take_host_windows()
        self._host: list[GpuHostWindow] = []
        # samples refused because their timestamp was not after the GPU's previous one
        self.out_of_order = 0
        # times the clock went back by more than a gap (the GPU's account restarted)
        self.clock_resets = 0

    def window_start(self, t: float) -> float:
        return math.floor(t / self.window_seconds) * self.window_seconds

    def add(self, t: float, sample: GpuSample) -> list[GpuSummary]:
        """Account one sample; returns the summaries of windows this sample closed."""
        gpu = self._gpus.setdefault(sample.gpu_uuid, _Gpu())
        closed: list[GpuSummary] = []
        if gpu.last_t is not None and t <= gpu.last_t:
            if gpu.last_t - t <= self.max_gap_seconds:
                # a duplicate or a small step back: keep the earlier account, count the refusal
                self.out_of_order += 1
                return []
            # the wall clock was set back: refusing samples until it catches up would leave
            # the GPU unmeasured for that long; send the open window and start again
            self.clock_resets += 1
            if gpu.window is not None:
                closed.append(self._summary(sample.gpu_uuid, gpu.window))
            gpu.window = None
            gpu.last_t = None
        start = gpu.last_t
        gap = start is None or t - start > self.max_gap_seconds
        if not gap and start is not None:
            energy_delta, energy_from_counter = self._energy(gpu, start, t, sample)
            length = t - start
            a = start
            while a < t:
                window = self._window_for(gpu, sample.gpu_uuid, a, closed)
                b = min(t, window.start + self.window_seconds)
                share = (b - a) / length
                self._account(
                    window,
                    sample,
                    b - a,
                    energy_delta * share if energy_delta is not None else None,
                    energy_from_counter,
                )
                a = b
        window = self._window_for(gpu, sample.gpu_uuid, t, closed)
        window.sample_count += 1
        window.job_ids.update(sample.job_ids)
        if sample.memory_total_bytes is not None:
            window.memory_total = sample.memory_total_bytes
        gpu.last_t = t
        # a missing reading breaks the counter chain: the next interval falls back to power
        # rather than attributing two intervals' energy to one (and double counting)
        gpu.last_energy = sample.energy_counter_joules
        return closed

    def _energy(self, gpu: _Gpu, start: float, t: float, sample: GpuSample) -> tuple[float | None, bool]:
        """Energy of (start, t] in joules and whether the counter gave it."""
        if sample.energy_counter_joules is not None and gpu.last_energy is not None:
            delta = sample.energy_counter_joules - gpu.last_energy
            if delta >= 0:
                return delta, True
        if sample.power_watts is not None:
            return sample.power_watts * (t - start), False
        return None, False

    def _window_for(self, gpu: _Gpu, uuid: str, t: float, closed: list[GpuSummary]) -> _Window:
        start = self.window_start(t)
        if gpu.window is not None and gpu.window.start != start:
            closed.append(self._summary(uuid, gpu.window))
            gpu.window = None
        if gpu.window is None:
            gpu.window = _Window(start=start)
        return gpu.window

    def _account(
        self,
        window: _Window,
        sample: GpuSample,
        seconds: float,
        energy: float | None,
        energy_from_counter: bool,
    ) -> None:
        window.covered += seconds
        if sample.util_percent is not None and sample.util_metric:
            if not window.util_metric:
                window.util_metric = sample.util_metric
            # a window keeps one metric; a sample of another one (a device that lost GPM
            # mid-window) counts as covered with unknown utilisation
            if sample.util_metric == window.util_metric:
                window.util_seconds += seconds
                window.util_weighted += sample.util_percent * seconds
                window.util_max = _max(window.util_max, sample.util_percent)
                if sample.util_percent < self.idle_threshold_percent:
                    window.idle += seconds
        if sample.process_count is not None:
            window.process_known_seconds += seconds
            if sample.process_count == 0:
                window.no_process += seconds
        if sample.memory_used_bytes is not None:
            window.memory_seconds += seconds
            window.memory_weighted += sample.memory_used_bytes * seconds
            if window.memory_max is None or sample.memory_used_bytes > window.memory_max:
                window.memory_max = sample.memory_used_bytes
        if sample.memory_total_bytes is not None:
            window.memory_total = sample.memory_total_bytes
        window.temperature_max = _max(window.temperature_max, sample.temperature_celsius)
        window.sm_clock_max = _max(window.sm_clock_max, sample.sm_clock_mhz)
        window.job_ids.update(sample.job_ids)
        if sample.clocks_event_reasons is not None:
            bits = sample.clocks_event_reasons
            window.reasons_seconds += seconds
            if bits & _POWER_BITS:
                window.throttle_power += seconds
            if bits & _THERMAL_BITS:
                window.throttle_thermal += seconds
            if bits & _HW_SLOWDOWN_BIT:
                window.throttle_hw_slowdown += seconds
        if sample.pcie_tx_kib_per_second is not None and sample.pcie_rx_kib_per_second is not None:
            window.pcie_seconds += seconds
            window.pcie_tx_bytes += sample.pcie_tx_kib_per_second * 1024.0 * seconds
            window.pcie_rx_bytes += sample.pcie_rx_kib_per_second * 1024.0 * seconds
        if sample.power_watts is not None:
            window.power_seconds += seconds
            window.power_weighted += sample.power_watts * seconds
        if energy is not None:
            window.energy += energy
            if energy_from_counter:
                window.energy_counter_used = True
            else:
                window.energy_power_used = True

    def _summary(self, uuid: str, w: _Window) -> GpuSummary:
        if w.reasons_seconds > 0 or w.pcie_seconds > 0:
            self._host.append(self._host_window(uuid, w))
        has_energy = w.energy_counter_used or w.energy_power_used
        return GpuSummary(
            source=SOURCE,
            node=self.node,
            gpu_uuid=uuid,
            window_start_at=datetime.fromtimestamp(w.start, UTC),
            window_seconds=self.window_seconds,
            util_metric=w.util_metric,
            sample_count=w.sample_count,
            covered_seconds=round(w.covered, 6),
            util_mean_percent=round(w.util_weighted / w.util_seconds, 6) if w.util_seconds > 0 else None,
            util_max_percent=w.util_max,
            idle_seconds=round(w.idle, 6),
            no_process_seconds=round(w.no_process, 6) if w.process_known_seconds > 0 else None,
            memory_used_mean_bytes=round(w.memory_weighted / w.memory_seconds)
            if w.memory_seconds > 0
            else None,
            memory_used_max_bytes=w.memory_max,
            memory_total_bytes=w.memory_total,
            power_mean_watts=round(w.power_weighted / w.power_seconds, 6) if w.power_seconds > 0 else None,
            energy_joules=round(w.energy, 6) if has_energy else None,
            energy_method=("power_integral" if w.energy_power_used else "counter") if has_energy else "",
            temperature_max_celsius=w.temperature_max,
            sm_clock_max_mhz=w.sm_clock_max,
            job_ids=tuple(sorted(w.job_ids, key=_job_sort_key)),
        )

    def _host_window(self, uuid: str, w: _Window) -> GpuHostWindow:
        reasons = w.reasons_seconds > 0
        # PCIe is read every few rounds: the bytes of the covered seconds it was read in,
        # scaled to the window's covered seconds (a rate held between reads)
        scale = w.covered / w.pcie_seconds if w.pcie_seconds > 0 else 0.0
        return GpuHostWindow(
            node=self.node,
            gpu_uuid=uuid,
            window_start_at=datetime.fromtimestamp(w.start, UTC),
            window_seconds=self.window_seconds,
            pcie_tx_bytes=round(w.pcie_tx_bytes * scale) if w.pcie_seconds > 0 else None,
            pcie_rx_bytes=round(w.pcie_rx_bytes * scale) if w.pcie_seconds > 0 else None,
            throttle_power_seconds=round(w.throttle_power, 6) if reasons else None,
            throttle_thermal_seconds=round(w.throttle_thermal, 6) if reasons else None,
            throttle_hw_slowdown_seconds=round(w.throttle_hw_slowdown, 6) if reasons else None,
            job_ids=tuple(sorted(w.job_ids, key=_job_sort_key)),
        )

    def take_host_windows(self) -> list[GpuHostWindow]:
        """The GPUs' host-side windows (throttling, PCIe) closed since the last call."""
        host, self._host = self._host, []
        return host

    def flush(self, now: float) -> list[GpuSummary]:
        """Close windows no future sample can reach: those ending more than a gap before NOW.

        Called by the sampling loop so a GPU that stopped answering still has its window sent.
        """
        closed = []
        for uuid, gpu in self._gpus.items():
            w = gpu.window
            if w is not None and w.start + self.window_seconds + self.max_gap_seconds < now:
                closed.append(self._summary(uuid, w))
                gpu.window = None
        return closed

    def close_all(self) -> list[GpuSummary]:
        """Summaries of every open window as it stands (used when the agent stops for good)."""
        closed = [self._summary(uuid, gpu.window) for uuid, gpu in self._gpus.items() if gpu.window]
        for gpu in self._gpus.values():
            gpu.window = None
        return closed

    def export_state(self) -> dict[str, Any]:
        """Open windows and each GPU's last sample, to resume after a clean restart."""
        return {
            "window_seconds": self.window_seconds,
            "gpus": {
                uuid: {
                    "last_t": gpu.last_t,
                    "last_energy": gpu.last_energy,
                    "window": gpu.window.to_state() if gpu.window else None,
                }
                for uuid, gpu in self._gpus.items()
            },
        }

    def restore_state(self, state: dict[str, Any], now: float) -> list[GpuSummary]:
        """Resume from export_state(); windows that ended meanwhile are returned closed."""
        if float(state.get("window_seconds", 0)) != self.window_seconds:
            # the window length changed: the saved windows do not fit; send them as they are
            saved_seconds = float(state.get("window_seconds", 0))
            closed = []
            for uuid, saved in state.get("gpus", {}).items():
                if saved.get("window"):
                    summary = self._summary(uuid, _Window.from_state(saved["window"]))
                    closed.append(dataclasses.replace(summary, window_seconds=saved_seconds))
            return closed
        for uuid, saved in state.get("gpus", {}).items():
            self._gpus[uuid] = _Gpu(
                last_t=saved.get("last_t"),
                last_energy=saved.get("last_energy"),
                window=_Window.from_state(saved["window"]) if saved.get("window") else None,
            )
        return self.flush(now)


def _job_sort_key(job_id: str) -> tuple[int, str]:
    return (int(job_id), job_id) if job_id.isdigit() else (2**63, job_id)
