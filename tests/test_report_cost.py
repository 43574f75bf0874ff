"""`report cost` on tests.factories.admin_day (2026-11-01, UTC, cluster "lab"), by hand.

Measured (GPU-hours; see test_report_taxonomy and test_report_capacity for the per-node sums):
  installed 169 = gpu 127 + debug 42 (gpu02's 24 unavailable + 18 unallocated)
  unavailable 66, unallocated 82.5, allocated 20.5 (no process 0.5, idle 0.5, active 1.5,
  unmeasured 18); useful 1.5 (J1 active 1 + the MIG job 0.5); failed 16; retry 2 (103's
  first attempt)
  allocated per account: physics 8.5 (J1 2 + 104 fitted 6 + MIG 0.5), chem 9 (102 8 + 106 1),
  bio 3 (103: 2 + 1)
  completed jobs (last attempt completed, ended in the day): 101, 103, 105, 106 = 4, all in
  partition gpu; physics 2 (101, 105), chem 1 (106), bio 1 (103)

Costs: monthly 2400 compute + 150 network + 300 storage + 90 support + 60 operations = 3000;
the period is 1 day of November's 30: months = 1/30, total = 3000 / 30 = 100.00
(components 80.00, 5.00, 10.00, 3.00, 2.00).
"""

from __future__ import annotations

import dataclasses
import json
import re
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from sqlalchemy import Engine

from slurmtel.access import Identity, Role
from slurmtel.cli import main
from slurmtel.config import Config, CostConfig, config_from_dict
from slurmtel.cost import allocate_money, settings_of
from slurmtel.errors import ConfigError
from slurmtel.months import months_in
from tests.factories import at, load_admin_day

NOW = at("2026-12-02T14:00:00")
COSTS = {
    "compute_per_month": "2400",
    "network_per_month": "150",
    "storage_per_month": "300",
    "support_per_month": "90",
    "operations_per_month": "60",
}
BASELINES = {"baseline_price_per_gpu_hour": "2.50", "baseline_price_per_unit": "30.00"}
ADMIN = Identity("root", Role.ADMIN)
FINANCE = Identity("fiona", Role.FINANCE)
USER = Identity("alice", Role.USER)
DAY = ("-S", "2026-11-01", "-E", "2026-11-02")


@pytest.fixture
def cli(engine: Engine, database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """run(identity, cost_settings, *argv) -> exit status, against the test database."""
    monkeypatch.setenv("SLURMTEL_DATABASE_URL", database_url)
    monkeypatch.setattr("slurmtel.commands.common.utc_now", lambda: NOW)

    def run(identity: Identity, cost: dict[str, str] | None, *argv: str, chargeback: str = "") -> int:
        config_file = tmp_path / "slurmtel.toml"
        table = "".join(f'{k} = "{v}"\n' for k, v in (cost or {}).items())
        config_file.write_text(
            '[site]\ntimezone = "UTC"\n'
            + (f"[cost]\n{table}" if cost is not None else "")
            + (f"[chargeback]\n{chargeback}" if chargeback else "")
        )
        monkeypatch.setattr("slurmtel.commands.common.current_identity", lambda config: identity)
        return main(["--config", str(config_file), "--log-level", "WARNING", *argv])

    return run


def hours(seconds: float) -> Decimal:
    """A GPU-seconds figure of the JSON in GPU-hours (exact)."""
    return Decimal(str(seconds)) / 3600


def cost_json(cli, capsys, cost: dict[str, str], *argv: str) -> list[dict]:
    assert cli(FINANCE, cost, "report", "cost", *DAY, "--format", "json", *argv) == 0
    out = capsys.readouterr().out
    return json.loads(out)


def test_cluster_by_hand(cli, engine: Engine, config: Config, capsys: pytest.CaptureFixture[str]) -> None:
    load_admin_day(engine, config)
    (row,) = cost_json(cli, capsys, {**COSTS, **BASELINES}, "--target-work", "1000")
    assert row == {
        "kind": "cluster",
        "cluster": "lab",
        "period_start_at": "2026-11-01T00:00:00+00:00",
        "period_end_at": "2026-11-02T00:00:00+00:00",
        "calendar_months": 0.033333,  # 1 day / 30
        "currency": "EUR",
        "installed_gpu_seconds": 608400.0,  # 169 h
        "allocated_gpu_seconds": 73800.0,  # 20.5 h
        # unused = unallocated 82.5 + allocated idle 0.5 + no process 0.5 = 83.5 h
        "unused_gpu_seconds": 300600.0,
        "unused_share": 0.4941,  # 83.5 / 169 = 0.49408
        "unused_cost": "49.41",  # 100 x 83.5 / 169 = 49.4083
        "retry_gpu_seconds": 7200.0,
        "retry_share": 0.0118,  # 2 / 169 = 0.011834
        "retry_cost": "1.18",  # 100 x 2 / 169 = 1.1834
        "failed_gpu_seconds": 57600.0,
        "useful_gpu_seconds": 5400.0,
        "useful_share": 0.0089,  # 1.5 / 169 = 0.008876
        "completed_jobs": 4,
        "accepted_unit": "completed_jobs",
        "accepted_units": 4,
        "total_cost": "100.00",  # 3000 x 1/30
        "compute_cost": "80.00",
        "network_cost": "5.00",
        "storage_cost": "10.00",
        "support_cost": "3.00",
        "operations_cost": "2.00",
        # J1's two GPU windows of the day, measured by the agents; no price per kWh configured
        "gpu_energy_joules": 108000.0,
        "gpu_energy_amount": None,
        "gpu_co2e_kilograms": None,
        "cost_per_unit": "25.00",  # 100 / 4
        "cost_per_useful_gpu_hour": "66.67",  # 100 / 1.5 = 66.666..
        "baseline_price_per_gpu_hour": "2.50",
        "baseline_gpu_hour_cost": "3.75",  # 2.50 x 1.5 useful GPU-hours
        "gpu_hour_savings": "-96.25",  # 3.75 - 100
        "break_even_useful_ratio": 0.2367,  # 100 / (169 x 2.50) = 100 / 422.5 = 0.236686
        "baseline_price_per_unit": "30.00",
        "baseline_unit_cost": "120.00",  # 30 x 4
        "unit_savings": "20.00",  # 120 - 100
        "break_even_units": 3.3333,  # 100 / 30
        # 1.5 useful GPU-hours / (169 / 24 GPUs) / (1/30 month) = 1080 / 169 = 6.390532 h
        "useful_gpu_seconds_per_gpu_month": 23005.917,
        "target_gpu_seconds_per_month": 3600000.0,
        "required_gpus": 156.48,  # 1000 / (1080 / 169) = 156.4815
        "required_gpus_ceil": 157,
    }


def test_partitions_share_the_cost_by_installed_gpu_hours(
    cli, engine: Engine, config: Config, capsys: pytest.CaptureFixture[str]
) -> None:
    load_admin_day(engine, config)
    rows = cost_json(cli, capsys, COSTS, "--by", "partition")
    by = {(r["kind"], r["partition"] if r["kind"] == "partition" else ""): r for r in rows}
    debug, gpu, total = by[("partition", "debug")], by[("partition", "gpu")], by[("total", "")]
    assert [r["kind"] for r in rows] == ["partition", "partition", "total"]
    # 100 x 42 / 169 = 24.852071; 100 x 127 / 169 = 75.147929
    assert (debug["total_cost"], gpu["total_cost"], total["total_cost"]) == ("24.85", "75.15", "100.00")
    assert sum(Decimal(r["total_cost"]) for r in (debug, gpu)) == Decimal(total["total_cost"])
    assert (hours(debug["installed_gpu_seconds"]), hours(gpu["installed_gpu_seconds"])) == (42, 127)
    # gpu: unused = 64.5 unallocated + 1 allocated idle; 65.5 / 127 = 0.515748; money 6550 / 169
    assert (hours(gpu["unused_gpu_seconds"]), gpu["unused_share"], gpu["unused_cost"]) == (
        Decimal("65.5"),
        0.5157,
        "38.76",
    )
    # debug: 18 unallocated / 42 = 0.428571; money 100 x 18 / 169 = 10.650888
    assert (hours(debug["unused_gpu_seconds"]), debug["unused_share"], debug["unused_cost"]) == (
        18,
        0.4286,
        "10.65",
    )
    assert (hours(gpu["retry_gpu_seconds"]), hours(debug["retry_gpu_seconds"])) == (2, 0)
    assert (gpu["completed_jobs"], debug["completed_jobs"]) == (4, 0)
    assert gpu["cost_per_unit"] == "18.79"  # (100 x 127 / 169) / 4 = 18.786982
    assert debug["cost_per_unit"] is None and debug["useful_gpu_seconds_per_gpu_month"] == 0.0
    assert total["completed_jobs"] == 4 and total["cluster"] == "lab"


def test_accounts_share_the_cost_by_allocated_gpu_hours_exactly(
    cli, engine: Engine, config: Config, capsys: pytest.CaptureFixture[str]
) -> None:
    load_admin_day(engine, config)
    rows = cost_json(cli, capsys, {**COSTS, **BASELINES}, "--by", "account")
    by = {r["account"]: r for r in rows}
    assert list(by) == ["bio", "chem", "physics", ""]
    # exact: bio 100 x 3 / 20.5 = 14.634146, chem 100 x 9 / 20.5 = 43.902439, physics
    # 100 x 8.5 / 20.5 = 41.463415; floors 14.63 + 43.90 + 41.46 = 99.99: the cent left goes to
    # the largest remainder (bio's 0.4146 of a cent)
    assert [by[a]["total_cost"] for a in ("bio", "chem", "physics", "")] == [
        "14.64",
        "43.90",
        "41.46",
        "100.00",
    ]
    assert by[""]["kind"] == "total"
    assert [hours(by[a]["allocated_gpu_seconds"]) for a in ("bio", "chem", "physics")] == [
        3,
        9,
        Decimal("8.5"),
    ]
    assert hours(by["bio"]["retry_gpu_seconds"]) == 2 and by["bio"]["retry_share"] == 0.6667
    assert by["bio"]["retry_cost"] == "9.76"  # 14.634146 x 2 / 3 = 9.756098
    assert (hours(by["physics"]["unused_gpu_seconds"]), by["physics"]["unused_share"]) == (1, 0.1176)
    assert [by[a]["completed_jobs"] for a in ("bio", "chem", "physics")] == [1, 1, 2]
    assert by["physics"]["cost_per_unit"] == "20.73"  # 41.463415 / 2
    assert by["physics"]["installed_gpu_seconds"] is None
    # break-even over the account's allocated GPU-hours: 41.463415 / (8.5 x 2.50) = 1.951220
    assert by["physics"]["break_even_useful_ratio"] == 1.9512


def test_other_units(cli, engine: Engine, config: Config, capsys: pytest.CaptureFixture[str]) -> None:
    load_admin_day(engine, config)
    (row,) = cost_json(cli, capsys, {**COSTS, "unit": "completed_gpu_hours"})
    # units = 1.5 useful GPU-hours: the unit cost is the cost per useful GPU-hour
    assert (row["accepted_unit"], row["accepted_units"], row["cost_per_unit"]) == (
        "completed_gpu_hours",
        1.5,
        "66.67",
    )
    configured = {**COSTS, "unit": "configured", "unit_name": "1M tokens", "units_per_month": "300"}
    rows = cost_json(cli, capsys, configured, "--by", "partition")
    # 300 a month x 1/30 = 10 units, shared out by useful GPU-hours (all in gpu)
    assert [(r["accepted_unit"], r["accepted_units"], r["cost_per_unit"]) for r in rows] == [
        ("1M tokens", 0.0, None),
        ("1M tokens", 10.0, "7.51"),  # 75.147929 / 10
        ("1M tokens", 10.0, "10.00"),
    ]


def test_missing_costs_are_named_and_exit_2(
    cli, engine: Engine, config: Config, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli(ADMIN, None, "report", "cost", *DAY) == 2
    err = capsys.readouterr().err
    for key in COSTS:
        assert f"cost.{key}" in err
    assert cli(ADMIN, {"compute_per_month": "1", "network_per_month": "0"}, "report", "cost", *DAY) == 2
    err = capsys.readouterr().err
    assert "not set: cost.storage_per_month, cost.support_per_month, cost.operations_per_month" in err
    assert "cost.compute_per_month" not in err
    # with the costs set and nothing measured: the cost, no shares or unit costs
    (row,) = cost_json(cli, capsys, COSTS)
    assert (row["total_cost"], row["installed_gpu_seconds"], row["unused_share"], row["cost_per_unit"]) == (
        "100.00",
        0.0,
        None,
        None,
    )


def test_a_plain_user_is_denied(
    cli, engine: Engine, config: Config, capsys: pytest.CaptureFixture[str]
) -> None:
    load_admin_day(engine, config)
    assert cli(USER, COSTS, "report", "cost", *DAY) != 0
    captured = capsys.readouterr()
    assert "may not view statements" in captured.err and captured.out == ""


def test_cli_three_formats(cli, engine: Engine, config: Config, capsys: pytest.CaptureFixture[str]) -> None:
    load_admin_day(engine, config)
    assert (
        cli(ADMIN, {**COSTS, **BASELINES}, "report", "cost", *DAY, "--by", "partition", "--format", "csv")
        == 0
    )
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("kind,cluster,partition,period_start_at,")
    assert len(lines) == 4 and lines[3].startswith("total,lab,,")
    assert ",100.00,80.00,5.00,10.00,3.00,2.00," in lines[3]
    assert cli(ADMIN, COSTS, "report", "cost", *DAY) == 0
    table = capsys.readouterr().out
    assert table.startswith("Cost, 2026-11-01 00:00 – 2026-11-02 00:00 UTC (0.033 months), EUR")
    assert "total_cost" in table and "100.00" in table
    assert re.search(r"^installed_gpu_hours +169$", table, re.MULTILINE)
    assert cli(ADMIN, COSTS, "report", "cost", *DAY, "--by", "account") == 0
    table = capsys.readouterr().out
    assert "physics" in table and "41.46" in table
    assert cli(ADMIN, COSTS, "report", "cost", *DAY, "--format", "json") == 0
    assert json.loads(capsys.readouterr().out)[0]["total_cost"] == "100.00"


def test_months_are_calendar_fractions() -> None:
    utc = ZoneInfo("UTC")
    november = months_in(datetime(2026, 11, 1, tzinfo=UTC), datetime(2026, 12, 1, tzinfo=UTC), utc)
    assert november == 1
    # 15 days of November (30) + 15 of December (31)
    mid = months_in(datetime(2026, 11, 16, tzinfo=UTC), datetime(2026, 12, 16, tzinfo=UTC), utc)
    assert abs(mid - (Decimal(15) / 30 + Decimal(15) / 31)) < Decimal("1e-25")
    berlin = ZoneInfo("Europe/Berlin")
    # October 2026 in Berlin has 745 hours (DST ends): the whole month is still exactly 1
    october = months_in(datetime(2026, 10, 1, tzinfo=berlin), datetime(2026, 11, 1, tzinfo=berlin), berlin)
    assert october == 1


def test_allocate_money_adds_up_exactly() -> None:
    parts = [Decimal(100) / 3] * 3
    assert allocate_money(parts, Decimal("0.01")) == [Decimal("33.34"), Decimal("33.33"), Decimal("33.33")]
    assert sum(allocate_money([Decimal("0.005")] * 7, Decimal("0.01"))) == Decimal("0.04")


def test_cost_config_is_validated_by_key() -> None:
    with pytest.raises(ConfigError, match=r"cost\.network_per_month must be a decimal"):
        config_from_dict({"cost": {"network_per_month": "ten"}})
    with pytest.raises(ConfigError, match=r"cost\.storage_per_month must be a non-negative"):
        config_from_dict({"cost": {"storage_per_month": "-1"}})
    with pytest.raises(ConfigError, match=r"cost\.unit must be"):
        config_from_dict({"cost": {"unit": "tokens"}})
    with pytest.raises(ConfigError, match=r"cost\.units_per_month is required"):
        config_from_dict({"cost": {"unit": "configured", "unit_name": "1M tokens"}})
    with pytest.raises(ConfigError, match=r"cost\.baseline_price_per_unit must be"):
        config_from_dict({"cost": {"baseline_price_per_unit": "1,5"}})
    config = dataclasses.replace(Config(), cost=CostConfig(**COSTS, target_gpu_hours_per_month="500"))
    settings = settings_of(config)
    assert settings.target_gpu_hours_per_month == Decimal(500)
    assert settings_of(config, Decimal(7)).target_gpu_hours_per_month == Decimal(7)
    assert sum(settings.monthly.values()) == Decimal(3000)


def test_the_measured_energy_is_priced_with_its_co2e(
    cli, engine: Engine, config: Config, capsys: pytest.CaptureFixture[str]
) -> None:
    """With chargeback.price_per_kwh and carbon_grams_per_kwh, each row prices the energy its
    GPUs drew (issue 27 item 5): 108,000 J = 0.03 kWh x 0.25 = 0.0075 -> 0.01 EUR; x 350 g =
    10.5 g -> 0.010 kg (3 places, half-even)."""
    load_admin_day(engine, config)
    pricing = 'price_per_kwh = "0.25"\ncarbon_grams_per_kwh = "350"\n'
    assert (
        cli(FINANCE, COSTS, "report", "cost", *DAY, "--by", "account", "--format", "json", chargeback=pricing)
        == 0
    )
    by = {r["account"]: r for r in json.loads(capsys.readouterr().out)}
    physics, total = by["physics"], by[""]
    assert (physics["gpu_energy_joules"], physics["gpu_energy_amount"], physics["gpu_co2e_kilograms"]) == (
        108000.0,
        "0.01",
        0.01,
    )
    assert by["chem"]["gpu_energy_joules"] is None  # nothing measured: not 0
    assert total["gpu_energy_joules"] == 108000.0
