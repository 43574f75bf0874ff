"""parse_sacct_parsable on real `sacct -P` captures (the lab's 22.05 cluster, XDMoD's rows).

Golden values were read by hand from the captures (tests/fixtures/sacct/PROVENANCE.md). Inputs
in other layouts (JobName last, another delimiter, epoch times, a name with a newline) are
rebuilt in memory from the real rows; the fixture files are never edited.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, tzinfo
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from slurmtel.errors import ParseError
from slurmtel.parsers.sacct_json import parse_sacct_json
from slurmtel.parsers.sacct_parsable import SACCT_DELIMITER, SACCT_FIELDS, parse_sacct_parsable
from slurmtel.records import JobAttempt, Rejected

FIXTURES = Path(__file__).parent / "fixtures" / "sacct"
LAB = FIXTURES / "slurm-22.05"
XDMOD = FIXTURES / "xdmod"
# from xdmod's PROVENANCE.md: the --format of xdmod-slurm-helper (its output has no header)
XDMOD_FIELDS = [
    *("jobid", "jobidraw", "cluster", "partition", "qos", "account", "group", "gid", "user", "uid"),
    *("submit", "eligible", "start", "end", "elapsed", "exitcode", "state", "nnodes", "ncpus"),
    *("reqcpus", "reqmem", "reqtres", "alloctres", "timelimit", "nodelist", "jobname"),
]


def attempts_of(records: list[JobAttempt | Rejected]) -> list[JobAttempt]:
    assert not [r for r in records if isinstance(r, Rejected)], "unexpected Rejected records"
    return [r for r in records if isinstance(r, JobAttempt)]


def lab(clock: str | None) -> datetime | None:
    return datetime.fromisoformat(f"2026-12-02T{clock}").replace(tzinfo=UTC) if clock else None


def psv_table(name: str) -> tuple[list[str], list[list[str]]]:
    header, *rows = (LAB / name).read_text().splitlines()
    return header.split("|"), [row.split("|") for row in rows]


def rebuild(header: list[str], rows: list[list[str]], columns: list[str], delimiter: str = "|") -> str:
    """The same real rows with only COLUMNS, in that order, joined with DELIMITER."""
    index = [header.index(c) for c in columns]
    lines = [delimiter.join(columns)] + [delimiter.join(row[i] for i in index) for row in rows]
    return "\n".join(lines) + "\n"


def key_fields(attempts: list[JobAttempt]) -> set[tuple[object, ...]]:
    return {(a.job_id_raw, a.submit_at, a.state, a.alloc_gpus, a.start_at, a.end_at) for a in attempts}


# --- the lab captures -------------------------------------------------------------------------


def test_lab_D_P_golden():
    attempts = attempts_of(parse_sacct_parsable((LAB / "sacct-a-D-P.psv").read_text(), timezone=UTC))
    # 45 rows: 22 allocations and 23 steps (1.batch, 3.0, 10_1.batch, ...), which are skipped
    assert len(attempts) == 22
    assert not [a for a in attempts if "." in a.job_id]
    by_db_index = {a.db_index: a for a in attempts}
    assert sorted(by_db_index) == [
        1,
        2,
        3,
        7,
        8,
        9,
        10,
        11,
        12,
        13,
        14,
        15,
        16,
        17,
        18,
        19,
        20,
        23,
        25,
        26,
        27,
        28,
    ]

    first = by_db_index[1]
    assert (first.cluster, first.job_id, first.job_id_raw, first.name) == ("lab", "1", 1, "gpu1-cancel-run")
    assert (first.user, first.uid, first.account, first.partition, first.qos) == (
        "alice",
        1002,
        "physics",
        "gpu",
        "normal",
    )
    # "CANCELLED by 0" without the uid
    assert first.state == "CANCELLED"
    assert (first.submit_at, first.eligible_at, first.start_at, first.end_at) == (
        lab("13:00:06"),
        lab("13:00:06"),
        lab("13:00:06"),
        lab("13:00:11"),
    )
    assert first.alloc_tres == {
        "billing": 1,
        "cpu": 1,
        "gres/gpu:h100": 1,
        "gres/gpu": 1,
        "mem": 256,
        "node": 1,
    }
    assert first.req_tres == {"billing": 1, "cpu": 1, "gres/gpu": 1, "mem": 256, "node": 1}
    assert (first.alloc_gpus, first.gpu_model, first.alloc_cpus) == (1, "h100", 1)
    assert (first.exit_code, first.state_reason, first.time_limit_seconds) == ("0:0", "None", 300)
    assert (first.nodelist, first.nodes, first.work_dir) == ("gpu01", ("gpu01",), "/home/alice")
    assert first.submit_line.startswith(
        "sbatch --parsable -J gpu1-cancel-run -o slurm-%j-%x.out --gres=gpu:1 -t 5"
    )

    # job 2 ran twice: the requeued attempt and the rerun, each its own DBIndex and submit time
    assert [(by_db_index[i].job_id, by_db_index[i].state, by_db_index[i].submit_at) for i in (2, 18)] == [
        ("2", "REQUEUED", lab("13:00:06")),
        ("2", "COMPLETED", lab("13:00:11")),
    ]
    assert [(by_db_index[i].state, by_db_index[i].submit_at) for i in (26, 28)] == [
        ("NODE_FAIL", lab("13:01:55")),
        ("COMPLETED", lab("13:02:02")),
    ]
    failed = by_db_index[8]
    assert (failed.job_id, failed.state, failed.exit_code) == ("5", "FAILED", "1:0")
    oom = by_db_index[17]
    assert (oom.job_id, oom.state, oom.exit_code, oom.time_limit_seconds) == (
        "14",
        "OUT_OF_MEMORY",
        "0:125",
        120,
    )
    pending_cancel = by_db_index[12]
    assert (pending_cancel.job_id, pending_cancel.start_at, pending_cancel.alloc_tres) == ("9", None, {})
    assert (pending_cancel.nodelist, pending_cancel.nodes, pending_cancel.alloc_cpus) == ("", (), 1)
    task = by_db_index[13]
    assert (task.job_id, task.job_id_raw, task.array_job_id, task.array_task_id) == ("10_4", 10, 10, 4)
    assert (task.eligible_at, task.state_reason) == (lab("13:01:04"), "JobArrayTaskLimit")
    multinode = by_db_index[16]
    assert (multinode.job_id, multinode.nodes, multinode.alloc_gpus) == ("13", ("gpu01", "gpu02"), 2)
    timeout = by_db_index[9]
    assert (timeout.job_id, timeout.state, timeout.time_limit_seconds) == ("6", "TIMEOUT", 60)


def test_cross_format_agreement_with_the_json_capture():
    # sacct -P printed local time, and the lab ran in UTC
    parsable = attempts_of(parse_sacct_parsable((LAB / "sacct-a-D-P.psv").read_text(), timezone=UTC))
    json_attempts = attempts_of(parse_sacct_json((LAB / "sacct-a-D.json").read_bytes()))
    assert len(parsable) == len(json_attempts) == 22
    assert key_fields(parsable) == key_fields(json_attempts)
    # and the rest of what both formats carry
    by_key = {(a.job_id_raw, a.submit_at): a for a in json_attempts}
    for p in parsable:
        j = by_key[p.job_id_raw, p.submit_at]
        assert (p.job_id, p.name, p.user, p.account, p.partition, p.qos) == (
            j.job_id,
            j.name,
            j.user,
            j.account,
            j.partition,
            j.qos,
        )
        assert (p.eligible_at, p.nodes, p.alloc_tres, p.req_tres, p.gpu_model, p.alloc_cpus) == (
            j.eligible_at,
            j.nodes,
            j.alloc_tres,
            j.req_tres,
            j.gpu_model,
            j.alloc_cpus,
        )
        assert (p.time_limit_seconds, p.array_job_id, p.array_task_id, p.state_reason, p.work_dir) == (
            j.time_limit_seconds,
            j.array_job_id,
            j.array_task_id,
            j.state_reason,
            j.work_dir,
        )


def test_lab_other_captures():
    allocations = attempts_of(parse_sacct_parsable((LAB / "sacct-a-D-X-P.psv").read_text()))
    full = attempts_of(parse_sacct_parsable((LAB / "sacct-a-D-P.psv").read_text()))
    assert key_fields(allocations) == key_fields(full)
    # without -D only the last attempt of jobs 2 and 19 is left
    last_only = attempts_of(parse_sacct_parsable((LAB / "sacct-a-P.psv").read_text()))
    assert len(last_only) == 20
    assert {(a.job_id, a.state) for a in last_only if a.job_id in ("2", "19")} == {
        ("2", "COMPLETED"),
        ("19", "COMPLETED"),
    }
    # --format=ALL: another column order, WorkDir last
    every_field = attempts_of(parse_sacct_parsable((LAB / "sacct-a-D-P-format-ALL.psv").read_text()))
    assert key_fields(every_field) == key_fields(full)
    assert {(a.db_index, a.work_dir, a.uid) for a in every_field} == {
        (a.db_index, a.work_dir, a.uid) for a in full
    }


def test_header_missing_a_column_raises_naming_it():
    # the lab's running snapshot asked for JobID,JobName,State,Start,AllocTRES,NodeList: no Submit
    with pytest.raises(ParseError, match=r"^running-1.psv: sacct -P header lacks column\(s\) Submit "):
        parse_sacct_parsable((LAB / "sacct-a-running-1.psv").read_text(), origin="running-1.psv")
    header, rows = psv_table("sacct-a-D-X-P.psv")
    text = rebuild(header, rows, [c for c in header if c not in ("JobID", "JobIDRaw", "State")])
    with pytest.raises(ParseError, match=r"lacks column\(s\) JobIDRaw or JobID, State"):
        parse_sacct_parsable(text, origin="x")
    with pytest.raises(ParseError, match=r"field list lacks column\(s\) Submit"):
        parse_sacct_parsable("1|1|COMPLETED\n", fields=["JobID", "JobIDRaw", "State"])


def test_field_names_are_case_insensitive_and_cluster_defaults():
    header, rows = psv_table("sacct-a-D-X-P.psv")
    columns = ["JobIDRaw", "JobID", "Submit", "Start", "End", "State", "AllocTRES", "JobName"]
    text = rebuild(header, rows, columns).replace("JobIDRaw|JobID|Submit", "jobidraw|JOBID|submit", 1)
    attempts = attempts_of(parse_sacct_parsable(text, default_cluster="lab-b"))
    assert len(attempts) == 22
    assert {a.cluster for a in attempts} == {"lab-b"}
    assert key_fields(attempts) == key_fields(
        attempts_of(parse_sacct_parsable(rebuild(header, rows, header)))
    )


# --- what slurmtel itself asks sacct for ------------------------------------------------------


def test_sacct_fields_are_what_sacct_22_05_accepts():
    offered = {name.lower() for name in (LAB / "sacct-helpformat.txt").read_text().split()}
    assert {f.lower() for f in SACCT_FIELDS} <= offered
    assert SACCT_FIELDS[-1] == "JobName"
    assert not {"SubmitLine", "Comment"} & set(SACCT_FIELDS)
    assert len(set(SACCT_FIELDS)) == len(SACCT_FIELDS)
    assert SACCT_DELIMITER == "\x1f"


def as_epoch(value: str) -> str:
    if value in ("", "None", "Unknown"):
        return value
    return str(int(datetime.fromisoformat(value).replace(tzinfo=UTC).timestamp()))


def test_round_trip_in_slurmtels_own_format():
    # What `sacct -P --delimiter=$'\x1f' --format=<SACCT_FIELDS>` with SLURM_TIME_FORMAT=%s prints,
    # rebuilt from the real --format=ALL rows: their SACCT_FIELDS columns, times as epoch seconds,
    # re-joined with the unit separator instead of "|".
    header, rows = psv_table("sacct-a-D-P-format-ALL.psv")
    times = {header.index(c) for c in ("Submit", "Eligible", "Start", "End")}
    epoch_rows = [[as_epoch(v) if i in times else v for i, v in enumerate(row)] for row in rows]
    text = rebuild(header, epoch_rows, list(SACCT_FIELDS), delimiter=SACCT_DELIMITER)
    assert "|" not in text.splitlines()[1]
    ours = attempts_of(parse_sacct_parsable(text, delimiter=SACCT_DELIMITER))
    reference = attempts_of(parse_sacct_parsable((LAB / "sacct-a-D-P-format-ALL.psv").read_text()))
    assert len(ours) == 22
    assert sorted(ours, key=lambda a: a.db_index or 0) == sorted(
        (_without_submit_line(a) for a in reference), key=lambda a: a.db_index or 0
    )


def _without_submit_line(attempt: JobAttempt) -> JobAttempt:
    return replace(attempt, submit_line="")


def test_local_times_in_another_zone():
    # the same rows printed by a sacct running in Europe/Berlin (UTC+1 in December)
    header, rows = psv_table("sacct-a-D-X-P.psv")
    times = {header.index(c) for c in ("Submit", "Eligible", "Start", "End")}
    berlin = ZoneInfo("Europe/Berlin")

    def shift(value: str) -> str:
        if value in ("", "None", "Unknown"):
            return value
        at = datetime.fromisoformat(value).replace(tzinfo=UTC).astimezone(berlin)
        return at.replace(tzinfo=None).isoformat()

    moved = [[shift(v) if i in times else v for i, v in enumerate(row)] for row in rows]
    assert moved[0][header.index("Submit")] == "2026-12-02T14:00:06"
    attempts = attempts_of(parse_sacct_parsable(rebuild(header, moved, header), timezone=berlin))
    assert key_fields(attempts) == key_fields(
        attempts_of(parse_sacct_parsable(rebuild(header, rows, header)))
    )


# --- names that break naive parsers -----------------------------------------------------------


def name_last_table(name_for_job_7: str, delimiter: str = "|") -> str:
    header, rows = psv_table("sacct-a-D-X-P.psv")
    columns = [c for c in header if c not in ("JobName", "SubmitLine", "Comment")] + ["JobName"]
    renamed = [row[:] for row in rows]
    for row in renamed:
        if row[header.index("JobID")] == "7":
            row[header.index("JobName")] = name_for_job_7
    return rebuild(header, renamed, columns, delimiter)


@pytest.mark.parametrize(
    "name", ["train|eval", "a||b|", "first line\nsecond line", "a|b\nc|d", "two\n\nblank lines", "tab\there"]
)
def test_job_name_with_delimiter_or_newline_when_name_is_last(name):
    attempts = attempts_of(parse_sacct_parsable(name_last_table(name)))
    assert len(attempts) == 22
    names = {a.job_id: a.name for a in attempts}
    assert names["7"] == name
    assert (names["6"], names["8"]) == ("gpu1-timeout", "gpus4-queued")


def test_job_name_with_newline_when_name_is_not_last():
    # sacct-a-D-X-P.psv order: JobName third, Comment last; a newline splits the row in two
    header, rows = psv_table("sacct-a-D-X-P.psv")
    renamed = [row[:] for row in rows]
    renamed[6][header.index("JobName")] = "two\nlines"  # job 7
    attempts = attempts_of(parse_sacct_parsable(rebuild(header, renamed, header)))
    assert len(attempts) == 22
    assert {a.job_id: a.name for a in attempts}["7"] == "two\nlines"


def test_delimiter_in_a_name_that_is_not_last_is_rejected_with_its_line():
    header, rows = psv_table("sacct-a-D-X-P.psv")
    renamed = [row[:] for row in rows]
    renamed[6][header.index("JobName")] = "train|eval"  # job 7, line 8 (header is line 1)
    records = parse_sacct_parsable(rebuild(header, renamed, header), origin="x.psv")
    rejected = [r for r in records if isinstance(r, Rejected)]
    assert [(r.source, r.origin, r.record_key, r.reason) for r in rejected] == [
        ("sacct", "x.psv", "line 8", f"expected {len(header)} fields, found {len(header) + 1}")
    ]
    assert rejected[0].raw.startswith("7|7|train|eval|bob|")
    assert len([r for r in records if isinstance(r, JobAttempt)]) == 21


def test_end_before_start_and_unreadable_times_are_rejected():
    header, rows = psv_table("sacct-a-D-X-P.psv")
    broken = [row[:] for row in rows]
    start, end = header.index("Start"), header.index("End")
    broken[4][start], broken[4][end] = broken[4][end], broken[4][start]  # job 5, line 6
    broken[5][header.index("Submit")] = "yesterday"  # job 6, line 7
    records = parse_sacct_parsable(rebuild(header, broken, header), origin="x.psv")
    rejected = {r.record_key: r.reason for r in records if isinstance(r, Rejected)}
    assert rejected == {
        "job 5 (line 6)": "end 2026-12-02T13:00:11+00:00 precedes start 2026-12-02T13:00:16+00:00",
        "job 6 (line 7)": "cannot read Submit time 'yesterday'",
    }
    assert len(records) == 22


def test_truncated_last_row_is_rejected_not_glued_to_a_name():
    text = name_last_table("gpu1-ok")
    cut = text.rstrip("\n").rsplit("\n", 1)
    # the last row (job 19's rerun) lost its second half
    damaged = cut[0] + "\n" + cut[1][: len(cut[1]) // 2] + "\n"
    records = parse_sacct_parsable(damaged)
    assert len([r for r in records if isinstance(r, JobAttempt)]) == 21
    (bad,) = [r for r in records if isinstance(r, Rejected)]
    assert bad.record_key == "line 23" and bad.reason.startswith("expected 44 fields")
    assert {a.name for a in records if isinstance(a, JobAttempt) and a.job_id == "20"} == {"survivor-gpu01"}


# --- XDMoD's rows (sacct --parsable2 --noheader, 26 fields) ---------------------------------


def xdmod(name: str, timezone: tzinfo = UTC) -> list[JobAttempt | Rejected]:
    text = (XDMOD / name).read_text(encoding="utf-8")
    return parse_sacct_parsable(text, fields=XDMOD_FIELDS, timezone=timezone, origin=name)


def test_xdmod_accounting_rows():
    attempts = attempts_of(xdmod("accounting-logs.log"))
    by_id = {a.job_id: a for a in attempts}
    assert list(by_id) == ["4103947", "4107166", "4107219", "5692623"]
    big = by_id["4103947"]
    assert (big.cluster, big.partition, big.account, big.user, big.uid) == (
        "ub-hpc",
        "general-compute",
        "anon",
        "unknown",
        192837,
    )
    assert (big.state, big.exit_code, big.time_limit_seconds, big.alloc_cpus) == (
        "TIMEOUT",
        "1:0",
        259200,
        256,
    )
    assert len(big.nodes) == 32  # nnodes
    assert big.nodes[7:9] == ("d09n04s01", "d09n04s02")
    assert big.alloc_tres == {"billing": 256, "cpu": 256, "mem": 3000, "node": 32}
    cancelled = by_id["4107166"]
    assert (cancelled.state, cancelled.name) == ("CANCELLED", "100-Floors-of-Frights")
    assert cancelled.nodes == ("k10n26s01", "k13n36s01", "k13n37s01")
    assert by_id["4107219"].time_limit_seconds == 14 * 3600 + 20 * 60
    gpu = by_id["5692623"]
    assert (gpu.alloc_gpus, gpu.eligible_at, gpu.partition, gpu.time_limit_seconds) == (2, None, "", None)
    assert gpu.nodes == ("cpn-k16-35-01", "cpn-k16-37-01")


def test_xdmod_local_times():
    (first, *_rest) = attempts_of(xdmod("accounting-logs.log", timezone=ZoneInfo("America/New_York")))
    # 2015-06-26T13:57:00 in Buffalo (EDT, UTC-4)
    assert first.submit_at == datetime(2015, 6, 26, 17, 57, tzinfo=UTC)
    assert first.end_at == datetime(2015, 7, 1, 6, 55, 50, tzinfo=UTC)


def test_xdmod_header_file_matches_the_field_list():
    text = (XDMOD / "accounting-logs.with-header.derived.psv").read_text()
    assert parse_sacct_parsable(text, origin="accounting-logs.log") == xdmod("accounting-logs.log")


def test_xdmod_array_records():
    attempts = attempts_of(xdmod("accounting-logs-with-job-arrays.log"))
    assert [(a.job_id, a.job_id_raw, a.array_job_id, a.array_task_id) for a in attempts] == [
        ("4103947_100", 4103947, 4103947, 100),
        ("4103947_[1-3]", 4103947, 4103947, None),
        ("4103947_[1,5]", 4103947, 4103947, None),
        ("4103947_[9-11,20]", 4103947, 4103947, None),
        ("4103947_[91,100-102]", 4103947, 4103947, None),
        ("4103947_[9-11,13,16-20]", 4103947, 4103947, None),
    ]


def test_xdmod_unknown_and_unfinished_states():
    assert [a.state for a in attempts_of(xdmod("unknown-job-state.log"))] == ["FOO", "BAR"]
    running, pending = attempts_of(xdmod("non-ended-job-state.log"))
    assert (running.state, running.name, running.partition) == ("RUNNING", "0065", "focaccia")
    assert (pending.state, pending.start_at, pending.end_at) == (
        "PENDING",
        None,
        datetime(2020, 7, 1, 15, 28, 17, tzinfo=UTC),
    )


def test_xdmod_non_ascii_name():
    (attempt,) = attempts_of(xdmod("utf8-multibyte-chars.log"))
    assert attempt.name == "aàb"
    assert attempt.nodes == ("d07n07s02",)


def test_empty_input():
    assert parse_sacct_parsable("") == []
    header_only = (LAB / "sacct-a-D-P.psv").read_text().splitlines()[0] + "\n"
    assert parse_sacct_parsable(header_only) == []
    assert parse_sacct_parsable("", fields=XDMOD_FIELDS) == []


# --- sacct -p (--parsable): a delimiter at the end of every line ----------------------------


def parsable1(text: str, delimiter: str = "|") -> str:
    """TEXT as `sacct -p` prints it: every line, the header too, ends in the delimiter."""
    return "\n".join(line + delimiter if line else line for line in text.split("\n"))


@pytest.mark.parametrize("name", ["sacct-a-D-P.psv", "sacct-a-D-X-P.psv", "sacct-a-P.psv"])
def test_parsable_with_a_trailing_delimiter_reads_like_parsable2(name: str) -> None:
    text = (LAB / name).read_text()
    expected = parse_sacct_parsable(text, origin="lab")
    assert attempts_of(expected)
    assert parse_sacct_parsable(parsable1(text), origin="lab") == expected
    # without a header line (--noheader), the trailing delimiter is recognised on the rows
    header, _, body = text.partition("\n")
    assert parse_sacct_parsable(parsable1(body), fields=header.split("|"), origin="lab") == expected


def test_parsable_with_a_trailing_delimiter_on_the_real_24_11_capture() -> None:
    text = (FIXTURES / "slurm-24.11" / "sacct-a-D-final-P.psv").read_text()
    expected = attempts_of(parse_sacct_parsable(text, origin="lab"))
    assert len(expected) == 12
    assert parse_sacct_parsable(parsable1(text), origin="lab") == expected


# --- array tasks without a JobIDRaw column ------------------------------------------------------


def test_array_tasks_without_jobidraw_are_quarantined_with_the_reason() -> None:
    # the lab's array 10: tasks 10_1..10_3 are jobs 15..17, 10_4 is job 10 itself; only
    # JobIDRaw says so, and without it the tasks cannot be told apart from each other
    header, rows = psv_table("sacct-a-D-X-P.psv")
    records = parse_sacct_parsable(
        rebuild(header, rows, [c for c in header if c != "JobIDRaw"]), origin="lab"
    )
    rejected = [r for r in records if isinstance(r, Rejected)]
    assert sorted(r.record_key.split(" ")[1] for r in rejected) == ["10_1", "10_2", "10_3", "10_4"]
    for r in rejected:
        task = r.record_key.split(" ")[1]
        assert r.reason == (
            f"array task '{task}' and no JobIDRaw column: its raw job id cannot be told from its JobID "
            "(ask sacct for JobIDRaw)"
        )
    # every other allocation is read as with the column
    with_raw = attempts_of(parse_sacct_parsable(rebuild(header, rows, header), origin="lab"))
    without = [r for r in records if isinstance(r, JobAttempt)]
    assert key_fields(without) == key_fields([a for a in with_raw if a.array_job_id is None])
