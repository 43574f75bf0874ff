"""parse_sacct_json's job-by-job path against its general path, on the real captures.

A document msgspec can split is read job by job (each job decoded by orjson, read, freed);
anything else goes the general path (the document decoded at once, or recovered). Both must
give the very same records. The captures are the ones tests/test_parse_sacct_json.py reads
(tests/fixtures/sacct/PROVENANCE.md); modified inputs are built in memory.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import orjson
import pytest

from slurmtel.errors import ParseError
from slurmtel.gcpause import gc_paused
from slurmtel.parsers import sacct_json
from slurmtel.parsers.sacct_json import parse_sacct_json
from slurmtel.records import JobAttempt, Rejected

FIXTURES = Path(__file__).parent / "fixtures" / "sacct"
CAPTURES = sorted(p for p in FIXTURES.rglob("*.json") if b'"jobs"' in p.read_bytes())
LAB = FIXTURES / "slurm-22.05" / "sacct-a-D.json"


def outcome(parse: Callable[[bytes, str], list[JobAttempt | Rejected]], raw: bytes, origin: str) -> object:
    try:
        return parse(raw, origin)
    except ParseError as exc:
        return f"ParseError: {exc}"


def schema(path: Path) -> str | None:
    meta = orjson.loads(path.read_bytes()).get("meta") or {}
    plugin, plugins = meta.get("plugin") or {}, meta.get("plugins") or {}
    return plugin.get("data_parser") or plugins.get("data_parser") or plugin.get("type")


def test_the_captures_cover_every_schema() -> None:
    schemas = {schema(p) for p in CAPTURES}
    assert {"openapi/dbv0.0.37", "openapi/dbv0.0.38", "data_parser/v0.0.39"} <= schemas
    assert {f"data_parser/v0.0.{v}" for v in range(40, 45)} <= schemas


@pytest.mark.parametrize("path", CAPTURES, ids=lambda p: str(p.relative_to(FIXTURES)))
def test_job_by_job_equals_the_whole_document(path: Path) -> None:
    raw = path.read_bytes()
    fast = outcome(sacct_json._parse, raw, str(path))
    assert fast == outcome(sacct_json._parse_whole, raw, str(path))
    # and the public function is the job-by-job path
    assert outcome(lambda r, o: parse_sacct_json(r, origin=o), raw, str(path)) == fast


def test_a_number_orjson_refuses_sends_the_document_the_general_way() -> None:
    # 1e999 in a field slurmtel does not read: msgspec skips it, orjson refuses the job, and
    # the general path (Python's json, which reads it as infinity) keeps every job
    raw = LAB.read_bytes()
    assert raw.count(b'"priority": 1,') >= 1
    damaged = raw.replace(b'"priority": 1,', b'"priority": 1e999,', 1)
    records = parse_sacct_json(damaged, origin="lab")
    assert records == parse_sacct_json(raw, origin="lab")
    assert len(records) == 22 and all(isinstance(r, JobAttempt) for r in records)


def test_bad_utf8_in_one_job_keeps_the_batch_and_its_name() -> None:
    # msgspec does not look inside the strings it skips; orjson refuses the job; the general
    # path reads the document with the bad byte replaced
    raw = LAB.read_bytes()
    damaged = raw.replace(b'"name": "gpu1-fail"', b'"name": "gpu1-f\xffil"', 1)
    assert damaged != raw
    expected = [
        replace(r, name="gpu1-f\ufffdil") if isinstance(r, JobAttempt) and r.name == "gpu1-fail" else r
        for r in parse_sacct_json(raw, origin="lab")
    ]
    assert parse_sacct_json(damaged, origin="lab") == expected
    assert sum(isinstance(r, JobAttempt) and r.name == "gpu1-f\ufffdil" for r in expected) == 1


def test_a_job_that_is_not_an_object_is_rejected_on_either_path() -> None:
    doc = orjson.loads(LAB.read_bytes())
    doc["jobs"].insert(3, "not a job")
    raw = orjson.dumps(doc)
    records = parse_sacct_json(raw, origin="lab")
    rejected = [r for r in records if isinstance(r, Rejected)]
    assert [(r.record_key, r.reason, r.raw) for r in rejected] == [
        ("jobs[3]", "job is not a JSON object", '"not a job"')
    ]
    assert records == sacct_json._parse_whole(raw, "lab")


def test_a_rejected_job_keeps_its_raw_object_without_steps() -> None:
    doc = orjson.loads(LAB.read_bytes())
    job = doc["jobs"][0]
    job["time"]["end"] = job["time"]["start"] - 60
    records = parse_sacct_json(orjson.dumps(doc), origin="lab")
    (bad,) = [r for r in records if isinstance(r, Rejected)]
    kept = orjson.loads(bad.raw)
    assert "steps" not in kept and kept["job_id"] == job["job_id"] and kept["time"] == job["time"]


def test_gc_pauses_nest_across_threads_and_restore_the_collector() -> None:
    assert gc.isenabled()
    inside_other = threading.Event()
    release_other = threading.Event()

    def other() -> None:
        with gc_paused():
            inside_other.set()
            release_other.wait()

    thread = threading.Thread(target=other)
    with gc_paused():
        assert not gc.isenabled()
        thread.start()
        inside_other.wait()
    # the other thread's pause is still on
    assert not gc.isenabled()
    release_other.set()
    thread.join()
    assert gc.isenabled()


def test_gc_pause_leaves_a_disabled_collector_disabled() -> None:
    gc.disable()
    try:
        with gc_paused(), gc_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()
