"""Every command given a malformed or out-of-range value answers one clear line, no traceback.

Exit 2 for a bad argument (a usage error), 1 for the environment (a missing file or directory,
an unreachable database). Errors argparse finds itself print its usage and `error:` line, exit 2.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy import Engine

from slurmtel.access import Identity, Role
from slurmtel.cli import main

NOW = datetime(2026, 11, 20, 12, 0, tzinfo=UTC)
ADMIN = Identity("root", Role.ADMIN)

USAGE, ENV = 2, 1


@dataclass(frozen=True)
class Case:
    argv: str  # split on spaces; {dir} is a scratch folder, {file} a small file in it
    rc: int
    argparse: bool = False  # argparse's own usage error (usage line + `error:` line)


CASES: list[Case] = []
BAD_TIMES = ("garbage", "9999-12-31T23:59:59", "2026-13-01", "11/01/2026", "now-99999999days")

# ------------------------------------------------------------------ collect, every source
for value in BAD_TIMES:
    CASES += [
        Case(f"collect sacct --once -S {value}", USAGE),
        Case(f"collect sacct --once -E {value}", USAGE),
        Case(f"collect dcgm --input {{file}} --node n1 --at {value}", USAGE),
        Case(f"collect slurmctld --input {{file}} --at {value}", USAGE),
    ]
CASES += [
    Case("collect sacct --input /nonexistent", ENV),
    Case("collect dcgm --input /nonexistent --node n1 --at 2026-11-01", ENV),
    Case("collect slurmctld --input /nonexistent --at 2026-11-01", ENV),
    Case("collect agent --input /nonexistent", ENV),
    Case("collect nccl --input /nonexistent", ENV),
    Case("collect dcgm --input {file}", USAGE),  # no --node/--at
    Case("collect sacct --input {file} --format parsable --timezone Mars/Olympus", USAGE),
    Case("collect sacct --input {file} --format xml", USAGE, argparse=True),
    Case("collect sacct --once -S 2026-11-10 -E 2026-11-01", USAGE),  # empty window
    Case("collect sacct --once -S 2099-01-01", USAGE),  # a window that starts after now
    Case("collect prometheus --once -S 2026-11-10 -E 2026-11-01", USAGE),
    Case("collect dcgm --once --target =host:9400", USAGE),  # a target without a node
    Case("collect agent --once --target http://:9767/", USAGE),  # a target without a host
    Case("collect nccl --input {file} --job abc", USAGE),
    Case("collect slurmctld --input {file} --nodes-input /nonexistent", ENV),
    Case("collect sacct", USAGE, argparse=True),
    Case("collect nosuch --once", USAGE, argparse=True),
]

# ------------------------------------------------------------------ reports
WINDOWED = (
    "usage",
    "failures",
    "idle",
    "queue",
    "taxonomy",
    "nodes",
    "capacity",
    "retries",
    "cost",
    "fabric",
)
for report in WINDOWED:
    CASES += [Case(f"report {report} -S {value}", USAGE) for value in BAD_TIMES]
    CASES += [
        Case(f"report {report} -E {BAD_TIMES[0]}", USAGE),
        Case(f"report {report} -S 2026-11-10 -E 2026-11-01", USAGE),  # empty window
        Case(f"report {report} --format xml", USAGE, argparse=True),
    ]
for report in ("failures", "idle"):
    CASES += [
        Case(f"report {report} --top -1", USAGE, argparse=True),
        Case(f"report {report} --top ten", USAGE, argparse=True),
        Case(f"report {report} --top 0", USAGE, argparse=True),
        Case(f"report {report} --top 99999999999999999999", USAGE, argparse=True),
    ]
# the API's bounds (slurmtel.bounds; tests/test_api_hostile.py sends the same to /v1/*)
for report in ("usage", "failures", "queue"):
    CASES += [
        Case(f"report {report} -u al\x1bice", USAGE),
        Case(f"report {report} -A phys\x07ics", USAGE),
        Case(f"report {report} -r {'p' * 300}", USAGE),
        Case(f"report {report} -M {','.join(f'c{i}' for i in range(1001))}", USAGE),
    ]
CASES += [
    Case("report capacity --target-gpu-hours 1e999", USAGE),
    Case("report capacity --target-gpu-hours 1e300", USAGE),
    Case("me --user bo\x1b[31mb", USAGE),
]
CASES += [Case(f"report budget --at {value}", USAGE) for value in BAD_TIMES]
CASES += [
    Case("report budget --format xml", USAGE, argparse=True),
    Case("report capacity --target-gpu-hours -5", USAGE),
    Case("report capacity --target-gpu-hours nan", USAGE),
    Case("report capacity --target-gpu-hours inf", USAGE),
    Case("report cost --target-work -5", USAGE, argparse=True),
    Case("report usage --by nothing", USAGE, argparse=True),
    Case("report nosuch", USAGE, argparse=True),
]

# ------------------------------------------------------------------ job, me, runs, quarantine
CASES += [
    Case("job 99999999999999999999", USAGE),
    Case("job 9223372036854775808", USAGE),
    Case("job 0", USAGE),
    Case("job 10_99999999999999999999", USAGE),
    Case("job 1+99999999999999999999", USAGE),
    Case("job abc", USAGE),
    Case("job -1", USAGE),
    Case("job 1 --plot {dir}/x.jpg", USAGE),
    Case("job 1 --plot {dir}/x", USAGE),
    Case("job 1 --plot /nonexistent/dir/x.png", ENV),
    Case("job 1 --format xml", USAGE, argparse=True),
    Case("me --month 2026-13", USAGE),
    Case("me --month garbage", USAGE),
    Case("me --month 0001-01", USAGE),
    Case("me --top ten", USAGE, argparse=True),
    Case("me --top 0", USAGE, argparse=True),
    Case("me --top 99999999999999999999", USAGE, argparse=True),
    Case("runs --limit -1", USAGE, argparse=True),
    Case("runs --limit 0", USAGE, argparse=True),
    Case("runs --limit many", USAGE, argparse=True),
    Case("runs --limit 99999999999999999999", USAGE, argparse=True),
    Case("quarantine list --limit -1", USAGE, argparse=True),
    Case("quarantine list --limit 99999999999999999999", USAGE, argparse=True),
]

# ------------------------------------------------------------------ chargeback, config, db
CASES += [
    Case("chargeback --month 2026-13", USAGE),
    Case("chargeback --month garbage", USAGE),
    Case("chargeback --month 99999-01", USAGE),
    Case("chargeback --void 2026-13 --reason x", USAGE),
    Case("chargeback --month 2026-10 --output /nonexistent/dir/x.csv", ENV),
    Case("chargeback --format xml", USAGE, argparse=True),
    Case("check-config {dir}/bad.toml", USAGE),
    Case("check-config {dir}/unknown-key.toml", USAGE),
    Case("db upgrade --force", USAGE, argparse=True),
    Case("db nosuch", USAGE, argparse=True),
    Case("db", USAGE, argparse=True),
]


@pytest.fixture
def run_cli(engine: Engine, database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Run `slurmtel ...` in-process against the test database as an admin."""
    config_file = tmp_path / "slurmtel.toml"
    config_file.write_text('[site]\ntimezone = "Europe/Berlin"\ncluster = "c1"\n')
    (tmp_path / "capture.txt").write_text("job_id|state\n1|COMPLETED\n")
    (tmp_path / "bad.toml").write_text("[site\ntimezone = \n")
    (tmp_path / "unknown-key.toml").write_text("[site]\nno_such_key = 1\n")
    monkeypatch.setenv("SLURMTEL_DATABASE_URL", database_url)
    monkeypatch.setattr("slurmtel.commands.common.utc_now", lambda: NOW)
    monkeypatch.setattr("slurmtel.sources.base.utc_now", lambda: NOW)
    monkeypatch.setattr("slurmtel.commands.common.current_identity", lambda config: ADMIN)

    def run(argv: str) -> int:
        words = argv.format(dir=tmp_path, file=tmp_path / "capture.txt").split()
        try:
            return main(["--config", str(config_file), "--log-level", "ERROR", *words])
        except SystemExit as exc:
            return int(exc.code or 0)

    return run


@pytest.mark.parametrize("case", CASES, ids=[c.argv for c in CASES])
def test_bad_value_is_one_line(case: Case, run_cli, capsys: pytest.CaptureFixture[str]) -> None:
    rc = run_cli(case.argv)
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    lines = err.strip().splitlines()
    assert rc == case.rc, f"exit {rc}, stderr: {err!r}"
    if case.argparse:
        assert lines[0].startswith("usage: slurmtel"), err
        assert ": error: " in lines[-1], err
    else:
        assert len(lines) == 1, f"expected one line on stderr, got: {err!r}"
        assert lines[0].startswith("slurmtel: "), err
        assert "internal error" not in lines[0], err


@pytest.fixture
def run_cli_embedded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Run `slurmtel ...` in-process as an admin with no database URL configured: a command
    that opened its database would start the embedded PostgreSQL under STATE."""
    state = tmp_path / "state"
    config_file = tmp_path / "slurmtel.toml"
    config_file.write_text(f'[site]\ntimezone = "Europe/Berlin"\ncluster = "c1"\nstate_dir = "{state}"\n')
    (tmp_path / "capture.txt").write_text("job_id|state\n1|COMPLETED\n")
    (tmp_path / "bad.toml").write_text("[site\ntimezone = \n")
    (tmp_path / "unknown-key.toml").write_text("[site]\nno_such_key = 1\n")
    monkeypatch.delenv("SLURMTEL_DATABASE_URL", raising=False)
    monkeypatch.setattr("slurmtel.commands.common.utc_now", lambda: NOW)
    monkeypatch.setattr("slurmtel.sources.base.utc_now", lambda: NOW)
    monkeypatch.setattr("slurmtel.commands.common.current_identity", lambda config: ADMIN)

    def run(argv: str) -> int:
        words = argv.format(dir=tmp_path, file=tmp_path / "capture.txt").split()
        try:
            return main(["--config", str(config_file), "--log-level", "ERROR", *words])
        except SystemExit as exc:
            return int(exc.code or 0)

    run.state = state  # type: ignore[attr-defined]
    return run


@pytest.mark.parametrize("case", CASES, ids=[c.argv for c in CASES])
def test_bad_value_is_refused_before_any_database_is_started(
    case: Case, run_cli_embedded, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every value is checked before the command opens its database: with no database URL, the
    refused command has not started the embedded PostgreSQL (its state directory, where
    pgserver makes pgdata first, is not there), and answers as it does with a database."""
    rc = run_cli_embedded(case.argv)
    err = capsys.readouterr().err
    assert rc == case.rc, f"exit {rc}, stderr: {err!r}"
    assert not run_cli_embedded.state.exists(), f"{case.argv}: the embedded PostgreSQL was started"


def test_unreachable_database_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    config_file = tmp_path / "slurmtel.toml"
    config_file.write_text('[site]\ntimezone = "Europe/Berlin"\n')
    monkeypatch.setenv("SLURMTEL_DATABASE_URL", "postgresql://nobody@127.0.0.1:1/none?connect_timeout=2")
    monkeypatch.setattr("slurmtel.commands.common.current_identity", lambda config: ADMIN)
    rc = main(["--config", str(config_file), "--log-level", "ERROR", "runs"])
    err = capsys.readouterr().err
    assert rc == ENV
    assert len(err.strip().splitlines()) == 1 and err.startswith("slurmtel: "), err


# ------------------------------------------------------------------ --plot formats

MAGIC = {"png": b"\x89PNG\r\n\x1a\n", "pdf": b"%PDF", "svg": b"<?xml"}


@pytest.mark.parametrize("fmt", sorted(MAGIC))
def test_plot_writes_the_format_its_extension_names(fmt: str, tmp_path: Path) -> None:
    from zoneinfo import ZoneInfo

    from slurmtel.reports.plot import GpuSeries, SeriesPoint, plot_job

    points = [SeriesPoint(NOW, 60.0, 50.0, 2**30, 200.0), SeriesPoint(NOW.replace(minute=1), 60.0, 0.0)]
    path = tmp_path / f"job.{fmt.upper() if fmt == 'pdf' else fmt}"
    plot_job([GpuSeries("n1/0", points)], path, title="Job 1", zone=ZoneInfo("Europe/Berlin"))
    data = path.read_bytes()
    assert data.startswith(MAGIC[fmt])
    if fmt == "svg":
        assert b"<svg" in data


@pytest.mark.parametrize("name", ["job.jpg", "job", "job.png.txt"])
def test_plot_refuses_other_extensions(name: str, tmp_path: Path) -> None:
    from zoneinfo import ZoneInfo

    from slurmtel.reports.plot import plot_job

    with pytest.raises(ValueError, match=r"\.png, \.svg or \.pdf"):
        plot_job([], tmp_path / name, title="Job 1", zone=ZoneInfo("UTC"))
    assert not (tmp_path / name).exists()


@pytest.mark.parametrize("name", ["x.jpg", "x"])
def test_job_plot_with_another_extension_does_no_work(
    name: str, run_cli, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run_cli(f"job 1 --plot {{dir}}/{name}") == USAGE
    out, err = capsys.readouterr()
    assert out == ""  # refused before the job view was printed
    assert err.strip() == f"slurmtel: --plot {tmp_path / name}: the file name must end in .png, .svg, .pdf"
