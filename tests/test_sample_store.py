"""The prometheus sample store (`telemetry.sample_store = "prometheus"`): the windows stay in the
site's Prometheus-compatible server and are read at attribution time and by `slurmtel job`;
PostgreSQL keeps none. Against a real Prometheus (Debian's prometheus, backfilled with promtool)
and a real VictoriaMetrics (Debian's victoria-metrics, the same data imported), each holding
the scrape sequence of real dcgm-exporter captures that tests/test_prometheus_source.py uses:
every report, `slurmtel job` (its document, its plot's windows, and the command end to end)
and a chargeback statement equal what the PostgreSQL store gives on the same data.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, text

from slurmtel.access import EVERYTHING, Identity, Role
from slurmtel.api.app import ReadApi
from slurmtel.attribution import run_attribution
from slurmtel.auth.identity import AuthSettings
from slurmtel.chargeback import build_statement, render_csv
from slurmtel.cli import main
from slurmtel.config import Config, config_from_dict
from slurmtel.errors import ConfigError
from slurmtel.reports.catalog import REPORTS
from slurmtel.reports.researcher import JobQuery, job_document
from slurmtel.reports.spec import build_query, run_report
from slurmtel.sources.base import RunContext
from slurmtel.sources.promapi import WindowReader
from slurmtel.store.jobs import write_attempts
from slurmtel.store.jobview import find_attempts, util_windows
from slurmtel.store.rls import set_transaction_scope
from slurmtel.store.samples import PrometheusSampleStore, _without, sample_store
from slurmtel.store.telemetry import ensure_shadow_tables, load_shadow_windows, write_summaries
from tests.conftest import LoginRoles, _empty_tables
from tests.factories import windows as factory_windows
from tests.prometheus_server import (
    STEP_SECONDS,
    PrometheusServer,
    backfill,
    import_prometheus,
    openmetrics,
    sequence,
    start_prometheus,
    start_victoria,
)
from tests.test_prometheus_source import ATTRIBUTION, NODES, NOW, T0, collect, jobs, rows

MONTH = "2026-12"
RATES = [{"partition": "*", "gpu_model": "*", "price_per_gpu_hour": "2.00", "valid_from": "2026-01-01"}]


@pytest.fixture(scope="module", params=["prometheus", "victoriametrics"])
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[PrometheusServer]:
    """A Prometheus (blocks backfilled by promtool) or a VictoriaMetrics (the same samples
    imported) holding the scrape sequence of NODES nodes from T0."""
    workdir = tmp_path_factory.mktemp(request.param)
    data = openmetrics(sequence(T0, NODES))
    if request.param == "prometheus":
        running = start_prometheus(workdir, data=backfill(workdir, data))
    else:
        running = start_victoria(workdir)
        import_prometheus(running, data)
    yield running
    running.stop()


def config_for(url: str, store: str) -> Config:
    return config_from_dict(
        {
            "site": {"timezone": "UTC"},
            "telemetry": {"sample_store": store},
            "chargeback": {"rates": RATES},
            "sources": {
                "prometheus": {
                    "enabled": True,
                    "url": url,
                    "step_seconds": STEP_SECONDS,
                    "delay_seconds": 60,
                    "initial_lookback_seconds": 3600,
                },
            },
        }
    )


def everything(engine: Engine, config: Config) -> dict[str, Any]:
    """What a site reads: the attribution rows, every report over the month, each job's
    document and its plot's windows, and the month's statement."""
    root = Identity("root", Role.ADMIN)
    month = T0.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    end = (month + timedelta(days=32)).replace(day=1)
    seen: dict[str, Any] = {
        "attribution": rows(
            engine, f"SELECT {ATTRIBUTION} FROM gpu_attribution ORDER BY job_id_raw, node, gpu_uuid, day"
        ),
        "parts": rows(engine, "SELECT * FROM gpu_attribution_part ORDER BY 1, 2, 3, 4, 5, 6, 7"),
    }
    with engine.connect() as conn:
        for name, spec in REPORTS.items():
            query = build_query(spec, root, start=month, end=end, now=NOW, zone=config.zone)
            seen[f"report {name}"] = run_report(conn, spec, query)
    for job in ("101", "102"):
        # each in a transaction of its own, as a command or a request runs it
        with engine.connect() as conn:
            query = JobQuery(job, (), NOW, config.zone, EVERYTHING, samples=sample_store(config))
            seen[f"job {job}"] = job_document(conn, query)
        with engine.connect() as conn:
            (attempt,) = find_attempts(conn, job, scope=EVERYTHING)
            assert attempt.start_at is not None
            end_at = attempt.end_at or NOW
            sample_store(config).prepare_spans(conn, [(attempt.nodes, attempt.start_at, end_at)], now=NOW)
            # the job's GPUs, as the plot asks for them
            uuids = [
                r[0]
                for r in conn.execute(
                    text("SELECT DISTINCT gpu_uuid FROM gpu_inventory WHERE node = ANY (:nodes) ORDER BY 1"),
                    {"nodes": list(attempt.nodes)},
                )
            ]
            seen[f"plot {job}"] = util_windows(conn, uuids, start=attempt.start_at, end=end_at)
    with engine.connect() as conn:
        seen["statement"] = render_csv(build_statement(conn, config, MONTH, NOW))
    return seen


def running_then_ended() -> tuple[list[Any], list[Any]]:
    """The jobs of the Prometheus-source test, job 102 first seen running and then ended inside
    the sequence (a record that changes after its windows were folded in: the next run reads
    its windows again, with no new telemetry to read them with)."""
    first = [replace(j, state="RUNNING", end_at=None) if j.job_id_raw == 102 else j for j in jobs()]
    ended = [replace(j, end_at=T0 + timedelta(minutes=8)) for j in jobs() if j.job_id_raw == 102]
    return first, ended


def replay(ctx: RunContext, config: Config) -> dict[str, Any]:
    """Collect, attribute, job 102 ends, attribute again, then recompute everything: what a site
    reads after each (the last: everything())."""
    first, ended = running_then_ended()
    with ctx.engine.begin() as conn:
        write_attempts(conn, first)
    outcome = collect(replace(ctx, config=config), config)
    assert (outcome.status, outcome.error_kind) == ("ok", ""), outcome.message
    run_attribution(ctx.engine, config, now=NOW)
    seen = {
        "first run": rows(ctx.engine, f"SELECT {ATTRIBUTION} FROM gpu_attribution ORDER BY 1, 2, 3, 4, 5, 6")
    }
    with ctx.engine.begin() as conn:
        write_attempts(conn, ended)
    later = NOW + timedelta(minutes=5)
    result = run_attribution(ctx.engine, config, now=later)
    assert result.attempts >= 1 and result.batches == 0
    seen["after the end"] = rows(
        ctx.engine, f"SELECT {ATTRIBUTION} FROM gpu_attribution ORDER BY 1, 2, 3, 4, 5, 6"
    )
    full = run_attribution(ctx.engine, config, now=later, full=True)
    assert full.packed_windows == 0 or config.telemetry.sample_store == "postgresql"
    seen |= everything(ctx.engine, config)
    return seen


def test_every_report_job_and_statement_equal_the_postgresql_store(
    ctx: RunContext, server: PrometheusServer
) -> None:
    postgresql = config_for(server.url, "postgresql")
    expected = replay(ctx, postgresql)
    stored_windows = rows(ctx.engine, "SELECT count(*) FROM gpu_summary")[0][0]
    assert stored_windows == NODES * 2 * 20

    _empty_tables(ctx.engine)
    remote = config_for(server.url, "prometheus")
    store = sample_store(remote)
    assert isinstance(store, PrometheusSampleStore)
    got = replay(ctx, remote)
    # the source kept the inventory and what was new, and no window: the windows read lived in
    # the transactions that read them
    assert rows(ctx.engine, "SELECT count(*), sum(rows) FROM ingest_batch") == [(NODES, stored_windows)]
    assert rows(ctx.engine, "SELECT count(*) FROM gpu_window") == [(0,)]
    assert rows(ctx.engine, "SELECT count(*) FROM gpu_window_hour") == [(0,)]

    assert got.keys() == expected.keys()
    for key in expected:
        assert got[key] == expected[key], key
    # what was compared holds the jobs' measured GPUs and their power; job 102's end changed them
    assert got["after the end"] != got["first run"]
    assert any(r[1] == 102 and r[10] > 0 for r in got["attribution"])
    documents = got["job 101"]
    assert documents and any(g.get("power_max_watts") for g in documents[0]["gpu_figures"]), documents
    assert len(got["plot 101"]) > 0
    assert b"\n" in got["statement"]


def test_slurmtel_job_reads_the_windows_from_the_server(
    engine: Engine,
    ctx: RunContext,
    server: PrometheusServer,
    database_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`slurmtel job` end to end (the read command's own psycopg connection), on each store: the
    same JSON."""
    monkeypatch.setenv("SLURMTEL_DATABASE_URL", database_url)
    monkeypatch.setattr("slurmtel.commands.common.utc_now", lambda: NOW)
    monkeypatch.setattr(
        "slurmtel.commands.common.current_identity", lambda config: Identity("root", Role.ADMIN)
    )
    out = {}
    for store in ("postgresql", "prometheus"):
        _empty_tables(engine)
        config = config_for(server.url, store)
        with engine.begin() as conn:
            write_attempts(conn, jobs())
        assert collect(replace(ctx, config=config), config).status == "ok"
        run_attribution(engine, config, now=NOW)
        config_file = tmp_path / f"{store}.toml"
        config_file.write_text(
            f'[site]\ntimezone = "UTC"\n[telemetry]\nsample_store = "{store}"\n'
            f'[sources.prometheus]\nurl = "{server.url}"\nstep_seconds = {STEP_SECONDS}\n'
        )
        code = main(
            ["--config", str(config_file), "--log-level", "WARNING", "job", "101", "--format", "json"]
        )
        printed, err = capsys.readouterr()
        assert code == 0, err
        out[store] = json.loads(printed)
    assert out["prometheus"] == out["postgresql"]
    assert any(g.get("power_max_watts") for g in out["prometheus"][0]["gpu_figures"])


def test_a_run_reads_each_window_from_the_server_once(
    ctx: RunContext, server: PrometheusServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The new batches' windows (read for their job ids) are in the transaction's table when the
    dirty attempts' windows are read next: they are not asked for again; and the node label's
    values are listed once for all the run's reads."""
    config = config_for(server.url, "prometheus")
    first, _ = running_then_ended()
    with ctx.engine.begin() as conn:
        write_attempts(conn, first)
    assert collect(replace(ctx, config=config), config).status == "ok"
    reader = WindowReader(config)
    asked: list[tuple[str, str, object]] = []
    listed = []
    list_nodes = reader.api.node_values

    def listing(lo: Any, hi: Any) -> list[str]:
        listed.append((lo, hi))
        return list_nodes(lo, hi)

    monkeypatch.setattr(reader.api, "node_values", listing)

    def counting(nodes: Any, lo: Any, hi: Any, *, now: Any) -> Any:
        for windows in reader(nodes, lo, hi, now=now):
            asked.extend((w.node, w.gpu_uuid, w.window_start_at) for w in windows)
            yield windows

    store = PrometheusSampleStore(counting, STEP_SECONDS)
    monkeypatch.setattr("slurmtel.attribution.sample_store", lambda config: store)
    result = run_attribution(ctx.engine, config, now=NOW)
    assert result.batches == NODES and result.windows > 0
    assert asked and len(asked) == len(set(asked)), "a window was read twice in one run"
    # the nodes' label values listed once for the run's reads (each call lists every node)
    assert len(listed) == 1, listed
    # and the rows are those of a store that reads everything twice (the reads before this change)
    monkeypatch.undo()
    again = rows(ctx.engine, f"SELECT {ATTRIBUTION} FROM gpu_attribution ORDER BY 1, 2, 3, 4, 5, 6")
    run_attribution(ctx.engine, config, now=NOW, full=True)
    assert rows(ctx.engine, f"SELECT {ATTRIBUTION} FROM gpu_attribution ORDER BY 1, 2, 3, 4, 5, 6") == again


def test_a_span_less_what_was_read_already() -> None:
    step = timedelta(seconds=30)
    t = [T0 + k * step for k in range(10)]
    assert _without(t[0], t[9], [], step) == [(t[0], t[9])]
    assert _without(t[0], t[9], [(t[5], t[9])], step) == [(t[0], t[4])]
    assert _without(t[0], t[9], [(t[0], t[9])], step) == []
    assert _without(t[0], t[9], [(t[3], t[4]), (t[7], t[7])], step) == [
        (t[0], t[2]),
        (t[5], t[6]),
        (t[8], t[9]),
    ]
    # a span outside, or touching only the edge
    assert _without(t[2], t[5], [(t[6], t[9])], step) == [(t[2], t[5])]
    assert _without(t[2], t[5], [(t[0], t[2])], step) == [(t[3], t[5])]


def test_the_sample_store_setting_is_checked() -> None:
    with pytest.raises(ConfigError, match="'postgresql' or 'prometheus'"):
        config_from_dict({"telemetry": {"sample_store": "influx"}})
    with pytest.raises(ConfigError, match=r"sources\.prometheus\.url"):
        config_from_dict({"telemetry": {"sample_store": "prometheus"}})
    with pytest.raises(ConfigError, match=r"sources\.agent cannot be enabled"):
        config_from_dict(
            {
                "telemetry": {"sample_store": "prometheus"},
                "sources": {"prometheus": {"url": "http://p:9090"}, "agent": {"enabled": True}},
            }
        )
    with pytest.raises(ConfigError, match="unknown key"):
        config_from_dict({"telemetry": {"sample_stor": "prometheus"}})


def test_a_window_the_postgresql_store_refuses_is_left_out_of_a_read_too(engine: Engine) -> None:
    """A window with a value beyond its column (here a sample count no integer column holds) is
    refused by the PostgreSQL store; read from the site's store it is left out the same way, and
    the windows beside it are kept."""
    good = factory_windows("GPU-a", T0, 3)
    bad = replace(good[1], sample_count=2**40)
    with engine.begin() as conn:
        stats = write_summaries(conn, [good[0], bad, good[2]], source="agent", node="gpu01")
        conn.rollback()
    assert stats.inserted == 2 and [r for r, _ in stats.refused] == [bad]
    with engine.begin() as conn:
        ensure_shadow_tables(conn)
        copied = load_shadow_windows(conn, [(good[0], None), (bad, None), (good[2], 7)])
        held = conn.execute(text("SELECT window_start_at, batch_id FROM gpu_window ORDER BY 1")).all()
    assert copied == 2
    assert [tuple(r) for r in held] == [(good[0].window_start_at, 0), (good[2].window_start_at, 7)]
    # the temporary table went with the transaction
    assert rows(engine, "SELECT count(*) FROM gpu_window") == [(0,)]


def test_the_read_api_role_reads_a_job_from_the_server(
    ctx: RunContext, server: PrometheusServer, login_roles: LoginRoles
) -> None:
    """The API answers /v1/jobs/JOBID as the reader role, under row security with the caller's
    scope: it may make the temporary table the store reads into, and gets what the owner gets."""
    remote = config_for(server.url, "prometheus")
    with ctx.engine.begin() as conn:
        write_attempts(conn, jobs())
    assert collect(replace(ctx, config=remote), remote).status == "ok"
    run_attribution(ctx.engine, remote, now=NOW)
    query = JobQuery("101", (), NOW, remote.zone, EVERYTHING, samples=sample_store(remote))
    with ctx.engine.connect() as conn:
        owner = job_document(conn, query)
    reader = login_roles.reader_engine()
    try:
        with reader.begin() as conn:
            set_transaction_scope(conn, EVERYTHING)
            as_reader = job_document(conn, query)
        # through the API's own reads, more than five times on one connection: the job's
        # statements prepared with one plan (ReadApi.job_transaction) while each transaction
        # makes its temporary table anew
        api = ReadApi(remote, reader, AuthSettings(), lambda: NOW)
        served = [api.job_document(query) for _ in range(8)]
    finally:
        reader.dispose()
    assert as_reader == owner
    assert all(document == owner for document in served)
    assert any(g.get("power_max_watts") for g in as_reader[0]["gpu_figures"])
