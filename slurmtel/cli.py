"""The `slurmtel` command line. Each command lives in slurmtel/commands/.

Exit status: 0 ok, 1 error, 2 usage or configuration error, 3 done but some records were
quarantined (see `slurmtel quarantine list`).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
from collections.abc import Callable, Sequence
from types import FrameType
from typing import TYPE_CHECKING, Any

from slurmtel import __version__
from slurmtel.commands import EXIT_ERROR, EXIT_OK, EXIT_USAGE, command_modules
from slurmtel.errors import ConfigError, SlurmtelError, Terminated, described

if TYPE_CHECKING:
    from slurmtel.config import Config

# the config, the logging setup and the renderer are imported once the command line is parsed:
# `slurmtel --version` answers without them (issue 28)


def load_config(path: str | os.PathLike[str] | None = None) -> Config:
    """slurmtel.config.load_config, imported when a command runs (tests replace this name)."""
    from slurmtel.config import load_config as load

    return load(path)


def main(argv: Sequence[str] | None = None) -> int:
    # what a command prints may hold whatever its input held (bytes that are not UTF-8 kept as
    # surrogates, unpaired \ud800 escapes): shown as escapes rather than failing the print
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(AttributeError, ValueError):
            stream.reconfigure(errors="backslashreplace")  # type: ignore[union-attr]
    words = list(sys.argv[1:] if argv is None else argv)
    command = command_in(words)
    if command is None and "--version" in words and not {"-h", "--help"} & set(words):
        # `slurmtel --version` answers before any command is looked at
        parser = _global_parser()
    else:
        parser = build_parser(command, report_in(words))
    args = parser.parse_args(words)
    if not getattr(args, "handler", None):
        parser.print_help()
        return EXIT_USAGE
    import logging

    import slurmtel.config
    from slurmtel.logs import configure_logging
    from slurmtel.reports.render import WIDE, ZONE

    # after `slurmtel demo`, its config when no other is given (never for the demo itself)
    demo_config = (
        None if args.config or not args.finds_demo_config else slurmtel.config.implicit_demo_config()
    )
    try:
        config = load_config(args.config or demo_config)
        if not getattr(args, "through_api", False) and config.api_client_only():
            # a login node: what cannot ask the API runs on the head, and nothing here starts
            # a database of its own
            raise ConfigError(config.head_only_message(args.command_words))
    except ConfigError as exc:
        _error(exc)
        return EXIT_USAGE
    if demo_config is not None:
        # which world the figures are of: the demo's, found because nothing else was given
        etc = slurmtel.config.DEFAULT_CONFIG_PATH
        _error(f"note: using the demo's config {demo_config} (no --config, $SLURMTEL_CONFIG or {etc})")
    level = args.log_level or config.logging.level
    configure_logging(level)
    if level.upper() != "DEBUG":
        # Alembic narrates every schema check at INFO; a command's output is not the place
        logging.getLogger("alembic").setLevel(logging.WARNING)
    # --wide (tables: every column, full GPU UUIDs) for every table the command prints
    wide = WIDE.set(bool(getattr(args, "wide", False)))
    zone = ZONE.set(config.zone)
    terminated = False
    previous_sigterm = _raise_on_sigterm()
    try:
        return int(args.handler(args, config))
    except Terminated:
        # unwound like an interrupt: transactions rolled back, and the embedded PostgreSQL
        # this process started stops at its exit (a second SIGTERM is ignored until then)
        terminated = True
        _error("terminated")
        return EXIT_ERROR
    except ConfigError as exc:
        _error(exc)
        return EXIT_USAGE
    except SlurmtelError as exc:
        _error(exc)
        return EXIT_ERROR
    except BrokenPipeError:
        return EXIT_OK
    except KeyboardInterrupt:
        _error("interrupted")
        return EXIT_ERROR
    except OSError as exc:
        # a file the caller named (an --output or --plot path, a state directory) is the
        # environment's problem: say which and why, no traceback
        where = f" {exc.filename}" if exc.filename else ""
        _error(f"cannot use{where}: {exc.strerror or exc}")
        return EXIT_ERROR
    except Exception as exc:
        if _is_database_error(exc):
            # a database failure no command turned into a SlurmtelError: its first line, no traceback
            _error(f"database error: {described(exc)}")
            return EXIT_ERROR
        if isinstance(exc, ModuleNotFoundError) and not (exc.name or "slurmtel").startswith("slurmtel"):
            # a package not installed, found missing only now that a command imports what it
            # needs: slurmtel.head says which, and how to install the head's packages
            raise
        # a bug: one line for the user, the traceback with --log-level DEBUG
        logging.getLogger("slurmtel.cli").debug("unexpected error", exc_info=True)
        _error(f"internal error: {described(exc)} (run with --log-level DEBUG for the traceback)")
        return EXIT_ERROR
    finally:
        WIDE.reset(wide)
        ZONE.reset(zone)
        if previous_sigterm is not None:
            with contextlib.suppress(ValueError):
                signal.signal(signal.SIGTERM, signal.SIG_IGN if terminated else previous_sigterm)


def _raise_on_sigterm() -> signal.Handlers | Callable[..., Any] | int | None:
    """SIGTERM raises Terminated in the main thread (as SIGINT raises KeyboardInterrupt), so
    that the command unwinds and exits through atexit. Python's default would end the process
    at once, leaving the embedded PostgreSQL running with a handle nobody removes. Returns the
    handler it replaced (None where none can be set: not the main thread)."""

    def terminate(signum: int, frame: FrameType | None) -> None:
        raise Terminated(signal.Signals(signum).name)

    try:
        return signal.signal(signal.SIGTERM, terminate)
    except ValueError:
        return None


def _is_database_error(exc: BaseException) -> bool:
    """An SQLAlchemy error, or psycopg's (the read commands use psycopg alone). Either is
    imported only by the commands that use the database (`slurmtel --version` and `--help` must
    start fast), so one raised means it is loaded."""
    sa_exc = sys.modules.get("sqlalchemy.exc")
    if sa_exc is not None and isinstance(exc, sa_exc.SQLAlchemyError):
        return True
    pg_errors = sys.modules.get("psycopg.errors")
    return pg_errors is not None and isinstance(exc, pg_errors.Error)


def _error(message: object) -> None:
    """One line on stderr, secrets masked (a URL's password may be part of an error); a
    message of several lines (libpq's "Is the server running...?") is joined into one."""
    from slurmtel.logs import redact

    text = " ".join(line.strip() for line in str(message).splitlines() if line.strip())
    print(f"slurmtel: {redact(text)}", file=sys.stderr)


def command_in(words: Sequence[str]) -> str | None:
    """The command WORDS name: the first word that is neither an option nor the value of one
    of the options before the command (--config FILE, --log-level LEVEL); None when there is
    none, or when help is asked for before it."""
    at = _command_at(words)
    return None if at is None else words[at]


def report_in(words: Sequence[str]) -> str | None:
    """The report `slurmtel report NAME ...` names: the word after the command `report` when
    it is not an option (`report` itself takes none but --help); None otherwise."""
    at = _command_at(words)
    if at is None or words[at] != "report" or at + 1 >= len(words) or words[at + 1].startswith("-"):
        return None
    return words[at + 1]


def _command_at(words: Sequence[str]) -> int | None:
    """Where in WORDS the command is (command_in)."""
    global_parser = _global_parser()
    takes_value = [
        option
        for action in global_parser._actions
        if action.nargs != 0 and action.option_strings
        for option in action.option_strings
    ]
    skip = False
    for i, word in enumerate(words):
        if skip:
            skip = False
        elif word == "--":
            return i + 1 if i + 1 < len(words) else None
        elif word == "-h" or (len(word) > 2 and "--help".startswith(word)):
            # help before the command is the help of them all
            return None
        elif word.startswith("-"):
            # `--config FILE`, or abbreviated as argparse allows (`--conf FILE`); not `--config=FILE`
            skip = word in takes_value or (
                word.startswith("--") and "=" not in word and any(o.startswith(word) for o in takes_value)
            )
        else:
            return i
    return None


def build_parser(command: str | None = None, report: str | None = None) -> argparse.ArgumentParser:
    """The CLI's parser: with COMMAND, only the modules that register it are imported and
    registered (a command answers without loading every other one); else all of them. With
    REPORT (`report NAME`), only the module that registers that report, unless it does not:
    then every one, so that the refusal lists them all."""
    parser = _global_parser()
    commands = parser.add_subparsers(title="commands", metavar="COMMAND")
    report_parser = commands.add_parser("report", help="admin reports")
    reports = report_parser.add_subparsers(title="reports", metavar="REPORT", required=True)
    chosen = command_modules(command, report)
    for module in chosen:
        module.register(commands, reports)
    if report is not None and report not in reports.choices:
        for module in command_modules(command):
            if module not in chosen:
                module.register(commands, reports)
    _name_commands(parser)
    return parser


def _name_commands(parser: argparse.ArgumentParser, words: tuple[str, ...] = ()) -> None:
    """Give each command's parser its words as a default (`command_words`: "report fabric"),
    for messages about the command run."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                sub.set_defaults(command_words=" ".join((*words, name)))
                _name_commands(sub, (*words, name))


def _global_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="slurmtel", description="Slurm accounting and GPU telemetry in PostgreSQL."
    )
    parser.add_argument("--version", action="version", version=f"slurmtel {__version__}")
    # the CLI's own entry point, for a command that runs others (the demo's views): a command
    # module importing slurmtel.cli would be an import cycle (tests/test_layers.py)
    parser.set_defaults(run_cli=main, finds_demo_config=True)
    parser.add_argument(
        "--config",
        default=None,
        help="config file (default: $SLURMTEL_CONFIG, else /etc/slurmtel/slurmtel.toml if present, "
        "else the config `slurmtel demo` left in your state directory, if any)",
    )
    parser.add_argument(
        "--log-level",
        default=None,
        choices=("DEBUG", "INFO", "WARNING", "ERROR"),
        help="override logging.level",
    )
    return parser
