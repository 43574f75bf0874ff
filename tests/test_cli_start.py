"""The `slurmtel` command starts without the database stack (issue 12): `--version`, `--help`
and `COMMAND --help` import none of the heavy packages, which only the handler of a command
that uses them imports. Each case runs the CLI in a fresh interpreter and reads its
sys.modules at exit, so a module-level import of any of them added to slurmtel.cli, a command
module or what one imports at module level fails here."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import Engine

from slurmtel.cli import _global_parser, _is_database_error, build_parser, command_in, main, report_in
from slurmtel.commands import COMMAND_MODULES, REPORT_MODULES, command_modules
from slurmtel.config import Config
from slurmtel.store.migrate import head_revision
from tests.factories import load_admin_day

ROOT = Path(__file__).resolve().parents[1]

# what a command line that does no database work must not load
HEAVY = (
    "sqlalchemy",
    "psycopg",
    "psycopg_pool",
    "alembic",
    "apscheduler",
    "rich",
    "matplotlib",
    "starlette",
    "uvicorn",
    "pyarrow",
    "pgserver",
)

# runs the CLI as `slurmtel` does, then prints the top-level packages it loaded (exit or not)
# and exits as the command did
LOADED = """
import json, sys
from slurmtel.head import main
code = 0
try:
    code = main(sys.argv[1:])
except SystemExit as exc:
    code = exc.code
finally:
    print(json.dumps(sorted({name.split(".")[0] for name in sys.modules})), file=sys.stderr)
sys.exit(code)
"""


def run_loaded(*argv: str) -> tuple[subprocess.CompletedProcess[str], set[str]]:
    """The CLI run with ARGV in a fresh interpreter, and the top-level packages it loaded."""
    done = subprocess.run(
        [sys.executable, "-c", LOADED, *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return done, set(json.loads(done.stderr.strip().splitlines()[-1]))


def loaded_by(*argv: str) -> set[str]:
    return run_loaded(*argv)[1]


@pytest.mark.parametrize(
    "argv",
    [
        ("--version",),
        ("--help",),
        ("job", "--help"),
        ("me", "--help"),
        ("report", "usage", "--help"),
        ("report", "budget", "--help"),
        ("collect", "sacct", "--help"),
        ("chargeback", "--help"),
        ("db", "--help"),
        ("run", "--help"),
        ("serve", "--help"),
        ("demo", "--help"),
    ],
    ids=lambda argv: " ".join(argv),
)
def test_parsing_loads_no_heavy_package(argv: tuple[str, ...]) -> None:
    assert loaded_by(*argv) & set(HEAVY) == set()


def test_the_probe_sees_a_heavy_import(tmp_path: Path) -> None:
    """The check above can fail: a command that reads the database loads the stack (here it
    then fails to connect, exit 1)."""
    config = tmp_path / "slurmtel.toml"
    config.write_text(
        '[database]\nurl = "postgresql://nobody@127.0.0.1:1/none"\nconnect_timeout_seconds = 2\n'
    )
    assert {"sqlalchemy", "psycopg"} <= loaded_by("--config", str(config), "db", "current")


@pytest.mark.parametrize(
    "argv",
    [
        ("job", "103"),
        ("me", "--user", "carol", "--month", "2026-11"),
        ("report", "usage", "-S", "2026-11-01", "-E", "2026-11-02"),
        ("report", "retries", "-S", "2026-11-01", "-E", "2026-11-02", "--format", "json"),
    ],
    ids=lambda argv: " ".join(argv[:2]),
)
def test_a_read_command_answers_without_sqlalchemy(
    engine: Engine, config: Config, database_url: str, tmp_path: Path, argv: tuple[str, ...]
) -> None:
    """job, me and report read over psycopg alone (slurmtel.store.reader): SQLAlchemy's import
    would cost them half of their 0.3 s."""
    load_admin_day(engine, config)
    site = tmp_path / "slurmtel.toml"
    site.write_text(
        f'[site]\nstate_dir = "{tmp_path}"\nclock = "2026-11-02T06:00:00+00:00"\n\n'
        f'[database]\nurl = "{database_url}"\n'
    )
    done, loaded = run_loaded("--config", str(site), *argv)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip()
    assert "psycopg" in loaded
    assert "sqlalchemy" not in loaded


def test_every_module_registers_the_commands_it_is_listed_with() -> None:
    everything = {
        name
        for action in build_parser()._actions
        if isinstance(action, argparse._SubParsersAction)
        for name in action.choices
    }
    listed: set[str] = set()
    for module_name, commands in COMMAND_MODULES.items():
        parser = _global_parser()
        top = parser.add_subparsers()
        report = top.add_parser("report")
        reports = report.add_subparsers()
        (module,) = [m for m in command_modules() if m.__name__.endswith(f".{module_name}")]
        module.register(top, reports)
        added = set(top.choices) - {"report"}
        if reports.choices:
            added.add("report")
        assert added == set(commands), module_name
        listed |= added
    assert listed == everything


@pytest.mark.parametrize(
    ("words", "command"),
    [
        ([], None),
        (["--version"], None),
        (["--help"], None),
        (["job", "123"], "job"),
        (["--config", "job", "me"], "me"),
        (["--conf", "x.toml", "report", "usage"], "report"),
        (["--config=x.toml", "run"], "run"),
        (["--log-level", "DEBUG", "collect", "sacct", "--once"], "collect"),
        (["--", "db"], "db"),
        (["--help", "job"], None),
        (["--he", "job"], None),
        (["-h", "job"], None),
        (["job", "--help"], "job"),
    ],
)
def test_the_command_is_found_before_parsing(words: list[str], command: str | None) -> None:
    assert command_in(words) == command


@pytest.mark.parametrize(
    "words",
    [
        ["--config", "x.toml", "job", "10_4", "--format", "json"],
        ["report", "idle", "-S", "2026-11-01", "--by", "cause"],
        ["--config", "x.toml", "report", "budget", "-A", "physics"],
        ["report", "idle-now", "--format", "json"],
        ["report", "nodes", "--drift"],
    ],
    ids=lambda words: " ".join(words),
)
def test_a_command_parses_as_with_every_command_registered(words: list[str]) -> None:
    alone = build_parser(command_in(words), report_in(words)).parse_args(words)
    full = build_parser().parse_args(words)
    assert {k: v for k, v in vars(alone).items() if k != "handler"} == {
        k: v for k, v in vars(full).items() if k != "handler"
    }
    assert repr(alone.handler) == repr(full.handler)


def test_a_report_registers_one_module_and_each_is_listed_with_its_reports() -> None:
    """REPORT_MODULES names what each module adds under `slurmtel report`; every other report
    is the catalog's module's ("reports"), so `report NAME` imports the one that registers it."""
    catalog: set[str] = set()
    for name in COMMAND_MODULES:
        if "report" not in COMMAND_MODULES[name]:
            continue
        parser = _global_parser()
        top = parser.add_subparsers()
        reports = top.add_parser("report").add_subparsers()
        (module,) = [m for m in command_modules() if m.__name__.endswith(f".{name}")]
        module.register(top, reports)
        if name == "reports":
            catalog = set(reports.choices)
        else:
            assert set(reports.choices) == set(REPORT_MODULES[name]), name
    assert catalog and not catalog & {r for names in REPORT_MODULES.values() for r in names}
    for report in ("idle", "usage", *catalog):
        assert [m.__name__ for m in command_modules("report", report)] == ["slurmtel.commands.reports"]
    assert [m.__name__ for m in command_modules("report", "budget")] == ["slurmtel.commands.budget"]


def test_an_unknown_report_is_refused_naming_them_all(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["report", "bogus"])
    assert exc.value.code == 2
    refusal = capsys.readouterr().err
    assert "'idle'" in refusal and "'budget'" in refusal and "'idle-now'" in refusal


@pytest.mark.parametrize(
    ("words", "report"),
    [
        (["report", "idle", "-S", "x"], "idle"),
        (["--config", "report", "report", "usage"], "usage"),
        (["report", "--help"], None),
        (["report"], None),
        (["job", "idle"], None),
        (["--", "report", "cost"], "cost"),
    ],
)
def test_the_report_is_found_before_parsing(words: list[str], report: str | None) -> None:
    assert report_in(words) == report


def test_an_unknown_command_is_refused_naming_them_all(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["bogus"])
    assert exc.value.code == 2
    assert "'job'" in capsys.readouterr().err


def test_the_head_revision_is_alembics() -> None:
    from alembic.script import ScriptDirectory

    from slurmtel.store.migrate import alembic_config

    assert head_revision() == ScriptDirectory.from_config(alembic_config()).get_current_head()


def test_a_database_error_is_known_without_importing_sqlalchemy() -> None:
    import psycopg
    from sqlalchemy.exc import OperationalError

    assert _is_database_error(OperationalError("SELECT 1", {}, Exception("server closed the connection")))
    assert _is_database_error(psycopg.OperationalError("server closed the connection"))
    assert not _is_database_error(ValueError("not the database"))
