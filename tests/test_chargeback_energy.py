"""Energy as money and carbon (issue 27 item 5), where the nodes report it: Slurm's energy TRES
(the joules acct_gather_energy measured for a job) billed per kWh with its kg CO2e on the
statement, and the GPUs' measured energy (NVML/DCGM) priced in `slurmtel job`. Optional: with
neither key set nothing changes. Site time zone Europe/Berlin."""

from __future__ import annotations

import csv
import io
from decimal import Decimal
from typing import Any

from sqlalchemy import Engine

from slurmtel.chargeback import build_statement, close_month, render_csv
from slurmtel.chargeback.focus import focus_records
from slurmtel.config import Config, config_from_dict
from slurmtel.reports.researcher import energy_lines, gpu_energy_figures
from slurmtel.rows import GpuFigures
from tests.factories import at
from tests.test_chargeback import job, load

GPU_RATE = {"partition": "*", "gpu_model": "*", "price_per_gpu_hour": "1.00", "valid_from": "2026-01-01"}
NOW = at("2026-12-03T12:00:00")


def configured(**energy: str) -> Config:
    return config_from_dict(
        {"site": {"timezone": "Europe/Berlin"}, "chargeback": {"rates": [GPU_RATE], **energy}}
    )


JOBS = [
    # 3 h across the Berlin month edge (23:00Z): 1 h in October, 2 h in November; 10.8 MJ =
    # 3 kWh measured by Slurm, 2 kWh of it in November
    job(1, "2026-10-31T22:00:00", 3 * 3600, alloc_tres={"gres/gpu": 1, "cpu": 4, "energy": 10_800_000}),
    # no energy gathered: no energy line
    job(2, "2026-11-05T00:00:00", 3600, user="bob", account="chemistry"),
]


def lines(engine: Engine, config: Config, month: str = "2026-11") -> dict[tuple[str, str], Any]:
    with engine.connect() as conn:
        statement = build_statement(conn, config, month, NOW)
    return {(line.user, line.tres): line for line in statement.lines}


def test_energy_is_billed_per_kwh_with_its_co2e(engine: Engine) -> None:
    config = configured(price_per_kwh="0.25", carbon_grams_per_kwh="350")
    load(engine, config, *JOBS)
    november = lines(engine, config)
    assert sorted(november) == [("alice", "energy"), ("alice", "gres/gpu"), ("bob", "gres/gpu")]
    energy = november["alice", "energy"]
    assert (
        energy.billed_unit, energy.billed_quantity, energy.rate, energy.amount, energy.co2e_kilograms,
        energy.allocated_tres_seconds,
    ) == ("kwh", Decimal("2.000000"), Decimal("0.25"), Decimal("0.50"), Decimal("0.700"), Decimal("0.00"))  # fmt: skip
    assert november["alice", "gres/gpu"].co2e_kilograms is None
    october = lines(engine, config, "2026-10")["alice", "energy"]
    assert (october.billed_quantity, october.amount, october.co2e_kilograms) == (
        Decimal("1.000000"),
        Decimal("0.25"),
        Decimal("0.350"),
    )
    with engine.connect() as conn:
        statement = build_statement(conn, config, "2026-11", NOW)
    (kwh,) = [u for u in statement.totals.by_unit if u.billed_unit == "kwh"]
    assert (kwh.billed_quantity, kwh.amount, kwh.co2e_kilograms) == (
        Decimal("2.000000"),
        Decimal("0.50"),
        Decimal("0.700"),
    )
    rows = list(csv.DictReader(io.StringIO(render_csv(statement).decode())))
    assert [(r["tres"], r["billed_unit"], r["co2e_kilograms"]) for r in rows if r["user"] == "alice"] == [
        ("energy", "kwh", "0.700"),
        ("gres/gpu", "gpu_hour", ""),
    ]
    (focus,) = [r for r in focus_records(statement) if r["PricingUnit"] == "kWh"]
    assert (focus["ListCost"], focus["Tags"]["co2e_kilograms"]) == (Decimal("0.50"), "0.700")


def test_a_closed_month_keeps_its_kwh_price_and_carbon_intensity(engine: Engine) -> None:
    config = configured(price_per_kwh="0.25", carbon_grams_per_kwh="350")
    load(engine, config, *JOBS)
    close_month(engine, config, "2026-11", NOW)
    # late energy of November, after the price and the grid changed
    load(
        engine,
        config,
        job(3, "2026-11-20T00:00:00", 3600, user="carol", alloc_tres={"gres/gpu": 1, "energy": 3_600_000}),
    )
    changed = configured(price_per_kwh="0.40", carbon_grams_per_kwh="100")
    with engine.connect() as conn:
        december = build_statement(conn, changed, "2026-12", at("2027-01-02T00:00:00"))
    (late,) = [line for line in december.lines if line.kind == "adjustment" and line.tres == "energy"]
    assert (late.billed_quantity, late.rate, late.amount, late.co2e_kilograms) == (
        Decimal("1.000000"),
        Decimal("0.25"),
        Decimal("0.25"),
        Decimal("0.350"),
    )


def test_without_the_keys_energy_is_not_on_the_statement(engine: Engine) -> None:
    config = configured()
    load(engine, config, *JOBS)
    assert sorted(lines(engine, config)) == [("alice", "gres/gpu"), ("bob", "gres/gpu")]


def gpu(energy_joules: float | None) -> GpuFigures:
    return GpuFigures("GPU-1", "gpu01", "agent", 3600, 3600, 0, 0, 0, 0, None, None, energy_joules)


def test_the_job_view_prices_the_gpus_energy() -> None:
    pricing = configured(price_per_kwh="0.25", carbon_grams_per_kwh="350").chargeback
    # two GPUs measured 4.5 MJ and 2.7 MJ: 2 kWh
    figures = gpu_energy_figures([gpu(4_500_000.0), gpu(2_700_000.0), gpu(None)], pricing)
    assert figures == {
        "gpu_energy_joules": Decimal("7200000.0"),
        "gpu_energy_amount": Decimal("0.50"),
        "gpu_co2e_kilograms": Decimal("0.700"),
        "currency": "EUR",
    }
    report = {**figures, "end_at": None}
    assert energy_lines(report) == [("GPU energy", "2.00 kWh, 0.50 EUR, 0.700 kg CO2e so far")]
    # no price configured: the energy alone; nothing measured: no line
    plain = gpu_energy_figures([gpu(3_600_000.0)], configured().chargeback)
    assert (plain["gpu_energy_amount"], plain["gpu_co2e_kilograms"]) == (None, None)
    assert energy_lines({**plain, "end_at": at("2026-11-01T00:00:00")}) == [("GPU energy", "1.00 kWh")]
    assert energy_lines({**gpu_energy_figures([gpu(None)], pricing), "end_at": None}) == []
