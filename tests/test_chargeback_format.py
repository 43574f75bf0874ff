"""Statement format 2 (issue 22 item 3) beside the statements closed before it.

Format 2: the CSV holds only lines (a spreadsheet's SUM of a money column is the total), each
naming its TRES, billed quantity and unit, and each row the statement's number, date, status
and checksum; totals and subtotals are files of their own; closing an empty month or one
before the latest closed month needs --force and is audited.

Format 1: the statements in tests/fixtures/chargeback (PROVENANCE.md) were closed by the code
before format 2. Stored as they were, then upgraded through migration 0018, they must re-export
the exact bytes they were closed with, get statement numbers in closing order, and their late
data must become format-2 adjustments that charge only what changed.
"""

from __future__ import annotations

import base64
import csv
import io
import json
import uuid
from collections.abc import Iterator
from dataclasses import replace
from datetime import datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.engine import make_url

from slurmtel.chargeback import (
    ChargebackError,
    CloseRefused,
    UsageFigure,
    build_statement,
    close_due_month,
    close_month,
    closed_statement,
    price_usage,
    render_csv,
    render_totals_csv,
    rollup_records,
    sha256,
    statement_of_closed,
    totals,
    verify_statement_file,
)
from slurmtel.cli import main
from slurmtel.config import ChargebackConfig, ChargebackRate, Config, config_from_dict
from slurmtel.store.chargeback import audit_entries, list_statements
from slurmtel.store.migrate import downgrade, upgrade
from tests.factories import at
from tests.test_chargeback import FINANCE, NOVEMBER, NOW, SETTINGS, job, load

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "chargeback"
FORMAT_1 = json.loads((FIXTURES / "format-1-statements.json").read_text())

# the jobs as they stood when November was closed in format 1 (PROVENANCE.md), late October
# data included
FORMAT_1_JOBS = [
    job(10, "2026-10-10T08:00:00", 3 * 3600, user="alice"),
    job(14, "2026-10-12T08:00:00", 5 * 3600, user="bob", account="chemistry", state="NODE_FAIL", gpu_model="a100"),
    job(15, "2026-10-13T08:00:00", 1000, user="erin", partition="debug", gpu_model=""),
    job(11, "2026-11-10T08:00:00", 3600, user="alice"),
    job(16, "2026-11-11T08:00:00", 7 * 3600 + 13, user="dave", partition="debug", gpu_model="a100", alloc_gpus=3),
    job(12, "2026-10-20T08:00:00", 4 * 3600, user="bob", gpu_model="a100"),
]  # fmt: skip


@pytest.fixture
def config() -> Config:
    return config_from_dict(SETTINGS)


def statement(engine: Engine, config: Config, month: str, now: datetime = NOW) -> Any:
    with engine.connect() as conn:
        return build_statement(conn, config, month, now)


def csv_rows(data: bytes) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(data.decode())))


# ------------------------------------------------------------------ a spreadsheet can sum it


def test_spreadsheet_sum_of_each_money_column_is_the_statement_total(engine: Engine, config: Config) -> None:
    load(engine, config, *NOVEMBER)
    result = statement(engine, config, "2026-11")
    rows = csv_rows(render_csv(result))
    # what =SUM(N2:N6) gives: every row is a line, empty cells count 0
    for column in ("amount", "waived_amount", "billable_amount"):
        column_sum = sum(Decimal(r[column]) for r in rows if r[column])
        assert column_sum == getattr(result.totals, column), column
    assert sum(Decimal(r["amount"]) for r in rows if r["amount"]) == Decimal("39.64")
    assert {r["kind"] for r in rows} == {"usage"}
    # the totals file sums right too (one row per billed unit, no grand total row)
    (unit,) = csv_rows(render_totals_csv(result))
    assert (unit["billed_unit"], unit["amount"], unit["billable_amount"], unit["unpriced_quantity"]) == (
        "gpu_hour",
        "39.64",
        "22.14",
        "1.500000",
    )
    assert (unit["line_count"], unit["unpriced_line_count"]) == ("5", "1")
    # every row says what it is a line of
    assert {(r["statement_status"], r["month"], r["currency"], r["format_version"]) for r in rows} == {
        ("open", "2026-11", "EUR", "2")
    }


@settings(max_examples=150, deadline=None)
@given(
    usage=st.lists(
        st.tuples(
            st.integers(min_value=0, max_value=10**8),
            st.integers(min_value=0, max_value=10**8),
            st.sampled_from(["gres/gpu", "billing"]),
        ),
        min_size=1,
        max_size=30,
    ),
    cents=st.integers(min_value=1, max_value=50_000),
    currency=st.sampled_from(["EUR", "JPY", "KWD"]),
)
def test_any_statement_csv_sums_to_its_totals(
    usage: list[tuple[int, int, str]], cents: int, currency: str
) -> None:
    from slurmtel.chargeback import Statement

    rate = ChargebackRate(price_per_gpu_hour=str(Decimal(cents) / 100), valid_from="2026-01-01")
    pricing = ChargebackConfig(currency=currency, rates=[rate])
    figures = [
        UsageFigure(
            "lab", f"a{i}", "u", "gpu", "h100", tres, Decimal(s) + Decimal("0.37"), Decimal(min(s, w))
        )
        for i, (s, w, tres) in enumerate(usage)
    ]
    lines = tuple(price_usage(figures, "2026-11", pricing))
    result = Statement("2026-11", currency, lines, totals(lines, currency), ())
    rows = csv_rows(render_csv(result))
    for column in ("amount", "waived_amount", "billable_amount"):
        assert sum((Decimal(r[column]) for r in rows if r[column]), Decimal(0)) == getattr(
            result.totals, column
        )
    for unit in result.totals.by_unit:
        mine = [r for r in rows if r["billed_unit"] == unit.billed_unit]
        assert sum(Decimal(r["billed_quantity"]) for r in mine) == unit.billed_quantity
    # and each line's amount is its printed rate x its printed quantity, rounded once
    for r in rows:
        if r["rate"]:
            exact = Decimal(r["rate"]) * Decimal(r["billed_quantity"])
            assert (
                abs(exact - Decimal(r["amount"]))
                <= Decimal(1).scaleb(-len(r["amount"].partition(".")[2])) / 2
            )


def test_a_statement_file_carries_and_checks_its_own_checksum(
    engine: Engine, config: Config, tmp_path: Path
) -> None:
    load(engine, config, *NOVEMBER)
    closed = close_month(engine, config, "2026-11", NOW, closed_by="fiona")
    rows = csv_rows(closed.csv)
    document = json.loads(closed.json)
    ((number, day, status, checksum),) = {
        (r["statement_number"], r["statement_date"], r["statement_status"], r["statement_sha256"])
        for r in rows
    }
    assert (number, day, status) == ("1", "2026-12-03", "closed")
    assert (document["statement_number"], document["statement_date"], document["statement_sha256"]) == (
        1,
        "2026-12-03",
        checksum,
    )
    assert document["csv_sha256"] == closed.csv_sha256 == sha256(closed.csv)
    assert verify_statement_file(closed.csv) == checksum
    assert verify_statement_file(closed.json) == checksum
    # a figure edited in either file no longer matches
    with pytest.raises(ChargebackError, match="lines were changed"):
        verify_statement_file(closed.csv.replace(b",19.25,", b",9.25,"))
    with pytest.raises(ChargebackError, match="lines were changed"):
        verify_statement_file(closed.json.replace(b'"19.25"', b'"9.25"'))
    with pytest.raises(ChargebackError, match="no statement_sha256"):
        verify_statement_file((FIXTURES / "format-1-2026-11.csv").read_bytes())
    # the CLI says the same, with no database
    good, bad = tmp_path / "good.csv", tmp_path / "bad.csv"
    good.write_bytes(closed.csv)
    bad.write_bytes(closed.csv.replace(b",19.25,", b",9.25,"))
    assert main(["chargeback", "--verify", str(good)]) == 0
    assert main(["chargeback", "--verify", str(bad)]) == 1


# ------------------------------------------------------------------------ closing guards


def test_closing_an_empty_month_or_one_before_the_latest_closed_needs_force(
    engine: Engine, config: Config
) -> None:
    load(engine, config, *NOVEMBER)
    with pytest.raises(CloseRefused, match="2026-09 has no usage"):
        close_month(engine, config, "2026-09", NOW)
    close_month(engine, config, "2026-11", NOW, closed_by="fiona")
    # October has usage (alice's first hour) but is earlier than November, closed
    with pytest.raises(CloseRefused, match="2026-10 is earlier than 2026-11, the latest closed month"):
        close_month(engine, config, "2026-10", NOW)
    # both guards at once, said together
    with pytest.raises(CloseRefused, match=r"no usage.*earlier than 2026-11.*--force"):
        close_month(engine, config, "2026-08", NOW)
    with engine.connect() as conn:
        assert [s.month for s in list_statements(conn)] == ["2026-11"]
    forced = close_month(engine, config, "2026-10", NOW, closed_by="root", force=True, reason="audit request")
    assert forced.statement_number == 2
    with engine.connect() as conn:
        audit = audit_entries(conn)
    assert [(e.action, e.month, e.actor) for e in audit] == [
        ("close", "2026-11", "fiona"),
        ("forced_close", "2026-10", "root"),
    ]
    assert audit[1].reason.startswith("2026-10 is earlier than 2026-11, the latest closed month")
    assert audit[1].reason.endswith("; audit request")
    # --force past no guard is an ordinary close
    load(engine, config, job(50, "2026-12-02T00:00:00", 3600, user="alice"))
    close_month(engine, config, "2026-12", at("2027-01-03T00:00:00"), force=True)
    with engine.connect() as conn:
        assert audit_entries(conn)[-1].action == "close"


def test_the_daemon_never_forces_a_close(engine: Engine, config: Config) -> None:
    # nothing collected for November: the daemon's close is refused, nothing is stored
    with pytest.raises(CloseRefused, match="2026-11 has no usage"):
        close_due_month(engine, config, at("2026-12-05T08:00:00"))
    with engine.connect() as conn:
        assert list_statements(conn) == [] and audit_entries(conn) == []


def test_cli_force_and_totals(
    engine: Engine, config: Config, database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    config_file = tmp_path / "slurmtel.toml"
    config_file.write_text(
        '[site]\ntimezone = "Europe/Berlin"\n[[chargeback.rates]]\nprice_per_gpu_hour = "2.00"\n'
        'valid_from = "2026-01-01"\n'
    )
    monkeypatch.setenv("SLURMTEL_DATABASE_URL", database_url)
    monkeypatch.setattr("slurmtel.commands.common.utc_now", lambda: NOW)
    monkeypatch.setattr("slurmtel.commands.common.current_identity", lambda config: FINANCE)

    def cli(*argv: str) -> int:
        return main(["--config", str(config_file), "--log-level", "WARNING", "chargeback", *argv])

    assert cli("--month", "2026-10", "--close") == 1
    assert "2026-10 has no usage" in capsys.readouterr().err
    assert cli("--month", "2026-10", "--force") == 2
    assert "--force goes with --close" in capsys.readouterr().err
    assert cli("--month", "2026-10", "--close", "--force", "--reason", "idle month") == 0
    assert "closed 2026-10 at 2026-12-03T12:00:00+00:00 as statement 1" in capsys.readouterr().err
    assert cli("--audit", "--format", "csv") == 0
    out = capsys.readouterr().out
    assert ",fiona,forced_close,2026-10," in out and "idle month" in out
    load(engine, config, *NOVEMBER)
    assert cli("--month", "2026-11", "--totals") == 0
    (row,) = csv_rows(capsys.readouterr().out.encode())
    # November at 2.00 (1.5 + 11 + 7 + 2 + 0.277778 GPU-hours) and, as an adjustment, the hour
    # of alice's 2-GPU job that fell in October, which was closed empty
    assert (row["billed_unit"], row["line_count"], row["billed_quantity"], row["amount"]) == (
        "gpu_hour",
        "6",
        "23.777778",
        "47.56",
    )


# --------------------------------------------------------------- statements closed in format 1


@pytest.fixture
def format_1_engine(server_url: str) -> Iterator[Engine]:
    """A database that was at 0015 when the format-1 statements of the fixture were closed
    (their rows inserted as they were stored), then upgraded to head; the jobs loaded."""
    name = f"slurmtel_fmt1_{uuid.uuid4().hex[:8]}"
    admin = create_engine(server_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    engine = create_engine(make_url(server_url).set(database=name))
    upgrade(engine, "0015")
    with engine.begin() as conn:
        for row in FORMAT_1["statements"]:
            values = {
                k: base64.b64decode(v["base64"])
                if isinstance(v, dict) and "base64" in v
                else json.dumps(v)
                if isinstance(v, list | dict)
                else v
                for k, v in row.items()
            }
            columns = ", ".join(values)
            placeholders = ", ".join(
                f"CAST(:{k} AS jsonb)" if k in ("lines", "totals", "completed_jobs", "settings") else f":{k}"
                for k in values
            )
            conn.execute(
                text(f"INSERT INTO chargeback_statement ({columns}) VALUES ({placeholders})"), values
            )
        conn.execute(text("DELETE FROM chargeback_audit"))
        for entry in FORMAT_1["audit"]:
            conn.execute(
                text(
                    "INSERT INTO chargeback_audit (at, actor, action, month, csv_sha256, reason) "
                    "VALUES (:at, :actor, :action, :month, :csv_sha256, :reason)"
                ),
                entry,
            )
    upgrade(engine)
    load(engine, config_from_dict(SETTINGS), *FORMAT_1_JOBS)
    yield engine
    engine.dispose()
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE "{name}" WITH (FORCE)'))
    admin.dispose()


def test_format_1_statements_re_export_the_bytes_they_were_closed_with(format_1_engine: Engine) -> None:
    for month in ("2026-10", "2026-11"):
        stored = closed_statement(format_1_engine, month)
        assert stored is not None
        assert stored.csv == (FIXTURES / f"format-1-{month}.csv").read_bytes()
        assert stored.json == (FIXTURES / f"format-1-{month}.json").read_bytes()
        assert stored.format_version == 1
    with format_1_engine.connect() as conn:
        listing = list_statements(conn)
        audit = audit_entries(conn)
    # numbered by the upgrade in the order they were closed
    assert [(r.statement_number, r.month, r.format_version, r.closed_by) for r in listing] == [
        (1, "2026-10", 1, "fin"),
        (2, "2026-11", 1, "slurmtel daemon"),
    ]
    assert [(e.action, e.month) for e in audit] == [("close", "2026-10"), ("close", "2026-11")]


def test_format_1_lines_read_as_format_2_with_their_figures(format_1_engine: Engine) -> None:
    stored = closed_statement(format_1_engine, "2026-11")
    assert stored is not None
    derived = statement_of_closed(stored)
    assert (derived.statement_number, derived.format_version, str(derived.statement_date)) == (
        2,
        1,
        "2026-12-05",
    )
    dave = next(line for line in derived.lines if line.user == "dave")
    # 21.0108 GPU-hours shown in format 1 (3 GPUs x 7 h 13 s); its amount as frozen
    assert (dave.tres, dave.billed_unit, dave.billed_quantity, dave.allocated_tres_seconds, dave.amount) == (
        "gres/gpu",
        "gpu_hour",
        Decimal("21.0108"),
        Decimal("75638.88"),
        Decimal("23.11"),
    )
    adjustments = [(a.adjusted_month, a.user, a.amount) for a in derived.lines if a.kind == "adjustment"]
    assert adjustments == [("2026-10", "alice", Decimal("2.50")), ("2026-10", "bob", Decimal("7.00"))]
    # the derived totals are the format-1 total row's figures
    total_row = (FIXTURES / "format-1-2026-11.csv").read_text().splitlines()[-1].split(",")
    assert total_row[1] == "total"
    assert (str(derived.totals.amount), str(derived.totals.billable_amount)) == (total_row[13], total_row[16])
    parents: dict[str, frozenset[str]] = {}
    assert sum(r["amount"] for r in rollup_records(derived, "top", parents)) == Decimal(total_row[13])


def test_format_1_months_get_adjustments_only_for_what_changed(
    format_1_engine: Engine, config: Config
) -> None:
    december_now = at("2027-01-03T00:00:00")
    load(format_1_engine, config, job(60, "2026-12-02T00:00:00", 3600, user="alice"))
    december = statement(format_1_engine, config, "2026-12", december_now)
    # nothing changed in October or November since they were closed: no adjustment at all,
    # although both are re-priced in format 1 and read back from format-1 lines
    assert [line for line in december.lines if line.kind == "adjustment"] == []
    # late data for both closed months
    load(
        format_1_engine,
        config,
        job(61, "2026-11-12T08:00:00", 1000, user="erin"),  # 0.2778 GPU-hours at 2.50 = 0.69
        replace(FORMAT_1_JOBS[2], end_at=at("2026-10-13T09:00:00")),  # erin's October job: 1000 s -> 3600 s
    )
    december = statement(format_1_engine, config, "2026-12", december_now)
    adjustments = [
        (a.adjusted_month, a.user, a.partition, a.tres, a.billed_quantity, a.allocated_tres_seconds, a.amount)
        for a in december.lines
        if a.kind == "adjustment"
    ]
    assert adjustments == [
        # October's erin, untyped on debug: unpriced, 1.0000 - 0.2778 GPU-hours
        ("2026-10", "erin", "debug", "gres/gpu", Decimal("0.7222"), Decimal("2599.92"), None),
        ("2026-11", "erin", "gpu", "gres/gpu", Decimal("0.2778"), Decimal("1000.08"), Decimal("0.69")),
    ]
    # December closes in format 2 with the next number; the format-1 months keep their bytes
    closed_dec = close_month(format_1_engine, config, "2026-12", december_now, closed_by="fiona")
    assert (closed_dec.statement_number, closed_dec.format_version) == (3, 2)
    rows = csv_rows(closed_dec.csv)
    assert [r["adjusted_month"] for r in rows if r["kind"] == "adjustment"] == ["2026-10", "2026-11"]
    # alice's December hour at December's gpu/h100 rate, and erin's late November
    assert sum(Decimal(r["amount"]) for r in rows if r["amount"]) == Decimal("3.00") + Decimal("0.69")
    stored_nov = closed_statement(format_1_engine, "2026-11")
    assert stored_nov is not None and stored_nov.csv == (FIXTURES / "format-1-2026-11.csv").read_bytes()
    # January: those adjustments are frozen in December: not charged again
    january = statement(format_1_engine, config, "2027-01", at("2027-02-03T00:00:00"))
    assert [line for line in january.lines if line.kind == "adjustment"] == []


def test_the_cli_re_exports_a_format_1_month_byte_for_byte(
    format_1_engine: Engine,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    config_file = tmp_path / "slurmtel.toml"
    config_file.write_text('[site]\ntimezone = "Europe/Berlin"\n')
    url = format_1_engine.url.render_as_string(hide_password=False)
    monkeypatch.setenv("SLURMTEL_DATABASE_URL", url)
    monkeypatch.setattr("slurmtel.commands.common.utc_now", lambda: at("2026-12-20T00:00:00"))
    monkeypatch.setattr("slurmtel.commands.common.current_identity", lambda config: FINANCE)
    out = tmp_path / "nov.csv"
    for fmt, name in (("csv", "format-1-2026-11.csv"), ("json", "format-1-2026-11.json")):
        argv = ["--config", str(config_file), "chargeback", "--month", "2026-11", "--format", fmt]
        assert main([*argv, "--output", str(out)]) == 0
        assert out.read_bytes() == (FIXTURES / name).read_bytes()
    capsys.readouterr()
    assert main(["--config", str(config_file), "chargeback", "--month", "2026-11", "--format", "table"]) == 0
    # numbered by the upgrade, shown in the table (its format-1 bytes do not carry it)
    assert "Chargeback 2026-11, statement 2 of 2026-12-05, closed" in capsys.readouterr().out


def test_downgrading_below_0018_refuses_format_2_statements(format_1_engine: Engine, config: Config) -> None:
    load(format_1_engine, config, job(70, "2026-12-02T00:00:00", 3600, user="alice"))
    close_month(format_1_engine, config, "2026-12", at("2027-01-03T00:00:00"))
    with pytest.raises(Exception, match="statements of format 2 are stored"):
        downgrade(format_1_engine, "0015")


def test_only_format_1_statements_downgrade_and_come_back(format_1_engine: Engine) -> None:
    downgrade(format_1_engine, "0015")
    upgrade(format_1_engine)
    stored = closed_statement(format_1_engine, "2026-11")
    assert stored is not None and stored.csv == (FIXTURES / "format-1-2026-11.csv").read_bytes()
