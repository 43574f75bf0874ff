"""A node's GPU topology from NVML, worded as `nvidia-smi topo -m` words it.

For each pair of GPUs: NV<n> when n of their NVLinks join them (directly, or both through
NVSwitches: then n is the smaller number of switch links), else the PCIe level of their
closest common ancestor (nvmlDeviceGetTopologyCommonAncestor: PIX, PXB, PHB, NODE, SYS).
Peer-to-peer read support (nvmlDeviceGetP2PStatus) is kept per ordered pair. The record is
the same shape the `topo -m` parser makes (slurmtel.parsers.topology), so drift compares the
two alike.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from slurmtel.agent.nvml import (
    INVALID_ARGUMENT,
    NVLINK_MAX_LINKS,
    P2P_STATUS_WORDS,
    TOPOLOGY_WORDS,
    DeviceHandle,
    NvmlApi,
    NvmlError,
)
from slurmtel.parsers.topology import topology_summary
from slurmtel.records import NodeTopology

NVML_SOURCE = "nvml"


@dataclass
class GpuLinks:
    """What discovery found about one GPU's NVLinks."""

    uuid: str
    handle: DeviceHandle
    index: int
    pci_bus_id: str
    # link number -> active
    links: dict[int, bool] = field(default_factory=dict)
    # active link -> (remote PCI bus id, remote type)
    remote: dict[int, tuple[str, str]] = field(default_factory=dict)

    @property
    def active(self) -> list[int]:
        return sorted(n for n, up in self.links.items() if up)


def discover_nvlinks(
    nvml: NvmlApi, uuid: str, handle: DeviceHandle, index: int, pci_bus_id: str,
    record_error: Callable[[str, NvmlError], None],
) -> GpuLinks:  # fmt: skip
    """The GPU's links (a GPU without NVLink answers NotSupported: no links)."""
    found = GpuLinks(uuid, handle, index, pci_bus_id.upper())
    for link in range(NVLINK_MAX_LINKS):
        try:
            up = nvml.nvlink_state(handle, link)
        except NvmlError as exc:
            if exc.not_supported and link == 0:
                break
            if exc.code == INVALID_ARGUMENT or exc.not_supported:
                continue  # no such link on this GPU
            record_error(uuid, exc)
            break
        found.links[link] = up
        if not up:
            continue
        try:
            remote = nvml.nvlink_remote_pci_bus_id(handle, link).upper()
        except NvmlError as exc:
            if not exc.not_supported:
                record_error(uuid, exc)
            remote = ""
        try:
            kind = nvml.nvlink_remote_device_type(handle, link)
        except NvmlError as exc:
            if not exc.not_supported:
                record_error(uuid, exc)
            kind = "unknown"
        found.remote[link] = (remote, kind)
    return found


def nvml_topology(
    nvml: NvmlApi,
    node: str,
    gpus: Sequence[GpuLinks],
    observed_at: datetime,
    record_error: Callable[[str, NvmlError], None],
) -> NodeTopology:
    ordered = sorted(gpus, key=lambda g: g.index)
    names = [f"GPU{g.index}" for g in ordered]
    links: list[str] = []
    p2p: list[str] = []
    for i, a in enumerate(ordered):
        for b in ordered[i + 1 :]:
            links.append(f"GPU{a.index}-GPU{b.index}:{_pair_kind(nvml, a, b, record_error)}")
    for a in ordered:
        for b in ordered:
            if a is b:
                continue
            try:
                status = nvml.p2p_read_status(a.handle, b.handle)
            except NvmlError as exc:
                if not exc.not_supported:
                    record_error(a.uuid, exc)
                continue
            p2p.append(f"GPU{a.index}-GPU{b.index}:{P2P_STATUS_WORDS.get(status, 'unknown')}")
    return NodeTopology(
        node=node,
        observed_at=observed_at,
        source=NVML_SOURCE,
        devices=tuple(names),
        links=tuple(links),
        summary=topology_summary(len(ordered), links),
        gpu_uuids=tuple(g.uuid for g in ordered),
        p2p=tuple(p2p),
    )


def _pair_kind(
    nvml: NvmlApi, a: GpuLinks, b: GpuLinks, record_error: Callable[[str, NvmlError], None]
) -> str:
    direct = sum(1 for remote, _ in a.remote.values() if remote and remote == b.pci_bus_id)
    if direct:
        return f"NV{direct}"
    a_switch = sum(1 for _, kind in a.remote.values() if kind == "switch")
    b_switch = sum(1 for _, kind in b.remote.values() if kind == "switch")
    if a_switch and b_switch:
        return f"NV{min(a_switch, b_switch)}"
    try:
        level = nvml.topology_common_ancestor(a.handle, b.handle)
    except NvmlError as exc:
        if not exc.not_supported:
            record_error(a.uuid, exc)
        return "unknown"
    return TOPOLOGY_WORDS.get(level, "SYS" if level > 50 else "unknown")
