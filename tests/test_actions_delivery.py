"""Delivery through real parts: a real SMTP server (aiosmtpd: plain, STARTTLS, TLS, AUTH) reads
every message; a real HTTP server takes the webhooks. Retries, backoff, permanent failures and
their metrics; hostile job names in the text, the HTML and the headers.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from sqlalchemy import Engine, text

from slurmtel.actions.cycle import run_cycle
from slurmtel.actions.metrics import ActionMetrics
from slurmtel.config import Config, config_from_dict
from tests.factories import T0, windows
from tests.mail_server import smtp_server, webhook_server
from tests.test_actions_rules import after, load, no_coordinators, running_job


def config_for(server: Any, **extra: Any) -> Config:
    actions: dict[str, Any] = {
        "recipients": {"domain": "example.org", "admins": ["hpc@example.org"]},
        "email": {
            "smtp_host": server.host,
            "smtp_port": server.port,
            "sender": "slurmtel@example.org",
            "reply_to": "help@example.org",
            **extra.pop("email", {}),
        },
        "base_url": "https://slurmtel.example.org",
    }
    actions.update(extra)
    return config_from_dict({"actions": actions, "chargeback": {"rates": [
        {"partition": "*", "gpu_model": "*", "price_per_gpu_hour": "2.00", "valid_from": "2026-01-01"}]}})  # fmt: skip


def idle_job(engine: Engine, name: str = "train", minutes: int = 70) -> None:
    load(
        engine,
        running_job(gpus=1, name=name),
        windows("GPU-a1", T0, minutes * 2, job="7"),
        [1],
        after(minutes),
    )


def cycle(engine: Engine, config: Config, now: datetime, metrics: ActionMetrics | None = None) -> Any:
    return run_cycle(
        engine, config, now=now, clock=lambda: now, recipients=no_coordinators(config), metrics=metrics
    )


def deliveries(engine: Engine) -> list[dict[str, Any]]:
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT * FROM action_delivery ORDER BY id")).mappings()
        return [dict(r) for r in rows]


def counter(metrics: ActionMetrics, channel: str, result: str) -> float:
    return metrics.deliveries.labels(channel=channel, result=result)._value.get()


def test_an_idle_job_owner_gets_one_mail_with_the_figures_and_the_link(
    engine: Engine, tmp_path: Path
) -> None:
    with smtp_server(tmp_path) as server:
        config = config_for(server)
        idle_job(engine)
        report = cycle(engine, config, after(70))
        assert [(o.channel, o.state) for o in report.deliveries] == [("email", "sent")]
        (mail,) = server.mailbox.wait_for(1)
        # nothing twice: the next evaluations send nothing
        cycle(engine, config, after(71))
        cycle(engine, config, after(72))
    assert len(server.mailbox.messages) == 1
    assert mail.rcpt_tos == ["alice@example.org"]
    message = mail.message
    assert message["Subject"] == "[slurmtel] Job 7 (train): 1 of 1 GPUs idle for 1 h 10 min"
    assert message["From"] == "slurmtel@example.org" and message["Reply-To"] == "help@example.org"
    assert message["Auto-Submitted"] == "auto-generated"
    assert message["Message-ID"].startswith("<slurmtel-action-delivery-1@")
    body = mail.body()
    assert "gpu01/1  idle for 1 h 10 min" in body
    assert "Job page: https://slurmtel.example.org/jobs/7" in body
    # 1 GPU x 70 min 10 s at 2.00 an hour
    assert "its GPUs so far cost 2.34 EUR" in body
    html = mail.body("html")
    assert '<a href="https://slurmtel.example.org/jobs/7">' in html
    (row,) = deliveries(engine)
    assert (row["state"], row["tries"], row["recipient_role"]) == ("sent", 1, "owner")
    assert row["result"] == "250 2.0.0 queued"
    with engine.connect() as conn:
        status = conn.execute(text("SELECT status, title, decided_by FROM action_log")).one()
    assert status.status == "sent" and status.title.startswith("Job 7 (train)")


def test_without_a_base_url_there_is_no_link(engine: Engine, tmp_path: Path) -> None:
    with smtp_server(tmp_path) as server:
        config = config_for(server, base_url="")
        idle_job(engine)
        cycle(engine, config, after(70))
        (mail,) = server.mailbox.wait_for(1)
    assert "Job page" not in mail.body() and "href" not in mail.body("html")
    assert "slurmtel job 7" in mail.body()


def test_starttls_with_auth_and_a_wrong_password(engine: Engine, tmp_path: Path) -> None:
    password = tmp_path / "smtp-password"
    password.write_text("s3cret\n")
    with smtp_server(tmp_path, security="starttls", user="slurmtel", password="s3cret") as server:
        email = {"security": "starttls", "ca_file": str(server.ca_file), "username": "slurmtel",
                 "password_file": str(password)}  # fmt: skip
        config = config_for(server, email=email)
        idle_job(engine)
        metrics = ActionMetrics(CollectorRegistry())
        report = cycle(engine, config, after(70), metrics)
        assert [o.state for o in report.deliveries] == ["sent"], report.deliveries
        server.mailbox.wait_for(1)
        assert counter(metrics, "email", "sent") == 1
    # a wrong password: refused for good (no retry can fix it)
    password.write_text("wrong")
    with engine.begin() as conn:
        conn.execute(text("TRUNCATE action_log CASCADE"))
    with smtp_server(tmp_path, security="starttls", user="slurmtel", password="s3cret") as server:
        email["ca_file"] = str(server.ca_file)
        config = config_for(server, email=email)
        report = cycle(engine, config, after(71), metrics)
        assert [o.state for o in report.deliveries] == ["failed"], report.deliveries
        assert "SMTP AUTH refused: 535" in report.deliveries[0].detail
        assert server.mailbox.messages == []
    assert counter(metrics, "email", "failed") == 1


def test_starttls_is_required_by_the_server(engine: Engine, tmp_path: Path) -> None:
    """A client configured without TLS is refused by a server that requires STARTTLS: not sent."""
    with smtp_server(tmp_path, security="starttls") as server:
        config = config_for(server)
        idle_job(engine)
        report = cycle(engine, config, after(70))
        assert [o.state for o in report.deliveries] == ["failed"]
        assert "530" in report.deliveries[0].detail
        assert server.mailbox.messages == []


def test_tls_from_the_start(engine: Engine, tmp_path: Path) -> None:
    with smtp_server(tmp_path, security="tls") as server:
        config = config_for(server, email={"security": "tls", "ca_file": str(server.ca_file)})
        idle_job(engine)
        report = cycle(engine, config, after(70))
        assert [o.state for o in report.deliveries] == ["sent"], report.deliveries
        server.mailbox.wait_for(1)


def test_a_failed_delivery_is_retried_with_backoff_and_counted(engine: Engine, tmp_path: Path) -> None:
    with smtp_server(tmp_path) as server:
        config = config_for(server, retry_backoff_seconds=60, retry_backoff_max_seconds=100)
        server.mailbox.rcpt_answers = ["451 4.3.0 try later", "451 4.3.0 try later"]
        idle_job(engine)
        metrics = ActionMetrics(CollectorRegistry())
        t = after(70)
        assert [o.state for o in cycle(engine, config, t, metrics).deliveries] == ["retry"]
        (row,) = deliveries(engine)
        assert row["state"] == "pending" and row["next_try_at"] == t + timedelta(seconds=60)
        assert "451 4.3.0 try later" in row["last_error"]
        # not due before its time
        assert cycle(engine, config, t + timedelta(seconds=59), metrics).deliveries == []
        assert [o.state for o in cycle(engine, config, t + timedelta(seconds=60), metrics).deliveries] == [
            "retry"
        ]
        # the second wait is 120 s, at most retry_backoff_max_seconds (100)
        assert deliveries(engine)[0]["next_try_at"] == t + timedelta(seconds=160)
        assert [o.state for o in cycle(engine, config, t + timedelta(seconds=160), metrics).deliveries] == [
            "sent"
        ]
        (mail,) = server.mailbox.wait_for(1)
    assert counter(metrics, "email", "retry") == 2 and counter(metrics, "email", "sent") == 1
    row = deliveries(engine)[0]
    assert (row["state"], row["tries"]) == ("sent", 3)
    # the same Message-ID on every try
    assert mail.message["Message-ID"] == row["message_id"]


def test_a_refused_recipient_fails_at_once_and_retries_give_up(engine: Engine, tmp_path: Path) -> None:
    with smtp_server(tmp_path) as server:
        config = config_for(server, retry_max_attempts=2)
        server.mailbox.rcpt_answers = ["550 5.1.1 no such user"]
        idle_job(engine)
        assert [o.state for o in cycle(engine, config, after(70)).deliveries] == ["failed"]
        with engine.connect() as conn:
            assert conn.execute(text("SELECT status FROM action_log")).scalar_one() == "failed"
    with smtp_server(tmp_path) as server:
        config = config_for(server, retry_max_attempts=2)
        with engine.begin() as conn:
            conn.execute(text("TRUNCATE action_log CASCADE"))
        server.mailbox.rcpt_answers = ["421 4.7.0 busy", "421 4.7.0 busy"]
        assert [o.state for o in cycle(engine, config, after(71)).deliveries] == ["retry"]
        assert [o.state for o in cycle(engine, config, after(73)).deliveries] == ["failed"]
        assert server.mailbox.messages == []


def test_an_unreachable_server_is_retried_and_tried_once_a_round(engine: Engine, tmp_path: Path) -> None:
    from tests.mail_server import free_port

    port = free_port()
    config = config_from_dict(
        {
            "actions": {
                "recipients": {"domain": "example.org"},
                "email": {"smtp_host": "127.0.0.1", "smtp_port": port},
            }
        }
    )
    load(engine, running_job(7, gpus=1), windows("GPU-a1", T0, 140, job="7"), [1], after(70))
    load(engine, running_job(8, gpus=1, user="bob"), windows("GPU-a2", T0, 140, job="8"), [2], after(70))
    report = cycle(engine, config, after(70))
    # the first finds the server down; the second waits for the next round untried
    assert [o.state for o in report.deliveries] == ["retry"]
    assert "cannot reach 127.0.0.1" in report.deliveries[0].detail
    assert sorted((r["state"], r["tries"]) for r in deliveries(engine)) == [("pending", 0), ("pending", 1)]
    with smtp_server(tmp_path) as server:
        config = config_from_dict(
            {
                "actions": {
                    "recipients": {"domain": "example.org"},
                    "email": {"smtp_host": server.host, "smtp_port": server.port},
                }
            }
        )
        report = cycle(engine, config, after(72))
        assert sorted(o.state for o in report.deliveries) == ["sent", "sent"]
        server.mailbox.wait_for(2)


def test_hostile_job_names_in_text_html_and_headers(engine: Engine, tmp_path: Path) -> None:
    hostile = "x\r\nBcc: evil@example.net\r\n\x1b[2J<script>alert(1)</script>&"
    with smtp_server(tmp_path) as server:
        config = config_for(server)
        idle_job(engine, name=hostile)
        report = cycle(engine, config, after(70))
        assert [o.state for o in report.deliveries] == ["sent"]
        (mail,) = server.mailbox.wait_for(1)
    # one recipient, the owner; no header came from the name
    assert mail.rcpt_tos == ["alice@example.org"]
    message = mail.message
    assert message["Bcc"] is None
    subject = message["Subject"]
    assert "\n" not in subject and "\r" not in subject and "\x1b" not in subject
    assert subject.startswith("[slurmtel] Job 7 (x\\x0d\\x0aBcc: evil@example.net\\x0d\\x0a\\x1b[2J<script>")
    text_body = mail.body()
    assert "x\\x0d\\x0aBcc: evil@example.net\\x0d\\x0a\\x1b[2J<script>alert(1)</script>&" in text_body
    assert "\x1b" not in text_body
    html = mail.body("html")
    assert "<script>" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;&amp;" in html


def test_webhooks_json_and_chat_payloads_retries_and_failures(engine: Engine, tmp_path: Path) -> None:
    with webhook_server() as hook, smtp_server(tmp_path) as server:
        token = tmp_path / "token"
        token.write_text("hook-token\n")
        hooks = [
            {"name": "records", "url": hook.url, "format": "json", "token_file": str(token)},
            {"name": "chat", "url": hook.url + "?channel=hpc", "format": "slack"},
            {"name": "teams", "url": hook.url, "format": "teams"},
        ]
        rules = [
            {
                "name": "idle",
                "kind": "gpus_idle",
                "warn_minutes": 60,
                "webhooks": ["records", "chat", "teams"],
            }
        ]
        config = config_for(server, webhooks=hooks, rules=rules)
        hook.statuses = [503]
        idle_job(engine)
        report = cycle(engine, config, after(70))
        states = {(o.channel, o.target): o.state for o in report.deliveries}
        assert states == {
            ("email", "alice@example.org"): "sent",
            ("webhook", "records"): "retry",
            ("webhook", "chat"): "sent",
            ("webhook", "teams"): "sent",
        }
        report = cycle(engine, config, after(72))
        assert [(o.target, o.state) for o in report.deliveries] == [("records", "sent")]
    first, chat, teams, again = hook.requests
    assert first["status"] == 503 and again["status"] == 200
    assert first["headers"]["Authorization"] == "Bearer hook-token"
    # the same key on every try of a delivery: a receiver can tell a retry
    assert first["headers"]["Idempotency-Key"] == again["headers"]["Idempotency-Key"]
    record = again["body"]
    assert (record["rule"], record["step"], record["job_id"], record["user"]) == (
        "idle",
        "warning",
        "7",
        "alice",
    )
    assert record["evidence"]["figures"]["matched_gpus"] == 1
    assert record["title"].startswith("Job 7 (train)")
    assert chat["path"].endswith("?channel=hpc")
    assert chat["body"]["text"].startswith("*Job 7 (train)")
    assert teams["body"]["@type"] == "MessageCard" and teams["body"]["title"].startswith("Job 7")


def test_a_webhook_that_refuses_is_not_retried(engine: Engine, tmp_path: Path) -> None:
    with webhook_server() as hook:
        hooks = [{"name": "records", "url": hook.url}]
        rules = [{"name": "idle", "kind": "gpus_idle", "warn_minutes": 60, "to": [], "webhooks": ["records"]}]
        config = config_from_dict({"actions": {"webhooks": hooks, "rules": rules}})
        hook.statuses = [400]
        idle_job(engine)
        report = cycle(engine, config, after(70))
        # the owner has no address (no recipients.domain): the record says so
        assert [(o.channel, o.state) for o in report.deliveries] == [("webhook", "failed")]
        with engine.connect() as conn:
            reason = conn.execute(text("SELECT reason FROM action_log")).scalar_one()
        assert "the owner alice has no address" in reason


@pytest.mark.parametrize("security", ["none", "starttls"])
def test_the_message_bytes_are_those_recorded(engine: Engine, tmp_path: Path, security: str) -> None:
    """What was sent is what `act log` shows: the body is rendered once, when decided."""
    with smtp_server(tmp_path, security=security) as server:
        email = {"security": security, "ca_file": str(server.ca_file or "")}
        config = config_for(server, email=email)
        idle_job(engine)
        cycle(engine, config, after(70))
        (mail,) = server.mailbox.wait_for(1)
    with engine.connect() as conn:
        stored = conn.execute(text("SELECT body_text, body_html FROM action_log")).one()

    def lines(value: str) -> str:
        return value.replace("\r\n", "\n").strip()

    assert lines(mail.body()) == lines(stored.body_text)
    assert lines(mail.body("html")) == lines(stored.body_html)
