"""Issue 10 item 5: tables on a terminal. Figures are never cut or elided (whole columns are
left out instead, and named), GPUs are `node/index` (the UUID with --wide, in csv and json),
and every cell and title is printed literally: no rich markup, control characters as `\\xNN`.

The renderer is tested with a file object that says it is a terminal; the CLI end to end in a
subprocess on a real pseudo-terminal of 80 and 120 columns over a real PostgreSQL."""

from __future__ import annotations

import csv
import dataclasses
import fcntl
import io
import json
import os
import re
import select
import struct
import subprocess
import sys
import termios
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from rich.cells import cell_len
from sqlalchemy import Engine

from slurmtel.columns import table_name, table_value
from slurmtel.config import Config
from slurmtel.reports.render import _text, escape_controls, fit_columns, render
from tests.factories import admin_day, load_admin_day

HOSTILE = ["[/]", "[link=http://x]y[/link]", "\x1b]0;pwned\x07", "\x1b[2J"]
ESCAPED = ["[/]", "[link=http://x]y[/link]", "\\x1b]0;pwned\\x07", "\\x1b[2J"]
# rich's own styling (bold headers): the only escape sequences a table may hold
SGR = re.compile(r"\x1b\[[0-9;]*m")
UUID = "GPU-773d4a1e-5b2c-4e8f-9a01-0123456789ab"


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def rows() -> list[dict[str, Any]]:
    return [
        {
            "cluster": "lab",
            "job_id": str(1000 + i),
            "name": name,
            "user": "alice",
            "account": "physics",
            "partition": "gpu",
            "gpu": f"gpu01/{i}",
            "gpu_uuid": UUID[:-1] + str(i),
            "allocated_gpu_seconds": 7281234.5 + i,
            "idle_gpu_seconds": 3600 * 17.25,
            "idle_share": 0.4321,
            "billable_amount": Decimal("123456.78"),
            "closed_amount": "98765.43",
            "state": "COMPLETED",
            "reason": "a long reason with several words in it",
        }
        for i, name in enumerate(HOSTILE)
    ]


def terminal(monkeypatch: pytest.MonkeyPatch, width: int) -> None:
    """A terminal WIDTH columns wide, whatever the caller's TERM (rich takes a dumb terminal to
    be 80 columns, COLUMNS or not)."""
    monkeypatch.setenv("COLUMNS", str(width))
    monkeypatch.setenv("TERM", "xterm-256color")


def table(width: int, monkeypatch: pytest.MonkeyPatch, **kwargs: Any) -> str:
    terminal(monkeypatch, width)
    out = Tty()
    render(rows(), out, "table", title="Jobs [bold]of[/] \x1b[2Jlab", **kwargs)
    return out.getvalue()


def visible(text: str) -> str:
    return SGR.sub("", text)


def dropped(text: str) -> list[str]:
    match = re.search(r"not shown \(\d+ columns\): (.*?); --wide or --format csv", re.sub(r"\s+", " ", text))
    return match.group(1).split(", ") if match else []


def shown_columns(all_columns: list[str], text: str) -> list[str]:
    return [c for c in all_columns if c not in dropped(text)]


def assert_figures_whole(text: str, figures: list[str]) -> None:
    assert "…" not in text
    for value in figures:
        assert re.search(rf"(?<![\d.]){re.escape(value)}(?![\d.])", text), value


def assert_no_raw_controls(text: str) -> None:
    assert not re.search("[\x00-\x09\x0b-\x1f\x7f-\x9f]", SGR.sub("", text))


TABLE_COLUMNS = [
    "cluster", "job_id", "name", "user", "account", "partition", "gpu", "allocated_gpu_hours",
    "idle_gpu_hours", "idle_percent", "billable_amount", "closed_amount", "state", "reason",
]  # fmt: skip


@pytest.mark.parametrize("width", [80, 120])
def test_a_table_fits_the_terminal_by_leaving_columns_out(
    width: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    text = table(width, monkeypatch)
    lines = visible(text).splitlines()
    assert all(cell_len(line) <= width for line in lines), [cell_len(line) for line in lines]
    left_out = dropped(text)
    assert left_out, "15 columns do not fit in 120"
    shown = shown_columns(TABLE_COLUMNS, text)
    # identity first, then the figures, then the other text
    assert {"cluster", "job_id", "name", "user", "account", "gpu"} <= set(shown)
    assert "reason" in left_out
    if width == 120:
        assert "allocated_gpu_hours" in shown and "state" in left_out
    for column in shown:
        assert column.split("_")[0] in visible(text)
    figures = {
        "allocated_gpu_hours": [_text(round((7281234.5 + i) / 3600, 4)) for i in range(4)],
        "idle_gpu_hours": ["17.25"],
        "idle_percent": ["43.2"],
        "billable_amount": ["123456.78"],
        "closed_amount": ["98765.43"],
        "job_id": ["1000", "1001", "1002", "1003"],
    }
    assert_figures_whole(visible(text), [v for c, vs in figures.items() if c in shown for v in vs])
    # a figure column is never squeezed below its widest value
    assert all(c not in left_out for c in ("job_id",))


@pytest.mark.parametrize("width", [80, 120])
def test_cells_and_titles_are_literal(width: int, monkeypatch: pytest.MonkeyPatch) -> None:
    text = table(width, monkeypatch)
    assert_no_raw_controls(text)
    assert "\x1b]" not in text and "\x07" not in text  # no retitling, no OSC 8 hyperlink
    assert "Jobs [bold]of[/] \\x1b[2Jlab" in visible(text)
    # the name column's lines, one cell wrapped over several
    index = shown_columns(TABLE_COLUMNS, text).index("name") + 1
    body = [line.split("│") for line in visible(text).splitlines() if line.startswith("│")]
    names = "".join(fields[index].strip() for fields in body)
    for name in ESCAPED:
        assert name in names, name


def test_wide_shows_every_column_and_full_uuids(monkeypatch: pytest.MonkeyPatch) -> None:
    text = visible(table(80, monkeypatch, wide=True))
    assert not dropped(text) and "not shown" not in text
    for i, name in enumerate(ESCAPED):
        assert UUID[:-1] + str(i) in text
        assert name in text
    assert "a long reason with several words in it" in text


def test_the_uuid_is_in_tables_only_with_wide_and_always_in_csv_and_json(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    terminal(monkeypatch, 200)
    for out in (Tty(), io.StringIO()):
        render(rows(), out, "table")
        assert "gpu01/3" in out.getvalue() and UUID[:8] not in out.getvalue()
    data = io.StringIO()
    render(rows(), data, "csv")
    parsed = list(csv.DictReader(io.StringIO(data.getvalue())))
    assert [r["gpu_uuid"] for r in parsed] == [UUID[:-1] + str(i) for i in range(4)]
    # csv is data: the names as they are (docs/commands.md: pipe it to a program, not to a terminal)
    assert [r["name"] for r in parsed] == HOSTILE
    document = io.StringIO()
    render(rows(), document, "json")
    assert "\x1b" not in document.getvalue()
    assert [r["name"] for r in json.loads(document.getvalue())] == HOSTILE


def test_a_plain_table_escapes_too() -> None:
    out = io.StringIO()
    render(rows(), out, "table", title="t\x1b[2J")
    text = out.getvalue()
    assert_no_raw_controls(text)
    for name in ESCAPED:
        assert name in text
    assert "t\\x1b[2J" in text


def test_escape_controls() -> None:
    assert escape_controls("a\x1b[2Jb\x07\x7f\x9b\tc\nd") == "a\\x1b[2Jb\\x07\\x7f\\x9b\\x09c\\x0ad"
    assert escape_controls("naïve ∑ [b]x[/b]") == "naïve ∑ [b]x[/b]"


def test_fit_keeps_the_first_column_and_whole_figures() -> None:
    cols = ["name", "a", "b"]
    cells = [["x" * 30, "12345678901", "1"]]
    chosen, widths = fit_columns(cols, cells, [False, True, True], 30)
    assert chosen[0] == 0
    assert dict(zip(chosen, widths, strict=True)).get(1, 11) >= 11
    # even a terminal narrower than one figure shows the first column whole-figured
    chosen, widths = fit_columns(["a"], [["1234567890123"]], [True], 5)
    assert chosen == [0] and widths == [13]


# ------------------------------------------------------------------ the CLI on a real pty


def run_on_pty(argv: list[str], width: int, env: dict[str, str]) -> str:
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, width, 0, 0))
    proc = subprocess.Popen(
        [sys.executable, "-m", "slurmtel", *argv],
        stdin=slave, stdout=slave, stderr=slave, close_fds=True,
        env={**env, "COLUMNS": str(width), "TERM": "xterm-256color"},
    )  # fmt: skip
    os.close(slave)
    chunks: list[bytes] = []
    try:
        while True:
            ready, _, _ = select.select([master], [], [], 60)
            if not ready:
                raise AssertionError("no output for 60 s")
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(master)
        assert proc.wait(timeout=60) == 0, b"".join(chunks).decode("utf-8", "replace")
    return b"".join(chunks).decode("utf-8", "replace").replace("\r\n", "\n")


@pytest.fixture
def cli_env(
    engine: Engine, config: Config, database_url: str, tmp_path: Path
) -> tuple[list[str], dict[str, str]]:
    day = admin_day()
    names = iter(HOSTILE * 10)
    day.attempts = [
        dataclasses.replace(a, name=next(names), user="alice") if a.job_id_raw in (101, 102, 103, 104) else a
        for a in day.attempts
    ]
    load_admin_day(engine, config, day)
    path = tmp_path / "slurmtel.toml"
    path.write_text('[site]\nclock = "2026-12-02T14:00:00Z"\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURMTEL_")}
    env["SLURMTEL_DATABASE_URL"] = database_url
    return ["--config", str(path), "--log-level", "WARNING"], env


def cli_json(argv: list[str], env: dict[str, str]) -> Any:
    done = subprocess.run(
        [sys.executable, "-m", "slurmtel", *argv, "--format", "json"],
        env=env,
        capture_output=True,
        check=True,
    )
    return json.loads(done.stdout)


@pytest.mark.parametrize("width", [80, 120])
def test_cli_tables_on_a_pty(width: int, cli_env: tuple[list[str], dict[str, str]]) -> None:
    base, env = cli_env
    idle = [*base, "report", "idle", "-S", "2026-11-01", "-E", "2026-11-02"]
    text = run_on_pty(idle, width, env)
    assert_no_raw_controls(text)
    assert all(cell_len(line) <= width for line in visible(text).splitlines())
    assert "…" not in text
    sections = visible(text).split("\n\n")
    document = cli_json(idle, env)
    for rows_, section in zip(document.values(), [s for s in sections if s.strip()], strict=False):
        for r in rows_:
            for column, value in r.items():
                # the table's unit of the column (hours, percent): the one conversion
                shown, value = table_name(column), table_value(column, value)
                if (
                    shown not in dropped(section)
                    and isinstance(value, int | float)
                    and not isinstance(value, bool)
                ):
                    assert_figures_whole(section, [_text(value)])

    jobs = [*base, "me", "-u", "alice", "--month", "2026-11", "--jobs"]
    text = run_on_pty(jobs, width, env)
    assert_no_raw_controls(text)
    assert "\x1b]" not in text and "\x07" not in text
    assert "…" not in text
    if width == 120:
        for name in ["[/]", "\\x1b[2J"]:
            assert name in visible(text)
    wide = visible(run_on_pty([*jobs, "--wide"], width, env))
    assert "not shown" not in wide
    for name in ESCAPED:
        assert name in wide

    job = run_on_pty([*base, "job", "102", "-M", "lab"], width, env)
    assert_no_raw_controls(job)
    assert "(\\x1b]0;pwned\\x07)" in job or "([link=http://x]y[/link])" in job


# what a report's narrow table keeps (its spec's key columns): the figures that answer the question
KEY_FIGURES = {
    ("me", "-u", "alice", "--month", "2026-11", "--jobs"): [
        "allocated_gpu_hours",
        "idle_percent",
        "mean_util_percent",
    ],
    ("report", "taxonomy", "-S", "2026-11-01", "-E", "2026-11-02"): [
        "active_percent",
        "allocated_idle_percent",
        "allocated_no_process_percent",
        "unallocated_percent",
    ],
    ("report", "idle", "-S", "2026-11-01", "-E", "2026-11-02"): [
        "idle_percent",
        "idle_gpu_hours",
        "no_process_gpu_hours",
        "mean_util_percent",
    ],
    ("report", "usage", "-S", "2026-11-01", "-E", "2026-11-02"): [
        "allocated_gpu_hours",
        "failed_gpu_hours",
        "queue_wait_p50_hours",
        "queue_wait_p95_hours",
    ],
}


@pytest.mark.parametrize("argv", list(KEY_FIGURES), ids=lambda argv: " ".join(argv[:2]))
def test_80_columns_keep_the_figures_that_answer_the_question(
    argv: tuple[str, ...], cli_env: tuple[list[str], dict[str, str]]
) -> None:
    base, env = cli_env
    text = visible(run_on_pty([*base, *argv], 80, env))
    first = text.split("\n\n")[0]
    left_out = dropped(first)
    assert left_out, "at 80 columns something is left out"
    for figure in KEY_FIGURES[argv]:
        assert figure not in left_out, (figure, left_out)
        assert figure.split("_")[0] in first
