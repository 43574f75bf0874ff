"""The agent's host side of jobs and GPUs: job cgroups read every round from trees built from
real captures (Slurm's cgroup v2 job_4 and v1 jobs 10/11), per-window increases, restarts;
NVML throttle reasons and PCIe from the fake built from real nvidia-smi captures."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import pytest

from slurmtel.agent.fake_nvml import FakeNvml
from slurmtel.agent.host import HostWindows, job_directories, read_jobs, with_pcie
from slurmtel.agent.main import Agent
from slurmtel.agent.nvml import CLOCKS_EVENT_HW_SLOWDOWN, CLOCKS_EVENT_SW_POWER_CAP
from slurmtel.agent.protocol import ALL_KINDS, decode_summaries_response, record_from_dict
from slurmtel.agent.sampler import Sampler
from slurmtel.agent.summarize import WindowSummarizer
from slurmtel.config import config_from_dict
from slurmtel.records import JobCgroupReading, JobHostWindow, Rejected
from tests.conftest import fixture_path
from tests.sysfs_trees import SLURM_V1_TTAR, clone_v2_job, slurm_v2_cgroup, untar, v2_job, write_job_files

T0 = datetime(2026, 12, 2, 13, 0, 0, tzinfo=UTC).timestamp()
H100 = fixture_path("nvidia_smi", "linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01__load__q.txt")
IO = "259:0 rbytes={r} wbytes={w} rios={ro} wios={wo} dbytes=0 dios=0\n"
PSI = "some avg10=0.00 avg60=0.00 avg300=0.00 total={some}\nfull avg10=0.00 avg60=0.00 avg300=0.00 total={full}\n"


def readings(root: Path) -> list[JobCgroupReading]:
    out = read_jobs(root)
    assert not [r for r in out if isinstance(r, Rejected)]
    return [r for r in out if isinstance(r, JobCgroupReading)]


def test_finds_slurm_jobs_in_v2_and_v1_trees(tmp_path: Path) -> None:
    v2 = slurm_v2_cgroup(tmp_path / "v2")
    version, jobs = job_directories(v2)
    assert version == 2 and list(jobs) == ["4"]
    v1 = untar(SLURM_V1_TTAR, tmp_path / "v1", "fixtures/")
    version, jobs = job_directories(v1)
    assert version == 1 and sorted(jobs) == ["10", "11"]
    by_job = {r.job_id: r for r in readings(v1)}
    assert by_job["10"].cpu_usage_seconds == pytest.approx(0.007710215)
    assert by_job["10"].memory_peak_bytes == 552960
    # no blkio controller in this tree: not measured
    assert by_job["10"].read_bytes is None


def test_windows_hold_the_increase_of_each_counter(tmp_path: Path) -> None:
    root = slurm_v2_cgroup(tmp_path / "cg")
    job = v2_job(root, "4")
    write_job_files(job, io_stat=IO.format(r=1000, w=0, ro=1, wo=0), io_pressure=PSI.format(some=10, full=5))
    host = HostWindows("gpu01", 30)
    # first round of the agent: a baseline only (the job's past is not this window's)
    assert host.add(T0 + 1, readings(root)) == []
    write_job_files(
        job,
        io_stat=IO.format(r=5000, w=9_000_000, ro=3, wo=40),
        io_pressure=PSI.format(some=2_000_010, full=1_000_005),
    )
    (job / "cpu.stat").write_text(
        (job / "cpu.stat").read_text().replace("usage_usec 126686", "usage_usec 30126686")
    )
    assert host.add(T0 + 29, readings(root)) == []
    (window,) = host.add(T0 + 31, readings(root))
    assert window == JobHostWindow(
        node="gpu01",
        job_id="4",
        window_start_at=datetime.fromtimestamp(T0, UTC),
        window_seconds=30.0,
        cgroup_version=2,
        read_bytes=4000,
        write_bytes=9_000_000,
        read_ops=2,
        write_ops=40,
        cpu_usage_seconds=30.0,
        cpus=1,
        memory_peak_bytes=7229440,
        io_some_stall_seconds=2.0,
        io_full_stall_seconds=1.0,
        # this tree has no cpu.pressure / memory.pressure: not measured
        cpu_some_stall_seconds=None,
        memory_some_stall_seconds=None,
        memory_full_stall_seconds=None,
    )


def test_a_job_that_starts_later_counts_from_zero_and_one_that_ends_gets_its_last_window(
    tmp_path: Path,
) -> None:
    root = slurm_v2_cgroup(tmp_path / "cg")
    host = HostWindows("gpu01", 30)
    host.add(T0 + 1, readings(root))
    new = clone_v2_job(root, "4", "77")
    write_job_files(new, io_stat=IO.format(r=7_000_000, w=0, ro=70, wo=0))
    host.add(T0 + 10, readings(root))
    # job 4 ends (its cgroup is removed) before the window closes
    shutil.rmtree(v2_job(root, "4"))
    closed = {w.job_id: w for w in host.add(T0 + 31, readings(root))}
    assert closed["77"].read_bytes == 7_000_000 and closed["77"].cpu_usage_seconds == pytest.approx(0.126686)
    assert closed["4"].read_bytes is None and closed["4"].cpu_usage_seconds == 0
    # job 4 is gone for good: the next window has job 77 only
    assert [w.job_id for w in host.add(T0 + 61, readings(root))] == ["77"]


def test_a_counter_that_goes_back_counts_from_zero(tmp_path: Path) -> None:
    root = slurm_v2_cgroup(tmp_path / "cg")
    job = v2_job(root, "4")
    write_job_files(job, io_stat=IO.format(r=10_000, w=0, ro=1, wo=0))
    host = HostWindows("gpu01", 30)
    host.add(T0 + 1, readings(root))
    # the job was requeued onto this node: a new cgroup of the same name
    write_job_files(job, io_stat=IO.format(r=300, w=0, ro=1, wo=0))
    host.add(T0 + 20, readings(root))
    (window,) = host.add(T0 + 31, readings(root))
    assert window.read_bytes == 300


def test_a_bad_file_is_shipped_for_quarantine_once_and_the_rest_kept(tmp_path: Path) -> None:
    root = slurm_v2_cgroup(tmp_path / "cg")
    write_job_files(v2_job(root, "4"), io_stat="259:0 rbytes=twelve\n")
    config = config_from_dict(
        {"agent": {"spool_path": str(tmp_path / "spool.sqlite"), "port": 0, "listen_address": "127.0.0.1",
                   "node_name": "gpu01", "cgroup_root": str(root), "sysfs_root": str(tmp_path / "nosys"),
                   "proc_root": str(tmp_path / "proc")}}
    )  # fmt: skip
    now = [T0 + 1]
    fake = FakeNvml.from_capture(H100, clock=lambda: now[0])
    agent = Agent(config, fake, clock=lambda: now[0])
    agent.start()
    try:
        for t in (T0 + 1, T0 + 2, T0 + 31, T0 + 32):
            now[0] = t
            agent.tick()
        items = agent.spool.read(0, 10000)
        kinds = [i.kind for i in items]
        assert kinds.count("rejected") == 1
        (bad,) = [record_from_dict("rejected", json.loads(i.payload)) for i in items if i.kind == "rejected"]
        assert isinstance(bad, Rejected) and bad.source == "cgroup" and "io.stat" in bad.record_key
        (window,) = [
            record_from_dict("job_host", json.loads(i.payload)) for i in items if i.kind == "job_host"
        ]
        assert isinstance(window, JobHostWindow) and window.read_bytes is None
        assert window.cpu_usage_seconds == 0
        # the H100 capture shows no throttle reason active: no GPU host window is shipped
        assert "gpu_host" not in kinds
        # the head: a page of these decodes; the rejected item is quarantined like an unreadable one
        page = decode_summaries_response(agent.server.summaries(0, 1000, ALL_KINDS))
        assert len(page.job_host_windows) == 1 and not page.gpu_host_windows
        assert [r.source for r in page.rejected] == ["cgroup"]
    finally:
        agent.close()


def test_throttle_reasons_and_pcie_become_gpu_host_windows() -> None:
    now = [T0]
    fake = FakeNvml.from_capture(H100, clock=lambda: now[0])
    uuid = fake.devices[0].uuid
    fake.set_clocks_event_reasons(
        uuid, lambda t: CLOCKS_EVENT_HW_SLOWDOWN | CLOCKS_EVENT_SW_POWER_CAP if T0 + 10 <= t < T0 + 20 else 0
    )
    fake.set_pcie_throughput(uuid, lambda t: (1000, 2000))
    fake.init()
    sampler = Sampler(fake, "gpu01", clock=lambda: now[0], pcie_every=5)
    sampler.discover()
    summarizer = WindowSummarizer("gpu01", 30, 1.0)
    for second in range(0, 32):
        now[0] = T0 + second
        for sample in sampler.sample():
            summarizer.add(now[0], sample)
    (window,) = summarizer.take_host_windows()
    assert window.gpu_uuid == uuid and window.window_start_at == datetime.fromtimestamp(T0, UTC)
    # samples at 11..20 stand for the seconds (10, 20]: 10 s with both reasons
    assert window.throttle_hw_slowdown_seconds == pytest.approx(10.0)
    assert window.throttle_power_seconds == pytest.approx(10.0)
    assert window.throttle_thermal_seconds == 0
    # 30 covered seconds at 1000 KiB/s out, 2000 in (read every 5 rounds, held between)
    assert window.pcie_tx_bytes == 30 * 1000 * 1024 and window.pcie_rx_bytes == 30 * 2000 * 1024
    assert window.throttled
    # the PCIe bytes go to the job window of each job on the GPU in that window
    job = JobHostWindow("gpu01", "4242", window.window_start_at, 30.0, 2)
    other = JobHostWindow("gpu01", "7", window.window_start_at, 30.0, 2)
    held = replace(window, job_ids=("4242",))
    assert with_pcie([job, other], [held]) == [
        replace(job, pcie_tx_bytes=30 * 1000 * 1024, pcie_rx_bytes=30 * 2000 * 1024),
        other,
    ]


def test_a_gpu_without_throttle_or_pcie_readings_has_no_host_window() -> None:
    now = [T0]
    fake = FakeNvml.from_capture(H100, clock=lambda: now[0])
    uuid = fake.devices[0].uuid
    fake.set_clocks_event_reasons(uuid, lambda t: None)
    fake.set_pcie_throughput(uuid, lambda t: None)
    fake.init()
    sampler = Sampler(fake, "gpu01", clock=lambda: now[0])
    sampler.discover()
    summarizer = WindowSummarizer("gpu01", 30, 1.0)
    for second in range(0, 32):
        now[0] = T0 + second
        for sample in sampler.sample():
            summarizer.add(now[0], sample)
    assert summarizer.take_host_windows() == []


def test_baselines_survive_a_restart(tmp_path: Path) -> None:
    root = slurm_v2_cgroup(tmp_path / "cg")
    job = v2_job(root, "4")
    write_job_files(job, io_stat=IO.format(r=100, w=0, ro=1, wo=0))
    host = HostWindows("gpu01", 30)
    host.add(T0 + 1, readings(root))
    state = json.loads(json.dumps(host.export_state()))
    write_job_files(job, io_stat=IO.format(r=600, w=0, ro=2, wo=0))
    later = HostWindows("gpu01", 30)
    later.restore_state(state)
    later.add(T0 + 5, readings(root))
    (window,) = later.add(T0 + 31, readings(root))
    assert window.read_bytes == 500
