"""Finance grade chargeback (issue 14): closed months are never re-priced, adjustments name
their cause, roll-ups by the Slurm account tree, closed/voided listing and audit, the
re-pricing diff, flat exports and Parquet. Figures worked out by hand from
tests/test_chargeback.py's November (site time zone Europe/Berlin)."""

from __future__ import annotations

import json
import os
import stat
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import Engine

from slurmtel.access import Identity, Role
from slurmtel.chargeback import (
    LINE_COLUMNS,
    ChargebackError,
    build_statement,
    close_due_month,
    close_month,
    diff_closed_month,
    rate_notices,
    render_completed_csv,
    render_csv,
    rollup_account,
    rollup_records,
    void_month,
)
from slurmtel.config import Config, config_from_dict
from slurmtel.parsers.sacctmgr import parse_account_parents
from slurmtel.store.chargeback import audit_entries, get_statements, list_statements
from tests.factories import at
from tests.test_chargeback import ADMIN, FINANCE, NOVEMBER, NOW, RATES, SETTINGS, job, load

ROOT = Path(__file__).resolve().parents[1]
TREE = ROOT / "tests/fixtures/slurmctld/slurm-22.05/sacctmgr-show-account-withassoc-nested.psv"
CLOSED_AT = at("2026-12-05T08:00:00")
DEC_NOW = at("2026-12-20T00:00:00")
# alice's gpu/h100 rate edited in place from 2.50 to 3.00 after November was closed
EDITED_RATES = [{**RATES[0], "price_per_gpu_hour": "3.00"}, *RATES[1:]]


def with_settings(**overrides: Any) -> Config:
    settings: dict[str, Any] = {**SETTINGS, **overrides}
    return config_from_dict(settings)


@pytest.fixture
def config() -> Config:
    return with_settings()


def adjustments_of(engine: Engine, config: Config, month: str, now: Any = DEC_NOW) -> list[Any]:
    with engine.connect() as conn:
        result = build_statement(conn, config, month, now)
    return [line for line in result.lines if line.kind == "adjustment"]


def closed_settings(engine: Engine) -> dict[str, Any]:
    with engine.connect() as conn:
        return {m: s.settings for m, s in get_statements(conn, ["2026-10", "2026-11", "2026-12"]).items()}


# ------------------------------------------------------------------ rates never re-price a closed month


def test_a_rate_edited_after_closing_never_re_prices_the_closed_month(engine: Engine, config: Config) -> None:
    load(engine, config, *NOVEMBER)
    closed = close_month(engine, config, "2026-11", CLOSED_AT, closed_by="fiona")
    edited = with_settings(chargeback={"rates": EDITED_RATES})
    # no adjustment lines with 0 GPU-hours: December's statement is December's usage only
    assert adjustments_of(engine, edited, "2026-12") == []
    notices = rate_notices(edited, closed_settings(engine))
    assert len(notices) == 2
    assert "rate gpu/h100 3.00 valid from 2026-01-01 covers closed month(s) 2026-11" in notices[0]
    assert "takes effect from 2026-12, the first open month" in notices[0]
    assert "rate gpu/h100 2.50 valid from 2026-01-01 priced closed month 2026-11" in notices[1]
    # the unchanged config says nothing
    assert rate_notices(config, closed_settings(engine)) == []
    # and December is priced with the new rate: 1 h of alice at 3.00
    load(engine, config, job(30, "2026-12-02T00:00:00", 3600, user="alice"))
    with engine.connect() as conn:
        december = build_statement(conn, edited, "2026-12", DEC_NOW)
    assert [(line.user, line.rate, line.amount) for line in december.lines] == [
        ("alice", Decimal("3.00"), Decimal("3.00"))
    ]
    assert closed.settings["rates"][0]["price_per_gpu_hour"] == "2.50"


def test_a_changed_time_zone_never_re_cuts_a_closed_month(engine: Engine, config: Config) -> None:
    load(engine, config, *NOVEMBER)
    close_month(engine, config, "2026-11", CLOSED_AT)
    # in UTC, November starts an hour later than in Berlin: job 1 (2 GPUs from 22:00Z on Oct 31)
    # would lose 2 GPU-hours of November. Closed November keeps its Berlin edges.
    utc = with_settings(site={"timezone": "UTC"})
    assert adjustments_of(engine, utc, "2026-12") == []
    (notice,) = rate_notices(utc, closed_settings(engine))
    assert "site.timezone is UTC, closed months were cut in Europe/Berlin" in notice


def test_late_usage_is_an_adjustment_priced_as_closed_and_naming_its_cause(
    engine: Engine, config: Config
) -> None:
    load(engine, config, *NOVEMBER)
    close_month(engine, config, "2026-11", CLOSED_AT)
    # 2 h of alice's November arrive after the close, while the config says 3.00 by now
    load(engine, config, job(31, "2026-11-20T00:00:00", 7200, user="alice"))
    edited = with_settings(chargeback={"rates": EDITED_RATES})
    (line,) = adjustments_of(engine, edited, "2026-12")
    # priced at November's 2.50: 2 h x 2.50 = 5.00
    assert (line.adjusted_month, line.user, line.billed_quantity, line.rate, line.amount) == (
        "2026-11",
        "alice",
        Decimal("2.000000"),
        Decimal("2.50"),
        Decimal("5.00"),
    )
    assert line.cause == "usage of 2026-11 that arrived after it was closed: +7200.00 gres/gpu-seconds"
    with engine.connect() as conn:
        december = build_statement(conn, edited, "2026-12", DEC_NOW)
    assert (
        "usage of 2026-11 that arrived after it was closed: +7200.00 gres/gpu-seconds"
        in render_csv(december).decode()
    )


def test_diff_shows_what_re_pricing_a_closed_month_today_would_change(engine: Engine, config: Config) -> None:
    load(engine, config, *NOVEMBER)
    close_month(engine, config, "2026-11", CLOSED_AT)
    with engine.connect() as conn:
        assert diff_closed_month(conn, config, "2026-11", DEC_NOW) == []
        edited = with_settings(chargeback={"rates": EDITED_RATES})
        rows = diff_closed_month(conn, edited, "2026-11", DEC_NOW)
        with pytest.raises(ChargebackError, match="2026-12 is not closed"):
            diff_closed_month(conn, edited, "2026-12", DEC_NOW)
    # alice 7 h: 17.50 -> 21.00; erin 1000 s = 0.277778 h: 0.69 -> 0.277778 x 3.00 = 0.8333 -> 0.83
    assert [
        (r["user"], r["closed_rate"], r["now_rate"], r["closed_billable_amount"], r["now_billable_amount"],
         r["billable_amount_change"])
        for r in rows
    ] == [
        ("alice", Decimal("2.50"), Decimal("3.00"), Decimal("17.50"), Decimal("21.00"), Decimal("3.50")),
        ("erin", Decimal("2.50"), Decimal("3.00"), Decimal("0.69"), Decimal("0.83"), Decimal("0.14")),
    ]  # fmt: skip


# ------------------------------------------------------------------------------ account hierarchy


def test_rollup_accounts_follow_the_real_slurm_tree() -> None:
    parents = parse_account_parents(TREE.read_text())
    assert [rollup_account("polymers", level, parents) for level in ("account", "parent", "top")] == [
        "polymers",
        "organic",
        "chemistry",
    ]
    # right below root: its own parent and top; an account the tree does not know likewise
    assert rollup_account("physics", "parent", parents) == "physics"
    assert rollup_account("nowhere", "top", parents) == "nowhere"


def test_subtotals_roll_up_the_tree_and_add_up_exactly(engine: Engine, config: Config) -> None:
    load(
        engine,
        config,
        *NOVEMBER,
        job(40, "2026-11-08T00:00:00", 1000, user="dave", account="organic"),
        job(41, "2026-11-09T00:00:00", 1000, user="dave", account="polymers"),
    )
    with engine.connect() as conn:
        statement = build_statement(conn, config, "2026-11", NOW)
    parents = parse_account_parents(TREE.read_text())
    records = rollup_records(statement, "top", parents)
    # subtotals only: one row per rolled-up account and billed unit, no lines, no total row
    subtotals = {r["rollup_account"]: r for r in records}
    assert len(records) == 3 and sorted(subtotals) == ["biology", "chemistry", "physics"]
    assert {r["billed_unit"] for r in records} == {"gpu_hour"}
    # chemistry = bob 19.25 + dave organic 0.69 + dave polymers 0.69 (1000 s x 2.50 each)
    assert subtotals["chemistry"]["amount"] == Decimal("20.63")
    assert subtotals["chemistry"]["billable_amount"] == Decimal("1.75") + Decimal("0.69") + Decimal("0.69")
    assert subtotals["chemistry"]["line_count"] == 3
    for name in ("amount", "billable_amount", "waived_amount"):
        assert sum(r[name] for r in records) == getattr(statement.totals, name), name
    (gpu,) = statement.totals.by_unit
    for name in ("billed_quantity", "unpriced_quantity", "allocated_tres_seconds", "line_count"):
        assert sum(r[name] for r in records) == getattr(gpu, name), name
    by_parent = rollup_records(statement, "parent", parents)
    assert [(r["rollup_account"], r["line_count"]) for r in by_parent] == [
        ("biology", 1),
        ("chemistry", 2),  # bob's chemistry and dave's organic
        ("organic", 1),  # dave's polymers
        ("physics", 3),
    ]


# --------------------------------------------------------------------- listing, voiding, audit


def test_void_keeps_the_statement_audits_it_and_lets_the_month_close_again(
    engine: Engine, config: Config
) -> None:
    load(engine, config, *NOVEMBER)
    first = close_month(engine, config, "2026-11", CLOSED_AT, closed_by="fiona")
    with pytest.raises(ChargebackError, match="needs --reason"):
        void_month(engine, "2026-11", DEC_NOW, "fiona", "  ")
    with pytest.raises(ChargebackError, match="2026-10 is not closed"):
        void_month(engine, "2026-10", DEC_NOW, "fiona", "wrong month")
    void_month(engine, "2026-11", DEC_NOW, "fiona", "rate for debug/a100 was wrong")
    load(engine, config, job(42, "2026-11-21T00:00:00", 3600, user="alice"))
    second = close_month(engine, config, "2026-11", at("2026-12-21T00:00:00"), closed_by="root")
    assert second.csv != first.csv
    with engine.connect() as conn:
        listing = list_statements(conn)
        audit = audit_entries(conn)
    assert [(r.month, r.status, r.closed_by, r.csv_sha256, r.voided_by, r.reason) for r in listing] == [
        ("2026-11", "voided", "fiona", first.csv_sha256, "fiona", "rate for debug/a100 was wrong"),
        ("2026-11", "closed", "root", second.csv_sha256, "", ""),
    ]
    assert listing[0].billable_amount == Decimal("22.14") and listing[1].billable_amount == Decimal("24.64")
    # numbered in closing order; the re-closed month gets a new number
    assert [(r.statement_number, r.format_version) for r in listing] == [(1, 2), (2, 2)]
    assert [(e.action, e.month, e.actor, e.csv_sha256, e.reason) for e in audit] == [
        ("close", "2026-11", "fiona", first.csv_sha256, ""),
        ("void", "2026-11", "fiona", first.csv_sha256, "rate for debug/a100 was wrong"),
        ("close", "2026-11", "root", second.csv_sha256, ""),
    ]
    # the daemon never closes a voided month again by itself
    void_month(engine, "2026-11", at("2026-12-22T00:00:00"), "fiona", "once more")
    assert close_due_month(engine, config, at("2026-12-23T00:00:00")) is None
    with engine.connect() as conn:
        assert [r.status for r in list_statements(conn)] == ["voided", "voided"]
    close_month(engine, config, "2026-11", at("2026-12-24T00:00:00"), closed_by="fiona")
    # a later closed month was computed against November: November cannot be voided under it
    load(engine, config, job(43, "2026-12-02T00:00:00", 3600, user="alice"))
    close_month(engine, config, "2026-12", at("2027-01-05T00:00:00"))
    with pytest.raises(ChargebackError, match="later months are closed \\(2026-12\\)"):
        void_month(engine, "2026-11", at("2027-01-06T00:00:00"), "fiona", "again")


# ------------------------------------------------------------------------------------- exports


COMPLETED_CSV = """\
month,account,completed_jobs,allocated_gpu_seconds,amount,billable_amount,unpriced_line_count,cost_per_completed_job,billable_per_completed_job,currency
2026-11,biology,1,5400.00,,,1,,,EUR
2026-11,chemistry,1,39600.00,19.25,1.75,0,19.25,1.75,EUR
2026-11,physics,3,33400.00,20.39,20.39,0,6.80,6.80,EUR
"""


def test_the_csv_holds_only_lines_and_completed_jobs_their_own(engine: Engine, config: Config) -> None:
    load(engine, config, *NOVEMBER)
    with engine.connect() as conn:
        statement = build_statement(conn, config, "2026-11", NOW)
    lines = render_csv(statement).decode().splitlines()
    assert lines[0].split(",") == list(LINE_COLUMNS)
    assert all(line.count(",") == len(LINE_COLUMNS) - 1 for line in lines)
    kind = LINE_COLUMNS.index("kind")
    assert [line.split(",")[kind] for line in lines[1:]] == ["usage"] * 5
    assert render_completed_csv(statement).decode() == COMPLETED_CSV


def test_the_docs_document_every_statement_column() -> None:
    section = (ROOT / "docs" / "chargeback.md").read_text()
    documented = set()
    for row in section.splitlines():
        if row.startswith("| `"):
            documented.update(part.strip(" `") for part in row.split("|")[1].split(","))
    from slurmtel.chargeback import COMPLETED_COLUMNS, DIFF_COLUMNS, ROLLUP_COLUMNS, TOTALS_COLUMNS
    from slurmtel.commands.finance import AUDIT_COLUMNS, LISTING_COLUMNS

    for columns in (
        LINE_COLUMNS,
        TOTALS_COLUMNS,
        COMPLETED_COLUMNS,
        DIFF_COLUMNS,
        ROLLUP_COLUMNS,
        LISTING_COLUMNS,
        AUDIT_COLUMNS,
    ):
        assert set(columns) <= documented, sorted(set(columns) - documented)


# ----------------------------------------------------------------------------------------- CLI


@pytest.fixture
def cli(engine: Engine, database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """`slurmtel ...` in-process against the test database, with a sacctmgr that prints the real
    nested account tree captured from the Slurm 22.05 lab."""
    from slurmtel.cli import main

    sacctmgr = tmp_path / "sacctmgr"
    sacctmgr.write_text(f"#!/bin/sh\ncat '{TREE}'\n")
    sacctmgr.chmod(sacctmgr.stat().st_mode | stat.S_IXUSR)
    config_file = tmp_path / "slurmtel.toml"

    def write_config(rates: list[dict[str, str]]) -> None:
        text = "".join(
            "\n[[chargeback.rates]]\n" + "".join(f'{k} = "{v}"\n' for k, v in r.items()) for r in rates
        )
        config_file.write_text(
            f'[site]\ntimezone = "Europe/Berlin"\n[access]\nsacctmgr_command = "{sacctmgr}"\n{text}'
        )

    write_config(RATES)
    monkeypatch.setenv("SLURMTEL_DATABASE_URL", database_url)
    monkeypatch.setattr("slurmtel.commands.common.utc_now", lambda: DEC_NOW)

    def run(identity: Identity, *argv: str) -> int:
        monkeypatch.setattr("slurmtel.commands.common.current_identity", lambda config: identity)
        return main(["--config", str(config_file), "--log-level", "WARNING", *argv])

    run.write_config = write_config  # type: ignore[attr-defined]
    return run


def test_cli_list_void_audit_diff(
    cli: Any, engine: Engine, config: Config, capsys: pytest.CaptureFixture[str]
) -> None:
    load(engine, config, *NOVEMBER)
    assert cli(FINANCE, "chargeback", "--month", "2026-11", "--close") == 0
    capsys.readouterr()
    cli.write_config(EDITED_RATES)
    assert cli(FINANCE, "chargeback", "--month", "2026-11", "--diff", "--format", "json") == 0
    out, err = capsys.readouterr()
    assert "takes effect from 2026-12, the first open month" in err
    assert [(r["user"], r["billable_amount_change"]) for r in json.loads(out)] == [
        ("alice", "3.50"),
        ("erin", "0.14"),
    ]
    alice = Identity("alice", Role.USER)
    assert cli(alice, "chargeback", "--void", "2026-11", "--reason", "x") == 1
    assert "may not close statements" in capsys.readouterr().err
    assert cli(FINANCE, "chargeback", "--void", "2026-11") == 2
    assert "--void needs --reason" in capsys.readouterr().err
    assert cli(FINANCE, "chargeback", "--void", "2026-11", "--reason", "rates revised") == 0
    assert "voided 2026-11" in capsys.readouterr().err
    assert cli(ADMIN, "chargeback", "--list", "--format", "csv") == 0
    out, _ = capsys.readouterr()
    header, row = out.splitlines()
    assert header.startswith("statement_number,month,status,format_version,closed_at,closed_by")
    assert row.startswith("1,2026-11,voided,2,") and row.endswith(",fiona,rates revised")
    assert cli(FINANCE, "chargeback", "--audit", "--format", "json") == 0
    audit = json.loads(capsys.readouterr().out)
    assert [(e["action"], e["actor"], e["reason"]) for e in audit] == [
        ("close", "fiona", ""),
        ("void", "fiona", "rates revised"),
    ]


def test_cli_by_top_parquet_completed_jobs_and_a_future_month(
    cli: Any, engine: Engine, config: Config, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    load(engine, config, *NOVEMBER, job(41, "2026-11-09T00:00:00", 1000, user="dave", account="polymers"))
    assert cli(FINANCE, "chargeback", "--month", "2026-11", "--by", "top", "--format", "json") == 0
    rows = json.loads(capsys.readouterr().out)
    assert {r["rollup_account"]: r["billable_amount"] for r in rows} == {
        "biology": "0.00",
        "chemistry": "2.44",
        "physics": "20.39",
    }
    parquet = tmp_path / "nov.parquet"
    assert (
        cli(FINANCE, "chargeback", "--month", "2026-11", "--format", "parquet", "--output", str(parquet)) == 0
    )
    capsys.readouterr()
    table = pq.read_table(parquet)
    assert table.column_names == list(LINE_COLUMNS)
    assert str(table.schema.field("amount").type) == "decimal128(38, 2)"
    assert str(table.schema.field("billed_quantity").type) == "decimal128(38, 6)"
    assert str(table.schema.field("allocated_tres_seconds").type) == "decimal128(38, 2)"
    assert table.schema.metadata[b"slurmtel.currency"] == b"EUR"
    # lines only: the column sums to the statement's total (39.64 + dave's 1000 s x 2.50)
    assert sum(a for a in table.column("amount").to_pylist() if a is not None) == Decimal("40.33")
    assert cli(FINANCE, "chargeback", "--month", "2026-11", "--format", "parquet") == 2
    assert "give --output FILE" in capsys.readouterr().err
    assert cli(FINANCE, "chargeback", "--month", "2026-11", "--completed-jobs") == 0
    assert capsys.readouterr().out.splitlines()[0].startswith("month,account,completed_jobs")
    assert cli(FINANCE, "chargeback", "--month", "2027-03") == 2
    assert "2027-03 has not begun yet" in capsys.readouterr().err
    assert cli(FINANCE, "chargeback", "--month", "9999-12") == 2
    assert os.path.exists(parquet)


# ------------------------------------------------------------------------------ money is exact


@settings(max_examples=200, deadline=None)
@given(
    seconds=st.lists(st.integers(min_value=0, max_value=10**9), min_size=1, max_size=40),
    cents=st.integers(min_value=1, max_value=100_000),
    currency=st.sampled_from(["EUR", "JPY", "KWD"]),
)
def test_totals_print_exactly_the_sum_of_the_printed_lines(
    seconds: list[int], cents: int, currency: str
) -> None:
    from slurmtel.chargeback import UsageFigure, money_quantum, price_usage, totals
    from slurmtel.config import ChargebackConfig, ChargebackRate

    rate = ChargebackRate(price_per_gpu_hour=str(Decimal(cents) / 100), valid_from="2026-01-01")
    pricing = ChargebackConfig(currency=currency, rates=[rate])
    figures = [
        UsageFigure("lab", f"a{i}", "u", "gpu", "h100", "gres/gpu", Decimal(s) + Decimal("0.123456"))
        for i, s in enumerate(seconds)
    ]
    lines = price_usage(figures, "2026-11", pricing)
    total = totals(lines, currency)
    places = -money_quantum(currency).as_tuple().exponent
    for amount in [line.amount for line in lines] + [total.amount]:
        assert amount is not None and -amount.as_tuple().exponent == places, amount
    assert total.amount == sum(line.amount for line in lines if line.amount is not None)
    # what is printed is what is summed: no float ever rounds a total to 1075.4499
    assert Decimal(str(total.amount)) == total.amount
