"""`slurmtel act` (--dry-run, log, exclude, include), `slurmtel mailprog` and the warnings of
`slurmtel me`, through the CLI on the real database."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, text

from slurmtel.access import Identity, Role
from slurmtel.actions.cycle import run_cycle
from slurmtel.actions.mailprog import parse_mail
from slurmtel.cli import main
from slurmtel.config import config_from_dict
from tests.factories import T0, windows
from tests.test_actions_rules import after, load, no_coordinators, running_job

ADMIN = Identity("root", Role.ADMIN)
ALICE = Identity("alice", Role.USER)
BOB = Identity("bob", Role.USER)
FINANCE = Identity("fin", Role.FINANCE)

Cli = Callable[..., tuple[int, str, str]]


def config_text(database_url: str, now: Any, extra: str = "", enabled: bool = False) -> str:
    return f"""
[database]
url = "{database_url}"
[site]
timezone = "UTC"
clock = "{now.isoformat()}"
[actions]
enabled = {str(enabled).lower()}
[actions.recipients]
domain = "example.org"
coordinators = false
{extra}
"""


@pytest.fixture
def cli(
    tmp_path: Path, database_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> Cli:
    def run(
        identity: Identity, *argv: str, now: Any = None, extra: str = "", enabled: bool = False
    ) -> tuple[int, str, str]:
        config_file = tmp_path / "slurmtel.toml"
        config_file.write_text(config_text(database_url, now or after(70), extra, enabled))
        monkeypatch.setattr("slurmtel.commands.common.current_identity", lambda config: identity)
        code = main(["--config", str(config_file), "--log-level", "WARNING", *argv])
        out, err = capsys.readouterr()
        return code, out, err

    return run


def two_idle_jobs(engine: Engine) -> None:
    load(engine, running_job(7, gpus=1), windows("GPU-a1", T0, 140, job="7"), [1], after(70))
    load(
        engine,
        running_job(8, gpus=1, user="bob", account="chem"),
        windows("GPU-a2", T0, 140, job="8"),
        [2],
        after(70),
    )


def test_dry_run_prints_the_evidence_and_does_nothing(engine: Engine, cli: Cli) -> None:
    two_idle_jobs(engine)
    code, out, err = cli(ADMIN, "act", "--dry-run")
    assert code == 0, err
    assert "dry run: nothing recorded or sent" in out
    assert "idle-gpus / warning: job 7 (alice)" in out
    assert "would send: alice@example.org (owner)" in out
    assert "subject: Job 7 (train): 1 of 1 GPUs idle for 1 h 10 min" in out
    assert "why: 1 of 1 GPUs of job 7 idle for 70 min (>= 60 min, warning; gpus = any)" in out
    assert "* gpu01/1: idle 70 min" in out and "memory max 1.0 GiB" in out
    assert "idle-gpus / warning: job 8 (bob)" in out
    code, out, _ = cli(ADMIN, "act", "--dry-run", "--format", "json")
    document = json.loads(out)
    assert {d["job_id"] for d in document["decisions"]} == {"7", "8"}
    assert all(d["text"] and d["html"] and d["title"] for d in document["decisions"])
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM action_log")).scalar_one() == 0
    # a plain user may not run the rules
    code, _, err = cli(ALICE, "act", "--dry-run")
    assert code == 1 and "may not manage actions" in err


def test_act_log_is_scoped_like_everything_else(engine: Engine, cli: Cli) -> None:
    two_idle_jobs(engine)
    config = config_from_dict({"actions": {"recipients": {"domain": "example.org"}}})
    run_cycle(engine, config, now=after(70), recipients=no_coordinators(config), deliver=False)
    code, out, err = cli(ALICE, "act", "log", "--format", "json")
    assert code == 0, err
    rows = json.loads(out)
    assert [(r["job_id"], r["user"], r["step"], r["status"]) for r in rows] == [
        ("7", "alice", "warning", "pending")
    ]
    assert rows[0]["deliveries"][0]["target"] == "alice@example.org"
    assert rows[0]["evidence"]["figures"]["matched_gpus"] == 1
    code, out, _ = cli(ADMIN, "act", "log", "--format", "json")
    assert sorted(r["user"] for r in json.loads(out)) == ["alice", "bob"]
    code, out, _ = cli(ADMIN, "act", "log", "-u", "bob")
    assert "bob" in out and "alice@example.org" not in out
    code, _, err = cli(FINANCE, "act", "log")
    assert code == 1 and "may not view actions" in err
    # what `me` shows alice: her warning, not bob's
    code, out, err = cli(ALICE, "me", "--month", "2026-11", "--format", "json")
    assert code == 0, err
    actions = json.loads(out)["actions"]
    assert [(a["job_id"], a["rule"], a["step"]) for a in actions] == [("7", "idle-gpus", "warning")]
    assert actions[0]["title"].startswith("Job 7 (train)")
    code, out, _ = cli(ALICE, "me", "--month", "2026-11")
    assert "Warnings and actions about your jobs" in out and "idle-gpus" in out


def test_an_admin_puts_a_user_on_the_exclusion_list_for_a_while(engine: Engine, cli: Cli) -> None:
    two_idle_jobs(engine)
    code, out, err = cli(ADMIN, "act", "exclude", "alice", "--for", "7d", "--reason", "thesis deadline")
    assert code == 0, err
    assert "alice is excluded from every action rule until 2026-11-08 11:10 UTC" in out
    code, out, _ = cli(ADMIN, "act", "--dry-run")
    assert "job 7" not in out.split("Not acted on:")[0]
    assert "alice is on the exclusion list until 2026-11-08 11:10 UTC (thesis deadline)" in out
    # recorded: who and why
    with engine.connect() as conn:
        row = conn.execute(
            text("SELECT user_name, reason, created_by, ends_at, revoked_at FROM action_exclusion")
        ).one()
    assert (row.user_name, row.reason, row.created_by, row.revoked_at) == (
        "alice",
        "thesis deadline",
        "root",
        None,
    )
    code, out, _ = cli(ADMIN, "act", "exclude", "--list")
    assert "thesis deadline" in out
    # only admins, always with an end and a reason
    assert cli(ALICE, "act", "exclude", "bob", "--for", "1d", "--reason", "x")[0] == 1
    assert cli(ADMIN, "act", "exclude", "bob", "--reason", "x")[0] == 2
    assert cli(ADMIN, "act", "exclude", "bob", "--for", "1d")[0] == 2
    assert cli(ADMIN, "act", "exclude", "bob", "--for", "forever", "--reason", "x")[0] == 2
    code, out, _ = cli(ADMIN, "act", "include", "alice")
    assert code == 0 and "alice is no longer excluded" in out
    with engine.connect() as conn:
        assert conn.execute(text("SELECT revoked_by FROM action_exclusion")).scalar_one() == "root"
    code, out, _ = cli(ADMIN, "act", "--dry-run")
    assert "idle-gpus / warning: job 7 (alice)" in out


def test_act_records_and_sends_once(engine: Engine, cli: Cli, tmp_path: Path) -> None:
    from tests.mail_server import smtp_server

    two_idle_jobs(engine)
    with smtp_server(tmp_path) as server:
        extra = f'[actions.email]\nsmtp_host = "{server.host}"\nsmtp_port = {server.port}\n'
        code, out, err = cli(ADMIN, "act", extra=extra)
        assert code == 0, err
        assert "2 recorded" in out and out.count(": sent (250 2.0.0 queued)") == 2
        code, out, err = cli(ADMIN, "act", extra=extra, now=after(75))
        assert "0 recorded" in out and "sent" not in out
        assert sorted(m.rcpt_tos[0] for m in server.mailbox.wait_for(2)) == [
            "alice@example.org",
            "bob@example.org",
        ]


# ------------------------------------------------------------------ MailProg


def test_slurms_mail_subjects_and_environment_are_read() -> None:
    ended = parse_mail(
        "Slurm Job_id=4242 Name=my job, v2 Ended, Run time 00:10:02, COMPLETED, ExitCode 0", {}, "lab"
    )
    assert ended is not None and (ended.job_id, ended.job_id_raw, ended.mail_type, ended.cluster) == (
        "4242", 4242, "Ended", "lab",
    )  # fmt: skip
    task = parse_mail(
        "Slurm Array Task Job_id=100_3 (103) Name=sweep Failed, Run time 00:00:05, FAILED, ExitCode 1",
        {},
        "lab",
    )
    assert task is not None and (task.job_id, task.job_id_raw, task.mail_type, task.array_summary) == (
        "100_3", 103, "Failed", False,
    )  # fmt: skip
    summary = parse_mail(
        "Slurm Array Summary Job_id=100_* (100) Name=sweep Ended, Mixed, MaxSignal [0]", {}, "lab"
    )
    assert summary is not None and summary.array_summary
    began = parse_mail("Slurm Job_id=7 Name=x Began, Queued time 00:00:01", {}, "lab")
    assert began is not None and began.mail_type == "Began"
    env = {"SLURM_JOB_ID": "77", "SLURM_JOB_MAIL_TYPE": "Ended", "SLURM_CLUSTER_NAME": "other"}
    by_env = parse_mail("anything", env, "lab")
    assert by_env is not None and (by_env.job_id, by_env.mail_type, by_env.cluster) == (
        "77",
        "Ended",
        "other",
    )
    assert parse_mail("hello", {}, "lab") is None


def fallback_script(tmp_path: Path) -> tuple[Path, Path]:
    """A mail program that writes how it was called (its arguments and its standard input)."""
    called = tmp_path / "called.json"
    script = tmp_path / "mail"
    script.write_text(
        "#!/usr/bin/env python3\nimport json, sys\n"
        f"json.dump({{'argv': sys.argv[1:], 'stdin': sys.stdin.read()}}, open({str(called)!r}, 'w'))\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script, called


def test_mailprog_records_job_end_mails_and_passes_the_others_on(
    engine: Engine, cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script, called = fallback_script(tmp_path)
    extra = f'[actions.mailprog]\nfallback_command = "{script}"\n'
    monkeypatch.setenv("SLURM_CLUSTER_NAME", "lab")
    subject = "Slurm Job_id=7 Name=train Ended, Run time 01:10:02, COMPLETED, ExitCode 0"

    def mailprog(subject: str, enabled: bool = True) -> tuple[int, str, str]:
        return cli(ADMIN, "mailprog", "-s", subject, "alice@lab.example.org", extra=extra, enabled=enabled)

    # actions off: every mail goes to the mail program, as it did before slurmtel
    code, _, err = mailprog(subject, enabled=False)
    assert code == 0, err
    assert json.loads(called.read_text())["argv"] == ["-s", subject, "alice@lab.example.org"]
    called.unlink()
    # on: a job-end mail becomes a request for the job's summary
    code, _, err = mailprog(subject)
    assert code == 0, err
    assert not called.exists()
    with engine.connect() as conn:
        row = conn.execute(
            text("SELECT cluster, job_id, job_id_raw, recipient, mail_type FROM action_mail_request")
        ).one()
    assert tuple(row) == ("lab", "7", 7, "alice@lab.example.org", "Ended")
    # the same mail again is the same request
    mailprog(subject)
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM action_mail_request")).scalar_one() == 1
    # a job-began mail is passed on
    began = "Slurm Job_id=7 Name=train Began, Queued time 00:00:03"
    assert mailprog(began)[0] == 0
    assert json.loads(called.read_text())["argv"] == ["-s", began, "alice@lab.example.org"]


def test_mailprog_passes_a_job_end_mail_on_when_it_cannot_record_it(
    cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script, called = fallback_script(tmp_path)
    monkeypatch.setenv("SLURM_CLUSTER_NAME", "lab")
    config_file = tmp_path / "down.toml"
    config_file.write_text(
        config_text("postgresql://nobody@127.0.0.1:1/none", after(70), enabled=True).replace(
            "[actions.recipients]", f'[actions.mailprog]\nfallback_command = "{script}"\n[actions.recipients]'
        )
    )
    subject = "Slurm Job_id=7 Name=train Ended, Run time 01:10:02, COMPLETED, ExitCode 0"
    code = main(["--config", str(config_file), "mailprog", "-s", subject, "alice@lab.example.org"])
    assert code == 0
    assert json.loads(called.read_text())["argv"] == ["-s", subject, "alice@lab.example.org"]


def test_the_mailprog_wrapper_is_executable_sh_that_runs_slurmtel_mailprog() -> None:
    import subprocess

    wrapper = Path(__file__).resolve().parents[1] / "systemd" / "slurmtel-mailprog.sh"
    assert os.access(wrapper, os.X_OK)
    subprocess.run(["sh", "-n", str(wrapper)], check=True)
    assert 'mailprog "$@"' in wrapper.read_text()
