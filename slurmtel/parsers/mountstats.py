"""/proc/self/mountstats -> one NfsMountStats per NFS mount.

Format (fs/nfs/super.c, nfs_show_stats): a `device D mounted on M with fstype T [statvers=V]`
line per mount; NFS mounts follow it with TAB-indented lines: `age: N`, `events: ...`,
`bytes: normalread normalwrite directread directwrite serverread serverwrite readpages
writepages`, `RPC iostats version: ...`, `xprt: ...`, `per-op statistics`, then one line per
operation `OP: ops trans timeouts bytes_sent bytes_recv queue_ms rtt_ms execute_ms [errors]`.

Counters are cumulative since the mount. A node-level figure: the NFS traffic of every job on
the node, attributed to a job only when it holds the node exclusively (the caller decides).
"""

from __future__ import annotations

import re

from slurmtel.records import NfsMountStats, Rejected

SOURCE = "mountstats"
RAW_CHARS = 4096
_DEVICE = re.compile(r"^device (\S+) mounted on (\S+) with fstype (\S+)(?: statvers=(\S+))?\s*$")
_OP = re.compile(r"^\s*([A-Z_0-9]+):\s+((?:\d+\s*)+)$")
NFS_TYPES = frozenset({"nfs", "nfs4"})
_U64_MAX = 2**64 - 1


class _Bad(ValueError):
    pass


def _numbers(text: str, what: str, at_least: int) -> list[int]:
    fields = text.split()
    if len(fields) < at_least or not all(f.isascii() and f.isdigit() for f in fields):
        raise _Bad(f"{what}: {text[:60]!r} is not {at_least} counters")
    values = [int(f) for f in fields]
    if any(v > _U64_MAX for v in values):
        raise _Bad(f"{what}: counter above 2^64")
    return values


def parse_mountstats(
    raw: str | bytes, *, origin: str = "/proc/self/mountstats"
) -> list[NfsMountStats | Rejected]:
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
    out: list[NfsMountStats | Rejected] = []
    mount: dict[str, object] | None = None
    lines: list[str] = []
    broken: str | None = None

    def finish() -> None:
        nonlocal mount, broken
        if mount is not None:
            key = f"{mount['device']} on {mount['mountpoint']}"
            if broken is not None:
                out.append(Rejected(SOURCE, origin, key, broken, "\n".join(lines)[:RAW_CHARS]))
            else:
                out.append(NfsMountStats(**mount))  # type: ignore[arg-type]
        mount, broken = None, None
        lines.clear()

    for number, line in enumerate(text.splitlines(), start=1):
        if (m := _DEVICE.match(line)) is not None:
            finish()
            if m.group(3) in NFS_TYPES:
                mount = {"device": m.group(1), "mountpoint": m.group(2), "fstype": m.group(3)}
                lines.append(line)
            continue
        if mount is None or not line.strip():
            continue
        lines.append(line)
        if broken is not None:
            continue
        stripped = line.strip()
        try:
            if stripped.startswith("age:"):
                mount["age_seconds"] = _numbers(stripped[4:], "age", 1)[0]
            elif stripped.startswith("bytes:"):
                values = _numbers(stripped[6:], "bytes", 6)
                mount["read_bytes"] = values[0] + values[2]
                mount["write_bytes"] = values[1] + values[3]
                mount["server_read_bytes"] = values[4]
                mount["server_write_bytes"] = values[5]
            elif (op := _OP.match(line)) is not None and op.group(1) in ("READ", "WRITE"):
                values = _numbers(op.group(2), op.group(1), 8)
                prefix = op.group(1).lower()
                mount[f"{prefix}_ops"] = values[0]
                mount[f"{prefix}_rtt_seconds"] = values[6] / 1000
        except _Bad as exc:
            broken = f"line {number}: {exc}"
    finish()
    return out
