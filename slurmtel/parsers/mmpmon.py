"""`mmpmon -p` answering `fs_io_s` (IBM Storage Scale / GPFS) -> one GpfsFsIo per file system.

Each answer is one line of key/value pairs, keys between underscores:

    _fs_io_s_ _n_ ADDRESS _nn_ NODE _rc_ RC _t_ SECONDS _tu_ MICROSECONDS _cl_ CLUSTER _fs_ FS
    _d_ DISKS _br_ BYTES_READ _bw_ BYTES_WRITTEN _oc_ OPENS _cc_ CLOSES _rdc_ READS _wc_ WRITES
    _dir_ READDIRS _iu_ INODE_UPDATES

Counters are cumulative since GPFS started on the node or the last `reset` request. A line
whose return code `_rc_` is not 0 (mmpmon could not answer for that file system), or that
lacks a field, is a Rejected with its reason; other lines (other requests' answers) are not
this parser's and are skipped.
"""

from __future__ import annotations

from datetime import UTC, datetime

from slurmtel.records import GpfsFsIo, Rejected

SOURCE = "mmpmon"
RAW_CHARS = 4096
PREFIX = "_fs_io_s_"
_COUNTERS = {
    "_br_": "read_bytes",
    "_bw_": "write_bytes",
    "_oc_": "opens",
    "_cc_": "closes",
    "_rdc_": "reads",
    "_wc_": "writes",
    "_dir_": "readdirs",
    "_iu_": "inode_updates",
}
_U64_MAX = 2**64 - 1


class _Bad(ValueError):
    pass


def _number(fields: dict[str, str], key: str) -> int:
    value = fields.get(key)
    if value is None:
        raise _Bad(f"no {key}")
    if not (value.isascii() and value.isdigit()) or int(value) > _U64_MAX:
        raise _Bad(f"{key} {value[:40]!r} is not a counter")
    return int(value)


def _record(line: str) -> GpfsFsIo:
    words = line.split()[1:]
    if len(words) % 2:
        raise _Bad("an odd number of words: not key/value pairs")
    fields = dict(zip(words[::2], words[1::2], strict=True))
    if (rc := fields.get("_rc_")) != "0":
        raise _Bad(f"mmpmon return code {rc!r}")
    for key in ("_n_", "_nn_", "_cl_", "_fs_"):
        if key not in fields:
            raise _Bad(f"no {key}")
    seconds, micros = _number(fields, "_t_"), _number(fields, "_tu_")
    try:
        at = datetime.fromtimestamp(seconds + micros / 1e6, UTC)
    except (OverflowError, OSError, ValueError) as exc:
        raise _Bad(f"_t_ {seconds} is out of range") from exc
    counters = {name: _number(fields, key) for key, name in _COUNTERS.items()}
    return GpfsFsIo(
        node_address=fields["_n_"],
        node_name=fields["_nn_"],
        cluster=fields["_cl_"],
        filesystem=fields["_fs_"],
        disks=_number(fields, "_d_"),
        at=at,
        **counters,
    )


def parse_mmpmon_fs_io_s(raw: str | bytes, *, origin: str = "mmpmon") -> list[GpfsFsIo | Rejected]:
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
    out: list[GpfsFsIo | Rejected] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.startswith(PREFIX + " "):
            continue
        try:
            out.append(_record(line))
        except _Bad as exc:
            out.append(Rejected(SOURCE, origin, f"line {number}", str(exc), line[:RAW_CHARS]))
    return out
