"""`report usage --tres`: allocated TRES-seconds of every TRES per month (issue 27 item 1), on
hand-built attempts whose figures are worked out by hand. The real-Slurm equality with sreport
-T ALL is tests/integration/test_slurm_sacct.py::test_every_tres_equals_sreport."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from sqlalchemy import Engine

from slurmtel.access import EVERYTHING, Scope
from slurmtel.cli import main
from slurmtel.config import config_from_dict
from slurmtel.store.jobs import sync_outcome_classes, write_attempts
from slurmtel.store.usage import tres_usage_report
from tests.factories import at, attempt

BERLIN = ZoneInfo("Europe/Berlin")
NOW = at("2026-12-10T00:00:00")


def load(engine: Engine, *attempts: Any) -> None:
    with engine.begin() as conn:
        sync_outcome_classes(conn, config_from_dict({}).outcomes.mapping())
        write_attempts(conn, attempts)


def job(job_id_raw: int, start: str, seconds: int, **overrides: Any) -> Any:
    start_at = at(start)
    values: dict[str, Any] = {"end_at": start_at + timedelta(seconds=seconds), **overrides}
    return attempt(
        job_id_raw=job_id_raw, submit_at=start_at, eligible_at=start_at, start_at=start_at, **values
    )


ATTEMPTS = [
    # a GPU job across the Berlin month edge (23:00Z): 1 h in October, 2 h in November
    job(1, "2026-10-31T22:00:00", 3 * 3600, alloc_gpus=2,
        alloc_tres={"cpu": 8, "mem": 32000, "node": 1, "billing": 16, "gres/gpu": 2, "gres/gpu:h100": 2}),
    # a CPU-only job on two nodes, with --mem
    job(2, "2026-11-02T00:00:00", 1800, user="bob", account="chemistry", partition="cpu", alloc_gpus=0,
        alloc_tres={"cpu": 64, "mem": 4096, "node": 2, "billing": 64, "license/matlab": 1}),
    # still running at NOW: counted up to now
    job(3, "2026-12-09T23:00:00", 0, user="bob", account="chemistry", alloc_gpus=0, end_at=None,
        alloc_tres={"cpu": 4, "mem": 1000, "node": 1, "energy": 123456}),
]  # fmt: skip


def test_tres_seconds_per_account_and_month(engine: Engine) -> None:
    load(engine, *ATTEMPTS)
    with engine.connect() as conn:
        rows = tres_usage_report(
            conn,
            start=at("2026-10-01T00:00:00"),
            end=NOW,
            now=NOW,
            by="account",
            scope=EVERYTHING,
            zone=BERLIN,
        )
    got = {(r["month"], r["account"], r["tres"]): r["allocated_tres_seconds"] for r in rows}
    assert got == {
        ("2026-10", "physics", "billing"): 16 * 3600,
        ("2026-10", "physics", "cpu"): 8 * 3600,
        ("2026-10", "physics", "gres/gpu"): 2 * 3600,
        ("2026-10", "physics", "gres/gpu:h100"): 2 * 3600,
        ("2026-10", "physics", "mem"): 32000 * 3600,
        ("2026-10", "physics", "node"): 3600,
        ("2026-11", "physics", "billing"): 16 * 7200,
        ("2026-11", "physics", "cpu"): 8 * 7200,
        ("2026-11", "physics", "gres/gpu"): 2 * 7200,
        ("2026-11", "physics", "gres/gpu:h100"): 2 * 7200,
        ("2026-11", "physics", "mem"): 32000 * 7200,
        ("2026-11", "physics", "node"): 7200,
        ("2026-11", "chemistry", "billing"): 64 * 1800,
        ("2026-11", "chemistry", "cpu"): 64 * 1800,
        ("2026-11", "chemistry", "license/matlab"): 1800,
        ("2026-11", "chemistry", "mem"): 4096 * 1800,
        ("2026-11", "chemistry", "node"): 2 * 1800,
        # the running job: 23:00Z Dec 9 to NOW, energy left out (consumed, not allocated)
        ("2026-12", "chemistry", "cpu"): 4 * 3600,
        ("2026-12", "chemistry", "mem"): 1000 * 3600,
        ("2026-12", "chemistry", "node"): 3600,
    }
    # months add up to the whole window, and the window's edges cut exactly
    with engine.connect() as conn:
        november = tres_usage_report(
            conn, start=at("2026-11-02T00:15:00"), end=at("2026-11-02T00:45:00"), now=NOW, by="user",
            scope=EVERYTHING, zone=BERLIN, tres=("cpu", "node"),
        )  # fmt: skip
    # bob's two-node job overlaps the 30-minute window for its last 15 minutes
    assert [(r["user"], r["tres"], r["allocated_tres_seconds"]) for r in november] == [
        ("bob", "cpu", 64 * 900),
        ("bob", "node", 2 * 900),
    ]


def test_a_user_sees_their_own_tres_only(engine: Engine) -> None:
    load(engine, *ATTEMPTS)
    with engine.connect() as conn:
        rows = tres_usage_report(
            conn, start=at("2026-11-01T00:00:00"), end=NOW, now=NOW, by="account", scope=Scope(users=("bob",)),
            zone=BERLIN, tres=("cpu",),
        )  # fmt: skip
    assert {(r["month"], r["account"], r["allocated_tres_seconds"]) for r in rows} == {
        ("2026-11", "chemistry", 64 * 1800),
        ("2026-12", "chemistry", 4 * 3600),
    }


def test_cli_report_usage_tres(
    engine: Engine, database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    from slurmtel.access import Identity, Role

    load(engine, *ATTEMPTS)
    config_file = tmp_path / "slurmtel.toml"
    config_file.write_text('[site]\ntimezone = "Europe/Berlin"\n')
    monkeypatch.setenv("SLURMTEL_DATABASE_URL", database_url)
    monkeypatch.setattr("slurmtel.commands.common.utc_now", lambda: NOW)
    monkeypatch.setattr("slurmtel.commands.common.current_identity", lambda c: Identity("root", Role.ADMIN))
    base = ["--config", str(config_file), "report", "usage", "-S", "2026-11-01", "-E", "2026-12-01"]
    assert main([*base, "--tres", "cpu,gres/gpu", "--by", "partition", "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert rows == [
        {"cluster": "lab", "month": "2026-11", "partition": "cpu", "tres": "cpu", "allocated_tres_seconds": 115200},
        {"cluster": "lab", "month": "2026-11", "partition": "gpu", "tres": "cpu", "allocated_tres_seconds": 57600},
        {"cluster": "lab", "month": "2026-11", "partition": "gpu", "tres": "gres/gpu", "allocated_tres_seconds": 14400},
    ]  # fmt: skip
    assert main([*base, "--tres", "all", "--format", "table"]) == 0
    out = capsys.readouterr().out
    assert "TRES usage (allocated TRES-seconds) by account and month" in out and "license/matlab" in out
    assert main([*base, "--tres", "energy"]) == 2
    assert "energy is consumed, not allocated" in capsys.readouterr().err
    assert main([*base, "--tres", "cpu;drop"]) == 2
    assert "is not a TRES name" in capsys.readouterr().err
