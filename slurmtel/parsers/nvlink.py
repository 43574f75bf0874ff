"""`nvidia-smi nvlink ...` output -> per GPU and link: state, speed, remote end, counters.

One reader for the subcommands' line forms, which share the `GPU n: NAME (UUID: ...)` heading
and a `Link N: ...` line per link (indented with 9 spaces by older drivers, a TAB and a space
by newer ones):

- `-s` / `--status`: `Link 0: 25 GB/s`, `Link 3: <inactive>`; `NVML: Unable to retrieve NVLink
  information as all links are inActive`; `Device does not have or support Nvlink`
- `-R`: `Link 4: Remote Device 00000000:D5:00.0: Link 6`
- `-gt d` / `-gt r`: `Link 0: Data Tx: 5863784 KiB`, `Link 0: Raw Rx: 1975423057 KiB`
- `-e`: `Link 0: Replay Errors: 0`, `Recovery Errors`, `CRC Errors` / `CRC Flit Errors`,
  `CRC Data Errors`, `ECC Data Errors`
- `-c`: `Link 0, P2P is supported: true`

Several captures in one text (status, then -R, then -gt d ...) merge per GPU. The agent reads
NVML, not this: the parser builds the fake NVML (slurmtel.agent.fake_nvml) from real
captures. Pure: text in, values out.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
_GPU = re.compile(r"^GPU (\d+): (.+?)(?: \(UUID: ([^)]*)\))?\s*$")
_LINK = re.compile(r"^\s*Link (\d+)\s*[:,]\s*(.*?)\s*$")
_SPEED = re.compile(r"([\d.]+) GB/s")
_REMOTE = re.compile(r"Remote Device ([0-9A-Fa-f]+:[0-9A-Fa-f]+:[0-9A-Fa-f]+\.[0-7]):\s*Link (\d+)")
_THROUGHPUT = re.compile(r"(Data|Raw) (Tx|Rx):\s*(\d+) KiB")
_COUNTER = re.compile(r"([A-Za-z][A-Za-z ]*?) Errors?:\s*(\d+)")
_CAPABILITY = re.compile(r"(.+?):\s*(true|false)$")
_ERROR_NAMES = {
    "replay": "replay",
    "recovery": "recovery",
    "crc": "crc_flit",
    "crc flit": "crc_flit",
    "crc data": "crc_data",
    "ecc data": "ecc_data",
}


@dataclass
class NvlinkLink:
    link: int
    # None when the capture does not say
    active: bool | None = None
    speed_gbps: float | None = None
    remote_pci_bus_id: str = ""
    remote_link: int | None = None
    data_tx_kib: int | None = None
    data_rx_kib: int | None = None
    raw_tx_kib: int | None = None
    raw_rx_kib: int | None = None
    # "replay", "recovery", "crc_flit", "crc_data", "ecc_data" -> count
    errors: dict[str, int] = field(default_factory=dict)
    capabilities: dict[str, bool] = field(default_factory=dict)


@dataclass
class NvlinkGpu:
    index: int
    name: str
    uuid: str
    # False: "Device does not have or support Nvlink"; None: the capture does not say
    supported: bool | None = None
    links: dict[int, NvlinkLink] = field(default_factory=dict)


def parse_nvlink(raw: str | bytes) -> list[NvlinkGpu]:
    """Every GPU the text names, with what it says about each of its links."""
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
    gpus: dict[int, NvlinkGpu] = {}
    current: NvlinkGpu | None = None
    for original in text.splitlines():
        line = _ANSI.sub("", original).replace("\r", "").rstrip()
        if (m := _GPU.match(line)) is not None:
            index = int(m.group(1))
            current = gpus.get(index)
            if current is None:
                current = gpus[index] = NvlinkGpu(index, m.group(2).strip(), (m.group(3) or "").strip())
            elif m.group(3) and not current.uuid:
                current.uuid = m.group(3).strip()
            continue
        if current is None:
            continue
        stripped = line.strip()
        if stripped.startswith("Device does not have or support Nvlink"):
            current.supported = False
            continue
        if "all links are inActive" in stripped or "all links are inactive" in stripped:
            current.supported = True
            continue
        if (m := _LINK.match(line)) is None:
            continue
        current.supported = True
        number, rest = int(m.group(1)), m.group(2)
        link = current.links.setdefault(number, NvlinkLink(number))
        _apply(link, rest)
    return [gpus[i] for i in sorted(gpus)]


def _apply(link: NvlinkLink, rest: str) -> None:
    if rest == "<inactive>":
        link.active = False
    elif (m := _REMOTE.search(rest)) is not None:
        link.remote_pci_bus_id = m.group(1).upper()
        link.remote_link = int(m.group(2))
        link.active = True
    elif (m := _THROUGHPUT.search(rest)) is not None:
        setattr(link, f"{m.group(1).lower()}_{m.group(2).lower()}_kib", int(m.group(3)))
    elif (m := _SPEED.fullmatch(rest)) is not None:
        link.active = True
        link.speed_gbps = float(m.group(1))
    elif (m := _COUNTER.fullmatch(rest)) is not None:
        name = m.group(1).strip().lower()
        link.errors[_ERROR_NAMES.get(name, name.replace(" ", "_"))] = int(m.group(2))
    elif (m := _CAPABILITY.fullmatch(rest)) is not None:
        link.capabilities[m.group(1).strip()] = m.group(2) == "true"


__all__ = ["NvlinkGpu", "NvlinkLink", "parse_nvlink"]
