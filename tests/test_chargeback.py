"""Chargeback statements on hand-built attempts whose amounts are worked out by hand.

Site time zone Europe/Berlin: November 2026 is [2026-10-31T23:00Z, 2026-11-30T23:00Z).
"""

from __future__ import annotations

import json
import re
import tomllib
from dataclasses import replace
from datetime import datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, text

from slurmtel.access import EVERYTHING, Identity, Role
from slurmtel.chargeback import (
    ChargebackError,
    MonthAlreadyClosed,
    StatementLine,
    UsageFigure,
    adjustment_lines,
    amount_of,
    build_statement,
    charge,
    close_due_month,
    close_month,
    closed_statement,
    hours,
    match_rate,
    money_quantum,
    month_due_for_closing,
    price_usage,
    quantity,
    render_csv,
    render_json,
    sha256,
)
from slurmtel.cli import main
from slurmtel.config import ChargebackRate, Config, config_from_dict
from slurmtel.errors import ConfigError
from slurmtel.records import JobAttempt
from slurmtel.store.jobs import sync_outcome_classes, write_attempts
from slurmtel.store.usage import usage_report
from slurmtel.timeparse import month_bounds
from tests.conftest import LoginRoles
from tests.factories import at, attempt

ROOT = Path(__file__).resolve().parents[1]
RATES = [
    {"partition": "gpu", "gpu_model": "h100", "price_per_gpu_hour": "2.50", "valid_from": "2026-01-01"},
    # a change in the middle of November applies from December on
    {"partition": "gpu", "gpu_model": "h100", "price_per_gpu_hour": "3.00", "valid_from": "2026-11-15"},
    {"partition": "gpu", "gpu_model": "*", "price_per_gpu_hour": "1.75", "valid_from": "2026-01-01"},
    {"partition": "*", "gpu_model": "a100", "price_per_gpu_hour": "1.10", "valid_from": "2026-01-01"},
]
SETTINGS: dict[str, Any] = {"site": {"timezone": "Europe/Berlin"}, "chargeback": {"rates": RATES}}


@pytest.fixture
def config() -> Config:
    return config_from_dict(SETTINGS)


def load(engine: Engine, config: Config, *attempts: JobAttempt) -> None:
    with engine.begin() as conn:
        sync_outcome_classes(conn, config.outcomes.mapping())
        write_attempts(conn, attempts)


def job(job_id_raw: int, start: str, seconds: int, **overrides: Any) -> JobAttempt:
    start_at = at(start)
    values: dict[str, Any] = {
        "job_id_raw": job_id_raw,
        "submit_at": start_at - timedelta(minutes=1),
        "eligible_at": start_at - timedelta(minutes=1),
        "start_at": start_at,
        "end_at": start_at + timedelta(seconds=seconds),
        "gpu_model": "h100",
    }
    values.update(overrides)
    return attempt(**values)


NOVEMBER = [
    # 2 GPUs 22:00Z .. 01:00Z: 1 h in October (Berlin), 2 h in November -> 4 GPU-hours x 2.50
    job(1, "2026-10-31T22:00:00", 3 * 3600, user="alice", account="physics", alloc_gpus=2),
    # same key, failed by the user: charged, 3 GPU-hours x 2.50
    job(2, "2026-11-03T08:00:00", 3 * 3600, user="alice", account="physics", state="FAILED"),
    # bob: node failure (waived) 10 h, requeued, then completed 1 h; a100 on gpu -> gpu/* 1.75
    job(
        3,
        "2026-11-04T00:00:00",
        10 * 3600,
        user="bob",
        account="chemistry",
        state="NODE_FAIL",
        gpu_model="a100",
    ),
    job(
        3,
        "2026-11-04T10:05:00",
        3600,
        user="bob",
        account="chemistry",
        gpu_model="a100",
        submit_at=at("2026-11-04T10:01:00"),
    ),
    # untyped GPU on debug: no rate matches -> unpriced
    job(4, "2026-11-05T00:00:00", 5400, user="carol", account="biology", partition="debug", gpu_model=""),
    # a100 on debug -> */a100 1.10, 2 GPU-hours
    job(
        5,
        "2026-11-06T00:00:00",
        3600,
        user="dave",
        account="physics",
        partition="debug",
        gpu_model="a100",
        alloc_gpus=2,
    ),
    # 1000 s x 2.50 / 3600 = 0.69444 -> 0.69
    job(6, "2026-11-07T00:00:00", 1000, user="erin", account="physics"),
    # no GPUs: not on a GPU statement
    job(7, "2026-11-07T00:00:00", 3600, user="erin", account="physics", alloc_gpus=0, gpu_model=""),
]
NOW = at("2026-12-03T12:00:00")

HEADER = (
    "format_version,statement_number,statement_date,statement_status,statement_sha256,month,currency,"
    "kind,adjusted_month,cluster,account,cost_centre,gl_code,pi,user,partition,tres,gpu_model,allocated_tres_seconds,"
    "waived_tres_seconds,billed_quantity,waived_quantity,billed_unit,priced,rate,amount,waived_amount,"
    "billable_amount,co2e_kilograms,cause\n"
)
# the lines only (no total row), statement_sha256 left empty (filled in by with_checksum)
NOVEMBER_LINES = """\
2,,,open,,2026-11,EUR,usage,,lab,biology,,,,carol,debug,gres/gpu,unknown,5400.00,0.00,1.500000,0.000000,gpu_hour,false,,,,,,
2,,,open,,2026-11,EUR,usage,,lab,chemistry,,,,bob,gpu,gres/gpu,a100,39600.00,36000.00,11.000000,10.000000,gpu_hour,true,1.75,19.25,17.50,1.75,,
2,,,open,,2026-11,EUR,usage,,lab,physics,,,,alice,gpu,gres/gpu,h100,25200.00,0.00,7.000000,0.000000,gpu_hour,true,2.50,17.50,0.00,17.50,,
2,,,open,,2026-11,EUR,usage,,lab,physics,,,,dave,debug,gres/gpu,a100,7200.00,0.00,2.000000,0.000000,gpu_hour,true,1.10,2.20,0.00,2.20,,
2,,,open,,2026-11,EUR,usage,,lab,physics,,,,erin,gpu,gres/gpu,h100,1000.00,0.00,0.277778,0.000000,gpu_hour,true,2.50,0.69,0.00,0.69,,
"""


def with_checksum(csv_text: str) -> str:
    """CSV_TEXT (statement_sha256 empty) with its statement_sha256 filled in, as defined: the
    sha256 of the lines CSV whose statement_sha256 fields are empty."""
    digest = sha256(csv_text.encode())
    return re.sub(r"^(\d+,[^,]*,[^,]*,[a-z]+,),", rf"\g<1>{digest},", csv_text, flags=re.M)


NOVEMBER_CSV = with_checksum(HEADER + NOVEMBER_LINES)


# ------------------------------------------------------------------------------- pure money


def test_rounding_is_half_even_to_the_currency_minor_unit_once() -> None:
    # 0.25/h x 72 s = 0.005 exactly -> 0.00 (to even); x 216 s = 0.015 -> 0.02
    assert charge(Decimal("0.25"), Decimal(72), "EUR") == Decimal("0.00")
    assert charge(Decimal("0.25"), Decimal(216), "EUR") == Decimal("0.02")
    assert str(charge(Decimal("0.25"), Decimal(72), "EUR")) == "0.00"
    assert money_quantum("JPY") == Decimal(1) and money_quantum("KWD") == Decimal("0.001")
    assert charge(Decimal("350"), Decimal(4500), "JPY") == Decimal(438)  # 437.5 -> 438 (even)
    # format 1 rounded the exact product once: 1000 s = 0.2778 h shown, 0.69 charged
    assert hours(Decimal(1000)) == Decimal("0.2778")
    assert charge(Decimal("2.50"), Decimal(1000), "EUR") == Decimal("0.69")
    # format 2 bills a quantity a ledger can multiply: 1000 s = 0.277778 GPU-hours, x 2.50 =
    # 0.694445 -> 0.69, money rounded once from the printed quantity and rate
    assert quantity("gres/gpu", Decimal(1000)) == Decimal("0.277778")
    assert amount_of(Decimal("2.50"), Decimal("0.277778"), "EUR") == Decimal("0.69")
    assert amount_of(Decimal("0.25"), Decimal("0.02"), "EUR") == Decimal("0.00")  # 0.005 -> even
    assert amount_of(Decimal("0.25"), Decimal("0.06"), "EUR") == Decimal("0.02")  # 0.015 -> even
    # mem is billed per GiB-hour from Slurm's megabytes: 4096 MB for 30 min = 2 GiB-hours
    assert quantity("mem", Decimal(4096 * 1800)) == Decimal("2.000000")


def rate(partition: str, model: str, price: str, valid_from: str = "2026-01-01") -> ChargebackRate:
    return ChargebackRate(partition, model, price, valid_from)


def test_the_most_specific_rate_valid_on_the_first_day_wins() -> None:
    rates = [
        rate("*", "*", "1.00"),
        rate("*", "h100", "2.00"),
        rate("gpu", "*", "3.00"),
        rate("gpu", "h100", "4.00"),
        rate("gpu", "h100", "5.00", "2026-12-01"),
        rate("gpu", "h100", "6.00", "2026-11-15"),
    ]
    nov, dec = datetime(2026, 11, 1).date(), datetime(2026, 12, 1).date()
    price = lambda p, m, on: match_rate(rates, p, m, on).price_per_gpu_hour  # type: ignore[union-attr]  # noqa: E731
    assert price("gpu", "h100", nov) == "4.00"
    assert price("gpu", "H100", nov) == "4.00"  # models compare case-insensitively
    assert price("gpu", "h100", dec) == "5.00"  # the latest valid_from on the 1st
    assert price("gpu", "a100", nov) == "3.00"
    assert price("long", "h100", nov) == "2.00"
    assert price("long", "a100", nov) == "1.00"
    assert match_rate(rates[3:4], "long", "h100", nov) is None
    assert match_rate(rates, "gpu", "h100", datetime(2025, 12, 31).date()) is None


def test_unpriced_usage_is_listed_never_charged_zero() -> None:
    config = config_from_dict({"chargeback": {"rates": [RATES[0]]}}).chargeback
    (line,) = price_usage(
        [UsageFigure("lab", "a", "u", "cpu", "unknown", "gres/gpu", Decimal(7200))], "2026-11", config
    )
    assert (line.priced, line.rate, line.amount, line.billable_amount) == (False, None, None, None)
    assert (line.allocated_tres_seconds, line.billed_quantity, line.billed_unit) == (
        Decimal("7200.00"),
        Decimal("2.000000"),
        "gpu_hour",
    )


def figure(seconds: int, key: str = "alice") -> UsageFigure:
    return UsageFigure("lab", "physics", key, "gpu", "h100", "gres/gpu", Decimal(seconds))


def test_adjustment_is_current_minus_frozen_minus_already_adjusted(config: Config) -> None:
    frozen = price_usage([figure(3600)], "2026-10", config.chargeback)
    current = price_usage([figure(5400), figure(3600, "bob")], "2026-10", config.chargeback)
    first = adjustment_lines("2026-10", current, frozen, [])
    assert [(a.user, a.kind, a.adjusted_month, a.allocated_tres_seconds, a.amount) for a in first] == [
        ("alice", "adjustment", "2026-10", Decimal("1800.00"), Decimal("1.25")),
        ("bob", "adjustment", "2026-10", Decimal("3600.00"), Decimal("2.50")),
    ]
    # once those are frozen in a later statement nothing is charged twice
    assert adjustment_lines("2026-10", current, frozen, first) == []
    # a record that vanished (moved to another account) is credited back
    (credit,) = adjustment_lines("2026-10", [], frozen, [])
    assert (credit.billed_quantity, credit.amount, credit.billable_amount) == (
        Decimal("-1.000000"),
        Decimal("-2.50"),
        Decimal("-2.50"),
    )


def test_config_rates_are_validated_by_key() -> None:
    with pytest.raises(ConfigError, match=r"unknown key 'chargeback\.rates\[1\]\.pric'"):
        config_from_dict({"chargeback": {"rates": [RATES[0], {"pric": "1"}]}})
    with pytest.raises(ConfigError, match=r"chargeback\.rates\[0\]\.price_per_gpu_hour must be a decimal"):
        config_from_dict({"chargeback": {"rates": [{**RATES[0], "price_per_gpu_hour": "2,50"}]}})
    with pytest.raises(ConfigError, match=r"'chargeback\.rates\[0\]\.price_per_gpu_hour' must be a str"):
        config_from_dict({"chargeback": {"rates": [{**RATES[0], "price_per_gpu_hour": 2.5}]}})
    with pytest.raises(ConfigError, match=r"chargeback\.rates\[0\]\.valid_from"):
        config_from_dict({"chargeback": {"rates": [{**RATES[0], "valid_from": "2026-02-30"}]}})
    with pytest.raises(ConfigError, match=r"chargeback\.rates\[1\] repeats chargeback\.rates\[0\]"):
        config_from_dict({"chargeback": {"rates": [RATES[0], {**RATES[0], "price_per_gpu_hour": "9"}]}})
    with pytest.raises(ConfigError, match=r"chargeback\.billing_rate is needed"):
        config_from_dict({"chargeback": {"use_billing_tres": True}})
    with pytest.raises(ConfigError, match=r"chargeback\.currency"):
        config_from_dict({"chargeback": {"currency": "euro"}})


def test_the_commented_rates_example_parses() -> None:
    example = (ROOT / "config" / "slurmtel.example.toml").read_text()
    block = example[example.index("# [[chargeback.rates]]") :]
    block = block[: block.index("\n\n")]
    uncommented = "\n".join(line[2:] for line in block.splitlines() if line.startswith("# "))
    config = config_from_dict(tomllib.loads(uncommented))
    assert config.chargeback.rates == [ChargebackRate("gpu", "h100", "2.50", "2026-01-01")]


def test_month_due_for_closing() -> None:
    config = config_from_dict(SETTINGS)
    assert month_due_for_closing(config, at("2026-12-04T22:59:00")) is None  # Dec 4th 23:59 in Berlin
    assert month_due_for_closing(config, at("2026-12-04T23:00:00")) == "2026-11"
    assert month_due_for_closing(config, at("2027-01-10T00:00:00")) == "2026-12"
    never = config_from_dict({"chargeback": {"close_day_of_month": 0}})
    assert month_due_for_closing(never, at("2026-12-20T00:00:00")) is None


# ------------------------------------------------------------------------------ statements


def statement(engine: Engine, config: Config, month: str, now: datetime = NOW):
    with engine.connect() as conn:
        return build_statement(conn, config, month, now)


def test_november_statement_golden_csv(engine: Engine, config: Config) -> None:
    load(engine, config, *NOVEMBER)
    result = statement(engine, config, "2026-11")
    assert render_csv(result).decode() == NOVEMBER_CSV
    document = json.loads(render_json(result))
    assert document["statement_status"] == "open" and document["rounding"] == "ROUND_HALF_EVEN"
    assert (document["format_version"], document["statement_number"], document["statement_date"]) == (
        2,
        None,
        None,
    )
    assert document["statement_sha256"] == NOVEMBER_CSV.splitlines()[1].split(",")[4]
    assert document["csv_sha256"] == sha256(NOVEMBER_CSV.encode())
    assert document["month_start_at"] == "2026-10-31T23:00:00+00:00"
    assert document["totals"]["amount"] == "39.64"
    (gpu,) = document["totals"]["by_unit"]
    assert (gpu["billed_unit"], gpu["unpriced_quantity"], gpu["unpriced_line_count"]) == (
        "gpu_hour",
        "1.500000",
        1,
    )
    assert document["lines"][1]["rate"] == "1.75" and document["lines"][0]["rate"] is None
    assert document["completed_jobs"][2]["cost_per_completed_job"] == "6.80"
    # totals are the sums of the rounded lines
    assert sum(line.amount for line in result.lines if line.amount is not None) == result.totals.amount
    # each line's amount is its rate x its billed quantity, rounded once
    for line in result.lines:
        if line.rate is not None:
            assert line.amount == amount_of(line.rate, line.billed_quantity, "EUR")


def test_gpu_hours_agree_with_the_usage_report(engine: Engine, config: Config) -> None:
    load(engine, config, *NOVEMBER)
    result = statement(engine, config, "2026-11")
    start, end = month_bounds("2026-11", config.zone)
    with engine.connect() as conn:
        usage = usage_report(conn, start=start, end=end, now=NOW, by="account", scope=EVERYTHING)
    by_account: dict[str, Decimal] = {}
    for line in result.lines:
        by_account[line.account] = by_account.get(line.account, Decimal(0)) + line.allocated_tres_seconds
    assert {r["account"]: Decimal(r["allocated_gpu_seconds"]) / 3600 for r in usage} == {
        "biology": Decimal("1.5"),
        "chemistry": Decimal("11"),
        "physics": Decimal(9 * 3600 + 1000) / 3600,
    }
    assert {a: s for a, s in by_account.items()} == {
        "biology": Decimal(5400),
        "chemistry": Decimal(39600),
        "physics": Decimal(9 * 3600 + 1000),
    }
    # October gets alice's first hour (2 GPUs) and nothing else
    october = statement(engine, config, "2026-10")
    assert [(line.user, line.billed_quantity, line.amount) for line in october.lines] == [
        ("alice", Decimal("2.000000"), Decimal("5.00"))
    ]


def test_waiving_can_be_switched_off(engine: Engine) -> None:
    config = config_from_dict({**SETTINGS, "chargeback": {"rates": RATES, "waive_system_failures": False}})
    load(engine, config, *NOVEMBER)
    bob = next(line for line in statement(engine, config, "2026-11").lines if line.user == "bob")
    assert (bob.amount, bob.waived_tres_seconds, bob.waived_amount, bob.billable_amount) == (
        Decimal("19.25"),
        Decimal("0.00"),
        Decimal("0.00"),
        Decimal("19.25"),
    )


def test_billing_tres_mode(engine: Engine) -> None:
    config = config_from_dict(
        {"site": SETTINGS["site"], "chargeback": {"use_billing_tres": True, "billing_rate": "0.05"}}
    )
    load(
        engine,
        config,
        job(1, "2026-11-02T00:00:00", 3600, alloc_gpus=2, alloc_tres={"billing": 16, "gres/gpu": 2}),
        # a CPU job with a billing TRES is billed too
        job(
            2, "2026-11-02T00:00:00", 1800, user="bob", alloc_gpus=0, gpu_model="", alloc_tres={"billing": 4}
        ),
        # no billing TRES recorded: unpriced, not free
        job(3, "2026-11-02T00:00:00", 3600, user="carol", alloc_tres={"gres/gpu": 1}),
    )
    lines = {(line.user, line.tres): line for line in statement(engine, config, "2026-11").lines}
    assert sorted(lines) == [("alice", "billing"), ("bob", "billing"), ("carol", "gres/gpu")]
    alice, bob, carol = lines["alice", "billing"], lines["bob", "billing"], lines["carol", "gres/gpu"]
    assert (alice.billed_unit, alice.allocated_tres_seconds, alice.billed_quantity, alice.amount) == (
        "billing_hour",
        Decimal("57600.00"),
        Decimal("16.000000"),
        Decimal("0.80"),
    )
    assert (bob.gpu_model, bob.billed_quantity, bob.amount) == ("none", Decimal("2.000000"), Decimal("0.10"))
    # GPU usage without a billing TRES is listed as GPU-hours, unpriced
    assert (carol.priced, carol.amount, carol.billed_quantity, carol.billed_unit) == (
        False,
        None,
        Decimal("1.000000"),
        "gpu_hour",
    )


def test_close_adjust_close_sequence(engine: Engine, config: Config) -> None:
    alice_oct = job(10, "2026-10-10T08:00:00", 2 * 3600, user="alice")
    load(engine, config, alice_oct, job(11, "2026-11-10T08:00:00", 3600, user="alice"))

    with pytest.raises(ChargebackError, match="has not ended yet"):
        close_month(engine, config, "2026-11", at("2026-11-20T00:00:00"))
    october = close_month(engine, config, "2026-10", at("2026-11-05T06:00:00"), closed_by="fin")
    assert october.csv_sha256 == sha256(october.csv)
    assert (october.format_version, october.statement_number) == (2, 1)
    assert [(line.user, line.amount) for line in october.lines] == [("alice", Decimal("5.00"))]
    with pytest.raises(MonthAlreadyClosed, match="already closed"):
        close_month(engine, config, "2026-10", at("2026-11-06T00:00:00"))

    # late data for October: a job sacct did not show before, and alice's end corrected (+1 h)
    load(
        engine,
        config,
        job(12, "2026-10-20T08:00:00", 4 * 3600, user="bob", gpu_model="a100"),
        replace(alice_oct, end_at=at("2026-10-10T11:00:00")),
    )
    stored = closed_statement(engine, "2026-10")
    assert stored is not None and (stored.csv, stored.json) == (october.csv, october.json)

    november = statement(engine, config, "2026-11", at("2026-12-03T00:00:00"))
    adjustments = [
        (line.kind, line.adjusted_month, line.user, line.billed_quantity, line.rate, line.amount)
        for line in november.lines
        if line.kind == "adjustment"
    ]
    assert adjustments == [
        ("adjustment", "2026-10", "alice", Decimal("1.000000"), Decimal("2.50"), Decimal("2.50")),
        ("adjustment", "2026-10", "bob", Decimal("4.000000"), Decimal("1.75"), Decimal("7.00")),
    ]
    assert november.totals.amount == Decimal("2.50") + Decimal("2.50") + Decimal("7.00")
    # December is not where October's late data goes while November is open
    assert [line for line in statement(engine, config, "2026-12").lines if line.kind == "adjustment"] == []

    closed_nov = close_month(engine, config, "2026-11", at("2026-12-05T00:00:00"))
    closed_at = at("2026-12-05T00:00:00")
    assert closed_nov.csv == render_csv(
        replace(
            november,
            status="closed",
            closed_at=closed_at,
            statement_number=2,
            statement_date=closed_at.astimezone(config.zone).date(),
        )
    )
    assert ",2,2026-12-05,closed," in closed_nov.csv.decode()
    assert "adjustment,2026-10,lab,physics,,,,bob,gpu,gres/gpu,a100,14400.00," in closed_nov.csv.decode()

    # December: October's adjustments are frozen in November; not charged again
    december = statement(engine, config, "2026-12", at("2027-01-02T00:00:00"))
    assert [line for line in december.lines if line.kind == "adjustment"] == []
    # more October data after November closed goes to December, and only that
    load(engine, config, job(13, "2026-10-21T08:00:00", 3600, user="carol"))
    december = statement(engine, config, "2026-12", at("2027-01-02T00:00:00"))
    assert [
        (line.adjusted_month, line.user, line.amount) for line in december.lines if line.kind == "adjustment"
    ] == [("2026-10", "carol", Decimal("2.50"))]
    # the closed months still export their original bytes
    assert closed_statement(engine, "2026-10").csv == october.csv  # type: ignore[union-attr]
    assert closed_statement(engine, "2026-11").json == closed_nov.json  # type: ignore[union-attr]


def test_stored_bytes_are_verified_against_their_checksum(engine: Engine, config: Config) -> None:
    load(engine, config, *NOVEMBER)
    close_month(engine, config, "2026-11", NOW)
    with engine.begin() as conn:
        conn.execute(text("UPDATE chargeback_statement SET csv = csv || '\\x0a'::bytea"))
    with pytest.raises(ChargebackError, match="does not match its sha256"):
        closed_statement(engine, "2026-11")


def test_close_due_month_for_the_daemon(engine: Engine, config: Config) -> None:
    load(engine, config, *NOVEMBER)
    assert close_due_month(engine, config, at("2026-12-02T00:00:00")) is None
    closed = close_due_month(engine, config, at("2026-12-05T08:00:00"))
    assert closed is not None and (closed.month, closed.closed_by) == ("2026-11", "slurmtel daemon")
    assert close_due_month(engine, config, at("2026-12-06T08:00:00")) is None


# ------------------------------------------------------------------------------------- CLI


@pytest.fixture
def cli(engine: Engine, database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Run `slurmtel ...` in-process against the test database as a given identity."""
    config_file = tmp_path / "slurmtel.toml"
    rates = "".join(
        "\n[[chargeback.rates]]\n" + "".join(f'{k} = "{v}"\n' for k, v in r.items()) for r in RATES
    )
    config_file.write_text(f'[site]\ntimezone = "Europe/Berlin"\n{rates}')
    monkeypatch.setenv("SLURMTEL_DATABASE_URL", database_url)
    monkeypatch.setattr("slurmtel.commands.common.utc_now", lambda: NOW)

    def run(identity: Identity, *argv: str) -> int:
        monkeypatch.setattr("slurmtel.commands.common.current_identity", lambda config: identity)
        return main(["--config", str(config_file), "--log-level", "WARNING", *argv])

    return run


FINANCE = Identity("fiona", Role.FINANCE)
ADMIN = Identity("root", Role.ADMIN)


def test_cli_exports_closes_and_re_exports_identical_bytes(
    cli, engine: Engine, config: Config, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    load(engine, config, *NOVEMBER)
    assert cli(FINANCE, "chargeback", "--month", "2026-11") == 0
    out, err = capsys.readouterr()
    assert out == NOVEMBER_CSV
    assert "warning: 1 line(s) (1.500000 gpu_hour) match no [[chargeback.rates]] entry" in err

    closed_csv = tmp_path / "nov.csv"
    assert cli(FINANCE, "chargeback", "--month", "2026-11", "--close", "--output", str(closed_csv)) == 0
    _, err = capsys.readouterr()
    digest = sha256(closed_csv.read_bytes())
    assert f"CSV sha256 {digest}" in err
    with engine.connect() as conn:
        closed_by = conn.execute(text("SELECT closed_by FROM chargeback_statement")).scalar_one()
    assert closed_by == "fiona"

    # more data for November arrives; the closed month's export does not change by a byte
    load(engine, config, job(20, "2026-11-20T00:00:00", 7200, user="frank", account="chemistry"))
    again = tmp_path / "again.csv"
    assert cli(ADMIN, "chargeback", "--month", "2026-11", "--output", str(again)) == 0
    _, err = capsys.readouterr()
    assert again.read_bytes() == closed_csv.read_bytes()
    assert f"CSV sha256 {digest}" in err
    assert cli(FINANCE, "chargeback", "--month", "2026-11", "--format", "json", "--output", str(again)) == 0
    _, err = capsys.readouterr()
    assert json.loads(again.read_bytes())["statement_status"] == "closed"
    assert f"JSON sha256 {sha256(again.read_bytes())}" in err
    assert cli(FINANCE, "chargeback", "--month", "2026-11", "--format", "table") == 0
    out, _ = capsys.readouterr()
    assert "Chargeback 2026-11, statement 1 of 2026-12-03, closed" in out and "Cost per completed job" in out

    assert cli(FINANCE, "chargeback", "--month", "2026-11", "--close") == 1
    _, err = capsys.readouterr()
    assert "2026-11 is already closed" in err and "not closed twice" in err

    # December shows frank's November job as an adjustment
    assert cli(FINANCE, "chargeback", "--month", "2026-12", "--format", "json") == 0
    out, _ = capsys.readouterr()
    (line,) = [line for line in json.loads(out)["lines"] if line["kind"] == "adjustment"]
    assert (line["adjusted_month"], line["user"], line["billed_quantity"], line["amount"]) == (
        "2026-11",
        "frank",
        "2.000000",
        "5.00",
    )


def test_cli_refuses_users_and_bad_months(cli, engine: Engine, capsys: pytest.CaptureFixture[str]) -> None:
    alice = Identity("alice", Role.USER, frozenset({"physics"}))
    assert cli(alice, "chargeback", "--month", "2026-11") == 1
    assert "alice (user) may not view statements" in capsys.readouterr().err
    assert cli(FINANCE, "chargeback", "--month", "2026-13") == 2
    assert re.search(r"YYYY-MM", capsys.readouterr().err)
    nobody = Identity("eve", Role.NOBODY)
    assert cli(nobody, "chargeback", "--month", "2026-11", "--close") == 1
    assert "may not close statements" in capsys.readouterr().err
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM chargeback_statement")).scalar_one() == 0


def test_statement_line_json_round_trip() -> None:
    from slurmtel.chargeback import line_from_data, line_to_data

    line = StatementLine(
        "usage", "", "lab", "a", "u", "gpu", "gres/gpu", "h100", Decimal("3600.00"), Decimal("0.00"),
        Decimal("1.000000"), Decimal("0.000000"), "gpu_hour", True, Decimal("2.50"), Decimal("2.50"),
        Decimal("0.00"), Decimal("2.50"), "", "alice", "CC-1", "GL-2",
    )  # fmt: skip
    assert line_from_data(json.loads(json.dumps(line_to_data(line)))) == line


# ------------------------------------------------------------------------ Grafana dashboard


def grafana_sql(sql: str, start: str, end: str) -> str:
    """rawSql with the Grafana PostgreSQL macros it uses expanded as Grafana does."""
    sql = re.sub(r"\$__timeFilter\(([^)]+)\)", rf"\1 BETWEEN '{start}' AND '{end}'", sql)
    return sql.replace("$__timeFrom()", f"'{start}'").replace("$__timeTo()", f"'{end}'")


def test_finance_dashboard_panels_run_and_show_the_closed_statement(
    engine: Engine, config: Config, login_roles: LoginRoles
) -> None:
    load(engine, config, *NOVEMBER)
    close_month(engine, config, "2026-11", NOW)
    dashboard = json.loads((ROOT / "config" / "grafana" / "slurmtel-finance.json").read_text())
    results: dict[str, list[tuple[Any, ...]]] = {}
    # as Grafana's role: the aggregate views only
    grafana = create_engine(login_roles.url(login_roles.aggregate))
    with grafana.connect() as conn:
        # months cut like the statement: the Grafana role's session time zone = site.timezone
        conn.exec_driver_sql("SET timezone = 'Europe/Berlin'")
        for panel in dashboard["panels"]:
            assert panel["datasource"] == {"type": "grafana-postgresql-datasource", "uid": "${DS_SLURMTEL}"}
            (target,) = panel["targets"]
            assert set(re.findall(r"\$__\w+", target["rawSql"])) <= {
                "$__timeFilter",
                "$__timeFrom",
                "$__timeTo",
            }
            sql = grafana_sql(target["rawSql"], "2026-10-01T00:00:00Z", "2026-12-31T00:00:00Z")
            results[panel["title"]] = [tuple(r) for r in conn.exec_driver_sql(sql)]
    grafana.dispose()
    november = month_bounds("2026-11", config.zone)[0]
    by_title = {title.split(" (")[0]: rows for title, rows in results.items()}
    gpu_hours = {(t, account): round(v, 4) for t, account, v in by_title["GPU-hours by account per month"]}
    assert {k[1]: v for k, v in gpu_hours.items() if k[0] == november} == {
        "biology": Decimal("1.5000"),
        "chemistry": Decimal("11.0000"),
        "physics": Decimal("9.2778"),
    }
    assert by_title["Billed amount by account per month"] == [
        (november, "chemistry", Decimal("1.75")),
        (november, "physics", Decimal("20.39")),
    ]
    assert by_title["Unpriced GPU-hours by account"] == [(november, "biology", Decimal("1.5000"))]
    assert by_title["Cost per completed job by account"] == [
        (november, "chemistry", Decimal("19.25")),
        (november, "physics", Decimal("6.80")),
    ]
    ((month, *_, billable, unpriced, digest),) = by_title["Closed statements"]
    assert (month, billable, unpriced) == ("2026-11", Decimal("22.14"), Decimal("1.5000"))
    assert digest == closed_statement(engine, "2026-11").csv_sha256  # type: ignore[union-attr]
