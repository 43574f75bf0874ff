"""Shared Slurm helpers: number objects, TRES strings and lists, GPU counts, states, node lists."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from slurmtel.parsers.slurm_common import (
    BASE_STATES,
    SACCT_STATE_FLAGS,
    SENTINELS,
    expand_nodelist,
    gpu_count,
    gpu_model,
    minutes_to_seconds,
    normalize_state,
    parse_duration_seconds,
    parse_tres_list,
    parse_tres_string,
    tres_key,
    unwrap_number,
)

FIXTURES = Path(__file__).parent / "fixtures" / "sacct"


def test_unwrap_number_reads_every_shape():
    assert unwrap_number(7200) == 7200
    assert unwrap_number(None) is None
    assert unwrap_number({"set": True, "infinite": False, "number": 7200}) == 7200
    assert unwrap_number({"set": False, "infinite": False, "number": 0}) is None
    assert unwrap_number({"set": True, "infinite": True, "number": 0}) is None
    assert unwrap_number("7200") is None


def test_time_limit_minutes():
    assert minutes_to_seconds(5) == 300
    assert minutes_to_seconds({"set": True, "infinite": False, "number": 2}) == 120
    assert minutes_to_seconds({"set": False, "infinite": False, "number": 0}) is None
    assert minutes_to_seconds({"set": True, "infinite": True, "number": 0}) is None
    # the plain-int schemas print NO_VAL / INFINITE themselves
    assert minutes_to_seconds(0xFFFFFFFE) is None
    assert minutes_to_seconds(0xFFFFFFFF) is None


def test_tres_string_from_the_lab_capture():
    # sacct-a-D.txt, job 13
    tres = parse_tres_string("billing=2,cpu=2,gres/gpu:h100=2,gres/gpu=2,mem=512M,node=2")
    assert tres == {"billing": 2, "cpu": 2, "gres/gpu:h100": 2, "gres/gpu": 2, "mem": 512, "node": 2}
    assert gpu_count(tres) == 2
    assert gpu_model(tres) == "h100"


def test_tres_string_memory_units_are_megabytes():
    assert parse_tres_string("mem=256M")["mem"] == 256
    assert parse_tres_string("mem=125G")["mem"] == 128000
    assert parse_tres_string("mem=2T")["mem"] == 2 * 1024 * 1024
    assert parse_tres_string("mem=1.50G")["mem"] == 1536
    # TRESUsageInTot's mem=3260K (sacct-a-D-P.psv, 1.batch) rounds to 3 MB
    assert parse_tres_string("mem=3260K")["mem"] == 3
    assert parse_tres_string("mem=3000")["mem"] == 3000


def test_tres_string_skips_what_is_not_a_count():
    # TRESUsageInTot of 1.batch in sacct-a-D-P.psv
    usage = "cpu=00:00:00,energy=0,fs/disk=15465,mem=3260K,pages=0,vmem=5512K"
    assert parse_tres_string(usage) == {"energy": 0, "fs/disk": 15465, "mem": 3, "pages": 0, "vmem": 5}
    assert parse_tres_string("") == {}
    assert parse_tres_string("energy=-2,cpu=1") == {"cpu": 1}


def test_gpu_count_matches_xdmods_expected_pairs():
    pairs = json.loads((FIXTURES / "xdmod" / "alloc-tres-gpu-count.json").read_text())
    assert len(pairs) == 9
    for alloc_tres, expected in pairs:
        assert gpu_count(parse_tres_string(alloc_tres)) == expected, alloc_tres


def test_gpu_model_needs_exactly_one_type():
    assert gpu_model(parse_tres_string("billing=1,cpu=1,gres/gpu:p100=1,mem=125G,node=1")) == "p100"
    assert gpu_model(parse_tres_string("gres/gpu=4")) == ""
    assert gpu_model(parse_tres_string("gres/gpu=3,gres/gpu:a100=1,gres/gpu:h100=2")) == ""
    # typed counts add up when the untyped total is missing
    assert gpu_count(parse_tres_string("gres/gpu:a100=1,gres/gpu:h100=2")) == 3
    # gres/gpu wins over the typed counts when present
    assert gpu_count(parse_tres_string("gres/gpu=3,gres/gpu:a100=1,gres/gpu:h100=2")) == 3


def test_tres_list_from_each_schema_generation():
    lab = json.loads((FIXTURES / "slurm-22.05" / "sacct-a-D.json").read_text())
    # job 19's first attempt: name null for cpu/mem/node/billing, "gpu" and "gpu:h100" for gres
    tres = parse_tres_list(lab["jobs"][0]["tres"]["allocated"])
    assert tres == {"cpu": 1, "mem": 256, "node": 1, "billing": 1, "gres/gpu": 2, "gres/gpu:h100": 2}
    sarc = json.loads((FIXTURES / "sarc" / "sacct_json_slurm_23_11_5.json").read_text())
    # name "" and energy -2 (not measured), which is left out
    tres = parse_tres_list(sarc["jobs"][0]["tres"]["allocated"])
    assert tres == {"cpu": 4, "mem": 32768, "node": 1, "billing": 3, "gres/gpu": 2}
    assert parse_tres_list(None) == {}
    assert parse_tres_list([{"type": "cpu", "name": None, "id": 1, "count": None}]) == {}
    assert tres_key("fs", "disk") == "fs/disk"


def test_normalize_state():
    assert normalize_state("CANCELLED by 0") == "CANCELLED"
    assert normalize_state("CANCELLED by 102216") == "CANCELLED"
    assert normalize_state("completed") == "COMPLETED"
    assert normalize_state("FOO") == "FOO"
    assert normalize_state(["RUNNING"]) == "RUNNING"
    assert normalize_state(["OUT_OF_MEMORY"]) == "OUT_OF_MEMORY"
    assert normalize_state([]) == ""
    assert normalize_state(None) == ""
    assert normalize_state("") == ""


def test_normalize_state_list_reports_what_sacct_text_shows():
    # data_parser v0.0.40+ lists the base state and the flags; sacct's text output (and the
    # pre-23.11 JSON string) shows a recognised flag instead of the base state. A requeued
    # attempt is stored with base state PENDING and the REQUEUED flag.
    assert normalize_state(["PENDING", "REQUEUED"]) == "REQUEUED"
    assert normalize_state(["PENDING", "REQUEUE_HOLD"]) == "REQUEUE_HOLD"
    assert normalize_state(["COMPLETED", "UPDATE_DB"]) == "COMPLETED"
    assert normalize_state(["UPDATE_DB", "FAILED"]) == "FAILED"
    assert normalize_state(["FOO", "BAR"]) == "FOO"


def test_expand_nodelist():
    assert expand_nodelist("gpu[01-02,07]") == ("gpu01", "gpu02", "gpu07")
    assert expand_nodelist("ng[30103,30203,30706-30707]") == ("ng30103", "ng30203", "ng30706", "ng30707")
    assert expand_nodelist("cn1") == ("cn1",)
    for none in ("None assigned", "(null)", "", None):
        assert expand_nodelist(none) == ()
    with pytest.raises(ValueError, match="gpu\\[01-"):
        expand_nodelist("gpu[01-")


def test_duration():
    assert parse_duration_seconds("00:05:00") == 300
    assert parse_duration_seconds("3-00:00:00") == 259200
    assert parse_duration_seconds("14:20:00") == 51600
    assert parse_duration_seconds("05:00") == 300
    for unset in ("UNLIMITED", "Partition_Limit", "", None):
        assert parse_duration_seconds(unset) is None
    with pytest.raises(ValueError):
        parse_duration_seconds("five minutes")


tres_names = st.sampled_from(
    ["cpu", "mem", "node", "billing", "energy", "gres/gpu", "gres/gpu:h100", "gres/gpu:a100", "fs/disk"]
)


# counts, and Slurm's "not set" (NO_VAL/INFINITE), which a count never is
counts = st.integers(min_value=0, max_value=2**40) | st.sampled_from(sorted(SENTINELS[64]))


@given(st.dictionaries(tres_names, counts))
def test_tres_string_round_trip(tres):
    text = ",".join(f"{k}={v}" for k, v in tres.items())
    tres = {k: v for k, v in tres.items() if v not in SENTINELS[64]}
    assert parse_tres_string(text) == tres
    typed = {k: v for k, v in tres.items() if k.startswith("gres/gpu:")}
    assert gpu_count(tres) == tres.get("gres/gpu", sum(typed.values()))
    assert gpu_model(tres) == (next(iter(typed))[9:] if len(typed) == 1 else "")


@given(
    st.dictionaries(
        tres_names, st.integers(min_value=-5, max_value=2**40) | st.sampled_from(sorted(SENTINELS[64]))
    )
)
def test_tres_list_agrees_with_string(tres):
    items = [
        {"type": k.split("/", 1)[0], "name": k.split("/", 1)[1] if "/" in k else None, "id": 1, "count": v}
        for k, v in tres.items()
    ]
    # negative counts (energy -2 = not measured) and Slurm's NO_VAL/INFINITE are no counts
    expected = {k: v for k, v in tres.items() if v >= 0 and v not in SENTINELS[64]}
    assert parse_tres_list(items) == expected
    assert parse_tres_string(",".join(f"{k}={v}" for k, v in tres.items())) == expected


@given(
    st.one_of(
        st.sampled_from(sorted(BASE_STATES | set(SACCT_STATE_FLAGS))),
        st.text(alphabet="ABCDEFGHIJKLMNOPQRSTUVWXYZ_", min_size=1, max_size=12),
    ),
    st.integers(min_value=0, max_value=2**31),
)
def test_normalize_state_is_idempotent_and_drops_by_uid(state, uid):
    assert normalize_state(f"{state} by {uid}") == state
    assert normalize_state(normalize_state(state)) == normalize_state(state)
    assert normalize_state([state]) == state


def test_slurm_sentinels_of_every_width_are_not_set() -> None:
    from slurmtel.parsers.slurm_common import slurm_epoch, text_number

    for bits, sentinels in (
        (16, (0xFFFE, 0xFFFF)),
        (32, (0xFFFFFFFE, 0xFFFFFFFF)),
        (64, (2**64 - 2, 2**64 - 1)),
    ):
        for value in sentinels:
            assert unwrap_number(value, bits) is None
            assert unwrap_number({"set": True, "infinite": False, "number": value}, bits) is None
            assert text_number(str(value), bits) is None
            assert slurm_epoch(value) is None
    # a 64-bit field takes the 32-bit NO_VAL Slurm copies into it; a 16-bit one is a real value
    # in wider fields (uid 65534 is nobody)
    assert unwrap_number(0xFFFFFFFE, 64) is None
    assert unwrap_number(65534) == 65534 and text_number("65534") == 65534
    assert unwrap_number(True) is None and unwrap_number(7.0) == 7
    for unset in (0, -1, None, {"set": False, "infinite": False, "number": 1700000000}, "x", True):
        assert slurm_epoch(unset) is None
    assert slurm_epoch({"set": True, "infinite": False, "number": 1700000000}) == 1700000000
