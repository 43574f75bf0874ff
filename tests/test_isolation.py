"""One bad record never costs the rest of its batch (issue: per-record isolation everywhere).

Each cause seen in the field, on real captures: a value beyond its column (GPU count, uid,
array task id, het offset beyond int4; a job id beyond int8; an agent sample_count beyond
int4; a dcgm `gpu` label beyond int4), a non-string where text goes (`qos: true`), an unpaired
`\\ud800`, 1000-deep nesting, a byte that is not UTF-8 in a `-P` field or its header, a NUL in a
record that is then quarantined, a clock years off. The record is refused by name (field,
value, job) and quarantined with its raw text; every other record is stored; the run records
its end; the output holds no traceback.
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
import pytest
from sqlalchemy import Engine, text

from slurmtel.agent.protocol import encode_summaries_response, record_to_json
from slurmtel.cli import main
from slurmtel.errors import ParseError
from slurmtel.parsers.slurmctld import parse_squeue_json, squeue_json_unavailable
from slurmtel.records import Rejected
from slurmtel.store.checks import record_problem
from slurmtel.store.jobs import ATTEMPT_FIELDS, write_attempts
from slurmtel.store.quarantine import list_quarantine, quarantine
from slurmtel.store.telemetry import SUMMARY_COLUMNS, existing_partitions, write_summaries
from slurmtel.store.text import MAX_STORED_CHARS, storable_text
from tests.conftest import FIXED_NOW, fixture_path
from tests.factories import attempt, windows

LAB = fixture_path("sacct", "slurm-24.11", "sacct-a-D-X-final.json")
PSV = fixture_path("sacct", "slurm-24.11", "sacct-a-D-X-final-slurmtel-P.psv")
DCGM = fixture_path("dcgm", "datadog_dcgm", "metrics.txt")


@pytest.fixture
def config_path(engine: Engine, database_url: str, tmp_path: Path) -> Path:
    path = tmp_path / "slurmtel.toml"
    path.write_text(
        f'[site]\ncluster = "lab"\nstate_dir = "{tmp_path}"\n[database]\nurl = "{database_url}"\n'
    )
    return path


def run(config: Path, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    capsys.readouterr()
    code = main(["--config", str(config), *args])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err, err
    return code, out + err


def query(engine: Engine, sql: str) -> list[tuple[Any, ...]]:
    with engine.connect() as conn:
        return [tuple(r) for r in conn.execute(text(sql))]


def lab_doc() -> dict[str, Any]:
    return orjson.loads(LAB.read_bytes())


def job_ids(doc: dict[str, Any]) -> set[int]:
    return {job["job_id"] for job in doc["jobs"]}


# ------------------------------------------------------------------ values no column can hold


@pytest.mark.parametrize(
    ("change", "field", "value"),
    [
        (lambda j: j["tres"]["allocated"].append({"type": "gres", "name": "gpu", "id": 1001, "count": 2**31}), "alloc_gpus", 2**31),
        (lambda j: j.__setitem__("uid", 2**31), "uid", 2**31),
        (lambda j: j.__setitem__("array", {"job_id": 35, "task_id": {"set": True, "infinite": False, "number": 2**31}}), "array_task_id", 2**31),
        (lambda j: j.__setitem__("het", {"job_id": 35, "job_offset": {"set": True, "infinite": False, "number": 2**31}}), "het_job_offset", 2**31),
        (lambda j: j.__setitem__("job_id", 2**63), "job_id_raw", 2**63),
        (lambda j: j.__setitem__("qos", True), "qos", True),
    ],
    ids=["gpu_count", "uid", "array_task_id", "het_offset", "job_id", "qos_true"],
)  # fmt: skip
def test_a_sacct_job_no_column_can_hold_is_refused_by_name(
    config_path: Path,
    engine: Engine,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    change: Any,
    field: str,
    value: Any,
) -> None:
    doc = lab_doc()
    victim = doc["jobs"][0]
    victim_id = victim["job_id"]
    victim["tres"]["allocated"] = [t for t in victim["tres"]["allocated"] if t["type"] != "gres"]
    change(victim)
    capture = tmp_path / "sacct.json"
    capture.write_bytes(orjson.dumps(doc))
    code, output = run(config_path, capsys, "collect", "sacct", "--input", str(capture))
    assert code == 3, output
    stored = {r[0] for r in query(engine, "SELECT job_id_raw FROM job_attempt")}
    assert stored == job_ids(lab_doc()) - {victim_id}
    ((key, reason, raw),) = query(engine, "SELECT record_key, reason, raw FROM quarantine")
    assert key.startswith("job ") and f"{field} is " in reason and repr(value) in reason, reason
    assert json.loads(raw)["name"] == victim["name"]
    assert query(engine, "SELECT status FROM collect_run") == [("partial",)]


def test_the_store_checks_every_field_against_its_column() -> None:
    # the one check: every integer against its column's width, text that is text
    ok = attempt(job_id_raw=1)
    assert record_problem(ok, ATTEMPT_FIELDS) is None
    assert record_problem(attempt(uid=2**31 - 1), ATTEMPT_FIELDS) is None
    assert (
        record_problem(attempt(uid=2**31), ATTEMPT_FIELDS)
        == "uid is 2147483648, beyond int4 (-2147483648 .. 2147483647)"
    )
    assert record_problem(attempt(time_limit_seconds=2**63), ATTEMPT_FIELDS).startswith(
        "time_limit_seconds is"
    )  # type: ignore[union-attr]
    assert (
        record_problem(attempt(name="a\ud800"), ATTEMPT_FIELDS)
        == "name holds b'\\xed\\xa0\\x80', which is not text"
    )
    assert (
        record_problem(attempt(nodes=("gpu01", 3)), ATTEMPT_FIELDS)
        == "nodes has an item that is int 3, not text"
    )  # type: ignore[arg-type]
    assert record_problem(attempt(alloc_tres={"gres/gpu": 2**64}), ATTEMPT_FIELDS).startswith("alloc_tres")  # type: ignore[union-attr]
    assert record_problem(attempt(db_index=2**64 - 2), ATTEMPT_FIELDS) is None
    big = windows("GPU-0", FIXED_NOW, 1)[0]
    from dataclasses import replace

    assert record_problem(replace(big, sample_count=2**32), SUMMARY_COLUMNS) == (
        "sample_count is 4294967296, beyond int4 (-2147483648 .. 2147483647)"
    )
    assert (
        record_problem(replace(big, covered_seconds=1e39), SUMMARY_COLUMNS)
        == "covered_seconds is 1e+39, too large for float4"
    )


def test_nul_and_unpaired_surrogates_never_fail_the_quarantine(engine: Engine) -> None:
    huge = "x" * (3 * MAX_STORED_CHARS)
    bad = [
        Rejected("sacct", "f\x00.json", "job \ud800", "reason\x00", '{"name": "a\x00b"}'),
        Rejected("sacct", "f.json", "job 2", "not UTF-8", "name \udcff\udcfe end"),
        Rejected("sacct", "f.json", "job 3", "huge", huge),
    ]
    with engine.begin() as conn:
        quarantine(conn, bad)
        quarantine(conn, bad)  # seen again: counted, not stored twice
    with engine.connect() as conn:
        stored = {r.record_key: r for r in list_quarantine(conn)}
    assert (
        stored["job \\ud800"].raw == '{"name": "a\\x00b"}' and stored["job \\ud800"].reason == "reason\\x00"
    )
    assert stored["job 2"].raw == "name \\xff\\xfe end"
    assert stored["job 3"].raw.startswith("x" * 100) and stored["job 3"].raw.endswith(
        f"... [{2 * MAX_STORED_CHARS} more characters]"
    )
    assert {r.seen_count for r in stored.values()} == {2}
    assert storable_text(b"\xff") == "\\xff"


def test_a_nul_record_that_is_quarantined_is_stored_escaped(
    config_path: Path, engine: Engine, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    doc = lab_doc()
    doc["jobs"][1]["name"] = "train\x00v2"
    doc["jobs"][1]["qos"] = 7  # not text: refused, and its raw text (with the NUL) quarantined
    capture = tmp_path / "sacct.json"
    capture.write_bytes(orjson.dumps(doc))
    code, _ = run(config_path, capsys, "collect", "sacct", "--input", str(capture))
    assert code == 3
    ((reason, raw),) = query(engine, "SELECT reason, raw FROM quarantine")
    # the NUL kept, escaped (the raw text is the record as JSON)
    assert "qos is int 7" in reason and "train\\u0000v2" in raw


def test_an_unpaired_surrogate_and_deep_nesting_cost_one_job_each(
    config_path: Path, engine: Engine, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    doc = lab_doc()
    doc["jobs"][0]["name"] = "SURROGATE"
    doc["jobs"][1]["comment"] = "DEEP"
    raw = (
        orjson.dumps(doc)
        .replace(b'"SURROGATE"', b'"train\\ud800"')
        .replace(b'"DEEP"', b"[" * 1000 + b"]" * 1000)
    )
    capture = tmp_path / "sacct.json"
    capture.write_bytes(raw)
    code, _ = run(config_path, capsys, "collect", "sacct", "--input", str(capture))
    assert code == 3
    stored = {r[0] for r in query(engine, "SELECT job_id_raw FROM job_attempt")}
    assert stored == job_ids(doc) - {doc["jobs"][0]["job_id"], doc["jobs"][1]["job_id"]}
    reasons = sorted(r[0] for r in query(engine, "SELECT reason FROM quarantine"))
    assert any("name holds" in r for r in reasons) and any("nested too deeply" in r for r in reasons), reasons


# ------------------------------------------------------------------ sacct -P


def test_a_byte_that_is_not_utf8_in_a_p_field_keeps_the_attempt(
    config_path: Path, engine: Engine, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    lines = PSV.read_bytes().split(b"\n")
    lines[1] = lines[1].replace(b"run-gpu2", b"run-gpu\xff2")
    capture = tmp_path / "sacct.psv"
    capture.write_bytes(b"\n".join(lines).replace(b"\x1f", b"|"))
    code, output = run(config_path, capsys, "collect", "sacct", "--input", str(capture))
    assert code == 0, output
    names = {r[0] for r in query(engine, "SELECT name FROM job_attempt")}
    assert "run-gpu\ufffd2" in names and len(names) == 9  # every job of the capture (run-het has two)
    assert query(engine, "SELECT status FROM collect_run") == [("ok",)]


def test_a_byte_that_is_not_utf8_in_a_p_header_is_a_clear_error_and_the_run_ends(
    config_path: Path, engine: Engine, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    raw = PSV.read_bytes().replace(b"\x1f", b"|").replace(b"Submit", b"Sub\xffmit", 1)
    capture = tmp_path / "sacct.psv"
    capture.write_bytes(raw)
    code, output = run(config_path, capsys, "collect", "sacct", "--input", str(capture))
    assert code == 1 and "lacks column(s) Submit" in output, output
    # the run is recorded as an error, not left 'running'
    assert query(engine, "SELECT status, error_kind FROM collect_run") == [("error", "parse_error")]


# ------------------------------------------------------------------ telemetry


def test_a_dcgm_gpu_label_beyond_int4_costs_that_gpu_its_inventory_only(
    config_path: Path, engine: Engine, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # the capture's three GPUs (two of them lines DataDog added) all say gpu="0"
    uuids = set(re.findall(r'UUID="([^"]+)"', DCGM.read_text()))
    scrape = tmp_path / "metrics.txt"
    scrape.write_text(DCGM.read_text().replace('gpu="0"', 'gpu="2147483648"'))
    code, output = run(
        config_path, capsys, "collect", "dcgm", "--input", str(scrape), "--node", "gpu01", "--at", "now"
    )
    assert code == 3, output
    # every GPU's window is stored; no inventory row holds an index no column can hold
    assert query(engine, "SELECT count(*) FROM gpu_summary") == [(len(uuids),)]
    assert query(engine, "SELECT count(*) FROM gpu_inventory") == [(0,)]
    refused = query(engine, "SELECT record_key, reason FROM quarantine ORDER BY record_key")
    assert [key for key, _ in refused] == [f"gpu {u}" for u in sorted(uuids)]
    assert {reason for _, reason in refused} == {
        "cannot be stored: index is 2147483648, beyond int4 (-2147483648 .. 2147483647)"
    }


def page(records: list[Any], *, tweak: dict[int, dict[str, Any]]) -> bytes:
    items = []
    for seq, record in enumerate(records, start=1):
        data = json.loads(record_to_json(record))
        data.update(tweak.get(seq, {}))
        items.append((seq, "summary", json.dumps(data)))
    return encode_summaries_response(
        node="gpu01", agent_version="t", items=items, next_cursor=len(items), evicted_total=0,
        spool_items=len(items), spool_bytes=1, spool_id="s",
    )  # fmt: skip


def test_an_agent_page_keeps_all_but_its_bad_windows(
    config_path: Path, engine: Engine, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from datetime import UTC, datetime

    now = datetime.now(UTC).replace(microsecond=0)
    records = windows("GPU-0", now - timedelta(hours=1), 10)
    raw = page(
        records,
        tweak={
            2: {"sample_count": 2**32},
            # a node whose clock is ten years ahead: no partition for 2036, the page still stored
            5: {"window_start_at": (now + timedelta(days=3650)).isoformat().replace("+00:00", "Z")},
        },
    )
    capture = tmp_path / "page.json"
    capture.write_bytes(raw)
    with engine.connect() as conn:
        before = len(existing_partitions(conn))
    code, output = run(config_path, capsys, "collect", "agent", "--input", str(capture))
    assert code == 3, output
    assert query(engine, "SELECT count(*) FROM gpu_summary") == [(8,)]
    reasons = sorted(r[0] for r in query(engine, "SELECT reason FROM quarantine"))
    assert reasons[0].startswith("cannot be stored: sample_count is 4294967296, beyond int4")
    assert reasons[1].startswith("clock skew: its window starts at 2036-")
    with engine.connect() as conn:
        assert len(existing_partitions(conn)) <= before + 1


def test_the_store_refuses_windows_by_name_and_keeps_the_rest(engine: Engine) -> None:
    from dataclasses import replace

    good = windows("GPU-0", FIXED_NOW - timedelta(hours=1), 3)
    bad = replace(good[1], sample_count=2**32)
    with engine.begin() as conn:
        stats = write_summaries(conn, [good[0], bad, good[2]], source="agent", node="gpu01")
    assert (stats.received, stats.inserted) == (3, 2)
    ((record, reason),) = stats.refused
    assert record is bad and reason.startswith("sample_count is 4294967296")


def test_attempts_refused_by_the_store_leave_the_others(engine: Engine) -> None:
    with engine.begin() as conn:
        stats = write_attempts(
            conn,
            [attempt(job_id_raw=1), attempt(job_id_raw=2, uid=2**40), attempt(job_id_raw=3, name="x\ud800")],
        )
    assert (stats.inserted, [r.job_id_raw for r, _ in stats.refused]) == (1, [2, 3])
    assert query(engine, "SELECT job_id_raw FROM job_attempt") == [(1,)]


# ------------------------------------------------------------------ secrets and unavailable JSON


def test_a_password_in_the_url_query_is_never_printed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "slurmtel.toml"
    config.write_text(
        '[database]\nurl = "postgresql://slurmtel@127.0.0.1:1/slurmtel?password=s3cr3t-pw&sslpassword=k3y-pw"\n'
        "connect_timeout_seconds = 1\n"
    )
    assert main(["--config", str(config), "check-config"]) == 0
    assert main(["--config", str(config), "runs"]) == 1
    out, err = capsys.readouterr()
    assert "s3cr3t-pw" not in out + err and "k3y-pw" not in out + err
    assert "password=***" in out and "cannot connect to PostgreSQL" in err


def test_squeue_without_json_is_named(
    config_path: Path, engine: Engine, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # what squeue prints when it cannot give JSON: its table
    table = tmp_path / "squeue.out"
    table.write_text(fixture_path("slurmctld", "slurm-22.05", "squeue-running-1.txt").read_text())
    code, output = run(
        config_path, capsys, "collect", "slurmctld", "--input", str(table), "--at", "now", "--cluster", "lab"
    )
    assert code == 1 and "squeue --json is not available here" in output and "no JobId= record" not in output
    # live: a squeue that refuses --json
    squeue = tmp_path / "squeue"
    squeue.write_text("#!/bin/sh\necho \"squeue: unrecognized option '--json'\" >&2\nexit 1\n")
    squeue.chmod(0o755)
    config_path.write_text(
        config_path.read_text()
        + f'[sources.slurmctld]\nsqueue_command = "{squeue}"\nscontrol_command = "/bin/true"\n'
    )
    code, output = run(config_path, capsys, "collect", "slurmctld", "--once")
    assert code == 1 and "squeue --json is not available here" in output, output


# What squeue prints, and exits 1, when Slurm was built without the serializer/json plugin
# (no json-c at build time) or it is missing from PluginDir. Not a capture: the lines are put
# together from Slurm's source, word for word: squeue/opts.c (--json: `if
# (serializer_g_init(MIME_TYPE_JSON_PLUGIN, NULL)) fatal("JSON plugin load failure")`, 23.02)
# and common/plugin.c's plugin_context_create() (the three errors before it, as slurmd prints
# them for a missing cgroup/v2 in the same form); newer Slurm ends with
# serializer_required()'s `fatal("%s: could not find plugin for %s", __func__, mime_type)`.
SQUEUE_NO_SERIALIZER = (
    "squeue: error: Couldn't find the specified plugin name for serializer/json looking at all files\n"
    "squeue: error: cannot find serializer plugin for serializer/json\n"
    "squeue: error: cannot create serializer context for serializer/json\n"
    "squeue: fatal: JSON plugin load failure\n"
)
SQUEUE_NO_SERIALIZER_NEWER = (
    "squeue: fatal: serializer_required: could not find plugin for application/json\n"
)


@pytest.mark.parametrize("stderr", [SQUEUE_NO_SERIALIZER, SQUEUE_NO_SERIALIZER_NEWER])
def test_squeue_without_the_serializer_plugin_is_named(
    stderr: str, config_path: Path, engine: Engine, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert squeue_json_unavailable(stderr)
    with pytest.raises(ParseError, match="squeue --json is not available here"):
        parse_squeue_json(stderr, cluster="lab", at=datetime(2026, 12, 3, tzinfo=UTC))
    # a saved output
    saved = tmp_path / "squeue.out"
    saved.write_text(stderr)
    code, output = run(
        config_path, capsys, "collect", "slurmctld", "--input", str(saved), "--at", "now", "--cluster", "lab"
    )
    assert code == 1 and "squeue --json is not available here" in output, output
    assert 'job_view = "scontrol_text"' in output and "no JobId= record" not in output
    # live: the squeue that prints it on stderr and exits 1
    squeue = tmp_path / "squeue"
    squeue.write_text(f"#!/bin/sh\ncat '{saved}' >&2\nexit 1\n")
    squeue.chmod(0o755)
    config_path.write_text(
        config_path.read_text()
        + f'[sources.slurmctld]\nsqueue_command = "{squeue}"\nscontrol_command = "/bin/true"\n'
    )
    code, output = run(config_path, capsys, "collect", "slurmctld", "--once")
    assert code == 1 and "squeue --json is not available here" in output, output
    assert "JSON plugin load failure" in output or "could not find plugin for application/json" in output
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM gpu_allocation")).scalar_one() == 0


def test_one_run_creates_at_most_max_new_partitions_per_run_and_the_next_run_goes_on(
    config_path: Path, engine: Engine, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from slurmtel.store.telemetry import ensure_day_partitions, partition_name

    # an agent's backlog: two windows on each of three old days (within retention) that have no
    # partition, and two on a day that has one; one run may create one partition
    config_path.write_text(config_path.read_text() + "[telemetry]\nmax_new_partitions_per_run = 1\n")
    today = datetime.now(UTC).date()
    new_days = [today - timedelta(days=n) for n in (40, 41, 42)]  # newest first
    old_day = today - timedelta(days=45)
    with engine.begin() as conn:
        for day in [*new_days, old_day]:
            conn.execute(text(f"DROP TABLE IF EXISTS {partition_name(day)}"))
        ensure_day_partitions(conn, [old_day])
        before = set(existing_partitions(conn))

    def noon(day: Any) -> datetime:
        return datetime(day.year, day.month, day.day, 12, tzinfo=UTC)

    records = [w for day in [*new_days, old_day] for w in windows("GPU-0", noon(day), 2)]
    capture = tmp_path / "page.json"
    capture.write_bytes(page(records, tweak={}))

    def stored_days() -> dict[Any, int]:
        got = query(
            engine,
            "SELECT (window_start_at AT TIME ZONE 'UTC')::date, count(*) FROM gpu_summary GROUP BY 1",
        )
        return {day: n for day, n in got}

    def refused() -> dict[str, int]:
        got = query(engine, "SELECT record_key, reason, seen_count FROM quarantine")
        for _, reason, _ in got:
            assert reason == (
                "cannot be stored: its day has no partition yet, and this run has created as many "
                "as telemetry.max_new_partitions_per_run allows (1)"
            ), reason
        return {key: n for key, _, n in got}

    code, output = run(config_path, capsys, "collect", "agent", "--input", str(capture))
    assert code == 3, output
    with engine.connect() as conn:
        created = set(existing_partitions(conn)) - before
    # the newest day without one gets the partition; a day with one is stored, not counted
    assert created == {partition_name(new_days[0])}
    assert stored_days() == {new_days[0]: 2, old_day: 2}
    first = refused()
    assert sorted(first) == sorted(
        f"gpu GPU-0 window {w.window_start_at.isoformat()}" for w in records[2:6]
    )  # the windows of the other two new days
    assert all(n == 1 for n in first.values())

    # the next run: the next day's partition, its windows stored, the rest refused again
    code, output = run(config_path, capsys, "collect", "agent", "--input", str(capture))
    assert code == 3, output
    with engine.connect() as conn:
        created = set(existing_partitions(conn)) - before
    assert created == {partition_name(new_days[0]), partition_name(new_days[1])}
    assert stored_days() == {new_days[0]: 2, new_days[1]: 2, old_day: 2}
    # the last day's two windows refused again (seen twice); the quarantine keeps the rows of
    # the day stored now as they were
    again = refused()
    assert again == {
        f"gpu GPU-0 window {w.window_start_at.isoformat()}": 1 if i < 4 else 2
        for i, w in enumerate(records)
        if 2 <= i < 6
    }
