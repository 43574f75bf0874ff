"""The daemon's own Prometheus metrics and its small HTTP server.

One private CollectorRegistry per daemon (never the global one). Counters and gauges are
updated by the scheduler as jobs finish; lags, backoff state, the sacct cursor and the node
agents' spool sizes are computed when /metrics is scraped (a custom collector). Database
reads at scrape time are skipped while the database is known to be down, so a scrape never
waits for a dead server; the last values read are served instead.

The same server takes `POST /v1/job-ended` from the EpilogSlurmctld hook
(systemd/slurmtel-epilog.sh): per peer rate-limited, screened without unmunge, then
authenticated (a MUNGE credential of root or SlurmUser bound to the request, or a bearer token:
slurmtel/auth/hook.py); a post that is not gets 401/403/429/503 and moves nothing. /metrics
stays open for Prometheus and holds no per-user data (sources, jobs of the daemon, node names).
The listener is bounded (slurmtel.listen: connections, the time a request may take to arrive,
threads); what it refuses is counted in slurmtel_http_refused{reason}.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from urllib.parse import parse_qs

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector
from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError

from slurmtel import __version__
from slurmtel.actions.metrics import ActionMetrics
from slurmtel.auth.hook import JOB_END_PATH as HOOK_PATH
from slurmtel.auth.hook import (
    MAX_CONCURRENT_CHECKS,
    SUSPECT_CHECKS,
    HookPolicy,
    NeedsCheck,
    PeerPenalty,
    PeerRateLimit,
    check_hook_credential,
    screen_hook_request,
)
from slurmtel.auth.identity import Denied, RequestView
from slurmtel.auth.replay import ReplayCache
from slurmtel.listen import GatedHTTPServer, GatedRequestHandler, ListenLimits, open_files_for
from slurmtel.logs import log_event
from slurmtel.store.daemon import AgentSpool, agent_spools, source_cursors

log = logging.getLogger(__name__)

JOB_END_PATH = HOOK_PATH
_JOB_ID = re.compile(r"[0-9]+(?:_[0-9]+)?(?:\+[0-9]+)?")
_MAX_BODY_BYTES = 4096


@dataclass(frozen=True)
class JobStatus:
    """A scheduled job's backoff state, as /metrics shows it."""

    job: str
    consecutive_failures: int
    backoff_remaining_seconds: float


class DaemonMetrics:
    def __init__(self, sources: Sequence[str], clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self.sources = list(sources)
        self.started_at = clock()
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.source_runs = Counter(
            "slurmtel_source_runs", "Scheduled runs of a source by status", ["source", "status"], registry=r
        )
        self.rows_read = Counter("slurmtel_source_rows_read", "Records a source read", ["source"], registry=r)
        self.rows_written = Counter(
            "slurmtel_source_rows_written", "Rows a source inserted or changed", ["source"], registry=r
        )
        self.rows_quarantined = Counter(
            "slurmtel_source_rows_quarantined", "Records a source quarantined", ["source"], registry=r
        )
        self.schema_unknown = Counter(
            "slurmtel_schema_unknown",
            "Documents in a schema version slurmtel does not know (a newer Slurm), read by the newest "
            "shape it knows",
            ["source", "schema"],
            registry=r,
        )
        self.source_errors = Counter(
            "slurmtel_source_errors",
            "Failed or partial source runs by error class",
            ["source", "kind"],
            registry=r,
        )
        self.last_run_duration = Gauge(
            "slurmtel_source_last_run_duration_seconds", "Duration of the last run", ["source"], registry=r
        )
        self.last_run = Gauge(
            "slurmtel_source_last_run_timestamp_seconds", "When the last run ended", ["source"], registry=r
        )
        self.last_success = Gauge(
            "slurmtel_source_last_success_timestamp_seconds",
            "When the last ok or partial run ended (also runs before this daemon started)",
            ["source"],
            registry=r,
        )
        self.database_errors = Counter(
            "slurmtel_database_errors",
            "Job runs that failed because PostgreSQL could not be reached or written",
            ["job"],
            registry=r,
        )
        self.database_up = Gauge(
            "slurmtel_database_up", "1 when the last database access of any job worked", registry=r
        )
        self.job_runs = Counter(
            "slurmtel_job_runs",
            "Scheduled job runs by result (ok, failed, skipped = inside a backoff)",
            ["job", "result"],
            registry=r,
        )
        self.attribution_runs = Counter(
            "slurmtel_attribution_runs", "Attribution runs by status", ["status"], registry=r
        )
        self.attribution_duration = Gauge(
            "slurmtel_attribution_last_run_duration_seconds",
            "Duration of the last attribution run",
            registry=r,
        )
        self.attribution_attempts = Gauge(
            "slurmtel_attribution_last_run_attempts",
            "Job attempts the last attribution run recomputed",
            registry=r,
        )
        self.attribution_last_success = Gauge(
            "slurmtel_attribution_last_success_timestamp_seconds",
            "When the last attribution run succeeded",
            registry=r,
        )
        self.partitions = Counter(
            "slurmtel_partitions", "Daily gpu_summary partitions created or dropped", ["action"], registry=r
        )
        self.batches_deleted = Counter(
            "slurmtel_ingest_batches_deleted", "Ingest batches forgotten with their partitions", registry=r
        )
        self.job_end_notifications = Counter(
            "slurmtel_job_end_notifications", "Job ends reported by the EpilogSlurmctld hook", registry=r
        )
        self.job_end_refused = Counter(
            "slurmtel_job_end_refused",
            "POST /v1/job-ended refused: unauthenticated, forbidden, rate_limited (the peer's rate, "
            "or a recent failed credential from it), busy, unavailable",
            ["reason"],
            registry=r,
        )
        self.http_refused = Counter(
            "slurmtel_http_refused",
            "Connections the HTTP listener answered itself: connections/address (over the limits, "
            "503), busy (every worker busy, 503), timeout (request not received in time, 408), "
            "head_too_large, body_too_large, bad_length, accept_error, handler_error",
            ["reason"],
            registry=r,
        )
        self.chargeback_closed = Counter(
            "slurmtel_chargeback_months_closed", "Months the daemon closed", registry=r
        )
        # [actions]: deliveries, decisions, and the per-node and per-job gauges of config/alerts
        self.actions = ActionMetrics(r)
        build = Gauge("slurmtel_build_info", "slurmtel version", ["version"], registry=r)
        build.labels(version=__version__).set(1)
        Gauge("slurmtel_start_time_seconds", "When the daemon started", registry=r).set(self.started_at)
        self.database_ok = True
        self.database_up.set(1)
        self._last_success: dict[str, float] = {}
        self._lock = threading.Lock()
        self.job_status: Callable[[], Iterable[JobStatus]] = list
        self.database = DatabaseReadings(None)
        r.register(_ScrapeTimeCollector(self))

    def set_database_up(self, ok: bool) -> None:
        self.database_ok = ok
        self.database_up.set(1 if ok else 0)

    def seed_last_success(self, times: dict[str, datetime]) -> None:
        """Last successes from before this process (collect_run), so lags survive restarts."""
        for source, at in times.items():
            self._note_success(source, at.timestamp())

    def _note_success(self, source: str, at: float) -> None:
        with self._lock:
            if at > self._last_success.get(source, 0.0):
                self._last_success[source] = at
                self.last_success.labels(source=source).set(at)

    def source_run(
        self,
        source: str,
        *,
        status: str,
        error_kind: str,
        seconds: float,
        rows_read: int = 0,
        rows_written: int = 0,
        rows_quarantined: int = 0,
        unknown_schemas: Sequence[str] = (),
    ) -> None:
        now = self.clock()
        self.source_runs.labels(source=source, status=status).inc()
        for schema in unknown_schemas:
            self.schema_unknown.labels(source=source, schema=schema).inc()
        self.rows_read.labels(source=source).inc(rows_read)
        self.rows_written.labels(source=source).inc(rows_written)
        self.rows_quarantined.labels(source=source).inc(rows_quarantined)
        if status == "error" or error_kind:
            self.source_errors.labels(source=source, kind=error_kind or "error").inc()
        elif status == "partial":
            self.source_errors.labels(source=source, kind="quarantined").inc()
        self.last_run_duration.labels(source=source).set(seconds)
        self.last_run.labels(source=source).set(now)
        if status in ("ok", "partial"):
            self._note_success(source, now)

    def attribution_run(self, *, ok: bool, seconds: float, attempts: int = 0) -> None:
        self.attribution_runs.labels(status="ok" if ok else "error").inc()
        self.attribution_duration.set(seconds)
        if ok:
            self.attribution_attempts.set(attempts)
            self.attribution_last_success.set(self.clock())

    def lags(self) -> dict[str, float]:
        now = self.clock()
        with self._lock:
            return {s: now - self._last_success.get(s, self.started_at) for s in self.sources}


class DatabaseReadings:
    """The database-backed gauges, read at scrape time; the last good reading while it is down."""

    def __init__(self, engine: Engine | None) -> None:
        self.engine = engine
        self.sacct_cursors: dict[str, datetime] = {}
        self.spools: list[AgentSpool] = []
        self._lock = threading.Lock()

    def refresh(self, database_up: bool) -> None:
        if self.engine is None or not database_up:
            return
        with self._lock:
            try:
                with self.engine.connect() as conn:
                    self.sacct_cursors = source_cursors(conn, "sacct")
                    self.spools = agent_spools(conn)
            except SQLAlchemyError as exc:
                log.debug("metrics: database read failed: %s", exc)


class _ScrapeTimeCollector(Collector):
    def __init__(self, metrics: DaemonMetrics) -> None:
        self.metrics = metrics

    def describe(self) -> Iterable[Metric]:
        return []  # computed at scrape time; nothing to describe up front

    def collect(self) -> Iterator[Metric]:
        m = self.metrics
        now = m.clock()
        lag = GaugeMetricFamily(
            "slurmtel_source_lag_seconds",
            "Seconds since the source's last ok or partial run (since the daemon started when none)",
            labels=["source"],
        )
        for source, seconds in sorted(m.lags().items()):
            lag.add_metric([source], seconds)
        yield lag
        failures = GaugeMetricFamily(
            "slurmtel_job_consecutive_failures", "Failed runs in a row of a scheduled job", labels=["job"]
        )
        backoff = GaugeMetricFamily(
            "slurmtel_job_backoff_seconds",
            "Seconds until a failing job may run again (0 when it is not backing off)",
            labels=["job"],
        )
        for status in m.job_status():
            failures.add_metric([status.job], status.consecutive_failures)
            backoff.add_metric([status.job], max(0.0, status.backoff_remaining_seconds))
        yield failures
        yield backoff
        readings = m.database
        readings.refresh(database_up=m.database_ok)
        cursor = GaugeMetricFamily(
            "slurmtel_sacct_cursor_lag_seconds",
            "Seconds between now and the end of the last stored sacct window, per cluster",
            labels=["scope"],
        )
        for scope, at in sorted(readings.sacct_cursors.items()):
            cursor.add_metric([scope], now - at.timestamp())
        yield cursor
        items = GaugeMetricFamily(
            "slurmtel_agent_spool_items",
            "Items in a node agent's spool, as it last reported",
            labels=["node"],
        )
        size = GaugeMetricFamily(
            "slurmtel_agent_spool_bytes",
            "Bytes in a node agent's spool, as it last reported",
            labels=["node"],
        )
        evicted = CounterMetricFamily(
            "slurmtel_agent_spool_evicted",
            "Items a node agent evicted from its full spool (lost), as it last reported",
            labels=["node"],
        )
        reported = GaugeMetricFamily(
            "slurmtel_agent_report_timestamp_seconds", "When a node agent last reported", labels=["node"]
        )
        for spool in readings.spools:
            items.add_metric([spool.node], spool.spool_items)
            size.add_metric([spool.node], spool.spool_bytes)
            evicted.add_metric([spool.node], spool.evicted_total)
            reported.add_metric([spool.node], spool.updated_at.timestamp())
        yield from (items, size, evicted, reported)


class DaemonHttpServer:
    """GET /metrics and POST /v1/job-ended, on a thread of its own."""

    def __init__(
        self,
        address: str,
        port: int,
        metrics: DaemonMetrics,
        on_job_end: Callable[[str], None],
        *,
        policy: HookPolicy,
        rate_per_second: float = 100.0,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        registry = metrics.registry
        limiter = PeerRateLimit(rate_per_second, burst=max(1.0, 2 * rate_per_second))
        penalty = PeerPenalty()
        replay_cache = ReplayCache()
        checks = threading.BoundedSemaphore(MAX_CONCURRENT_CHECKS)
        suspect_checks = threading.BoundedSemaphore(SUSPECT_CHECKS)
        refused = metrics.job_end_refused

        class Handler(GatedRequestHandler):
            server_version = f"slurmtel/{__version__}"

            def do_GET(self) -> None:
                if self.path.split("?", 1)[0] != "/metrics":
                    self._reply(404, b"not found: try /metrics\n")
                    return
                encoder, content_type = choose_encoder(self.headers.get("Accept", ""))
                self._reply(200, encoder(registry), content_type)

            def do_POST(self) -> None:
                if self.path.split("?", 1)[0] != JOB_END_PATH:
                    self._reply(404, b"not found\n")
                    return
                # the body is small and bounded: the listener has read all of it
                try:
                    length = min(int(self.headers.get("Content-Length", "0")), _MAX_BODY_BYTES)
                except ValueError:
                    length = 0
                body = self.rfile.read(length).decode("utf-8", "replace") if length > 0 else ""
                peer = str(self.client_address[0])
                # cheapest first: a flood is turned away before any credential is looked at
                if not limiter.allow(peer, monotonic()):
                    refused.labels(reason="rate_limited").inc()
                    self._reply(429, b"too many requests\n")
                    return
                request = RequestView.of("POST", self.path, self.headers, peer)
                now = clock()
                who = screen_hook_request(request, policy, replay_cache, now)
                if isinstance(who, NeedsCheck):
                    # unmunge: a slot only for a post that passed every check without one; an
                    # address whose last credential failed shares one slot with all such
                    suspect = penalty.active(peer, monotonic())
                    slots = suspect_checks if suspect else checks
                    if not slots.acquire(blocking=False):
                        refused.labels(reason="rate_limited" if suspect else "busy").inc()
                        self._reply(429 if suspect else 503, b"too many requests\n" if suspect else b"busy\n")
                        return
                    try:
                        who = check_hook_credential(request, who.credential, policy, replay_cache, now)
                    finally:
                        slots.release()
                    if isinstance(who, Denied) and int(who.status) in (401, 403):
                        penalty.penalise(peer, monotonic())
                    elif suspect and not isinstance(who, Denied):
                        penalty.clear(peer)
                if isinstance(who, Denied):
                    reason = {401: "unauthenticated", 403: "forbidden", 429: "rate_limited"}.get(
                        int(who.status), "unavailable"
                    )
                    refused.labels(reason=reason).inc()
                    log.debug("job-ended from %s refused: %s", peer, who.reason)
                    self._reply(int(who.status), f"{who.reason}\n".encode())
                    return
                job_id = (parse_qs(body).get("job_id") or [""])[0].strip()
                if job_id and not _JOB_ID.fullmatch(job_id):
                    self._reply(400, b"job_id must be a Slurm job id\n")
                    return
                on_job_end(job_id)
                self._reply(202, b"accepted\n")

            def _reply(self, code: int, body: bytes, content_type: str = "text/plain; charset=utf-8") -> None:
                try:
                    self.send_response(code)
                    if code == 401:
                        self.send_header(
                            "WWW-Authenticate", 'MUNGE realm="slurmtel", Bearer realm="slurmtel"'
                        )
                    self.send_header("Content-Type", content_type)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except OSError:
                    pass  # the epilog hook hangs up without reading the answer

            def log_message(self, format: str, *args: object) -> None:
                pass  # one log line per event, not per request

        limits = ListenLimits(max_body_bytes=_MAX_BODY_BYTES)
        connections = open_files_for(limits.max_connections)
        if connections < limits.max_connections:
            limits = ListenLimits(max_connections=connections, max_body_bytes=_MAX_BODY_BYTES)
        http_refused = metrics.http_refused
        self.httpd = GatedHTTPServer(
            (address, port),
            Handler,
            limits,
            on_refused=lambda reason: http_refused.labels(reason=reason).inc(),
            name="daemon-http",
            logger=log,
        )
        self._thread: threading.Thread | None = None

    @property
    def address(self) -> tuple[str, int]:
        host, port = self.httpd.server_address[:2]
        return str(host), int(port)

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.1}, name="http", daemon=True
        )
        self._thread.start()
        host, port = self.address
        log_event(log, "listening", address=host, port=port, paths=f"/metrics,{JOB_END_PATH}")

    def stop(self) -> None:
        if self._thread is not None:
            self.httpd.shutdown()
            self._thread.join(timeout=5)
        self.httpd.server_close()
