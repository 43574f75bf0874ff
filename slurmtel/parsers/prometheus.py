"""Answers of a Prometheus-compatible HTTP API -> DCGM scrapes, window summaries and inventory.

Pure: text in, records out; no I/O, no clock. The prometheus source asks the server for
dcgm-exporter's series (`/api/v1/query_range`, a "matrix": per series its labels and its
points `[unix seconds, "value"]`) and this module turns each node's samples at one instant
into the same DcgmScrape the dcgm source gets from one `/metrics` scrape
(parsers.dcgm.dcgm_scrapes_from_series), and those into the same window summaries and
inventory (parsers.dcgm.dcgm_summaries, dcgm_inventory): one summariser for both paths.

An answer that is no API answer at all (not JSON, no `data.result`, not a matrix) is a
ParseError; an answer whose status is "error" (the server could not run the query) is
SourceUnavailable; a series or a point that cannot be read is a Rejected and the rest is kept.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import math
import operator
import reprlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson

from slurmtel.errors import ParseError, SourceUnavailable
from slurmtel.parsers.dcgm import (
    DcgmScrape,
    dcgm_inventory,
    dcgm_scrapes_from_series,
    dcgm_summaries,
)
from slurmtel.records import GpuInventory, GpuSummary, Rejected

SOURCE = "prometheus"
# the label the prometheus source's query puts on each series: the DCGM field it is read as
# (a function may drop a series' metric name, and `or` matches series without their names)
FIELD_LABEL = "slurmtel_dcgm_field"
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_UNSEEN = datetime.min  # (not a time any answer holds: _instant gives aware times)
# a raw record in the quarantine is cut to this many characters
_RAW_CHARS = 2000


@dataclass(frozen=True, slots=True)
class PromSeries:
    """One series of a matrix: its labels (metric name as `__name__`) and its points in time order."""

    labels: Mapping[str, str]
    points: tuple[tuple[datetime, float], ...]


@dataclass(frozen=True, slots=True)
class PromMatrix:
    series: tuple[PromSeries, ...]
    # the server's warnings (a partial answer of a federated or remote-read store)
    warnings: tuple[str, ...] = ()
    rejected: tuple[Rejected, ...] = ()
    # points read, the rejected ones included
    points: int = 0


def _load(raw: str | bytes, origin: str) -> dict[str, Any]:
    try:
        document = orjson.loads(raw)
    except (orjson.JSONDecodeError, ValueError, TypeError) as exc:
        raise ParseError(f"{origin}: the answer is not JSON: {exc}") from exc
    if not isinstance(document, dict) or not isinstance(document.get("status"), str):
        raise ParseError(f"{origin}: the answer is no Prometheus API answer (no status)")
    if document["status"] == "error":
        kind = document.get("errorType", "error")
        raise SourceUnavailable(f"{origin}: the server could not answer: {kind}: {document.get('error', '')}")
    if document["status"] != "success":
        raise ParseError(f"{origin}: unknown answer status '{str(document['status'])[:40]}'")
    return document


def _warnings(document: dict[str, Any]) -> tuple[str, ...]:
    warnings = document.get("warnings")
    if not isinstance(warnings, list):
        return ()
    return tuple(str(w) for w in warnings)


def _raw(item: object) -> str:
    try:
        text = orjson.dumps(item).decode()
    except TypeError:  # orjson.JSONEncodeError: nested too deep to write back
        text = reprlib.repr(item)  # a few levels, never the whole depth
    return text[:_RAW_CHARS]


def _instant(value: object) -> datetime | None:
    """Unix seconds (Prometheus gives milliseconds at most) -> an aware UTC datetime."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        return None
    try:
        seconds = float(value)
    except ValueError:
        return None
    if not math.isfinite(seconds) or not -62135596800 <= seconds <= 253402300799:
        return None
    return _EPOCH + timedelta(milliseconds=round(seconds * 1000))


def _series_key(labels: Mapping[str, str]) -> str:
    name = labels.get("__name__", "")
    rest = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()) if k != "__name__")
    return f"{name}{{{rest}}}"


def parse_prometheus_matrix(raw: str | bytes, *, origin: str) -> PromMatrix:
    """Read one `/api/v1/query_range` answer (resultType "matrix").

    A series whose labels are not an object of strings, or whose values are not a list, is
    rejected whole; a point that is not `[time, "number"]` is rejected alone. "NaN" and "±Inf"
    are numbers here: the DCGM reader drops them as impossible readings and counts them.
    """
    document = _load(raw, origin)
    data = document.get("data")
    if not isinstance(data, dict) or not isinstance(data.get("result"), list):
        raise ParseError(f"{origin}: the answer has no data.result list")
    if data.get("resultType") != "matrix":
        raise ParseError(f"{origin}: expected a matrix, got resultType '{str(data.get('resultType'))[:40]}'")
    series: list[PromSeries] = []
    rejected: list[Rejected] = []
    points = 0
    # every series of an answer has the same instants: each is converted once
    instants: dict[int | float | str, datetime | None] = {}
    for number, item in enumerate(data["result"], start=1):
        labels = item.get("metric") if isinstance(item, dict) else None
        values = item.get("values") if isinstance(item, dict) else None
        if not isinstance(labels, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in labels.items()
        ):
            rejected.append(Rejected(SOURCE, origin, f"series {number}", "labels are not text", _raw(item)))
            continue
        key = _series_key(labels)
        if not isinstance(values, list):
            rejected.append(Rejected(SOURCE, origin, key, "no list of values", _raw(item)))
            continue
        kept: list[tuple[datetime, float]] = []
        for point in values:
            points += 1
            at = value = None
            if isinstance(point, list) and len(point) == 2:
                raw_at = point[0]
                # (True == 1 as a key: a bool is no time, and is never looked up)
                if type(raw_at) in (int, float, str):
                    at = instants.get(raw_at, _UNSEEN)
                    if at is _UNSEEN:
                        at = instants[raw_at] = _instant(raw_at)
                else:
                    at = _instant(raw_at)
                if isinstance(point[1], str):
                    try:
                        value = float(point[1])
                    except ValueError:
                        value = None
            if at is None or value is None:
                reason = 'a point is not [unix time, "number"]'
                rejected.append(Rejected(SOURCE, origin, key, reason, _raw(point)))
                continue
            kept.append((at, value))
        kept.sort(key=lambda p: p[0])
        series.append(PromSeries(labels=dict(labels), points=tuple(kept)))
    return PromMatrix(
        series=tuple(series), warnings=_warnings(document), rejected=tuple(rejected), points=points
    )


def parse_label_values(raw: str | bytes, *, origin: str) -> list[str]:
    """Read one `/api/v1/label/NAME/values` answer: the values, sorted."""
    document = _load(raw, origin)
    data = document.get("data")
    if not isinstance(data, list) or not all(isinstance(v, str) for v in data):
        raise ParseError(f"{origin}: the answer's data is not a list of label values")
    return sorted(data)


def node_name(value: str) -> str:
    """The Slurm node a node label's value names, as the dcgm source names a target's node:
    "gpu01:9400", "gpu01.cluster.example.org" and "gpu01" are all gpu01. An IP address
    (with or without a port) stays as it is: there is no name to cut."""
    host = value.strip()
    if host.startswith("["):  # [IPv6]:port
        return host[1:].split("]", 1)[0]
    if host.count(":") == 1:
        name, _, port = host.partition(":")
        if port.isdigit():
            host = name
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return host.split(".", 1)[0]
    return host


def matrix_scrapes(
    matrix: PromMatrix, *, node_label: str, origin: str
) -> tuple[list[DcgmScrape], list[Rejected]]:
    """The matrix's samples as one DcgmScrape per node and instant, in (node, time) order.

    Each series must carry its DCGM field (FIELD_LABEL, else its metric name `__name__`) and
    NODE_LABEL; one that lacks either is rejected (its GPU could not be placed). Samples of
    series that are not DCGM's are read and ignored, as in a scrape.
    """
    rejected: list[Rejected] = []
    named: list[tuple[str, str, Mapping[str, str], Sequence[tuple[datetime, float]]]] = []
    for series in matrix.series:
        name = series.labels.get(FIELD_LABEL) or series.labels.get("__name__", "")
        node_value = series.labels.get(node_label, "")
        if not name or not node_value.strip():
            missing = "no metric name" if not name else f"no '{node_label}' label: its node is unknown"
            rejected.append(
                Rejected(SOURCE, origin, _series_key(series.labels), missing, _raw(series.labels))
            )
            continue
        labels = {k: v for k, v in series.labels.items() if k not in ("__name__", FIELD_LABEL)}
        named.append((name, node_name(node_value), labels, series.points))
    return dcgm_scrapes_from_series(named), rejected


def scrape_summaries(
    scrapes: Sequence[DcgmScrape],
    *,
    window_seconds: float,
    idle_threshold_percent: float,
    since: datetime | None = None,
    source: str = SOURCE,
) -> list[GpuSummary]:
    """The window summaries of SCRAPES (consecutive instants WINDOW_SECONDS apart), each as the
    dcgm source summarises one scrape. A window's energy is the GPU's energy counter's increase
    since the window before, when the scrapes have that one; else power x window. Windows
    before SINCE only give the energy reading of the window before the first kept one.
    """
    step = timedelta(seconds=window_seconds)
    previous: dict[tuple[str, str], tuple[datetime, float]] = {}
    summaries: list[GpuSummary] = []
    for scrape in sorted(scrapes, key=lambda s: (s.at, s.node)):
        # per GPU, its counter's reading of the window before (none across a gap: the
        # counter's increase would span it)
        before: dict[str, tuple[datetime, float]] = {}
        for gpu in scrape.gpus:
            if gpu.mig_parent:
                continue
            key = (scrape.node, gpu.gpu_uuid)
            reading = previous.get(key)
            if reading is not None and reading[0] == scrape.at - step:
                before[gpu.gpu_uuid] = reading
            if gpu.energy_joules_total is not None:
                previous[key] = (scrape.at, gpu.energy_joules_total)
        if since is not None and scrape.at < since:
            continue
        summaries += dcgm_summaries(
            scrape,
            window_seconds=window_seconds,
            idle_threshold_percent=idle_threshold_percent,
            source=source,
            previous=before,
        )
    return summaries


def scrape_inventory(scrapes: Iterable[DcgmScrape], *, since: datetime | None = None) -> list[GpuInventory]:
    """The inventory SCRAPES show, each distinct GPU record at the first and the last instant it
    was seen (what storing every scrape's inventory would leave, in two rows instead of many)."""
    # a record's fields but its time, as a tuple (a record without its time, made by
    # dataclasses.replace, cost most of a source run's reading of its inventory)
    same_record = operator.attrgetter(
        *(f.name for f in dataclasses.fields(GpuInventory) if f.name != "observed_at")
    )
    first: dict[tuple[object, ...], GpuInventory] = {}
    last: dict[tuple[object, ...], GpuInventory] = {}
    for scrape in scrapes:
        if since is not None and scrape.at < since:
            continue
        for gpu in dcgm_inventory(scrape):
            key = same_record(gpu)
            if key not in first or gpu.observed_at < first[key].observed_at:
                first[key] = gpu
            if key not in last or gpu.observed_at > last[key].observed_at:
                last[key] = gpu
    result = list(first.values())
    result += [gpu for key, gpu in last.items() if gpu is not first[key]]
    # stored in time order, so that the latest reading of a GPU's details is the one kept
    return sorted(result, key=lambda gpu: gpu.observed_at)
