"""cgroup parsers on real captures: a Slurm cgroup v2 job tree and a v1 tree (treydock's
cgroup_exporter), the kernel's io.stat example, oomd's and procfs' PSI files, a v1 blkio
capture. Hostile text becomes a Rejected with its reason; absent files stay None."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slurmtel.parsers.cgroup import (
    V1_FILES,
    V2_FILES,
    count_cpus,
    parse_blkio_throttle,
    parse_bytes_value,
    parse_cpu_stat,
    parse_cpuacct_usage,
    parse_io_stat,
    parse_job_cgroup,
    parse_pressure,
)
from slurmtel.records import IoDeviceCounters, JobCgroupReading, Rejected
from tests.conftest import fixture_path
from tests.sysfs_trees import untar

V2_TTAR = fixture_path("cgroup", "treydock_cgroup_exporter_slurm_v2_job_4.ttar")
V1_TTAR = fixture_path("cgroup", "treydock_cgroup_exporter_slurm_v1_jobs_10_11.ttar")


def _read(root: Path, names: tuple[str, ...]) -> dict[str, str | None]:
    return {name: (root / name).read_text() if (root / name).exists() else None for name in names}


def test_io_stat_kernel_example() -> None:
    devices = parse_io_stat(fixture_path("cgroup", "kernel_doc_cgroup_v2_io.stat").read_text())
    assert devices == [
        IoDeviceCounters("8:16", 1459200, 314773504, 192, 353, 0, 0),
        IoDeviceCounters("8:0", 90430464, 299008000, 8950, 1252, 50331648, 3021),
    ]


def test_io_stat_oomd_and_empty() -> None:
    devices = parse_io_stat(fixture_path("cgroup", "oomd_system_slice_io.stat").read_bytes())
    assert [d.device for d in devices] == ["1:10", "1:11"]
    assert devices[1].discard_bytes == 6666666666
    # a cgroup that did no block IO yet has an empty io.stat: no device, not an error
    assert parse_io_stat("") == []
    # keys the io.latency controller adds are ignored
    line = "8:0 rbytes=1 wbytes=2 rios=3 wios=4 dbytes=0 dios=0 depth=1 avg_lat=20 win=100\n"
    assert parse_io_stat(line)[0].write_ops == 4


def test_blkio_v1_capture() -> None:
    devices = parse_blkio_throttle(
        fixture_path("cgroup", "intel_cri_rm_blkio.throttle.io_service_bytes_recursive").read_text()
    )
    by = {d.device: d for d in devices}
    assert by["8:16"].read_bytes == 4223325184 and by["8:16"].write_bytes == 3207528448
    assert by["8:0"].read_bytes == 5246572032 and by["8:0"].write_bytes == 2361737216
    # bytes only: the operation counts come from io_serviced, not read here
    assert by["8:0"].read_ops is None


def test_pressure_captures() -> None:
    io = parse_pressure(fixture_path("cgroup", "oomd_system_slice_io.pressure").read_text(), "io")
    assert io.some_total_seconds == pytest.approx(134829.384401)
    assert io.full_total_seconds == pytest.approx(128544.748771)
    assert io.some_avg10_share == pytest.approx(0.0112)
    cpu = parse_pressure(fixture_path("cgroup", "procfs_proc_pressure_cpu_some_only.txt").read_text(), "cpu")
    # kernels before 5.13 print no `full` line for cpu: not measured, not zero
    assert cpu.full_total_seconds is None and cpu.some_total_seconds == pytest.approx(15e-6)
    mem = parse_pressure(fixture_path("cgroup", "oomd_system_slice_memory.pressure").read_text(), "memory")
    assert mem.full_avg10_share == pytest.approx(0.0444)


def test_slurm_v2_job_tree(tmp_path: Path) -> None:
    root = untar(V2_TTAR, tmp_path, "fixtures/")
    job = root / "system.slice" / "slurmstepd.scope" / "job_4"
    out = parse_job_cgroup(_read(job, V2_FILES), job_id="4", version=2)
    assert out == [
        JobCgroupReading(
            job_id="4",
            cgroup_version=2,
            cpu_usage_seconds=0.126686,
            cpus=1,
            memory_peak_bytes=7229440,
        )
    ]
    # this node gave the job no io controller and has no PSI files: every such figure is None
    reading = out[0]
    assert isinstance(reading, JobCgroupReading)
    assert reading.read_bytes is None and reading.io_some_stall_seconds is None


def test_slurm_v1_job_tree(tmp_path: Path) -> None:
    root = untar(V1_TTAR, tmp_path, "fixtures/")
    files = {
        "cpuacct/cpuacct.usage": (root / "cpuacct/slurm/uid_20821/job_10/cpuacct.usage").read_text(),
        "memory/memory.max_usage_in_bytes": (
            root / "memory/slurm/uid_20821/job_10/memory.max_usage_in_bytes"
        ).read_text(),
    }
    out = parse_job_cgroup(files, job_id="10", version=1)
    assert out == [
        JobCgroupReading(
            job_id="10", cgroup_version=1, cpu_usage_seconds=0.007710215, memory_peak_bytes=552960
        )
    ]
    assert parse_cpuacct_usage("7710215\n").usage_seconds == pytest.approx(0.007710215)
    assert set(V1_FILES) >= set(files)


def test_one_bad_file_is_quarantined_the_rest_kept(tmp_path: Path) -> None:
    root = untar(V2_TTAR, tmp_path, "fixtures/")
    job = root / "system.slice" / "slurmstepd.scope" / "job_4"
    files = _read(job, V2_FILES)
    files["io.stat"] = "8:0 rbytes=12 wbytes=-5\n"
    files["io.pressure"] = (
        "some avg10=0.00 avg60=0.00 avg300=0.00 total=12\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=7\n"
    )
    out = parse_job_cgroup(files, job_id="4", version=2, origin="gpu01")
    reading, bad = out
    assert isinstance(reading, JobCgroupReading) and isinstance(bad, Rejected)
    assert bad.source == "cgroup" and bad.origin == "gpu01" and "io.stat" in bad.record_key
    assert "not a counter" in bad.reason and "wbytes=-5" in bad.raw
    assert reading.read_bytes is None and reading.cpu_usage_seconds == pytest.approx(0.126686)
    assert reading.io_some_stall_seconds == pytest.approx(12e-6)
    assert reading.io_full_stall_seconds == pytest.approx(7e-6)


@pytest.mark.parametrize(
    ("call", "text"),
    [
        (parse_io_stat, "rbytes=1 wbytes=2\n"),
        (parse_io_stat, "8:0 rbytes\n"),
        (parse_io_stat, "8:0 rbytes=99999999999999999999999\n"),
        (parse_cpu_stat, "user_usec 5\n"),
        (parse_cpu_stat, "usage_usec 5 6\n"),
        (lambda raw: parse_pressure(raw, "io"), "full avg10=0.00 avg60=0.00 avg300=0.00 total=1\n"),
        (lambda raw: parse_pressure(raw, "io"), "some avg10=120.00 avg60=0.00 avg300=0.00 total=1\n"),
        (lambda raw: parse_blkio_throttle(raw), "8:0 Read\n"),
        (lambda raw: parse_blkio_throttle(raw), "8:0 Frobnicate 5\n"),
        (count_cpus, "0-99999999999"),
        (count_cpus, "3-1"),
        (lambda raw: parse_bytes_value(raw, "memory.peak"), "\x00\n"),
    ],
)
def test_hostile_text_raises_value_error(call: object, text: str) -> None:
    with pytest.raises(ValueError):
        call(text)  # type: ignore[operator]


def test_memory_max_and_cpuset() -> None:
    assert parse_bytes_value("max\n") is None
    assert count_cpus("0-3,8-11\n") == 8
    assert count_cpus("\n") is None


@settings(
    max_examples=150, derandomize=True, deadline=None, database=None, suppress_health_check=list(HealthCheck)
)
@given(st.dictionaries(st.sampled_from(V2_FILES), st.one_of(st.text(max_size=200), st.binary(max_size=200))))
def test_fuzz_never_raises(files: dict[str, str | bytes]) -> None:
    out = parse_job_cgroup(files, job_id="7", version=2)
    assert isinstance(out[0], JobCgroupReading)
    assert all(isinstance(r, Rejected) and r.reason for r in out[1:])
