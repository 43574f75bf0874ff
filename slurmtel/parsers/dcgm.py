"""dcgm-exporter `/metrics` (Prometheus text exposition) -> per-GPU samples.

Hand-written for speed: the head scrapes every GPU node each cycle, and the text is regular
(one metric family after another, every GPU's label block repeated verbatim on each line), so
a line costs a few string operations plus one dict lookup of its label block; the label block is
parsed once per distinct block.

Field names: dcgm-exporter <= 4.8 prints the DCGM 3 names; 4.9 renamed the fields DCGM 4.7
deprecates to their new names, several with new units; the 1.x-compatibility collector prints
lowercase names. Each quantity, as DCGM 3 -> DCGM 4.7 -> 1.x compat:

- graphics engine active: DCGM_FI_PROF_GR_ENGINE_ACTIVE (ratio) -> DCGM_FI_PROF_GR_ENGINE_UTIL_RATIO
  -> dcgm_fi_prof_gr_engine_active
- SM active: DCGM_FI_PROF_SM_ACTIVE (ratio) -> DCGM_FI_PROF_SM_UTIL_RATIO -> dcgm_fi_prof_sm_active
- GPU utilisation: DCGM_FI_DEV_GPU_UTIL (%) -> DCGM_FI_DEV_GPU_UTIL_RATIO (ratio) -> dcgm_gpu_utilization
- memory: DCGM_FI_DEV_FB_USED/_FREE/_TOTAL/_RESERVED (MiB) -> DCGM_FI_DEV_FB_USED_BYTES/_FREE_BYTES/
  _CAPACITY_BYTES/_RESERVED_BYTES -> dcgm_fb_used/_free (MiB)
- power: DCGM_FI_DEV_POWER_USAGE (W) -> DCGM_FI_DEV_BOARD_POWER_WATTS -> dcgm_power_usage
- energy counter: DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION (mJ) -> DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL (J)
  -> dcgm_total_energy_consumption (mJ)
- temperature: DCGM_FI_DEV_GPU_TEMP -> DCGM_FI_DEV_GPU_TEMP_CELSIUS -> dcgm_gpu_temp
- SM clock: DCGM_FI_DEV_SM_CLOCK (MHz) -> DCGM_FI_DEV_SM_CLOCK_HERTZ (Hz) -> dcgm_sm_clock
- last XID: DCGM_FI_DEV_XID_ERRORS -> DCGM_FI_DEV_XID_ERROR -> dcgm_xid_errors
- ECC: DCGM_FI_DEV_ECC_{SBE,DBE}_{VOL,AGG}_TOTAL (unchanged) -> dcgm_ecc_{sbe,dbe}_{volatile,aggregate}_total

Labels: `UUID` (1.x: `uuid`), `gpu`, `device`, `modelName`, `Hostname` (renamed `hostname` in
exporter 4.8.3), `pci_bus_id`, `GPU_I_ID`/`GPU_I_PROFILE` on MIG instances, `hpc_job` (with
`--hpc-job-mapping-dir`; one series per job on a GPU), DCGM_FI_DRIVER_VERSION (4.9:
DCGM_FI_SYSTEM_DRIVER_VERSION) and other DCGM_FI_* info labels. Label names are matched without
regard to case. DCGM cannot name a MIG instance's UUID (dcgm-exporter issue #171: the `UUID`
label is the parent GPU's), so a MIG instance without a MIG UUID label is identified as
`<parent GPU UUID>/gi<GPU_I_ID>`; the head translates that through the node's inventory.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from slurmtel.errors import ParseError
from slurmtel.parsers.gres import mig_slices
from slurmtel.records import GpuInventory, GpuSummary, Rejected

SOURCE = "dcgm"
_MIB = 1024 * 1024
# DCGM's "blank" sentinels sit at the top of the int32 range (DCGM_INT32_BLANK = 0x7ffffff0);
# 4294967295 is an unsigned -1. Nothing real is that large in a MiB/count/XID field.
_INT32_BLANK = 2147483632
_INT64_BLANK = 9223372036854775792


@dataclass(frozen=True, slots=True)
class DcgmGpuSample:
    """One GPU (or MIG instance) in one scrape. Values are None where the scrape had none."""

    node: str
    gpu_uuid: str
    observed_at: datetime
    gpu_index: int | None = None
    model: str = ""
    # the exporter's Hostname label (a container's hostname under Kubernetes, not the node)
    hostname: str = ""
    device: str = ""
    pci_bus_id: str = ""
    driver_version: str = ""
    cuda_version: str = ""
    vbios_version: str = ""
    minor_number: int | None = None
    # MIG: the parent GPU's UUID, the GPU instance id and its profile ("1g.10gb")
    parent_gpu_uuid: str = ""
    gpu_instance_id: int | None = None
    mig_profile: str = ""
    # which metric util_percent came from: "gr_engine_active", "sm_active" or "gpu_util"
    util_metric: str = ""
    util_percent: float | None = None
    memory_used_bytes: int | None = None
    memory_free_bytes: int | None = None
    memory_total_bytes: int | None = None
    # on a MIG instance, power/energy/temperature/clock/XID are the parent GPU's
    power_watts: float | None = None
    # the power cap in force (DCGM_FI_DEV_POWER_MGMT_LIMIT)
    power_limit_watts: float | None = None
    energy_joules_total: float | None = None
    temperature_celsius: float | None = None
    sm_clock_mhz: float | None = None
    xid_last: int | None = None
    ecc_sbe_volatile_total: int | None = None
    ecc_dbe_volatile_total: int | None = None
    ecc_sbe_aggregate_total: int | None = None
    ecc_dbe_aggregate_total: int | None = None
    # Slurm job ids from the hpc_job label, in the order the scrape showed them
    job_ids: tuple[str, ...] = ()
    # a GPU in MIG mode, seen through its instances too (its time is theirs)
    mig_parent: bool = False


@dataclass(frozen=True, slots=True)
class DcgmScrape:
    """One scrape of one node's dcgm-exporter."""

    node: str
    at: datetime
    gpus: tuple[DcgmGpuSample, ...]
    # impossible values dropped, per DcgmGpuSample field ("util_percent": 2, ...)
    dropped: dict[str, int] = field(default_factory=dict, hash=False)
    rejected: tuple[Rejected, ...] = ()
    # sample lines read (comments and blank lines excluded), DCGM or not
    sample_lines: int = 0
    # DCGM sample lines that name no GPU (no UUID label) and so cannot be attributed
    unattributed_lines: int = 0


def _ratio_percent(value: float) -> float:
    return value * 100.0


def _same(value: float) -> float:
    return value


def _mib_bytes(value: float) -> float:
    return value * _MIB


def _mj_joules(value: float) -> float:
    return value / 1000.0


def _hz_mhz(value: float) -> float:
    return value / 1e6


# field -> (lowest, highest) a real reading can have, after unit conversion
_BOUNDS: dict[str, tuple[float, float]] = {
    "util_percent": (0.0, 100.0 + 1e-6),
    "memory_used_bytes": (0.0, _INT32_BLANK * float(_MIB) - 1),
    "memory_free_bytes": (0.0, _INT32_BLANK * float(_MIB) - 1),
    "memory_total_bytes": (0.0, _INT32_BLANK * float(_MIB) - 1),
    "memory_reserved_bytes": (0.0, _INT32_BLANK * float(_MIB) - 1),
    "power_watts": (0.0, 100_000.0),
    "power_limit_watts": (0.0, 100_000.0),
    "energy_joules_total": (0.0, _INT64_BLANK / 1000.0),
    "temperature_celsius": (-60.0, 250.0),
    "sm_clock_mhz": (0.0, 100_000.0),
    "xid_last": (0.0, _INT32_BLANK - 1),
    "ecc_sbe_volatile_total": (0.0, _INT32_BLANK - 1),
    "ecc_dbe_volatile_total": (0.0, _INT32_BLANK - 1),
    "ecc_sbe_aggregate_total": (0.0, _INT32_BLANK - 1),
    "ecc_dbe_aggregate_total": (0.0, _INT32_BLANK - 1),
}

# util metric slots in order of preference
_UTIL_ORDER = ("gr_engine_active", "sm_active", "gpu_util")

Converter = Callable[[float], float]

# metric name -> (slot, converter). A slot is a DcgmGpuSample field, or "util:<metric>".
_METRICS: dict[str, tuple[str, Converter]] = {}


def _register(slot: str, convert: Converter, *names: str) -> None:
    for name in names:
        _METRICS[name] = (slot, convert)
        # the 1.x-compatibility collectors print DCGM_FI names in lowercase
        _METRICS.setdefault(name.lower(), (slot, convert))


_register("util:gr_engine_active", _ratio_percent, "DCGM_FI_PROF_GR_ENGINE_ACTIVE")
_register("util:gr_engine_active", _ratio_percent, "DCGM_FI_PROF_GR_ENGINE_UTIL_RATIO")
_register("util:sm_active", _ratio_percent, "DCGM_FI_PROF_SM_ACTIVE", "DCGM_FI_PROF_SM_UTIL_RATIO")
_register("util:gpu_util", _same, "DCGM_FI_DEV_GPU_UTIL", "dcgm_gpu_utilization")
_register("util:gpu_util", _ratio_percent, "DCGM_FI_DEV_GPU_UTIL_RATIO")
_register("memory_used_bytes", _mib_bytes, "DCGM_FI_DEV_FB_USED", "dcgm_fb_used")
_register("memory_free_bytes", _mib_bytes, "DCGM_FI_DEV_FB_FREE", "dcgm_fb_free")
_register("memory_total_bytes", _mib_bytes, "DCGM_FI_DEV_FB_TOTAL")
_register("memory_reserved_bytes", _mib_bytes, "DCGM_FI_DEV_FB_RESERVED")
_register("memory_used_bytes", _same, "DCGM_FI_DEV_FB_USED_BYTES")
_register("memory_free_bytes", _same, "DCGM_FI_DEV_FB_FREE_BYTES")
_register("memory_total_bytes", _same, "DCGM_FI_DEV_FB_CAPACITY_BYTES")
_register("memory_reserved_bytes", _same, "DCGM_FI_DEV_FB_RESERVED_BYTES")
_register("power_watts", _same, "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_BOARD_POWER_WATTS")
_register("power_watts", _same, "dcgm_power_usage")
_register("power_limit_watts", _same, "DCGM_FI_DEV_POWER_MGMT_LIMIT", "DCGM_FI_DEV_ENFORCED_POWER_LIMIT")
_register(
    "energy_joules_total", _mj_joules, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "dcgm_total_energy_consumption"
)
_register("energy_joules_total", _same, "DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL")
_register("temperature_celsius", _same, "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_GPU_TEMP_CELSIUS")
_register("temperature_celsius", _same, "dcgm_gpu_temp")
_register("sm_clock_mhz", _same, "DCGM_FI_DEV_SM_CLOCK", "dcgm_sm_clock")
_register("sm_clock_mhz", _hz_mhz, "DCGM_FI_DEV_SM_CLOCK_HERTZ")
_register("xid_last", _same, "DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_XID_ERROR", "dcgm_xid_errors")
_register("ecc_sbe_volatile_total", _same, "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "dcgm_ecc_sbe_volatile_total")
_register("ecc_dbe_volatile_total", _same, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "dcgm_ecc_dbe_volatile_total")
_register("ecc_sbe_aggregate_total", _same, "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", "dcgm_ecc_sbe_aggregate_total")
_register("ecc_dbe_aggregate_total", _same, "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", "dcgm_ecc_dbe_aggregate_total")

_INT_FIELDS = frozenset(
    {
        "memory_used_bytes",
        "memory_free_bytes",
        "memory_total_bytes",
        "memory_reserved_bytes",
        "xid_last",
        "ecc_sbe_volatile_total",
        "ecc_dbe_volatile_total",
        "ecc_sbe_aggregate_total",
        "ecc_dbe_aggregate_total",
    }
)

_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*\Z")
_LABEL_PAIR = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*(,|\Z)', re.DOTALL)
_ESCAPE = re.compile(r"\\(.)")
_ESCAPES = {"n": "\n", "\\": "\\", '"': '"'}


def _unescape(value: str) -> str:
    if "\\" not in value:
        return value
    return _ESCAPE.sub(lambda m: _ESCAPES.get(m.group(1), "\\" + m.group(1)), value)


def _parse_label_block(block: str) -> dict[str, str]:
    """`gpu="0",UUID="GPU-..."` -> {"gpu": "0", ...}; ValueError when it is not a label set."""
    labels: dict[str, str] = {}
    pos = 0
    end = len(block)
    if block.strip() == "":
        return labels
    while pos < end:
        match = _LABEL_PAIR.match(block, pos)
        if match is None:
            raise ValueError(f"bad label set near '{block[pos : pos + 40]}'")
        labels[match.group(1)] = _unescape(match.group(2))
        pos = match.end()
        if match.group(3) == "" or block[pos:].strip() == "":
            break
    if block[pos:].strip():
        raise ValueError(f"trailing text in label set: '{block[pos : pos + 40]}'")
    return labels


@dataclass(slots=True)
class _Identity:
    """What a label block says about the GPU it belongs to (cached per distinct block)."""

    key: tuple[str, str] | None
    labels: dict[str, str]
    job_id: str
    # whether it is a MIG instance, and the DcgmGpuSample fields its labels give (_labelled),
    # read once per identity: a Prometheus answer repeats a series' labels at every instant
    fields: tuple[bool, dict[str, Any]] | None = None


def _labelled(key: tuple[str, str], labels: dict[str, str]) -> tuple[bool, dict[str, Any]]:
    uuid, gi = key
    mig_profile = _label(labels, "gpu_i_profile")
    is_mig = bool(gi) or uuid.startswith("MIG-") or bool(mig_profile)
    gpu_uuid = f"{uuid}/gi{gi}" if gi and not uuid.startswith("MIG-") else uuid
    parent = _label(labels, "uuid") if is_mig else ""
    if parent == gpu_uuid:
        parent = ""
    device = _label(labels, "device")
    minor = _int_or_none(_label(labels, "dcgm_fi_dev_minor_number"))
    if minor is None and device.startswith("nvidia"):
        minor = _int_or_none(device[len("nvidia") :])
    return is_mig, {
        "gpu_uuid": gpu_uuid,
        "gpu_index": _int_or_none(_label(labels, "gpu")),
        "model": _label(labels, "modelname", "dcgm_fi_dev_name"),
        "hostname": _label(labels, "hostname"),
        "device": device,
        "pci_bus_id": _label(labels, "pci_bus_id", "dcgm_fi_dev_pci_busid"),
        "driver_version": _label(labels, "dcgm_fi_driver_version", "dcgm_fi_system_driver_version"),
        "cuda_version": _cuda_version(_label(labels, "dcgm_fi_cuda_driver_version")),
        "vbios_version": _label(labels, "dcgm_fi_dev_vbios_version"),
        "minor_number": minor,
        "parent_gpu_uuid": parent,
        "gpu_instance_id": _int_or_none(gi),
        "mig_profile": mig_profile,
    }


def _label(labels: dict[str, str], *names: str) -> str:
    for name in names:
        value = labels.get(name)
        if value is not None:
            return value
    return ""


def _identity(block: str) -> _Identity:
    return _identity_from_labels(_parse_label_block(block))


def _identity_from_labels(raw: Mapping[str, str]) -> _Identity:
    labels = {name.lower(): value for name, value in raw.items()}
    mig_uuid = _label(labels, "mig_uuid")
    uuid = _label(labels, "uuid")
    if not mig_uuid and uuid.startswith("MIG-"):
        mig_uuid = uuid
    gi = _label(labels, "gpu_i_id")
    if mig_uuid:
        key: tuple[str, str] | None = (mig_uuid, "")
    elif uuid:
        key = (uuid, gi)
    else:
        key = None
    return _Identity(key=key, labels=labels, job_id=_label(labels, "hpc_job"))


@dataclass(slots=True)
class _Gpu:
    identity: _Identity
    values: dict[str, float] = field(default_factory=dict)
    job_ids: list[str] = field(default_factory=list)


def _int_or_none(text: str) -> int | None:
    text = text.strip()
    return int(text) if text.isdigit() else None


def _cuda_version(text: str) -> str:
    # DCGM_FI_CUDA_DRIVER_VERSION is major*1000 + minor*10: 12010 -> 12.1
    if not text.isdigit():
        return text
    number = int(text)
    return f"{number // 1000}.{(number % 1000) // 10}"


def _mig_fraction(profile: str) -> float:
    # "3g.40gb" holds 3 of an A100's or H100's 7 compute slices, "1g.6gb" 1 of an A30's 4
    # (slurmtel.parsers.gres.mig_slices, as Slurm's MIG GRES are counted)
    slices = mig_slices(profile)
    return min(slices[0] / slices[1], 1.0) if slices else 1.0


def parse_dcgm_metrics(raw: str, *, node: str, at: datetime) -> DcgmScrape:
    """Read one dcgm-exporter scrape of NODE taken at AT.

    Comment, HELP/TYPE and blank lines are skipped; metrics that are not DCGM's are read and
    ignored; an unreadable line becomes a Rejected (the rest is kept); a value no GPU can have
    (NaN, +Inf, negative, 4294967295, > 100 %) is dropped and counted in `dropped`.
    Raises ParseError when the text has sample-looking lines and none of them can be read.
    """
    origin = f"dcgm-exporter on {node}"
    identities: dict[str, _Identity] = {}
    gpus: dict[tuple[str, str], _Gpu] = {}
    rejected: list[Rejected] = []
    sample_lines = 0
    unattributed = 0
    metrics = _METRICS

    # the format ends lines with "\n" only (splitlines would also split at U+2028 in a label value)
    for number, line in enumerate(raw.split("\n"), start=1):
        if not line or line[0] == "#":
            continue
        if line[0] in " \t":
            line = line.strip()
            if not line or line[0] == "#":
                continue
        brace = line.find("{")
        if brace >= 0:
            name = line[:brace]
            # values and timestamps hold no "}", so the last one closes the label set even
            # when a label value contains "}"
            close = line.rfind("}")
            if close < brace:
                rejected.append(Rejected(SOURCE, origin, f"line {number}", "label set not closed", line))
                continue
            block = line[brace + 1 : close]
            rest = line[close + 1 :].split()
        else:
            parts = line.split()
            if not parts:
                continue  # only characters str.split() counts as white space (\x1c-\x1f, U+2028)
            name = parts[0]
            block = ""
            rest = parts[1:]
        if not 1 <= len(rest) <= 2:
            rejected.append(Rejected(SOURCE, origin, f"line {number}", "expected a value", line))
            continue
        try:
            value = float(rest[0])
            if len(rest) == 2:
                int(rest[1])
        except ValueError:
            reason = f"not a number: '{' '.join(rest)}'"
            rejected.append(Rejected(SOURCE, origin, f"line {number}", reason, line))
            continue
        spec = metrics.get(name)
        if spec is None and not _METRIC_NAME.match(name):
            rejected.append(Rejected(SOURCE, origin, f"line {number}", f"bad metric name '{name}'", line))
            continue
        identity = identities.get(block)
        if identity is None:
            try:
                identity = _identity(block)
            except ValueError as exc:
                rejected.append(Rejected(SOURCE, origin, f"line {number}", str(exc), line))
                continue
            identities[block] = identity
        sample_lines += 1
        if spec is None and name[:5] not in ("DCGM_", "dcgm_"):
            continue
        if not _add(gpus, identity, spec, value):
            unattributed += 1

    if rejected and sample_lines == 0:
        raise ParseError(
            f"{origin}: no line could be read as Prometheus text "
            f"({len(rejected)} rejected, first at {rejected[0].record_key}: {rejected[0].reason})"
        )
    return _scrape(gpus, node, at, rejected, sample_lines, unattributed)


def dcgm_scrapes_from_series(
    series: Iterable[tuple[str, str, Mapping[str, str], Iterable[tuple[datetime, float]]]],
) -> list[DcgmScrape]:
    """Series as a Prometheus server answers a query, each (metric name, node, labels, points),
    as one DcgmScrape per node and instant, in (node, time) order: the GPUs, values, units, MIG
    instances, job ids and dropped impossible values of each are exactly what parse_dcgm_metrics
    gives for that instant's samples written as exposition text in series order. Samples of
    metrics that are not DCGM's are counted and ignored. Each distinct label set is read once,
    not once per instant."""
    identities: dict[tuple[tuple[str, str], ...], _Identity] = {}
    grouped: dict[
        tuple[str, datetime], list[tuple[tuple[str, Converter] | None, _Identity | None, float]]
    ] = {}
    for name, node, labels, points in series:
        spec = _METRICS.get(name)
        identity = None
        if spec is not None or name[:5] in ("DCGM_", "dcgm_"):
            block = tuple(sorted(labels.items()))
            identity = identities.get(block)
            if identity is None:
                identity = identities[block] = _identity_from_labels(labels)
        for at, value in points:
            grouped.setdefault((node, at), []).append((spec, identity, value))
    scrapes = []
    for (node, at), samples in sorted(grouped.items()):
        gpus: dict[tuple[str, str], _Gpu] = {}
        unattributed = 0
        for spec, known, value in samples:
            if known is not None and not _add(gpus, known, spec, value):
                unattributed += 1
        scrapes.append(_scrape(gpus, node, at, [], len(samples), unattributed))
    return scrapes


def dcgm_field_names() -> frozenset[str]:
    """Every metric name the DCGM readers know (DCGM 3, DCGM 4.7 and 1.x-compatibility names)."""
    return frozenset(_METRICS)


def _add(
    gpus: dict[tuple[str, str], _Gpu], identity: _Identity, spec: tuple[str, Converter] | None, value: float
) -> bool:
    """Put one DCGM sample on its GPU; False when its labels name no GPU (unattributed)."""
    key = identity.key
    if key is None:
        return False
    gpu = gpus.get(key)
    if gpu is None:
        # any DCGM series names its GPU, even one this parser does not read
        gpu = gpus[key] = _Gpu(identity=identity)
    if identity.job_id and identity.job_id not in gpu.job_ids:
        gpu.job_ids.append(identity.job_id)
    if spec is None:
        return True
    slot, convert = spec
    if slot not in gpu.values:
        # (a repeat is the same series again for another hpc_job / pod label: the same reading)
        gpu.values[slot] = convert(value)
    return True


def _scrape(
    gpus: dict[tuple[str, str], _Gpu],
    node: str,
    at: datetime,
    rejected: list[Rejected],
    sample_lines: int,
    unattributed: int,
) -> DcgmScrape:
    dropped: dict[str, int] = {}
    samples = [_sample(key, gpu, node, at, dropped) for key, gpu in gpus.items()]
    # a GPU in MIG mode also shows device-level series of its own (no GPU_I_ID): it is the
    # parent of its instances, not one more whole GPU beside them
    parents = {s.parent_gpu_uuid for s in samples if s.parent_gpu_uuid}
    samples = [
        dataclasses.replace(s, mig_parent=True) if s.gpu_uuid in parents and not s.parent_gpu_uuid else s
        for s in samples
    ]
    return DcgmScrape(
        node=node,
        at=at,
        gpus=tuple(samples),
        dropped=dropped,
        rejected=tuple(rejected),
        sample_lines=sample_lines,
        unattributed_lines=unattributed,
    )


# the slots a sample reads -> the field whose bounds check them
_FLOAT_FIELDS = (
    "power_watts",
    "power_limit_watts",
    "energy_joules_total",
    "temperature_celsius",
    "sm_clock_mhz",
)
_SLOT_FIELDS: dict[str, str] = {
    **{f"util:{metric}": "util_percent" for metric in _UTIL_ORDER},
    **{name: name for name in _INT_FIELDS},
    **{name: name for name in _FLOAT_FIELDS},
}


def _sample(
    key: tuple[str, str], gpu: _Gpu, node: str, at: datetime, dropped: dict[str, int]
) -> DcgmGpuSample:
    labelled = gpu.identity.fields
    if labelled is None:  # (the GPU's key is its identity's)
        labelled = gpu.identity.fields = _labelled(key, gpu.identity.labels)
    is_mig, fields = labelled

    # the readings within their field's bounds; one beyond them is dropped and counted
    values: dict[str, float] = {}
    for slot, value in gpu.values.items():
        field_name = _SLOT_FIELDS.get(slot)
        # DCGM_FI_DEV_GPU_UTIL means nothing on a MIG instance
        if field_name is None or (is_mig and slot == "util:gpu_util"):
            continue
        low, high = _BOUNDS[field_name]
        if math.isnan(value) or not low <= value <= high:
            dropped[field_name] = dropped.get(field_name, 0) + 1
        else:
            values[slot] = value

    util_metric = ""
    util: float | None = None
    for metric in _UTIL_ORDER:
        util = values.get(f"util:{metric}")
        if util is not None:
            util_metric = metric
            break

    ints: dict[str, int | None] = {}
    for name in _INT_FIELDS:
        reading = values.get(name)
        ints[name] = None if reading is None else round(reading)
    used, free, total = ints["memory_used_bytes"], ints["memory_free_bytes"], ints["memory_total_bytes"]
    if total is None and used is not None and free is not None:
        total = used + free + (ints["memory_reserved_bytes"] or 0)

    return DcgmGpuSample(
        node=node,
        observed_at=at,
        **fields,
        util_metric=util_metric,
        util_percent=util,
        memory_used_bytes=used,
        memory_free_bytes=free,
        memory_total_bytes=total,
        power_watts=values.get("power_watts"),
        power_limit_watts=values.get("power_limit_watts"),
        energy_joules_total=values.get("energy_joules_total"),
        temperature_celsius=values.get("temperature_celsius"),
        sm_clock_mhz=values.get("sm_clock_mhz"),
        xid_last=ints["xid_last"],
        ecc_sbe_volatile_total=ints["ecc_sbe_volatile_total"],
        ecc_dbe_volatile_total=ints["ecc_dbe_volatile_total"],
        ecc_sbe_aggregate_total=ints["ecc_sbe_aggregate_total"],
        ecc_dbe_aggregate_total=ints["ecc_dbe_aggregate_total"],
        job_ids=tuple(gpu.job_ids),
    )


def dcgm_summaries(
    scrape: DcgmScrape,
    *,
    window_seconds: float,
    idle_threshold_percent: float,
    source: str = SOURCE,
    previous: Mapping[str, tuple[datetime, float]] | None = None,
) -> list[GpuSummary]:
    """One GpuSummary per GPU of SCRAPE: a scrape is one sample standing for one window.

    A GPU without a utilisation reading covers nothing (sample_count 0, covered 0 s): its seconds
    stay unmeasured rather than idle or busy. DCGM cannot tell whether a process is on the GPU,
    so no_process_seconds is None. energy_joules is None: the head computes it as the delta of
    energy_joules_total between consecutive scrapes of the same GPU (energy_method "counter"),
    unless PREVIOUS is given (per GPU, its counter's reading before this window, where there is
    one): then each window has the energy window_energy gives. A MIG instance carries no power:
    the exporter repeats the parent GPU's power on every instance, and summing those would count
    it several times. A GPU in MIG mode gives no summary of its own: its time is that of its
    instances (counted once, as their shares).
    """
    summaries: list[GpuSummary] = []
    for gpu in scrape.gpus:
        if gpu.mig_parent:
            continue
        util = gpu.util_percent
        measured = util is not None
        is_mig = bool(gpu.parent_gpu_uuid or gpu.mig_profile)
        power = None if is_mig else gpu.power_watts
        energy: tuple[float | None, str] = (None, "")
        if previous is not None:
            energy = window_energy(
                scrape.at,
                window_seconds,
                power_mean_watts=power,
                total_joules=gpu.energy_joules_total,
                previous=previous.get(gpu.gpu_uuid),
            )
        summaries.append(
            GpuSummary(
                source=source,
                node=scrape.node,
                gpu_uuid=gpu.gpu_uuid,
                window_start_at=scrape.at,
                window_seconds=window_seconds,
                util_metric=gpu.util_metric,
                sample_count=1 if measured else 0,
                covered_seconds=window_seconds if measured else 0.0,
                util_mean_percent=util,
                util_max_percent=util,
                idle_seconds=window_seconds if util is not None and util < idle_threshold_percent else 0.0,
                no_process_seconds=None,
                memory_used_mean_bytes=gpu.memory_used_bytes,
                memory_used_max_bytes=gpu.memory_used_bytes,
                memory_total_bytes=gpu.memory_total_bytes,
                power_mean_watts=power,
                energy_joules=energy[0],
                energy_method=energy[1],
                temperature_max_celsius=gpu.temperature_celsius,
                sm_clock_max_mhz=gpu.sm_clock_mhz,
                job_ids=gpu.job_ids,
            )
        )
    return summaries


def window_energy(
    window_start_at: datetime,
    window_seconds: float,
    *,
    power_mean_watts: float | None,
    total_joules: float | None,
    previous: tuple[datetime, float] | None,
) -> tuple[float | None, str]:
    """The energy of a window and how it was had: the increase of the GPU's energy counter
    (reading TOTAL_JOULES at the window's start) since PREVIOUS (an earlier reading: its time
    and joules) when there is one and the counter has not gone back ("counter"); else power x
    window ("power_integral"); else none."""
    if (
        total_joules is not None
        and previous is not None
        and total_joules >= previous[1]
        and window_start_at > previous[0]
    ):
        return total_joules - previous[1], "counter"
    if power_mean_watts is not None:
        return power_mean_watts * window_seconds, "power_integral"
    return None, ""


def with_window_energy(
    summary: GpuSummary, *, total_joules: float | None, previous: tuple[datetime, float] | None
) -> GpuSummary:
    """SUMMARY with the energy of its window (window_energy) where it has one."""
    joules, method = window_energy(
        summary.window_start_at,
        summary.window_seconds,
        power_mean_watts=summary.power_mean_watts,
        total_joules=total_joules,
        previous=previous,
    )
    if not method:
        return summary
    return dataclasses.replace(summary, energy_joules=joules, energy_method=method)


def dcgm_inventory(scrape: DcgmScrape) -> list[GpuInventory]:
    """The GPUs (and MIG instances) a scrape shows; GPUs without a `gpu` index label are left out.

    A GPU in MIG mode is its instances' parent (mig_mode "enabled", parent of no one, its whole
    share), as the node agent lists it: each physical GPU once, whether or not the scrape has
    series of its own, each instance as its share.
    """
    inventory: list[GpuInventory] = []
    listed = {gpu.gpu_uuid for gpu in scrape.gpus}
    for gpu in scrape.gpus:
        if gpu.gpu_index is None:
            continue
        if gpu.parent_gpu_uuid and gpu.parent_gpu_uuid not in listed:
            # an exporter that labels every series of a GPU in MIG mode with an instance (all
            # of them, not only the profiling fields) shows no parent: it is listed once, from
            # its first instance, so that the node still has its physical GPU
            listed.add(gpu.parent_gpu_uuid)
            inventory.append(
                GpuInventory(
                    node=scrape.node,
                    gpu_uuid=gpu.parent_gpu_uuid,
                    index=gpu.gpu_index,
                    model=gpu.model,
                    observed_at=scrape.at,
                    minor_number=gpu.minor_number,
                    pci_bus_id=gpu.pci_bus_id,
                    driver_version=gpu.driver_version,
                    cuda_version=gpu.cuda_version,
                    vbios_version=gpu.vbios_version,
                    mig_mode="enabled",
                )
            )
        is_mig = bool(gpu.parent_gpu_uuid or gpu.mig_profile) or gpu.mig_parent
        inventory.append(
            GpuInventory(
                node=scrape.node,
                gpu_uuid=gpu.gpu_uuid,
                index=gpu.gpu_index,
                model=gpu.model,
                observed_at=scrape.at,
                memory_total_bytes=gpu.memory_total_bytes,
                minor_number=gpu.minor_number,
                pci_bus_id=gpu.pci_bus_id,
                driver_version=gpu.driver_version,
                cuda_version=gpu.cuda_version,
                vbios_version=gpu.vbios_version,
                mig_mode="enabled" if is_mig else "",
                parent_gpu_uuid=gpu.parent_gpu_uuid,
                mig_profile=gpu.mig_profile,
                gpu_fraction=_mig_fraction(gpu.mig_profile) if is_mig and not gpu.mig_parent else 1.0,
                # a MIG instance's readings are its parent's: the cap is the parent GPU's
                power_limit_watts=None if is_mig and not gpu.mig_parent else gpu.power_limit_watts,
            )
        )
    return inventory
