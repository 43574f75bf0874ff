"""slurmtel.store.sql and slurmtel.store.reader: the read functions on psycopg alone give what
they give on SQLAlchemy (that the read commands load no SQLAlchemy: tests/test_cli_start.py)."""

from __future__ import annotations

import re
import uuid
from datetime import UTC, datetime
from pathlib import Path

import psycopg
import pytest
from sqlalchemy import Engine
from sqlalchemy import text as sqlalchemy_text
from sqlalchemy.dialects.postgresql.psycopg import PGDialect_psycopg
from sqlalchemy.engine import make_url

from slurmtel.access import Identity, Role
from slurmtel.config import Config, load_config
from slurmtel.errors import DatabaseUnavailable, SchemaMissing
from slurmtel.reports.catalog import REPORTS
from slurmtel.reports.researcher import job_document, job_query, me_document, me_query
from slurmtel.reports.spec import build_query, report_document, run_report
from slurmtel.store.reader import NotForPsycopg, connect_arguments, connect_reader
from slurmtel.store.sql import Connection as StoreConnection
from slurmtel.store.sql import ReadConnection, psycopg_sql, text
from tests.factories import load_admin_day

START, END = datetime(2026, 11, 1, tzinfo=UTC), datetime(2026, 11, 2, tzinfo=UTC)
NOW = datetime(2026, 11, 2, 6, tzinfo=UTC)
ADMIN = Identity("root", Role.ADMIN)


@pytest.mark.parametrize(
    ("sql", "expected"),
    [
        ("SELECT :a", "SELECT %(a)s"),
        # as in SQLAlchemy, a name right before a cast is no parameter: CAST(:b AS text) is
        ("SELECT CAST(:a AS int), :b::text", "SELECT CAST(%(a)s AS int), :b::text"),
        ("SELECT x::int, y::timestamptz", "SELECT x::int, y::timestamptz"),
        ("SELECT 10 % 3, 'a%b' LIKE :p", "SELECT 10 %% 3, 'a%%b' LIKE %(p)s"),
        ("SELECT '\\:lit', :a_1", "SELECT ':lit', %(a_1)s"),
        ("SELECT f(:x,:y)", "SELECT f(%(x)s,%(y)s)"),
        ("SELECT 'x':y", "SELECT 'x'%(y)s"),
    ],
)
def test_parameters_are_found_as_sqlalchemy_finds_them(sql: str, expected: str) -> None:
    assert psycopg_sql(sql) == expected
    # the names are SQLAlchemy's own for the same text
    assert sorted(sqlalchemy_text(sql)._bindparams) == sorted(set(re.findall(r"%\((\w+)\)s", expected)))


URLS = [
    "postgresql://postgres@127.0.0.1:5432/slurmtel",
    "postgresql+psycopg://slurm%40tel:p%40ss%3Aw@db.example.org/slurm_db?sslmode=verify-full&sslrootcert=/etc/ca.pem",
    "postgres://u:pw@[::1]:6432/db",
    "postgresql+psycopg://postgres@/slurmtel?host=/run/postgresql",
    "postgresql+psycopg://postgres:@/postgres?host=/tmp/pgserver-x&application_name=slurmtel",
    "postgresql://db.example.org/slurmtel?connect_timeout=3",
    "postgresql://u%2Fx:p%40@h/db%20x?application_name=a%20b",
]


@pytest.mark.parametrize("url", URLS)
def test_connect_arguments_are_sqlalchemys(url: str) -> None:
    """psycopg.connect gets what SQLAlchemy's psycopg dialect would give it for the URL."""
    parsed = make_url(url).set(drivername="postgresql+psycopg")
    args, kwargs = PGDialect_psycopg().create_connect_args(parsed)
    assert args in ([], [""])
    assert connect_arguments(url) == {k: v for k, v in kwargs.items() if k != "context"}


@pytest.mark.parametrize(
    "url",
    [
        "mysql://root@localhost/slurm",
        "postgresql+psycopg2://u@h/db",
        "postgresql://u@/db?host=a:5432&host=b:5432",  # SQLAlchemy's multi-host form
        "not a url",
    ],
)
def test_other_urls_are_left_to_sqlalchemy(url: str) -> None:
    with pytest.raises(NotForPsycopg):
        connect_arguments(url)


@pytest.fixture
def loaded(engine: Engine, config: Config) -> Engine:
    load_admin_day(engine, config)
    return engine


def _reader_config(tmp_path: Path, url: str) -> Config:
    path = tmp_path / "slurmtel.toml"
    path.write_text(f'[site]\nstate_dir = "{tmp_path}"\n\n[database]\nurl = "{url}"\n')
    return load_config(path)


def test_every_report_reads_the_same_on_either_connection(
    loaded: Engine, database_url: str, tmp_path: Path
) -> None:
    config = _reader_config(tmp_path, database_url)
    for spec in REPORTS.values():
        query = build_query(
            spec,
            ADMIN,
            start=START,
            end=END,
            now=NOW,
            zone=config.zone,
            job_filter=None,
            options={p.name: p.default for p in spec.parameters},
            resubmission_window_seconds=config.attribution.resubmission_window_seconds,
            poll_interval_seconds=config.sources.slurmctld.interval_seconds,
        )
        with loaded.connect() as conn:
            expected = report_document(run_report(conn, spec, query))
        with connect_reader(config) as reader:
            assert isinstance(reader, ReadConnection)
            assert report_document(run_report(reader, spec, query)) == expected, spec.name
        assert any(expected.values()), spec.name  # the day has rows for every report


def test_job_and_month_read_the_same_on_either_connection(
    loaded: Engine, database_url: str, tmp_path: Path
) -> None:
    config = _reader_config(tmp_path, database_url)
    for job in ("102", "103", "105"):
        query = job_query(ADMIN, job, clusters=(), now=NOW, zone=config.zone)
        with loaded.connect() as conn:
            expected = job_document(conn, query)
        with connect_reader(config) as reader:
            assert job_document(reader, query) == expected
            assert reader.execute(text("SHOW jit")).scalar() == "off"  # as make_engine's
        assert expected
    for jobs in (False, True):
        month = me_query(
            Identity("carol", Role.USER),
            user=None,
            month="2026-11",
            now=NOW,
            zone=config.zone,
            jobs=jobs,
            top=5,
        )
        with loaded.connect() as conn:
            expected_month = me_document(conn, month)
        with connect_reader(config) as reader:
            assert me_document(reader, month) == expected_month


def test_a_read_connection_answers_as_sqlalchemys(database_url: str, engine: Engine) -> None:
    sql = text("SELECT n, n * 2 AS twice, 'x' AS \"?column?\" FROM generate_series(1, :top) n ORDER BY n")
    with psycopg.connect(**connect_arguments(database_url)) as pg, engine.connect() as sqlalchemy_conn:
        reader = ReadConnection(pg)
        theirs: StoreConnection = sqlalchemy_conn  # a Statement runs on it as text() would
        for top in (0, 1, 3):
            for conn in (reader, theirs):
                assert [tuple(r) for r in conn.execute(sql, {"top": top})] == [
                    (n, 2 * n, "x") for n in range(1, top + 1)
                ]
                assert [r.twice for r in conn.execute(sql, {"top": top}).all()] == [
                    2 * n for n in range(1, top + 1)
                ]
                assert list(conn.execute(sql, {"top": top}).scalars()) == list(range(1, top + 1))
                assert conn.execute(sql, {"top": top}).scalar() == (1 if top else None)
                assert (conn.execute(sql, {"top": top}).first() is None) == (top == 0)
                assert [dict(m) for m in conn.execute(sql, {"top": top}).mappings()] == [
                    {"n": n, "twice": 2 * n, "?column?": "x"} for n in range(1, top + 1)
                ]
        assert reader.execute(sql, {"top": 1}).scalar_one() == 1
        assert reader.execute(sql, {"top": 1}).one().twice == 2
        assert reader.execute(sql, {"top": 1}).mappings().one()["twice"] == 2
        assert reader.execute(sql, {"top": 0}).scalar_one_or_none() is None
        for top in (0, 2):
            with pytest.raises(LookupError):
                reader.execute(sql, {"top": top}).one()
        with pytest.raises(LookupError):
            reader.execute(sql, {"top": 2}).scalar_one_or_none()
        # SET LOCAL holds for the connection's later statements, as in SQLAlchemy's transaction
        reader.execute(text("SET LOCAL work_mem = '7MB'"))
        assert reader.execute(text("SHOW work_mem")).scalar() == "7MB"


def test_the_reader_checks_the_schema_and_says_why_it_cannot_connect(server_url: str, tmp_path: Path) -> None:
    empty = f"slurmtel_test_empty_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(**connect_arguments(server_url), autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{empty}"')
        try:
            url = make_url(server_url).set(database=empty).render_as_string(hide_password=False)
            with (
                pytest.raises(SchemaMissing, match="no slurmtel schema"),
                connect_reader(_reader_config(tmp_path, url)),
            ):
                pass
        finally:
            admin.execute(f'DROP DATABASE IF EXISTS "{empty}" WITH (FORCE)')
    config = _reader_config(tmp_path, "postgresql://nobody:s3cret@127.0.0.1:1/none")
    with pytest.raises(DatabaseUnavailable) as exc, connect_reader(config):
        pass
    assert "cannot connect to PostgreSQL at" in str(exc.value) and "s3cret" not in str(exc.value)
