"""Slurm GRES strings, as slurmctld prints them, read into counts and GPU indices.

Forms seen in real output (Slurm 20.11 .. 25.11):

    gpu:h100:4                    a node's configured GPUs (scontrol Gres=, sinfo/nodes "gres")
    gpu:nvidia_h100_80gb_hbm3:8(S:0-1)      with the sockets the GPUs are bound to
    gpu:1g.10gb:21(S:1)           MIG slices declared as a GPU type
    gpu:4 / gpu:0                 untyped
    gpu:h100:4(IDX:0-3)           in use, with the indices (GresUsed=, gres_used, job GRES=, gres_detail)
    gpu:1g.10gb:9(IDX:0-3,5-9)    index lists; commas inside the parentheses
    gpu:h100:0(IDX:N/A)           nothing in use
    gpu:h100:2(IDX:0-1),gpu:h200:4(IDX:2-5)  several types
    gpu:h100:1(IDX:0),gpu:h200:0(IDX:)       a type the job got none of
    gres:gpu:1 / gres/gpu:4 / gres/gpu:h100:1,gres/gpu:h200:1 / gpu:titanxp:1   tres_per_* requests
    (null), "", justarandomfield  no GPU at all

Index lists are plain integers ("0-3,5-9") and are expanded here; node name lists are not (use
python-hostlist for those).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

# Slurm scales GRES counts with binary suffixes (gres.conf "Count=1K" is 1024).
_SUFFIX = {"K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4, "P": 1024**5}
_PAREN = re.compile(r"\(([^()]*)\)")


@dataclass(frozen=True, slots=True)
class GresItem:
    """One `name[:type][:count][(S:..)][(IDX:..)]` entry."""

    name: str
    type: str
    count: int
    # the IDX list when the string had one (None: no IDX part; (): IDX:N/A or empty)
    indices: tuple[int, ...] | None = None


def split_top_level(text: str) -> list[str]:
    """Split on commas that are not inside parentheses."""
    parts: list[str] = []
    depth = 0
    start = 0
    for pos, char in enumerate(text):
        if char == "(":
            depth += 1
        elif char == ")":
            depth = max(depth - 1, 0)
        elif char == "," and depth == 0:
            parts.append(text[start:pos])
            start = pos + 1
    parts.append(text[start:])
    return [part.strip() for part in parts if part.strip()]


def parse_index_list(text: str) -> tuple[int, ...]:
    """`0-3,5,7-8` -> (0, 1, 2, 3, 5, 7, 8); `N/A` and `` -> ()."""
    text = text.strip()
    if not text or text.upper() == "N/A":
        return ()
    indices: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        low, sep, high = part.partition("-")
        if not (low.isdigit() and (not sep or high.isdigit())):
            raise ValueError(f"bad index list '{text}'")
        first, last = int(low), int(high) if sep else int(low)
        if last < first:
            raise ValueError(f"bad index range '{part}' in '{text}'")
        indices.extend(range(first, last + 1))
    return tuple(indices)


def _count(text: str) -> int | None:
    """`4` -> 4, `1K` -> 1024; None when TEXT is not a count."""
    if text.isdigit():
        return int(text)
    if len(text) > 1 and text[:-1].isdigit() and text[-1].upper() in _SUFFIX:
        return int(text[:-1]) * _SUFFIX[text[-1].upper()]
    return None


def parse_gres(text: str | None) -> list[GresItem]:
    """Read a GRES string into items; `(null)`, `N/A` and `` give []."""
    if text is None:
        return []
    text = text.strip()
    if not text or text in ("(null)", "N/A", "none"):
        return []
    items: list[GresItem] = []
    for part in split_top_level(text):
        indices: tuple[int, ...] | None = None
        for group in _PAREN.findall(part):
            key, _, value = group.partition(":")
            if key == "IDX":
                indices = parse_index_list(value)
        head = _PAREN.sub("", part).strip()
        # tres_per_* spell the same thing "gres:gpu:1" (22.05) or "gres/gpu:1" (23.02+)
        if head.startswith(("gres:", "gres/")):
            head = head[5:]
        fields = head.split(":")
        name = fields[0]
        if not name:
            raise ValueError(f"empty GRES name in '{text}'")
        rest = fields[1:]
        count = 1
        if rest:
            parsed = _count(rest[-1])
            if parsed is not None:
                count = parsed
                rest = rest[:-1]
        if len(rest) > 1:
            raise ValueError(f"cannot read GRES '{part}' in '{text}'")
        items.append(GresItem(name=name, type=rest[0] if rest else "", count=count, indices=indices))
    return items


def gpu_items(text: str | None) -> list[GresItem]:
    """The `gpu` entries of a GRES string."""
    return [item for item in parse_gres(text) if item.name == "gpu"]


def gpu_count(text: str | None) -> int:
    """Total GPUs a GRES string names."""
    return sum(item.count for item in gpu_items(text))


# a MIG profile as a GPU type: "1g.10gb", "3g.40gb", "1g.10gb+me", "1c.3g.71gb" (a compute
# instance: 1 of the 3 compute slices of a 3g GPU instance), also after the GPU's name as
# sites and Slurm's NVML autodetection name them ("a100_3g.20gb", "nvidia_a100_1g.5gb")
_MIG_PROFILE = re.compile(r"(?:[\w.-]*[_-])?(?:(\d+)c\.)?(\d+)g\.(\d+)gb(?:\+\w+)*", re.IGNORECASE)
# how many instances of a profile with G compute slices one GPU holds at most (NVIDIA's MIG
# user guide: A100/H100/H200/B200 have 7 compute slices; A30 has 4, its profiles are 6 GB a slice)
_MAX_INSTANCES = {7: {1: 7, 2: 3, 3: 2, 4: 1, 7: 1}, 4: {1: 4, 2: 2, 4: 1}}


def mig_slices(gpu_type: str) -> tuple[int, int] | None:
    """(compute slices, slices of its GPU) of a MIG profile ("3g.40gb" -> (3, 7), "2g.12gb" ->
    (2, 4) on an A30); None when GPU_TYPE is not a MIG profile."""
    m = _MIG_PROFILE.fullmatch(gpu_type.strip())
    if m is None:
        return None
    compute, gpu_slices, memory = int(m.group(1) or 0), int(m.group(2)), int(m.group(3))
    per_gpu = 4 if gpu_slices and memory == 6 * gpu_slices and gpu_slices in (1, 2, 4) else 7
    return (compute or gpu_slices), per_gpu


def physical_gpus(items: list[GresItem]) -> int:
    """The physical GPUs a node's GRES stands for: whole GPUs as counted, MIG slices as shares
    of their GPU (DESIGN §4: capacity counts physical GPUs, never slices).

    `gpu:1g.10gb:21` on a node of three A100 80 GB is 3 GPUs, not 21. Slurm does not say which
    slice sits on which GPU, so the count is the least number of GPUs that can hold the slices:
    the compute slices over 7 (4 on an A30), and each profile's instances over the most one GPU
    holds (3 of 2g.20gb), rounded up, whichever is larger.
    """
    whole = 0
    slices: dict[int, float] = {}
    needed = 0
    for item in items:
        if item.count <= 0:
            continue
        profile = mig_slices(item.type) if item.type else None
        if profile is None:
            whole += item.count
            continue
        compute, per_gpu = profile
        slices[per_gpu] = slices.get(per_gpu, 0.0) + item.count * compute / per_gpu
        most = _MAX_INSTANCES[per_gpu].get(compute, 1)
        needed = max(needed, math.ceil(item.count / most))
    if not slices:
        return whole
    return whole + max(needed, sum(math.ceil(share - 1e-9) for share in slices.values()))


def tres_gpu_items(tres: dict[str, int], configured: list[GresItem]) -> list[GresItem]:
    """The GPUs of a TRES map (AllocTRES, CfgTRES, tres_used) as GRES items of the types the
    node's GRES (CONFIGURED) names, so that physical_gpus counts them as it counts the GRES:
    a MIG node's `gres/gpu=6` is 6 slices, not 6 GPUs. The typed entries (`gres/gpu:1g.10gb=2`,
    where AccountingStorageTRES tracks them) are taken as they are; the untyped count beyond
    them is of the node's one GPU type, or, on a node of several types, of its smallest slices
    first (Slurm does not say which: the least physical share the count can be)."""
    typed = [
        GresItem("gpu", key[len("gres/gpu:") :], count)
        for key, count in tres.items()
        if key.startswith("gres/gpu:") and count > 0
    ]
    rest = tres.get("gres/gpu", 0) - sum(item.count for item in typed)
    if rest <= 0:
        return typed
    kinds = [item for item in configured if item.count > 0] or [GresItem("gpu", "", rest)]
    items = list(typed)
    # smallest share of a GPU first: a slice is its compute slices of its GPU's, a GPU is 1
    for kind in sorted(kinds, key=lambda item: _share(item.type)):
        free = kind.count - sum(item.count for item in typed if item.type == kind.type)
        take = min(rest, free)
        if take > 0:
            items.append(GresItem("gpu", kind.type, take))
            rest -= take
    if rest > 0:
        # more than the node has of every kind (a count that lags a reconfiguration): the rest
        # as its largest kind, never dropped
        largest = max(kinds, key=lambda item: _share(item.type))
        items.append(GresItem("gpu", largest.type, rest))
    return items


def _share(gpu_type: str) -> float:
    profile = mig_slices(gpu_type) if gpu_type else None
    return 1.0 if profile is None else profile[0] / profile[1]


def single_gpu_type(items: list[GresItem]) -> str:
    """The GPU type when the items name exactly one (ignoring zero-count entries), else ""."""
    types = {item.type for item in items if item.count > 0 and item.type}
    if not types:
        types = {item.type for item in items if item.type}
    return types.pop() if len(types) == 1 else ""


def tres_count(tres: str | None, key: str) -> int | None:
    """The count of KEY in a TRES string `cpu=1,mem=256M,gres/gpu=2`; None when absent."""
    if not tres:
        return None
    for part in tres.split(","):
        name, sep, value = part.partition("=")
        if sep and name.strip() == key:
            parsed = _count(value.strip())
            if parsed is None:
                raise ValueError(f"bad count for {key} in '{tres}'")
            return parsed
    return None
