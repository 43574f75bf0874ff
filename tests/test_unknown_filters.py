"""Issue 15 item 5: a filter naming a value slurmtel has never seen warns on stderr and exits 0
with the empty result; the check runs in the caller's scope, so it cannot tell a plain user
whether someone else's user or account exists. Also --top 0 and the "Top N" titles."""

from __future__ import annotations

import io

import pytest
from sqlalchemy import Engine, text

from slurmtel.access import Identity, Role
from slurmtel.cli import main
from slurmtel.columns import table_name
from slurmtel.config import Config
from slurmtel.reports.render import for_table, render
from tests.conftest import FIXED_NOW
from tests.factories import load_admin_day
from tests.test_report_admin_cli import WINDOW, Run, as_identity


@pytest.fixture
def run(
    engine: Engine,
    config: Config,
    database_url: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture,
) -> Run:
    """The CLI in process over the admin day (as in test_report_admin_cli), root unless swapped."""
    load_admin_day(engine, config)
    monkeypatch.setenv("SLURMTEL_DATABASE_URL", database_url)
    monkeypatch.delenv("SLURMTEL_CONFIG", raising=False)
    monkeypatch.setattr("slurmtel.commands.common.utc_now", lambda: FIXED_NOW)

    def _run(*argv: str) -> tuple[int, str, str]:
        capsys.readouterr()
        code = main(["--log-level", "WARNING", *argv])
        out, err = capsys.readouterr()
        return code, out, err

    return _run


KINDS = [("-A", "account"), ("-u", "user"), ("-r", "partition"), ("-M", "cluster")]


def known(engine: Engine, column: str) -> str:
    with engine.connect() as conn:
        return str(conn.execute(text(f"SELECT min({column}) FROM job_attempt")).scalar_one())


@pytest.mark.parametrize(("flag", "kind"), KINDS)
def test_every_filter_kind_warns_and_exits_0_with_the_empty_result(run: Run, flag: str, kind: str) -> None:
    code, out, err = run("report", "usage", *WINDOW, flag, "nosuch")
    assert code == 0
    assert "(no rows)" in out
    assert err == f"slurmtel: warning: no such {kind} 'nosuch' in the data\n"


def test_one_line_per_unknown_value_and_none_for_known_ones(run: Run, engine: Engine) -> None:
    account, user = known(engine, "account"), known(engine, "user_name")
    code, _, err = run("report", "usage", *WINDOW, "-A", f"x1,{account},x2", "-u", user)
    assert code == 0
    assert err.splitlines() == [
        "slurmtel: warning: no such account 'x1' in the data",
        "slurmtel: warning: no such account 'x2' in the data",
    ]
    partition, cluster = known(engine, "partition"), known(engine, "cluster")
    code, _, err = run("report", "usage", *WINDOW, "-r", partition, "-M", cluster)
    assert (code, err) == (0, "")


@pytest.mark.parametrize(
    "argv",
    [
        ("failures", "-A", "nosuch"),
        ("idle", "-u", "nosuch"),
        ("queue", "-A", "nosuch"),
        ("retries", "-u", "nosuch"),
        ("taxonomy", "-r", "nosuch"),
        ("nodes", "-M", "nosuch"),
        ("nodes", "--drift", "-r", "nosuch"),
        ("capacity", "-r", "nosuch"),
        ("fabric", "-M", "nosuch"),
        ("fabric", "--nodes", "-r", "nosuch"),
    ],
)
def test_every_report_with_filters_warns(run: Run, argv: tuple[str, ...]) -> None:
    code, _, err = run("report", argv[0], *WINDOW, *argv[1:])
    assert code == 0
    assert "slurmtel: warning: no such " in err and "'nosuch' in the data" in err
    assert len(err.splitlines()) == 1


def test_budget_runs_and_quarantine_warn(run: Run) -> None:
    code, _, err = run("report", "budget", "-A", "nosuch")
    assert code == 0 and err.startswith("slurmtel: warning: no such account 'nosuch' in the data")
    for argv in (("runs", "--source", "nosuch"), ("quarantine", "list", "--source", "nosuch")):
        code, out, err = run(*argv)
        assert code == 0 and "(no rows)" in out
        assert err.startswith("slurmtel: warning: no such source 'nosuch' in the data (known sources: ")
    # a registered source that has not run yet is not unknown
    code, _, err = run("runs", "--source", "nccl")
    assert (code, err) == (0, "")


def test_a_plain_user_learns_nothing_about_users_outside_their_scope(
    run: Run, engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    with engine.connect() as conn:
        users = [r[0] for r in conn.execute(text("SELECT DISTINCT user_name FROM job_attempt ORDER BY 1"))]
    me, other = users[0], users[1]
    as_identity(monkeypatch, Identity(me, Role.USER))
    _, out_other, err_other = run("report", "failures", *WINDOW, "-u", other)
    _, out_none, err_none = run("report", "failures", *WINDOW, "-u", "nosuch")
    # the same answer whether the user exists or not
    assert err_other.replace(other, "X") == err_none.replace("nosuch", "X")
    assert err_none == "slurmtel: warning: no such user 'nosuch' in the data you may see\n"
    assert out_other == out_none
    # their own name is known
    code, _, err = run("report", "failures", *WINDOW, "-u", me)
    assert (code, err) == (0, "")


# ------------------------------------------------------------------------ --top and titles


def test_top_titles_say_what_is_shown(run: Run, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run("report", "failures", *WINDOW, "--top", "1000")
    assert code == 0
    assert "Top 1000" not in out and "attempts by failed GPU-hours" in out
    code, out, _ = run("report", "idle", "-S", "2030-01-01", "-E", "2030-01-02")
    assert code == 0 and "No jobs with idle GPU-hours" in out and "Top 10" not in out
    for report in ("failures", "idle"):
        with pytest.raises(SystemExit) as exited:
            run("report", report, *WINDOW, "--top", "0")
        assert exited.value.code == 2 and "--top: must be between 1 and" in capsys.readouterr().err


# ------------------------------------------------------------------------ hours in tables


def test_tables_convert_units_in_one_place_and_data_formats_keep_them() -> None:
    assert table_name("queue_wait_p50_seconds") == "queue_wait_p50_hours"
    assert table_name("completed_gpu_seconds") == "completed_gpu_hours"
    assert table_name("idle_share") == "idle_percent"
    assert table_name("jobs") == "jobs"
    rows = [
        {"account": "a", "failed_gpu_seconds": 728580, "queue_wait_p50_seconds": None, "idle_share": 0.4312}
    ]
    columns = ["account", "failed_gpu_seconds", "queue_wait_p50_seconds", "idle_share"]
    table = io.StringIO()
    render(rows, table, "table", columns=columns)
    header, line = table.getvalue().splitlines()
    assert header.split() == ["account", "failed_gpu_hours", "queue_wait_p50_hours", "idle_percent"]
    assert line.split() == ["a", "202.3833", "43.1"]
    data = io.StringIO()
    render(rows, data, "csv", columns=["account", "failed_gpu_seconds", "idle_share"])
    assert data.getvalue() == "account,failed_gpu_seconds,idle_share\na,728580,0.4312\n"
    # a figure/value table converts each value by the column its figure names
    converted, cols = for_table([{"figure": "idle_gpu_seconds", "value": 7200}], ["figure", "value"])
    assert cols == ["figure", "value"] and converted == [{"figure": "idle_gpu_hours", "value": 2.0}]
