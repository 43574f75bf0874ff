"""docs/commands.md's command table against the argparse parser: every command and subcommand
the CLI has is in the table, and every command and `--option` the table names exists; and every
`slurmtel ...` command the README's front page gives parses as written."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from slurmtel.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]


def subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def command_paths() -> dict[tuple[str, ...], argparse.ArgumentParser]:
    """('report', 'idle') -> its parser, for every command of the CLI (a group too: `act` has
    options of its own beside its subcommands)."""
    paths: dict[tuple[str, ...], argparse.ArgumentParser] = {}

    def walk(prefix: tuple[str, ...], parser: argparse.ArgumentParser) -> None:
        children = subparsers(parser)
        if prefix:
            paths[prefix] = parser
        for name, child in children.items():
            walk((*prefix, name), child)

    walk((), build_parser())
    return paths


def table_rows() -> list[str]:
    """The first cell of each row of docs/commands.md's table of every command."""
    text = (ROOT / "docs" / "commands.md").read_text()
    section = text[text.index("## Every command") :]
    end = section.find("\n## ", 5)
    section = section if end < 0 else section[:end]
    return [row.split(" | ")[0] for row in section.splitlines() if row.startswith("| `slurmtel ")]


def documented(path: tuple[str, ...], rows: list[str]) -> bool:
    """PATH is in a row that names it in full (`slurmtel report idle`), or in a row that lists
    it after its parent (`slurmtel report failures`, `idle`, ...)."""
    full = " ".join(path)
    parent, leaf = " ".join(path[:-1]), path[-1]
    for row in rows:
        names = re.findall(r"`([^`]*)`", row)
        if any(re.match(rf"slurmtel {re.escape(full)}\b", n) for n in names):
            return True
        if (
            parent
            and any(n.startswith(f"slurmtel {parent} ") for n in names)
            and (f"`{leaf}`" in row or f"`{leaf} " in row or f"{parent} {leaf}" in row)
        ):
            return True
    return False


def test_every_command_is_in_the_readme_table() -> None:
    rows = table_rows()
    missing = [" ".join(path) for path in command_paths() if not documented(path, rows)]
    assert missing == [], "commands missing from docs/commands.md's table"


def test_every_command_and_option_the_table_names_exists() -> None:
    paths = command_paths()

    def options_of(prefix: tuple[str, ...]) -> set[str]:
        # a command, or every command under a group (`slurmtel collect SOURCE --once`)
        return {
            option
            for path, parser in paths.items()
            if path[: len(prefix)] == prefix
            for action in parser._actions
            for option in action.option_strings
        }

    for row in table_rows():
        row_options: set[str] = set()
        for name in re.findall(r"`(slurmtel [^`]*)`", row):
            words = [w for w in name.split()[1:] if re.fullmatch(r"[a-z][a-z-]*", w)]
            # the longest run of leading words that is a command or a group of commands
            found = next(
                (tuple(words[:n]) for n in range(len(words), 0, -1) if options_of(tuple(words[:n]))), None
            )
            assert found is not None, f"docs/commands.md names `{name}`, which is no slurmtel command"
            row_options |= options_of(found)
            # `slurmtel report failures`, `idle`, ...: the siblings a row lists after a command
            row_options |= options_of(found[:-1]) if len(found) > 1 else set()
        for option in re.findall(r"(?<![\w-])(--[a-z][a-z-]*)", row):
            assert option in row_options, (
                f"docs/commands.md's row {row!r} names {option}, which none of its commands has"
            )


def front_page_commands() -> list[str]:
    """Every `slurmtel ...` command the README's front page gives, in code spans and blocks."""
    readme = (ROOT / "README.md").read_text()
    spans = re.findall(r"`(slurmtel [^`]+)`", readme)
    blocks = [
        line.split("#")[0].strip()
        for block in re.findall(r"```sh\n(.*?)```", readme, flags=re.S)
        for line in block.splitlines()
    ]
    return [c for c in [*spans, *blocks] if c.startswith("slurmtel ") and c != "slurmtel demo"]


def test_every_command_the_front_page_gives_parses() -> None:
    parser = build_parser()
    commands = front_page_commands()
    assert len(commands) > 20
    for command in commands:
        # the placeholders a reader fills in
        argv = [{"JOBID": "1", "N": "1", "NAME": "x", "USER": "x"}.get(w, w) for w in command.split()[1:]]
        try:
            parser.parse_args(argv)
        except SystemExit as exc:
            raise AssertionError(f"README gives `{command}`, which slurmtel refuses") from exc
