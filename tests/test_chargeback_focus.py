"""`chargeback --format focus|focus-parquet` (issue 27 item 4) against the published FOCUS 1.2
column list: tests/fixtures/focus/focus-1.2-columns.csv and focus-1.2-allowed-values.csv,
extracted from the FinOps Foundation's FOCUS_Spec repository at tag v1.2 (PROVENANCE.md).

Every Mandatory column is there with its data type, no column that allows no nulls has one,
every allowed-value column holds allowed values, every column is the spec's or a custom x_
column; usage lines are Usage charges and adjustments Adjustment/Correction charges in the
month they correct; the costs add up to the statement."""

from __future__ import annotations

import csv
import io
import json
import re
from datetime import datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from sqlalchemy import Engine

from slurmtel.access import Identity, Role
from slurmtel.cli import main
from slurmtel.config import config_from_dict
from tests.test_chargeback import NOVEMBER, RATES, job, load

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "focus"
SPEC = {r["column_id"]: r for r in csv.DictReader((FIXTURES / "focus-1.2-columns.csv").open())}
ALLOWED: dict[str, set[str]] = {}
for row in csv.DictReader((FIXTURES / "focus-1.2-allowed-values.csv").open()):
    ALLOWED.setdefault(row["column_id"], set()).add(row["value"])
SUBCATEGORIES = {
    (r["service_category"], r["value"])
    for r in csv.DictReader((FIXTURES / "focus-1.2-allowed-values.csv").open())
    if r["column_id"] == "ServiceSubcategory"
}
MANDATORY = {c for c, r in SPEC.items() if r["feature_level"] == "Mandatory"}
NOT_NULL = {c for c, r in SPEC.items() if r["allows_nulls"] == "False"}
INSTANT = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z")
NOW = datetime.fromisoformat("2026-12-03T12:00:00+00:00")
CPU_RATE = {"partition": "*", "gpu_model": "*", "price_per_cpu_hour": "0.02", "valid_from": "2026-01-01"}


def test_the_fixture_is_the_focus_1_2_column_list() -> None:
    # a sanity check of the extraction, against the spec's own words (PROVENANCE.md)
    assert len(SPEC) == 57
    assert {"BilledCost", "EffectiveCost", "ListCost", "ContractedCost", "BillingPeriodStart", "ChargeCategory",
            "PricingQuantity", "PricingUnit", "ServiceName", "ServiceCategory", "ProviderName"} <= MANDATORY  # fmt: skip
    assert SPEC["Tags"]["data_type"] == "JSON" and SPEC["ChargePeriodStart"]["data_type"] == "Date/Time"
    assert ALLOWED["ChargeCategory"] == {"Usage", "Purchase", "Tax", "Credit", "Adjustment"}


@pytest.fixture
def cli(engine: Engine, database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    rates = "".join(
        "\n[[chargeback.rates]]\n" + "".join(f'{k} = "{v}"\n' for k, v in r.items())
        for r in [*RATES, CPU_RATE]
    )
    config_file = tmp_path / "slurmtel.toml"
    config_file.write_text(
        # no sacctmgr: the accounts' codes are the file's alone (the ledger's own tests read
        # sacctmgr's account tree); the host's sacctmgr, if any, is not asked
        '[site]\ntimezone = "Europe/Berlin"\n[access]\nsacctmgr_command = ""\n'
        '[chargeback]\nprovider_name = "Example HPC Centre"\n'
        '[[chargeback.accounts]]\naccount = "physics"\npi = "dr-phys"\ncost_centre = "CC-1042"\n' + rates
    )
    monkeypatch.setenv("SLURMTEL_DATABASE_URL", database_url)
    monkeypatch.setattr(
        "slurmtel.commands.common.current_identity", lambda c: Identity("fiona", Role.FINANCE)
    )

    def run(now: str, *argv: str) -> int:
        monkeypatch.setattr("slurmtel.commands.common.utc_now", lambda: datetime.fromisoformat(now))
        return main(["--config", str(config_file), "--log-level", "WARNING", "chargeback", *argv])

    return run


def check_focus_rows(header: list[str], rows: list[dict[str, str]]) -> None:
    """ROWS (CSV text) against the spec: columns, types, nulls, allowed values."""
    assert set(header) >= MANDATORY, sorted(MANDATORY - set(header))
    assert all(c in SPEC or c.startswith("x_") for c in header), [c for c in header if c not in SPEC]
    for row in rows:
        for column in header:
            value = row[column]
            if column in NOT_NULL:
                assert value != "", (column, row)
            if value == "" or column not in SPEC:
                continue
            kind = SPEC[column]["data_type"]
            if kind == "Decimal":
                assert Decimal(value).is_finite(), (column, value)
            elif kind == "Date/Time":
                assert INSTANT.fullmatch(value), (column, value)
            elif kind == "JSON":
                tags = json.loads(value)
                assert isinstance(tags, dict) and all(isinstance(v, str) for v in tags.values()), value
            if column in ALLOWED:
                assert value in ALLOWED[column], (column, value)
        assert (row["ServiceCategory"], row["ServiceSubcategory"]) in SUBCATEGORIES


def test_focus_csv_of_an_open_month_with_adjustments(
    engine: Engine, cli: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    config = config_from_dict({"site": {"timezone": "Europe/Berlin"}})
    load(engine, config, job(9, "2026-10-10T08:00:00", 3600, user="alice"))
    assert cli("2026-11-05T06:00:00+00:00", "--month", "2026-10", "--close") == 0
    # November's usage, and October usage that arrived after October was closed
    load(engine, config, *NOVEMBER, job(10, "2026-10-20T08:00:00", 7200, user="alice"))
    capsys.readouterr()
    assert cli("2026-12-03T12:00:00+00:00", "--month", "2026-11", "--format", "focus") == 0
    out, err = capsys.readouterr()
    assert "match no [[chargeback.rates]] entry" in err  # carol's untyped GPU on debug
    reader = csv.DictReader(io.StringIO(out))
    rows = list(reader)
    assert reader.fieldnames is not None
    check_focus_rows(list(reader.fieldnames), rows)
    assert {r["x_StatementStatus"] for r in rows} == {"open"} and {r["InvoiceId"] for r in rows} == {""}
    assert {(r["BillingPeriodStart"], r["BillingPeriodEnd"]) for r in rows} == {
        ("2026-10-31T23:00:00Z", "2026-11-30T23:00:00Z")
    }
    # the late October job's GPU-hours and CPU-hours
    adjustments = [r for r in rows if r["ChargeCategory"] == "Adjustment"]
    assert sorted(r["PricingUnit"] for r in adjustments) == ["CPU-Hours", "GPU-Hours"]
    (adjustment,) = [r for r in adjustments if r["PricingUnit"] == "GPU-Hours"]
    assert (adjustment["ChargeClass"], adjustment["ChargePeriodStart"], adjustment["ChargePeriodEnd"]) == (
        "Correction",
        "2026-09-30T22:00:00Z",
        "2026-10-31T23:00:00Z",
    )
    # alice's late job (2 GPU-hours) and the October hour of her 2-GPU job 1 (loaded after the close)
    assert (adjustment["BilledCost"], adjustment["PricingQuantity"], adjustment["PricingUnit"]) == (
        "10.00",
        "4.000000",
        "GPU-Hours",
    )
    usage = [r for r in rows if r["ChargeCategory"] == "Usage"]
    assert {r["ChargeClass"] for r in usage} == {""}
    assert {r["ConsumedUnit"] for r in usage} == {"GPU-Hours", "CPU-Hours"}
    alice = next(
        r for r in usage if json.loads(r["Tags"])["user"] == "alice" and r["PricingUnit"] == "GPU-Hours"
    )
    assert (alice["ResourceId"], alice["SubAccountId"], alice["ListUnitPrice"], alice["ListCost"]) == (
        "lab/physics",
        "physics",
        "2.50",
        "17.50",
    )
    assert json.loads(alice["Tags"]) == {
        "cluster": "lab", "user": "alice", "partition": "gpu", "tres": "gres/gpu", "gpu_model": "h100",
        "pi": "dr-phys", "cost_centre": "CC-1042", "gl_code": "",
    }  # fmt: skip
    assert alice["ProviderName"] == alice["InvoiceIssuerName"] == "Example HPC Centre"
    # bob's node failure: listed at list price, not billed
    bob = next(r for r in usage if json.loads(r["Tags"])["user"] == "bob" and r["PricingUnit"] == "GPU-Hours")
    assert (bob["ListCost"], bob["BilledCost"], bob["EffectiveCost"]) == ("19.25", "1.75", "1.75")
    unpriced = [r for r in rows if r["x_Priced"] == "false"]
    assert [(r["BilledCost"], r["ListUnitPrice"], r["PricingCategory"]) for r in unpriced] == [
        ("0.00", "", "")
    ]
    # the costs add up to the statement's own totals
    assert cli("2026-12-03T12:00:00+00:00", "--month", "2026-11", "--totals", "--format", "json") == 0
    totals = json.loads(capsys.readouterr().out)
    assert sum(Decimal(r["BilledCost"]) for r in rows) == sum(Decimal(t["billable_amount"]) for t in totals)
    assert sum(Decimal(r["ListCost"]) for r in rows) == sum(Decimal(t["amount"]) for t in totals)


def test_focus_parquet_of_a_closed_month_has_the_spec_types(
    engine: Engine, cli: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = config_from_dict({"site": {"timezone": "Europe/Berlin"}})
    load(engine, config, *NOVEMBER)
    assert cli("2026-12-03T12:00:00+00:00", "--month", "2026-11", "--close") == 0
    capsys.readouterr()
    path = tmp_path / "nov.parquet"
    assert (
        cli(
            "2026-12-10T00:00:00+00:00",
            "--month",
            "2026-11",
            "--format",
            "focus-parquet",
            "--output",
            str(path),
        )
        == 0
    )
    table = pq.read_table(path)
    assert table.schema.metadata[b"focus.version"] == b"1.2"
    assert set(table.column_names) >= MANDATORY
    for field in table.schema:
        if field.name not in SPEC:
            assert field.name.startswith("x_")
            continue
        kind = SPEC[field.name]["data_type"]
        expected = {
            "Decimal": pa.types.is_decimal,
            "Date/Time": pa.types.is_timestamp,
            "String": pa.types.is_string,
            "JSON": pa.types.is_string,
        }[kind]
        assert expected(field.type), (field.name, kind, field.type)
        if field.name in NOT_NULL:
            assert table.column(field.name).null_count == 0, field.name
    assert str(table.schema.field("BilledCost").type) == "decimal128(38, 2)"
    assert str(table.schema.field("BillingPeriodStart").type) == "timestamp[us, tz=UTC]"
    rows = table.to_pylist()
    assert {r["x_StatementStatus"] for r in rows} == {"closed"} and {r["InvoiceId"] for r in rows} == {"1"}
    assert cli("2026-12-10T00:00:00+00:00", "--month", "2026-11", "--totals", "--format", "json") == 0
    totals = json.loads(capsys.readouterr().out)
    assert sum(r["BilledCost"] for r in rows) == sum(Decimal(t["billable_amount"]) for t in totals)
    # GPU-hours as in the statement without CPU rates (tests/test_chargeback.py), CPU-hours beside
    gpu = sum(r["BilledCost"] for r in rows if r["PricingUnit"] == "GPU-Hours")
    assert gpu == Decimal("22.14") and {r["PricingUnit"] for r in rows} == {"GPU-Hours", "CPU-Hours"}
    assert all(json.loads(r["Tags"])["cluster"] == "lab" for r in rows)
    # the CSV of a closed month is derived from its frozen lines: the same bytes after more data
    assert cli("2026-12-10T00:00:00+00:00", "--month", "2026-11", "--format", "focus") == 0
    first = capsys.readouterr().out
    load(engine, config, job(30, "2026-11-20T00:00:00", 3600, user="frank"))
    assert cli("2026-12-11T00:00:00+00:00", "--month", "2026-11", "--format", "focus") == 0
    assert capsys.readouterr().out == first
    check_focus_rows(first.splitlines()[0].split(","), list(csv.DictReader(io.StringIO(first))))
    assert cli("2026-12-11T00:00:00+00:00", "--month", "2026-11", "--format", "focus-parquet") == 2
    assert "give --output FILE" in capsys.readouterr().err
