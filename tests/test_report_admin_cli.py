"""The admin reports through the real CLI (slurmtel.cli.main, in process), every format.

Data: tests.factories.admin_day; expected figures are derived in the test_report_*.py files.
The unix user running the tests is root (an admin) unless a test swaps the identity.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Callable

import pytest
from sqlalchemy import Engine

from slurmtel.access import Identity, Role
from slurmtel.cli import main
from slurmtel.config import Config
from tests.conftest import FIXED_NOW
from tests.factories import load_admin_day

WINDOW = ("-S", "2026-11-01", "-E", "2026-11-02")
Run = Callable[..., tuple[int, str, str]]


@pytest.fixture
def run(
    engine: Engine,
    config: Config,
    database_url: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture,
) -> Run:
    load_admin_day(engine, config)
    monkeypatch.setenv("SLURMTEL_DATABASE_URL", database_url)
    monkeypatch.delenv("SLURMTEL_CONFIG", raising=False)
    monkeypatch.setattr("slurmtel.commands.common.utc_now", lambda: FIXED_NOW)

    def _run(*argv: str) -> tuple[int, str, str]:
        capsys.readouterr()
        code = main(["--log-level", "WARNING", *argv])
        out, err = capsys.readouterr()
        return code, out, err

    return _run


def as_identity(monkeypatch: pytest.MonkeyPatch, identity: Identity) -> None:
    monkeypatch.setattr("slurmtel.commands.common.current_identity", lambda config: identity)


def csv_sections(text: str) -> dict[str, list[dict[str, str]]]:
    """Parse the multi-section CSV: "# name", header, rows; sections apart by a blank line."""
    sections: dict[str, list[dict[str, str]]] = {}
    for block in text.strip("\n").split("\n\n"):
        first, _, body = block.partition("\n")
        assert first.startswith("# "), block
        sections[first[2:]] = list(csv.DictReader(io.StringIO(body)))
    return sections


SECTIONED = {
    "failures": ["by_account", "by_user", "by_partition", "by_node", "top_attempts"],
    "idle": ["by_account", "by_user", "by_partition", "by_cause", "top_jobs", "unmapped"],
    "queue": ["wait_by_partition", "wait_by_account", "pending", "quota"],
    "capacity": ["summary", "breakdown"],
    "retries": ["chains", "by_account", "by_user"],
}


@pytest.mark.parametrize("name", sorted(SECTIONED))
def test_sectioned_reports_in_json_and_csv(run: Run, name: str) -> None:
    code, out, _ = run("report", name, *WINDOW, "--format", "json")
    assert code == 0
    document = json.loads(out)
    assert list(document) == SECTIONED[name]
    assert all(isinstance(rows, list) for rows in document.values())
    code, out, _ = run("report", name, *WINDOW, "--format", "csv")
    assert code == 0
    sections = csv_sections(out)
    assert list(sections) == SECTIONED[name]
    # the same rows in both formats
    assert {k: len(v) for k, v in sections.items()} == {k: len(v) for k, v in document.items()}


def test_failures_figures_in_every_format(run: Run) -> None:
    _, out, _ = run("report", "failures", *WINDOW, "--format", "json")
    document = json.loads(out)
    physics = next(r for r in document["by_account"] if r["account"] == "physics")
    # machine output in seconds (the unit rule of slurmtel.columns)
    assert (
        physics["failed_gpu_seconds"],
        physics["system_failure_gpu_seconds"],
        physics["allocated_gpu_seconds"],
    ) == (10 * 3600, 10 * 3600, 13 * 3600)
    assert [t["job_id"] for t in document["top_attempts"]] == ["104", "102", "103"]
    _, out, _ = run("report", "failures", *WINDOW, "--format", "csv", "--top", "1")
    sections = csv_sections(out)
    assert sections["by_node"][0]["node"] == "gpu04"
    assert [t["job_id"] for t in sections["top_attempts"]] == ["104"]
    assert sections["top_attempts"][0]["retry"] == "False"
    code, out, _ = run("report", "failures", *WINDOW)
    assert code == 0
    assert "Failed GPU-hours by account, 2026-11-01 00:00 – 2026-11-02 00:00 UTC" in out
    assert "failed_gpu_hours" in out and "failed_gpu_seconds" not in out
    assert "Top 3 attempts by failed GPU-hours" in out  # 3 of --top 10
    assert "gpu[01-02]" in out


def test_idle_queue_retries_and_capacity_figures(run: Run) -> None:
    idle = json.loads(run("report", "idle", *WINDOW, "--format", "json")[1])
    assert idle["top_jobs"][0]["job_id"] == "101"
    assert {r["account"]: r["unmapped_gpu_seconds"] for r in idle["unmapped"]} == {
        "physics": 10 * 3600,
        "chem": 5 * 3600,
        "bio": 3 * 3600,
    }
    queue = json.loads(run("report", "queue", *WINDOW, "--format", "json")[1])
    assert queue["wait_by_partition"][0]["queue_wait_p95_seconds"] == 6099.0
    assert [q["reason"] for q in queue["quota"]] == ["AssocGrpGRES", "QOSMaxGRESPerUser"]
    assert queue["pending"][0]["observed_at"] == "2026-11-01T23:59:00+00:00"
    capacity = json.loads(
        run("report", "capacity", *WINDOW, "--target-gpu-hours", "1000", "--format", "json")[1]
    )
    (summary,) = capacity["summary"]
    # exact decimals come out as JSON numbers
    assert (summary["installed_gpu_seconds"], summary["useful_gpu_seconds"], summary["required_gpus"]) == (
        169 * 3600,
        5400,
        156.48,
    )
    assert sum(r["category_gpu_seconds"] for r in capacity["breakdown"]) == 169 * 3600
    retries = json.loads(run("report", "retries", *WINDOW, "--format", "json")[1])
    assert {r["account"]: r["retry_gpu_seconds"] for r in retries["by_account"]} == {
        "bio": 7200,
        "chem": 0,
        "physics": 0,
    }
    code, out, _ = run("report", "capacity", *WINDOW)
    # one way to print a window: the whole days of a day-grained report, as any window
    assert code == 0 and "Capacity, 2026-11-01 00:00 – 2026-11-02 00:00 UTC" in out


def test_taxonomy_in_every_format(run: Run) -> None:
    code, out, _ = run("report", "taxonomy", *WINDOW, "--format", "json")
    assert code == 0
    rows = {r["partition"]: r for r in json.loads(out)}
    assert rows["gpu"]["installed_gpu_seconds"] == 127 * 3600
    assert rows["gpu"]["unallocated_gpu_seconds"] == 64.5 * 3600
    assert rows["debug"]["unavailable_share"] == round(24 / 42, 4)
    assert "installed_gpu_hours" not in rows["gpu"]
    code, out, _ = run("report", "taxonomy", *WINDOW, "--format", "csv", "-r", "debug")
    (row,) = list(csv.DictReader(io.StringIO(out)))
    assert (row["day"], row["installed_gpu_seconds"], row["unallocated_gpu_seconds"]) == (
        "2026-11-01",
        "151200.000",
        "64800.000",
    )
    code, out, _ = run("report", "taxonomy", *WINDOW)
    assert code == 0 and "GPU-hour taxonomy, 2026-11-01 00:00 – 2026-11-02 00:00 UTC" in out and "127" in out


def test_nodes_in_every_format(run: Run) -> None:
    code, out, _ = run("report", "nodes", *WINDOW, "--format", "json")
    assert code == 0
    rows = json.loads(out)
    assert rows[0]["node"] == "gpu02"
    assert {r["node"]: r["driver_drift"] for r in rows if r["driver_version"]} == {
        "gpu01": False,
        "gpu03": False,
        "gpu05": True,
    }
    _, out, _ = run("report", "nodes", *WINDOW, "--format", "csv")
    by_node = {r["node"]: r for r in csv.DictReader(io.StringIO(out))}
    assert (by_node["gpu01"]["xid_codes"], by_node["gpu02"]["partitions"]) == ("79:2 48:1", "debug,gpu")
    code, out, _ = run("report", "nodes", *WINDOW)
    assert code == 0 and "DOWN+NOT_RESPONDING" in out


def test_a_user_sees_only_their_own_rows(run: Run, monkeypatch: pytest.MonkeyPatch) -> None:
    as_identity(monkeypatch, Identity("alice", Role.USER))
    code, out, _ = run("report", "failures", *WINDOW, "--format", "json")
    assert code == 0
    document = json.loads(out)
    assert [r["user"] for r in document["by_user"]] == ["alice"]
    assert document["top_attempts"] == []  # alice's job did not fail
    code, _, err = run("report", "taxonomy", *WINDOW)
    assert code == 1 and "alice (user) may not view operations" in err


def test_a_coordinator_sees_their_accounts(run: Run, monkeypatch: pytest.MonkeyPatch) -> None:
    as_identity(monkeypatch, Identity("bob", Role.USER, coordinated_accounts=frozenset({"bio"})))
    document = json.loads(run("report", "idle", *WINDOW, "--format", "json")[1])
    assert sorted(r["account"] for r in document["by_account"]) == ["bio", "chem"]
    assert sorted(r["user"] for r in document["by_user"]) == ["bob", "carol"]


def test_finance_gets_aggregates_without_jobs_and_nobody_nothing(
    run: Run, monkeypatch: pytest.MonkeyPatch
) -> None:
    as_identity(monkeypatch, Identity("fin", Role.FINANCE))
    document = json.loads(run("report", "failures", *WINDOW, "--format", "json")[1])
    assert len(document["by_account"]) == 3 and document["top_attempts"] == []
    assert run("report", "nodes", *WINDOW)[0] == 1
    as_identity(monkeypatch, Identity("mallory", Role.NOBODY))
    for name in ("failures", "idle", "queue", "taxonomy", "nodes", "capacity", "retries"):
        code, out, err = run("report", name, *WINDOW, "--format", "json")
        assert (code, out) == (1, ""), name
        assert "mallory (nobody) may not" in err


def test_usage_errors(run: Run) -> None:
    code, _, err = run("report", "taxonomy", *WINDOW, "-A", "physics")
    assert code == 2 and "-A/-u do not apply" in err
    code, _, err = run("report", "capacity", *WINDOW, "--target-gpu-hours", "-5")
    assert code == 2
    code, _, err = run("report", "failures", "-S", "2026-11-02", "-E", "2026-11-01")
    assert code == 2 and "empty window" in err


def test_a_users_report_says_it_shows_their_own_share(run: Run, monkeypatch: pytest.MonkeyPatch) -> None:
    """A plain user's `report usage` is their share of each account, and its title says so; a
    coordinator's names the accounts it shows whole; an admin's shows everything and says
    nothing."""
    code, out, _ = run("report", "usage", *WINDOW)
    assert code == 0 and out.startswith("GPU usage by account, 2026-11-01 00:00")
    as_identity(monkeypatch, Identity("alice", Role.USER))
    code, out, _ = run("report", "usage", *WINDOW)
    assert code == 0 and out.startswith("GPU usage by account (your own jobs only), 2026-11-01")
    as_identity(monkeypatch, Identity("bob", Role.USER, frozenset({"bio", "chem"})))
    code, out, _ = run("report", "idle", *WINDOW)
    assert code == 0
    assert out.startswith("Idle GPU-hours by account (all jobs of bio, chem; elsewhere your own jobs only), ")
