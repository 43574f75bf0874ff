"""Prices per TRES (issue 27 item 2): GPU-hours by partition and model as before, CPU-hours,
GiB-hours of memory and node-hours, one statement line per (account, user, partition, TRES);
a closed month is never re-priced by any rate. Figures worked out by hand; site time zone
Europe/Berlin (November 2026 is [2026-10-31T23:00Z, 2026-11-30T23:00Z))."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from sqlalchemy import Engine

from slurmtel.chargeback import build_statement, close_month, rate_notices, render_csv
from slurmtel.config import ChargebackRate, Config, config_from_dict
from slurmtel.errors import ConfigError
from slurmtel.store.chargeback import closed_settings
from tests.factories import at
from tests.test_chargeback import job, load

GPU = {"partition": "gpu", "gpu_model": "h100", "price_per_gpu_hour": "2.50", "valid_from": "2026-01-01"}
CPU = {"partition": "*", "gpu_model": "*", "price_per_cpu_hour": "0.02", "valid_from": "2026-01-01"}
MEM = {"partition": "cpu", "gpu_model": "*", "price_per_gib_hour": "0.005", "valid_from": "2026-01-01"}
NODE = {"partition": "cpu", "gpu_model": "*", "price_per_node_hour": "0.10", "valid_from": "2026-01-01"}
NOW = at("2026-12-03T12:00:00")


def configured(*rates: dict[str, str]) -> Config:
    return config_from_dict({"site": {"timezone": "Europe/Berlin"}, "chargeback": {"rates": list(rates)}})


JOBS = [
    # 2 h of an H100 job with 8 CPUs and 64000 MB
    job(1, "2026-11-02T00:00:00", 7200, user="alice", alloc_gpus=1,
        alloc_tres={"cpu": 8, "mem": 64000, "node": 1, "gres/gpu": 1}),
    # 30 min of a CPU-only job on two nodes of partition cpu: 64 CPUs, 4096 MB
    job(2, "2026-11-03T00:00:00", 1800, user="bob", account="chemistry", partition="cpu", alloc_gpus=0,
        gpu_model="", alloc_tres={"cpu": 64, "mem": 4096, "node": 2}),
]  # fmt: skip


def lines_of(engine: Engine, config: Config, month: str = "2026-11") -> dict[tuple[str, str], Any]:
    with engine.connect() as conn:
        statement = build_statement(conn, config, month, NOW)
    return {(line.user, line.tres): line for line in statement.lines}


def test_one_line_per_tres_each_priced_by_its_own_rate(engine: Engine) -> None:
    config = configured(GPU, CPU, MEM, NODE)
    load(engine, config, *JOBS)
    lines = lines_of(engine, config)
    figures = {
        key: (line.billed_unit, line.allocated_tres_seconds, line.billed_quantity, line.rate, line.amount)
        for key, line in lines.items()
    }
    assert figures == {
        ("alice", "gres/gpu"): ("gpu_hour", Decimal("7200.00"), Decimal("2.000000"), Decimal("2.50"), Decimal("5.00")),
        # 8 CPUs x 2 h = 16 CPU-hours x 0.02
        ("alice", "cpu"): ("cpu_hour", Decimal("57600.00"), Decimal("16.000000"), Decimal("0.02"), Decimal("0.32")),
        # memory and nodes of partition gpu: no rate -> listed unpriced, not free
        ("alice", "mem"): ("gib_hour", Decimal("460800000.00"), Decimal("125.000000"), None, None),
        ("alice", "node"): ("node_hour", Decimal("7200.00"), Decimal("2.000000"), None, None),
        # 64 CPUs x 0.5 h = 32 CPU-hours x 0.02
        ("bob", "cpu"): ("cpu_hour", Decimal("115200.00"), Decimal("32.000000"), Decimal("0.02"), Decimal("0.64")),
        # 4096 MB = 4 GiB x 0.5 h = 2 GiB-hours x 0.005 = 0.01
        ("bob", "mem"): ("gib_hour", Decimal("7372800.00"), Decimal("2.000000"), Decimal("0.005"), Decimal("0.01")),
        # 2 nodes x 0.5 h x 0.10
        ("bob", "node"): ("node_hour", Decimal("3600.00"), Decimal("1.000000"), Decimal("0.10"), Decimal("0.10")),
    }  # fmt: skip
    assert lines["bob", "cpu"].gpu_model == "none"
    with engine.connect() as conn:
        statement = build_statement(conn, config, "2026-11", NOW)
    # totals per billed unit, and the money total is the sum of the lines
    assert {u.billed_unit: u.amount for u in statement.totals.by_unit} == {
        "cpu_hour": Decimal("0.96"),
        "gib_hour": Decimal("0.01"),
        "gpu_hour": Decimal("5.00"),
        "node_hour": Decimal("0.10"),
    }
    assert statement.totals.amount == Decimal("6.07") == sum(line.amount or 0 for line in statement.lines)
    assert statement.totals.unpriced_line_count == 2


def test_without_cpu_rates_cpu_only_jobs_are_not_on_the_statement(engine: Engine) -> None:
    config = configured(GPU)
    load(engine, config, *JOBS)
    assert sorted(lines_of(engine, config)) == [("alice", "gres/gpu")]


def test_a_cpu_rate_edited_after_closing_re_prices_nothing(engine: Engine) -> None:
    config = configured(GPU, CPU)
    load(engine, config, *JOBS)
    closed = close_month(engine, config, "2026-11", NOW)
    edited = configured(GPU, {**CPU, "price_per_cpu_hour": "0.05"})
    # December: no adjustment for November, whose CPU-hours were priced at 0.02
    with engine.connect() as conn:
        december = build_statement(conn, edited, "2026-12", at("2027-01-02T00:00:00"))
        settings = closed_settings(conn)
    assert [line for line in december.lines if line.kind == "adjustment"] == []
    notices = rate_notices(edited, settings)
    assert "rate cpu */* 0.05 valid from 2026-01-01 covers closed month(s) 2026-11" in notices[0]
    assert "rate cpu */* 0.02 valid from 2026-01-01 priced closed month 2026-11" in notices[1]
    # late CPU usage of November is charged at November's 0.02
    load(engine, config, job(3, "2026-11-20T00:00:00", 3600, user="bob", account="chemistry",
                             partition="cpu", alloc_gpus=0, gpu_model="", alloc_tres={"cpu": 10}))  # fmt: skip
    with engine.connect() as conn:
        december = build_statement(conn, edited, "2026-12", at("2027-01-02T00:00:00"))
    (adjustment,) = [line for line in december.lines if line.kind == "adjustment"]
    assert (adjustment.tres, adjustment.billed_quantity, adjustment.rate, adjustment.amount) == (
        "cpu",
        Decimal("10.000000"),
        Decimal("0.02"),
        Decimal("0.20"),
    )
    assert "adjustment,2026-11,lab,chemistry,,,,bob,cpu,cpu,none," in render_csv(december).decode()
    assert closed.settings["rates"][1] == CPU  # what November was priced with, kept


def test_rate_config_names_exactly_one_tres() -> None:
    with pytest.raises(ConfigError, match=r"chargeback\.rates\[0\] needs exactly one of price_per_gpu_hour"):
        configured({**CPU, "price_per_gpu_hour": "1.00"})
    with pytest.raises(ConfigError, match=r"needs exactly one of .* not 0"):
        configured({"partition": "*", "gpu_model": "*", "valid_from": "2026-01-01"})
    with pytest.raises(ConfigError, match=r"chargeback\.rates\[0\]\.price_per_gib_hour must be a decimal"):
        configured({**MEM, "price_per_gib_hour": "cheap"})
    # the same partition, model and date for two TRES is two rates, not a repeat
    config = configured(CPU, {**CPU, "price_per_cpu_hour": "", "price_per_node_hour": "1"})
    assert [r.tres() for r in config.chargeback.rates] == ["cpu", "node"]
    with pytest.raises(ConfigError, match=r"rates\[1\] repeats chargeback\.rates\[0\] \(cpu"):
        configured(CPU, {**CPU, "price_per_cpu_hour": "0.03"})
    # a rate stored by a statement before CPU rates existed reads back as the same GPU rate
    assert ChargebackRate(**{k: v for k, v in GPU.items()}).tres() == "gres/gpu"


def test_the_commented_cpu_rate_example_parses() -> None:
    import tomllib
    from pathlib import Path

    example = (Path(__file__).resolve().parents[1] / "config" / "slurmtel.example.toml").read_text()
    block = example[example.index("# Other TRES are priced") :]
    block = block[: block.index("\n\n")]
    entry = block[block.index("# [[chargeback.rates]]") :]
    uncommented = "\n".join(line[2:] for line in entry.splitlines() if line.startswith("# "))
    config = config_from_dict(tomllib.loads(uncommented))
    assert [(r.tres(), r.price()) for r in config.chargeback.rates] == [("cpu", Decimal("0.02"))]
