"""dcgm-exporter /metrics parser, on real captures (tests/fixtures/dcgm, see PROVENANCE.md).

Expected values were read by hand from the capture files. Variants (labels re-ordered,
escaped label values, DCGM 4 names, impossible values, MIG and hpc_job labels) are built in the
tests from real lines of datadog_dcgm/metrics.txt; the fixture files are never edited.
"""

from __future__ import annotations

import dataclasses
import math
from datetime import UTC, datetime
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from slurmtel.errors import ParseError
from slurmtel.parsers.dcgm import (
    DcgmGpuSample,
    dcgm_inventory,
    dcgm_summaries,
    parse_dcgm_metrics,
)
from slurmtel.records import GpuInventory, GpuSummary

FIXTURES = Path(__file__).parent / "fixtures" / "dcgm"
AT = datetime(2026, 12, 2, 13, 0, 30, tzinfo=UTC)
MIB = 1024 * 1024
T4_OLD = "GPU-20c56d28-0da5-6d26-a36a-e7af1ce2586e"  # driver 460.106.00 capture, host 424773df46e0
T4_NEW = "GPU-9ef1b6d0-3643-5dd7-b823-c0ec20dcf2d5"  # driver 470.182.03 capture, host 551bdf382151


def read(*parts: str) -> str:
    path = FIXTURES.joinpath(*parts)
    assert path.exists(), path
    return path.read_text()


def datadog() -> str:
    return read("datadog_dcgm", "metrics.txt")


def real_line(metric: str) -> str:
    """The first sample line of METRIC (with labels) in the real datadog capture."""
    for line in datadog().splitlines():
        if line.startswith(metric + "{"):
            return line
    raise AssertionError(f"{metric} not in the capture")


def labels_of(line: str) -> dict[str, str]:
    """Label values of a line as prometheus_client (an independent parser) reads them."""
    (family,) = text_string_to_metric_families(line + "\n")
    (sample,) = family.samples
    return dict(sample.labels)


def render(metric: str, labels: list[tuple[str, str]], value: str) -> str:
    """A sample line with LABELS in the given order, values escaped as the text format says."""

    def escape(text: str) -> str:
        return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")

    body = ",".join(f'{name}="{escape(text)}"' for name, text in labels)
    return f"{metric}{{{body}}} {value}"


def parse(text: str) -> tuple[DcgmGpuSample, ...]:
    scrape = parse_dcgm_metrics(text, node="gpu01", at=AT)
    assert scrape.rejected == ()
    return scrape.gpus


# --------------------------------------------------------------------------- the real capture


def test_datadog_capture_golden() -> None:
    scrape = parse_dcgm_metrics(datadog(), node="gpu01", at=AT)
    assert scrape.rejected == ()
    assert scrape.dropped == {}
    # 115 lines: 77 HELP/TYPE/NOTE comments, 38 samples; the 14 samples after the second
    # "# NOTE" carry no labels (upstream dummies) and cannot be given to a GPU
    assert scrape.sample_lines == 38
    assert scrape.unattributed_lines == 14
    assert [gpu.gpu_uuid for gpu in scrape.gpus] == [T4_OLD, T4_NEW, "GPU-abc"]
    old, new, a10g = scrape.gpus
    assert old == DcgmGpuSample(
        node="gpu01",
        gpu_uuid=T4_OLD,
        observed_at=AT,
        gpu_index=0,
        model="Tesla T4",
        hostname="424773df46e0",
        device="nvidia0",
        driver_version="460.106.00",
        minor_number=0,
        util_metric="gpu_util",
        util_percent=0.0,
        memory_used_bytes=0,
        memory_free_bytes=15109 * MIB,
        # no FB_TOTAL in this capture: used + free
        memory_total_bytes=15109 * MIB,
        power_watts=8.969,
        energy_joules_total=128996.013,
        temperature_celsius=25.0,
        sm_clock_mhz=300.0,
        xid_last=0,
    )
    assert new == DcgmGpuSample(
        node="gpu01",
        gpu_uuid=T4_NEW,
        observed_at=AT,
        gpu_index=0,
        model="Tesla T4",
        hostname="551bdf382151",
        device="nvidia0",
        driver_version="470.182.03",
        cuda_version="12.1",
        vbios_version="90.04.96.00.02",
        minor_number=0,
        memory_total_bytes=15109 * MIB,
        # DCGM_FI_DEV_POWER_MGMT_LIMIT 70.000000: the T4's cap, kept in its inventory
        power_limit_watts=70.0,
    )
    assert a10g == DcgmGpuSample(
        node="gpu01",
        gpu_uuid="GPU-abc",
        observed_at=AT,
        gpu_index=0,
        model="NVIDIA A10G",
        hostname="ip-11111",
        device="nvidia0",
        driver_version="550.144.03",
        cuda_version="12.4",
        minor_number=0,
    )


def test_the_power_limit_goes_into_the_inventory() -> None:
    scrape = parse_dcgm_metrics(datadog(), node="gpu01", at=AT)
    assert {g.gpu_uuid: g.power_limit_watts for g in dcgm_inventory(scrape)} == {
        T4_OLD: None,  # the older capture exports no limit
        T4_NEW: 70.0,
        "GPU-abc": None,
    }


def test_datadog_values_agree_with_prometheus_client() -> None:
    # an independent reader of the same text gives the same numbers for the fields we map
    # (keyed by family name: prometheus_client renames a counter's samples to <name>_total)
    reference: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(datadog()):
        for sample in family.samples:
            if "UUID" in sample.labels:
                reference[(family.name, sample.labels["UUID"])] = sample.value
    (old, new, _a10g) = parse(datadog())
    assert old.power_watts == reference[("DCGM_FI_DEV_POWER_USAGE", T4_OLD)]
    assert old.energy_joules_total == reference[("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", T4_OLD)] / 1000
    assert old.memory_free_bytes == reference[("DCGM_FI_DEV_FB_FREE", T4_OLD)] * MIB
    assert old.sm_clock_mhz == reference[("DCGM_FI_DEV_SM_CLOCK", T4_OLD)]
    assert new.memory_total_bytes == reference[("DCGM_FI_DEV_FB_TOTAL", T4_NEW)] * MIB


def test_datadog_summaries() -> None:
    scrape = parse_dcgm_metrics(datadog(), node="gpu01", at=AT)
    summaries = dcgm_summaries(scrape, window_seconds=30.0, idle_threshold_percent=5.0)
    assert summaries[0] == GpuSummary(
        source="dcgm",
        node="gpu01",
        gpu_uuid=T4_OLD,
        window_start_at=AT,
        window_seconds=30.0,
        util_metric="gpu_util",
        sample_count=1,
        covered_seconds=30.0,
        util_mean_percent=0.0,
        util_max_percent=0.0,
        idle_seconds=30.0,
        no_process_seconds=None,
        memory_used_mean_bytes=0,
        memory_used_max_bytes=0,
        memory_total_bytes=15109 * MIB,
        power_mean_watts=8.969,
        energy_joules=None,
        energy_method="",
        temperature_max_celsius=25.0,
        sm_clock_max_mhz=300.0,
        job_ids=(),
    )
    # no utilisation reading: the window stays unmeasured, neither idle nor busy
    unmeasured = summaries[1]
    assert (unmeasured.gpu_uuid, unmeasured.sample_count, unmeasured.covered_seconds) == (T4_NEW, 0, 0.0)
    assert (unmeasured.idle_seconds, unmeasured.util_mean_percent, unmeasured.util_metric) == (0.0, None, "")
    assert unmeasured.memory_total_bytes == 15109 * MIB
    assert [s.gpu_uuid for s in summaries] == [T4_OLD, T4_NEW, "GPU-abc"]


def test_datadog_inventory() -> None:
    inventory = dcgm_inventory(parse_dcgm_metrics(datadog(), node="gpu01", at=AT))
    assert inventory[1] == GpuInventory(
        node="gpu01",
        gpu_uuid=T4_NEW,
        index=0,
        model="Tesla T4",
        observed_at=AT,
        memory_total_bytes=15109 * MIB,
        minor_number=0,
        driver_version="470.182.03",
        cuda_version="12.1",
        vbios_version="90.04.96.00.02",
        power_limit_watts=70.0,
    )
    assert [(g.gpu_uuid, g.model, g.driver_version) for g in inventory] == [
        (T4_OLD, "Tesla T4", "460.106.00"),
        (T4_NEW, "Tesla T4", "470.182.03"),
        ("GPU-abc", "NVIDIA A10G", "550.144.03"),
    ]


def test_label_remap_capture_extra_labels_do_not_change_the_gpu() -> None:
    (gpu,) = parse(read("datadog_dcgm", "label_remap.txt"))
    assert (gpu.gpu_uuid, gpu.util_percent, gpu.util_metric, gpu.job_ids) == (T4_OLD, 0.0, "gpu_util", ())
    assert gpu.hostname == "424773df46e0"


@pytest.mark.parametrize(
    ("parts", "samples"),
    [
        (("nvidia_gpu_exporter", "linux-x86_64__nvidia-h100-mig__590.48.01__load.metrics"), 128),
        (("nvidia_gpu_exporter", "linux-x86_64__nvidia-l40s__595.80__idle.metrics"), 130),
        (("slurm_job_exporter", "readme_sample.prom"), 101),
    ],
)
def test_other_exporters_are_read_but_give_no_dcgm_gpu(parts: tuple[str, str], samples: int) -> None:
    # nvidia_gpu_exporter (nvidia_smi_* with a "uuid" label) and slurm-job-exporter are not
    # dcgm-exporter: every line is read, none is taken for a DCGM GPU
    text = read(*parts)
    scrape = parse_dcgm_metrics(text, node="gpu01", at=AT)
    assert (scrape.gpus, scrape.rejected, scrape.dropped, scrape.unattributed_lines) == ((), (), {}, 0)
    assert scrape.sample_lines == samples
    assert sum(len(f.samples) for f in text_string_to_metric_families(text)) == samples


# --------------------------------------------------------------------------- variants of real lines


def test_label_order_escapes_spaces_and_trailing_comma() -> None:
    # built from the real GPU_UTIL line: its labels reversed, the Hostname given a quote, a
    # backslash, a newline and a "}" (all legal in a label value), value 57
    line = real_line("DCGM_FI_DEV_GPU_UTIL")
    pairs = list(labels_of(line).items())[::-1]
    hostname = 'node "a"\\b\nc}'
    pairs = [(name, hostname if name == "Hostname" else value) for name, value in pairs]
    reordered = render("DCGM_FI_DEV_GPU_UTIL", pairs, "57")
    assert labels_of(reordered)["Hostname"] == hostname
    (gpu,) = parse(reordered)
    assert (gpu.gpu_uuid, gpu.gpu_index, gpu.model, gpu.hostname) == (T4_OLD, 0, "Tesla T4", hostname)
    assert (gpu.util_percent, gpu.util_metric, gpu.driver_version) == (57.0, "gpu_util", "460.106.00")

    # the same label set written with blanks after the commas and a trailing comma
    spaced = reordered.replace('",', '", ').replace('"} 57', '",} 57')
    assert (spaced.count('", '), spaced.endswith('",} 57')) == (len(pairs) - 1, True)
    assert parse(spaced) == (gpu,)


def test_sample_timestamps_nan_and_inf_values() -> None:
    # real lines with an exposition timestamp after the value; NaN/+Inf are dropped and counted
    power = real_line("DCGM_FI_DEV_POWER_USAGE")
    temp = real_line("DCGM_FI_DEV_GPU_TEMP")
    clock = real_line("DCGM_FI_DEV_SM_CLOCK")
    text = "\n".join(
        [
            power + " 1764680430000",
            temp.rsplit(" ", 1)[0] + " NaN",
            clock.rsplit(" ", 1)[0] + " +Inf 1764680430000",
        ]
    )
    scrape = parse_dcgm_metrics(text, node="gpu01", at=AT)
    (gpu,) = scrape.gpus
    assert (gpu.power_watts, gpu.temperature_celsius, gpu.sm_clock_mhz) == (8.969, None, None)
    assert scrape.dropped == {"temperature_celsius": 1, "sm_clock_mhz": 1}
    assert scrape.rejected == ()


def test_4294967295_utilisation_is_dropped_and_counted() -> None:
    # the real GPU_UTIL line with the unsigned -1 DCGM sometimes reports
    util = real_line("DCGM_FI_DEV_GPU_UTIL").rsplit(" ", 1)[0] + " 4294967295"
    memory = real_line("DCGM_FI_DEV_FB_USED").rsplit(" ", 1)[0] + " -1"
    power = real_line("DCGM_FI_DEV_POWER_USAGE")
    scrape = parse_dcgm_metrics("\n".join([util, memory, power]), node="gpu01", at=AT)
    (gpu,) = scrape.gpus
    assert (gpu.util_percent, gpu.util_metric, gpu.memory_used_bytes, gpu.power_watts) == (
        None,
        "",
        None,
        8.969,
    )
    assert scrape.dropped == {"util_percent": 1, "memory_used_bytes": 1}
    (summary,) = dcgm_summaries(scrape, window_seconds=30.0, idle_threshold_percent=5.0)
    assert (summary.sample_count, summary.covered_seconds, summary.idle_seconds) == (0, 0.0, 0.0)


def test_utilisation_over_100_percent_is_dropped() -> None:
    util = real_line("DCGM_FI_DEV_GPU_UTIL").rsplit(" ", 1)[0] + " 101"
    scrape = parse_dcgm_metrics(util, node="gpu01", at=AT)
    assert (scrape.gpus[0].util_percent, scrape.dropped) == (None, {"util_percent": 1})


def with_metric(line: str, metric: str, value: str) -> str:
    """LINE (a real sample line) with another metric name and value, labels untouched."""
    labels = line[line.index("{") : line.rindex("}") + 1]
    return f"{metric}{labels} {value}"


def test_utilisation_metric_preference_and_fallback() -> None:
    # the real GPU's label set carrying the three utilisation metrics
    base = real_line("DCGM_FI_DEV_GPU_UTIL")
    gr = with_metric(base, "DCGM_FI_PROF_GR_ENGINE_ACTIVE", "0.250000")
    sm = with_metric(base, "DCGM_FI_PROF_SM_ACTIVE", "0.125000")
    util = with_metric(base, "DCGM_FI_DEV_GPU_UTIL", "97")
    (gpu,) = parse("\n".join([util, sm, gr]))
    assert (gpu.util_percent, gpu.util_metric) == (25.0, "gr_engine_active")
    (gpu,) = parse("\n".join([util, sm]))
    assert (gpu.util_percent, gpu.util_metric) == (12.5, "sm_active")
    (gpu,) = parse(util)
    assert (gpu.util_percent, gpu.util_metric) == (97.0, "gpu_util")
    # an impossible GR_ENGINE_ACTIVE falls back to the next metric, and is counted
    scrape = parse_dcgm_metrics(
        "\n".join([with_metric(base, "DCGM_FI_PROF_GR_ENGINE_ACTIVE", "NaN"), sm, util]), node="gpu01", at=AT
    )
    assert (scrape.gpus[0].util_percent, scrape.gpus[0].util_metric) == (12.5, "sm_active")
    assert scrape.dropped == {"util_percent": 1}


def dcgm3_lines() -> list[str]:
    return [
        real_line("DCGM_FI_DEV_GPU_UTIL").rsplit(" ", 1)[0] + " 57",
        real_line("DCGM_FI_DEV_FB_USED").rsplit(" ", 1)[0] + " 1024",
        real_line("DCGM_FI_DEV_FB_FREE"),
        real_line("DCGM_FI_DEV_POWER_USAGE"),
        real_line("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"),
        real_line("DCGM_FI_DEV_GPU_TEMP"),
        real_line("DCGM_FI_DEV_SM_CLOCK"),
        real_line("DCGM_FI_DEV_XID_ERRORS").rsplit(" ", 1)[0] + " 79",
    ]


def test_dcgm4_names_and_units_give_the_same_sample() -> None:
    # the same readings as dcgm-exporter >= 4.9 prints them (DCGM 4.7 names, base units), with
    # the 4.8.3 "hostname" and 4.9 DCGM_FI_SYSTEM_DRIVER_VERSION label names; built from the
    # real lines: metric renamed, value converted, label names changed
    def dcgm4(line: str, metric: str, value: str) -> str:
        renamed = with_metric(line, metric, value)
        return renamed.replace("Hostname=", "hostname=").replace(
            "DCGM_FI_DRIVER_VERSION=", "DCGM_FI_SYSTEM_DRIVER_VERSION="
        )

    lines = dcgm3_lines()
    dcgm4_lines = [
        dcgm4(lines[0], "DCGM_FI_DEV_GPU_UTIL_RATIO", "0.57"),
        dcgm4(lines[1], "DCGM_FI_DEV_FB_USED_BYTES", str(1024 * MIB)),
        dcgm4(lines[2], "DCGM_FI_DEV_FB_FREE_BYTES", str(15109 * MIB)),
        dcgm4(lines[3], "DCGM_FI_DEV_BOARD_POWER_WATTS", "8.969000"),
        dcgm4(lines[4], "DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL", "128996.013"),
        dcgm4(lines[5], "DCGM_FI_DEV_GPU_TEMP_CELSIUS", "25"),
        dcgm4(lines[6], "DCGM_FI_DEV_SM_CLOCK_HERTZ", "300000000"),
        dcgm4(lines[7], "DCGM_FI_DEV_XID_ERROR", "79"),
    ]
    assert "Hostname=" not in "".join(dcgm4_lines)
    (old,) = parse("\n".join(lines))
    (new,) = parse("\n".join(dcgm4_lines))
    assert new.util_percent is not None and math.isclose(new.util_percent, 57.0)
    assert new == DcgmGpuSample(
        node="gpu01",
        gpu_uuid=T4_OLD,
        observed_at=AT,
        gpu_index=0,
        model="Tesla T4",
        hostname="424773df46e0",
        device="nvidia0",
        driver_version="460.106.00",
        minor_number=0,
        util_metric="gpu_util",
        util_percent=new.util_percent,
        memory_used_bytes=1024 * MIB,
        memory_free_bytes=15109 * MIB,
        memory_total_bytes=16133 * MIB,
        power_watts=8.969,
        energy_joules_total=128996.013,
        temperature_celsius=25.0,
        sm_clock_mhz=300.0,
        xid_last=79,
    )
    assert old == dataclasses.replace(new, util_percent=57.0)

    # DCGM 4.7 profiling names
    base = lines[0]
    (gpu,) = parse(with_metric(base, "DCGM_FI_PROF_GR_ENGINE_UTIL_RATIO", "0.5"))
    assert (gpu.util_percent, gpu.util_metric) == (50.0, "gr_engine_active")
    (gpu,) = parse(with_metric(base, "DCGM_FI_PROF_SM_UTIL_RATIO", "0.5"))
    assert (gpu.util_percent, gpu.util_metric) == (50.0, "sm_active")


def test_1x_compatibility_names() -> None:
    # dcgm-exporter's 1.x-compatibility collector names (etc/1.x-compatibility-metrics.csv),
    # on the real label set with the 1.x lowercase "uuid" label
    base = real_line("DCGM_FI_DEV_GPU_UTIL").replace("UUID=", "uuid=")
    lines = [
        with_metric(base, "dcgm_gpu_utilization", "40"),
        with_metric(base, "dcgm_fb_used", "2048"),
        with_metric(base, "dcgm_power_usage", "70.5"),
        with_metric(base, "dcgm_total_energy_consumption", "5000"),
        with_metric(base, "dcgm_fi_prof_gr_engine_active", "0.75"),
    ]
    (gpu,) = parse("\n".join(lines))
    assert (gpu.gpu_uuid, gpu.util_percent, gpu.util_metric) == (T4_OLD, 75.0, "gr_engine_active")
    assert (gpu.memory_used_bytes, gpu.power_watts, gpu.energy_joules_total) == (2048 * MIB, 70.5, 5.0)


def test_mig_instances() -> None:
    # the real label set plus the MIG labels dcgm-exporter adds on MIG instances
    # (GPU_I_PROFILE, GPU_I_ID, as in NVIDIA/dcgm-exporter issue #544); UUID stays the parent's
    def mig(line: str, gi: str, profile: str) -> str:
        return line.replace('Hostname="', f'GPU_I_PROFILE="{profile}",GPU_I_ID="{gi}",Hostname="')

    gr = with_metric(real_line("DCGM_FI_DEV_GPU_UTIL"), "DCGM_FI_PROF_GR_ENGINE_ACTIVE", "0.5")
    util = real_line("DCGM_FI_DEV_GPU_UTIL").rsplit(" ", 1)[0] + " 100"
    fb = real_line("DCGM_FI_DEV_FB_USED").rsplit(" ", 1)[0] + " 4096"
    power = real_line("DCGM_FI_DEV_POWER_USAGE")
    text = "\n".join(
        [
            mig(gr, "7", "1g.10gb"),
            mig(util, "7", "1g.10gb"),
            mig(fb, "7", "1g.10gb"),
            mig(power, "7", "1g.10gb"),
            mig(util, "1", "3g.40gb"),
        ]
    )
    scrape = parse_dcgm_metrics(text, node="gpu01", at=AT)
    small, large = scrape.gpus
    assert (small.gpu_uuid, small.parent_gpu_uuid, small.gpu_instance_id, small.mig_profile) == (
        f"{T4_OLD}/gi7",
        T4_OLD,
        7,
        "1g.10gb",
    )
    assert (small.util_percent, small.util_metric, small.memory_used_bytes) == (
        50.0,
        "gr_engine_active",
        4096 * MIB,
    )
    # DCGM_FI_DEV_GPU_UTIL means nothing on a MIG instance: not used, not counted as dropped
    assert (large.gpu_uuid, large.util_percent, large.util_metric) == (f"{T4_OLD}/gi1", None, "")
    assert scrape.dropped == {}

    inventory = dcgm_inventory(scrape)
    # the parent has no series of its own here: it is listed once, from its first instance
    assert [(i.gpu_uuid, i.parent_gpu_uuid, i.mig_mode, i.mig_profile) for i in inventory] == [
        (T4_OLD, "", "enabled", ""),
        (f"{T4_OLD}/gi7", T4_OLD, "enabled", "1g.10gb"),
        (f"{T4_OLD}/gi1", T4_OLD, "enabled", "3g.40gb"),
    ]
    assert [round(i.gpu_fraction, 4) for i in inventory] == [1.0, round(1 / 7, 4), round(3 / 7, 4)]
    # the parent's power is repeated on every instance: summaries leave it out
    summary = dcgm_summaries(scrape, window_seconds=30.0, idle_threshold_percent=5.0)[0]
    assert (small.power_watts, summary.power_mean_watts) == (8.969, None)


def test_hpc_job_label_gives_job_ids() -> None:
    # dcgm-exporter --hpc-job-mapping-dir prints one series per job on a GPU; built from real
    # lines with an hpc_job label added
    util = real_line("DCGM_FI_DEV_GPU_UTIL").rsplit(" ", 1)[0] + " 3"
    power = real_line("DCGM_FI_DEV_POWER_USAGE")

    def job(line: str, job_id: str) -> str:
        return line.replace("} ", f',hpc_job="{job_id}"}} ', 1)

    scrape = parse_dcgm_metrics(
        "\n".join([job(util, "1017"), job(util, "1018"), job(power, "1017"), job(power, "1018")]),
        node="gpu01",
        at=AT,
    )
    (gpu,) = scrape.gpus
    assert (gpu.gpu_uuid, gpu.job_ids, gpu.util_percent, gpu.power_watts) == (
        T4_OLD,
        ("1017", "1018"),
        3.0,
        8.969,
    )
    (summary,) = dcgm_summaries(scrape, window_seconds=30.0, idle_threshold_percent=5.0)
    assert (summary.job_ids, summary.idle_seconds) == (("1017", "1018"), 30.0)


def test_idle_threshold_is_strictly_below() -> None:
    base = real_line("DCGM_FI_DEV_GPU_UTIL").rsplit(" ", 1)[0]
    for value, idle in (("4.9", 30.0), ("5", 0.0), ("80", 0.0)):
        scrape = parse_dcgm_metrics(f"{base} {value}", node="gpu01", at=AT)
        (summary,) = dcgm_summaries(scrape, window_seconds=30.0, idle_threshold_percent=5.0)
        assert summary.idle_seconds == idle, value


def test_bad_lines_are_rejected_with_their_line_number() -> None:
    lines = datadog().splitlines()
    # lines 3, 6 and 9 of the real capture are samples; damage three of them in different ways
    assert [lines[2][:20], lines[5][:21], lines[8][:20]] == [
        "DCGM_FI_DEV_SM_CLOCK",
        "DCGM_FI_DEV_MEM_CLOCK",
        "DCGM_FI_DEV_GPU_TEMP",
    ]
    lines[2] = lines[2].rsplit(" ", 1)[0]  # no value
    lines[5] = lines[5].rsplit(" ", 1)[0] + " fast"  # not a number
    lines[8] = lines[8].replace('modelName="Tesla T4"', 'modelName="Tesla T4') + " x"  # label set broken
    scrape = parse_dcgm_metrics("\n".join(lines), node="gpu01", at=AT)
    assert [(r.record_key, r.source, r.origin) for r in scrape.rejected] == [
        ("line 3", "dcgm", "dcgm-exporter on gpu01"),
        ("line 6", "dcgm", "dcgm-exporter on gpu01"),
        ("line 9", "dcgm", "dcgm-exporter on gpu01"),
    ]
    assert scrape.rejected[1].reason == "not a number: 'fast'"
    assert scrape.rejected[0].raw == lines[2]
    # the rest of the scrape is kept
    old = scrape.gpus[0]
    assert (old.gpu_uuid, old.power_watts, old.sm_clock_mhz, old.temperature_celsius) == (
        T4_OLD,
        8.969,
        None,
        None,
    )
    assert scrape.sample_lines == 35


def test_text_that_is_not_prometheus_raises() -> None:
    with pytest.raises(ParseError, match="no line could be read"):
        parse_dcgm_metrics("<html>\n<body>502 Bad Gateway</body>\n</html>\n", node="gpu01", at=AT)


def test_empty_scrape_is_empty() -> None:
    scrape = parse_dcgm_metrics("", node="gpu01", at=AT)
    assert (scrape.gpus, scrape.rejected, scrape.sample_lines) == ((), (), 0)
    assert dcgm_summaries(scrape, window_seconds=30.0, idle_threshold_percent=5.0) == []


def test_a_mig_parent_is_its_instances_parent_not_one_more_gpu() -> None:
    # dcgm-exporter also prints device-level series of a GPU in MIG mode (no GPU_I_ID): that
    # GPU is the instances' parent, counted once, and its time is its instances'
    def mig(line: str, gi: str, profile: str) -> str:
        return line.replace('Hostname="', f'GPU_I_PROFILE="{profile}",GPU_I_ID="{gi}",Hostname="')

    gr = with_metric(real_line("DCGM_FI_DEV_GPU_UTIL"), "DCGM_FI_PROF_GR_ENGINE_ACTIVE", "0.5")
    parent_util = real_line("DCGM_FI_DEV_GPU_UTIL").rsplit(" ", 1)[0] + " 100"
    parent_power = real_line("DCGM_FI_DEV_POWER_USAGE")
    scrape = parse_dcgm_metrics(
        "\n".join([parent_util, parent_power, mig(gr, "7", "1g.10gb"), mig(gr, "1", "3g.40gb")]),
        node="gpu01",
        at=AT,
    )
    inventory = dcgm_inventory(scrape)
    assert [(i.gpu_uuid, i.parent_gpu_uuid, i.mig_mode, round(i.gpu_fraction, 4)) for i in inventory] == [
        (T4_OLD, "", "enabled", 1.0),
        (f"{T4_OLD}/gi7", T4_OLD, "enabled", round(1 / 7, 4)),
        (f"{T4_OLD}/gi1", T4_OLD, "enabled", round(3 / 7, 4)),
    ]
    # one physical GPU: the inventory's whole GPUs (no parent) are it alone
    assert [i.gpu_uuid for i in inventory if not i.parent_gpu_uuid] == [T4_OLD]
    summaries = dcgm_summaries(scrape, window_seconds=30.0, idle_threshold_percent=5.0)
    assert [s.gpu_uuid for s in summaries] == [f"{T4_OLD}/gi7", f"{T4_OLD}/gi1"]


# --------------------------------------------------------------------------- MIG, real scrapes


def test_a_scrape_of_mig_instances_only_counts_each_physical_gpu_once() -> None:
    """NVIDIA/dcgm-exporter#317: two A30 in MIG mode, four 1g.6gb instances each; every series is
    an instance's (no device-level series of the parents). Each physical GPU is listed once, as
    the parent of its instances, and each instance is its share: 1 of an A30's 4 slices."""
    scrape = parse_dcgm_metrics(
        read("dcgm_exporter_issues", "issue317_a30_mig_excerpt.metrics"), node="gpu01", at=AT
    )
    assert (scrape.rejected, scrape.dropped, scrape.sample_lines) == ((), {}, 12)
    inventory = dcgm_inventory(scrape)
    gpu0, gpu1 = "GPU-265c9814-6156-355b-e589-ff2064894f16", "GPU-2d20791a-b4a6-ba59-97f1-e95b99fe5b49"
    whole = [(i.gpu_uuid, i.index, i.model, i.mig_mode) for i in inventory if not i.parent_gpu_uuid]
    assert whole == [(gpu0, 0, "NVIDIA A30", "enabled"), (gpu1, 1, "NVIDIA A30", "enabled")]
    instances = [(i.gpu_uuid, i.parent_gpu_uuid, i.gpu_fraction) for i in inventory if i.parent_gpu_uuid]
    assert instances == [
        *((f"{gpu0}/gi{gi}", gpu0, 0.25) for gi in (3, 4, 5, 6)),
        *((f"{gpu1}/gi{gi}", gpu1, 0.25) for gi in (3, 4)),
    ]
    # the parents carry no time of their own: each instance is summarised, a parent never
    summaries = dcgm_summaries(scrape, window_seconds=30.0, idle_threshold_percent=5.0)
    assert [s.gpu_uuid for s in summaries] == [u for u, _, _ in instances]


def test_one_instance_over_a_whole_gpu_is_one_gpu_not_two() -> None:
    """NVIDIA/dcgm-exporter#713: an A100 with one 7g instance over all of it (`7g.79gb`, GPU
    instance 0). Its parent and its instance are one physical GPU: the parent once (share 1),
    the instance its 7 of 7 slices, and only the parent counts as a GPU of the node."""
    scrape = parse_dcgm_metrics(
        read("dcgm_exporter_issues", "issue713_a100_all_7g_excerpt.metrics"), node="gpu01", at=AT
    )
    parent = "GPU-06357e72-c3ee-614b-775f-a89e18e8cc08"
    inventory = dcgm_inventory(scrape)
    assert [(i.gpu_uuid, i.parent_gpu_uuid, i.mig_profile, i.gpu_fraction) for i in inventory] == [
        (parent, "", "", 1.0),
        (f"{parent}/gi0", parent, "7g.79gb", 1.0),
    ]
    assert len([i for i in inventory if not i.parent_gpu_uuid]) == 1
    assert [s.gpu_uuid for s in dcgm_summaries(scrape, window_seconds=30.0, idle_threshold_percent=5.0)] == [
        f"{parent}/gi0"
    ]
