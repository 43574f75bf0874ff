"""Nothing is sent twice and nothing is lost: real processes (`slurmtel act`, `slurmtel run`)
killed with SIGKILL in the middle of an SMTP conversation, and two of them at once.

The SMTP server (aiosmtpd) holds the first client either at RCPT (before DATA: nothing the
server would deliver has arrived) or after it stored the message and before its "250" (the
message is accepted: a real server has queued it), and the test kills the sender there.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, text

from tests.factories import T0, windows
from tests.mail_server import SmtpServer, smtp_server
from tests.test_actions_rules import after, load, running_job
from tests.test_daemon import ROOT, DaemonProcess, labelled, metric, toml_text, wait_for

OWNERS = ("alice", "bob", "carol")
GPUS = ("GPU-a1", "GPU-a2", "GPU-a3")


def three_idle_jobs(engine: Engine) -> None:
    for i, (owner, gpu) in enumerate(zip(OWNERS, GPUS, strict=True)):
        job_id = 7 + i
        load(
            engine,
            running_job(job_id, gpus=1, user=owner),
            windows(gpu, T0, 140, job=str(job_id)),
            [i + 1],
            after(70),
        )


def settings(server: SmtpServer) -> dict[str, Any]:
    return {
        "site": {"timezone": "UTC", "clock": after(70).isoformat()},
        "actions": {
            "enabled": True,
            "recipients": {"domain": "example.org", "coordinators": False},
            "email": {"smtp_host": server.host, "smtp_port": server.port, "timeout_seconds": 60},
        },
    }


def act(tmp_path: Path, server: SmtpServer, database_url: str) -> subprocess.Popen[bytes]:
    config = tmp_path / "act.toml"
    config.write_text(toml_text({"database": {"url": database_url}, **settings(server)}))
    return subprocess.Popen(
        [sys.executable, "-m", "slurmtel", "--config", str(config), "act"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def states(engine: Engine) -> list[tuple[str, str, int]]:
    with engine.connect() as conn:
        return [
            tuple(r)
            for r in conn.execute(text("SELECT target, state, tries FROM action_delivery ORDER BY id"))
        ]  # type: ignore[misc]


def delivered_to(server: SmtpServer) -> list[str]:
    return sorted(r for m in server.mailbox.messages for r in m.rcpt_tos)


@pytest.mark.timeout(300)
def test_killed_before_the_end_of_data_the_mail_is_sent_once_after_restart(
    engine: Engine, database_url: str, tmp_path: Path
) -> None:
    three_idle_jobs(engine)
    with smtp_server(tmp_path) as server:
        server.mailbox.hold_at = "rcpt"
        first = act(tmp_path, server, database_url)
        assert server.mailbox.reached.wait(60), first.communicate(timeout=5)
        assert [s for _, s, _ in states(engine)].count("sending") == 1
        first.kill()
        first.wait(timeout=30)
        server.mailbox.hold_at = ""
        server.mailbox.release.set()
        time.sleep(0.5)
        assert server.mailbox.messages == []  # the killed conversation delivered nothing
        again = act(tmp_path, server, database_url)
        _out, err = again.communicate(timeout=120)
        assert again.returncode == 0, err.decode()
        server.mailbox.wait_for(3)
        time.sleep(0.5)
    assert delivered_to(server) == ["alice@example.org", "bob@example.org", "carol@example.org"]
    assert sorted(s for _, s, _ in states(engine)) == ["sent", "sent", "sent"]
    # the killed one was tried twice; its Message-ID the same both times (one message arrived)
    assert sorted(t for _, _, t in states(engine)) == [1, 1, 2]


@pytest.mark.timeout(300)
def test_killed_waiting_for_the_answer_the_mail_is_never_sent_again(
    engine: Engine, database_url: str, tmp_path: Path
) -> None:
    three_idle_jobs(engine)
    with smtp_server(tmp_path) as server:
        server.mailbox.hold_at = "data"
        first = act(tmp_path, server, database_url)
        assert server.mailbox.reached.wait(60), first.communicate(timeout=5)
        # the message was accepted (stored) before the answer; the sender is killed waiting for it
        assert len(server.mailbox.messages) == 1
        assert [s for _, s, _ in states(engine)].count("committing") == 1
        first.kill()
        first.wait(timeout=30)
        server.mailbox.hold_at = ""
        server.mailbox.release.set()
        again = act(tmp_path, server, database_url)
        _out, err = again.communicate(timeout=120)
        assert again.returncode == 0, err.decode()
        server.mailbox.wait_for(3)
        time.sleep(0.5)
    # each owner once: the uncertain one is not sent again, and nothing is lost
    assert delivered_to(server) == ["alice@example.org", "bob@example.org", "carol@example.org"]
    assert sorted(s for _, s, _ in states(engine)) == ["sent", "sent", "uncertain"]
    with engine.connect() as conn:
        statuses = sorted(r[0] for r in conn.execute(text("SELECT status FROM action_log")))
    assert statuses == ["sent", "sent", "uncertain"]


@pytest.mark.timeout(300)
def test_two_processes_at_once_send_each_mail_once(engine: Engine, database_url: str, tmp_path: Path) -> None:
    three_idle_jobs(engine)
    with smtp_server(tmp_path) as server:
        server.mailbox.hold_at = "rcpt"
        first = act(tmp_path, server, database_url)
        assert server.mailbox.reached.wait(60)
        second = act(tmp_path, server, database_url)
        _out, err = second.communicate(timeout=120)
        assert second.returncode == 1
        assert b"the actions lease is held by" in err and b"nothing done" in err
        server.mailbox.hold_at = ""
        server.mailbox.release.set()
        _out, err = first.communicate(timeout=120)
        assert first.returncode == 0, err.decode()
        server.mailbox.wait_for(3)
    assert delivered_to(server) == ["alice@example.org", "bob@example.org", "carol@example.org"]


@pytest.mark.timeout(300)
def test_two_daemons_started_by_mistake_send_each_mail_once(
    engine: Engine, database_url: str, tmp_path: Path
) -> None:
    three_idle_jobs(engine)
    with smtp_server(tmp_path) as server:
        common = {
            **settings(server),
            "sources": {"slurmctld": {"enabled": False}, "sacct": {"enabled": False}},
        }
        daemons = [DaemonProcess(tmp_path, common, database_url, name=f"daemon{i}").start() for i in range(2)]
        try:
            server.mailbox.wait_for(3, timeout=90)
            samples = [wait_for(lambda d=d: _acted(d), "an actions run") for d in daemons]
            time.sleep(1.0)
        finally:
            for d in daemons:
                d.kill()
    assert delivered_to(server) == ["alice@example.org", "bob@example.org", "carol@example.org"]
    sent = sum(
        metric(s, "slurmtel_action_deliveries_total", channel="email", result="sent") or 0 for s in samples
    )
    assert sent == 3
    runs = {labels: v for s in samples for labels, v in labelled(s, "slurmtel_action_runs_total").items()}
    assert (("status", "ok"),) in runs
    # the gauges of the alerting rules: three idle GPUs on gpu01, one per job
    ok = [s for s in samples if metric(s, "slurmtel_action_runs_total", status="ok")]
    assert metric(ok[0], "slurmtel_node_gpus_idle", node="gpu01") == 3
    assert metric(ok[0], "slurmtel_job_gpus_idle", cluster="lab", job_id="7", partition="gpu") == 1
    assert metric(ok[0], "slurmtel_job_idle_seconds", cluster="lab", job_id="7", partition="gpu") == 4200


def _acted(daemon: DaemonProcess) -> Any:
    samples = daemon.wait_serving()
    runs = labelled(samples, "slurmtel_action_runs_total")
    return samples if runs else None
