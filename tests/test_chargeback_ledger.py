"""What a ledger import needs (issue 27 item 3): each line's PI, cost centre and GL code, from
[[chargeback.accounts]] or sacctmgr's Organization/Description (a configurable mapping),
sub-accounts inheriting up the real Slurm account tree; one statement per PI beside the site's.

The tree and its Descr/Org fields are the real capture
tests/fixtures/slurmctld/slurm-22.05/sacctmgr-show-account-withassoc-nested.psv (chemistry >
organic > polymers; Descr "chemistry dept", "organic chemistry", ...; Org "university")."""

from __future__ import annotations

import csv
import io
import json
import stat
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine

from slurmtel.access import Identity, Role
from slurmtel.chargeback import (
    LedgerCodes,
    build_statement,
    close_month,
    for_pi,
    ledger_of,
    render_csv,
    rollup_records,
    verify_statement_file,
)
from slurmtel.cli import main
from slurmtel.config import Config, config_from_dict
from slurmtel.errors import ConfigError
from tests.test_chargeback import NOVEMBER, NOW, RATES, job, load

TREE = (
    Path(__file__).resolve().parent
    / "fixtures/slurmctld/slurm-22.05/sacctmgr-show-account-withassoc-nested.psv"
)
ACCOUNTS = [
    {"account": "chemistry", "pi": "dr-chem", "cost_centre": "CC-1042"},
    {"account": "physics", "pi": "dr-phys", "gl_code": "GL-5100"},
]
MAPPED = {"sacctmgr_description": "cost_centre", "sacctmgr_organization": "gl_code"}
EXTRA = [
    job(40, "2026-11-08T00:00:00", 1000, user="dave", account="organic"),
    job(41, "2026-11-09T00:00:00", 1000, user="dave", account="polymers"),
]


def configured(**chargeback: Any) -> Config:
    # no sacctmgr command: the host's sacctmgr (if any) is never asked; the tests that read the
    # account tree give it themselves (TREE, or a fake sacctmgr printing it)
    return config_from_dict(
        {
            "site": {"timezone": "Europe/Berlin"},
            "access": {"sacctmgr_command": ""},
            "chargeback": {"rates": RATES, **chargeback},
        }
    )


def test_codes_come_from_config_then_sacctmgr_then_the_parent_account() -> None:
    ledger = ledger_of(configured(accounts=ACCOUNTS, **MAPPED).chargeback, TREE.read_text())
    assert ledger.codes("chemistry") == LedgerCodes("dr-chem", "CC-1042", "university")
    # a sub-account keeps its own sacctmgr fields and inherits the PI of chemistry
    assert ledger.codes("organic") == LedgerCodes("dr-chem", "organic chemistry", "university")
    assert ledger.codes("polymers") == LedgerCodes("dr-chem", "polymer chemistry", "university")
    assert ledger.codes("physics") == LedgerCodes("dr-phys", "physics dept", "GL-5100")
    assert ledger.codes("biology") == LedgerCodes("", "biology dept", "university")
    assert ledger.codes("nowhere") == LedgerCodes()
    # without the mapping, only the config's codes, inherited down the tree
    plain = ledger_of(configured(accounts=ACCOUNTS).chargeback, TREE.read_text())
    assert plain.codes("polymers") == LedgerCodes("dr-chem", "CC-1042", "")
    assert plain.codes("biology") == LedgerCodes()


def statement_with_codes(engine: Engine, config: Config) -> Any:
    load(engine, config, *NOVEMBER, *EXTRA)
    with engine.connect() as conn:
        return build_statement(
            conn, config, "2026-11", NOW, ledger=ledger_of(config.chargeback, TREE.read_text())
        )


def test_each_line_carries_its_codes_and_a_pi_statement_its_own_lines(engine: Engine) -> None:
    config = configured(accounts=ACCOUNTS)
    statement = statement_with_codes(engine, config)
    codes = {(line.account, line.user): (line.pi, line.cost_centre, line.gl_code) for line in statement.lines}
    assert codes == {
        ("biology", "carol"): ("", "", ""),
        ("chemistry", "bob"): ("dr-chem", "CC-1042", ""),
        ("organic", "dave"): ("dr-chem", "CC-1042", ""),
        ("polymers", "dave"): ("dr-chem", "CC-1042", ""),
        ("physics", "alice"): ("dr-phys", "", "GL-5100"),
        ("physics", "dave"): ("dr-phys", "", "GL-5100"),
        ("physics", "erin"): ("dr-phys", "", "GL-5100"),
    }
    chem = for_pi(statement, "dr-chem")
    assert sorted({line.account for line in chem.lines}) == ["chemistry", "organic", "polymers"]
    # bob 19.25 (17.50 waived) + dave 0.69 + 0.69
    assert (chem.totals.amount, chem.totals.billable_amount) == (Decimal("20.63"), Decimal("3.13"))
    assert [c.account for c in chem.completed_jobs] == ["chemistry", "organic", "polymers"]
    rows = list(csv.DictReader(io.StringIO(render_csv(chem).decode())))
    assert sum(Decimal(r["amount"]) for r in rows) == chem.totals.amount
    assert {r["pi"] for r in rows} == {"dr-chem"}
    verify_statement_file(render_csv(chem))
    assert (
        json.loads(__import__("slurmtel.chargeback", fromlist=["render_json"]).render_json(chem))["pi"]
        == "dr-chem"
    )
    # the PIs' statements and the lines of no PI add up to the site's statement
    parts = [for_pi(statement, pi) for pi in ("dr-chem", "dr-phys", "")]
    assert sum(p.totals.amount for p in parts) == statement.totals.amount
    assert sum(len(p.lines) for p in parts) == len(statement.lines)
    # subtotals by PI and by cost centre
    by_pi = {r["rollup_account"]: r["amount"] for r in rollup_records(statement, "pi", {})}
    assert by_pi == {"": Decimal("0.00"), "dr-chem": Decimal("20.63"), "dr-phys": Decimal("20.39")}
    assert sum(r["amount"] for r in rollup_records(statement, "cost_centre", {})) == statement.totals.amount


def test_a_closed_statement_keeps_the_codes_it_was_closed_with(engine: Engine) -> None:
    config = configured(accounts=ACCOUNTS)
    load(engine, config, *NOVEMBER)
    closed = close_month(engine, config, "2026-11", NOW)
    assert b",physics,,GL-5100,dr-phys,alice," in closed.csv
    renamed = configured(accounts=[{**ACCOUNTS[1], "pi": "dr-new"}])
    with engine.connect() as conn:
        from slurmtel.store.chargeback import get_statements

        stored = get_statements(conn, ["2026-11"])["2026-11"]
        december = build_statement(conn, renamed, "2026-12", NOW.replace(month=12, day=20))
    assert {line.pi for line in stored.lines if line.account == "physics"} == {"dr-phys"}
    # a changed PI is no late usage: no adjustment line
    assert [line for line in december.lines if line.kind == "adjustment"] == []


def test_ledger_config_is_checked() -> None:
    with pytest.raises(
        ConfigError, match=r"chargeback\.sacctmgr_organization must be one of pi, cost_centre"
    ):
        configured(sacctmgr_organization="org")
    with pytest.raises(ConfigError, match=r"name the same field 'pi'"):
        configured(sacctmgr_organization="pi", sacctmgr_description="pi")
    with pytest.raises(ConfigError, match=r"chargeback\.accounts\[0\] sets none of"):
        configured(accounts=[{"account": "physics"}])
    with pytest.raises(ConfigError, match=r"chargeback\.accounts\[1\] repeats chargeback\.accounts\[0\]"):
        configured(accounts=[ACCOUNTS[0], {**ACCOUNTS[0], "pi": "x"}])


def test_cli_pi_statement_by_pi_and_sacctmgr_mapping(
    engine: Engine, database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    sacctmgr = tmp_path / "sacctmgr"
    sacctmgr.write_text(f"#!/bin/sh\ncat '{TREE}'\n")
    sacctmgr.chmod(sacctmgr.stat().st_mode | stat.S_IXUSR)
    rates = "".join(
        "\n[[chargeback.rates]]\n" + "".join(f'{k} = "{v}"\n' for k, v in r.items()) for r in RATES
    )
    config_file = tmp_path / "slurmtel.toml"
    config_file.write_text(
        f'[site]\ntimezone = "Europe/Berlin"\n[access]\nsacctmgr_command = "{sacctmgr}"\n'
        '[chargeback]\nsacctmgr_description = "cost_centre"\n'
        '[[chargeback.accounts]]\naccount = "chemistry"\npi = "dr-chem"\n' + rates
    )
    monkeypatch.setenv("SLURMTEL_DATABASE_URL", database_url)
    monkeypatch.setattr("slurmtel.commands.common.utc_now", lambda: NOW)
    monkeypatch.setattr(
        "slurmtel.commands.common.current_identity", lambda c: Identity("fiona", Role.FINANCE)
    )
    load(engine, configured(), *NOVEMBER, *EXTRA)

    def cli(*argv: str) -> int:
        return main(
            [
                "--config",
                str(config_file),
                "--log-level",
                "WARNING",
                "chargeback",
                "--month",
                "2026-11",
                *argv,
            ]
        )

    assert cli("--close") == 0
    capsys.readouterr()
    outputs = []
    for _ in range(2):
        assert cli("--pi", "dr-chem") == 0
        outputs.append(capsys.readouterr().out)
    # a closed month's PI statement is derived from its frozen lines: the same bytes each time
    assert outputs[0] == outputs[1]
    rows = list(csv.DictReader(io.StringIO(outputs[0])))
    assert {(r["account"], r["cost_centre"], r["statement_number"]) for r in rows} == {
        ("chemistry", "chemistry dept", "1"),
        ("organic", "organic chemistry", "1"),
        ("polymers", "polymer chemistry", "1"),
    }
    assert cli("--by", "pi", "--format", "json") == 0
    subtotals = json.loads(capsys.readouterr().out)
    assert {r["rollup_account"]: r["billable_amount"] for r in subtotals} == {"": "20.39", "dr-chem": "3.13"}
    assert cli("--pi", "nobody") == 0
    assert "no line of 2026-11 belongs to PI 'nobody'" in capsys.readouterr().err


def test_the_commented_accounts_example_parses() -> None:
    import tomllib

    example = (Path(__file__).resolve().parents[1] / "config" / "slurmtel.example.toml").read_text()
    block = example[example.index("# [[chargeback.accounts]]") :]
    block = block[: block.index("\n\n")]
    config = config_from_dict(
        tomllib.loads("\n".join(line[2:] for line in block.splitlines() if line.startswith("# ")))
    )
    (entry,) = config.chargeback.accounts
    assert (entry.account, entry.pi, entry.cost_centre, entry.gl_code) == (
        "chemistry",
        "dr-chem",
        "CC-1042",
        "GRANT-2026-17",
    )
