"""Fabric counters on the node: InfiniBand / RoCE ports from sysfs, NVLinks through NVML.

Once per summary window the agent reads every counter and ships the increase since the last
read (records.PortCounters, records.NvlinkCounters). Counters are not all alike:

- InfiniBand's PortCounters error counters are 4 to 16 bits wide and *saturate*: they stop at
  their maximum instead of wrapping (a `link_downed` of 255 stays 255). A counter at its
  maximum is reported as saturated: its increase is a floor.
- The data and packet counters are 64-bit (PortCountersExtended, what the kernel shows when
  the HCA has it; `counters_ext/*_64` on mlx4) and wrap; a 32-bit one (an HCA without
  extended counters) saturates at 2^32-1.
- `hw_counters/*` (mlx5 queue counters: out_of_buffer, out_of_sequence, retransmissions, ...)
  are 32- or 64-bit, depending on the firmware; they wrap.

A counter that is lower than before wrapped if it was in the upper half of its width and the
wrapped increase is small; otherwise it was reset (cleared with perfquery -R, a driver reload,
a reboot) and its increase counts from zero. Either way nothing negative is ever shipped.

`sysfs_root` is configurable (`agent.sysfs_root`, like `agent.proc_root`), so tests read trees
built from real captures. The last readings are kept in the agent's spool with the records
they produced (one transaction), so a restart, even kill -9, neither loses nor repeats a window.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from slurmtel.agent.nvml import GPU_IS_LOST, INVALID_ARGUMENT, DeviceHandle, NvmlApi, NvmlError
from slurmtel.records import GpfsFsIo, NfsMountStats, NodeFsWindow, NvlinkCounters, PortCounters

log = logging.getLogger(__name__)

# IB PortCounters widths (IBA 1.3, table 247); all of these saturate
SATURATING_WIDTHS: Mapping[str, int] = {
    "symbol_error": 16,
    "link_error_recovery": 8,
    "link_downed": 8,
    "port_rcv_errors": 16,
    "port_rcv_remote_physical_errors": 16,
    "port_rcv_switch_relay_errors": 16,
    "port_xmit_discards": 16,
    "port_xmit_constraint_errors": 8,
    "port_rcv_constraint_errors": 8,
    "local_link_integrity_errors": 4,
    "excessive_buffer_overrun_errors": 4,
    "VL15_dropped": 16,
    "port_xmit_wait": 32,
}
# data and packet counters: 64-bit extended ones wrap, a value pinned at 2^32-1 is a 32-bit one saturated
DATA_COUNTERS = frozenset(
    {
        "port_xmit_data",
        "port_rcv_data",
        "port_xmit_packets",
        "port_rcv_packets",
        "unicast_xmit_packets",
        "unicast_rcv_packets",
        "multicast_xmit_packets",
        "multicast_rcv_packets",
        "port_rcv_discards",
    }
)
# hw_counters entries that are settings or gauges, not counters
NOT_COUNTERS = frozenset({"lifespan"})
_U32_MAX = 2**32 - 1
_STATE = re.compile(r"^\s*\d+:\s*(\S+)")
_RATE = re.compile(r"([\d.]+)\s*Gb/sec")
INFINIBAND = "class/infiniband"


# ---------------------------------------------------------------- counter arithmetic


@dataclass(frozen=True, slots=True)
class Increase:
    value: int
    reset: bool = False
    saturated: bool = False


def counter_increase(name: str, previous: int, current: int) -> Increase:
    """How much counter NAME grew from PREVIOUS to CURRENT (see the module docstring)."""
    width = SATURATING_WIDTHS.get(name)
    if width is not None:
        top = (1 << width) - 1
        if current < previous:
            return Increase(current, reset=True, saturated=current >= top)
        return Increase(current - previous, saturated=current >= top)
    if name in DATA_COUNTERS and current == _U32_MAX and previous <= current:
        return Increase(current - previous, saturated=True)
    if current >= previous:
        return Increase(current - previous)
    for bits in (32, 64):
        modulus = 1 << bits
        if previous < modulus and previous >= modulus >> 1:
            wrapped = current + modulus - previous
            if wrapped < modulus >> 2:
                return Increase(wrapped)
    return Increase(current, reset=True)


# ---------------------------------------------------------------- InfiniBand / RoCE from sysfs


@dataclass(frozen=True, slots=True)
class PortReading:
    device: str
    port: int
    link_layer: str
    state: str
    phys_state: str
    rate_gbps: float | None
    counters: dict[str, int]


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text(errors="replace").strip()
    except OSError:
        return None


def _read_counters(directory: Path, rename: Callable[[str], str] = lambda name: name) -> dict[str, int]:
    counters: dict[str, int] = {}
    try:
        entries = sorted(directory.iterdir())
    except OSError:
        return counters
    for entry in entries:
        if entry.name in NOT_COUNTERS:
            continue
        value = _read_text(entry)
        # "N/A (no PMA)": a driver without a performance management agent
        if value is not None and value.isdigit():
            counters[rename(entry.name)] = int(value)
    return counters


def _extended_name(name: str) -> str:
    """counters_ext (mlx4) -> the counters/ name: port_xmit_data_64 -> port_xmit_data,
    port_unicast_xmit_packets -> unicast_xmit_packets."""
    if name.endswith("_64"):
        return name[:-3]
    if name.startswith("port_unicast_") or name.startswith("port_multicast_"):
        return name[len("port_") :]
    return name


def read_infiniband(sysfs_root: str | Path) -> list[PortReading]:
    """Every port under SYSFS_ROOT/class/infiniband, with its counters as they are now."""
    base = Path(sysfs_root) / INFINIBAND
    readings: list[PortReading] = []
    try:
        devices = sorted(p for p in base.iterdir() if p.is_dir())
    except OSError:
        return readings
    for device in devices:
        try:
            ports = sorted(
                (p for p in (device / "ports").iterdir() if p.name.isdigit()), key=lambda p: int(p.name)
            )
        except OSError:
            continue
        for port in ports:
            counters = _read_counters(port / "counters")
            # 64-bit counters where the kernel has them apart (mlx4): they win
            counters.update(_read_counters(port / "counters_ext", _extended_name))
            for name, value in _read_counters(port / "hw_counters").items():
                counters.setdefault(name, value)
            rate = _RATE.search(_read_text(port / "rate") or "")
            readings.append(
                PortReading(
                    device=device.name,
                    port=int(port.name),
                    link_layer=_read_text(port / "link_layer") or "",
                    state=_state_word(_read_text(port / "state")),
                    phys_state=_state_word(_read_text(port / "phys_state")),
                    rate_gbps=float(rate.group(1)) if rate else None,
                    counters=counters,
                )
            )
    return readings


def _state_word(text: str | None) -> str:
    """ "4: ACTIVE" -> "ACTIVE", "5: LinkUp" -> "LinkUp"."""
    if not text:
        return ""
    m = _STATE.match(text)
    return m.group(1) if m else text.split()[0]


# ---------------------------------------------------------------- NVLinks through NVML


@dataclass(frozen=True, slots=True)
class NvlinkReading:
    gpu_uuid: str
    links_total: int
    links_active: int
    # "LINK:counter" -> value; counter is tx_kib, rx_kib or an NVLINK_ERROR_COUNTERS name
    counters: dict[str, int]


def read_nvlinks(
    nvml: NvmlApi,
    gpus: Iterable[tuple[str, DeviceHandle, list[int], int]],
    record_error: Callable[[str, NvmlError], None],
) -> list[NvlinkReading]:
    """The counters of each GPU's active links: GPUS are (uuid, handle, active links, links)."""
    readings = []
    for uuid, handle, active, total in gpus:
        counters: dict[str, int] = {}
        for link in active:
            try:
                tx, rx = nvml.nvlink_throughput_kib(handle, link)
                counters[f"{link}:tx_kib"], counters[f"{link}:rx_kib"] = tx, rx
            except NvmlError as exc:
                if not exc.not_supported:
                    record_error(uuid, exc)
                if exc.code == GPU_IS_LOST:
                    break
            try:
                for name, value in nvml.nvlink_error_counters(handle, link).items():
                    counters[f"{link}:{name}"] = value
            except NvmlError as exc:
                if not exc.not_supported and exc.code != INVALID_ARGUMENT:
                    record_error(uuid, exc)
        readings.append(NvlinkReading(uuid, total, len(active), counters))
    return readings


# ---------------------------------------------------------------- windows


@dataclass(frozen=True)
class FsReading:
    """One network file system client's cumulative counters on the node (read_bytes,
    write_bytes, read_ops, write_ops, read_rtt_ms, write_rtt_ms: those it has)."""

    filesystem: str
    fstype: str
    device: str
    counters: dict[str, int]


def nfs_reading(m: NfsMountStats) -> FsReading:
    """An NFS mount of /proc/self/mountstats (its mountpoint names it)."""
    values = {
        "read_bytes": m.read_bytes,
        "write_bytes": m.write_bytes,
        "read_ops": m.read_ops,
        "write_ops": m.write_ops,
        "read_rtt_ms": round(m.read_rtt_seconds * 1000) if m.read_rtt_seconds is not None else None,
        "write_rtt_ms": round(m.write_rtt_seconds * 1000) if m.write_rtt_seconds is not None else None,
    }
    return FsReading(m.mountpoint, m.fstype, m.device, {k: v for k, v in values.items() if v is not None})


def gpfs_reading(g: GpfsFsIo) -> FsReading:
    """A GPFS file system of mmpmon's fs_io_s (its name names it, its cluster is the device)."""
    counters = {
        "read_bytes": g.read_bytes,
        "write_bytes": g.write_bytes,
        "read_ops": g.reads,
        "write_ops": g.writes,
    }
    return FsReading(g.filesystem, "gpfs", g.cluster, counters)


@dataclass
class _Last:
    at: float
    counters: dict[str, int]


@dataclass
class FabricWindows:
    """Turns successive readings into per-window increases; its state survives restarts."""

    node: str
    window_seconds: float
    ports: dict[str, _Last] = field(default_factory=dict)
    nvlinks: dict[str, _Last] = field(default_factory=dict)
    # network file system clients by fstype:filesystem (NFS mounts, GPFS file systems)
    mounts: dict[str, _Last] = field(default_factory=dict)
    # a reading older than this is no baseline: the gap is unmeasured, not one long window
    max_gap_seconds: float = 3600.0

    def _window(self, last: _Last, now: float) -> tuple[datetime, float] | None:
        elapsed = now - last.at
        if elapsed <= 0 or elapsed > self.max_gap_seconds:
            return None
        start = last.at - last.at % self.window_seconds if self.window_seconds > 0 else last.at
        return datetime.fromtimestamp(start, UTC), round(elapsed, 3)

    def port_windows(self, readings: Iterable[PortReading], now: float) -> list[PortCounters]:
        records = []
        for r in readings:
            key = f"{r.device}/{r.port}"
            last = self.ports.get(key)
            self.ports[key] = _Last(now, dict(r.counters))
            if last is None or (window := self._window(last, now)) is None:
                continue
            deltas, resets, saturated = _increases(last.counters, r.counters)
            records.append(
                PortCounters(
                    node=self.node,
                    device=r.device,
                    port=r.port,
                    window_start_at=window[0],
                    window_seconds=window[1],
                    link_layer=r.link_layer,
                    state=r.state,
                    phys_state=r.phys_state,
                    rate_gbps=r.rate_gbps,
                    deltas=deltas,
                    resets=resets,
                    saturated=saturated,
                )
            )
        return records

    def nvlink_windows(self, readings: Iterable[NvlinkReading], now: float) -> list[NvlinkCounters]:
        records = []
        for r in readings:
            last = self.nvlinks.get(r.gpu_uuid)
            self.nvlinks[r.gpu_uuid] = _Last(now, dict(r.counters))
            if last is None or (window := self._window(last, now)) is None:
                continue
            deltas, resets, _ = _increases(last.counters, r.counters)
            tx = [v for k, v in deltas.items() if k.endswith(":tx_kib")]
            rx = [v for k, v in deltas.items() if k.endswith(":rx_kib")]
            errors: dict[str, int] = {}
            link_errors: dict[str, int] = {}
            for key, value in deltas.items():
                name = key.split(":", 1)[1]
                if name in ("tx_kib", "rx_kib"):
                    continue
                errors[name] = errors.get(name, 0) + value
                if value:
                    link_errors[key] = value
            records.append(
                NvlinkCounters(
                    node=self.node,
                    gpu_uuid=r.gpu_uuid,
                    window_start_at=window[0],
                    window_seconds=window[1],
                    links_active=r.links_active,
                    links_total=r.links_total,
                    tx_bytes=sum(tx) * 1024 if tx else None,
                    rx_bytes=sum(rx) * 1024 if rx else None,
                    errors=errors,
                    link_errors=link_errors,
                    resets=resets,
                )
            )
        return records

    def fs_windows(self, readings: list[FsReading], now: float) -> list[NodeFsWindow]:
        """Each network file system client's increases since its last reading (one seen first:
        none; a counter that went backwards, a remount or a GPFS restart: counted from zero).
        READINGS are all the node's (NFS and GPFS together): one missing has gone."""
        records = []
        for r in readings:
            key = f"{r.fstype}:{r.filesystem}"
            last = self.mounts.get(key)
            self.mounts[key] = _Last(now, dict(r.counters))
            if last is None or (window := self._window(last, now)) is None:
                continue
            up = {
                k: v - last.counters[k] if v >= last.counters[k] else v
                for k, v in r.counters.items()
                if k in last.counters
            }
            records.append(
                NodeFsWindow(
                    node=self.node, filesystem=r.filesystem, fstype=r.fstype, device=r.device,
                    window_start_at=window[0], window_seconds=window[1], read_bytes=up.get("read_bytes"),
                    write_bytes=up.get("write_bytes"), read_ops=up.get("read_ops"), write_ops=up.get("write_ops"),
                    read_rtt_seconds=up["read_rtt_ms"] / 1000 if "read_rtt_ms" in up else None,
                    write_rtt_seconds=up["write_rtt_ms"] / 1000 if "write_rtt_ms" in up else None,
                )
            )  # fmt: skip
        # one gone (unmounted) is no baseline for one mounted there later
        seen = {f"{r.fstype}:{r.filesystem}" for r in readings}
        for gone in [k for k in self.mounts if k not in seen]:
            del self.mounts[gone]
        return records

    def export_state(self) -> dict[str, Any]:
        def dump(items: dict[str, _Last]) -> dict[str, Any]:
            return {k: {"at": v.at, "counters": v.counters} for k, v in items.items()}

        return {"ports": dump(self.ports), "nvlinks": dump(self.nvlinks), "mounts": dump(self.mounts)}

    def restore_state(self, state: Any) -> None:
        """The readings a previous run left (a malformed state is ignored: one window lost)."""
        try:
            for target, name in ((self.ports, "ports"), (self.nvlinks, "nvlinks"), (self.mounts, "mounts")):
                # a state from before NFS mounts were read has none
                for key, value in state.get(name, {}).items() if name == "mounts" else state[name].items():
                    counters = {str(k): int(v) for k, v in value["counters"].items()}
                    target[str(key)] = _Last(float(value["at"]), counters)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            log.warning("fabric counter state from the spool is unreadable (%s): starting afresh", exc)
            self.ports.clear()
            self.nvlinks.clear()
            self.mounts.clear()


def _increases(
    previous: dict[str, int], current: dict[str, int]
) -> tuple[dict[str, int], tuple[str, ...], tuple[str, ...]]:
    deltas: dict[str, int] = {}
    resets: list[str] = []
    saturated: list[str] = []
    for name, value in sorted(current.items()):
        before = previous.get(name)
        if before is None:
            continue  # appeared during the window: its start is unknown
        increase = counter_increase(name.rsplit(":", 1)[-1], before, value)
        deltas[name] = increase.value
        if increase.reset:
            resets.append(name)
        if increase.saturated:
            saturated.append(name)
    return deltas, tuple(resets), tuple(saturated)
