"""`slurmtel me`: a user's month, split exactly at the month's edges, and who may ask for whom."""

from __future__ import annotations

import json
import re
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import Engine

from slurmtel.access import Identity, Role
from slurmtel.attribution import run_attribution
from slurmtel.cli import main
from slurmtel.config import Config
from slurmtel.store.jobs import sync_outcome_classes, write_attempts
from slurmtel.store.telemetry import write_inventory, write_summaries
from tests.factories import T0, at, attempt, inventory, windows

NOW = at("2026-12-03T12:00:00")
ALICE = Identity("alice", Role.USER)
CHEMISTRY_COORDINATOR = Identity("carol", Role.USER, frozenset({"chemistry"}))
ADMIN = Identity("root", Role.ADMIN)
FINANCE = Identity("fiona", Role.FINANCE)


def load(engine: Engine, config: Config) -> None:
    attempts = [
        # 2 GPUs across the Oct/Nov edge: 1 h in each month
        attempt(
            job_id_raw=1,
            name="edge",
            alloc_gpus=2,
            submit_at=at("2026-10-31T22:00:00"),
            start_at=at("2026-10-31T23:00:00"),
            end_at=at("2026-11-01T01:00:00"),
        ),
        # failed by the user: 3 GPU-hours
        attempt(
            job_id_raw=2,
            name="fails",
            state="OUT_OF_MEMORY",
            submit_at=at("2026-11-05T00:00:00"),
            start_at=at("2026-11-05T00:00:00"),
            end_at=at("2026-11-05T03:00:00"),
        ),
        # measured: 10 windows on GPU-0, 5 busy, 5 idle
        attempt(
            job_id_raw=3,
            name="measured",
            submit_at=T0,
            start_at=T0,
            end_at=T0 + timedelta(minutes=5),
            nodes=("gpu01",),
        ),
        # alice in chemistry: 1 GPU-hour
        attempt(
            job_id_raw=4,
            name="chem",
            account="chemistry",
            submit_at=at("2026-11-06T00:00:00"),
            start_at=at("2026-11-06T00:00:00"),
            end_at=at("2026-11-06T01:00:00"),
        ),
        # bob's job is not alice's
        attempt(
            job_id_raw=5,
            user="bob",
            submit_at=at("2026-11-07T00:00:00"),
            start_at=at("2026-11-07T00:00:00"),
            end_at=at("2026-11-07T09:00:00"),
        ),
    ]
    with engine.begin() as conn:
        sync_outcome_classes(conn, config.outcomes.mapping())
        write_attempts(conn, attempts)
        write_inventory(conn, inventory("gpu01", ["GPU-0"]), source="agent")
        write_summaries(conn, windows("GPU-0", T0, 10, busy={0, 1, 2, 3, 4}, job="3"), source="agent")
    run_attribution(engine, config, now=NOW)


@pytest.fixture
def cli(
    engine: Engine, config: Config, database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
):
    load(engine, config)
    config_file = tmp_path / "slurmtel.toml"
    config_file.write_text("")
    monkeypatch.setenv("SLURMTEL_DATABASE_URL", database_url)
    clock = {"now": NOW}
    monkeypatch.setattr("slurmtel.commands.common.utc_now", lambda: clock["now"])

    def run(identity: Identity, *argv: str, now=None) -> tuple[int, str, str]:
        clock["now"] = now or NOW
        monkeypatch.setattr("slurmtel.commands.common.current_identity", lambda config: identity)
        code = main(["--config", str(config_file), "--log-level", "WARNING", "me", *argv])
        out, err = capsys.readouterr()
        return code, out, err

    return run


def me(cli, identity: Identity, *argv: str) -> dict:
    code, out, err = cli(identity, "--format", "json", *argv)
    assert code == 0, err
    return json.loads(out)


def test_own_month_figures(cli) -> None:
    result = me(cli, ALICE, "--month", "2026-11")
    top = result.pop("top_jobs")
    assert result.pop("actions") == []
    assert result == {
        "user": "alice",
        "month": "2026-11",
        "jobs": 4,
        "attempts": 4,
        # 2 (edge, November half) + 3 (failed) + 300 s + 1 (chemistry)
        "allocated_gpu_seconds": 6 * 3600 + 300,
        "failed_gpu_seconds": 3 * 3600,
        "covered_gpu_seconds": 300,
        "unmeasured_gpu_seconds": 0,
        "idle_gpu_seconds": 150,
        "idle_share": 0.5,
        "mean_util_share": 0.4,
        # ten measured windows of 300 J; no price or carbon intensity configured
        "gpu_energy_joules": 3000.0,
        "gpu_energy_amount": None,
        "gpu_co2e_kilograms": None,
        "currency": None,
    }
    assert [
        (j["job_id"], j["name"], j["state"], j["allocated_gpu_seconds"], j["idle_share"]) for j in top
    ] == [
        ("2", "fails", "OUT_OF_MEMORY", 3 * 3600, None),
        ("1", "edge", "COMPLETED", 2 * 3600, None),
        ("4", "chem", "COMPLETED", 3600, None),
        ("3", "measured", "COMPLETED", 300, 0.5),
    ]
    assert top[3]["mean_util_share"] == 0.4 and top[3]["covered_share"] == 1.0


def test_the_month_edge_is_exact_and_the_default_is_this_month(cli) -> None:
    october = me(cli, ALICE, "--month", "2026-10")
    assert (october["jobs"], october["allocated_gpu_seconds"]) == (1, 2 * 3600)
    assert [j["job_id"] for j in october["top_jobs"]] == ["1"]
    december = me(cli, ALICE)
    assert (december["month"], december["jobs"], december["allocated_gpu_seconds"]) == ("2026-12", 0, 0)
    code, out, _ = cli(ALICE, "--top", "2", now=at("2026-11-20T00:00:00"))
    assert code == 0
    assert out.startswith("GPU use of alice in 2026-11 (so far)\n")
    assert re.search(r"\nallocated_gpu_hours +6\.0833\n", out)
    assert "Top 2 jobs by GPU-hours in 2026-11" in out


def test_who_may_ask_for_whom(cli) -> None:
    code, out, err = cli(ALICE, "--user", "bob", "--month", "2026-11")
    assert (code, out) == (1, "")
    assert "alice may only see their own usage, not bob's" in err
    # a coordinator sees another user's jobs in the accounts they coordinate only
    chem = me(cli, CHEMISTRY_COORDINATOR, "--user", "alice", "--month", "2026-11")
    assert (chem["jobs"], chem["allocated_gpu_seconds"], [j["job_id"] for j in chem["top_jobs"]]) == (
        1,
        3600,
        ["4"],
    )
    assert me(cli, ADMIN, "--user", "bob", "--month", "2026-11")["allocated_gpu_seconds"] == 9 * 3600
    code, _, err = cli(FINANCE, "--month", "2026-11")
    assert code == 1 and "fiona (finance) may not view jobs" in err
    code, _, err = cli(ALICE, "--month", "2026-13")
    assert code == 2 and "YYYY-MM" in err


def test_an_unknown_user_warns_in_the_callers_scope(cli) -> None:
    code, out, err = cli(ADMIN, "--month", "2030-01", "-u", "nosuch")
    assert code == 0
    assert err == "slurmtel: warning: no such user 'nosuch' in the data\n"
    assert "No jobs in 2030-01" in out and "Top 0" not in out
    # a coordinator: the same answer for a user outside their accounts whether one exists or not
    _, _, err_bob = cli(CHEMISTRY_COORDINATOR, "--month", "2026-11", "-u", "bob")
    _, _, err_none = cli(CHEMISTRY_COORDINATOR, "--month", "2026-11", "-u", "nosuch")
    assert err_none == "slurmtel: warning: no such user 'nosuch' in the data you may see\n"
    assert err_bob.replace("bob", "nosuch") == err_none
    code, _, err = cli(ADMIN, "--month", "2026-11", "-u", "alice")
    assert (code, err) == (0, "")
    with pytest.raises(SystemExit) as exited:
        cli(ALICE, "--top", "0")
    assert exited.value.code == 2


def test_the_months_gpu_energy_priced(cli, tmp_path: Path) -> None:
    # 3000 J = 0.000833 kWh x 120.00 = 0.09996 -> 0.10; x 600 g/kWh = 0.5 g -> 0.000 kg (to even)
    (tmp_path / "slurmtel.toml").write_text(
        '[chargeback]\nprice_per_kwh = "120.00"\ncarbon_grams_per_kwh = "600"\n'
    )
    result = me(cli, ALICE, "--month", "2026-11")
    # money an exact string, the rest numbers (as every JSON of slurmtel gives them)
    assert (result["gpu_energy_amount"], result["currency"], result["gpu_co2e_kilograms"]) == (
        "0.10",
        "EUR",
        0.0,
    )
    code, out, _ = cli(ALICE, "--month", "2026-11")
    assert code == 0 and "gpu_energy_amount" in out and "0.10" in out
