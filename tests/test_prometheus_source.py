"""The prometheus source against a real Prometheus (Debian's package, started by the tests: see
tests/prometheus_server.py).

The exactness test backfills a sequence of real dcgm-exporter captures (values varied, see
prometheus_server.scrape_text) at exact instants, reads them back through the source, and
compares every stored window, the inventory and the attribution of jobs on those GPUs with what
the dcgm source stores for the same scrapes at the same instants. Another test has Prometheus
scrape a capture served on loopback. Failures are checked against real answers too: the
server down, a token refused, an answer that is no API answer.
"""

from __future__ import annotations

import argparse
import http.server
import threading
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, ClassVar

import pytest
from sqlalchemy import Engine, text

from slurmtel.attribution import run_attribution
from slurmtel.cli import main
from slurmtel.config import Config, config_from_dict
from slurmtel.errors import ConfigError
from slurmtel.parsers.dcgm import dcgm_summaries, parse_dcgm_metrics
from slurmtel.sources import default_options, get_source
from slurmtel.sources.base import RunContext
from slurmtel.sources.dcgm import DcgmSource
from slurmtel.sources.prometheus import PrometheusApi
from slurmtel.sources.runner import RunOutcome, run_recorded
from slurmtel.store.jobs import write_attempts
from slurmtel.store.telemetry import SUMMARY_COLUMNS
from tests.conftest import _empty_tables
from tests.factories import at, attempt
from tests.prometheus_server import (
    CAPTURE,
    SCRAPES,
    STEP_SECONDS,
    T4,
    PrometheusServer,
    backfill,
    node_name,
    openmetrics,
    self_signed_certificate,
    sequence,
    start_prometheus,
)

T0 = at("2026-12-02T12:00:00")
# the head's clock in these tests: the sequence (T0 .. T0 + 9.5 min) is well behind it
NOW = at("2026-12-02T12:30:00")
NODES = 2


@pytest.fixture(scope="module")
def backfilled(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrometheusServer]:
    """A Prometheus holding the scrape sequence of NODES nodes, backfilled at exact instants,
    and gpu01's power once more under a recording rule's name (RENAMED_POWER)."""
    workdir = tmp_path_factory.mktemp("prometheus-backfilled")
    scrapes = sequence(T0, NODES)
    renamed = [
        (when, "\n".join(_renamed_power(line) for line in text.split("\n") if _is_power(line)), labels)
        for when, text, labels in scrapes
        if labels["instance"].startswith(node_name(1))
    ]
    data = backfill(workdir, openmetrics([*scrapes, *renamed]))
    server = start_prometheus(workdir, data=data)
    yield server
    server.stop()


RENAMED_POWER = "site:gpu_power_watts"


def _is_power(line: str) -> bool:
    return line.startswith("DCGM_FI_DEV_POWER_USAGE{")


def _renamed_power(line: str) -> str:
    return RENAMED_POWER + line[len("DCGM_FI_DEV_POWER_USAGE") :]


def prometheus_config(url: str, **overrides: Any) -> Config:
    return config_from_dict(
        {
            "sources": {
                "dcgm": {"interval_seconds": STEP_SECONDS},
                "prometheus": {
                    "enabled": True,
                    "url": url,
                    "step_seconds": STEP_SECONDS,
                    "delay_seconds": 60,
                    "initial_lookback_seconds": 3600,
                    **overrides,
                },
            }
        }
    )


def collect(ctx: RunContext, config: Config, now: datetime = NOW) -> RunOutcome:
    c = replace(ctx, config=config, clock=lambda: now)
    source = get_source("prometheus")
    return run_recorded(c, "prometheus", "once", lambda: source.collect(c, default_options(source)))


def rows(engine: Engine, sql: str) -> list[tuple[Any, ...]]:
    with engine.connect() as conn:
        return [tuple(r) for r in conn.execute(text(sql))]


# every stored column but the source's name and the batch
SUMMARY = ", ".join(c for c, _ in SUMMARY_COLUMNS if c != "source")
INVENTORY = (
    "node, gpu_uuid, gpu_index, model, memory_total_bytes, minor_number, pci_bus_id, driver_version, "
    "cuda_version, vbios_version, mig_mode, parent_gpu_uuid, mig_profile, gpu_fraction, first_seen_at, "
    "last_seen_at"
)
ATTRIBUTION = (
    "cluster, job_id_raw, submit_at, node, gpu_uuid, day, mapping, gpu_fraction, util_metric, "
    "allocated_seconds, covered_seconds, busy_seconds, idle_seconds, no_process_seconds, "
    "unmeasured_seconds, util_weighted_sum, util_max_percent, memory_used_max_bytes, energy_joules"
)


def stored(engine: Engine) -> dict[str, list[tuple[Any, ...]]]:
    return {
        "summaries": rows(engine, f"SELECT {SUMMARY} FROM gpu_summary ORDER BY gpu_uuid, window_start_at"),
        "inventory": rows(engine, f"SELECT {INVENTORY} FROM gpu_inventory ORDER BY node, gpu_uuid"),
        "attribution": rows(
            engine, f"SELECT {ATTRIBUTION} FROM gpu_attribution ORDER BY job_id_raw, node, gpu_uuid, day"
        ),
    }


def jobs() -> list[Any]:
    """Two jobs on the sequence's GPUs (each node wholly allocated: its 2 GPUs), one starting
    inside a window, one running on past the sequence (unmeasured time)."""
    return [
        attempt(
            job_id_raw=101,
            submit_at=T0 - timedelta(minutes=5),
            nodes=(node_name(1),),
            alloc_gpus=2,
            start_at=T0 + timedelta(seconds=45),
            end_at=T0 + timedelta(minutes=7, seconds=10),
        ),
        attempt(
            job_id_raw=102,
            submit_at=T0 - timedelta(minutes=5),
            nodes=(node_name(2),),
            alloc_gpus=2,
            start_at=T0 + timedelta(minutes=2),
            end_at=T0 + timedelta(minutes=20),
        ),
    ]


def dcgm_path(ctx: RunContext, tmp_path: Path) -> None:
    """The same scrapes through the dcgm source (`collect dcgm --input --node --at`), in order,
    by one source object (its energy counter memory), as a daemon would have scraped them."""
    source = DcgmSource()
    c = replace(ctx, clock=lambda: NOW)
    for when, scrape, labels in sequence(T0, NODES):
        path = tmp_path / "scrape.txt"
        path.write_text(scrape)
        node = labels["instance"].split(":")[0]
        source.ingest(c, path, argparse.Namespace(input_node=node, input_at=when.isoformat()))


def test_windows_inventory_and_attribution_equal_the_dcgm_source(
    ctx: RunContext, backfilled: PrometheusServer, tmp_path: Path
) -> None:
    config = prometheus_config(backfilled.url)
    ctx = replace(ctx, config=config)
    with ctx.engine.begin() as conn:
        write_attempts(conn, jobs())
    dcgm_path(ctx, tmp_path)
    run_attribution(ctx.engine, config, now=NOW)
    expected = stored(ctx.engine)

    _empty_tables(ctx.engine)
    with ctx.engine.begin() as conn:
        write_attempts(conn, jobs())
    outcome = collect(ctx, config)
    assert (outcome.status, outcome.error_kind) == ("ok", ""), outcome.message
    run_attribution(ctx.engine, config, now=NOW)
    got = stored(ctx.engine)

    assert got["summaries"] == expected["summaries"]
    assert got["inventory"] == expected["inventory"]
    assert got["attribution"] == expected["attribution"]
    # and what was compared is the whole sequence: every GPU of both nodes at every instant
    assert len(got["summaries"]) == NODES * 2 * SCRAPES
    assert rows(ctx.engine, "SELECT DISTINCT source FROM gpu_summary") == [("prometheus",)]
    t4 = rows(
        ctx.engine,
        f"SELECT util_metric, util_mean_percent, energy_method, energy_joules FROM gpu_summary "
        f"WHERE gpu_uuid = '{T4}' ORDER BY window_start_at",
    )
    # scrape 0: 20.6 W over the window (no reading before); scrape 1: the counter's 618 J more
    assert t4[0] == ("gpu_util", 1.0, "power_integral", pytest.approx(20.6 * STEP_SECONDS))
    assert t4[1] == ("gpu_util", 38.0, "counter", pytest.approx(20.6 * STEP_SECONDS))
    assert t4[7][:2] == ("", None)  # 4294967295 is no utilisation: unmeasured
    mapped = rows(
        ctx.engine,
        "SELECT job_id_raw, count(*), sum(covered_seconds), sum(unmeasured_seconds) "
        "FROM gpu_attribution WHERE gpu_uuid <> '' GROUP BY 1 ORDER BY 1",
    )
    assert [r[:2] for r in mapped] == [(101, 2), (102, 2)]
    assert mapped[1][3] > 0  # job 102 runs past the sequence
    assert rows(ctx.engine, "SELECT count(*) FROM quarantine") == [(0,)]


def test_small_chunks_read_the_same_rows_in_more_queries(
    ctx: RunContext, backfilled: PrometheusServer
) -> None:
    whole = collect(ctx, prometheus_config(backfilled.url))
    assert whole.status == "ok"
    one_query = stored(ctx.engine)["summaries"]
    assert any("= 1 queries; 2 nodes" in note for note in whole.result.notes), whole.result.notes

    _empty_tables(ctx.engine)
    before = backfilled.query_range_requests()
    chunked = collect(ctx, prometheus_config(backfilled.url, max_points_per_series=7, nodes_per_query=1))
    assert chunked.status == "ok", chunked.message
    # the window: 11:30:00 .. 12:29:00, 120 windows -> 20 stretches of 6 windows (7 points a
    # series: each query also asks for the window before), x 2 nodes one at a time
    assert any("= 40 queries; 2 nodes" in note for note in chunked.result.notes), chunked.result.notes
    assert backfilled.query_range_requests() - before == 40
    assert stored(ctx.engine)["summaries"] == one_query


def test_a_renamed_metric_is_read_as_its_field(ctx: RunContext, backfilled: PrometheusServer) -> None:
    gpu01 = f"SELECT {SUMMARY} FROM gpu_summary WHERE node = 'gpu01' ORDER BY gpu_uuid, window_start_at"
    assert collect(ctx, prometheus_config(backfilled.url)).status == "ok"
    expected = rows(ctx.engine, gpu01)
    _empty_tables(ctx.engine)
    config = prometheus_config(backfilled.url, metric_names={"DCGM_FI_DEV_POWER_USAGE": RENAMED_POWER})
    assert collect(ctx, config).status == "ok"
    # gpu01's power under its other name, in watts as the field it stands for: the same windows
    assert rows(ctx.engine, gpu01) == expected
    # gpu02 has no such series: no power (and energy from the counter alone)
    assert rows(ctx.engine, "SELECT DISTINCT power_mean_watts FROM gpu_summary WHERE node = 'gpu02'") == [
        (None,)
    ]


def test_the_cursor_moves_on_and_a_range_read_again_stores_nothing_twice(
    ctx: RunContext, backfilled: PrometheusServer
) -> None:
    config = prometheus_config(backfilled.url)
    first = collect(ctx, config)
    assert first.result.rows_written == NODES * 2 * SCRAPES
    scope = backfilled.url
    cursor = rows(
        ctx.engine, f"SELECT cursor_at FROM source_cursor WHERE source = 'prometheus' AND scope = '{scope}'"
    )
    assert cursor == [(at("2026-12-02T12:29:00"),)]  # NOW - delay_seconds, on a step

    before = backfilled.query_range_requests()
    again = collect(ctx, config)
    assert (again.status, again.result.rows_written) == ("ok", 0)
    assert backfilled.query_range_requests() == before  # nothing new to ask for

    later = collect(ctx, config, now=NOW + timedelta(minutes=10))
    assert (later.status, later.result.rows_written) == ("ok", 0)
    assert later.result.window_start_at == at("2026-12-02T12:29:30")
    assert rows(ctx.engine, "SELECT cursor_at FROM source_cursor WHERE source = 'prometheus'") == [
        (at("2026-12-02T12:39:00"),)
    ]

    # the cursor lost (a restored database): the whole range is read again and nothing doubles
    with ctx.engine.begin() as conn:
        conn.execute(text("DELETE FROM source_cursor WHERE source = 'prometheus'"))
    reread = collect(ctx, config)
    assert (reread.status, reread.result.rows_written) == ("ok", 0)
    assert reread.result.rows_read > 0
    assert rows(ctx.engine, "SELECT count(*) FROM gpu_summary") == [(NODES * 2 * SCRAPES,)]


def test_an_explicit_window_is_a_backfill_that_leaves_the_cursor_alone(
    cli_env: Engine, backfilled: PrometheusServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "slurmtel.toml"
    config.write_text(
        f'[site]\nclock = "{NOW.isoformat()}"\n[sources.prometheus]\nenabled = true\nurl = "{backfilled.url}"\n'
    )
    argv = ["--config", str(config), "collect", "prometheus", "--once"]
    # -S between two windows starts at the next one; -E on a window ends with it
    assert main([*argv, "-S", "2026-12-02T12:01:50", "-E", "2026-12-02T12:04:00"]) == 0
    assert "= 1 queries; 2 nodes" in capsys.readouterr().out
    assert rows(cli_env, "SELECT min(window_start_at), max(window_start_at), count(*) FROM gpu_summary") == [
        (at("2026-12-02T12:02:00"), at("2026-12-02T12:04:00"), NODES * 2 * 5)
    ]
    assert rows(cli_env, "SELECT count(*) FROM source_cursor") == [(0,)]
    assert main([*argv, "-S", "garbage"]) == 2


def test_a_prometheus_scraping_a_capture_on_loopback(ctx: RunContext, tmp_path: Path) -> None:
    """Prometheus scrapes the real capture from a loopback server every second, as it scrapes a
    dcgm-exporter (instance relabelled to the node's name and exporter port, as sites do)."""
    body = CAPTURE.read_bytes()
    exporter = _serve(lambda handler: handler.reply(200, body, "text/plain; version=0.0.4"))
    port = exporter.server_address[1]
    config_yaml = (
        "global: {scrape_interval: 1s, scrape_timeout: 1s}\n"
        "scrape_configs:\n"
        "  - job_name: dcgm\n"
        f"    static_configs: [{{targets: ['127.0.0.1:{port}']}}]\n"
        "    relabel_configs: [{target_label: instance, replacement: 'gpu07:9400'}]\n"
    )
    server = start_prometheus(tmp_path, data=tmp_path / "data", config=config_yaml)
    try:
        # wait for ten scrapes (Prometheus' own count of what it stored): 9 s of samples hold at
        # least three whole 2 s windows however the scrapes and the clock fall
        while _stored_samples(server) < 10:
            threading.Event().wait(0.5)
        now = datetime.now(UTC)
        config = prometheus_config(server.url, step_seconds=2, delay_seconds=0, initial_lookback_seconds=60)
        outcome = collect(ctx, config, now=now)
    finally:
        server.stop()
        exporter.shutdown()
    assert outcome.status == "ok", outcome.message
    windows = rows(
        ctx.engine,
        f"SELECT {SUMMARY} FROM gpu_summary WHERE gpu_uuid = '{T4}' ORDER BY window_start_at",
    )
    assert len(windows) >= 3
    assert {w[0] for w in windows} == {"gpu07"}
    # each window is what the dcgm source makes of the same scrape at that instant (energy
    # aside: it depends on which windows are next to each other, which the scrape timing decides)
    reading = parse_dcgm_metrics(body.decode(), node="gpu07", at=T0)
    (expected,) = [
        s for s in dcgm_summaries(reading, window_seconds=2.0, idle_threshold_percent=5.0) if s.gpu_uuid == T4
    ]
    columns = [c for c, _ in SUMMARY_COLUMNS if c != "source"]
    skip = {"window_start_at", "energy_joules", "energy_method"}
    for window in windows:
        got = {c: v for c, v in zip(columns, window, strict=True) if c not in skip}
        want = {c: getattr(expected, c) for c in columns if c not in skip}
        assert got.pop("job_ids") == list(want.pop("job_ids"))
        numbers = {c for c, v in want.items() if isinstance(v, float)}
        assert {c: v for c, v in got.items() if c not in numbers} == {
            c: v for c, v in want.items() if c not in numbers
        }
        # float4 columns
        assert {c: got[c] for c in numbers} == pytest.approx({c: want[c] for c in numbers}, rel=1e-6)
    # the two T4s (the upstream-edited A10G line has none of the fields the source asks for)
    assert rows(ctx.engine, "SELECT count(DISTINCT gpu_uuid) FROM gpu_inventory WHERE node = 'gpu07'") == [
        (2,)
    ]


def _stored_samples(server: PrometheusServer) -> int:
    import json

    answer = json.loads(server.get("/api/v1/query?query=count_over_time(DCGM_FI_DEV_GPU_UTIL%5B10m%5D)"))
    result = answer["data"]["result"]
    return int(float(result[0]["value"][1])) if result else 0


# ---------------------------------------------------------------- failures


def test_prometheus_down_is_source_unavailable_and_other_sources_still_run(
    cli_env: Engine, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "slurmtel.toml"
    # nothing listens on port 1
    config.write_text(
        '[sources.prometheus]\nenabled = true\nurl = "http://127.0.0.1:1"\ntimeout_seconds = 5\n'
    )
    assert main(["--config", str(config), "collect", "prometheus", "--once"]) == 1
    assert "127.0.0.1:1" in capsys.readouterr().err
    argv = ["--config", str(config), "collect", "dcgm", "--input", str(CAPTURE), "--node", "gpu01"]
    assert main([*argv, "--at", "2026-12-02T13:00:00"]) == 0
    assert rows(cli_env, "SELECT source, status, error_kind FROM collect_run ORDER BY id") == [
        ("prometheus", "error", "source_unavailable"),
        ("dcgm", "ok", ""),
    ]


@pytest.fixture
def cli_env(monkeypatch: pytest.MonkeyPatch, database_url: str, engine: Engine) -> Engine:
    monkeypatch.setenv("SLURMTEL_DATABASE_URL", database_url)
    monkeypatch.delenv("SLURMTEL_CONFIG", raising=False)
    return engine


class _Handler(http.server.BaseHTTPRequestHandler):
    respond: ClassVar[Callable[[_Handler], None]]
    seen: ClassVar[list[tuple[str, str, str]]] = []

    def do_GET(self) -> None:
        self._answer()

    def do_POST(self) -> None:
        self._answer()

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        self.body = self.rfile.read(length) if length else None
        _Handler.seen.append((self.command, self.path, self.headers.get("Authorization", "")))
        type(self).respond(self)

    def reply(self, status: int, body: bytes, content_type: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def _serve(respond: Callable[[_Handler], None]) -> http.server.ThreadingHTTPServer:
    handler = type("Handler", (_Handler,), {"respond": staticmethod(respond)})
    _Handler.seen = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.mark.parametrize(
    "answer",
    [
        b'{"status":"success","data":{"resultType":"vector","result":[]}}',
        b'{"status":"success","data":{"resultType":"matrix","result":[{"metric":{}',
        b"<html>502 Bad Gateway</html>",
    ],
    ids=["vector", "truncated", "html"],
)
def test_an_answer_that_is_no_matrix_is_a_parse_error(ctx: RunContext, answer: bytes) -> None:
    def respond(handler: _Handler) -> None:
        if "/label/" in handler.path:
            handler.reply(200, b'{"status":"success","data":["gpu01:9400"]}')
        else:
            handler.reply(200, answer)

    server = _serve(respond)
    try:
        outcome = collect(ctx, prometheus_config(f"http://127.0.0.1:{server.server_address[1]}"))
    finally:
        server.shutdown()
    assert (outcome.status, outcome.error_kind) == ("error", "parse_error"), outcome.message


def test_the_bearer_token_is_sent(ctx: RunContext, backfilled: PrometheusServer, tmp_path: Path) -> None:
    """A loopback proxy in front of the real Prometheus lets only "Bearer s3cret" through."""

    def respond(handler: _Handler) -> None:
        if handler.headers.get("Authorization") != "Bearer s3cret":
            handler.reply(401, b'{"status":"error","errorType":"unauthorized","error":"no token"}')
            return
        request = urllib.request.Request(
            backfilled.url + handler.path, data=handler.body, method=handler.command
        )
        if handler.body is not None:
            request.add_header("Content-Type", handler.headers["Content-Type"])
        with urllib.request.urlopen(request, timeout=60) as response:
            handler.reply(response.status, response.read())

    proxy = _serve(respond)
    url = f"http://127.0.0.1:{proxy.server_address[1]}"
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    try:
        refused = collect(ctx, prometheus_config(url))
        outcome = collect(ctx, prometheus_config(url, bearer_token_file=str(token)))
    finally:
        proxy.shutdown()
    assert (refused.status, refused.error_kind) == ("error", "source_unavailable")
    assert "HTTP 401" in refused.message and "no token" in refused.message
    assert outcome.status == "ok", outcome.message
    assert outcome.result.rows_written == NODES * 2 * SCRAPES
    with_token = [seen for seen in _Handler.seen if seen[2]]
    assert {(method, auth) for method, _, auth in with_token} == {
        ("GET", "Bearer s3cret"),
        ("POST", "Bearer s3cret"),
    }


def test_https_with_the_ca_file_or_without_verification(ctx: RunContext, tmp_path: Path) -> None:
    """Prometheus serving https (its --web.config.file) with a self-signed certificate."""
    cert, key = self_signed_certificate(tmp_path)
    data = backfill(tmp_path, openmetrics(sequence(T0, 1)))
    server = start_prometheus(tmp_path, data=data, tls=(cert, key))
    try:
        refused = collect(ctx, prometheus_config(server.url))
        verified = collect(ctx, prometheus_config(server.url, ca_file=str(cert)))
        _empty_tables(ctx.engine)
        unverified = collect(ctx, prometheus_config(server.url, insecure_skip_verify=True))
    finally:
        server.stop()
    # the system's CAs do not know the certificate
    assert (refused.status, refused.error_kind) == ("error", "source_unavailable")
    assert "CERTIFICATE_VERIFY_FAILED" in refused.message
    assert (verified.status, verified.result.rows_written) == ("ok", 2 * SCRAPES)
    assert (unverified.status, unverified.result.rows_written) == ("ok", 2 * SCRAPES)


# ---------------------------------------------------------------- config and query


def test_config_section_is_checked() -> None:
    with pytest.raises(ConfigError, match=r"unknown key 'sources\.prometheus\.urll'"):
        config_from_dict({"sources": {"prometheus": {"urll": "http://x"}}})
    with pytest.raises(ConfigError, match=r"sources\.prometheus\.url is required"):
        config_from_dict({"sources": {"prometheus": {"enabled": True}}})
    with pytest.raises(ConfigError, match="must not hold credentials"):
        config_from_dict({"sources": {"prometheus": {"url": "https://user:pw@prom:9090"}}})
    with pytest.raises(ConfigError, match="no DCGM field"):
        config_from_dict({"sources": {"prometheus": {"metrics": ["node_load1"]}}})
    with pytest.raises(ConfigError, match="max_points_per_series"):
        config_from_dict({"sources": {"prometheus": {"max_points_per_series": 1}}})
    with pytest.raises(ConfigError, match="metric_names: 'DCGM_FI_DEV_GPU_TEMP' is not in"):
        config_from_dict(
            {
                "sources": {
                    "prometheus": {
                        "metrics": ["DCGM_FI_DEV_GPU_UTIL"],
                        "metric_names": {"DCGM_FI_DEV_GPU_TEMP": "t"},
                    }
                }
            }
        )


def test_the_query_reads_renamed_metrics_as_their_field() -> None:
    config = config_from_dict(
        {
            "sources": {
                "prometheus": {
                    "url": "http://prom:9090/",
                    "node_label": "Hostname",
                    "metrics": ["DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_POWER_USAGE"],
                    "metric_names": {"DCGM_FI_DEV_POWER_USAGE": "site:gpu_power_watts"},
                }
            }
        }
    )
    api = PrometheusApi(config.sources.prometheus)
    assert api.base_url == "http://prom:9090"
    assert api.query(["gpu01.example.org", 'we"ird']) == (
        'label_replace(last_over_time(DCGM_FI_DEV_GPU_UTIL{Hostname=~"gpu01\\\\.example\\\\.org|we\\"ird"}'
        '[29999ms]), "slurmtel_dcgm_field", "DCGM_FI_DEV_GPU_UTIL", "", "") or '
        'label_replace(last_over_time(site:gpu_power_watts{Hostname=~"gpu01\\\\.example\\\\.org|we\\"ird"}'
        '[29999ms]), "slurmtel_dcgm_field", "DCGM_FI_DEV_POWER_USAGE", "", "")'
    )
