"""Log lines: logfmt, one line per event, journald-aware, never a password or token."""

from __future__ import annotations

import io
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import Engine
from sqlalchemy.engine import make_url

from slurmtel import logs
from slurmtel.logs import StructuredFormatter, add_secret, format_value, log_event, redact, under_journald
from tests.test_daemon import ROOT, SACCT_LAB, DaemonProcess, fake_sacct, rows, wait_for

PASSWORD = "Pa55-w0rd-XYZ"


def record(message: str, level: int = logging.INFO, **extra: object) -> logging.LogRecord:
    rec = logging.LogRecord("slurmtel.test", level, __file__, 1, message, (), None)
    rec.created = 1796220000.25  # 2026-12-02T14:00:00.25Z
    for key, value in extra.items():
        setattr(rec, key, value)
    return rec


def test_an_event_is_one_logfmt_line() -> None:
    line = StructuredFormatter().format(
        record(
            "source_run",
            event="source_run",
            fields={"source": "sacct", "status": "ok", "rows": 22, "seconds": 0.41, "message": 'a "b"\nc'},
        )
    )
    assert line == (
        "ts=2026-12-02T14:00:00.250000Z level=info event=source_run source=sacct status=ok rows=22 "
        'seconds=0.41 message="a \\"b\\"\\nc"'
    )


def test_a_plain_message_names_its_logger() -> None:
    line = StructuredFormatter().format(record("could not record the end of the sacct run", logging.WARNING))
    assert line == (
        "ts=2026-12-02T14:00:00.250000Z level=warning logger=slurmtel.test "
        'msg="could not record the end of the sacct run"'
    )


def test_under_journald_there_is_no_timestamp_and_a_priority_prefix() -> None:
    formatter = StructuredFormatter(journal=True)
    assert formatter.format(record("x", logging.ERROR, event="e", fields={})) == "<3>level=error event=e"
    assert (
        formatter.format(record("x", logging.INFO, event="e", fields={"n": 1})) == "<6>level=info event=e n=1"
    )


def test_a_traceback_stays_on_the_line() -> None:
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        rec = record("failed", logging.ERROR)
        rec.exc_info = sys.exc_info()
    line = StructuredFormatter().format(rec)
    assert "\n" not in line
    assert 'exc="Traceback (most recent call last):\\n' in line and "RuntimeError: boom" in line


@pytest.mark.parametrize(
    ("value", "text"),
    [
        ("sacct", "sacct"),
        ("", '""'),
        (None, '""'),
        (True, "true"),
        (0.0, "0"),
        (1.23456, "1.235"),
        ("two words", '"two words"'),
        ("a=b", '"a=b"'),
        ("source:sacct,attribution", "source:sacct,attribution"),
    ],
)
def test_values(value: object, text: str) -> None:
    assert format_value(value) == text


@pytest.mark.parametrize(
    ("raw", "masked"),
    [
        (
            "postgresql+psycopg://slurmtel:s3cret@db.example.org:5432/slurmtel",
            "postgresql+psycopg://slurmtel:***@db.example.org:5432/slurmtel",
        ),
        ('url="postgresql://u:p%40ss@h/db" next', 'url="postgresql://u:***@h/db" next'),
        ("host=db user=slurmtel password=s3cret dbname=x", "host=db user=slurmtel password=*** dbname=x"),
        ("Authorization: Bearer abc.DEF-123", "Authorization: Bearer ***"),
        # no password: unchanged
        ("postgresql://slurmtel@db/slurmtel and http://gpu01:9400/metrics", None),
    ],
)
def test_redact(raw: str, masked: str | None) -> None:
    assert redact(raw) == (masked or raw)


def test_a_registered_secret_is_masked_anywhere(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(logs, "_secrets", set())
    add_secret("agent-token-0123")
    stream = io.StringIO()
    logger = logging.getLogger("slurmtel.test.secret")
    handler = logging.StreamHandler(stream)
    handler.setFormatter(StructuredFormatter())
    logger.addHandler(handler)
    monkeypatch.setattr(logger, "level", logging.INFO)
    try:
        log_event(logger, "pull", header="token agent-token-0123 sent")
        logger.warning("psycopg said: postgresql://a:%s@h/db failed", "hunter22")
    finally:
        logger.removeHandler(handler)
    out = stream.getvalue()
    assert "agent-token-0123" not in out and "hunter22" not in out
    assert 'header="token *** sent"' in out and "postgresql://a:***@h/db" in out


def test_journald_is_detected_by_the_stream_it_names(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "stream"
    with open(path, "w") as stream:
        st = os.fstat(stream.fileno())
        monkeypatch.setenv("JOURNAL_STREAM", f"{st.st_dev}:{st.st_ino}")
        assert under_journald(stream)
        monkeypatch.setenv("JOURNAL_STREAM", f"{st.st_dev}:{st.st_ino + 1}")
        assert not under_journald(stream)  # inherited from a parent, not our stderr
        monkeypatch.delenv("JOURNAL_STREAM")
        assert not under_journald(stream)


def test_the_daemon_never_logs_the_database_password_even_at_debug(
    tmp_path: Path, engine: Engine, database_url: str
) -> None:
    secret_url = make_url(database_url).set(password=PASSWORD).render_as_string(hide_password=False)
    sacct, _ = fake_sacct(tmp_path, SACCT_LAB)
    daemon = DaemonProcess(
        tmp_path,
        {"sources": {"sacct": {"command": sacct, "interval_seconds": 3600}}, "logging": {"level": "DEBUG"}},
        secret_url,
    )
    # stdout/stderr go to the log file: tell the daemon that file is the journal
    daemon.log_path.touch()
    st = os.stat(daemon.log_path)
    daemon.env["JOURNAL_STREAM"] = f"{st.st_dev}:{st.st_ino}"
    daemon.start()
    try:
        wait_for(lambda: rows(engine, "SELECT 1 FROM collect_run WHERE status = 'ok'"), "a sacct run")
        assert daemon.terminate()[0] == 0
    finally:
        daemon.kill()
    log = daemon.log()
    assert PASSWORD not in log
    assert ":***@" in log  # the started line names the database, masked
    lines = log.splitlines()
    assert lines and all(
        line.startswith(("<7>level=", "<6>level=", "<4>level=", "<3>level=")) for line in lines
    )
    assert not any("ts=" in line.split(" ", 1)[0] for line in lines)


def test_a_refused_start_does_not_print_the_password(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "SLURMTEL_CONFIG"}
    env["SLURMTEL_DATABASE_URL"] = f"postgresql://slurmtel:{PASSWORD}@127.0.0.1:1/slurmtel"
    config = tmp_path / "c.toml"
    config.write_text("[database]\nconnect_timeout_seconds = 2\n")
    for argv in (["run"], ["check-config"], ["check-config", "--database"]):
        done = subprocess.run(
            [sys.executable, "-m", "slurmtel", "--config", str(config), "--log-level", "DEBUG", *argv],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert PASSWORD not in done.stdout + done.stderr, argv
        assert "slurmtel:***@127.0.0.1:1/slurmtel" in done.stdout + done.stderr, argv
    assert done.returncode == 1 and "cannot connect to PostgreSQL" in done.stderr


def test_a_database_error_is_described_without_sql_parameters_or_row_values(engine: Engine) -> None:
    """SQLAlchemy's str() of a driver error appends the statement and its parameters, and
    PostgreSQL's DETAIL quotes the row: a flood of bad input would fill the logs and the
    recorded runs with it. described() keeps the class, SQLSTATE and the names concerned."""
    from sqlalchemy import text

    from slurmtel.errors import described

    seen = []
    with engine.connect() as conn:
        conn.execute(text("CREATE TEMP TABLE who (name text PRIMARY KEY, n int)"))
        conn.execute(text("INSERT INTO who VALUES ('alice-secret', 1)"))
        conn.commit()
        for sql, params in (
            ("SELECT CAST(:x AS text)", {"x": "bob-secret\x00"}),
            ("INSERT INTO who VALUES (:x, 1)", {"x": "alice-secret"}),
            ("INSERT INTO who VALUES ('carol', CAST(:x AS int))", {"x": "dave-secret"}),
        ):
            try:
                conn.execute(text(sql), params)
            except Exception as exc:
                seen.append(described(exc))
                conn.rollback()
    assert seen[0] == "DataError: PostgreSQL text fields cannot contain NUL (0x00) bytes"
    assert seen[1] == "UniqueViolation (SQLSTATE 23505, table who, constraint who_pkey)"
    assert seen[2].startswith("InvalidTextRepresentation (SQLSTATE 22P02")
    for line in seen:
        assert "secret" not in line and "\n" not in line
        assert not any(word in line for word in ("[SQL", "SELECT", "INSERT", "parameters"))
