"""Real Slurm 22.05, 24.11 and 26.05 output (tests/fixtures/sacct/slurm-*/, captured by the
labs, PROVENANCE.md): windows without jobs, jobs that never started, a newer data_parser, and
captures of the same jobs taken in any order.

The oracle is each capture's own `sacct` text view (`*.txt`, the same window), read here by
its column widths, and the capture notes in PROVENANCE.md.
"""

from __future__ import annotations

import json
import logging
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import Engine, text

from slurmtel.cli import main
from slurmtel.config import config_from_dict
from slurmtel.metrics import DaemonMetrics
from slurmtel.parsers.sacct_json import parse_sacct_json
from slurmtel.parsers.sacct_parsable import SACCT_DELIMITER, parse_sacct_parsable
from slurmtel.parsers.slurm_common import gpu_count, normalize_state, parse_tres_string
from slurmtel.records import JobAttempt, Rejected, SchemaNotice
from slurmtel.scheduler import Schedule
from slurmtel.sources.base import RunContext
from tests.conftest import fixture_path
from tests.test_daemon import command, fake_sacct

VERSIONS = ("22.05", "24.11", "26.05")
SCHEMAS = {"22.05": "openapi/dbv0.0.38", "24.11": "data_parser/v0.0.42", "26.05": "data_parser/v0.0.45"}


def capture(version: str, name: str) -> Path:
    return fixture_path("sacct", f"slurm-{version}", name)


def json_records(path: Path) -> list[Any]:
    return parse_sacct_json(path.read_bytes(), origin=path.name)


def psv_records(path: Path) -> list[Any]:
    return parse_sacct_parsable(path.read_text(), origin=path.name, delimiter=SACCT_DELIMITER)


def attempts(records: list[Any]) -> list[JobAttempt]:
    assert not [r for r in records if isinstance(r, Rejected)], [
        r.reason for r in records if isinstance(r, Rejected)
    ]
    return [r for r in records if isinstance(r, JobAttempt)]


def sacct_text(path: Path) -> list[dict[str, str]]:
    """sacct's fixed-width text view: one dict per row, keyed by the header's names."""
    header, dashes, *lines = path.read_text().splitlines()
    spans, at = [], 0
    for dash in dashes.split(" "):
        spans.append((at, at + len(dash)))
        at += len(dash) + 1
    names = [header[a:b].strip() for a, b in spans]
    return [
        {n: line[a:b].strip() for n, (a, b) in zip(names, spans, strict=True)}
        for line in lines
        if line.strip()
    ]


def at_text(value: str) -> datetime | None:
    return None if value in ("None", "Unknown", "") else datetime.fromisoformat(value).replace(tzinfo=UTC)


def view(a: JobAttempt, version: str) -> tuple[Any, ...]:
    # 22.05's JSON says exit_code 0 (SUCCESS) for a job whose launch failed with 2:0 (its text
    # view and -P say 2:0): each output is read as it says it, so the exit code is not compared
    exit_code = a.exit_code if version != "22.05" else ""
    nodes = a.nodelist or "None assigned"
    return (a.job_id, a.job_id_raw, a.state, exit_code, a.start_at, a.end_at, a.alloc_gpus, nodes)


def text_view(row: dict[str, str], version: str) -> tuple[Any, ...]:
    return (
        row["JobID"],
        int(row["JobIDRaw"]),
        normalize_state(row["State"]),
        row["ExitCode"] if version != "22.05" else "",
        at_text(row["Start"]),
        at_text(row["End"]),
        gpu_count(parse_tres_string(row["AllocTRES"])),
        row["NodeList"],
    )


# ------------------------------------------------------------------ a window without jobs


@pytest.mark.parametrize("version", VERSIONS)
def test_an_empty_window_is_an_empty_result(version: str) -> None:
    path = capture(version, "sacct-empty-window.json")
    doc = json.loads(path.read_text())
    if version == "22.05":
        # 22.05 says "Nothing found" (error 9003) beside the empty list: not a failure
        assert [e["error_number"] for e in doc["errors"]] == [9003]
    records = json_records(path)
    assert [r for r in records if not isinstance(r, SchemaNotice)] == []
    assert psv_records(capture(version, "sacct-empty-window-slurmtel-P.psv")) == []


def test_real_errors_beside_no_jobs_stay_errors() -> None:
    from slurmtel.errors import ParseError

    doc = json.loads(capture("22.05", "sacct-empty-window.json").read_text())
    doc["errors"] = [{"description": "Unable to connect to database", "error_number": 7000, "error": "x"}]
    with pytest.raises(ParseError, match="Unable to connect to database"):
        parse_sacct_json(json.dumps(doc))
    # and one real error beside "Nothing found" is a failure too
    doc["errors"].append({"description": "Nothing found", "error_number": 9003})
    with pytest.raises(ParseError, match="sacct reported errors"):
        parse_sacct_json(json.dumps(doc))


def cli(config: Path, *args: str) -> int:
    return main(["--config", str(config), *args])


def config_file(tmp_path: Path, database_url: str, **sacct: Any) -> Path:
    lines = [f'[site]\ncluster = "lab"\nstate_dir = "{tmp_path}"\n[database]\nurl = "{database_url}"']
    if sacct:
        lines.append("[sources.sacct]\n" + "\n".join(f"{k} = {json.dumps(v)}" for k, v in sacct.items()))
    path = tmp_path / "slurmtel.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize("version", VERSIONS)
def test_collect_of_an_empty_window_succeeds_and_moves_the_cursor(
    version: str, engine: Engine, database_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    empty = capture(version, "sacct-empty-window.json")
    config = config_file(tmp_path, database_url)
    assert cli(config, "collect", "sacct", "--input", str(empty)) == 0
    command, _ = fake_sacct(tmp_path, empty)
    config = config_file(tmp_path, database_url, command=command)
    assert cli(config, "collect", "sacct", "--once") == 0
    assert "parse_error" not in capsys.readouterr().err
    with engine.connect() as conn:
        statuses = conn.execute(text("SELECT status FROM collect_run ORDER BY id")).scalars().all()
        cursor = conn.execute(text("SELECT cursor_at FROM source_cursor WHERE source = 'sacct'")).scalar()
    assert statuses == ["ok", "ok"]
    assert cursor is not None


# ------------------------------------------------------------------ jobs that never started


@pytest.mark.parametrize("version", VERSIONS)
def test_jobs_that_never_started_are_read_with_no_start(version: str) -> None:
    path = capture(version, "sacct-D-X-j-never-started.json")
    raw = json.loads(path.read_text())
    starts = {job["time"]["start"] for job in raw["jobs"]}
    if version in ("24.11", "26.05"):
        # what Slurm writes: NO_VAL (32-bit) as the start, {"set": false} task ids
        assert starts == {4294967294}
        assert any(
            job["array"]["task_id"] == {"set": False, "infinite": False, "number": 0} for job in raw["jobs"]
        )
    for records in (
        json_records(path),
        psv_records(capture(version, "sacct-D-X-j-never-started-slurmtel-P.psv")),
    ):
        found = attempts(records)
        assert len(found) == 4
        for a in found:
            assert (a.state, a.start_at, a.alloc_gpus, a.nodes) == ("CANCELLED", None, 0, ())
            assert a.end_at is not None and a.end_at > a.submit_at
            assert a.array_task_id is None
        # the held job was never eligible either
        assert sorted(a.eligible_at is None for a in found) == [False, False, False, True]


def test_slurm_23_02_unset_numbers_are_not_set() -> None:
    # sarc's real 23.02 capture: {"set": false} task id and het offset, end 0 (running)
    (job,) = attempts(json_records(fixture_path("sacct", "sarc", "sacct_json_slurm_23_2_6.json")))
    assert (job.array_job_id, job.array_task_id, job.het_job_id, job.het_job_offset, job.end_at) == (
        None,
        None,
        None,
        None,
        None,
    )
    assert job.time_limit_seconds == 7200 * 60


@pytest.mark.parametrize("version", ("24.11", "26.05"))
def test_the_scenario_job_cancelled_while_pending_is_kept(version: str) -> None:
    """gpus4-cancel-pend never started (NO_VAL start): an attempt, not a quarantined record."""
    expected = {
        line.split("\t")[1]: line.split("\t")[4].split(",")
        for line in capture(version, "scenario-jobs.tsv").read_text().splitlines()[1:]
    }
    found = attempts(json_records(capture(version, "scenario-sacct-a-D-X.json")))
    states: dict[str, list[str]] = {}
    for a in sorted(found, key=lambda a: a.submit_at):
        states.setdefault(str(a.array_job_id or a.job_id_raw), []).append(a.state)
    for job_id, wanted in expected.items():
        assert set(states[job_id]) == set(wanted), (job_id, states[job_id], wanted)
    (pend,) = [a for a in found if a.name == "gpus4-cancel-pend"]
    assert (pend.state, pend.start_at, pend.nodes) == ("CANCELLED", None, ())


# ------------------------------------------------------------------ every version, as sacct shows it


@pytest.mark.parametrize(
    ("version", "json_name", "text_name"),
    [
        *((v, "sacct-a-D-X-final.json", "sacct-a-D-X-final.txt") for v in VERSIONS),
        *((v, "scenario-sacct-a-D-X.json", "scenario-sacct-a-D-X.txt") for v in ("24.11", "26.05")),
    ],
)
def test_every_version_reads_as_sacct_shows_it(version: str, json_name: str, text_name: str) -> None:
    records = json_records(capture(version, json_name))
    notices = [(n.schema, n.read_as) for n in records if isinstance(n, SchemaNotice)]
    # 26.05 is newer than every schema slurmtel knows: read by the newest one, with a notice
    assert notices == ([("data_parser/v0.0.45", "data_parser/v0.0.44")] if version == "26.05" else [])
    assert json.loads(capture(version, json_name).read_text())["meta"] and SCHEMAS[version]
    got = sorted(view(a, version) for a in attempts(records))
    assert got == sorted(text_view(row, version) for row in sacct_text(capture(version, text_name)))


@pytest.mark.parametrize("version", VERSIONS)
def test_json_and_parsable_give_the_same_attempts(version: str) -> None:
    from_json = attempts(json_records(capture(version, "sacct-a-D-X-final.json")))
    from_psv = attempts(psv_records(capture(version, "sacct-a-D-X-final-slurmtel-P.psv")))

    def key(a: JobAttempt) -> tuple[Any, ...]:
        return (*view(a, version), a.submit_at, a.user, a.account, a.partition, a.alloc_tres.get("gres/gpu"))

    assert sorted(map(key, from_json)) == sorted(map(key, from_psv))
    # -P carries slurmdbd's job_db_inx, beyond bigint from 24.11 on
    assert all(a.db_index is not None for a in from_psv)


def metric_samples(metrics: DaemonMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(generate_latest(metrics.registry).decode())
        for s in family.samples
    }


def source_run_lines(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if getattr(r, "event", None) == "source_run"]


def test_the_newer_schema_is_counted_in_the_daemon_metric(
    ctx: RunContext, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    command, _ = fake_sacct(tmp_path, capture("26.05", "sacct-a-D-X-final.json"))
    config = config_from_dict(
        {
            "sources": {"sacct": {"command": command}, "slurmctld": {"enabled": False}},
            "attribution": {"enabled": False},
        }
    )
    c = replace(ctx, config=config)
    metrics = DaemonMetrics(["sacct"])
    schedule = Schedule(c, metrics)
    schedule.run_job("source:sacct")
    key = ("slurmtel_schema_unknown_total", (("schema", "data_parser/v0.0.45"), ("source", "sacct")))
    assert metric_samples(metrics)[key] == 1.0
    with c.engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM job_attempt")).scalar_one() == 12
        assert conn.execute(text("SELECT status FROM collect_run")).scalar_one() == "ok"
    # the run is ok, yet its log line is a WARNING that names the version and how it was read
    (line,) = source_run_lines(caplog)
    fields = line.fields  # type: ignore[attr-defined]
    assert (line.levelno, fields["status"], fields["unknown_schemas"]) == (
        logging.WARNING,
        "ok",
        "data_parser/v0.0.45",
    )
    assert "read data_parser/v0.0.45 by the newest known shape data_parser/v0.0.44" in fields["message"]
    assert any(
        r.levelno == logging.WARNING
        and "'data_parser/v0.0.45' is not one this slurmtel knows" in r.getMessage()
        for r in caplog.records
    )


def test_a_known_schema_run_logs_at_info(
    ctx: RunContext, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    command, _ = fake_sacct(tmp_path, capture("24.11", "sacct-a-D-X-final.json"))
    config = config_from_dict(
        {
            "sources": {"sacct": {"command": command}, "slurmctld": {"enabled": False}},
            "attribution": {"enabled": False},
        }
    )
    Schedule(replace(ctx, config=config), DaemonMetrics(["sacct"])).run_job("source:sacct")
    (line,) = source_run_lines(caplog)
    assert line.levelno == logging.INFO
    assert "unknown_schemas" not in line.fields  # type: ignore[attr-defined]


def test_collect_input_of_the_newer_schema_warns_on_the_cli(
    engine: Engine, database_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = config_file(tmp_path, database_url)
    assert cli(config, "collect", "sacct", "--input", str(capture("26.05", "sacct-a-D-X-final.json"))) == 0
    out = capsys.readouterr().out
    assert (
        "warning: 1 sacct output(s) in schema 'data_parser/v0.0.45', which this slurmtel does not know: "
        "read as data_parser/v0.0.44, the newest it knows"
    ) in out
    # a known one says nothing of the kind
    assert cli(config, "collect", "sacct", "--input", str(capture("24.11", "sacct-a-D-X-final.json"))) == 0
    assert "does not know" not in capsys.readouterr().out


# ------------------------------------------------------------------ the controller's JSON, 24.11 and 26.05


def controller(version: str, name: str) -> Path:
    return fixture_path("slurmctld", f"slurm-{version}", name)


@pytest.mark.parametrize("version", ("24.11", "26.05"))
def test_collect_input_of_the_controller_view_of_each_version(
    version: str, engine: Engine, database_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = config_file(tmp_path, database_url)
    code = cli(
        config,
        "collect",
        "slurmctld",
        "--input",
        str(controller(version, "squeue-running.json")),
        "--nodes-input",
        str(controller(version, "scontrol-show-node-d-running.txt")),
        "--at",
        "2026-12-03T14:05:00",
    )
    out = capsys.readouterr().out
    assert code == 0, out
    # 8 GPU indices held by 6 jobs (see test_parse_slurmctld's 24.11/26.05 allocations)
    assert "lab: 8 GPUs held by 6 running jobs, 4 pending jobs, 2 nodes; 0 quarantined" in out
    warning = (
        "schema 'data_parser/v0.0.45', which this slurmtel does not know: read as data_parser/v0.0.44, "
        "the newest it knows"
    )
    assert (warning in out) == (version == "26.05")
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM gpu_allocation")).scalar_one() == 8
        assert conn.execute(text("SELECT status FROM collect_run")).scalar_one() == "ok"


def test_the_newer_controller_schema_is_counted_and_logged_by_the_daemon(
    ctx: RunContext, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    squeue = command(tmp_path, "squeue", f"cat '{controller('26.05', 'squeue-a-running.json')}'\n")
    scontrol = command(
        tmp_path,
        "scontrol",
        f"""case "$2" in
config) cat '{controller("26.05", "scontrol-show-config.txt")}' ;;
node) cat '{controller("26.05", "scontrol-show-node-d-running.txt")}' ;;
*) echo "unexpected: $*" >&2; exit 1 ;;
esac
""",
    )
    config = config_from_dict(
        {
            "sources": {
                "sacct": {"enabled": False},
                "slurmctld": {"squeue_command": squeue, "scontrol_command": scontrol},
            },
            "attribution": {"enabled": False},
        }
    )
    metrics = DaemonMetrics(["slurmctld"])
    Schedule(replace(ctx, config=config), metrics).run_job("source:slurmctld")
    key = ("slurmtel_schema_unknown_total", (("schema", "data_parser/v0.0.45"), ("source", "slurmctld")))
    assert metric_samples(metrics)[key] == 1.0
    (line,) = source_run_lines(caplog)
    fields = line.fields  # type: ignore[attr-defined]
    assert (line.levelno, fields["status"], fields["unknown_schemas"]) == (
        logging.WARNING,
        "ok",
        "data_parser/v0.0.45",
    )
    with ctx.engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM gpu_allocation")).scalar_one() == 8
        assert conn.execute(text("SELECT status FROM collect_run")).scalar_one() == "ok"


# ------------------------------------------------------------------ the newest state wins


def snapshot(engine: Engine) -> list[tuple[Any, ...]]:
    with engine.connect() as conn:
        return [
            tuple(r)
            for r in conn.execute(
                text(
                    "SELECT cluster, job_id_raw, submit_at, job_id, name, state, state_reason, exit_code, "
                    "eligible_at, start_at, end_at, alloc_gpus, alloc_tres, nodelist, nodes, time_limit_seconds, "
                    "job_submit_at, attempt_number, updated_at FROM job_attempt ORDER BY 1, 2, 3"
                )
            )
        ]


@pytest.mark.parametrize("version", VERSIONS)
def test_a_final_view_then_an_older_one_leaves_identical_rows(
    version: str, engine: Engine, database_url: str, tmp_path: Path
) -> None:
    final, running = capture(version, "sacct-a-D-X-final.json"), capture(version, "sacct-a-D-X-running.json")
    config = config_file(tmp_path, database_url)
    assert cli(config, "collect", "sacct", "--input", str(final)) == 0
    after_final = snapshot(engine)
    assert any(row[5] == "COMPLETED" for row in after_final)
    # the earlier capture (jobs still RUNNING and PENDING) comes later: nothing moves back
    assert cli(config, "collect", "sacct", "--input", str(running)) == 0
    assert snapshot(engine) == after_final
    # and in the daemon's own path, the older view fetched later than the final one
    for path in (final, running):
        command, _ = fake_sacct(tmp_path, path, name=f"sacct-{path.stem}")
        live = config_file(tmp_path, database_url, command=command)
        assert cli(live, "collect", "sacct", "--once", "-S", "2026-12-01", "-E", "2026-12-04") == 0
    rows = snapshot(engine)
    assert [r[:-1] for r in rows] == [r[:-1] for r in after_final]


@pytest.mark.parametrize("version", VERSIONS)
def test_a_running_view_then_the_final_one_ends_the_jobs(
    version: str, engine: Engine, database_url: str, tmp_path: Path
) -> None:
    config = config_file(tmp_path, database_url)
    assert cli(config, "collect", "sacct", "--input", str(capture(version, "sacct-a-D-X-running.json"))) == 0
    running = {r[1]: r[5] for r in snapshot(engine)}
    assert "RUNNING" in running.values()
    assert cli(config, "collect", "sacct", "--input", str(capture(version, "sacct-a-D-X-final.json"))) == 0
    final = [a for a in attempts(json_records(capture(version, "sacct-a-D-X-final.json")))]
    stored = {(r[1], r[2]): r[5] for r in snapshot(engine)}
    for a in final:
        assert stored[(a.job_id_raw, a.submit_at)] == a.state
