"""The HTTP side of a Prometheus-compatible server (Prometheus, VictoriaMetrics, Thanos, Mimir):
`/api/v1/label/NAME/values` and `/api/v1/query_range` with the DCGM query of the prometheus
source, bounded (points per series and query, nodes per query) and with timeouts, and the
windows of some nodes read back from it as the prometheus source stores them.

Two users: the prometheus source (slurmtel.sources.prometheus), which reads the series from a
cursor on, and the prometheus sample store (slurmtel.store.samples, `telemetry.sample_store =
"prometheus"`), which reads the windows attribution and `slurmtel job` need when they need them.
Nothing here touches the database.
"""

from __future__ import annotations

import ssl
import urllib.error
import urllib.parse
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

import orjson

from slurmtel.config import Config, PrometheusSourceConfig
from slurmtel.errors import ConfigError
from slurmtel.parsers.dcgm import DcgmScrape
from slurmtel.parsers.prometheus import (
    FIELD_LABEL,
    matrix_scrapes,
    node_name,
    parse_label_values,
    parse_prometheus_matrix,
    scrape_inventory,
    scrape_summaries,
)
from slurmtel.records import GpuSummary
from slurmtel.sources.io import http_request

if TYPE_CHECKING:
    from slurmtel.sources.plausible import Screened

NAME = "prometheus"


def screened_nodes(
    scrapes: Sequence[DcgmScrape],
    config: Config,
    *,
    since: datetime | None,
    now: datetime,
    origin: str,
    inventory: bool = False,
) -> Iterator[tuple[str, list[DcgmScrape], Screened]]:
    """Per node of SCRAPES (one query_range answer's): its scrapes from SINCE on, and its
    windows from SINCE on summarised and screened as the prometheus source stores them (with
    their inventory, INVENTORY): one rule for the source and for the sample store's reads."""
    from slurmtel.sources.plausible import screen_telemetry

    by_node: dict[str, list[DcgmScrape]] = {}
    for scrape in scrapes:
        by_node.setdefault(scrape.node, []).append(scrape)
    for node, node_scrapes in by_node.items():
        kept = [s for s in node_scrapes if since is None or s.at >= since]
        summaries = scrape_summaries(
            node_scrapes,
            window_seconds=float(config.sources.prometheus.step_seconds),
            idle_threshold_percent=config.attribution.idle_threshold_percent,
            since=since,
        )
        screened = screen_telemetry(
            now=now,
            telemetry=config.telemetry,
            source=NAME,
            origin=f"{origin} {node}",
            summaries=summaries,
            inventory=scrape_inventory(kept) if inventory else (),
        )
        yield node, kept, screened


def time_chunks(
    start: datetime, end: datetime, step: int, max_points: int
) -> list[tuple[datetime, datetime]]:
    """[first, last] window starts of each query: at most MAX_POINTS - 1 windows each (a query
    also asks for the window before its first)."""
    per_chunk = timedelta(seconds=step * (max_points - 2))
    chunks = []
    while start <= end:
        last = min(start + per_chunk, end)
        chunks.append((start, last))
        start = last + timedelta(seconds=step)
    return chunks


def _floor(at: datetime, step: int) -> datetime:
    seconds = int(at.timestamp())
    return datetime.fromtimestamp(seconds - seconds % step, at.tzinfo)


def _ceil(at: datetime, step: int) -> datetime:
    floor = _floor(at, step)
    return floor if floor == at else floor + timedelta(seconds=step)


def _span(start: datetime, end: datetime) -> str:
    return f"{start.isoformat()}..{end.isoformat()}"


def _regex_literal(value: str) -> str:
    """VALUE as an RE2 pattern that matches it alone."""
    return "".join("\\" + ch if ch in "\\.^$*+?{}[]|()" else ch for ch in value)


def _promql_string(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


class PrometheusApi:
    """The HTTP calls of one run: GET label values, POST query_range; counts its queries."""

    def __init__(self, cfg: PrometheusSourceConfig) -> None:
        self.cfg = cfg
        self.base_url = cfg.url.rstrip("/")
        self.queries = 0
        self.headers = {"Accept": "application/json"}
        if cfg.bearer_token_file:
            try:
                token = Path(cfg.bearer_token_file).read_text().strip()
            except OSError as exc:
                raise ConfigError(
                    f"sources.prometheus.bearer_token_file: cannot read {cfg.bearer_token_file}: {exc.strerror}"
                ) from exc
            self.headers["Authorization"] = f"Bearer {token}"
        self.context: ssl.SSLContext | None = None
        if self.base_url.startswith("https://"):
            try:
                self.context = ssl.create_default_context(cafile=cfg.ca_file or None)
            except (OSError, ssl.SSLError) as exc:
                raise ConfigError(f"sources.prometheus.ca_file: cannot read {cfg.ca_file}: {exc}") from exc
            if cfg.insecure_skip_verify:
                self.context.check_hostname = False
                self.context.verify_mode = ssl.CERT_NONE
        # queried name -> the DCGM field it is read as
        self.metrics = {cfg.metric_names.get(field, field): field for field in cfg.metrics}

    def node_values(self, start: datetime, end: datetime) -> list[str]:
        """The node label's values of the DCGM series between START and END."""
        match = "{__name__=~" + _promql_string("|".join(_regex_literal(m) for m in self.metrics)) + "}"
        params = urllib.parse.urlencode({"match[]": match, "start": _unix(start), "end": _unix(end)})
        label = urllib.parse.quote(self.cfg.node_label, safe="")
        url = f"{self.base_url}/api/v1/label/{label}/values?{params}"
        return parse_label_values(self._request(url, None), origin=url)

    def query(self, node_values: Sequence[str]) -> str:
        """The PromQL of one query: each metric's latest reading per step, renamed back to its
        DCGM field, for the nodes NODE_VALUES."""
        nodes = _promql_string("|".join(_regex_literal(v) for v in node_values))
        selector = f"{{{self.cfg.node_label}=~{nodes}}}"
        # the step before the window, its start left out: (start - step, start]
        span = f"{self.cfg.step_seconds * 1000 - 1}ms"
        return " or ".join(
            f'label_replace(last_over_time({name}{selector}[{span}]), "{FIELD_LABEL}", "{field}", "", "")'
            for name, field in self.metrics.items()
        )

    def query_range(self, node_values: Sequence[str], start: datetime, end: datetime) -> bytes:
        form = {
            "query": self.query(node_values),
            "start": _unix(start),
            "end": _unix(end),
            "step": str(self.cfg.step_seconds),
            "timeout": f"{self.cfg.timeout_seconds}s",
        }
        self.queries += 1
        return self._request(f"{self.base_url}/api/v1/query_range", urllib.parse.urlencode(form).encode())

    def _request(self, url: str, form: bytes | None) -> bytes:
        headers: Mapping[str, str] = self.headers
        if form is not None:
            headers = {**headers, "Content-Type": "application/x-www-form-urlencoded"}
        return http_request(
            url,
            timeout_seconds=self.cfg.timeout_seconds,
            data=form,
            headers=headers,
            context=self.context,
            shown_url=url.split("?", 1)[0],
            error_detail=_error_detail,
        )


def _error_detail(exc: urllib.error.HTTPError) -> str:
    """The API's own error text of a refused request (`{"status":"error","error":...}`)."""
    try:
        document = orjson.loads(exc.read(4096))
    except (OSError, ValueError):
        return ""
    if isinstance(document, dict) and isinstance(document.get("error"), str):
        return f": {document.get('errorType', 'error')}: {document['error'][:300]}"
    return ""


def _unix(at: datetime) -> str:
    return str(int(at.timestamp()))


class WindowReader:
    """The windows of some nodes over a stretch of time, read from the server of
    [sources.prometheus] as the prometheus source stores them: the same query (each window's
    latest readings, and the window before the first for the energy counter), the same
    summaries, the same screening (a window outside the plausible range is left out, as the
    source quarantines it). The node label's values of the nodes asked for come from a
    label-values call, kept for the reader's later reads inside the time it covered (it asks
    up to `now` at once): a run reads thousands of spans, and each call lists every node."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.cfg = config.sources.prometheus
        self.api = PrometheusApi(self.cfg)
        self.step = self.cfg.step_seconds
        # (from, to, node name -> its node label values) of the last label-values call
        self._values: tuple[datetime, datetime, dict[str, list[str]]] | None = None

    def _node_values(self, lo: datetime, hi: datetime, now: datetime) -> dict[str, list[str]]:
        held = self._values
        if held is None or lo < held[0] or hi > held[1]:
            lo, hi = (lo, max(hi, now)) if held is None else (min(lo, held[0]), max(hi, held[1], now))
            by_node: dict[str, list[str]] = {}
            for value in self.api.node_values(lo, hi):
                by_node.setdefault(node_name(value), []).append(value)
            self._values = held = (lo, hi, by_node)
        return held[2]

    def __call__(
        self, nodes: Sequence[str], first: datetime, last: datetime, *, now: datetime
    ) -> Iterator[list[GpuSummary]]:
        """The windows of NODES (short node names) starting FIRST..LAST (multiples of the step),
        a query's at a time (a whole cluster's hour would not fit in memory at once)."""
        step = timedelta(seconds=self.step)
        known = self._node_values(first - step, last, now)
        values = sorted(v for node in set(nodes) for v in known.get(node, ()))
        if not values:
            return
        groups = [
            values[i : i + self.cfg.nodes_per_query] for i in range(0, len(values), self.cfg.nodes_per_query)
        ]
        for chunk_start, chunk_end in time_chunks(first, last, self.step, self.cfg.max_points_per_series):
            for group in groups:
                origin = f"{self.api.base_url} {chunk_start.isoformat()}..{chunk_end.isoformat()}"
                raw = self.api.query_range(group, chunk_start - step, chunk_end)
                scrapes, _ = matrix_scrapes(
                    parse_prometheus_matrix(raw, origin=origin), node_label=self.cfg.node_label, origin=origin
                )
                summaries: list[GpuSummary] = []
                for _, _, screened in screened_nodes(
                    scrapes, self.config, since=chunk_start, now=now, origin=origin
                ):
                    summaries += screened.summaries
                yield summaries
