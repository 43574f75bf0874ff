"""The sampler through the NVML seam, on fakes built from real captures and a fake /proc."""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from pathlib import Path

import pytest

from slurmtel.agent.fake_nvml import FakeNvml
from slurmtel.agent.metrics import AgentMetrics
from slurmtel.agent.nvml import (
    EVENT_DOUBLE_BIT_ECC,
    EVENT_XID_CRITICAL,
    GPU_IS_LOST,
    NOT_SUPPORTED,
    UNKNOWN,
    GpuProcess,
)
from slurmtel.agent.sampler import Sampler
from slurmtel.agent.summarize import WindowSummarizer
from slurmtel.parsers.nvidia_smi import MIB
from slurmtel.records import GpuEvent
from tests.conftest import fixture_path
from tests.test_agent_procmap import CGROUP_V1, CGROUP_V2, CGROUP_V2_NOT_A_JOB, write_proc

T0 = 1_800_000_000.0
GPU0 = "GPU-00000000-0000-0000-0000-000000000000"
GPU1 = "GPU-00000000-0000-0000-0000-000000000001"


class Clock:
    def __init__(self, t: float = T0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def h100_pair(clock: Clock) -> FakeNvml:
    """Two H100s: the real H100 `-q` section twice, the second with its own UUID and bus id."""
    raw = fixture_path(
        "nvidia_smi", "linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01__load__q.txt"
    ).read_text()
    head, body = raw.split("GPU 00000000:00:09.0\n", 1)
    second = body.replace(GPU0, GPU1).replace("00000000:00:09.0", "00000000:00:0A.0")
    fake = FakeNvml.from_text(
        head + "GPU 00000000:00:09.0\n" + body + "GPU 00000000:00:0A.0\n" + second, clock=clock
    )
    fake.init()
    return fake


def make_sampler(fake: FakeNvml, clock: Clock, proc: Path, metrics: AgentMetrics | None = None) -> Sampler:
    sampler = Sampler(fake, "gpu01", proc, metrics, clock=clock)
    sampler.discover()
    return sampler


def test_h100_sample_with_jobs_from_proc(tmp_path: Path) -> None:
    clock = Clock()
    fake = FakeNvml.from_capture(
        fixture_path("nvidia_smi", "linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01.txt"), clock=clock
    )
    fake.init()
    # the capture's processes: memhog 11327, 11328 and gpu_burn 11345
    write_proc(tmp_path, 11327, CGROUP_V2.replace("job_123", "job_4242"), {"SLURM_JOB_ID": "4242"})
    write_proc(tmp_path, 11328, CGROUP_V1.replace("job_123", "job_4242"))
    write_proc(tmp_path, 11345, CGROUP_V2_NOT_A_JOB, {"SLURM_JOB_ID": "4243"})
    sampler = make_sampler(fake, clock, tmp_path)
    (sample,) = sampler.sample()
    assert sample.gpu_uuid == GPU0
    # Hopper has GPM: GR engine activity, here the captured 100 %
    assert (sample.util_metric, sample.util_percent) == ("gr_engine_active", 100.0)
    assert (sample.memory_used_bytes, sample.memory_total_bytes) == (19818 * MIB, 81559 * MIB)
    assert sample.power_watts == 629.45
    assert sample.temperature_celsius == 59.0
    assert sample.sm_clock_mhz == 1980.0
    assert (sample.ecc_corrected_volatile, sample.ecc_uncorrected_volatile) == (0, 0)
    assert sample.process_count == 3
    assert sample.job_ids == ("4242", "4243")
    assert sampler.error_counts == {}


def test_l40s_uses_gpu_util(tmp_path: Path) -> None:
    clock = Clock()
    fake = FakeNvml.from_capture(
        fixture_path("nvidia_smi", "linux-x86_64__nvidia-l40s__595.80.txt"), clock=clock
    )
    fake.init()
    (sample,) = make_sampler(fake, clock, tmp_path).sample()
    assert (sample.util_metric, sample.util_percent) == ("gpu_util", 9.0)
    assert sample.process_count == 2
    assert sample.job_ids == ()


def test_mig_instances_are_sampled_separately(tmp_path: Path) -> None:
    clock = Clock()
    fake = FakeNvml.from_capture(
        fixture_path("nvidia_smi", "linux-x86_64__nvidia-h200-mig__590.48.01.txt"), clock=clock
    )
    fake.init()
    for pid in (12249, 12250, 12267):
        write_proc(tmp_path, pid, CGROUP_V2.replace("job_123", "job_31"))
    fake.set_utilization("MIG-00000001-0000-0000-0000-000000000001", lambda t: 97.0)
    samples = {s.gpu_uuid: s for s in make_sampler(fake, clock, tmp_path).sample()}
    parent = samples[GPU0]
    # a MIG-enabled GPU has no whole-GPU utilisation, but power and all processes
    assert (parent.util_metric, parent.util_percent) == ("", None)
    assert parent.power_watts == 294.94
    assert parent.process_count == 3
    # ... whose job is the instance's: a parent is never counted beside its instances (the job
    # would hold the whole GPU and its slice, 1 + 2/7 GPUs)
    assert parent.job_ids == ()
    # the processes run in GPU instance 2, compute instance 1: MIG device 1 (2c.3g.71gb)
    busy = samples["MIG-00000001-0000-0000-0000-000000000001"]
    assert (busy.util_metric, busy.util_percent, busy.process_count, busy.job_ids) == (
        "gr_engine_active",
        97.0,
        3,
        ("31",),
    )
    assert busy.power_watts is None
    assert busy.memory_total_bytes == 71424 * MIB
    idle = samples["MIG-00000002-0000-0000-0000-000000000002"]
    assert (idle.process_count, idle.job_ids, idle.util_percent) == (0, (), 0.0)


def test_error_on_one_device_is_recorded_and_the_other_is_sampled(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    clock = Clock()
    fake = h100_pair(clock)
    metrics = AgentMetrics()
    sampler = make_sampler(fake, clock, tmp_path, metrics)
    fake.inject_error(GPU0, "power_usage_milliwatts", UNKNOWN)
    caplog.set_level(logging.WARNING, logger="slurmtel.agent.sampler")
    for _ in range(3):
        clock.t += 1
        by_uuid = {s.gpu_uuid: s for s in sampler.sample()}
        # an Unknown error on power leaves power None; the rest of GPU 0 is sampled
        assert by_uuid[GPU0].power_watts is None
        assert by_uuid[GPU0].util_percent == 100.0
        assert by_uuid[GPU1].power_watts == 629.45
    assert sampler.error_counts == {(GPU0, "nvmlDeviceGetPowerUsage", "Unknown"): 3}
    assert sampler.last_error[GPU0] == "nvmlDeviceGetPowerUsage: Unknown"
    assert (
        metrics.registry.get_sample_value(
            "slurmtel_agent_nvml_errors_total", {"call": "nvmlDeviceGetPowerUsage", "error": "Unknown"}
        )
        == 3.0
    )
    # logged once, not once per round
    assert [r.getMessage() for r in caplog.records] == [f"NVML nvmlDeviceGetPowerUsage on {GPU0}: Unknown"]

    # the GPU falls off the bus: no sample from it (unmeasured), the other GPU goes on
    fake.clear_errors()
    fake.inject_error(GPU0, "memory_info", GPU_IS_LOST)
    clock.t += 1
    samples = sampler.sample()
    assert [s.gpu_uuid for s in samples] == [GPU1]
    assert sampler.last_error[GPU0] == "nvmlDeviceGetMemoryInfo: GpuIsLost"
    assert (
        metrics.registry.get_sample_value("slurmtel_agent_dropped_samples_total", {"reason": "gpu_lost"})
        == 1.0
    )
    assert metrics.registry.get_sample_value("slurmtel_agent_samples_total") == 7.0


def test_not_supported_metric_is_none_and_not_asked_again(tmp_path: Path) -> None:
    clock = Clock()
    fake = h100_pair(clock)
    sampler = make_sampler(fake, clock, tmp_path)
    fake.inject_error(GPU1, "temperature_celsius", NOT_SUPPORTED, count=1)
    before = fake.calls.get("temperature_celsius", 0)
    for _ in range(3):
        clock.t += 1
        samples = {s.gpu_uuid: s for s in sampler.sample()}
        assert samples[GPU1].temperature_celsius is None
        assert samples[GPU0].temperature_celsius == 59.0
    # GPU 1 was asked once; GPU 0 every round
    assert fake.calls["temperature_celsius"] - before == 4


def test_gpm_stopping_falls_back_to_gpu_util(tmp_path: Path) -> None:
    clock = Clock()
    fake = h100_pair(clock)
    sampler = make_sampler(fake, clock, tmp_path)
    fake.inject_error(GPU0, "gr_engine_active_percent", NOT_SUPPORTED)
    samples = {s.gpu_uuid: s for s in sampler.sample()}
    assert (samples[GPU0].util_metric, samples[GPU0].util_percent) == ("gpu_util", 100.0)
    assert samples[GPU1].util_metric == "gr_engine_active"


def test_out_of_range_gpu_util_is_not_utilisation(tmp_path: Path) -> None:
    clock = Clock()
    fake = FakeNvml.from_capture(
        fixture_path("nvidia_smi", "linux-x86_64__nvidia-l40s__595.80.txt"), clock=clock
    )
    fake.init()
    fake.set_utilization(GPU0, lambda t: 4294967295.0)
    (sample,) = make_sampler(fake, clock, tmp_path).sample()
    assert (sample.util_metric, sample.util_percent) == ("", None)


def test_xid_and_ecc_events(tmp_path: Path) -> None:
    clock = Clock()
    fake = h100_pair(clock)
    sampler = make_sampler(fake, clock, tmp_path)
    assert sampler.start_events()
    fake.push_event(GPU1, EVENT_XID_CRITICAL, 79)
    fake.push_event(GPU0, EVENT_DOUBLE_BIT_ECC, 0)
    at = datetime.fromtimestamp(T0, UTC)
    assert sampler.wait_events(0) == [
        GpuEvent("gpu01", GPU1, at, "xid", 79, ""),
        GpuEvent("gpu01", GPU0, at, "ecc_double_bit", 1, "nvml event"),
    ]
    assert sampler.wait_events(0) == []


def test_mig_xid_goes_to_the_instance(tmp_path: Path) -> None:
    clock = Clock()
    fake = FakeNvml.from_capture(
        fixture_path("nvidia_smi", "linux-x86_64__nvidia-h100-mig__590.48.01.txt"), clock=clock
    )
    fake.init()
    sampler = make_sampler(fake, clock, tmp_path)
    sampler.start_events()
    # GPU instance 3 is MIG device 1 (2g.20gb) in the capture
    fake.push_event(GPU0, EVENT_XID_CRITICAL, 43, gpu_instance_id=3, compute_instance_id=0)
    fake.push_event(GPU0, EVENT_XID_CRITICAL, 79)
    events = sampler.wait_events(0)
    assert [(e.gpu_uuid, e.value, e.detail) for e in events] == [
        ("MIG-00000001-0000-0000-0000-000000000001", 43, "gpu_instance_id=3 compute_instance_id=0"),
        (GPU0, 79, ""),
    ]


def test_ecc_counter_growth_is_an_event_where_nvml_sends_none(tmp_path: Path) -> None:
    clock = Clock()
    fake = h100_pair(clock)
    sampler = make_sampler(fake, clock, tmp_path)
    fake.inject_error(GPU0, "register_events", NOT_SUPPORTED)
    sampler.start_events()
    sampler.sample()
    fake.device(GPU0).ecc = (3, 1)
    fake.device(GPU1).ecc = (5, 0)  # GPU 1 has NVML ECC events: its counters make no event
    clock.t += 1
    sampler.sample()
    at = datetime.fromtimestamp(T0 + 1, UTC)
    assert sampler.take_counter_events() == [
        GpuEvent("gpu01", GPU0, at, "ecc_single_bit", 3, "volatile ECC counter"),
        GpuEvent("gpu01", GPU0, at, "ecc_double_bit", 1, "volatile ECC counter"),
    ]
    assert sampler.take_counter_events() == []
    # a periodic re-scan keeps what was learnt: GPU 1 still has NVML events, GPU 0 counters
    sampler.discover()
    fake.device(GPU0).ecc = (4, 1)
    fake.device(GPU1).ecc = (9, 0)
    clock.t += 1
    sampler.sample()
    assert [(e.gpu_uuid, e.kind, e.value) for e in sampler.take_counter_events()] == [
        (GPU0, "ecc_single_bit", 1)
    ]


def test_sampler_and_summarizer_with_a_scripted_timeline(tmp_path: Path) -> None:
    """30 one-second rounds on the H100 fake: idle for 10 s, busy after, job gone after 20 s."""
    clock = Clock(T0 - 1)
    fake = FakeNvml.from_capture(
        fixture_path("nvidia_smi", "linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01.txt"), clock=clock
    )
    fake.init()
    write_proc(tmp_path, 11345, CGROUP_V2.replace("job_123", "job_9"))
    fake.set_utilization(GPU0, lambda t: 1.0 if t < T0 + 10.5 else 88.0)
    fake.set_processes(GPU0, lambda t: [GpuProcess(11345, 100 * MIB)] if t < T0 + 20.5 else [])
    sampler = make_sampler(fake, clock, tmp_path)
    summarizer = WindowSummarizer("gpu01", 30, 1, 5)
    closed = []
    for i in range(32):
        clock.t = T0 - 1 + i
        for sample in sampler.sample():
            closed += summarizer.add(clock.t, sample)
    window = next(x for x in closed if x.window_start_at == datetime.fromtimestamp(T0, UTC))
    assert window.sample_count == 30
    assert window.covered_seconds == 30.0
    # the window holds the intervals ending at T0+1 .. T0+30; those ending at T0+1 .. T0+10 read 1 %
    assert window.idle_seconds == 10.0
    # intervals ending at T0+21 .. T0+30 saw no process
    assert window.no_process_seconds == 10.0
    assert window.job_ids == ("9",)
    assert window.util_metric == "gr_engine_active"
    # the fake's energy counter integrates the captured 629.45 W
    assert window.energy_method == "counter"
    assert window.energy_joules == pytest.approx(629.45 * 30, abs=0.01)
