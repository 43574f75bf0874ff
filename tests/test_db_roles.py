"""Database roles and row-level security (migration 0010, `slurmtel db roles`,
slurmtel.store.rls), against the real PostgreSQL as the session's login roles.

- the reader (API) without a scope sees no row of any protected table; with a Scope it sees
  exactly what slurmtel_in_scope admits (own user, coordinated accounts, everything), only for the
  transaction that set it; it can write nothing and become no other role;
- the aggregate role (Grafana) reads the slurmtel_agg views and no table;
- the writer (daemon) runs the real ingest, attribution and partition maintenance;
- reports give the same numbers as the reader with the matching scope as they do as the owner;
- `slurmtel db roles` is idempotent and refuses a role row security would not hold.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Iterator
from datetime import date, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Connection, Engine, create_engine, text
from sqlalchemy.exc import ProgrammingError

from slurmtel.access import EVERYTHING, NOTHING, Scope
from slurmtel.cli import main
from slurmtel.config import Config, config_from_dict
from slurmtel.metrics import DaemonMetrics
from slurmtel.scheduler import Schedule
from slurmtel.sources.base import RunContext
from slurmtel.store.jobs import write_attempts
from slurmtel.store.reports_failures import failures_report
from slurmtel.store.reports_idle import idle_report
from slurmtel.store.reports_queue import queue_report
from slurmtel.store.reports_retries import retries_report
from slurmtel.store.rls import ScopeOutsideTransaction, new_scope_key, scope_settings, set_transaction_scope
from slurmtel.store.telemetry import existing_partitions, partition_name
from slurmtel.store.usage import usage_report
from tests.conftest import LoginRoles, drop_login_roles, fixture_path
from tests.factories import at, attempt, load_admin_day

SACCT_LAB = fixture_path("sacct", "slurm-22.05", "sacct-a-D.json")
DAY = date(2026, 11, 1)
START, END, NOW = at("2026-11-01T00:00:00"), at("2026-11-02T00:00:00"), at("2026-11-02T06:00:00")

# the decisions of migration 0010: rows per user (own user and account) ...
OWN_ROWS = ("job_attempt", "pending_job", "retry_link", "action_log")
# ... rows per attempt (visible with their attempt) ...
OF_ATTEMPT = (
    "gpu_attribution",
    "gpu_allocation",
    "attempt_node_day",
    "job_checkpoint",
    "gpu_attribution_part",
)
# ... rows visible with their action (migration 0017) ...
OF_ACTION = ("action_delivery",)
# ... and rows only a scope of everything sees
EVERYTHING_ONLY = (
    "quarantine",
    "gpu_job_span",
    "nccl_log",
    "nccl_run",
    "nccl_run_node",
    "nccl_pickup",
    "chargeback_statement",
    "chargeback_statement_voided",
    "chargeback_audit",
    "node_day_allocation",
    "attribution_progress",
    "action_gpu_streak",
    "action_exclusion",
    "action_mail_request",
    "lustre_job_stat",
)
PROTECTED = OWN_ROWS + OF_ATTEMPT + OF_ACTION + EVERYTHING_ONLY


@pytest.fixture(scope="module")
def reader(login_roles: LoginRoles) -> Iterator[Engine]:
    engine = login_roles.reader_engine()
    yield engine
    engine.dispose()


@pytest.fixture(scope="module")
def writer(login_roles: LoginRoles) -> Iterator[Engine]:
    engine = create_engine(login_roles.url(login_roles.writer))
    yield engine
    engine.dispose()


@pytest.fixture(scope="module")
def aggregate(login_roles: LoginRoles) -> Iterator[Engine]:
    engine = create_engine(login_roles.url(login_roles.aggregate))
    yield engine
    engine.dispose()


def count(conn: Connection, table: str) -> int:
    return int(conn.execute(text(f"SELECT count(*) FROM {table}")).scalar_one())


def keys(conn: Connection, table: str) -> set[tuple[Any, ...]]:
    """(job_id_raw, submit_at) of the rows of TABLE, a per-attempt table."""
    return {tuple(r) for r in conn.execute(text(f"SELECT job_id_raw, submit_at FROM {table}"))}


def owner_keys(engine: Engine, table: str, where: str) -> set[tuple[Any, ...]]:
    """The keys of TABLE's rows whose attempt (job_attempt a) matches WHERE, as the owner."""
    rows = (
        "job_attempt a"
        if table == "job_attempt"
        else f"{table} t JOIN job_attempt a USING (cluster, job_id_raw, submit_at)"
    )
    with engine.connect() as conn:
        return {
            tuple(r)
            for r in conn.execute(text(f"SELECT a.job_id_raw, a.submit_at FROM {rows} WHERE {where}"))
        }


def fill(engine: Engine, config: Config) -> None:
    """The admin day, plus a row in every protected table it leaves empty (as the owner)."""
    load_admin_day(engine, config)
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO gpu_allocation (cluster, job_id_raw, submit_at, node, gpu_index, gpu_uuid, "
                "first_seen_at, last_seen_at) VALUES ('lab', 101, :alice, 'gpu01', 0, 'GPU-A0', :t, :t), "
                "('lab', 102, :bob, 'gpu01', 1, 'GPU-A1', :t, :t)"
            ),
            {"alice": at("2026-10-31T23:50:00"), "bob": at("2026-11-01T07:00:00"), "t": START},
        )
        conn.execute(
            text(
                "INSERT INTO retry_link (cluster, job_id_raw, job_submit_at, prev_job_id_raw, "
                "prev_job_submit_at, prev_end_at, user_name, account, partition, name) "
                "VALUES ('lab', 107, :next, 102, :prev, :end, 'bob', 'chem', 'gpu', 'train')"
            ),
            {
                "next": at("2026-11-01T10:30:00"),
                "prev": at("2026-11-01T07:00:00"),
                "end": at("2026-11-01T10:00:00"),
            },
        )
        conn.execute(
            text(
                "INSERT INTO quarantine (source, origin, record_key, reason, raw, raw_sha256) "
                "VALUES ('sacct', 'test', '1', 'bad', 'alice|train|...', 'x')"
            )
        )
        log_id = conn.execute(
            text(
                "INSERT INTO nccl_log (log_sha256, origin, bytes, runs) VALUES ('x', 'test', 1, 1) RETURNING id"
            )
        ).scalar_one()
        run_id = conn.execute(
            text(
                "INSERT INTO nccl_run (log_id, run_index, run_at, tool, collective, status) "
                "VALUES (:log, 0, :t, 'nccl-tests', 'all_reduce', 'ok') RETURNING id"
            ),
            {"log": log_id, "t": START},
        ).scalar_one()
        conn.execute(text("INSERT INTO nccl_run_node (run_id, node) VALUES (:run, 'gpu01')"), {"run": run_id})
        conn.execute(
            text(
                "INSERT INTO nccl_pickup (cluster, job_id_raw, submit_at, status, path, first_tried_at, "
                "last_tried_at) VALUES ('lab', 101, :alice, 'stored', '/home/alice/nccl.out', :t, :t)"
            ),
            {"alice": at("2026-10-31T23:50:00"), "t": START},
        )
        statement = {"s": at("2026-10-01T00:00:00"), "e": START, "t": NOW}
        columns = (
            "month, month_start_at, month_end_at, closed_at, closed_by, currency, csv, json, csv_sha256, "
            "json_sha256, lines, totals, completed_jobs, settings, format_version"
        )
        values = "'2026-10', :s, :e, :t, 'root', 'EUR', '', '', 'x', 'x', '[]', '{}', '[]', '{}', 2"
        conn.execute(text(f"INSERT INTO chargeback_statement ({columns}) VALUES ({values})"), statement)
        conn.execute(
            text(
                f"INSERT INTO chargeback_statement_voided ({columns}, voided_at, voided_by, reason) "
                f"VALUES ({values}, :t, 'root', 'wrong rates')"
            ),
            statement,
        )
        conn.execute(
            text(
                "INSERT INTO chargeback_audit (at, actor, action, month, csv_sha256) "
                "VALUES (:t, 'root', 'close', '2026-10', 'x')"
            ),
            statement,
        )
        # actions (migration 0017): alice's job, bob's job, a node alert of no user
        for user, account, subject in (
            ("alice", "physics", "job:lab:101"),
            ("bob", "chem", "job:lab:102"),
            ("", "", "node:lab:gpu01"),
        ):
            action = conn.execute(
                text(
                    "INSERT INTO action_log (rule, rule_kind, subject, step, kind, user_name, account, decided_at, "
                    "decided_by, reason, status) VALUES ('r', 'gpus_idle', :subject, 'warning', 'message', :user, "
                    ":account, :t, 'test', 'why', 'pending') RETURNING id"
                ),
                {"subject": subject, "user": user, "account": account, "t": NOW},
            ).scalar_one()
            conn.execute(
                text(
                    "INSERT INTO action_delivery (action_id, channel, target, state, next_try_at) "
                    "VALUES (:id, 'email', 'someone@example.org', 'pending', :t)"
                ),
                {"id": action, "t": NOW},
            )
        conn.execute(
            text(
                "INSERT INTO action_gpu_streak (gpu_uuid, source, node, window_seconds, last_window_end_at, "
                "idle_since_at) VALUES ('GPU-A0', 'agent', 'gpu01', 30, :t, :t)"
            ),
            {"t": NOW},
        )
        conn.execute(
            text(
                "INSERT INTO action_exclusion (user_name, starts_at, ends_at, reason, created_by, created_at) "
                "VALUES ('alice', :s, :t, 'deadline', 'root', :s)"
            ),
            {"s": START, "t": NOW},
        )
        conn.execute(
            text(
                "INSERT INTO action_mail_request (cluster, job_id, recipient, mail_type, mail_subject, received_at) "
                "VALUES ('lab', '101', 'alice@example.org', 'Ended', 'Slurm Job_id=101', :t)"
            ),
            {"t": NOW},
        )
        # issue 26's tables: Lustre jobstats (names can hold uids and hosts), checkpoint
        # estimates of alice's and bob's attempts
        conn.execute(
            text(
                "INSERT INTO lustre_job_stat (target, job_name, snapshot_at, job_id, write_bytes) "
                "VALUES ('fs-OST0000', 'SLURM_JOB101:1000:gpu01', :t, '101', 1)"
            ),
            {"t": NOW},
        )
        for job, submit in ((101, at("2026-10-31T23:50:00")), (102, at("2026-11-01T07:00:00"))):
            conn.execute(
                text(
                    "INSERT INTO job_checkpoint (cluster, job_id_raw, submit_at, episodes, checkpoint_gpu_seconds, "
                    "checkpoint_write_bytes, computed_at) VALUES ('lab', :job, :submit, 1, 30, 1, :t) "
                    "ON CONFLICT DO NOTHING"
                ),
                {"job": job, "submit": submit, "t": NOW},
            )
    with engine.connect() as conn:
        empty = [t for t in PROTECTED if count(conn, t) == 0]
    assert not empty, f"the test data leaves {empty} empty"


def as_reader(reader: Engine, scope: Scope | None, table: str) -> int:
    with reader.begin() as conn:
        if scope is not None:
            set_transaction_scope(conn, scope)
        return count(conn, table)


# ---------------------------------------------------------------- the migration's decisions


def test_row_security_is_on_exactly_where_decided(engine: Engine) -> None:
    with engine.connect() as conn:
        protected = set(
            conn.execute(
                text(
                    "SELECT relname FROM pg_class WHERE relrowsecurity AND NOT relforcerowsecurity "
                    "AND relnamespace = CAST('public' AS regnamespace)"
                )
            ).scalars()
        )
    # scope_key (0016): row security on and no policy at all, beside its privileges taken back
    assert protected == {*PROTECTED, "scope_key"}


def test_every_table_is_granted_to_the_writer_and_the_reader_and_none_to_grafana(engine: Engine) -> None:
    """Also the tables later migrations add (the default privileges of 0010): a table the
    daemon cannot write or the API cannot read fails here, not in production."""
    with engine.connect() as conn:
        grants = conn.execute(
            text(
                """
                SELECT c.relname, c.relkind,
                       has_table_privilege('slurmtel_reader', c.oid, 'SELECT') AS reader_select,
                       has_table_privilege('slurmtel_reader', c.oid, 'INSERT, UPDATE, DELETE, TRUNCATE')
                           AS reader_writes,
                       -- a list of privileges asks for any of them
                       has_table_privilege('slurmtel_writer', c.oid, 'SELECT') AS writer_select,
                       has_table_privilege('slurmtel_writer', c.oid, 'INSERT')
                           AND has_table_privilege('slurmtel_writer', c.oid, 'UPDATE')
                           AND has_table_privilege('slurmtel_writer', c.oid, 'DELETE') AS writer_writes_all,
                       has_table_privilege('slurmtel_writer', c.oid, 'INSERT, UPDATE, DELETE')
                           AS writer_writes_any,
                       has_table_privilege('slurmtel_writer', c.oid, 'TRUNCATE') AS writer_truncate,
                       has_table_privilege('slurmtel_aggregate', c.oid, 'SELECT') AS aggregate_select
                FROM pg_class c
                WHERE c.relnamespace = CAST('public' AS regnamespace) AND c.relkind IN ('r', 'p', 'v')
                  AND NOT c.relispartition
                """
            )
        ).all()
        # a view is read with its owner's rights unless security_invoker (PostgreSQL 15+): the
        # reader would pass row security through it
        definer_views = conn.execute(
            text(
                "SELECT relname FROM pg_class WHERE relnamespace = CAST('public' AS regnamespace) "
                "AND relkind = 'v' AND has_table_privilege('slurmtel_reader', oid, 'SELECT') "
                "AND NOT coalesce('security_invoker=true' = ANY(reloptions), false)"
            )
        ).all()
        agg_views = conn.execute(
            text(
                "SELECT bool_and(has_table_privilege('slurmtel_aggregate', c.oid, 'SELECT')), count(*) "
                "FROM pg_class c WHERE c.relnamespace = CAST('slurmtel_agg' AS regnamespace)"
            )
        ).one()
    assert len(grants) > 30
    for g in grants:
        if g.relname == "scope_key":
            # the API's scope key (0016): no role of slurmtel's reads or writes it, only the owner
            assert not (g.reader_select or g.writer_select or g.writer_writes_any or g.aggregate_select)
            continue
        # (on PostgreSQL 14 the reader may not read job_attempt_outcome: see below)
        assert g.reader_select or g.relkind == "v", g.relname
        assert not g.reader_writes and not g.aggregate_select, g.relname
        assert not g.writer_truncate, g.relname
        assert g.writer_select, g.relname
        if g.relname == "alembic_version":
            assert not g.writer_writes_any
        else:
            assert g.writer_writes_all, g.relname
    assert definer_views == []
    readable, views = agg_views
    assert readable and views >= 10


# ---------------------------------------------------------------- the reader and its scope


def test_the_reader_without_a_scope_sees_no_protected_row(
    engine: Engine, reader: Engine, config: Config
) -> None:
    fill(engine, config)
    for table in PROTECTED:
        assert as_reader(reader, None, table) == 0, table
        assert as_reader(reader, NOTHING, table) == 0, table
    # the view reads job_attempt as its reader (security_invoker), not as its owner
    assert as_reader(reader, None, "job_attempt_outcome") == 0
    # what belongs to no user stays readable
    assert as_reader(reader, None, "node_state") > 0


def test_the_scope_ends_with_its_transaction(engine: Engine, reader: Engine, config: Config) -> None:
    fill(engine, config)
    with reader.connect() as conn:
        with conn.begin():
            set_transaction_scope(conn, EVERYTHING)
            assert count(conn, "job_attempt") == 7
        # the same session, a new transaction: the setting is back to '' (not unset)
        with conn.begin():
            assert count(conn, "job_attempt") == 0
            assert count(conn, "gpu_attribution") == 0


def test_a_user_sees_only_their_own_rows(engine: Engine, reader: Engine, config: Config) -> None:
    fill(engine, config)
    alice = Scope(users=frozenset({"alice"}))
    with reader.begin() as conn:
        set_transaction_scope(conn, alice)
        assert {r[0] for r in conn.execute(text("SELECT DISTINCT user_name FROM job_attempt"))} == {"alice"}
        assert {r[0] for r in conn.execute(text("SELECT DISTINCT user_name FROM pending_job"))} == {"alice"}
        assert {r[0] for r in conn.execute(text("SELECT DISTINCT user_name FROM job_attempt_outcome"))} == {
            "alice"
        }
        for table in OF_ATTEMPT:
            assert keys(conn, table) == owner_keys(engine, table, "a.user_name = 'alice'") != set(), table
        for table in (*EVERYTHING_ONLY, "retry_link"):
            assert count(conn, table) == 0, table
        # the actions on her own jobs and their deliveries; no node alert
        assert [r[0] for r in conn.execute(text("SELECT subject FROM action_log"))] == ["job:lab:101"]
        assert count(conn, "action_delivery") == 1


def test_a_coordinator_sees_their_accounts(engine: Engine, reader: Engine, config: Config) -> None:
    fill(engine, config)
    bob_coordinating_physics = Scope(users=frozenset({"bob"}), accounts=frozenset({"physics"}))
    where = "(a.user_name = 'bob' OR a.account = 'physics')"
    with reader.begin() as conn:
        set_transaction_scope(conn, bob_coordinating_physics)
        assert keys(conn, "job_attempt") == owner_keys(engine, "job_attempt", where)
        assert {
            tuple(r) for r in conn.execute(text("SELECT DISTINCT user_name, account FROM job_attempt"))
        } == {
            ("alice", "physics"),
            ("dave", "physics"),
            ("erin", "physics"),
            ("bob", "chem"),
        }
        for table in OF_ATTEMPT:
            assert keys(conn, table) == owner_keys(engine, table, where), table
        assert count(conn, "retry_link") == 1  # bob's
        assert sorted(r[0] for r in conn.execute(text("SELECT subject FROM action_log"))) == [
            "job:lab:101",
            "job:lab:102",
        ]
        assert {r[0] for r in conn.execute(text("SELECT DISTINCT account FROM pending_job"))} == {
            "physics",
            "chem",
        }
        for table in EVERYTHING_ONLY:
            assert count(conn, table) == 0, table


def test_a_scope_of_everything_sees_every_row(engine: Engine, reader: Engine, config: Config) -> None:
    fill(engine, config)
    with engine.connect() as conn:
        expected = {t: count(conn, t) for t in PROTECTED}
    assert {t: as_reader(reader, EVERYTHING, t) for t in PROTECTED} == expected


def test_names_are_matched_exactly_whatever_they_hold(engine: Engine, reader: Engine) -> None:
    odd = 'a,b"c{d} e\\'
    with engine.begin() as conn:
        write_attempts(
            conn,
            [
                attempt(job_id_raw=1, user=odd, account="x,y"),
                attempt(job_id_raw=2, user="a", account="x"),
                attempt(job_id_raw=3, user="b", account="y"),
            ],
        )
    with reader.begin() as conn:
        set_transaction_scope(conn, Scope(users=frozenset({odd})))
        assert [r[0] for r in conn.execute(text("SELECT user_name FROM job_attempt"))] == [odd]
    with reader.begin() as conn:
        set_transaction_scope(conn, Scope(accounts=frozenset({"x,y", "y"})))
        assert sorted(r[0] for r in conn.execute(text("SELECT job_id_raw FROM job_attempt"))) == [1, 3]


# ---------------------------------------------------------------- a leaked reader login (0016)

SETTINGS = ("slurmtel.scope_all", "slurmtel.scope_users", "slurmtel.scope_accounts", "slurmtel.scope_proof")


def test_a_leaked_reader_login_reads_nothing(
    engine: Engine, reader: Engine, login_roles: LoginRoles, config: Config
) -> None:
    """The red team's way: the reader's login, `SET slurmtel.scope_all = on`, `SET LOCAL
    slurmtel.scope_users = '{bob}'`; then a proof of another key, and the API's own proof
    replayed in another session. Every protected table: zero rows. The API, with the key, as
    before."""
    fill(engine, config)
    leaked = create_engine(login_roles.url(login_roles.reader))  # the login, not the key
    try:
        with leaked.connect() as conn:
            conn.exec_driver_sql("SET slurmtel.scope_all = on")
            assert {t: count(conn, t) for t in PROTECTED} == dict.fromkeys(PROTECTED, 0)
            conn.rollback()
        with leaked.begin() as conn:
            conn.exec_driver_sql("SET LOCAL slurmtel.scope_users = '{bob}'")
            assert count(conn, "job_attempt") == 0
            conn.exec_driver_sql("SET LOCAL slurmtel.scope_all = on")
            conn.exec_driver_sql(f"SET LOCAL slurmtel.scope_proof = '{'0' * 64}'")
            assert count(conn, "job_attempt") == 0
        # a proof made right, for this very session, with a key that is not the database's
        with leaked.begin() as conn:
            session = conn.execute(text("SELECT slurmtel_scope_session()")).scalar_one()
            forged = scope_settings(EVERYTHING, new_scope_key(), session)
            assignments = ", ".join(
                f"set_config('{n}', :{k}, true)" for n, k in zip(SETTINGS, forged, strict=True)
            )
            conn.execute(text(f"SELECT {assignments}"), forged)
            assert count(conn, "job_attempt") == 0 and count(conn, "quarantine") == 0
        # the API's genuine settings and proof, copied into another session: bound to the API's
        with reader.begin() as conn:
            set_transaction_scope(conn, EVERYTHING)
            genuine = [
                conn.execute(text("SELECT current_setting(:n)"), {"n": n}).scalar_one() for n in SETTINGS
            ]
            assert count(conn, "job_attempt") == 7
        with leaked.begin() as conn:
            for name, value in zip(SETTINGS, genuine, strict=True):
                conn.execute(text("SELECT set_config(:n, :v, true)"), {"n": name, "v": value})
            assert {t: count(conn, t) for t in PROTECTED} == dict.fromkeys(PROTECTED, 0)
        # nor may the login read the key
        with leaked.connect() as conn, pytest.raises(ProgrammingError, match="permission denied"):
            conn.execute(text("SELECT inner_pad FROM scope_key"))
    finally:
        leaked.dispose()


def test_the_api_refuses_to_start_on_a_key_the_database_does_not_take(
    engine: Engine, login_roles: LoginRoles, config: Config, tmp_path: Path
) -> None:
    from slurmtel.api.app import ReadApi
    from slurmtel.auth.identity import AuthSettings
    from slurmtel.store.rls import ScopeKeyRefused, write_scope_key

    plain = create_engine(login_roles.url(login_roles.reader))
    other = create_engine(login_roles.url(login_roles.reader))
    try:
        with pytest.raises(ScopeKeyRefused, match=r"api\.scope_key_file is not set"):
            ReadApi(config, plain, AuthSettings(), lambda: NOW)
        with pytest.raises(ScopeKeyRefused, match="another scope key"):
            ReadApi(config, other, AuthSettings(), lambda: NOW, scope_key=new_scope_key())
        # the right key, from api.scope_key_file: the server starts
        key_file = tmp_path / "scope.key"
        write_scope_key(key_file, login_roles.scope_key)
        keyed = dataclasses.replace(config, api=dataclasses.replace(config.api, scope_key_file=str(key_file)))
        ReadApi(keyed, create_engine(login_roles.url(login_roles.reader)), AuthSettings(), lambda: NOW)
        # the owner needs no key: row security does not filter it
        ReadApi(config, engine, AuthSettings(), lambda: NOW)
    finally:
        plain.dispose()
        other.dispose()


def test_the_scope_needs_a_transaction(reader: Engine) -> None:
    with reader.connect() as conn, pytest.raises(ScopeOutsideTransaction):
        set_transaction_scope(conn, EVERYTHING)


@pytest.mark.parametrize(
    "sql",
    [
        "INSERT INTO job_attempt (cluster, job_id_raw, submit_at, job_id, state) VALUES ('lab', 9, now(), '9', 'PENDING')",
        "UPDATE job_attempt SET name = 'x'",
        "DELETE FROM job_attempt",
        "TRUNCATE job_attempt",
        "DELETE FROM gpu_attribution",
        "INSERT INTO node_state (cluster, node, states, gpus_total, gpus_allocated, first_seen_at, last_seen_at) "
        "VALUES ('lab', 'n', '{IDLE}', 1, 0, now(), now())",
        "DELETE FROM quarantine",
        "UPDATE chargeback_statement SET closed_by = 'x'",
        "DELETE FROM alembic_version",
        "SELECT slurmtel_create_summary_partition(CAST('2030-01-01' AS date))",
        "SELECT slurmtel_drop_summary_partition(CAST('2030-01-01' AS date))",
        "CREATE TABLE mine (a int)",
        "DROP TABLE job_attempt",
        "ALTER TABLE job_attempt DISABLE ROW LEVEL SECURITY",
    ],
)
def test_the_reader_cannot_write(reader: Engine, sql: str) -> None:
    with reader.begin() as conn:
        set_transaction_scope(conn, EVERYTHING)  # not even with every row in scope
        with pytest.raises(ProgrammingError, match=r"permission denied|must be owner"):
            conn.execute(text(sql))


def test_the_reader_cannot_become_another_role(reader: Engine, login_roles: LoginRoles) -> None:
    for role in ("slurmtel_writer", login_roles.writer, "slurmtel_aggregate", "postgres"):
        with reader.connect() as conn, pytest.raises(ProgrammingError, match="permission denied"):
            conn.exec_driver_sql(f'SET ROLE "{role}"')
    with reader.connect() as conn, pytest.raises(ProgrammingError, match="permission denied"):
        conn.exec_driver_sql("SET SESSION AUTHORIZATION postgres")


# ---------------------------------------------------------------- Grafana's role


@pytest.mark.parametrize(
    "table",
    [
        *PROTECTED,
        "job_attempt_outcome",
        "gpu_summary",
        "node_state",
        "gpu_event",
        "collect_run",
        "alembic_version",
    ],
)
def test_the_aggregate_role_reads_no_table(aggregate: Engine, table: str) -> None:
    with aggregate.connect() as conn, pytest.raises(ProgrammingError, match="permission denied"):
        conn.execute(text(f"SELECT 1 FROM {table} LIMIT 1"))


def test_the_aggregate_role_reads_the_aggregate_views(
    engine: Engine, aggregate: Engine, config: Config
) -> None:
    fill(engine, config)
    with engine.connect() as conn:
        views = list(
            conn.execute(
                text("SELECT table_name FROM information_schema.views WHERE table_schema = 'slurmtel_agg'")
            )
            .scalars()
            .all()
        )
        expected = {v: count(conn, f"slurmtel_agg.{v}") for v in views}
    assert len(views) >= 10
    with aggregate.connect() as conn:
        # over every row (the views are read with their owner's rights), none with a user name or job id
        assert {v: count(conn, f"slurmtel_agg.{v}") for v in views} == expected
        columns = set(
            conn.execute(
                text("SELECT column_name FROM information_schema.columns WHERE table_schema = 'slurmtel_agg'")
            ).scalars()
        )
    assert columns.isdisjoint({"user_name", "user", "job_id", "job_id_raw", "name", "job_ids", "raw", "path"})
    assert expected["attempts_ended"] > 0 and expected["gpu_days"] > 0


# ---------------------------------------------------------------- the daemon as the writer


def test_the_daemon_runs_as_the_writer(
    engine: Engine,
    writer: Engine,
    reader: Engine,
    login_roles: LoginRoles,
    config: Config,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("SLURMTEL_DATABASE_URL", login_roles.url(login_roles.writer))
    monkeypatch.delenv("SLURMTEL_CONFIG", raising=False)
    monkeypatch.setattr("slurmtel.config.DEFAULT_CONFIG_PATH", Path("/nonexistent/slurmtel.toml"))
    # sacct ingest through the CLI: attempts, runs, cursors; then a cut capture: quarantine
    assert main(["collect", "sacct", "--input", str(SACCT_LAB)]) == 0
    truncated = tmp_path / "cut.json"
    raw = SACCT_LAB.read_bytes()
    truncated.write_bytes(raw[: int(len(raw) * 0.9)])
    assert main(["collect", "sacct", "--input", str(truncated)]) == 3
    assert main(["attribute", "--full"]) == 0
    capsys.readouterr()
    # telemetry (daily partitions made on the way), controller data, attribution, retry links
    load_admin_day(writer, config)
    with engine.connect() as conn:
        assert count(conn, "job_attempt") == 22 + 7
        assert count(conn, "quarantine") == 1
        assert count(conn, "gpu_attribution") > 0 and count(conn, "gpu_job_span") > 0
        assert partition_name(DAY) in existing_partitions(conn)
    # partition maintenance: days ahead made, days past the retention dropped
    ctx = RunContext(
        config=config_from_dict({"telemetry": {"retention_days": 30, "partitions_ahead_days": 2}}),
        engine=writer,
        clock=lambda: at("2026-12-02T14:00:00"),
    )
    schedule = Schedule(ctx, DaemonMetrics([]))
    schedule.run_job("maintenance")
    assert schedule.states["maintenance"].failures == 0
    with engine.connect() as conn:
        partitions = existing_partitions(conn)
    assert partition_name(DAY) not in partitions
    assert {partition_name(date(2026, 12, 2) + timedelta(days=d)) for d in range(3)} <= set(partitions)
    # what the writer wrote, the reader reads with a scope of everything
    assert as_reader(reader, EVERYTHING, "job_attempt") == 29
    # least privilege: rows, not the schema
    for sql in (
        "DROP TABLE job_attempt",
        "ALTER TABLE job_attempt DISABLE ROW LEVEL SECURITY",
        "CREATE TABLE mine (a int)",
    ):
        with (
            writer.connect() as conn,
            pytest.raises(ProgrammingError, match=r"permission denied|must be owner"),
        ):
            conn.execute(text(sql))
    with writer.connect() as conn, pytest.raises(ProgrammingError, match="permission denied"):
        conn.execute(text("UPDATE alembic_version SET version_num = version_num"))


# ---------------------------------------------------------------- reports as the reader


def reports(conn: Connection, scope: Scope) -> dict[str, Any]:
    return {
        "usage": usage_report(conn, start=START, end=END, now=NOW, by="account", scope=scope),
        "usage_by_user": usage_report(conn, start=START, end=END, now=NOW, by="user", scope=scope),
        "idle": idle_report(conn, first_day=DAY, last_day=DAY, scope=scope),
        "queue": queue_report(conn, start=START, end=END, now=NOW, scope=scope),
        "failures": failures_report(conn, start=START, end=END, now=NOW, scope=scope),
        "retries": retries_report(conn, start=START, end=END, now=NOW, scope=scope),
    }


@pytest.mark.parametrize(
    "scope",
    [
        EVERYTHING,
        Scope(users=frozenset({"alice"})),
        Scope(users=frozenset({"bob"}), accounts=frozenset({"physics"})),
    ],
    ids=["everything", "alice", "bob-coordinating-physics"],
)
def test_reports_give_the_same_numbers_as_the_reader(
    engine: Engine, reader: Engine, config: Config, scope: Scope
) -> None:
    fill(engine, config)
    with engine.connect() as conn:
        as_owner = reports(conn, scope)
    with reader.begin() as conn:
        set_transaction_scope(conn, scope)
        as_api = reports(conn, scope)
    assert as_api == as_owner
    assert as_owner["usage"] and as_owner["idle"]["by_account"] and as_owner["retries"]["by_account"]


# ---------------------------------------------------------------- slurmtel db roles


def test_db_roles_is_idempotent_and_refuses_unsafe_roles(
    database_url: str,
    engine: Engine,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("SLURMTEL_DATABASE_URL", database_url)
    monkeypatch.delenv("SLURMTEL_CONFIG", raising=False)
    monkeypatch.setattr("slurmtel.config.DEFAULT_CONFIG_PATH", Path("/nonexistent/slurmtel.toml"))
    tag = uuid.uuid4().hex[:8]
    names = {
        "writer": f"slurmtel_t_w_{tag}",
        "reader": f"slurmtel_t_r_{tag}",
        "aggregate": f"slurmtel_t_a_{tag}",
    }
    argv = ["db", "roles", *(a for kind, name in names.items() for a in (f"--{kind}", name))]
    try:
        assert main(argv) == 0
        first = capsys.readouterr().out
        assert first.count(": created, made a member of") == 3
        assert "no password" in first
        assert main(argv) == 0
        second = capsys.readouterr().out
        assert second.count(": exists, already a member of") == 3
        assert "no password" not in second
        with engine.connect() as conn:
            memberships = {
                tuple(r)
                for r in conn.execute(
                    text(
                        "SELECT r.rolname, g.rolname, r.rolcanlogin FROM pg_auth_members m "
                        "JOIN pg_roles g ON g.oid = m.roleid JOIN pg_roles r ON r.oid = m.member "
                        "WHERE r.rolname = ANY(:names)"
                    ),
                    {"names": list(names.values())},
                )
            }
            zone = conn.execute(
                text(
                    "SELECT s.setconfig FROM pg_db_role_setting s JOIN pg_roles r ON r.oid = s.setrole "
                    "WHERE r.rolname = :name AND s.setdatabase = (SELECT oid FROM pg_database "
                    "WHERE datname = current_database())"
                ),
                {"name": names["aggregate"]},
            ).scalar_one()
        assert memberships == {
            (names["writer"], "slurmtel_writer", True),
            (names["reader"], "slurmtel_reader", True),
            (names["aggregate"], "slurmtel_aggregate", True),
        }
        assert zone == ["TimeZone=UTC"]
        # a reader row security would not hold: a superuser, or one holding the writer's group
        assert main(["db", "roles", "--reader", "postgres", "--writer", names["writer"]]) == 1
        assert "superuser" in capsys.readouterr().err
        swapped = ["db", "roles", "--writer", names["reader"], "--reader", names["writer"]]
        swapped += ["--aggregate", names["aggregate"]]
        assert main(swapped) == 1
        assert "also a member of slurmtel_writer" in capsys.readouterr().err
        # usage errors: one role for two kinds, a group role, a name that is not one
        assert main(["db", "roles", "--writer", "same", "--reader", "same"]) == 2
        for bad in ("slurmtel_reader", "Robert'); DROP TABLE x;--"):
            with pytest.raises(SystemExit) as exit_:
                main(["db", "roles", "--reader", bad])
            assert exit_.value.code == 2
    finally:
        drop_login_roles(engine, list(names.values()))


def test_the_partition_functions_make_and_drop_only_daily_partitions(engine: Engine, writer: Engine) -> None:
    day = date(2031, 1, 1)
    with writer.begin() as conn:
        assert conn.execute(text("SELECT slurmtel_create_summary_partition(:d)"), {"d": day}).scalar_one()
        assert not conn.execute(text("SELECT slurmtel_create_summary_partition(:d)"), {"d": day}).scalar_one()
        assert existing_partitions(conn)[partition_name(day)] == day
        bounds = conn.execute(
            text("SELECT pg_get_expr(relpartbound, oid) FROM pg_class WHERE relname = :n"),
            {"n": partition_name(day)},
        ).scalar_one()
        assert "2031-01-01 00:00:00+00" in bounds and "2031-01-02 00:00:00+00" in bounds
        assert conn.execute(text("SELECT slurmtel_drop_summary_partition(:d)"), {"d": day}).scalar_one()
        assert not conn.execute(text("SELECT slurmtel_drop_summary_partition(:d)"), {"d": day}).scalar_one()
        assert partition_name(day) not in existing_partitions(conn)


def test_db_roles_sets_passwords_and_gives_the_database_the_scope_key(
    database_url: str,
    engine: Engine,
    login_roles: LoginRoles,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from slurmtel.store.rls import install_scope_key, read_scope_key

    monkeypatch.setenv("SLURMTEL_DATABASE_URL", database_url)
    monkeypatch.delenv("SLURMTEL_CONFIG", raising=False)
    monkeypatch.setattr("slurmtel.config.DEFAULT_CONFIG_PATH", Path("/nonexistent/slurmtel.toml"))
    tag = uuid.uuid4().hex[:8]
    names = [f"slurmtel_t_w_{tag}", f"slurmtel_t_r_{tag}", f"slurmtel_t_a_{tag}"]
    secrets_dir, key_file = tmp_path / "secrets", tmp_path / "scope.key"
    argv = ["db", "roles", "--writer", names[0], "--reader", names[1], "--aggregate", names[2]]
    argv += ["--password-dir", str(secrets_dir), "--scope-key-file", str(key_file)]
    try:
        assert main(argv) == 0
        out = capsys.readouterr().out
        assert out.count("password set, written to") == 3 and "scope key made" in out
        for name in names:
            for suffix in (".password", ".url"):
                path = secrets_dir / f"{name}{suffix}"
                assert path.stat().st_mode & 0o777 == 0o600, path
            password = (secrets_dir / f"{name}.password").read_text().strip()
            assert password in (secrets_dir / f"{name}.url").read_text()
        assert key_file.stat().st_mode & 0o777 == 0o600
        with engine.connect() as conn:
            stored = dict(
                conn.execute(
                    text("SELECT rolname, rolpassword FROM pg_authid WHERE rolname = ANY(:n)"), {"n": names}
                ).all()
            )
            inner = bytes(conn.execute(text("SELECT inner_pad FROM scope_key")).scalar_one())
        # a SCRAM verifier made by the client: the password never reached the server
        assert all(v.startswith("SCRAM-SHA-256$") for v in stored.values()) and len(stored) == 3
        assert inner == bytes(b ^ 0x36 for b in read_scope_key(key_file).ljust(64, b"\0"))
        # again: the files are read, nothing new is made
        assert main(argv) == 0
        again = capsys.readouterr().out
        assert again.count("password set from") == 3 and "scope key read" in again
        assert "already held it" in again
        # without --password-dir: how a site maps roles without passwords is said
        plain = ["db", "roles", "--writer", f"{names[0]}x", "--reader", f"{names[1]}x"]
        plain += ["--aggregate", f"{names[2]}x"]
        assert main(plain) == 0
        assert "pg_hba.conf (peer" in capsys.readouterr().out
        names += [f"{n}x" for n in names]
    finally:
        with engine.begin() as conn:
            install_scope_key(conn, login_roles.scope_key)
        drop_login_roles(engine, names)


def test_every_reader_policy_trusts_only_the_proven_scope(engine: Engine) -> None:
    """The class, not a list: every row policy the reader role has, on any table a migration
    made (migration 0017's action tables came after 0016 and first read the settings
    unproven), asks slurmtel_proven_scope and never reads the scope settings itself."""
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT tablename, qual FROM pg_policies WHERE policyname = 'reader_scope' "
                "AND schemaname = 'public'"
            )
        ).all()
    assert {t for t, _ in rows} >= set(PROTECTED)
    for table, qual in rows:
        assert "slurmtel_proven_scope" in qual, table
        assert "current_setting" not in qual, table
