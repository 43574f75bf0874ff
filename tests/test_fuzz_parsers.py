"""Property tests (hypothesis) of every parser: whatever the input, a parser returns its records
(bad ones as Rejected, with a reason) or raises ParseError for the input as a whole; it never
raises anything else, and one damaged record never changes the records around it.

Inputs are arbitrary bytes and text (unpaired surrogates, NUL, control characters included)
and real captures from tests/fixtures with one record's field replaced by an arbitrary value.
Bounded and deterministic (derandomize, a small example budget) so the suite stays fast.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slurmtel.agent.protocol import decode_summaries_response, encode_summaries_response, record_to_json
from slurmtel.errors import ParseError, SourceUnavailable
from slurmtel.parsers.dcgm import dcgm_inventory, dcgm_summaries, parse_dcgm_metrics
from slurmtel.parsers.gres import gpu_items, parse_gres, physical_gpus
from slurmtel.parsers.nvidia_smi import parse_nvidia_smi_list, parse_nvidia_smi_query, parse_nvidia_smi_xml
from slurmtel.parsers.prometheus import (
    matrix_scrapes,
    parse_prometheus_matrix,
    scrape_inventory,
    scrape_summaries,
)
from slurmtel.parsers.sacct_json import parse_sacct_json
from slurmtel.parsers.sacct_parsable import SACCT_DELIMITER, SACCT_FIELDS, parse_sacct_parsable
from slurmtel.parsers.sacctmgr import parse_account_parents, parse_coordinators
from slurmtel.parsers.scontrol_config import cluster_name
from slurmtel.parsers.sinfo_nodes import parse_sinfo_gpu_nodes
from slurmtel.parsers.slurmctld import (
    parse_scontrol_jobs,
    parse_scontrol_nodes,
    parse_sinfo_json,
    parse_squeue_json,
)
from slurmtel.records import (
    GpuAllocation,
    GpuInventory,
    GpuSummary,
    JobAttempt,
    NodeState,
    PendingJob,
    Rejected,
    SchemaNotice,
)
from tests.conftest import fixture_path
from tests.factories import T0, windows

pytestmark = pytest.mark.fuzz

AT = datetime(2026, 12, 2, 14, 0, tzinfo=UTC)
FUZZ = settings(
    max_examples=60,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

# every character, unpaired surrogates and controls included
ANY_CHAR = st.characters(codec=None, categories=["L", "M", "N", "P", "S", "Z", "C"])
ANY_TEXT = st.text(ANY_CHAR, max_size=400)
ANY_BYTES = st.binary(max_size=400)
# any JSON value, with integers far beyond every column and sentinels among them
SCALARS = (
    st.none()
    | st.booleans()
    | st.sampled_from([0, -1, 2**31, 2**32, 2**63, 2**64 - 2, 4294967294, 65534, 10**30])
    | st.integers()
    | st.floats()
    | st.text(ANY_CHAR, max_size=20)
)
JSON_VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=10,
)

SACCT_JSON = [
    fixture_path("sacct", "slurm-22.05", "sacct-a-D.json"),
    fixture_path("sacct", "sarc", "sacct_json_slurm_23_2_6.json"),
    fixture_path("sacct", "slurm_web", "24.11", "0.0.42", "slurmdb-job-gpus-multi-nodes.json"),
    fixture_path("sacct", "slurm_web", "25.11", "0.0.44", "slurmdb-job-pending.json"),
]
SQUEUE_JSON = fixture_path("slurmctld", "slurm-22.05", "squeue-running-1.json")
NODES_JSON = fixture_path("slurmctld", "lcrownover_slurm_exporter", "V0040OpenapiNodesResp.json")
DCGM = fixture_path("dcgm", "datadog_dcgm", "metrics.txt")
PSV = fixture_path("sacct", "slurm-22.05", "sacct-a-D-P.psv")


def is_parse_error_or(call: Callable[[], Any]) -> Any:
    """CALL's result, or None when it raised ParseError; anything else fails the test."""
    try:
        return call()
    except ParseError as exc:
        assert str(exc), "a ParseError says why"
        return None


def check_rejected(records: list[Any]) -> None:
    for r in records:
        if isinstance(r, Rejected):
            assert r.reason and r.record_key and isinstance(r.raw, str)


# ------------------------------------------------------------------ arbitrary input


@FUZZ
@given(st.one_of(ANY_TEXT, ANY_BYTES))
def test_sacct_json_takes_any_input(raw: str | bytes) -> None:
    records = is_parse_error_or(lambda: parse_sacct_json(raw, origin="fuzz"))
    if records is not None:
        assert all(isinstance(r, JobAttempt | Rejected | SchemaNotice) for r in records)
        check_rejected(records)


@FUZZ
@given(ANY_TEXT, st.sampled_from(["|", SACCT_DELIMITER, ",|"]))
def test_sacct_parsable_takes_any_input(raw: str, delimiter: str) -> None:
    for fields in (None, list(SACCT_FIELDS)):
        records = is_parse_error_or(
            lambda fields=fields: parse_sacct_parsable(raw, origin="fuzz", fields=fields, delimiter=delimiter)  # type: ignore[misc]
        )
        if records is not None:
            assert all(isinstance(r, JobAttempt | Rejected) for r in records)
            check_rejected(records)


@FUZZ
@given(st.one_of(ANY_TEXT, ANY_BYTES))
def test_controller_json_takes_any_input(raw: str | bytes) -> None:
    for parse in (parse_squeue_json, parse_sinfo_json):
        records = is_parse_error_or(lambda parse=parse: parse(raw, cluster="lab", at=AT, origin="fuzz"))  # type: ignore[misc]
        if records is not None:
            assert all(
                isinstance(r, GpuAllocation | PendingJob | NodeState | Rejected | SchemaNotice)
                for r in records
            )
            check_rejected(records)


@FUZZ
@given(ANY_TEXT)
def test_controller_text_takes_any_input(raw: str) -> None:
    for parse, prefix in ((parse_scontrol_jobs, "JobId="), (parse_scontrol_nodes, "NodeName=")):
        for text in (raw, prefix + raw):
            records = is_parse_error_or(lambda parse=parse, text=text: parse(text, cluster="lab", at=AT))  # type: ignore[misc]
            if records is not None:
                assert all(
                    isinstance(r, GpuAllocation | PendingJob | NodeState | Rejected | SchemaNotice)
                    for r in records
                )
                check_rejected(records)


@FUZZ
@given(ANY_TEXT)
def test_dcgm_takes_any_input(raw: str) -> None:
    for text in (raw, 'DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-x"} ' + raw):
        scrape = is_parse_error_or(lambda text=text: parse_dcgm_metrics(text, node="gpu01", at=AT))
        if scrape is not None:
            check_rejected(list(scrape.rejected))
            assert all(
                isinstance(s, GpuSummary)
                for s in dcgm_summaries(scrape, window_seconds=30, idle_threshold_percent=5)
            )
            assert all(isinstance(i, GpuInventory) for i in dcgm_inventory(scrape))


@FUZZ
@given(st.one_of(ANY_TEXT, ANY_BYTES))
def test_agent_pages_take_any_input(raw: str | bytes) -> None:
    page = is_parse_error_or(lambda: decode_summaries_response(raw, origin="fuzz"))
    if page is not None:
        check_rejected(list(page.rejected))


@FUZZ
@given(ANY_TEXT)
def test_small_parsers_take_any_input(raw: str) -> None:
    for parse in (parse_nvidia_smi_query, parse_nvidia_smi_xml, parse_nvidia_smi_list, parse_coordinators,
                  parse_account_parents, cluster_name):  # fmt: skip
        is_parse_error_or(lambda parse=parse: parse(raw))  # type: ignore[misc]
    assert all(isinstance(n, str) for n in parse_sinfo_gpu_nodes(raw))
    try:
        items = parse_gres(raw)
    except ValueError:
        return  # documented: a GRES string that is not one
    assert physical_gpus(items) >= 0 and physical_gpus(gpu_items(raw)) >= 0


# ------------------------------------------------------------------ real captures, one record damaged


def attempt_keys(records: list[Any]) -> dict[tuple[str, int, datetime], JobAttempt]:
    return {(a.cluster, a.job_id_raw, a.submit_at): a for a in records if isinstance(a, JobAttempt)}


def set_path(job: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    node = job
    for part in path[:-1]:
        if not isinstance(node.get(part), dict):
            node[part] = {}
        node = node[part]
    node[path[-1]] = value


SACCT_FIELDS_JSON = [
    ("job_id",), ("name",), ("user",), ("account",), ("qos",), ("cluster",), ("nodes",), ("uid",),
    ("time", "submission"), ("time", "start"), ("time", "end"), ("time", "eligible"), ("time", "limit"),
    ("state",), ("state", "current"), ("tres",), ("tres", "allocated"), ("array", "task_id"),
    ("array", "job_id"), ("het", "job_offset"), ("exit_code",), ("wckey",), ("required", "CPUs"), ("time",),
]  # fmt: skip


def one_by_one(doc: dict[str, Any], key: str, parse: Callable[[str], list[Any]]) -> list[Any]:
    """What parsing each record of DOC in a document of its own gives, in order: what the
    whole document must give when records are read in isolation."""
    out: list[Any] = []
    for item in doc[key]:
        out += parse(json.dumps({**doc, key: [item]}))
    return out


def records_of(records: list[Any]) -> list[Any]:
    return [r for r in records if not isinstance(r, SchemaNotice)]


@FUZZ
@given(
    st.sampled_from(SACCT_JSON),
    st.integers(min_value=0, max_value=50),
    st.sampled_from(SACCT_FIELDS_JSON),
    JSON_VALUES,
)
def test_one_damaged_sacct_job_leaves_the_others_as_they_were(
    path: Any, pick: int, field: Any, value: Any
) -> None:
    doc = orjson.loads(path.read_bytes())
    index = pick % len(doc["jobs"])
    set_path(doc["jobs"][index], field, value)
    records = parse_sacct_json(json.dumps(doc), origin="fuzz")
    check_rejected(records)
    # every job is read on its own: the damaged one is one record (an attempt or a Rejected)
    # and the others are exactly what they are in documents of their own
    alone = one_by_one(doc, "jobs", lambda text: records_of(parse_sacct_json(text, origin="fuzz")))
    assert records_of(records) == alone
    assert len(records_of(records)) == len(doc["jobs"])


@FUZZ
@given(
    st.integers(min_value=0, max_value=60),
    st.integers(min_value=0, max_value=45),
    st.text(ANY_CHAR, max_size=30),
)
def test_one_damaged_sacct_p_field_leaves_the_other_rows_as_they_were(
    row: int, column: int, value: str
) -> None:
    value = value.replace("|", "").replace("\n", "").replace("\r", "")
    lines = PSV.read_text().split("\n")
    header, rows = lines[0], [line for line in lines[1:] if line]
    baseline = parse_sacct_parsable(PSV.read_text(), origin="fuzz")
    target = row % len(rows)
    fields = rows[target].split("|")
    fields[column % len(fields)] = value
    damaged = "\n".join([header, *rows[:target], "|".join(fields), *rows[target + 1 :]]) + "\n"
    records = parse_sacct_parsable(damaged, origin="fuzz")
    check_rejected(records)
    # the damaged row's job: a step row (1.batch, 7_2.0) feeds its job's step usage, so that
    # job may change; every other job must not. Read from the original row's first two fields.
    damaged_jobs = {re.split(r"[._+]", f, maxsplit=1)[0] for f in rows[target].split("|")[:2]}
    untouched = {k: v for k, v in attempt_keys(baseline).items() if str(k[1]) not in damaged_jobs}
    stored = attempt_keys(records)
    assert {k: stored.get(k) for k in untouched} == untouched


@FUZZ
@given(st.integers(min_value=0, max_value=20), st.sampled_from(
    [("job_id",), ("submit_time",), ("gres_detail",), ("nodes",), ("job_state",), ("user_name",), ("array_task_id",),
     ("eligible_time",), ("tres_req_str",), ("node_count",)]), JSON_VALUES)  # fmt: skip
def test_one_damaged_controller_job_leaves_the_others_as_they_were(pick: int, field: Any, value: Any) -> None:
    doc = orjson.loads(SQUEUE_JSON.read_bytes())
    index = pick % len(doc["jobs"])
    set_path(doc["jobs"][index], field, value)
    records = parse_squeue_json(json.dumps(doc), cluster="lab", at=AT)
    check_rejected(records)
    assert records == one_by_one(doc, "jobs", lambda text: parse_squeue_json(text, cluster="lab", at=AT))


@FUZZ
@given(st.integers(min_value=0, max_value=20), st.sampled_from(
    [("name",), ("gres",), ("gres_used",), ("state",), ("tres",), ("partitions",), ("reason",)]), JSON_VALUES)  # fmt: skip
def test_one_damaged_node_leaves_the_others_as_they_were(pick: int, field: Any, value: Any) -> None:
    doc = orjson.loads(NODES_JSON.read_bytes())
    index = pick % len(doc["nodes"])
    set_path(doc["nodes"][index], field, value)
    records = parse_sinfo_json(json.dumps(doc), cluster="lab", at=AT)
    check_rejected(records)
    assert records == one_by_one(doc, "nodes", lambda text: parse_sinfo_json(text, cluster="lab", at=AT))
    assert len(records) == len(doc["nodes"])


@FUZZ
@given(st.integers(min_value=0, max_value=200), st.text(ANY_CHAR, max_size=60))
def test_one_damaged_dcgm_line_leaves_the_other_gpus_as_they_were(pick: int, junk: str) -> None:
    lines = DCGM.read_text().split("\n")
    index = pick % len(lines)
    lines[index] = junk.replace("\n", " ")
    scrape = parse_dcgm_metrics("\n".join(lines), node="gpu01", at=AT)
    check_rejected(list(scrape.rejected))
    # a single GPU's line at most changed what is known of that GPU
    assert len(scrape.gpus) >= 1


SUMMARY_FIELDS = ["window_start_at", "sample_count", "covered_seconds", "util_mean_percent", "gpu_uuid",
                  "job_ids", "memory_used_max_bytes", "energy_joules", "window_seconds"]  # fmt: skip


@FUZZ
@given(st.integers(min_value=0, max_value=9), st.sampled_from(SUMMARY_FIELDS), JSON_VALUES)
def test_one_damaged_agent_item_leaves_the_page(pick: int, field: str, value: Any) -> None:
    records = windows("GPU-0", T0, 10)
    items = []
    for seq, record in enumerate(records, start=1):
        data = json.loads(record_to_json(record))
        if seq - 1 == pick:
            data[field] = value
        items.append((seq, "summary", json.dumps(data)))
    raw = encode_summaries_response(
        node="gpu01", agent_version="t", items=items, next_cursor=10, evicted_total=0, spool_items=10,
        spool_bytes=1, spool_id="s",
    )  # fmt: skip
    page = decode_summaries_response(raw, origin="fuzz")
    check_rejected(list(page.rejected))
    assert len(page.items) + len(page.rejected) == 10
    untouched = [item.record for item in page.items if item.seq != pick + 1]
    assert untouched == [r for i, r in enumerate(records) if i != pick]


# ------------------------------------------------------------------ nccl-tests, NVLink, topology, json_scan

NCCL_LOGS = sorted(fixture_path("nccl_tests", "cases").glob("*/input.txt"))[:6]
TOPO_MATRICES = sorted(fixture_path("nvidia_smi_topo").glob("*.txt"))[:4]
NVLINK_TEXTS = sorted(p for p in fixture_path("nvlink").rglob("*.txt"))[:4]


def mutate(text: str, at: int, cut: int, junk: str) -> str:
    """TEXT with CUT characters at a relative position AT (per mille) replaced by JUNK."""
    pos = len(text) * at // 1000
    return text[:pos] + junk + text[pos + cut :]


MUTATION = (st.integers(0, 1000), st.integers(0, 200), ANY_TEXT)


@FUZZ
@given(st.one_of(ANY_TEXT, ANY_BYTES))
def test_fabric_parsers_take_any_input(raw: str | bytes) -> None:
    from slurmtel.parsers.nccl import NcclRun, parse_nccl_tests
    from slurmtel.parsers.nvlink import NvlinkGpu, parse_nvlink
    from slurmtel.parsers.topology import parse_topo_matrix
    from slurmtel.records import NodeTopology

    records = is_parse_error_or(lambda: parse_nccl_tests(raw, origin="fuzz"))
    if records is not None:
        assert all(isinstance(r, NcclRun | Rejected) for r in records)
        check_rejected(records)
    gpus = is_parse_error_or(lambda: parse_nvlink(raw))
    assert gpus is None or all(isinstance(g, NvlinkGpu) for g in gpus)
    topo = is_parse_error_or(lambda: parse_topo_matrix(raw, node="n", observed_at=AT, origin="fuzz"))
    if topo is not None:
        assert all(isinstance(r, NodeTopology | Rejected) for r in topo)
        check_rejected(topo)


@FUZZ
@given(st.integers(0, 10**6), *MUTATION)
def test_mutated_fabric_captures_never_raise_anything_else(pick: int, at: int, cut: int, junk: str) -> None:
    from slurmtel.parsers.nccl import parse_nccl_tests
    from slurmtel.parsers.nvlink import parse_nvlink
    from slurmtel.parsers.topology import parse_topo_matrix

    nccl = mutate(NCCL_LOGS[pick % len(NCCL_LOGS)].read_text(errors="replace"), at, cut, junk)
    records = is_parse_error_or(lambda: parse_nccl_tests(nccl, origin="fuzz"))
    if records is not None:
        check_rejected(records)
    topo = mutate(TOPO_MATRICES[pick % len(TOPO_MATRICES)].read_text(errors="replace"), at, cut, junk)
    found = is_parse_error_or(lambda: parse_topo_matrix(topo, node="n", observed_at=AT, origin="fuzz"))
    if found is not None:
        check_rejected(found)
    if NVLINK_TEXTS:
        is_parse_error_or(
            lambda: parse_nvlink(
                mutate(NVLINK_TEXTS[pick % len(NVLINK_TEXTS)].read_text(errors="replace"), at, cut, junk)
            )
        )


@FUZZ
@given(st.one_of(ANY_TEXT, st.integers(0, 10**6).flatmap(lambda p: st.tuples(st.just(p), *MUTATION))))
def test_json_scan_raises_only_its_own_errors(case: Any) -> None:
    from slurmtel.parsers.json_scan import BadItem, NotAnObject, Truncated, loads_one, read_document

    if isinstance(case, str):
        text = case
    else:
        pick, at, cut, junk = case
        text = (
            mutate(SQUEUE_JSON.read_text(), at, cut, junk)
            if pick % 2
            else mutate(NODES_JSON.read_text(), at, cut, junk)
        )
    try:
        document = read_document(text, "jobs")
    except (Truncated, NotAnObject, ValueError):
        pass
    else:
        assert isinstance(document, dict) and isinstance(document.get("jobs", []), list)
        for item in document.get("jobs", []):
            if isinstance(item, BadItem):
                assert item.reason
    try:
        loads_one(text)
    except ValueError as exc:
        assert str(exc)


# ------------------------------------------------------------------ Prometheus API answers

PROMETHEUS = fixture_path("prometheus_api", "cases", "source_query_two_nodes", "input.json")


def prometheus_or_error(raw: str | bytes) -> Any:
    """The matrix's windows and inventory, or None for a ParseError - or for SourceUnavailable
    when the input is an API error answer (status "error": the server could not run the query)."""
    try:
        matrix = parse_prometheus_matrix(raw, origin="fuzz")
    except ParseError as exc:
        assert str(exc)
        return None
    except SourceUnavailable:
        assert orjson.loads(raw)["status"] == "error"
        return None
    check_rejected(list(matrix.rejected))
    scrapes, rejected = matrix_scrapes(matrix, node_label="instance", origin="fuzz")
    check_rejected(rejected)
    summaries = scrape_summaries(scrapes, window_seconds=30, idle_threshold_percent=5)
    assert all(isinstance(s, GpuSummary) for s in summaries)
    assert all(isinstance(i, GpuInventory) for i in scrape_inventory(scrapes))
    return matrix


@FUZZ
@given(
    st.one_of(ANY_TEXT, ANY_BYTES, JSON_VALUES.map(lambda v: json.dumps({"status": "success", "data": v})))
)
def test_prometheus_answers_take_any_input(raw: str | bytes) -> None:
    prometheus_or_error(raw)


@FUZZ
@given(
    st.integers(min_value=0, max_value=60),
    st.sampled_from(
        [("metric",), ("values",), ("values", 0), ("values", 1, 0), ("values", 2, 1), ("metric", "instance")]
    ),
    JSON_VALUES,
)
def test_one_damaged_prometheus_series_leaves_the_others_as_they_were(
    pick: int, field: Any, value: Any
) -> None:
    doc = orjson.loads(PROMETHEUS.read_bytes())
    series = doc["data"]["result"]
    index = pick % len(series)
    target: Any = series[index]
    for key in field[:-1]:
        target = target[key]
    target[field[-1]] = value
    matrix = prometheus_or_error(json.dumps(doc))
    assert matrix is not None
    # every other series is exactly what it is in an answer of its own
    for i, item in enumerate(series):
        if i == index:
            continue
        alone = parse_prometheus_matrix(
            json.dumps({**doc, "data": {**doc["data"], "result": [item]}}), origin="fuzz"
        )
        assert alone.series[0] in matrix.series
