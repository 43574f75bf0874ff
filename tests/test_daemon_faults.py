"""The daemon under faults (DESIGN §9), with real processes.

- PostgreSQL stopped for a while and started again: the PostgreSQL is this module's own
  (pgserver's binaries in a temporary directory, stopped and started with its pg_ctl), never
  the shared test server. The daemon stays up, backs off, shows the outage in /metrics, and
  catches up: its job rows equal those of an undisturbed ingest of the same captures.
- kill -9 at random moments while it ingests a large synthetic sacct capture, many times,
  then one clean run: the job_attempt totals equal an undisturbed run into a fresh database.
- sacct hanging, a dcgm-exporter unreachable: recorded, and the daemon stays up.
"""

from __future__ import annotations

import http.server
import random
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any, ClassVar

import pytest
from sqlalchemy import Engine, create_engine, text

from slurmtel.config import config_from_dict
from slurmtel.simulate import render_sacct_json, synthetic_jobs
from slurmtel.sources import default_options, get_source
from slurmtel.sources.base import RunContext
from slurmtel.sources.runner import run_recorded
from slurmtel.store.engine import make_engine
from slurmtel.store.migrate import upgrade
from tests.conftest import fixture_path
from tests.test_daemon import (
    DaemonProcess,
    command,
    fake_sacct,
    labelled,
    metric,
    rows,
    wait_for,
)

SACCT_RUNNING = fixture_path("sacct", "slurm-22.05", "sacct-a-running-1.json")
SACCT_FINAL = fixture_path("sacct", "slurm-22.05", "sacct-a-D.json")
DCGM = fixture_path("dcgm", "datadog_dcgm", "metrics.txt")
KILLS = 20
SYNTHETIC_JOBS = 5_000


# ---------------------------------------------------------------- a PostgreSQL of our own


@dataclass
class OwnPostgres:
    """A PostgreSQL this module starts, stops and starts again (pgserver's binaries)."""

    server: Any
    socket_dir: str

    def url(self, database: str) -> str:
        return f"postgresql+psycopg://postgres@/{database}?host={self.socket_dir}"

    def new_database(self) -> str:
        """A fresh database with the slurmtel schema; returns its URL."""
        name = f"slurmtel_{uuid.uuid4().hex[:8]}"
        admin = create_engine(self.url("postgres"), isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
        admin.dispose()
        engine = create_engine(self.url(name))
        upgrade(engine)
        engine.dispose()
        return self.url(name)

    def stop(self) -> None:
        from pgserver._commands import pg_ctl  # type: ignore[attr-defined]

        pg_ctl(["-w", "-m", "fast", "stop"], pgdata=self.server.pgdata, user=self.server.system_user)

    def running(self) -> bool:
        engine = create_engine(self.url("postgres"))
        try:
            with engine.connect():
                return True
        except Exception:
            return False
        finally:
            engine.dispose()

    def start(self) -> None:
        from pgserver._commands import pg_ctl  # type: ignore[attr-defined]

        pg_ctl(
            ["-w", "-o", '-h ""', "-o", f"-k {self.socket_dir}", "-l", str(self.server.log), "start"],
            pgdata=self.server.pgdata,
            user=self.server.system_user,
            timeout=60,
        )


@pytest.fixture(scope="module")
def own_postgres() -> Iterator[OwnPostgres]:
    from urllib.parse import parse_qs, urlparse

    import pgserver

    directory = tempfile.mkdtemp(prefix="slurmtel-faults-pg-")
    server = pgserver.get_server(Path(directory) / "pgdata", cleanup_mode="stop")
    socket_dir = parse_qs(urlparse(server.get_uri()).query)["host"][0]
    yield OwnPostgres(server, socket_dir)
    server.cleanup()
    shutil.rmtree(directory, ignore_errors=True)


def job_totals(url: str) -> tuple[int, float, str]:
    """count, Σ GPU-seconds of ended attempts, and an md5 over every row (all columns but the
    bookkeeping ones: when a row was first seen, changed, and when its sacct output was taken),
    in key order."""
    engine = create_engine(url)
    with engine.connect() as conn:
        columns = (
            conn.execute(
                text(
                    "SELECT column_name FROM information_schema.columns WHERE table_name = 'job_attempt' "
                    "AND column_name NOT IN ('id', 'first_seen_at', 'updated_at', 'captured_at') "
                    "ORDER BY ordinal_position"
                )
            )
            .scalars()
            .all()
        )
        row = conn.execute(
            text(
                f"""
                SELECT count(*),
                       coalesce(sum(alloc_gpus * extract(epoch FROM end_at - start_at))
                                FILTER (WHERE end_at IS NOT NULL AND start_at IS NOT NULL), 0),
                       coalesce(md5(string_agg(ROW({", ".join(columns)})::text, E'\\n'
                                    ORDER BY cluster, job_id_raw, submit_at)), '')
                FROM job_attempt
                """
            )
        ).one()
    engine.dispose()
    return int(row[0]), float(row[1]), str(row[2])


def run_rows(url: str, sql: str) -> list[tuple[Any, ...]]:
    engine = create_engine(url)
    try:
        return rows(engine, sql)
    finally:
        engine.dispose()


def safely(query: Callable[[], Any]) -> Any:
    """QUERY's value, or None while the database is down."""
    try:
        return query()
    except Exception:
        return None


# ---------------------------------------------------------------- PostgreSQL outage


def test_a_postgresql_outage_backs_off_and_catches_up(tmp_path: Path, own_postgres: OwnPostgres) -> None:
    url = own_postgres.new_database()
    capture = tmp_path / "current.json"
    shutil.copy(SACCT_RUNNING, capture)
    sacct, _ = fake_sacct(tmp_path, capture)
    settings = {
        "sources": {"sacct": {"command": sacct, "interval_seconds": 1}},
        "attribution": {"enabled": True, "interval_seconds": 1},
        "daemon": {"backoff_max_seconds": 4},
        "database": {"connect_timeout_seconds": 2},
    }
    daemon = DaemonProcess(tmp_path, settings, url)
    daemon.start()
    try:
        ok_runs = "SELECT count(*) FROM collect_run WHERE source = 'sacct' AND status = 'ok'"
        wait_for(lambda: safely(lambda: run_rows(url, ok_runs)[0][0]) or 0, "the first sacct run")

        own_postgres.stop()
        stopped_at = datetime.now(UTC)
        shutil.copy(SACCT_FINAL, capture)  # jobs end while the database is down

        def outage_visible() -> dict[str, float] | None:
            samples = daemon.metrics()
            seen = {
                "database_errors": metric(samples, "slurmtel_database_errors_total", job="source:sacct") or 0,
                "skipped": metric(samples, "slurmtel_job_runs_total", job="source:sacct", result="skipped")
                or 0,
                "sacct_errors": metric(
                    samples, "slurmtel_source_errors_total", source="sacct", kind="database_unavailable"
                )
                or 0,
                "attribution_errors": metric(samples, "slurmtel_database_errors_total", job="attribution")
                or 0,
                "backoff": metric(samples, "slurmtel_job_backoff_seconds", job="source:sacct") or 0,
                "failures": metric(samples, "slurmtel_job_consecutive_failures", job="source:sacct") or 0,
                "database_up": metric(samples, "slurmtel_database_up") or 0,
                "lag": metric(samples, "slurmtel_source_lag_seconds", source="sacct") or 0,
            }
            wanted = seen["database_errors"] >= 3 and seen["skipped"] >= 1 and seen["backoff"] > 0
            return seen if wanted and seen["attribution_errors"] >= 1 else None

        during = wait_for(outage_visible, "the outage in /metrics")
        assert daemon.alive()
        assert during["database_up"] == 0
        assert during["sacct_errors"] >= 3 and during["failures"] >= 3
        time.sleep(1.0)
        later = daemon.metrics()
        # the lag keeps growing while nothing can be stored
        assert metric(later, "slurmtel_source_lag_seconds", source="sacct") > during["lag"]
        outage_seconds = (datetime.now(UTC) - stopped_at).total_seconds()

        own_postgres.start()
        restarted_at = datetime.now(UTC)
        caught_up = (
            "SELECT min(finished_at) FROM collect_run WHERE source = 'sacct' AND status = 'ok' "
            f"AND started_at >= '{restarted_at.isoformat()}'"
        )
        first_ok = wait_for(
            lambda: safely(lambda: run_rows(url, caught_up)[0][0]), "a sacct run after the outage"
        )
        catch_up_seconds = (first_ok - restarted_at).total_seconds()
        wait_for(
            lambda: metric(daemon.metrics(), "slurmtel_job_consecutive_failures", job="source:sacct") == 0,
            "the backoff to reset",
        )
        after = daemon.metrics()
        assert metric(after, "slurmtel_database_up") == 1
        assert daemon.alive()
        rc, stop_seconds = daemon.terminate()
        assert rc == 0
    finally:
        daemon.kill()
        if not own_postgres.running():
            own_postgres.start()

    # an undisturbed ingest of the same two captures, in process, into a fresh database
    reference = own_postgres.new_database()
    engine = make_engine(config_from_dict({}), reference)
    source = get_source("sacct")
    for snapshot in (SACCT_RUNNING, SACCT_FINAL):
        command_path, _ = fake_sacct(tmp_path, snapshot, name=f"sacct-ref-{snapshot.stem}")
        config = config_from_dict({"sources": {"sacct": {"command": command_path}}})
        ctx = RunContext(config=config, engine=engine)
        options = default_options(source)
        outcome = run_recorded(ctx, "sacct", "once", partial(source.collect, ctx, options))
        assert outcome.status == "ok"
    engine.dispose()
    assert job_totals(url) == job_totals(reference)
    assert job_totals(url)[0] == 22
    print(
        f"PostgreSQL outage of {outage_seconds:.1f} s: caught up {catch_up_seconds:.2f} s after the restart; "
        f"SIGTERM stop {stop_seconds:.2f} s"
    )


# ---------------------------------------------------------------- kill -9


def test_kill_9_during_ingest_loses_and_duplicates_nothing(tmp_path: Path, own_postgres: OwnPostgres) -> None:
    capture = tmp_path / "synthetic.json"
    capture.write_bytes(
        render_sacct_json(synthetic_jobs(SYNTHETIC_JOBS, start=datetime(2026, 11, 1, tzinfo=UTC), seed=7))
    )
    sacct, _ = fake_sacct(tmp_path, capture)
    settings = {"sources": {"sacct": {"command": sacct, "interval_seconds": 3600}}}
    last_ok = (
        "SELECT started_at, finished_at FROM collect_run WHERE source = 'sacct' AND status = 'ok' "
        "ORDER BY id DESC LIMIT 1"
    )

    # the undisturbed run, which also measures how long one ingest takes
    reference = own_postgres.new_database()
    daemon = DaemonProcess(tmp_path, settings, reference, name="reference")
    daemon.start()
    started_at, finished_at = wait_for(lambda: run_rows(reference, last_ok), "the reference run")[0]
    assert daemon.terminate()[0] == 0
    ingest_seconds = (finished_at - started_at).total_seconds()

    # the same capture, killed -9 at a random moment of its ingest, again and again: the kill
    # comes a random time after the run started (by its collect_run row), within the shortest
    # run seen so far (once one run has stored everything, later ones only compare, faster)
    url = own_postgres.new_database()
    seed = random.randrange(1_000_000)
    rng = random.Random(seed)
    # a run cut short is 'interrupted' once the next one has started (its lock went with its
    # process); the last victim's, with no run after it yet, is still 'running'
    running = "SELECT count(*) FROM collect_run WHERE status IN ('running', 'interrupted')"
    latest = "SELECT started_at, status, finished_at FROM collect_run ORDER BY id DESC LIMIT 1"
    delays = []
    ceiling = ingest_seconds
    for i in range(KILLS):
        victim = DaemonProcess(tmp_path, settings, url, name=f"killed-{i}")
        victim.start()
        # each victim records exactly one run before it dies
        wait_for(
            lambda runs=i + 1: run_rows(url, "SELECT count(*) FROM collect_run")[0][0] == runs,  # type: ignore[misc]
            "the run to start",
        )
        run_started_at = run_rows(url, latest)[0][0]
        delay = rng.uniform(0, ceiling)
        delays.append(delay)
        time.sleep(max(0.0, (run_started_at + timedelta(seconds=delay) - datetime.now(UTC)).total_seconds()))
        victim.kill()
        _, status, run_finished_at = run_rows(url, latest)[0]
        if status == "ok":
            ceiling = min(ceiling, (run_finished_at - run_started_at).total_seconds())
    interrupted = run_rows(url, running)[0][0]
    completed = run_rows(url, "SELECT count(*) FROM collect_run WHERE status = 'ok'")[0][0]
    assert interrupted + completed == KILLS

    # then one clean run
    clean = DaemonProcess(tmp_path, settings, url, name="clean")
    clean.start()
    wait_for(
        lambda: run_rows(url, "SELECT count(*) FROM collect_run WHERE status = 'ok'")[0][0] > completed,
        "the clean run",
    )
    assert clean.terminate()[0] == 0
    # the clean run's start marked every run cut short as such: none is left 'running'
    assert run_rows(url, "SELECT count(*) FROM collect_run WHERE status = 'running'")[0][0] == 0
    assert run_rows(url, "SELECT count(*) FROM collect_run WHERE status = 'interrupted'")[0][0] == interrupted

    expected, got = job_totals(reference), job_totals(url)
    print(
        f"kill -9 x{KILLS} (seed {seed}) {min(delays):.2f}..{max(delays):.2f} s into runs of about "
        f"{ingest_seconds:.2f} s: {interrupted} runs cut short, {completed} completed first; totals "
        f"{got[0]} attempts, {got[1]:.0f} GPU-seconds, md5 {got[2]} "
        f"(reference {expected[0]}, {expected[1]:.0f}, {expected[2]})"
    )
    assert got == expected
    assert expected[0] == SYNTHETIC_JOBS
    # kills did land inside runs (a run cut short is 'interrupted'), not only between them
    assert interrupted >= KILLS // 4


# ---------------------------------------------------------------- sources that fail


def test_a_hanging_sacct_times_out_is_recorded_and_the_daemon_stays_up(
    tmp_path: Path, engine: Engine, database_url: str
) -> None:
    sacct = command(tmp_path, "sacct", "sleep 30\n")
    daemon = DaemonProcess(
        tmp_path,
        {
            "sources": {"sacct": {"command": sacct, "interval_seconds": 1, "timeout_seconds": 1}},
            "daemon": {"backoff_max_seconds": 2},
        },
        database_url,
    )
    daemon.start()
    try:
        failed = "SELECT status, error_kind, message FROM collect_run WHERE source = 'sacct' ORDER BY id"

        def two_finished() -> list[tuple[Any, ...]] | None:
            found = rows(engine, failed + " LIMIT 2")
            return found if len(found) == 2 and found[1][0] != "running" else None

        recorded = wait_for(two_finished, "two timed-out sacct runs")
        for status, kind, message in recorded:
            assert (status, kind) == ("error", "source_unavailable")
            assert message.endswith("did not answer within 1 s")
        samples = daemon.metrics()
        assert metric(samples, "slurmtel_source_errors_total", source="sacct", kind="source_unavailable") >= 2  # type: ignore[operator]
        assert metric(samples, "slurmtel_source_runs_total", source="sacct", status="error") >= 2  # type: ignore[operator]
        assert metric(samples, "slurmtel_database_up") == 1  # sacct failed, not the database
        assert labelled(samples, "slurmtel_database_errors_total") == {}
        assert daemon.alive()
        assert daemon.terminate()[0] == 0
        assert "event=source_run source=sacct status=error" in daemon.log()
    finally:
        daemon.kill()


class _Exporter(http.server.BaseHTTPRequestHandler):
    body: ClassVar[bytes] = b""

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args: object) -> None:
        pass


def test_an_unreachable_dcgm_exporter_makes_runs_partial_and_the_daemon_stays_up(
    tmp_path: Path, engine: Engine, database_url: str
) -> None:
    _Exporter.body = DCGM.read_bytes()
    exporter = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Exporter)
    threading.Thread(target=exporter.serve_forever, daemon=True).start()
    daemon = DaemonProcess(
        tmp_path,
        {
            "sources": {
                "sacct": {"enabled": False},
                "dcgm": {
                    "enabled": True,
                    "interval_seconds": 1,
                    "timeout_seconds": 2,
                    # gpu09: nothing listens on port 1
                    "targets": [f"gpu01=127.0.0.1:{exporter.server_address[1]}", "gpu09=127.0.0.1:1"],
                },
            }
        },
        database_url,
    )
    daemon.start()
    try:
        partial = "SELECT status, error_kind, message FROM collect_run WHERE source = 'dcgm' AND status <> 'running'"
        recorded = wait_for(lambda: (found := rows(engine, partial))[1:] and found, "two dcgm runs")
        for status, kind, message in recorded:
            assert (status, kind) == ("partial", "source_unavailable")
            assert message.startswith("gpu09: ")
        # the reachable node's GPUs were stored all the same
        assert rows(engine, "SELECT DISTINCT node FROM gpu_summary") == [("gpu01",)]
        samples = daemon.metrics()
        assert metric(samples, "slurmtel_source_runs_total", source="dcgm", status="partial") >= 2  # type: ignore[operator]
        assert (
            metric(samples, "slurmtel_job_consecutive_failures", job="source:dcgm") == 0
        )  # partial is no failure
        assert metric(samples, "slurmtel_source_last_success_timestamp_seconds", source="dcgm")
        assert daemon.alive()
        assert daemon.terminate()[0] == 0
    finally:
        daemon.kill()
        exporter.shutdown()
        exporter.server_close()
