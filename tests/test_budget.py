"""Budgets on hand-built attempts whose figures are worked out by hand.

Site time zone Europe/Berlin: November 2026 is [2026-10-31T23:00Z, 2026-11-30T23:00Z).
AT = 2026-11-11T23:00Z (midnight of the 12th in Berlin): 11 days of November have passed.

physics, by hand:
- job 1: 4 GPUs x 10 h on the 2nd, ended                       -> used 40 GPU-hours
- job 2: 2 GPUs since 19:00Z, running at AT, time limit 10 h   -> used 2 x 4 h = 8,
  committed 2 x (19:00 + 10 h - 23:00) = 2 x 6 h = 12 GPU-hours
- job 3: October (not in the period)
used 48, committed 12; budget 100 -> remaining 100 - 48 - 12 = 40;
burn rate 48 / 11 days = 4.3636 per day; exhaustion AT + (100 - 48) / (48 / 11) days
= AT + 11 11/12 days = AT + 11 d 22 h = 2026-11-23T21:00Z.
Money (gpu/h100 at 2.50, budget 300.00): used 120.00, committed 30.00, remaining 150.00,
burn 120 / 11 = 10.909 -> 10.91 per day, exhaustion AT + 180 / (120 / 11) days = AT + 16.5 d
= 2026-11-28T11:00Z.
"""

from __future__ import annotations

import csv
import io
import json
import stat
from datetime import datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine

from slurmtel.access import EVERYTHING, Identity, Role, Scope
from slurmtel.budget import (
    Budget,
    RunningAttempt,
    budget_row,
    committed_figures,
    configured_budgets,
    merge_budgets,
    month_slices,
    period_of,
    slurm_budgets,
)
from slurmtel.chargeback import build_statement
from slurmtel.cli import main
from slurmtel.commands.budget import budget_rows
from slurmtel.config import Config, config_from_dict
from slurmtel.errors import ConfigError
from slurmtel.parsers.sacctmgr import parse_account_parents, parse_grp_tres_mins
from slurmtel.records import JobAttempt
from slurmtel.store.jobs import sync_outcome_classes, write_attempts
from tests.conftest import fixture_path
from tests.factories import at, attempt

AT = at("2026-11-11T23:00:00")
RATE = {"partition": "gpu", "gpu_model": "h100", "price_per_gpu_hour": "2.50", "valid_from": "2026-01-01"}
GRP_FIXTURE = fixture_path("sacctmgr", "show-assoc-grptresmins-22.05.txt")
TREE_FIXTURE = fixture_path("slurmctld", "slurm-22.05", "sacctmgr-show-account-withassoc-nested.psv")


def settings(*budgets: dict[str, str], **chargeback: Any) -> dict[str, Any]:
    return {
        "site": {"timezone": "Europe/Berlin"},
        "chargeback": {"rates": [RATE], "budgets": list(budgets), **chargeback},
    }


def job(job_id_raw: int, start: str, seconds: int | None, **overrides: Any) -> JobAttempt:
    start_at = at(start)
    values: dict[str, Any] = {
        "job_id_raw": job_id_raw,
        "submit_at": start_at - timedelta(minutes=1),
        "eligible_at": start_at - timedelta(minutes=1),
        "start_at": start_at,
        "end_at": start_at + timedelta(seconds=seconds) if seconds is not None else None,
        "gpu_model": "h100",
        "alloc_tres": {"cpu": 1, "gres/gpu": overrides.get("alloc_gpus", 1)},
    }
    values.update(overrides)
    return attempt(**values)


PHYSICS = [
    job(1, "2026-11-02T00:00:00", 10 * 3600, alloc_gpus=4),
    job(2, "2026-11-11T19:00:00", None, alloc_gpus=2, state="RUNNING", user="bob", time_limit_seconds=36000),
    job(3, "2026-10-30T00:00:00", 3600, alloc_gpus=8),
]
CHEMISTRY = [
    # chemistry itself: 1 GPU x 3 h; its sub-account organic 2 GPUs x 5 h; polymers (below
    # organic) 1 GPU x 1 h: 3 + 10 + 1 = 14 GPU-hours for a budget on chemistry
    job(10, "2026-11-03T00:00:00", 3 * 3600, account="chemistry", user="bob"),
    job(11, "2026-11-04T00:00:00", 5 * 3600, account="organic", user="dave", alloc_gpus=2),
    job(12, "2026-11-05T00:00:00", 3600, account="polymers", user="dave"),
    # biology has no budget
    job(13, "2026-11-05T00:00:00", 3600, account="biology", user="carol"),
]


def load(engine: Engine, config: Config, *attempts: JobAttempt) -> None:
    with engine.begin() as conn:
        sync_outcome_classes(conn, config.outcomes.mapping())
        write_attempts(conn, attempts)


def rows_for(
    engine: Engine, config: Config, scope: Scope = EVERYTHING, parents: Any = None
) -> dict[str, Any]:
    budgets = configured_budgets(config.chargeback, AT, config.zone)
    with engine.connect() as conn:
        rows = budget_rows(conn, config, budgets, parents, AT, scope)
    return {r.account: r for r in rows}


# ------------------------------------------------------------------------------- by hand


def test_gpu_hour_budget_worked_out_by_hand(engine: Engine) -> None:
    config = config_from_dict(settings({"account": "physics", "period": "month", "gpu_hours": "100"}))
    load(engine, config, *PHYSICS, *CHEMISTRY)
    row = rows_for(engine, config)["physics"]
    assert (row.period, row.unit, row.source) == ("2026-11", "gpu_hours", "config")
    assert (row.period_start_at, row.period_end_at) == (at("2026-10-31T23:00:00"), at("2026-11-30T23:00:00"))
    assert row.budget == Decimal("100.0000")
    assert row.used == Decimal("48.0000")
    assert row.committed == Decimal("12.0000")
    assert row.remaining == Decimal("40.0000")
    assert row.burn_rate_per_day == Decimal("4.3636")
    assert row.projected_exhaustion_at == at("2026-11-23T21:00:00")
    assert row.covered_accounts == ("physics",)

    # used equals the chargeback statement's GPU-hours of the same month, computed at AT
    with engine.connect() as conn:
        statement = build_statement(conn, config, "2026-11", AT)
    physics = [line for line in statement.lines if line.account == "physics" and line.tres == "gres/gpu"]
    assert sum(line.allocated_tres_seconds for line in physics) / 3600 == row.used


def test_money_budget_priced_as_chargeback_prices(engine: Engine) -> None:
    config = config_from_dict(settings({"account": "physics", "period": "month", "amount": "300"}))
    load(engine, config, *PHYSICS)
    row = rows_for(engine, config)["physics"]
    assert (row.unit, row.currency) == ("amount", "EUR")
    assert (row.budget, row.used, row.committed, row.remaining) == (
        Decimal("300.00"),
        Decimal("120.00"),
        Decimal("30.00"),
        Decimal("150.00"),
    )
    assert row.burn_rate_per_day == Decimal("10.91")
    assert row.projected_exhaustion_at == at("2026-11-28T11:00:00")
    with engine.connect() as conn:
        statement = build_statement(conn, config, "2026-11", AT)
    assert sum(line.billable_amount or 0 for line in statement.lines if line.account == "physics") == row.used


def test_money_budget_counts_unpriced_usage_apart(engine: Engine) -> None:
    config = config_from_dict(settings({"account": "physics", "period": "month", "amount": "300"}))
    # debug partition: no rate matches; used 1 GPU x 2 h + the running one 1 h so far, which
    # commits 1 h more: 4 unpriced GPU-hours
    load(
        engine,
        config,
        job(20, "2026-11-05T00:00:00", 7200, partition="debug"),
        job(21, "2026-11-11T22:00:00", None, partition="debug", state="RUNNING", time_limit_seconds=7200),
    )
    row = rows_for(engine, config)["physics"]
    assert (row.used, row.committed, row.unpriced_gpu_hours) == (
        Decimal("0.00"),
        Decimal("0.00"),
        Decimal("4.0000"),
    )
    assert row.burn_rate_per_day == Decimal("0.00") and row.projected_exhaustion_at is None


def test_exhausted_and_not_within_the_period() -> None:
    period = period_of("month", AT, config_from_dict(settings()).zone)
    spent = budget_row(
        Budget("a", "month", "gpu_hours", Decimal(10), "config"),
        period,
        AT,
        Decimal(11),
        Decimal(1),
        Decimal(0),
        ["a"],
        "EUR",
    )
    assert spent.remaining == Decimal("-2.0000") and spent.projected_exhaustion_at == AT
    slow = budget_row(
        Budget("a", "month", "gpu_hours", Decimal(1000), "config"),
        period,
        AT,
        Decimal(11),
        Decimal(0),
        Decimal(0),
        ["a"],
        "EUR",
    )
    assert slow.burn_rate_per_day == Decimal("1.0000") and slow.projected_exhaustion_at is None
    idle = budget_row(
        Budget("a", "month", "gpu_hours", Decimal(5), "config"),
        period,
        AT,
        Decimal(0),
        Decimal(0),
        Decimal(0),
        ["a"],
        "EUR",
    )
    assert idle.burn_rate_per_day == Decimal("0.0000") and idle.projected_exhaustion_at is None


def test_periods_in_the_site_zone_and_committed_stops_at_the_period_end() -> None:
    zone = config_from_dict(settings()).zone
    quarter = period_of("quarter", AT, zone)
    assert (quarter.label, quarter.start_at, quarter.end_at) == (
        "2026-Q4",
        at("2026-09-30T22:00:00"),  # CEST
        at("2026-12-31T23:00:00"),
    )
    year = period_of("year", AT, zone)
    assert (year.label, year.start_at) == ("2026", at("2025-12-31T23:00:00"))
    assert [s.month for s in month_slices(quarter, AT, zone)] == ["2026-10", "2026-11"]
    assert month_slices(quarter, AT, zone)[-1].end_at == AT
    december_rate = {**RATE, "price_per_gpu_hour": "3.00", "valid_from": "2026-12-01"}
    config = config_from_dict(
        {"site": {"timezone": "Europe/Berlin"}, "chargeback": {"rates": [RATE, december_rate]}}
    )
    month = period_of("month", AT, zone)
    # no time limit: until the period's end (19 days of 24 h from AT)
    unlimited = RunningAttempt("a", "gpu", "h100", 1, Decimal(0), AT - timedelta(hours=1), None)
    assert committed_figures("gpu_hours", [unlimited], month, AT, zone, config.chargeback)[0] == Decimal(
        "456.0000"
    )
    # past its limit: nothing
    overdue = RunningAttempt("a", "gpu", "h100", 1, Decimal(0), AT - timedelta(hours=5), 3600)
    assert committed_figures("gpu_hours", [overdue], month, AT, zone, config.chargeback)[0] == Decimal(
        "0.0000"
    )
    # a quarter: at 2026-11-30T13:00Z, 20 h left: 10 h in November (2.50), 10 h from 23:00Z
    # in December (3.00, December's rate): 25.00 + 30.00
    december = RunningAttempt("a", "gpu", "h100", 1, Decimal(0), at("2026-11-30T13:00:00"), 20 * 3600)
    committed, unpriced = committed_figures(
        "amount", [december], quarter, at("2026-11-30T13:00:00"), zone, config.chargeback
    )
    assert (committed, unpriced) == (Decimal("25.00") + Decimal("30.00"), Decimal(0))


# ------------------------------------------------------------------- sub-accounts, scope


def test_a_budget_covers_its_sub_accounts(engine: Engine) -> None:
    config = config_from_dict(settings({"account": "chemistry", "period": "month", "gpu_hours": "25"}))
    load(engine, config, *CHEMISTRY)
    parents = parse_account_parents(TREE_FIXTURE.read_text())
    row = rows_for(engine, config, parents=parents)["chemistry"]
    assert row.covered_accounts == ("chemistry", "organic", "polymers")
    assert (row.used, row.remaining) == (Decimal("14.0000"), Decimal("11.0000"))
    # without the tree: the account alone
    row = rows_for(engine, config)["chemistry"]
    assert (row.covered_accounts, row.used) == (("chemistry",), Decimal("3.0000"))


def test_valid_from_picks_the_latest_budget_valid_on_the_period_start() -> None:
    config = config_from_dict(
        settings(
            {"account": "physics", "period": "month", "gpu_hours": "10", "valid_from": "2026-01-01"},
            {"account": "physics", "period": "month", "gpu_hours": "20", "valid_from": "2026-11-01"},
            {"account": "physics", "period": "month", "gpu_hours": "30", "valid_from": "2026-11-15"},
            {"account": "physics", "period": "year", "amount": "9000"},
        )
    )
    budgets = configured_budgets(config.chargeback, AT, config.zone)
    assert [(b.period, b.unit, b.value) for b in budgets] == [
        ("month", "gpu_hours", Decimal(20)),
        ("year", "amount", Decimal(9000)),
    ]


# ------------------------------------------------------------------------ Slurm budgets


def test_parse_grp_tres_mins_on_a_real_capture() -> None:
    # Slurm 22.05.8: chemistry cpu=100000,gres/gpu=1500; physics gres/gpu=6000; a user row
    # (alice in physics, gres/gpu=60) is not an account budget
    assert parse_grp_tres_mins(GRP_FIXTURE.read_text()) == {"chemistry": 1500, "physics": 6000}
    assert parse_grp_tres_mins(
        "lab|a||gres/gpu:h100=5,gres/gpu=-1\nlab|b||gres/gpu=60\nlab2|b||gres/gpu=30\n"
    ) == {"b": 90}
    assert parse_grp_tres_mins("") == {}


def test_configured_budgets_win_over_slurm_ones() -> None:
    configured = [Budget("physics", "month", "amount", Decimal(300), "config")]
    merged = merge_budgets(configured, slurm_budgets({"chemistry": 1500, "physics": 6000}, "quarter"))
    assert [(b.account, b.period, b.unit, b.value, b.source) for b in merged] == [
        ("chemistry", "quarter", "gpu_hours", Decimal(25), "slurm"),
        ("physics", "month", "amount", Decimal(300), "config"),
    ]


# ------------------------------------------------------------------------------- config


@pytest.mark.parametrize(
    ("budget", "message"),
    [
        ({"period": "month", "gpu_hours": "1"}, r"chargeback.budgets\[0\].account is required"),
        ({"account": "a", "period": "week", "gpu_hours": "1"}, r"chargeback.budgets\[0\].period must be"),
        ({"account": "a"}, r"exactly one of chargeback.budgets\[0\].gpu_hours and"),
        ({"account": "a", "gpu_hours": "1", "amount": "2"}, "exactly one of"),
        ({"account": "a", "gpu_hours": "lots"}, r"chargeback.budgets\[0\].gpu_hours must be a decimal"),
        ({"account": "a", "amount": "-5"}, r"chargeback.budgets\[0\].amount must be a non-negative"),
        ({"account": "a", "amount": "5", "valid_from": "2026-13-01"}, r"valid_from is not a valid date"),
        ({"account": "a", "amount": "5", "valid_from": "Nov 1"}, r"valid_from must be a date YYYY-MM-DD"),
        ({"account": "a", "amount": "5", "colour": "red"}, r"unknown key 'chargeback.budgets\[0\].colour'"),
        ({"account": "a", "gpu_hours": 5}, r"'chargeback.budgets\[0\].gpu_hours' must be a str"),
    ],
)
def test_budget_config_errors_name_the_key(budget: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        config_from_dict({"chargeback": {"budgets": [budget]}})


def test_budget_config_errors_for_repeats_and_the_slurm_period() -> None:
    twice = {"account": "a", "gpu_hours": "1"}
    with pytest.raises(ConfigError, match=r"chargeback.budgets\[1\] repeats chargeback.budgets\[0\]"):
        config_from_dict({"chargeback": {"budgets": [twice, twice]}})
    with pytest.raises(ConfigError, match=r"chargeback\.budget_slurm_period must be"):
        config_from_dict({"chargeback": {"budget_slurm_period": "week"}})
    with pytest.raises(ConfigError, match=r"'chargeback\.budgets_from_slurm' must be true or false"):
        config_from_dict({"chargeback": {"budgets_from_slurm": "yes"}})


# ------------------------------------------------------------------------------------- CLI

NOW = at("2026-11-20T12:00:00")


@pytest.fixture
def cli(engine: Engine, database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Run `slurmtel report budget` in-process with a fake sacctmgr printing the captures."""
    fake = tmp_path / "sacctmgr"
    fake.write_text(
        "#!/bin/sh\n"
        'case "$*" in\n'
        f"  *GrpTRESMins*) cat '{GRP_FIXTURE}' ;;\n"
        f"  *withassoc*) cat '{TREE_FIXTURE}' ;;\n"
        "  *) exit 1 ;;\n"
        "esac\n"
    )
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    config_file = tmp_path / "slurmtel.toml"
    config_file.write_text(
        '[site]\ntimezone = "Europe/Berlin"\n'
        f'[access]\nsacctmgr_command = "{fake}"\n'
        "[chargeback]\nbudgets_from_slurm = true\n"
        '[[chargeback.rates]]\npartition = "gpu"\ngpu_model = "h100"\nprice_per_gpu_hour = "2.50"\n'
        'valid_from = "2026-01-01"\n'
        '[[chargeback.budgets]]\naccount = "physics"\nperiod = "month"\ngpu_hours = "100"\n'
    )
    monkeypatch.setenv("SLURMTEL_DATABASE_URL", database_url)
    monkeypatch.setattr("slurmtel.commands.common.utc_now", lambda: NOW)

    def run(identity: Identity, *argv: str) -> int:
        monkeypatch.setattr("slurmtel.commands.common.current_identity", lambda config: identity)
        return main(["--config", str(config_file), "--log-level", "WARNING", "report", "budget", *argv])

    run.fake = fake  # type: ignore[attr-defined]
    return run


ADMIN = Identity("root", Role.ADMIN)


def test_cli_three_formats_with_slurm_budgets(
    cli, engine: Engine, capsys: pytest.CaptureFixture[str]
) -> None:
    load(engine, Config(), *PHYSICS, *CHEMISTRY)
    assert cli(ADMIN, "--at", "2026-11-12T00:00:00", "--format", "json") == 0
    out, err = capsys.readouterr()
    rows = {r["account"]: r for r in json.loads(out)}
    assert set(rows) == {"chemistry", "physics"}  # the configured budget wins for physics
    physics, chemistry = rows["physics"], rows["chemistry"]
    assert physics == {
        "account": "physics",
        "period": "2026-11",
        "period_start_at": "2026-10-31T23:00:00+00:00",
        "period_end_at": "2026-11-30T23:00:00+00:00",
        # a GPU-time budget: the _gpu_seconds figures, no amounts
        "budget_gpu_seconds": 360000.0,  # 100 h
        "used_gpu_seconds": 172800.0,  # 48 h
        "committed_gpu_seconds": 43200.0,  # 12 h
        "remaining_gpu_seconds": 144000.0,  # 40 h
        "burn_gpu_seconds_per_day": 15708.96,  # 4.3636 h a day
        "budget_amount": None,
        "used_amount": None,
        "committed_amount": None,
        "remaining_amount": None,
        "burn_amount_per_day": None,
        "currency": "",
        "projected_exhaustion_at": "2026-11-23T21:00:00+00:00",
        "unpriced_gpu_seconds": 0.0,
        "covered_accounts": ["physics"],
        "source": "config",
    }
    # GrpTRESMins gres/gpu=1500 GPU-minutes = 25 GPU-hours, over chemistry and its sub-accounts
    assert (
        chemistry["budget_gpu_seconds"],
        chemistry["used_gpu_seconds"],
        chemistry["remaining_gpu_seconds"],
        chemistry["source"],
    ) == (90000.0, 50400.0, 39600.0, "slurm")
    assert chemistry["covered_accounts"] == ["chemistry", "organic", "polymers"]
    assert err == ""

    assert cli(ADMIN, "--at", "2026-11-12T00:00:00", "--format", "csv", "-A", "physics") == 0
    out, _ = capsys.readouterr()
    (line,) = list(csv.DictReader(io.StringIO(out)))
    assert (line["used_gpu_seconds"], line["committed_gpu_seconds"], line["projected_exhaustion_at"]) == (
        "172800.000",
        "43200.000",
        "2026-11-23T21:00:00+00:00",
    )
    assert out.splitlines()[0] == (
        "account,period,period_start_at,period_end_at,budget_gpu_seconds,used_gpu_seconds,"
        "committed_gpu_seconds,remaining_gpu_seconds,burn_gpu_seconds_per_day,budget_amount,used_amount,"
        "committed_amount,remaining_amount,burn_amount_per_day,currency,projected_exhaustion_at,"
        "unpriced_gpu_seconds,covered_accounts,source"
    )

    assert cli(ADMIN, "--at", "2026-11-12T00:00:00") == 0
    out, _ = capsys.readouterr()
    assert "Budgets at 2026-11-12 00:00:00 CET" in out
    assert "physics" in out and "chemistry" in out and "48" in out and "used_gpu_hours" in out

    # default --at: the clock (NOW, 2026-11-20T12:00Z): job 2 still running (209 h, as the
    # statement counts it: 40 + 2 x 209 = 458), past its time limit so it commits nothing more
    assert cli(ADMIN, "--format", "json", "-A", "physics") == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert (row["used_gpu_seconds"], row["committed_gpu_seconds"], row["remaining_gpu_seconds"]) == (
        1648800.0,  # 458 h
        0.0,
        -1288800.0,  # -358 h
    )
    assert row["projected_exhaustion_at"] == "2026-11-20T12:00:00+00:00"  # exhausted already


def test_cli_coordinator_sees_only_their_accounts(
    cli, engine: Engine, capsys: pytest.CaptureFixture[str]
) -> None:
    load(engine, Config(), *PHYSICS, *CHEMISTRY)
    alice = Identity("alice", Role.USER, frozenset({"physics"}))
    assert cli(alice, "--at", "2026-11-12T00:00:00", "--format", "json") == 0
    rows = json.loads(capsys.readouterr().out)
    # the whole account's usage (bob's running job too), not only alice's own jobs
    assert [(r["account"], r["used_gpu_seconds"], r["committed_gpu_seconds"]) for r in rows] == [
        ("physics", 172800.0, 43200.0)
    ]
    assert cli(alice, "--at", "2026-11-12T00:00:00", "--format", "json", "-A", "chemistry") == 0
    assert json.loads(capsys.readouterr().out) == []
    nobody = Identity("eve", Role.NOBODY)
    assert cli(nobody) == 1
    assert "may not view aggregates" in capsys.readouterr().err


def test_cli_without_sacctmgr_warns_and_uses_configured_budgets(
    cli, engine: Engine, capsys: pytest.CaptureFixture[str]
) -> None:
    load(engine, Config(), *PHYSICS)
    cli.fake.write_text("#!/bin/sh\necho 'sacctmgr: error: Problem talking to the database' >&2\nexit 1\n")
    assert cli(ADMIN, "--at", "2026-11-12T00:00:00", "--format", "json") == 0
    out, err = capsys.readouterr()
    assert [r["account"] for r in json.loads(out)] == ["physics"]
    assert "cannot read GrpTRESMins from sacctmgr" in err
    assert "budgets cover only their own account" in err
    assert cli(ADMIN, "--at", "someday") == 2


def test_usage_in_the_period_slices_matches_the_whole_period(engine: Engine) -> None:
    # a quarter budget: usage summed over the quarter's months equals the usage of the quarter
    config = config_from_dict(settings({"account": "physics", "period": "quarter", "gpu_hours": "1000"}))
    load(engine, config, *PHYSICS)
    row = rows_for(engine, config)["physics"]
    # October's 8 GPU-hours count in Q4 too: 40 + 8 + 8
    assert (row.period, row.used, row.committed) == ("2026-Q4", Decimal("56.0000"), Decimal("12.0000"))
    assert row.period_start_at == datetime.fromisoformat("2026-09-30T22:00:00+00:00")
