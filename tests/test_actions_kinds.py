"""The other rule kinds on the admin day of tests/factories.py: job-end summaries (asked through
Slurm's MailProg, or for every job), node health for admins (XID, ECC, failing nodes, drift,
NCCL acceptance regressions), budgets for coordinators and finance, closed months' statements
for PIs and coordinators. Each is sent once."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, text

from slurmtel.actions.cycle import run_cycle
from slurmtel.actions.recipients import Recipients
from slurmtel.chargeback import close_month
from slurmtel.config import Config, config_from_dict
from slurmtel.store.actions import add_mail_request
from tests.factories import at, load_admin_day
from tests.mail_server import smtp_server
from tests.test_report_fabric import (
    D0,
    acceptance,  # noqa: F401 - a fixture
)

NOW = at("2026-11-02T06:00:00")
COORDINATORS = {"physics": frozenset({"pat"}), "chem": frozenset({"quinn"})}


def make_config(rules: list[dict[str, Any]], server: Any = None, **chargeback: Any) -> Config:
    actions: dict[str, Any] = {
        "rules": rules,
        "base_url": "https://slurmtel.example.org",
        "recipients": {
            "domain": "example.org",
            "admins": ["hpc@example.org"],
            "finance": ["finance@example.org"],
            "pis": {"bio": ["pi-bio@example.org"]},
        },
    }
    if server is not None:
        actions["email"] = {"smtp_host": server.host, "smtp_port": server.port}
    return config_from_dict({"actions": actions, "chargeback": {"close_day_of_month": 0, **chargeback}})


def cycle(engine: Engine, config: Config, now: Any = NOW, dry_run: bool = False) -> Any:
    return run_cycle(
        engine,
        config,
        now=now,
        dry_run=dry_run,
        clock=lambda: now,
        recipients=Recipients(config, coordinators=lambda: COORDINATORS),
        deliver=not dry_run,
    )


# ------------------------------------------------------------------ job end


def test_a_job_end_summary_goes_where_slurm_was_asked_to_mail(engine: Engine, tmp_path: Path) -> None:
    load_admin_day(engine, Config())
    with engine.begin() as conn:
        add_mail_request(
            conn, cluster="lab", job_id="101", job_id_raw=101, recipient="alice@lab.example.org",
            mail_type="Ended", mail_subject="Slurm Job_id=101 Name=prep Ended, Run time 02:00:00, COMPLETED, ExitCode 0",
            now=at("2026-11-01T02:00:05"),
        )  # fmt: skip
    rules = [{"name": "summary", "kind": "job_end"}]
    with smtp_server(tmp_path) as server:
        config = make_config(rules, server, rates=[{"partition": "gpu", "gpu_model": "*", "price_per_gpu_hour": "3.00",
                                                    "valid_from": "2026-01-01"}])  # fmt: skip
        report = cycle(engine, config)
        assert [(d.rule.name, d.step, d.job_id) for d in report.decisions] == [("summary", "summary", "101")]
        (mail,) = server.mailbox.wait_for(1)
        assert cycle(engine, config, NOW + timedelta(minutes=5)).decisions == []
    assert mail.rcpt_tos == ["alice@lab.example.org"]
    assert mail.message["Subject"] == "[slurmtel] Job 101 (prep) COMPLETED: 1 GPU for 2 h 00 min"
    body = mail.body()
    # the figures and advice of `slurmtel job 101`: 1 h busy, 1 h idle (half of it with no process)
    assert "GPUs        1, 2.00 GPU-hours, cost 6.00 EUR" in body
    assert "gpu01/0" in body and "   50 %" in body
    assert "Advice:" in body and "Job page: https://slurmtel.example.org/jobs/101" in body
    with engine.connect() as conn:
        handled = conn.execute(text("SELECT handled_at FROM action_mail_request")).scalar_one()
    assert handled == NOW


def test_a_summary_waits_for_the_record_then_goes_with_what_there_is(engine: Engine) -> None:
    with engine.begin() as conn:
        add_mail_request(
            conn, cluster="lab", job_id="999", job_id_raw=999, recipient="zed@example.org", mail_type="Failed",
            mail_subject="Slurm Job_id=999 Name=gone Failed, Run time 00:00:03, FAILED, ExitCode 1", now=NOW,
        )  # fmt: skip
    config = make_config([{"name": "summary", "kind": "job_end"}])
    report = cycle(engine, config, dry_run=True)
    assert report.decisions == []
    assert [s.reason for s in report.skipped] == ["waits for the job's accounting record and last telemetry"]
    later = cycle(engine, config, NOW + timedelta(seconds=config.actions.mailprog.wait_seconds), dry_run=True)
    (decision,) = later.decisions
    assert decision.recipients == [("zed@example.org", "owner")]
    assert "not complete when the wait ran out" in decision.reason
    assert "FAILED" in later.rendered[0].title


def test_every_gpu_job_gets_a_summary_without_mailprog(engine: Engine) -> None:
    load_admin_day(engine, Config())
    config = make_config(
        [{"name": "summary", "kind": "job_end", "only_when_asked": False, "max_jobs_per_run": 0}]
    )
    report = cycle(engine, config, at("2026-11-02T00:30:00"), dry_run=True)
    # the GPU jobs that ended in the last day, each once (103, requeued, about its last attempt)
    jobs = sorted(d.job_id for d in report.decisions)
    assert jobs == ["101", "102", "103", "104", "105", "106"]
    assert {d.recipients[0][0] for d in report.decisions if d.job_id == "102"} == {"bob@example.org"}


# ------------------------------------------------------------------ node health


def test_node_health_tells_the_admins_once(engine: Engine, tmp_path: Path) -> None:
    load_admin_day(engine, Config())
    rules = [{"name": "nodes", "kind": "node_health", "min_attempts": 2, "nccl": False}]
    with smtp_server(tmp_path) as server:
        config = make_config(rules, server)
        report = cycle(engine, config, at("2026-11-01T23:00:00"))
        found = sorted((d.node, d.step) for d in report.decisions)
        assert found == [
            ("gpu01", "xid:2026-11-01"),
            ("gpu02", "failed:2026-11-01"),
            ("gpu04", "ecc:2026-11-01"),
            ("gpu05", "drift:535.129.03/12.2"),
        ]
        server.mailbox.wait_for(4)
        # the next hour: nothing new to say
        assert cycle(engine, config, at("2026-11-02T00:00:00")).decisions == []
    assert {m.rcpt_tos[0] for m in server.mailbox.messages} == {"hpc@example.org"}
    subjects = sorted(m.message["Subject"] for m in server.mailbox.messages)
    assert "[slurmtel] Node gpu01 (lab): 3 GPU XID error(s)" in subjects
    xid = next(m for m in server.mailbox.messages if "XID" in m.message["Subject"])
    assert "code:count 79:2 48:1" in xid.body()


def test_nccl_acceptance_regressions_are_told(acceptance: Engine) -> None:  # noqa: F811
    config = make_config(
        [{"name": "nodes", "kind": "node_health", "xid": False, "ecc": False, "drift": False}]
    )
    report = cycle(acceptance, config, D0 + timedelta(hours=8), dry_run=True)
    reasons = sorted(d.reason for d in report.decisions)
    assert any("at 8 % of its baseline bandwidth" in r for r in reasons), reasons
    assert any("failed" in r for r in reasons), reasons
    slow = next(d for d in report.decisions if "baseline" in d.reason)
    assert slow.evidence["figures"]["busbw_ratio"] < 0.1


# ------------------------------------------------------------------ budgets


def test_budgets_passed_are_told_to_coordinators_and_finance_once_a_threshold(engine: Engine) -> None:
    load_admin_day(engine, Config())
    budgets = [{"account": "physics", "period": "month", "gpu_hours": "15"}]
    config = make_config([{"name": "budgets", "kind": "budget"}], budgets=budgets)
    report = cycle(engine, config)
    (decision,) = report.decisions
    # physics used 13 of 15 GPU-hours (alice 2, dave 10, erin 1)
    assert (decision.account, decision.step) == ("physics", "0.8")
    assert decision.recipients == [("finance@example.org", "finance"), ("pat@example.org", "coordinators")]
    assert decision.evidence["figures"]["budget_used_share"] == round(13 / 15, 4)
    assert cycle(engine, config, NOW + timedelta(hours=1)).decisions == []
    # a smaller budget: 1.0 passed, sent once; 0.8 is not sent after it
    smaller = make_config(
        [{"name": "budgets", "kind": "budget"}], budgets=[{**budgets[0], "gpu_hours": "12"}]
    )
    assert [d.step for d in cycle(engine, smaller, NOW + timedelta(hours=2)).decisions] == ["1"]
    assert cycle(engine, smaller, NOW + timedelta(hours=3)).decisions == []


# ------------------------------------------------------------------ closed months


def test_a_closed_months_statement_goes_to_each_accounts_pis_and_coordinators(
    engine: Engine, tmp_path: Path
) -> None:
    load_admin_day(engine, Config())
    rates = [{"partition": "*", "gpu_model": "*", "price_per_gpu_hour": "2.00", "valid_from": "2026-01-01"}]
    with smtp_server(tmp_path) as server:
        config = make_config([{"name": "statements", "kind": "month_closed"}], server, rates=rates)
        closed = close_month(engine, config, "2026-11", at("2026-12-02T00:00:00"), closed_by="finance")
        report = cycle(engine, config, at("2026-12-02T01:00:00"))
        assert sorted(d.account for d in report.decisions) == ["bio", "chem", "physics"]
        server.mailbox.wait_for(3)
        assert cycle(engine, config, at("2026-12-02T02:00:00")).decisions == []
    to = {m.rcpt_tos[0]: m for m in server.mailbox.messages}
    assert set(to) == {"pat@example.org", "quinn@example.org", "pi-bio@example.org"}
    physics = to["pat@example.org"]
    # alice 2 h and erin 1 h at 2.00; dave's 10 h NODE_FAIL waived (a system failure)
    assert physics.message["Subject"] == "[slurmtel] Statement 2026-11 for account physics: 6.00 EUR"
    assert closed.csv_sha256 in physics.body()
    assert "alice" in physics.body() and "bob" not in physics.body()
