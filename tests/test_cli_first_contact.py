"""First contact: what a new admin or a login node meets before any report.

- a database URL that is not PostgreSQL's is refused by check-config and by every command in
  one line (exit 2), wherever the URL came from (database.url, $SLURMTEL_DATABASE_URL,
  database.url_file);
- an error about a missing database or schema names the database and why it is that one;
- on a login node (a config with only [api] url) every command either asks the API or refuses
  at once, saying it runs on the head node, and none starts an embedded PostgreSQL;
- `serve` on a busy port exits 1 with one line.
"""

from __future__ import annotations

import argparse
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from slurmtel.access import Identity, Role
from slurmtel.cli import build_parser, main
from slurmtel.config import config_from_dict
from slurmtel.errors import ConfigError

ADMIN = Identity("root", Role.ADMIN)
USAGE, ENV = 2, 1


def leaf_commands(
    parser: argparse.ArgumentParser | None = None, words: tuple[str, ...] = ()
) -> Iterator[tuple[str, ...]]:
    """The words of every command the CLI has (`report usage`, `db upgrade`, `runs`, ...)."""
    parser = parser or build_parser()
    subparsers = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subparsers:
        yield words
        return
    for action in subparsers:
        for name, sub in action.choices.items():
            yield from leaf_commands(sub, (*words, name))


# what a command needs beside its words for argparse to let it run
REQUIRED = {("job",): ("1",), ("chargeback",): ("--month", "2026-11"), ("act", "include"): ("alice",)}
COMMANDS = [
    (*words, *REQUIRED.get(words, ("--once",) if words[0] == "collect" else ())) for words in leaf_commands()
]


def command_id(argv: tuple[str, ...]) -> str:
    return " ".join(argv)


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    try:
        rc = main(argv)
    except SystemExit as exc:
        rc = int(exc.code or 0)
    out, err = capsys.readouterr()
    return rc, out, err


def one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("slurmtel: "), err
    assert "Traceback" not in err and "internal error" not in err, err
    return lines[0]


# ------------------------------------------------------------------ not a PostgreSQL URL

BAD_URLS = [
    "mysql://slurm:S3cret-pw@db.example.org/slurm_acct_db",
    "sqlite:///var/lib/slurmtel/x.db",
    "garbage",
    "http://db.example.org:5432/slurmtel",
    "postgresql+psycopg2://slurmtel@db.example.org/slurmtel",
]


@pytest.fixture
def no_database_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No URL in the environment, the home and state folders in TMP_PATH."""
    monkeypatch.delenv("SLURMTEL_DATABASE_URL", raising=False)
    monkeypatch.delenv("SLURMTEL_CONFIG", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "home" / ".local" / "state"))
    monkeypatch.setattr("slurmtel.commands.common.current_identity", lambda config: ADMIN)
    return tmp_path


@pytest.mark.parametrize("url", BAD_URLS)
def test_check_config_refuses_a_url_that_is_not_postgresql(
    url: str, no_database_env: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = no_database_env / "slurmtel.toml"
    config.write_text(f'[database]\nurl = "{url}"\n')
    rc, out, err = run(["check-config", str(config)], capsys)
    line = one_line(err)
    assert (rc, out) == (USAGE, "")
    assert line.startswith("slurmtel: database.url must be a PostgreSQL URL such as postgresql://")
    assert "S3cret-pw" not in err


@pytest.mark.parametrize("argv", COMMANDS, ids=command_id)
def test_every_command_refuses_a_url_that_is_not_postgresql_in_one_line(
    argv: tuple[str, ...], no_database_env: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = no_database_env / "slurmtel.toml"
    config.write_text(f'[database]\nurl = "{BAD_URLS[0]}"\n')
    t0 = time.monotonic()
    rc, out, err = run(["--config", str(config), *argv], capsys)
    line = one_line(err)
    assert (rc, out) == (USAGE, ""), err
    assert "'mysql://slurm:***@db.example.org/slurm_acct_db'" in line and "S3cret-pw" not in line
    # refused before anything was started: no embedded PostgreSQL, no state folder
    assert not (no_database_env / "home").exists()
    assert time.monotonic() - t0 < 30


@pytest.mark.parametrize("origin", ["environment", "url_file"])
def test_a_bad_url_from_the_environment_or_a_file_is_named_by_where_it_came_from(
    origin: str, no_database_env: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    config = no_database_env / "slurmtel.toml"
    if origin == "environment":
        monkeypatch.setenv("SLURMTEL_DATABASE_URL", "sqlite:///tmp/x.db")
        config.write_text("")
        where = "$SLURMTEL_DATABASE_URL"
    else:
        url_file = no_database_env / "db-url"
        url_file.write_text("mysql://slurm:S3cret-pw@db/x\n")
        config.write_text(f'[database]\nurl_file = "{url_file}"\n')
        where = f"database.url_file ({url_file})"
    for argv in (["check-config", str(config)], ["--config", str(config), "runs"]):
        rc, _, err = run(argv, capsys)
        assert rc == USAGE, err
        assert one_line(err).startswith(f"slurmtel: {where} must be a PostgreSQL URL"), err
        assert "S3cret-pw" not in err


@pytest.mark.parametrize(
    ("url", "message"),
    [
        (
            "postgresql://u:pw@db:notaport/x",
            "the port of 'postgresql://u:***@db:notaport/x' must be a number",
        ),
        ("postgresql://u@db:70000/x", "must be a number from 1 to 65535"),
        ("postgresql://[::1/x", "cannot read 'postgresql://[::1/x'"),
    ],
)
def test_a_postgresql_url_slurmtel_cannot_read_is_refused_at_load(url: str, message: str) -> None:
    with pytest.raises(ConfigError, match=r"^database\.url: ") as exc:
        config_from_dict({"database": {"url": url}})
    assert message in str(exc.value)


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://slurmtel@db.example.org/slurmtel",
        "postgres://slurmtel:pw@db.example.org:5432/slurmtel?sslmode=require",
        "postgresql+psycopg://slurmtel@/slurmtel?host=/run/postgresql",
        "postgresql:///slurmtel",
        "postgresql://slurmtel@[::1]:5432/slurmtel",
    ],
)
def test_postgresql_urls_are_accepted(url: str) -> None:
    assert config_from_dict({"database": {"url": url}}).database_url() == url


# ------------------------------------------------------------------ which database, and why


def test_no_schema_says_which_database_and_why(
    no_database_env: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The first `slurmtel report usage` after installing, with no config anywhere: the error
    names the embedded PostgreSQL it made and why it is that one (no config file was found)."""
    state = no_database_env / "home" / ".local" / "state" / "slurmtel"
    rc, _, err = run(["report", "usage"], capsys)
    line = one_line(err)
    assert rc == ENV
    assert line == (
        f"slurmtel: the embedded PostgreSQL under {state / 'pgdata'} (no database.url and no config file: "
        "none given with --config or $SLURMTEL_CONFIG and no /etc/slurmtel/slurmtel.toml) has no "
        "slurmtel schema yet: run `slurmtel db upgrade` first"
    )


def test_a_database_without_the_schema_is_named_with_its_config(
    server_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    name = f"slurmtel_empty_{int(time.time() * 1000) % 10**9}"
    admin = create_engine(server_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        url = make_url(server_url).set(database=name).render_as_string(hide_password=False)
        shown = make_url(url).render_as_string(hide_password=True)
        config = tmp_path / "slurmtel.toml"
        config.write_text(f'[database]\nurl = "{url}"\n')
        monkeypatch.delenv("SLURMTEL_DATABASE_URL", raising=False)
        monkeypatch.setattr("slurmtel.commands.common.current_identity", lambda config: ADMIN)
        for argv in (["report", "usage"], ["runs"]):
            rc, _, err = run(["--config", str(config), *argv], capsys)
            assert rc == ENV
            assert one_line(err) == (
                f"slurmtel: PostgreSQL at {shown} (database.url in {config}) has no slurmtel schema yet: "
                "run `slurmtel db upgrade` first"
            )
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def test_an_unreachable_database_is_named_with_where_its_url_was_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SLURMTEL_DATABASE_URL", "postgresql://nobody:pw@127.0.0.1:1/none?connect_timeout=2")
    monkeypatch.setattr("slurmtel.commands.common.current_identity", lambda config: ADMIN)
    config = tmp_path / "slurmtel.toml"
    config.write_text("")
    for argv in (["report", "usage"], ["runs"], ["db", "current"]):
        rc, _, err = run(["--config", str(config), *argv], capsys)
        assert rc == ENV
        assert one_line(err).startswith(
            "slurmtel: cannot connect to PostgreSQL at postgresql://nobody:***@127.0.0.1:1/none"
            "?connect_timeout=2 ($SLURMTEL_DATABASE_URL): "
        ), err


# ------------------------------------------------------------------ a login node

# what a login node's user may type besides each command's plain form
LOGIN_VARIANTS = [
    ("chargeback", "--list"),
    ("chargeback", "--audit"),
    ("chargeback", "--void", "2026-10", "--reason", "x"),
    ("chargeback", "--month", "2026-10", "--diff"),
    ("check-config", "--database"),
]
# the commands that ask `slurmtel serve` (unreachable here: exit 1, "cannot reach")
THROUGH_API = (
    {"job", "me", "chargeback"}
    | {f"report {n}" for n in ("usage", "failures", "idle", "queue")}
    | {f"report {n}" for n in ("taxonomy", "nodes", "capacity", "retries")}
    | {f"report {n}" for n in ("budget", "cost", "fabric", "checkpoints", "idle-now")}
)
# the variants that ask the API too
API_VARIANTS = [("report", "nodes", "--drift"), ("report", "fabric", "--nodes")]


@pytest.mark.parametrize("argv", [*COMMANDS, *LOGIN_VARIANTS, *API_VARIANTS], ids=command_id)
def test_a_login_node_asks_the_api_or_refuses_and_starts_no_database(
    argv: tuple[str, ...], no_database_env: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = no_database_env / "client.toml"
    config.write_text('[api]\nurl = "http://127.0.0.1:1"\n')
    rc, out, err = run(["--config", str(config), *argv], capsys)
    words = " ".join(w for w in argv if not w.startswith("-") and w not in ("1", "2026-10", "2026-11", "x"))
    if argv == ("check-config",):
        assert rc == 0
        assert "# database: none: a login-node client (api.url, no database.url)" in out
    elif words in THROUGH_API and argv not in LOGIN_VARIANTS:
        # on its way to the API: no server there (or no munged to sign the request with)
        assert rc == ENV
        assert "head node" not in one_line(err), err
    else:
        assert rc == USAGE, err
        line = one_line(err)
        assert "head node" in line, line
        if argv[0] != "chargeback":
            assert line.endswith(
                f"runs on the head node: this is a login-node client of http://127.0.0.1:1 (api.url in "
                f"{config}, no database.url), which starts no database of its own"
            ), line
    # whatever it did, it made no database of its own: no state folder in the home directory
    assert not (no_database_env / "home").exists()


# ------------------------------------------------------------------ serve on a busy port


def test_serve_on_a_busy_port_says_so_in_one_line(tmp_path: Path, database_url: str) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        config = tmp_path / "slurmtel.toml"
        config.write_text(f'[database]\nurl = "{database_url}"\n[api]\nport = {port}\n')
        proc = subprocess.run(
            [sys.executable, "-m", "slurmtel", "--config", str(config), "serve"],
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert proc.returncode == ENV, proc.stderr
    assert proc.stdout == ""
    assert one_line(proc.stderr) == (
        f"slurmtel: api.listen_address/api.port: cannot listen on 127.0.0.1:{port}: Address already in use"
    )
