"""Lustre jobstats on real captures: HPE lustre_exporter's 2.10-era OST/MDT files (bare Slurm
job ids) and whamcloud's recorded `lctl get_param obdfilter.*OST*.job_stats mdt.*.job_stats`
(2.15-era: secs.nsecs, start_time, jobid_name `SLURM_JOB%j:%u:%H`). Counter resets and job-id
reuse between two snapshots; hostile entries quarantined one by one."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slurmtel.parsers.lustre import job_stats_increase, parse_lustre_jobstats
from slurmtel.records import LustreJobStat, Rejected
from tests.conftest import fixture_path

WHAMCLOUD = fixture_path("lustre", "whamcloud_lctl_get_param_obdfilter_mdt_job_stats_slurm.txt")
HPE_OST = fixture_path("lustre", "hpe_lustre_exporter_obdfilter_OST0000_job_stats")
HPE_MDT = fixture_path("lustre", "hpe_lustre_exporter_mdt_MDT0000_job_stats")


def _stats(out: list[LustreJobStat | Rejected]) -> list[LustreJobStat]:
    assert not [r for r in out if isinstance(r, Rejected)]
    return [r for r in out if isinstance(r, LustreJobStat)]


def test_hpe_ost_bare_job_ids() -> None:
    stats = _stats(parse_lustre_jobstats(HPE_OST.read_text(), target="lustrefs-OST0000"))
    assert len(stats) == 35
    first = stats[0]
    assert (first.target, first.job_name, first.job_id) == ("lustrefs-OST0000", "24", "24")
    assert first.write_bytes == 215147593728 and first.write_ops == 64575
    assert first.read_bytes == 0 and first.metadata_ops == 1
    # 2.10 reports no start time and no latencies: not measured
    assert first.start_at is None and first.write_wait_seconds is None
    assert first.snapshot_at.timestamp() == 1510782606


def test_hpe_mdt_metadata_only() -> None:
    stats = _stats(parse_lustre_jobstats(HPE_MDT.read_text(), target="lustrefs-MDT0000"))
    assert len(stats) == 15
    assert all(s.read_bytes is None and s.write_bytes is None for s in stats)
    assert stats[0].metadata_ops == 1


def test_whamcloud_headings_quoted_jobid_name_and_nsecs() -> None:
    stats = _stats(parse_lustre_jobstats(WHAMCLOUD.read_text()))
    assert len(stats) == 16
    assert {s.target for s in stats} == {"es01a-OST0001"}
    named = stats[0]
    assert named.job_name == "SLURM_JOB10:0:es18kxe-co-client" and named.job_id == "10"
    assert named.write_bytes == 11025514496 and named.write_ops == 861
    assert named.write_wait_seconds == pytest.approx(7.304967)
    assert named.start_at is not None and named.snapshot_at.microsecond == 887516
    # the same Slurm job under a second name (jobid_name changed): both kept, both job 10
    assert [s.job_id for s in stats].count("10") == 2


def test_job_pattern_and_names_without_a_job() -> None:
    text = WHAMCLOUD.read_text().replace("SLURM_JOB10:0:", "cp.0:", 1)
    stats = _stats(parse_lustre_jobstats(text))
    assert stats[0].job_id == "" and stats[0].job_name.startswith("cp.0")
    custom = _stats(parse_lustre_jobstats(HPE_OST.read_text(), job_pattern=r"^(\d)"))
    assert custom[0].job_id == "2"


def test_counter_reset_and_job_id_reuse() -> None:
    stats = _stats(parse_lustre_jobstats(WHAMCLOUD.read_text()))
    first = stats[0]
    later = replace(
        first,
        snapshot_at=first.snapshot_at + timedelta(seconds=30),
        write_bytes=first.write_bytes + 1000,  # type: ignore[operator]
        write_ops=first.write_ops + 2,  # type: ignore[operator]
    )
    increase = job_stats_increase(first, later)
    assert increase.write_bytes == 1000 and increase.write_ops == 2 and increase.read_bytes == 0
    # Lustre dropped the entry (job_cleanup_interval) and a new job with the same id made a
    # new one: start_time changed, the counters start again from zero
    reused = replace(later, start_at=later.snapshot_at, write_bytes=500, write_ops=1)
    assert job_stats_increase(later, reused).write_bytes == 500
    # 2.10 has no start_time: a counter that went backwards says the same
    old = _stats(parse_lustre_jobstats(HPE_OST.read_text()))[0]
    reset = replace(old, write_bytes=4096, write_ops=1)
    assert job_stats_increase(old, reset).write_bytes == 4096
    assert job_stats_increase(None, old) == old


def test_hostile_entry_is_quarantined_the_rest_kept() -> None:
    text = HPE_OST.read_text()
    lines = text.splitlines()
    # the second entry's write_bytes is garbage, the fourth entry is cut in the middle
    lines[17] = "  write_bytes:     { samples: lots, unit: bytes }"
    damaged = "\n".join(lines) + "\n- job_id: 999\n  snapshot_"
    out = parse_lustre_jobstats(damaged, origin="/var/lib/lustre.txt")
    bad = [r for r in out if isinstance(r, Rejected)]
    good = [r for r in out if isinstance(r, LustreJobStat)]
    assert len(good) == 34 and len(bad) == 2
    assert "job 26" in bad[0].record_key and "not a counter" in bad[0].reason
    assert "job 999" in bad[1].record_key
    assert all(r.origin == "/var/lib/lustre.txt" for r in bad)


@settings(
    max_examples=150, derandomize=True, deadline=None, database=None, suppress_health_check=list(HealthCheck)
)
@given(st.one_of(st.text(max_size=400), st.binary(max_size=400)))
def test_fuzz_never_raises(raw: str | bytes) -> None:
    for record in parse_lustre_jobstats(raw):
        assert isinstance(record, LustreJobStat | Rejected)
