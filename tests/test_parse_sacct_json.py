"""parse_sacct_json on real captures of every sacct --json schema from Slurm 21.08 to 25.11.

Golden values were read by hand from the captures (tests/fixtures/sacct/PROVENANCE.md).
Modified inputs (truncated bytes, another meta, a broken job) are built in memory from the real
captures; the fixture files are never edited.
"""

from __future__ import annotations

import copy
import json
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
import pytest

from slurmtel.errors import ParseError
from slurmtel.parsers.sacct_json import parse_sacct_json
from slurmtel.records import JobAttempt, Rejected, SchemaNotice, type_problem

FIXTURES = Path(__file__).parent / "fixtures" / "sacct"
LAB = FIXTURES / "slurm-22.05"
WEB = FIXTURES / "slurm_web"


def read(path: Path) -> bytes:
    return path.read_bytes()


def parse_file(path: Path) -> list[JobAttempt | Rejected]:
    return parse_sacct_json(read(path), origin=str(path))


def attempts_of(records: list[JobAttempt | Rejected]) -> list[JobAttempt]:
    assert not [r for r in records if isinstance(r, Rejected)], "unexpected Rejected records"
    return [r for r in records if isinstance(r, JobAttempt)]


def one(path: Path) -> JobAttempt:
    (attempt,) = attempts_of(parse_file(path))
    return attempt


def utc(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def lab(clock: str | None) -> datetime | None:
    # the lab scenario ran on 2026-12-02, in UTC
    return utc(f"2026-12-02T{clock}") if clock else None


# sacct-a-D.txt / sacct-a-D.json, one row per allocation (attempt), in no particular order:
# job id, JobIDRaw, submit, start, end, state, GPUs, nodes
LAB_ATTEMPTS = [
    ("1", 1, "13:00:06", "13:00:06", "13:00:11", "CANCELLED", 1, ("gpu01",)),
    ("2", 2, "13:00:06", "13:00:06", "13:00:11", "REQUEUED", 1, ("gpu01",)),
    ("2", 2, "13:00:11", "13:01:14", "13:01:54", "COMPLETED", 1, ("gpu02",)),
    ("3", 3, "13:00:06", "13:00:06", "13:00:46", "COMPLETED", 2, ("gpu01",)),
    ("4", 4, "13:00:06", "13:00:07", "13:00:52", "COMPLETED", 4, ("gpu02",)),
    ("5", 5, "13:00:06", "13:00:11", "13:00:16", "FAILED", 1, ("gpu01",)),
    ("6", 6, "13:00:06", "13:00:11", "13:01:28", "TIMEOUT", 1, ("gpu01",)),
    ("7", 7, "13:00:06", "13:00:17", "13:00:47", "COMPLETED", 1, ("gpu01",)),
    ("8", 8, "13:00:06", "13:00:53", "13:01:13", "COMPLETED", 4, ("gpu02",)),
    ("9", 9, "13:00:06", None, "13:00:11", "CANCELLED", 0, ()),
    ("10_1", 15, "13:00:06", "13:00:53", "13:01:03", "COMPLETED", 1, ("gpu01",)),
    ("10_2", 16, "13:00:06", "13:00:53", "13:01:03", "COMPLETED", 1, ("gpu01",)),
    ("10_3", 17, "13:00:06", "13:01:04", "13:01:14", "COMPLETED", 1, ("gpu01",)),
    ("10_4", 10, "13:00:06", "13:01:04", "13:01:14", "COMPLETED", 1, ("gpu01",)),
    ("11", 11, "13:00:06", "13:00:53", "13:01:08", "COMPLETED", 1, ("gpu01",)),
    ("12", 12, "13:00:06", "13:00:07", "13:00:12", "COMPLETED", 0, ("gpu01",)),
    ("13", 13, "13:00:06", "13:01:14", "13:01:29", "COMPLETED", 2, ("gpu01", "gpu02")),
    ("14", 14, "13:00:06", "13:00:07", "13:00:08", "OUT_OF_MEMORY", 0, ("gpu01",)),
    ("18", 18, "13:01:55", "13:01:57", "13:02:02", "NODE_FAIL", 2, ("gpu02",)),
    ("19", 19, "13:01:55", "13:01:57", "13:02:02", "NODE_FAIL", 2, ("gpu02",)),
    ("19", 19, "13:02:02", "13:02:27", "13:02:47", "COMPLETED", 2, ("gpu02",)),
    ("20", 20, "13:01:55", "13:01:57", "13:02:27", "COMPLETED", 3, ("gpu01",)),
]


def lab_rows(attempts: list[JobAttempt]) -> list[tuple[object, ...]]:
    return sorted(
        (a.job_id, a.job_id_raw, a.submit_at, a.start_at, a.end_at, a.state, a.alloc_gpus, a.nodes)
        for a in attempts
    )


def expected_lab_rows() -> list[tuple[object, ...]]:
    return sorted(
        (job_id, raw, lab(submit), lab(start), lab(end), state, gpus, nodes)
        for job_id, raw, submit, start, end, state, gpus, nodes in LAB_ATTEMPTS
    )


# --- the lab capture (Slurm 22.05.8, openapi/dbv0.0.38) ---------------------------------------


def test_lab_sacct_a_D_is_exactly_the_allocations_of_the_text_view():
    attempts = attempts_of(parse_file(LAB / "sacct-a-D.json"))
    assert len(attempts) == 22
    assert lab_rows(attempts) == expected_lab_rows()
    # steps (1.batch, 3.0, ...) are not attempts; every record is the lab's
    assert {a.cluster for a in attempts} == {"lab"}
    assert all(a.job_id_raw not in (0, None) for a in attempts)


def test_lab_attempt_details():
    attempts = attempts_of(parse_file(LAB / "sacct-a-D.json"))
    by_key = {(a.job_id, a.submit_at): a for a in attempts}
    requeued, rerun = by_key["2", lab("13:00:06")], by_key["2", lab("13:00:11")]
    assert (requeued.state, rerun.state) == ("REQUEUED", "COMPLETED")
    # the new attempt waited for cred_expire: eligible 20 s after its (reset) submit time
    assert rerun.eligible_at == lab("13:00:32")
    assert rerun.state_reason == "BeginTime"

    pending_cancel = by_key["9", lab("13:00:06")]
    assert pending_cancel.start_at is None
    assert pending_cancel.alloc_tres == {}
    assert pending_cancel.req_tres == {"cpu": 1, "mem": 256, "node": 1, "billing": 1, "gres/gpu": 4}
    assert pending_cancel.alloc_gpus == 0
    assert pending_cancel.gpu_model == ""
    assert pending_cancel.nodelist == ""
    # no allocated TRES: the CPU count falls back to required.CPUs
    assert pending_cancel.alloc_cpus == 1

    multinode = by_key["13", lab("13:00:06")]
    assert multinode.nodelist == "gpu[01-02]"
    assert multinode.nodes == ("gpu01", "gpu02")
    assert multinode.alloc_tres == {
        "cpu": 2,
        "mem": 512,
        "node": 2,
        "billing": 2,
        "gres/gpu": 2,
        "gres/gpu:h100": 2,
    }

    task = by_key["10_4", lab("13:00:06")]
    assert (task.job_id_raw, task.array_job_id, task.array_task_id) == (10, 10, 4)
    assert task.state_reason == "JobArrayTaskLimit"
    first_task = by_key["10_1", lab("13:00:06")]
    assert (first_task.job_id_raw, first_task.array_job_id, first_task.array_task_id) == (15, 10, 1)

    oom = by_key["14", lab("13:00:06")]
    assert oom.state == "OUT_OF_MEMORY"
    # dbv0.0.38 prints {"status": "SIGNALED", "return_code": null, "signal": {"signal_id": 125}}
    assert oom.exit_code == "0:125"
    assert oom.time_limit_seconds == 120
    assert oom.partition == "debug"

    timeout = by_key["6", lab("13:00:06")]
    assert (timeout.state, timeout.time_limit_seconds, timeout.user, timeout.account) == (
        "TIMEOUT",
        60,
        "bob",
        "chemistry",
    )
    assert by_key["18", lab("13:01:55")].state == "NODE_FAIL"

    gpu_attempts = [a for a in attempts if a.alloc_gpus]
    assert {a.gpu_model for a in gpu_attempts} == {"h100"}
    assert all(a.alloc_tres["gres/gpu"] == a.alloc_tres["gres/gpu:h100"] for a in gpu_attempts)

    chem = by_key["11", lab("13:00:06")]
    assert (chem.name, chem.user, chem.account, chem.qos, chem.wckey) == (
        "chem-as-alice",
        "alice",
        "chemistry",
        "normal",
        "",
    )
    assert chem.work_dir == "/home/alice"
    assert chem.het_job_id is None and chem.het_job_offset is None
    assert chem.array_job_id is None and chem.array_task_id is None
    assert chem.db_index is None  # sacct JSON does not carry job_db_inx


def test_lab_attempts_follow_the_scenario():
    scenario = (LAB / "scenario-jobs.tsv").read_text().splitlines()[1:]
    window_start, window_end = (LAB / "scenario-window.txt").read_text().split()
    attempts = attempts_of(parse_file(LAB / "sacct-a-D.json"))
    for line in scenario:
        label, jobid, user, account, expected, _args = line.split("\t")
        mine = sorted(
            (a for a in attempts if a.job_id == jobid or a.array_job_id == int(jobid)),
            key=lambda a: a.submit_at,
        )
        assert mine, label
        assert {(a.user, a.account) for a in mine} == {(user, account)}, label
        states = [a.state for a in mine]
        if expected == "NODE_FAIL+REQUEUE":
            assert states == ["NODE_FAIL", "COMPLETED"], label
        elif label == "gpu1-requeue":
            assert states == ["REQUEUED", "COMPLETED"], label
        else:
            assert set(states) == {expected}, label
        for a in mine:
            assert utc(window_start) <= a.submit_at <= utc(window_end)


def test_lab_sacct_without_D_is_the_same_capture():
    # the lab's `sacct -a --json` printed every attempt too (the files are identical)
    assert lab_rows(attempts_of(parse_file(LAB / "sacct-a.json"))) == expected_lab_rows()


def test_lab_running_snapshot():
    attempts = attempts_of(parse_file(LAB / "sacct-a-running-1.json"))
    assert len(attempts) == 14
    by_id = {a.job_id: a for a in attempts}
    running = by_id["3"]
    assert (running.state, running.start_at, running.end_at, running.alloc_gpus) == (
        "RUNNING",
        lab("13:00:06"),
        None,
        2,
    )
    # the pending array's meta record: sacct -P shows it as 10_[1-4%2]; dbv0.0.38 has the hex bitmap 0x1E
    meta = by_id["10_[1-4%2]"]
    assert (meta.job_id_raw, meta.array_job_id, meta.array_task_id, meta.state) == (10, 10, None, "PENDING")
    assert (meta.start_at, meta.nodes) == (None, ())
    assert {a.state for a in attempts} == {"RUNNING", "PENDING", "OUT_OF_MEMORY"}


def test_lab_multinode_running():
    attempt = one(LAB / "sacct-multinode-running.json")
    assert (attempt.job_id, attempt.name, attempt.state) == ("2", "multinode-gpu-live", "RUNNING")
    assert attempt.nodes == ("gpu01", "gpu02")
    assert (attempt.alloc_gpus, attempt.gpu_model, attempt.end_at) == (4, "h100", None)


def test_lab_slurmrestd_slurmdb_response():
    attempts = attempts_of(parse_file(LAB / "slurmrestd-slurmdb-v0.0.38-job-19.json"))
    assert [(a.job_id, a.state, a.submit_at) for a in attempts] == [
        ("19", "NODE_FAIL", lab("13:01:55")),
        ("19", "COMPLETED", lab("13:02:02")),
    ]


# --- one real capture per Slurm release -------------------------------------------------------


def test_slurm_21_08_dbv0_0_37():
    attempt = one(FIXTURES / "sarc" / "sacct_json_slurm_21_8_8.json")
    assert (attempt.cluster, attempt.job_id_raw, attempt.job_id) == ("cedar", 55978384, "55978384")
    assert (attempt.state, attempt.alloc_gpus, attempt.gpu_model) == ("REQUEUED", 1, "")
    assert attempt.submit_at == utc("2023-01-09T14:37:03")
    assert attempt.start_at == utc("2023-01-09T14:37:03")
    assert attempt.end_at == utc("2023-01-10T16:49:46")
    assert attempt.time_limit_seconds == 1440 * 60
    assert (attempt.wckey, attempt.partition, attempt.nodes) == ("submitit", "gpubackfill", ("cdr896",))
    assert attempt.alloc_tres == {"cpu": 4, "mem": 40960, "node": 1, "billing": 1, "gres/gpu": 1}


def test_slurm_21_08_clockwork_arrays_and_node_fail():
    first, second = attempts_of(parse_file(FIXTURES / "clockwork" / "sacct_1.json"))
    assert (first.job_id, first.job_id_raw, first.array_job_id, first.array_task_id) == ("1_7", 10, 1, 7)
    assert (first.state, first.state_reason, first.end_at) == ("NODE_FAIL", "Prolog", None)
    assert first.eligible_at == datetime.fromtimestamp(1680193504, UTC)
    # task 0 is a task like any other
    assert (second.job_id, second.job_id_raw, second.array_task_id) == ("2_0", 20, 0)
    assert second.state == "REQUEUED"
    later, _ = attempts_of(parse_file(FIXTURES / "clockwork" / "sacct_2.json"))
    assert (later.job_id, later.name, later.end_at) == (
        "1_7",
        "new_name",
        datetime.fromtimestamp(1680244103, UTC),
    )


def test_slurm_22_05_dbv0_0_38():
    attempt = one(FIXTURES / "sarc" / "sacct_json_slurm_22_5_9.json")
    assert (attempt.job_id, attempt.job_id_raw) == ("20247445_100", 20247445)
    assert (attempt.array_job_id, attempt.array_task_id) == (20247445, 100)
    assert (attempt.state, attempt.alloc_gpus, attempt.alloc_cpus) == ("FAILED", 16, 96)
    assert attempt.nodes == ("ng30103", "ng30203", "ng30706", "ng30707")
    assert attempt.start_at == utc("2023-09-03T11:30:41")
    assert attempt.end_at == utc("2023-09-04T22:04:04")
    assert attempt.time_limit_seconds == 2880 * 60


def test_slurm_23_02_data_parser_v0_0_39():
    attempt = one(FIXTURES / "sarc" / "sacct_json_slurm_23_2_6.json")
    assert (attempt.cluster, attempt.job_id, attempt.state) == ("mila", "4", "RUNNING")
    assert (attempt.alloc_gpus, attempt.start_at, attempt.end_at) == (2, utc("2021-02-19T09:00:09"), None)
    # time.limit is {"set": true, "number": 7200}; energy -2 is left out of the TRES
    assert attempt.time_limit_seconds == 7200 * 60
    assert attempt.alloc_tres == {"cpu": 4, "mem": 32768, "node": 1, "billing": 3, "gres/gpu": 2}
    # array.task_id {"set": false} means "not an array task"
    assert (attempt.array_job_id, attempt.array_task_id, attempt.het_job_offset) == (None, None, None)
    assert attempt.exit_code == "0:0"


def test_slurm_23_11_data_parser_v0_0_40():
    attempt = one(FIXTURES / "sarc" / "sacct_json_slurm_23_11_5.json")
    # state.current is a list from this version on
    assert (attempt.cluster, attempt.job_id, attempt.state) == ("mila", "4", "RUNNING")
    assert (attempt.user, attempt.account, attempt.nodes) == ("masterkohga", "mila", ("mila02",))
    assert (attempt.alloc_gpus, attempt.alloc_cpus, attempt.end_at) == (2, 4, None)
    assert attempt.time_limit_seconds == 7200 * 60
    assert attempt.exit_code == "0:0"


def test_slurm_24_05_data_parser_v0_0_41():
    failed = one(WEB / "24.05" / "0.0.41" / "slurmdb-job-failed.json")
    assert (failed.cluster, failed.job_id, failed.state, failed.exit_code) == (
        "hpc",
        "649719",
        "FAILED",
        "1:0",
    )
    assert (failed.start_at, failed.end_at) == (utc("2025-05-20T15:21:12"), utc("2025-05-20T15:21:13"))
    assert failed.submit_line == "sbatch --time 1 --wrap sleep 1 && false --ntasks 1"
    pending = one(WEB / "24.05" / "0.0.41" / "slurmdb-job-pending.json")
    assert (pending.state, pending.state_reason, pending.start_at) == ("PENDING", "BeginTime", None)
    assert pending.eligible_at == utc("2025-05-20T16:21:34")
    assert (pending.alloc_tres, pending.alloc_cpus, pending.nodes) == ({}, 64, ())
    for name in ("archived", "completed", "gpus-gres", "gpus-multi-nodes", "running", "timeout"):
        assert one(WEB / "24.05" / "0.0.41" / f"slurmdb-job-{name}.json").cluster == "hpc"


def test_slurm_24_11_data_parser_v0_0_42():
    running = one(WEB / "24.11" / "0.0.42" / "slurmdb-job-running.json")
    assert (running.job_id, running.state, running.account, running.partition) == (
        "6368",
        "RUNNING",
        "biology",
        "standard",
    )
    assert (running.start_at, running.end_at) == (utc("2025-11-10T15:33:21"), None)
    assert (running.alloc_cpus, running.alloc_tres["mem"], running.time_limit_seconds) == (4, 2048, 120)
    multi = one(WEB / "24.11" / "0.0.42" / "slurmdb-job-gpus-multi-nodes.json")
    assert (multi.job_id, multi.nodelist, multi.nodes) == ("6371", "ia[1-2]", ("ia1", "ia2"))
    # this dev cluster does not account gres/gpu, so the TRES hold no GPUs
    assert multi.alloc_gpus == 0
    for name in ("archived", "completed", "failed", "gpus-gres", "pending", "timeout"):
        assert one(WEB / "24.11" / "0.0.42" / f"slurmdb-job-{name}.json").cluster == "hpc"


def test_slurm_25_05_data_parser_v0_0_43():
    timeout = one(WEB / "25.05" / "0.0.43" / "slurmdb-job-timeout.json")
    assert (timeout.job_id, timeout.state, timeout.user) == ("4730", "TIMEOUT", "progers")
    assert (timeout.start_at, timeout.end_at) == (utc("2025-11-10T15:36:35"), utc("2025-11-10T15:37:38"))
    archived = one(WEB / "25.05" / "0.0.43" / "slurmdb-job-archived.json")
    assert (archived.job_id, archived.qos, archived.nodes) == ("2194", "study", ("gpu1", "gpu2"))
    assert archived.time_limit_seconds == 120 * 60
    for name in ("completed", "failed", "gpus-gres", "gpus-multi-nodes", "pending", "running"):
        assert one(WEB / "25.05" / "0.0.43" / f"slurmdb-job-{name}.json").cluster == "hpc"


def test_slurm_25_11_data_parser_v0_0_44():
    done = one(WEB / "25.11" / "0.0.44" / "slurmdb-job-completed.json")
    assert (done.job_id, done.job_id_raw, done.state, done.user) == ("5749", 5749, "COMPLETED", "vhartman")
    assert (done.submit_at, done.start_at, done.end_at) == (
        utc("2025-11-12T10:14:34"),
        utc("2025-11-12T10:14:35"),
        utc("2025-11-12T10:15:05"),
    )
    assert done.alloc_tres == {"cpu": 4, "mem": 2048, "node": 1, "billing": 4}
    assert (done.alloc_cpus, done.time_limit_seconds, done.exit_code) == (4, 120, "0:0")
    assert done.submit_line == "sbatch --time 2 --wrap sleep 30 && true --ntasks 4"
    assert done.work_dir == "/home/vhartman"
    failed = one(WEB / "25.11" / "0.0.44" / "slurmdb-job-failed.json")
    assert (failed.state, failed.exit_code) == ("FAILED", "1:0")
    for name in ("archived", "gpus-gres", "gpus-multi-nodes", "pending", "running", "timeout"):
        assert one(WEB / "25.11" / "0.0.44" / f"slurmdb-job-{name}.json").cluster == "hpc"


# --- schema detection -------------------------------------------------------------------------


def notices(records: list) -> list[tuple[str, str]]:  # type: ignore[type-arg]
    return [(n.schema, n.read_as) for n in records if isinstance(n, SchemaNotice)]


def test_an_unknown_schema_version_is_read_by_the_newest_shape_with_a_notice():
    # a Slurm upgrade must not stop ingestion: 26.05 prints data_parser/v0.0.45
    path = WEB / "25.11" / "0.0.44" / "slurmdb-job-completed.json"
    doc = json.loads(read(path))
    doc["meta"]["plugin"]["data_parser"] = "data_parser/v0.0.45"
    records = parse_sacct_json(json.dumps(doc), origin="<mem>")
    assert notices(records) == [("data_parser/v0.0.45", "data_parser/v0.0.44")]
    assert [r for r in records if not isinstance(r, SchemaNotice)] == parse_file(path)
    # and older names than any known are read by shape too
    old = json.loads(read(LAB / "sacct-a-D.json"))
    old["meta"]["plugin"]["type"] = "openapi/dbv0.0.36"
    records = parse_sacct_json(json.dumps(old), origin="<mem>")
    assert notices(records) == [("openapi/dbv0.0.36", "data_parser/v0.0.44")]
    assert (
        lab_rows(attempts_of([r for r in records if not isinstance(r, SchemaNotice)])) == expected_lab_rows()
    )


def test_an_unknown_schema_whose_objects_match_no_shape_is_refused():
    doc = json.loads(read(WEB / "25.11" / "0.0.44" / "slurmdb-job-completed.json"))
    doc["meta"]["plugin"]["data_parser"] = "data_parser/v1.0.0"
    doc["jobs"] = [{"id": {"job": 5749}, "times": {"submitted": 1762788774}}]
    with pytest.raises(
        ParseError, match=r"<mem>: unknown sacct JSON schema 'data_parser/v1.0.0', and its job"
    ):
        parse_sacct_json(json.dumps(doc), origin="<mem>")
    # an empty window of an unknown schema is just empty
    doc["jobs"] = []
    assert notices(parse_sacct_json(json.dumps(doc))) == [("data_parser/v1.0.0", "data_parser/v0.0.44")]


def test_schema_names_in_every_place_meta_has_held_them():
    plural = json.loads(read(FIXTURES / "sarc" / "sacct_json_slurm_23_2_6.json"))
    assert plural["meta"]["plugins"]["data_parser"] == "data_parser/v0.0.39"
    assert notices(parse_sacct_json(json.dumps(plural))) == []
    plural["meta"]["plugins"]["data_parser"] = "data_parser/v0.0.99"
    assert notices(parse_sacct_json(json.dumps(plural))) == [("data_parser/v0.0.99", "data_parser/v0.0.44")]
    # 23.11 leaves plugin.type empty and names the parser in plugin.data_parser
    sarc = json.loads(read(FIXTURES / "sarc" / "sacct_json_slurm_23_11_5.json"))
    assert sarc["meta"]["plugin"]["type"] == ""
    assert notices(parse_sacct_json(json.dumps(sarc))) == []
    sarc["meta"]["plugin"]["data_parser"] = "data_parser/v0.0.36"
    assert notices(parse_sacct_json(json.dumps(sarc))) == [("data_parser/v0.0.36", "data_parser/v0.0.44")]


def test_without_meta_jobs_are_read_by_shape():
    doc = json.loads(read(LAB / "sacct-a-D.json"))
    del doc["meta"]
    assert lab_rows(attempts_of(parse_sacct_json(json.dumps(doc)))) == expected_lab_rows()
    recent = json.loads(read(WEB / "25.11" / "0.0.44" / "slurmdb-job-completed.json"))
    recent["meta"] = {}
    assert attempts_of(parse_sacct_json(json.dumps(recent)))[0].job_id == "5749"


def test_slurmctld_json_is_refused():
    with pytest.raises(ParseError, match=re.escape("squeue-final.json: this is slurmctld job JSON")):
        parse_sacct_json(read(LAB / "squeue-final.json"), origin="squeue-final.json")


# --- whole-input failures ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b"{not json", "invalid JSON"),
        (b"", "empty input"),
        (b"   \n", "empty input"),
        (b"[]", "expected a JSON object"),
        (b'{"meta": {}, "errors": []}', "no 'jobs' list"),
        (b'{"jobs": {"job_id": 1}}', "no 'jobs' list"),
        (b'{"jobs": [{"job_id": 1}] } trailing', "invalid JSON"),
    ],
)
def test_unreadable_input_raises_parse_error_naming_the_origin(raw, reason):
    with pytest.raises(ParseError, match=f"^/var/tmp/capture.json: {reason}"):
        parse_sacct_json(raw, origin="/var/tmp/capture.json")


def test_sacct_errors_without_jobs_raise():
    doc = json.loads(read(WEB / "25.11" / "0.0.44" / "slurmdb-job-completed.json"))
    doc["jobs"] = []
    doc["errors"] = [{"description": "Unable to connect to slurmdbd", "error_number": 1, "source": "sacct"}]
    with pytest.raises(ParseError, match="Unable to connect to slurmdbd"):
        parse_sacct_json(json.dumps(doc))
    doc["errors"] = []
    assert parse_sacct_json(json.dumps(doc)) == []


def test_invalid_utf8_in_a_name_keeps_the_batch():
    raw = read(LAB / "sacct-a-D.json").replace(b'"gpu1-fail"', b'"gpu1-f\xe9il"')
    attempts = attempts_of(parse_sacct_json(raw))
    assert len(attempts) == 22
    assert {a.name for a in attempts if a.job_id == "5"} == {"gpu1-f\ufffdil"}


# --- single bad jobs ----------------------------------------------------------------------------


def test_job_ending_before_it_started_is_rejected_and_the_rest_kept():
    doc = json.loads(read(LAB / "sacct-a-D.json"))
    job3 = next(j for j in doc["jobs"] if j["job_id"] == 3)
    job3["time"]["end"] = job3["time"]["start"] - 10
    records = parse_sacct_json(json.dumps(doc), origin="lab")
    rejected = [r for r in records if isinstance(r, Rejected)]
    assert len(records) == 22 and len(rejected) == 1
    (bad,) = rejected
    assert (bad.source, bad.origin, bad.record_key) == ("sacct", "lab", "job 3")
    assert "precedes start" in bad.reason
    raw = json.loads(bad.raw)
    assert raw["name"] == "gpu2-srun-ok" and "steps" not in raw
    kept = [r for r in records if isinstance(r, JobAttempt)]
    assert lab_rows(kept) == [row for row in expected_lab_rows() if row[0] != "3"]


def test_jobs_without_id_or_submission_are_rejected():
    doc = json.loads(read(LAB / "sacct-a-D.json"))
    jobs = {j["job_id"]: j for j in doc["jobs"]}
    jobs[7]["time"]["submission"] = 0
    del jobs[8]["job_id"]
    jobs[11]["time"] = "yesterday"
    records = parse_sacct_json(orjson.dumps(doc))
    reasons = {r.record_key: r.reason for r in records if isinstance(r, Rejected)}
    assert reasons == {"job 7": "no submission time", "job ?": "no job_id", "job 11": "no time object"}
    assert len([r for r in records if isinstance(r, JobAttempt)]) == 19


def test_het_job_component_id():
    # no capture holds a heterogeneous job: a real 25.11 job with its het fields filled in
    doc = json.loads(read(WEB / "25.11" / "0.0.44" / "slurmdb-job-completed.json"))
    doc["jobs"][0]["het"] = {"job_id": 5748, "job_offset": {"set": True, "infinite": False, "number": 1}}
    (attempt,) = attempts_of(parse_sacct_json(json.dumps(doc)))
    assert (attempt.job_id, attempt.job_id_raw, attempt.het_job_id, attempt.het_job_offset) == (
        "5748+1",
        5749,
        5748,
        1,
    )


def test_requeued_state_list_reads_like_sacct_text():
    doc = json.loads(read(WEB / "25.11" / "0.0.44" / "slurmdb-job-completed.json"))
    doc["jobs"][0]["state"]["current"] = ["PENDING", "REQUEUED"]
    assert attempts_of(parse_sacct_json(json.dumps(doc)))[0].state == "REQUEUED"


# --- truncated input ----------------------------------------------------------------------------

TRUNCATION = re.compile(r"truncated JSON after (\d+) complete jobs at byte (\d+)")


def salvage(raw: bytes, cut: int) -> tuple[list[JobAttempt], Rejected]:
    records = parse_sacct_json(raw[:cut], origin="cut.json")
    *attempts, last = records
    assert isinstance(last, Rejected)
    assert all(isinstance(a, JobAttempt) for a in attempts)
    assert (last.source, last.origin, last.record_key) == ("sacct", "cut.json", "truncated input")
    return attempts, last  # type: ignore[return-value]


def test_truncated_inside_a_job_keeps_the_jobs_before_it():
    raw = read(LAB / "sacct-a-D.json")
    full = attempts_of(parse_sacct_json(raw))
    # the file lists jobs 19, 2, 1, 2, 3, 4, 5, ...: cut inside job 5 (at its name)
    cut = raw.index(b'"name": "gpu1-fail"')
    attempts, truncation = salvage(raw, cut)
    assert [a.job_id for a in attempts] == ["19", "2", "1", "2", "3", "4"]
    assert attempts == full[:6]
    m = TRUNCATION.fullmatch(truncation.reason)
    assert m and int(m.group(1)) == 6
    at = int(m.group(2))
    assert raw[at - 1 : at] == b"}"  # the end of job 4
    assert truncation.raw == raw[at:cut][:4096].decode()


@pytest.mark.parametrize("fraction", [0.25, 0.5, 0.75, 0.95, 0.999])
def test_truncated_anywhere_salvages_a_prefix(fraction):
    raw = read(LAB / "sacct-a-D.json")
    full = attempts_of(parse_sacct_json(raw))
    cut = int(len(raw) * fraction)
    attempts, truncation = salvage(raw, cut)
    m = TRUNCATION.fullmatch(truncation.reason)
    assert m
    count, at = int(m.group(1)), int(m.group(2))
    assert 0 < count <= 22 and count == len(attempts)
    assert attempts == full[:count]
    assert at <= cut
    assert truncation.raw == raw[at:cut][:4096].decode()


def test_truncated_after_the_jobs_array_keeps_every_job():
    raw = read(LAB / "sacct-a-D.json")
    attempts, truncation = salvage(raw, len(raw.rstrip()) - 1)  # "]\n}" lost its brace
    assert len(attempts) == 22
    assert TRUNCATION.fullmatch(truncation.reason).group(1) == "22"  # type: ignore[union-attr]


def test_truncated_in_a_multibyte_character():
    # a cut between the two bytes of "é"; the name is replaced in memory, the rest is real
    raw = read(LAB / "sacct-a-D.json").replace(b'"gpu1-fail"', b'"gpu1-f\xc3\xa9il"')
    cut = raw.index(b"\xa9il")
    attempts, truncation = salvage(raw, cut)
    assert [a.job_id for a in attempts] == ["19", "2", "1", "2", "3", "4"]
    # the lone first byte of the cut character is replaced, and kept in the broken tail
    assert truncation.raw.endswith('"name": "gpu1-f\ufffd')


def test_truncated_recent_file_without_readable_meta():
    # 23.11+ print "jobs" before "meta": a cut in meta leaves no schema name, the job is kept
    raw = read(WEB / "25.11" / "0.0.44" / "slurmdb-job-completed.json")
    cut = raw.index(b'"meta"') + 40
    attempts, truncation = salvage(raw, cut)
    assert [a.job_id for a in attempts] == ["5749"]
    assert TRUNCATION.fullmatch(truncation.reason).group(1) == "1"  # type: ignore[union-attr]


def test_truncated_before_any_job_raises():
    raw = read(LAB / "sacct-a-D.json")
    with pytest.raises(ParseError, match=re.escape("cut.json: truncated JSON before any complete job")):
        parse_sacct_json(raw[:200], origin="cut.json")  # inside meta
    with pytest.raises(ParseError, match="before any complete job"):
        parse_sacct_json(raw[: raw.index(b'"jobs"') + 100], origin="cut.json")


def test_truncated_objects_of_unknown_shape_raise():
    # jobs first, meta cut off, and the objects are not sacct jobs (no "time")
    doc = json.loads(read(WEB / "25.11" / "0.0.44" / "slurmdb-job-completed.json"))
    strange = copy.deepcopy(doc["jobs"][0])
    del strange["time"]
    raw = json.dumps({"jobs": [strange], "meta": doc["meta"]}, indent=2).encode()
    with pytest.raises(ParseError, match="not sacct jobs"):
        parse_sacct_json(raw[: raw.index(b'"meta"') + 30], origin="cut.json")


def test_damage_inside_one_job_rejects_that_job_alone():
    # one job that is not JSON: the others of the document are kept (per-record isolation)
    raw = read(LAB / "sacct-a-D.json")
    broken = raw.replace(b'"name": "gpu1-fail",', b'"name": "gpu1-fail" "x",', 1)
    records = parse_sacct_json(broken, origin="lab")
    (bad,) = [r for r in records if isinstance(r, Rejected)]
    assert (bad.origin, bad.record_key) == ("lab", "jobs[6]")
    assert bad.reason.startswith("job is not valid JSON: Expecting ',' delimiter")
    assert '"name": "gpu1-fail" "x",' in bad.raw
    assert lab_rows([r for r in records if isinstance(r, JobAttempt)]) == [
        row for row in expected_lab_rows() if row[0] != "5"
    ]


def test_damage_outside_the_jobs_raises():
    raw = read(LAB / "sacct-a-D.json")
    broken = raw.replace(b'"meta": {', b'"meta": {{', 1)
    with pytest.raises(ParseError, match=r"^lab: invalid JSON"):
        parse_sacct_json(broken, origin="lab")


# --- the fields read, against SchedMD's own job schemas (schemas, not inputs) ------------------

SCHEMAS = {
    "0.0.37": ("slurm_schedmd/openapi_dbv0.0.37_slurm-21.08.json", "dbv0.0.37_job"),
    "0.0.38": ("slurm_schedmd/openapi_dbv0.0.38_slurm-22.05.json", "dbv0.0.38_job"),
    "0.0.40": ("lcrownover_slurm_exporter/slurmdb_jobs_subset_v0.0.40.json", "v0.0.40_job"),
    "0.0.41": ("slurm_schedmd/slurmdb_jobs_subset_v0.0.41.json", "v0.0.41_job"),
    "0.0.42": ("slurm_schedmd/slurmdb_jobs_subset_v0.0.42.json", "v0.0.42_job"),
    "0.0.43": ("slurm_schedmd/slurmdb_jobs_subset_v0.0.43.json", "v0.0.43_job"),
    "0.0.44": ("slurm_schedmd/slurmdb_jobs_subset_v0.0.44.json", "v0.0.44_job"),
}
# every job field parse_sacct_json reads
FIELDS_READ = [
    "job_id", "cluster", "name", "user", "account", "partition", "qos", "nodes", "working_directory",
    "time.submission", "time.eligible", "time.start", "time.end", "time.limit",
    "state.current", "state.reason", "tres.allocated", "tres.requested", "required.CPUs",
    "array.job_id", "array.task_id", "array.task", "array.limits.max.running.tasks",
    "het.job_id", "het.job_offset", "exit_code.return_code", "wckey.wckey",
]  # fmt: skip


def schema_of(version: str, path: str) -> dict[str, object]:
    file, job = SCHEMAS[version]
    spec = json.loads((FIXTURES / file).read_text())
    schemas = spec["components"]["schemas"]

    def resolve(node: dict[str, object]) -> dict[str, object]:
        while "$ref" in node:
            node = schemas[str(node["$ref"]).rsplit("/", 1)[1]]
        return node

    node = resolve(schemas[job])
    for part in path.split("."):
        node = resolve(node["properties"][part])  # type: ignore[index]
    return node


@pytest.mark.parametrize("version", sorted(SCHEMAS))
def test_fields_read_exist_in_every_job_schema(version):
    for path in FIELDS_READ:
        assert schema_of(version, path), f"{version}: {path}"
    signal = schema_of(version, "exit_code.signal")["properties"]
    assert ("signal_id" if version < "0.0.40" else "id") in signal  # type: ignore[operator]
    if version >= "0.0.40":
        assert schema_of(version, "submit_line")["type"] == "string"


@pytest.mark.parametrize("version", sorted(SCHEMAS))
def test_shapes_that_changed_between_schemas(version):
    current = schema_of(version, "state.current")
    limit = schema_of(version, "time.limit")
    task_id = schema_of(version, "array.task_id")
    if version < "0.0.40":
        assert current["type"] == "string"
        assert limit["type"] == task_id["type"] == "integer"
    else:
        assert current["type"] == "array"
        for number in (
            limit,
            task_id,
            schema_of(version, "het.job_offset"),
            schema_of(version, "exit_code.return_code"),
        ):
            assert set(number["properties"]) == {"set", "infinite", "number"}  # type: ignore[arg-type]
    # epoch integers in every version
    assert schema_of(version, "time.submission")["type"] == "integer"


# --- Slurm's "not set", in every numeric and time field ---------------------------------------

SENTINELS = [4294967294, 4294967295, 18446744073709551614, {"set": False, "infinite": False, "number": 5}]
# (path in the job, the JobAttempt field it gives)
SENTINEL_FIELDS = [
    (("time", "start"), "start_at"),
    (("time", "end"), "end_at"),
    (("time", "eligible"), "eligible_at"),
    (("time", "limit"), "time_limit_seconds"),
    (("uid",), "uid"),
    (("array", "task_id"), "array_task_id"),
    (("array", "job_id"), "array_job_id"),
    (("het", "job_id"), "het_job_id"),
    (("het", "job_offset"), "het_job_offset"),
]


@pytest.mark.parametrize(("path", "attribute"), SENTINEL_FIELDS, ids=[a for _, a in SENTINEL_FIELDS])
@pytest.mark.parametrize("sentinel", SENTINELS, ids=["NO_VAL", "INFINITE", "NO_VAL64", "unset"])
def test_sentinels_are_not_set_in_every_field(
    path: tuple[str, ...], attribute: str, sentinel: object
) -> None:
    doc = json.loads(read(WEB / "24.11" / "0.0.42" / "slurmdb-job-completed.json"))
    node = doc["jobs"][0]
    for part in path[:-1]:
        node = node.setdefault(part, {})
    node[path[-1]] = sentinel
    (attempt,) = attempts_of(parse_sacct_json(json.dumps(doc)))
    assert getattr(attempt, attribute) is None
    # and a TRES count of NO_VAL is no count
    doc["jobs"][0]["tres"]["allocated"].append({"type": "gres", "name": "gpu", "id": 1001, "count": sentinel})
    (attempt,) = attempts_of(parse_sacct_json(json.dumps(doc)))
    assert "gres/gpu" not in attempt.alloc_tres and attempt.alloc_gpus == 0


@pytest.mark.parametrize("sentinel", SENTINELS, ids=["NO_VAL", "INFINITE", "NO_VAL64", "unset"])
def test_a_sentinel_where_an_id_or_submission_must_be_rejects_the_job(sentinel: object) -> None:
    doc = json.loads(read(WEB / "24.11" / "0.0.42" / "slurmdb-job-completed.json"))
    doc["jobs"][0]["time"]["submission"] = sentinel
    (bad,) = parse_sacct_json(json.dumps(doc))
    assert isinstance(bad, Rejected) and bad.reason == "no submission time"
    doc = json.loads(read(WEB / "24.11" / "0.0.42" / "slurmdb-job-completed.json"))
    doc["jobs"][0]["job_id"] = sentinel
    (bad,) = parse_sacct_json(json.dumps(doc))
    assert isinstance(bad, Rejected) and bad.reason.startswith("no job_id")


@pytest.mark.parametrize(
    ("errors", "empty"),
    [
        ([{"error": "Nothing found", "error_number": 9003}], True),
        ([{"description": "Nothing found"}], True),
        # no number: a text that begins "Nothing found" only says so too
        ([{"error": "Nothing found with query"}], True),
        ([{"description": "nothing found for the given filters", "error": ""}], True),
        # a number that is not 9003 with more words, or another error, is a failure
        ([{"error": "Nothing found with query", "error_number": 7000}], False),
        ([{"error": "Unable to connect to database"}], False),
        ([{"error": "Nothing found with query"}, {"error": "Unable to connect"}], False),
    ],
)
def test_nothing_found_beside_no_jobs_is_an_empty_window(errors: list[dict[str, Any]], empty: bool) -> None:
    doc = json.dumps({"meta": {}, "errors": errors, "warnings": [], "jobs": []})
    if empty:
        assert [r for r in parse_sacct_json(doc) if not isinstance(r, SchemaNotice)] == []
    else:
        with pytest.raises(ParseError):
            parse_sacct_json(doc)


def test_a_job_without_a_cluster_takes_meta_s_then_the_given_one() -> None:
    """A job that names no cluster: meta's (wherever meta stands), else --cluster/site.cluster
    (default_cluster); one that names its own keeps it. (It refused the whole document.)"""
    doc = json.loads((LAB / "sacct-a-D.json").read_text())
    doc["jobs"][0].pop("cluster", None)
    doc["jobs"][1]["cluster"] = "own"
    doc["meta"] = {k: v for k, v in doc.get("meta", {}).items() if k not in ("Slurm", "slurm")}
    attempts = [
        r for r in parse_sacct_json(json.dumps(doc), default_cluster="site") if isinstance(r, JobAttempt)
    ]
    assert attempts[0].cluster == "site" and attempts[1].cluster == "own"
    doc["meta"]["slurm"] = {"cluster": "meta"}
    for raw in (json.dumps(doc), json.dumps({"jobs": doc["jobs"], "meta": doc["meta"]})):
        attempts = [r for r in parse_sacct_json(raw, default_cluster="site") if isinstance(r, JobAttempt)]
        assert attempts[0].cluster == "meta" and attempts[1].cluster == "own"


def test_a_field_of_another_json_type_rejects_its_job_alone() -> None:
    doc = json.loads((LAB / "sacct-a-D.json").read_text())
    doc["jobs"][0]["cluster"] = {"name": "lab"}
    doc["jobs"][1]["user"] = ["alice"]
    doc["jobs"][2]["name"] = "a\x00b"
    doc["x_extra"] = "DEEP"
    raw = json.dumps(doc).replace('"DEEP"', "[" * 3000 + "]" * 3000)
    records = parse_sacct_json(raw)
    rejected = {r.record_key: r.reason for r in records if isinstance(r, Rejected)}
    assert any("cluster is dict {'name': 'lab'}, not text" in reason for reason in rejected.values()), (
        rejected
    )
    assert any("user is list ['alice'], not text" in reason for reason in rejected.values()), rejected
    assert rejected.get("top-level 'x_extra'", "").endswith("nested too deeply to read"), rejected
    attempts = [r for r in records if isinstance(r, JobAttempt)]
    assert len(attempts) == len(doc["jobs"]) - 2
    assert "a\ufffdb" in {a.name for a in attempts}


def test_the_quick_type_check_agrees_with_the_full_one_on_a_well_formed_document() -> None:
    """A document msgspec reads (the fast path): a TRES type that is a number, a job id built
    from a pending array's task text with NUL, NUL in wckey and the state reason: the same
    rejections and replacements as the full per-field check gives."""
    doc = json.loads((LAB / "sacct-a-D.json").read_text())
    doc["jobs"][0]["tres"]["requested"] = [{"type": 7, "name": "", "id": 1, "count": 2}]
    doc["jobs"][1]["wckey"] = {"wckey": "w\x00k", "flags": []}
    doc["jobs"][2]["state"]["reason"] = "r\x00"
    records = parse_sacct_json(json.dumps(doc))
    rejected = {r.record_key: r.reason for r in records if isinstance(r, Rejected)}
    assert list(rejected.values()) == [
        "req_tres is dict {7: 2}, not a map of names to integers",
    ], rejected
    attempts = [r for r in records if isinstance(r, JobAttempt)]
    assert len(attempts) == len(doc["jobs"]) - 1
    assert attempts[0].wckey == "w\ufffdk" and attempts[1].state_reason == "r\ufffd"
    for attempt in attempts:
        assert type_problem(attempt) == (attempt, None)


def _every_json_capture() -> list[Path]:
    return sorted(p for p in FIXTURES.rglob("*.json") if p.is_file())


@pytest.mark.parametrize("path", _every_json_capture(), ids=lambda p: str(p.relative_to(FIXTURES)))
def test_the_typed_path_reads_every_capture_as_the_general_path_does(
    path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The typed per-job path (msgspec structs) gives the very records the general per-job
    path (orjson, _attempt) gives, on every real capture: jobs it does not take go there."""
    from slurmtel.parsers import sacct_json

    raw = read(path)
    try:
        typed = parse_sacct_json(raw, origin="x", default_cluster="site")
    except ParseError as exc:
        typed_error: str | None = str(exc)
    else:
        typed_error = None

    def general_only(job: Any, default_cluster: str) -> JobAttempt:
        raise sacct_json._Slow

    monkeypatch.setattr(sacct_json, "_fast_attempt", general_only)
    try:
        general = parse_sacct_json(raw, origin="x", default_cluster="site")
    except ParseError as exc:
        assert typed_error == str(exc)
        return
    assert typed_error is None
    assert typed == general


def test_the_typed_path_reads_generated_jobs_as_the_general_path_does(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The benchmark's jobs (arrays, pending and running ones, steps with usage), and the same
    jobs with the shapes the typed path leaves to the general one."""
    from slurmtel.parsers import sacct_json
    from slurmtel.simulate import render_sacct_json, synthetic_jobs

    jobs = list(synthetic_jobs(400, start=datetime(2026, 11, 1, tzinfo=UTC)))
    doc = orjson.loads(render_sacct_json(jobs, usage_steps=3))
    odd = copy.deepcopy(doc)
    for i, job in enumerate(odd["jobs"][::7]):
        variant = i % 6
        if variant == 0:
            job["time"]["start"] = {"set": True, "infinite": False, "number": job["time"]["start"]}
        elif variant == 1:
            job["tres"]["allocated"] = [t for t in job["tres"]["allocated"] if t["type"] != "cpu"]
            job["required"] = {"CPUs": 12}
        elif variant == 2:
            job["array"] = {
                "job_id": 77,
                "task_id": {"set": False, "infinite": False, "number": 0},
                "task": "1-4",
            }
        elif variant == 3:
            job["time"]["end"] = job["time"]["start"] - 10 if job["time"]["start"] else 1
        elif variant == 4:
            job["name"] = 12
        else:
            job["state"] = {"current": "CANCELLED by 0", "reason": None}
    # the steps' shapes: those the typed steps take (number objects, nulls, a TRES list without
    # memory, an unset count) and those they leave to the general path (a float, a step that
    # is not an object, usage as a list, a type that is not text)
    with_steps = [job for job in odd["jobs"][3::7] if job.get("steps")]
    assert len(with_steps) >= 9
    for i, job in enumerate(with_steps):
        step = job["steps"][0]
        variant = i % 9
        if variant == 0:
            step["time"]["total"]["seconds"] = {"set": True, "infinite": False, "number": 4000}
        elif variant == 1:
            step["time"]["total"] = {"seconds": {"set": False, "infinite": False, "number": 0}}
        elif variant == 2:
            step["time"] = None
            step["tres"]["requested"]["max"] = [
                t for t in step["tres"]["requested"]["max"] if t["type"] != "mem"
            ]
        elif variant == 3:
            mem = next(t for t in step["tres"]["requested"]["total"] if t["type"] == "mem")
            mem["count"] = {"set": False, "infinite": False, "number": 0}
        elif variant == 4:
            for each in job["steps"]:  # a peak of 0 bytes, in every step
                each["tres"] = {"requested": {"max": None, "total": [{"type": "mem", "count": 0}]}}
        elif variant == 5:
            step["time"]["total"]["microseconds"] = 0.5
        elif variant == 6:
            job["steps"].append("a step that is not an object")
        elif variant == 7:
            step["tres"]["requested"] = [step["tres"]["requested"]]
        else:
            step["tres"]["requested"]["max"][0]["type"] = None if i % 2 else 7
    counts = {"typed": 0}
    fast = sacct_json._fast_attempt

    def counting(job: Any, default_cluster: str) -> JobAttempt:
        attempt = fast(job, default_cluster)
        counts["typed"] += 1
        return attempt

    for document in (doc, odd):
        raw = orjson.dumps(document)
        counts["typed"] = 0
        monkeypatch.setattr(sacct_json, "_fast_attempt", counting)
        typed = parse_sacct_json(raw, origin="x")
        taken = counts["typed"]

        def general_only(job: Any, default_cluster: str) -> JobAttempt:
            raise sacct_json._Slow

        monkeypatch.setattr(sacct_json, "_fast_attempt", general_only)
        assert typed == parse_sacct_json(raw, origin="x")
        # every generated job takes the typed path; the altered ones do not
        if document is doc:
            assert taken == len(jobs)
        else:
            assert 0 < taken < len(jobs)
