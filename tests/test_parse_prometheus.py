"""Prometheus HTTP API answers -> series -> DCGM scrapes -> window summaries (parsers/prometheus.py).

Each folder under tests/fixtures/prometheus_api/cases holds an answer (input.json: real answers
of Debian's Prometheus 2.42, or a real answer damaged one way, see PROVENANCE.md) and what the
parser must make of it (expected.json, the golden output): the series, the rejected records,
the warnings, and the windows the dcgm summariser makes of them (node label `instance`,
30 s windows) - or the error an answer that is no matrix is. SLURMTEL_UPDATE_GOLDEN=1 rewrites
the golden files from the parser (then read the diff before committing it).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from slurmtel.errors import SlurmtelError
from slurmtel.parsers.prometheus import (
    matrix_scrapes,
    node_name,
    parse_label_values,
    parse_prometheus_matrix,
    scrape_inventory,
    scrape_summaries,
)

CASES = Path(__file__).parent / "fixtures" / "prometheus_api" / "cases"
CASE_NAMES = sorted(p.name for p in CASES.iterdir() if (p / "input.json").is_file())


def jsonable(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    return value


def parsed(raw: bytes, origin: str) -> dict[str, Any]:
    try:
        matrix = parse_prometheus_matrix(raw, origin=origin)
    except SlurmtelError as exc:
        return {"error": exc.kind, "message": str(exc)}
    scrapes, rejected = matrix_scrapes(matrix, node_label="instance", origin=origin)
    return jsonable(
        {
            "series": [{"labels": s.labels, "points": s.points} for s in matrix.series],
            "points": matrix.points,
            "warnings": matrix.warnings,
            "rejected": [
                {"record_key": r.record_key, "reason": r.reason, "raw": r.raw}
                for r in (*matrix.rejected, *rejected)
            ],
            "dropped": [s.dropped for s in scrapes if s.dropped],
            "summaries": [
                dataclasses.asdict(s)
                for s in scrape_summaries(scrapes, window_seconds=30.0, idle_threshold_percent=5.0)
            ],
            "inventory": [dataclasses.asdict(g) for g in scrape_inventory(scrapes)],
        }
    )


def test_every_case_is_listed_in_the_provenance() -> None:
    provenance = (CASES.parent / "PROVENANCE.md").read_text()
    listed = set(re.findall(r"^\| `([a-z0-9_]+)` \|", provenance, re.M))
    assert listed == set(CASE_NAMES)


@pytest.mark.parametrize("name", CASE_NAMES)
def test_case(name: str) -> None:
    got = parsed((CASES / name / "input.json").read_bytes(), origin=f"{name}/input.json")
    expected_file = CASES / name / "expected.json"
    if os.environ.get("SLURMTEL_UPDATE_GOLDEN") == "1":
        expected_file.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
    assert got == json.loads(expected_file.read_text())


def test_text_and_bytes_read_alike() -> None:
    raw = (CASES / "source_query_two_nodes" / "input.json").read_bytes()
    assert parse_prometheus_matrix(raw, origin="x") == parse_prometheus_matrix(raw.decode(), origin="x")


def test_label_values() -> None:
    assert parse_label_values(b'{"status":"success","data":["gpu02:9400","gpu01:9400"]}', origin="x") == [
        "gpu01:9400",
        "gpu02:9400",
    ]
    with pytest.raises(SlurmtelError, match="not a list of label values"):
        parse_label_values(b'{"status":"success","data":{"a":1}}', origin="x")


@pytest.mark.parametrize(
    ("value", "node"),
    [
        ("gpu01:9400", "gpu01"),
        ("gpu01.cluster.example.org:9400", "gpu01"),
        ("gpu01", "gpu01"),
        ("10.1.2.3:9400", "10.1.2.3"),
        ("[fd00::7]:9400", "fd00::7"),
        ("fd00::7", "fd00::7"),
    ],
)
def test_node_names_as_the_dcgm_source_names_a_target(value: str, node: str) -> None:
    assert node_name(value) == node


def test_windows_before_since_only_give_the_energy_reading() -> None:
    raw = (CASES / "source_query_two_nodes" / "input.json").read_bytes()
    scrapes, _ = matrix_scrapes(parse_prometheus_matrix(raw, origin="x"), node_label="instance", origin="x")
    since = datetime(2026, 12, 2, 12, 0, 30, tzinfo=UTC)
    kept = scrape_summaries(scrapes, window_seconds=30.0, idle_threshold_percent=5.0, since=since)
    assert {s.window_start_at for s in kept} == {since, datetime(2026, 12, 2, 12, 1, tzinfo=UTC)}
    # the T4's first kept window has the counter's increase since the window before
    t4 = [s for s in kept if s.gpu_uuid == "GPU-20c56d28-0da5-6d26-a36a-e7af1ce2586e"]
    assert (t4[0].energy_method, t4[0].energy_joules) == ("counter", pytest.approx(618.0))
