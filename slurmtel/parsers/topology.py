"""`nvidia-smi topo -m` (the GPU topology matrix) -> NodeTopology, and the matrix in words.

The matrix names how each pair of devices (GPUs, NICs) is connected: `NV<n>` a bonded set of
n NVLinks, `PIX` at most one PCIe bridge, `PXB` several PCIe bridges, `PHB` a PCIe host bridge,
`NODE` host bridges within a NUMA node, `SYS` the SMP interconnect between NUMA nodes, `X` the
device itself. nvidia-smi separates cells with TABs; copies pasted from terminals have spaces,
and some drivers underline the header with ANSI escapes; affinity cells can be empty. All of
these read the same. The agent builds the same record from NVML (slurmtel.agent.topology),
so a node's topology compares the same way whichever produced it.

Pure: text in, records out.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Sequence
from datetime import datetime

from slurmtel.records import NodeTopology, Rejected

SOURCE = "topology"
TOPO_MATRIX = "topo-matrix"

# what each connection kind means, as nvidia-smi's legend says it
KIND_WORDS = {
    "PIX": "at most one PCIe bridge",
    "PXB": "several PCIe bridges",
    "PHB": "a PCIe host bridge",
    "NODE": "PCIe host bridges within a NUMA node",
    "SYS": "the SMP interconnect between NUMA nodes",
}
_KIND = re.compile(r"NV\d+|NVB|PIX|PXB|PHB|NODE|SYS|SOC|X")
_DEVICE = re.compile(r"(?:GPU|NIC)\d+|mlx\d+_\d+|[a-z][a-z0-9]*_\d+")
_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
_NIC_LEGEND = re.compile(r"^\s*(NIC\d+)\s*:\s*(\S+)\s*$")
_AFFINITY_COLUMNS = ("CPU Affinity", "NUMA Affinity", "GPU NUMA ID")


def parse_topo_matrix(
    raw: str | bytes, *, node: str, observed_at: datetime, origin: str = "<input>"
) -> list[NodeTopology | Rejected]:
    """The topology in one `nvidia-smi topo -m` output (of NODE, captured at OBSERVED_AT); a
    Rejected record when there is no matrix.

    A row whose device the header lacks (a terminal-damaged header without its NIC columns)
    still says how it connects to the header's devices.
    """
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
    lines = [_ANSI.sub("", line).replace("\r", "").rstrip() for line in text.splitlines()]
    header_at, columns, affinity_columns = _header(lines)
    if header_at is None:
        return [_reject(origin, "no `nvidia-smi topo -m` header (a line of GPU0 GPU1 ... columns)", text)]
    devices = list(columns)
    cells: dict[tuple[str, str], str] = {}
    cpu: dict[str, str] = {}
    numa: dict[str, str] = {}
    nic_names: dict[str, str] = {}
    bad: list[str] = []
    for line in lines[header_at + 1 :]:
        tokens = line.split()
        if not tokens:
            continue
        if (m := _NIC_LEGEND.match(line)) is not None:
            nic_names[m.group(1)] = m.group(2)
            continue
        if not _DEVICE.fullmatch(tokens[0]) or (len(tokens) > 1 and not _KIND.fullmatch(tokens[1])):
            continue
        row, values = tokens[0], tokens[1:]
        if row not in devices:
            devices.append(row)
        if len(values) < len(columns):
            bad.append(row)
            continue
        for column, value in zip(columns, values, strict=False):
            if not _KIND.fullmatch(value):
                bad.append(row)
                break
            cells[(row, column)] = value
        extra = values[len(columns) :]
        for name, value in zip(affinity_columns, extra, strict=False):
            if name == "CPU Affinity":
                cpu[row] = value
            elif name == "NUMA Affinity":
                numa[row] = value
    gpus = [d for d in devices if d.startswith("GPU")]
    if not gpus or not any(row in devices for row, _ in cells):
        return [_reject(origin, "a topology header but no matrix rows", text)]
    if bad:
        return [_reject(origin, f"unreadable matrix row(s): {', '.join(dict.fromkeys(bad))}", text)]
    links = []
    for i, a in enumerate(devices):
        for b in devices[i + 1 :]:
            kind = cells.get((a, b)) or cells.get((b, a))
            if kind:
                links.append(f"{a}-{b}:{kind}")
    nics = [d for d in devices if not d.startswith("GPU")]
    return [
        NodeTopology(
            node=node,
            observed_at=observed_at,
            source=TOPO_MATRIX,
            devices=tuple(devices),
            links=tuple(links),
            summary=topology_summary(len(gpus), links),
            gpu_uuids=tuple("" for _ in gpus),
            cpu_affinity=tuple(cpu.get(g, "") for g in gpus),
            numa_affinity=tuple(numa.get(g, "") for g in gpus),
            nic_names=tuple(nic_names.get(n, "" if n.startswith("NIC") else n) for n in nics),
        )
    ]


def _header(lines: Sequence[str]) -> tuple[int | None, list[str], list[str]]:
    """The column header: the first line whose first cell is GPU0 and that is not a row (its
    top-left cell is empty, so it starts with blanks; or its next cell is not a connection)."""
    for index, line in enumerate(lines):
        tokens = line.split()
        if not tokens or tokens[0] != "GPU0":
            continue
        if not line[:1].isspace() and len(tokens) > 1 and _KIND.fullmatch(tokens[1]):
            continue  # the GPU0 row
        devices = []
        for token in tokens:
            if not _DEVICE.fullmatch(token):
                break
            devices.append(token)
        rest = " ".join(tokens[len(devices) :])
        columns = sorted((c for c in _AFFINITY_COLUMNS if c in rest), key=rest.index)
        return index, devices, columns
    return None, [], []


def topology_summary(gpus: int, links: Iterable[str]) -> str:
    """The GPU part of a topology in words: "8 GPUs; every pair NV18 (18 bonded NVLinks)",
    "4 GPUs; pairs: 4 NODE (PCIe host bridges within a NUMA node), 2 SYS (...)"."""
    if gpus <= 1:
        return f"{gpus} GPU" + ("" if gpus == 1 else "s")
    kinds = Counter(
        link.rsplit(":", 1)[1]
        for link in links
        if link.startswith("GPU") and link.split("-", 1)[1].startswith("GPU")
    )
    pairs = gpus * (gpus - 1) // 2
    known = sum(kinds.values())

    def words(kind: str) -> str:
        if kind.startswith("NV") and kind[2:].isdigit():
            return f"{kind} ({kind[2:]} bonded NVLink{'' if kind == 'NV1' else 's'})"
        return f"{kind} ({KIND_WORDS[kind]})" if kind in KIND_WORDS else kind

    order = sorted(kinds, key=lambda k: (-kinds[k], k))
    if len(kinds) == 1 and known == pairs:
        described = f"every pair {words(order[0])}"
    else:
        described = "pairs: " + ", ".join(f"{kinds[k]} {words(k)}" for k in order)
        if known < pairs:
            described += f", {pairs - known} unknown"
    return f"{gpus} GPUs; {described}"


def _reject(origin: str, reason: str, text: str) -> Rejected:
    return Rejected(source=SOURCE, origin=origin, record_key="topology", reason=reason, raw=text[:8192])


__all__ = ["TOPO_MATRIX", "parse_topo_matrix", "topology_summary"]
