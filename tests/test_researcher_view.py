"""Researcher view (issue 13 item 5): `slurmtel job` with the host side (CPU efficiency, peak
memory against the request, time used against the limit), GPU power, the new advice lines, the
three-panel plot, and `slurmtel me --jobs`.

Job 50 (alice, physics): 8 CPUs, 64 GiB, 2 GPUs on gpu01 for 1 h of an 8 h limit, 2 steps read:
CPU time 8 x 3600 s x 20 % = 5760 s; the largest step peaked at 8 GiB (largest task 5 GiB).
GPU-0 (index 0) busy at 80 % and 250 W throughout, GPU-1 (index 1) idle at 60 W throughout.
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine

from slurmtel.access import Identity, Role
from slurmtel.attribution import run_attribution
from slurmtel.cli import main
from slurmtel.config import Config
from slurmtel.records import GpuSummary, JobAttempt
from slurmtel.reports.advice import JobFacts, advise, host_advice
from slurmtel.reports.plot import GpuSeries, SeriesPoint, plot_job
from slurmtel.rows import GpuFigures
from slurmtel.store.jobs import sync_outcome_classes, write_attempts
from slurmtel.store.telemetry import write_inventory, write_summaries
from tests.factories import T0, attempt, inventory, windows

GIB = 2**30
HOUR = 3600.0
NOW = T0 + timedelta(days=2)
ALICE = Identity("alice", Role.USER)
BOB = Identity("bob", Role.USER)
PHYSICS_COORDINATOR = Identity("carol", Role.USER, frozenset({"physics"}))
ADMIN = Identity("root", Role.ADMIN)


def job_50(**overrides: Any) -> JobAttempt:
    values: dict[str, Any] = {
        "job_id_raw": 50,
        "name": "train",
        "submit_at": T0 - timedelta(minutes=1),
        "eligible_at": T0 - timedelta(minutes=1),
        "start_at": T0,
        "end_at": T0 + timedelta(hours=1),
        "alloc_gpus": 2,
        "alloc_cpus": 8,
        "alloc_tres": {"cpu": 8, "mem": 65536, "gres/gpu": 2},
        "nodes": ("gpu01",),
        "nodelist": "gpu01",
        "exit_code": "0:0",
        "time_limit_seconds": 8 * 3600,
        "cpu_time_seconds": 5760.0,
        "mem_peak_step_bytes": 8 * GIB,
        "mem_peak_task_bytes": 5 * GIB,
        "usage_steps": 2,
    }
    values.update(overrides)
    return attempt(**values)


def telemetry_50() -> list[GpuSummary]:
    busy = [
        replace(w, power_mean_watts=250.0) for w in windows("GPU-0", T0, 120, busy=set(range(120)), job="50")
    ]
    idle = [replace(w, power_mean_watts=60.0) for w in windows("GPU-1", T0, 120, job="50")]
    return busy + idle


def store(engine: Engine, config: Config, attempts: list[JobAttempt], summaries: list[GpuSummary]) -> None:
    with engine.begin() as conn:
        sync_outcome_classes(conn, config.outcomes.mapping())
        write_attempts(conn, attempts)
        write_inventory(conn, inventory("gpu01", ["GPU-0", "GPU-1"]), source="agent")
        write_summaries(conn, summaries, source="agent", node="gpu01")
    run_attribution(engine, config, now=NOW)


@pytest.fixture
def cli(engine: Engine, database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys):
    config_file = tmp_path / "slurmtel.toml"
    config_file.write_text('[site]\ntimezone = "Europe/Berlin"\n')
    monkeypatch.setenv("SLURMTEL_DATABASE_URL", database_url)
    monkeypatch.setattr("slurmtel.commands.common.utc_now", lambda: NOW)

    def run(identity: Identity, *argv: str) -> tuple[int, str, str]:
        monkeypatch.setattr("slurmtel.commands.common.current_identity", lambda config: identity)
        code = main(["--config", str(config_file), "--log-level", "WARNING", *argv])
        out, err = capsys.readouterr()
        return code, out, err

    return run


# ------------------------------------------------------------------------- slurmtel job


EXPECTED_ADVICE = [
    "1 of 2 GPUs idle 100 % of the time: ask for 1 GPU.",
    # 1 h x 1.5, rounded up to 15 min
    "The job used 01:00:00 of its 08:00:00 time limit (12 %): --time=01:30:00 would let it start "
    "earlier (backfill).",
    # 8 GiB x 1.2 = 9.6, rounded up
    "Peak host memory 8.0 GiB of 64.0 GiB requested (12 %): ask for --mem=10G.",
    # 8 CPUs x 20 % x 1.25 = 2
    "CPU efficiency 20 % of 8 CPUs: about 2 CPUs would do (fewer --cpus-per-task), or put the rest "
    "to work (data-loader workers).",
]


def test_job_shows_host_figures_gpu_power_and_advice(cli, engine: Engine, config: Config) -> None:
    store(engine, config, [job_50()], telemetry_50())
    code, out, err = cli(ALICE, "job", "50", "--format", "json")
    assert code == 0, err
    (report,) = json.loads(out)
    assert {
        k: report[k]
        for k in (
            "cpus",
            "cpu_time_seconds",
            "cpu_efficiency_share",
            "mem_requested_bytes",
            "mem_peak_bytes",
            "mem_peak_task_bytes",
            "mem_efficiency_share",
            "usage_steps",
            "elapsed_seconds",
            "time_limit_seconds",
            "time_limit_used_share",
        )
    } == {
        "cpus": 8,
        "cpu_time_seconds": 5760.0,
        "cpu_efficiency_share": 0.2,  # 5760 / (8 x 3600)
        "mem_requested_bytes": 64 * GIB,
        "mem_peak_bytes": 8 * GIB,
        "mem_peak_task_bytes": 5 * GIB,
        "mem_efficiency_share": 0.125,  # 8 / 64
        "usage_steps": 2,
        "elapsed_seconds": 3600,
        "time_limit_seconds": 8 * 3600,
        "time_limit_used_share": 0.125,  # 1 h of 8 h
    }
    gpus = {r["gpu"]: r for r in report["gpu_figures"]}
    assert sorted(gpus) == ["gpu01/0", "gpu01/1"]
    # 120 windows x 300 J over 3600 s measured: 10 W mean; the windows' highest mean power
    assert (gpus["gpu01/0"]["power_mean_watts"], gpus["gpu01/0"]["power_max_watts"]) == (10.0, 250.0)
    assert (gpus["gpu01/1"]["power_max_watts"], gpus["gpu01/1"]["idle_share"]) == (60.0, 1.0)
    assert report["advice"] == EXPECTED_ADVICE

    code, text, _ = cli(ALICE, "job", "50")
    assert code == 0
    assert "  CPUs        8 CPUs, efficiency 20.0 % (CPU time 01:36:00)\n" in text
    assert "  host memory peak 8.0 GiB of 64.0 GiB requested (12.5 %), largest task 5.0 GiB\n" in text
    assert "  time limit  01:00:00 used of 08:00:00 (12.5 %)\n" in text
    # times in the site zone
    assert "  start       2026-11-01 11:00:00 CET\n" in text
    header = text.splitlines()[text.splitlines().index("") + 1]
    # a GPU is node/index in the table; its UUID with --wide (and in json)
    assert header.split()[:3] == ["gpu", "mapping", "mean_util_percent"]
    assert "power_mean_watts" in header and "power_max_watts" in header
    code, wide, _ = cli(ALICE, "job", "50", "--wide")
    assert code == 0
    header = wide.splitlines()[wide.splitlines().index("") + 1]
    assert header.split()[:3] == ["gpu", "gpu_uuid", "mapping"]
    assert text.endswith("Advice:\n" + "".join(f"  * {line}\n" for line in EXPECTED_ADVICE))


def test_job_without_steps_or_limit_says_so(cli, engine: Engine, config: Config) -> None:
    bare = job_50(
        cpu_time_seconds=None,
        mem_peak_step_bytes=None,
        mem_peak_task_bytes=None,
        usage_steps=None,
        time_limit_seconds=None,
    )
    store(engine, config, [bare], telemetry_50())
    code, text, _ = cli(ALICE, "job", "50")
    assert code == 0
    assert "  CPUs        8 CPUs, efficiency not measured (no job steps read)\n" in text
    assert "  host memory 64.0 GiB requested, peak not measured (no job steps read)\n" in text
    assert "  time limit  none (or not known)\n" in text
    assert text.endswith("Advice:\n  * 1 of 2 GPUs idle 100 % of the time: ask for 1 GPU.\n")


def test_timeout_job_is_told_to_checkpoint(cli, engine: Engine, config: Config) -> None:
    late = job_50(state="TIMEOUT", time_limit_seconds=3600, cpu_time_seconds=8 * 3600 * 0.9)
    store(engine, config, [late], telemetry_50())
    code, out, _ = cli(ALICE, "job", "50", "--format", "json")
    assert code == 0
    (report,) = json.loads(out)
    assert report["time_limit_used_share"] == 1.0
    assert report["advice"] == [
        "1 of 2 GPUs idle 100 % of the time: ask for 1 GPU.",
        "The job hit its time limit (01:00:00): save checkpoints and resume from them, "
        "or ask for a longer --time.",
        "Peak host memory 8.0 GiB of 64.0 GiB requested (12 %): ask for --mem=10G.",
    ]


# ------------------------------------------------------------------------------ advice (pure)


def busy_gpu() -> GpuFigures:
    return GpuFigures("GPU-0", "gpu01", "process", HOUR, HOUR, 0.0, 0.0, 0.0, 80.0 * HOUR, 95.0, None, None)


def facts(**overrides: Any) -> JobFacts:
    values: dict[str, Any] = {
        "alloc_gpus": 1,
        "elapsed_seconds": HOUR,
        "state": "COMPLETED",
        "alloc_cpus": 8,
        "cpu_efficiency_percent": 80.0,
        "mem_requested_bytes": 16 * GIB,
        "mem_peak_bytes": 12 * GIB,
        "time_limit_seconds": int(2 * HOUR),
    }
    values.update(overrides)
    return JobFacts(**values)


def test_a_well_sized_job_gets_no_host_advice() -> None:
    assert host_advice(facts()) == []
    assert advise(facts(), [busy_gpu()]) == ["GPU use looks good: mean utilisation 80 % on 1 GPU."]


def test_time_limit_hit_and_over_requested() -> None:
    assert host_advice(facts(state="TIMEOUT", elapsed_seconds=2 * HOUR + 70)) == [
        "The job hit its time limit (02:00:00): save checkpoints and resume from them, or ask for a longer --time."
    ]
    # 20 min of a 2 h limit: 17 %, ask for 30 min
    assert host_advice(facts(elapsed_seconds=1200)) == [
        "The job used 00:20:00 of its 02:00:00 time limit (17 %): --time=00:30:00 would let it start "
        "earlier (backfill)."
    ]
    # 25 % or more: not over-requested
    assert host_advice(facts(elapsed_seconds=1800)) == []
    # the suggestion would not be tighter than the limit: nothing to say
    assert host_advice(facts(elapsed_seconds=60, time_limit_seconds=600)) == []
    # a failed or a running attempt did not show how long the work takes
    assert host_advice(facts(elapsed_seconds=1200, state="FAILED")) == []
    assert host_advice(facts(elapsed_seconds=1200, state="RUNNING")) == []
    assert host_advice(facts(elapsed_seconds=1200, time_limit_seconds=None)) == []


def test_host_memory_over_requested() -> None:
    assert host_advice(facts(mem_peak_bytes=3 * GIB)) == [
        "Peak host memory 3.0 GiB of 16.0 GiB requested (19 %): ask for --mem=4G."
    ]
    # on 2 nodes the request is per node: 7 GiB x 1.2 / 2 = 4.2 -> 5G
    assert host_advice(facts(mem_peak_bytes=7 * GIB, nodes=2)) == [
        "Peak host memory 7.0 GiB of 16.0 GiB requested (44 %): ask for --mem=5G per node."
    ]
    # half or more used, no steps read, or still running: nothing
    assert host_advice(facts(mem_peak_bytes=8 * GIB)) == []
    assert host_advice(facts(mem_peak_bytes=None)) == []
    assert host_advice(facts(mem_peak_bytes=GIB, state="RUNNING")) == []
    # a tiny request that cannot be rounded lower
    assert host_advice(facts(mem_requested_bytes=GIB, mem_peak_bytes=GIB // 4)) == []


def test_low_cpu_efficiency() -> None:
    assert host_advice(facts(cpu_efficiency_percent=10.0)) == [
        "CPU efficiency 10 % of 8 CPUs: about 1 CPU would do (fewer --cpus-per-task), or put the rest "
        "to work (data-loader workers)."
    ]
    assert host_advice(facts(cpu_efficiency_percent=30.0)) == []
    assert host_advice(facts(cpu_efficiency_percent=5.0, alloc_cpus=1)) == []
    assert host_advice(facts(cpu_efficiency_percent=None)) == []


def test_a_job_without_gpus_still_gets_host_advice() -> None:
    assert advise(facts(alloc_gpus=0, cpu_efficiency_percent=10.0), []) == [
        "CPU efficiency 10 % of 8 CPUs: about 1 CPU would do (fewer --cpus-per-task), or put the rest "
        "to work (data-loader workers)."
    ]
    assert advise(facts(alloc_gpus=0, elapsed_seconds=None), []) == []


# ------------------------------------------------------------------------------------ plot


def _rows_of(figure: Any) -> list[list[Any]]:
    """The figure's panels as rows of (utilisation, memory, power)."""
    axes = figure.axes
    assert len(axes) % 3 == 0
    return [axes[i : i + 3] for i in range(0, len(axes), 3)]


def _values(ax: Any) -> list[float]:
    (line,) = [line for line in ax.get_lines() if line.get_linestyle() == "-"]
    return [float(y) for y in line.get_ydata() if y == y]


def _reference_lines(ax: Any) -> list[float]:
    return [float(line.get_ydata()[0]) for line in ax.get_lines() if line.get_linestyle() == "--"]


def _no_two_overlap(figure: Any) -> None:
    """No panel covers another, nor a row's label another row's panels."""
    figure.canvas.draw()
    renderer = figure.canvas.get_renderer()
    boxes = [ax.get_window_extent(renderer) for ax in figure.axes]
    for i, box in enumerate(boxes):
        for other in boxes[i + 1 :]:
            assert not box.overlaps(other)


def test_plot_one_row_per_gpu_with_reference_lines_and_dates(tmp_path: Path) -> None:
    """Issue 22 item 8: idle GPUs' flat lines no longer lie on top of each other (3 listed, 1
    visible): each GPU has its own row of three panels, same scale per column; each row has its
    GPU's memory capacity and power limit as dashed lines; the time axis names the date."""
    from zoneinfo import ZoneInfo

    start = T0 + timedelta(hours=12)  # 23:00 in Berlin: the job runs into the next day there
    points = [SeriesPoint(start + timedelta(seconds=30 * i), 30.0, 80.0, 40 * GIB, 250.0) for i in range(240)]
    flat = [SeriesPoint(p.start_at, 30.0, 0.0, GIB, 60.0) for p in points]
    series = [
        GpuSeries("gpu01/0", points, memory_total_bytes=80 * GIB, power_limit_watts=700.0),
        GpuSeries(
            "gpu01/1", flat, idle=True, idle_share=1.0, memory_total_bytes=80 * GIB, power_limit_watts=700.0
        ),
        GpuSeries(
            "gpu01/2", flat, idle=True, idle_share=0.95, memory_total_bytes=80 * GIB, power_limit_watts=700.0
        ),
    ]
    path = tmp_path / "plot.png"
    figure = plot_job(series, path, title="Job 50", zone=ZoneInfo("Europe/Berlin"))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rows = _rows_of(figure)
    assert len(rows) == 3
    assert [ax.get_title() for ax in rows[0]] == ["utilisation (%)", "memory used (GiB)", "power (W)"]
    assert [row[0].get_ylabel() for row in rows] == ["gpu01/0", "gpu01/1\nidle 100 %", "gpu01/2\nidle 95 %"]
    # every GPU's line is in its own panels: the two idle ones at 0 are both there
    assert [(_values(u)[0], _values(m)[0], _values(p)[0]) for u, m, p in rows] == [
        (80.0, 40.0, 250.0),
        (0.0, 1.0, 60.0),
        (0.0, 1.0, 60.0),
    ]
    for _, memory, power in rows:
        assert _reference_lines(memory) == [80.0]
        assert _reference_lines(power) == [700.0]
    # one scale per column, and room above the reference lines
    for column in range(3):
        assert len({row[column].get_ylim() for row in rows}) == 1
    assert rows[0][1].get_ylim()[1] > 80 and rows[0][2].get_ylim()[1] > 700
    assert rows[0][0].get_ylim()[0] < 0  # a line at 0 % stays clear of the axis
    # idle rows are shaded, the busy one is not
    assert rows[0][0].get_facecolor() != rows[1][0].get_facecolor() == rows[2][0].get_facecolor()
    # the time axis: Berlin times, the date under the first tick and where the day changes
    figure.canvas.draw()
    labels = [t.get_text() for t in rows[-1][0].get_xticklabels() if t.get_text()]
    assert labels[0].startswith("23:") and labels[0].endswith("\n2026-11-01"), labels
    assert [label for label in labels[1:] if "\n" in label] == ["00:00\n2026-11-02"], labels
    assert rows[-1][1].get_xlabel() == "time (Europe/Berlin)"
    _no_two_overlap(figure)


def test_plot_of_many_gpus_has_a_row_per_node() -> None:
    """More GPUs than rows fit: one row per node, its GPUs' mean with their lowest and highest."""
    import io as bytes_io
    from zoneinfo import ZoneInfo

    from slurmtel.reports.plot import MAX_GPU_ROWS

    series = []
    for n in range(3):
        for i in range(8):
            util = 0.0 if (n, i) == (2, 7) else 50.0 + i
            points = [SeriesPoint(T0 + timedelta(seconds=30 * k), 30.0, util, GIB, 100.0) for k in range(10)]
            series.append(
                GpuSeries(
                    f"gpu0{n}/{i}",
                    points,
                    idle=util == 0,
                    idle_share=1.0 if util == 0 else 0.0,
                    node=f"gpu0{n}",
                )
            )
    assert len(series) > MAX_GPU_ROWS
    figure = plot_job(series, bytes_io.BytesIO(), title="Job 60", zone=ZoneInfo("UTC"), fmt="png")
    rows = _rows_of(figure)
    assert [row[0].get_ylabel() for row in rows] == [
        "gpu00\n8 GPUs",
        "gpu01\n8 GPUs",
        "gpu02\n8 GPUs\n1 of 8 idle",
    ]
    assert figure.texts[0].get_text().split("\n")[1].startswith("one row per node (its GPUs' mean")
    mean, low, high = (float(line.get_ydata()[0]) for line in rows[2][0].get_lines())
    assert (round(mean, 4), low, high) == (round(sum(50.0 + i for i in range(7)) / 8, 4), 0.0, 56.0)


@pytest.mark.parametrize(
    "name",
    [
        "$\\frac{1}{0}$ unbalanced $ \\sqrt{",  # mathtext: never read, never a crash
        "[bold red]run[/] \x1b[2J\x07 \x9b31m\nsecond line",  # markup and control characters
        "x" * 300,  # very long
    ],
)
def test_a_hostile_job_name_is_shown_literally_in_the_plot_title(name: str) -> None:
    import io as bytes_io
    from zoneinfo import ZoneInfo

    from slurmtel.reports.plot import TITLE_NAME_CHARS, plot_title
    from slurmtel.reports.render import escape_controls

    title = plot_title(
        job_id="70", name=name, user="alice", cluster="lab", state="COMPLETED", elapsed="01:00:00",
        running=False, gpus=1, gpu_model="h100", attempts=1,
    )  # fmt: skip
    shown = escape_controls(name)
    expected = shown if len(shown) <= TITLE_NAME_CHARS else shown[: TITLE_NAME_CHARS - 1] + "…"
    assert title == f"Job 70 “{expected}” of alice on lab: COMPLETED, 01:00:00 elapsed, 1 GPU (h100)"
    assert not any(ord(c) < 32 or 127 <= ord(c) < 160 for c in title)
    points = [SeriesPoint(T0, 30.0, 50.0, GIB, 100.0)]
    figure = plot_job(
        [GpuSeries("gpu01/0", points)], bytes_io.BytesIO(), title=title, zone=ZoneInfo("UTC"), fmt="svg"
    )
    (suptitle,) = figure.texts
    # as given (no markup, no mathtext read), then what the rows show
    assert suptitle.get_text() == (
        f"{title}\none row per GPU: utilisation, memory and power; dashed: memory capacity, power limit; "
        "times in UTC"
    )
    figure.canvas.draw()  # the title draws without error, whatever it holds
    width = suptitle.get_window_extent(figure.canvas.get_renderer()).width
    assert width <= figure.bbox.width


def test_job_plot_names_gpus_node_index_with_title_and_limits(
    cli, engine: Engine, config: Config, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store(engine, config, [job_50()], telemetry_50())
    with engine.begin() as conn:
        # the node's inventory gives each GPU's memory and power cap
        write_inventory(
            conn,
            [
                replace(g, memory_total_bytes=80 * GIB, power_limit_watts=700.0)
                for g in inventory("gpu01", ["GPU-0", "GPU-1"])
            ],
            source="agent",
        )
    drawn: list[Any] = []
    real = plot_job

    def spy(series, path, **kwargs):  # type: ignore[no-untyped-def]
        drawn.append((series, kwargs["title"], real(series, path, **kwargs)))
        return drawn[-1][2]

    monkeypatch.setattr("slurmtel.reports.plot.plot_job", spy)
    path = tmp_path / "job50.png"
    code, _, err = cli(ALICE, "job", "50", "--plot", str(path))
    assert code == 0 and f"wrote {path}" in err
    ((series, title, figure),) = drawn
    assert [(s.label, s.idle, len(s.points), s.memory_total_bytes, s.power_limit_watts) for s in series] == [
        ("gpu01/0", False, 120, 80 * GIB, 700.0),
        ("gpu01/1", True, 120, 80 * GIB, 700.0),
    ]
    assert title == "Job 50 “train” of alice on lab: COMPLETED, 01:00:00 elapsed, 2 GPUs"
    assert [p.power_watts for p in series[0].points][:2] == [250.0, 250.0]
    rows = _rows_of(figure)
    assert [row[0].get_ylabel() for row in rows] == ["gpu01/0", "gpu01/1\nidle 100 %"]
    assert rows[-1][1].get_xlabel() == "time (Europe/Berlin)"
    assert [_reference_lines(row[2]) for row in rows] == [[700.0], [700.0]]
    _no_two_overlap(figure)


# ---------------------------------------------------------------------------- me --jobs


def month_jobs() -> list[JobAttempt]:
    return [
        job_50(),
        # 1 h CPU job without steps
        attempt(
            job_id_raw=51,
            name="prep",
            alloc_gpus=0,
            alloc_tres={"cpu": 2, "mem": 4096},
            alloc_cpus=2,
            submit_at=T0 + timedelta(hours=2),
            start_at=T0 + timedelta(hours=2),
            end_at=T0 + timedelta(hours=3),
        ),
        # bob's job is never alice's
        attempt(
            job_id_raw=52,
            user="bob",
            account="chem",
            submit_at=T0 + timedelta(hours=4),
            start_at=T0 + timedelta(hours=4),
            end_at=T0 + timedelta(hours=5),
        ),
        # alice, October: outside the month
        attempt(
            job_id_raw=53,
            submit_at=T0 - timedelta(days=5),
            start_at=T0 - timedelta(days=5),
            end_at=T0 - timedelta(days=5) + timedelta(hours=1),
        ),
    ]


def test_me_jobs_lists_the_callers_attempts(cli, engine: Engine, config: Config) -> None:
    store(engine, config, month_jobs(), telemetry_50())
    code, out, err = cli(ALICE, "me", "--jobs", "--month", "2026-11", "--format", "json")
    assert code == 0, err
    rows = json.loads(out)
    assert [r["job_id"] for r in rows] == ["50", "51"]
    first = rows[0]
    assert first == {
        "cluster": "lab",
        "job_id": "50",
        "attempt": 1,
        "name": "train",
        "account": "physics",
        "partition": "gpu",
        "state": "COMPLETED",
        "start_at": "2026-11-01T10:00:00+00:00",
        "elapsed_seconds": 3600.0,
        "gpus": 2,
        "allocated_gpu_seconds": 7200.0,
        # GPU-0 at 80 %, GPU-1 at 0 %, each 1 h measured
        "mean_util_share": 0.4,
        "idle_share": 0.5,
        "cpu_efficiency_share": 0.2,
        "mem_peak_bytes": 8 * GIB,
        "mem_requested_bytes": 64 * GIB,
        "mem_efficiency_share": 0.125,
    }
    second = rows[1]
    assert (second["gpus"], second["allocated_gpu_seconds"], second["mean_util_share"]) == (0, 0.0, None)
    assert (second["cpu_efficiency_share"], second["mem_peak_bytes"], second["mem_requested_bytes"]) == (
        None,
        None,
        4 * GIB,
    )

    code, out, _ = cli(ALICE, "me", "--jobs", "--month", "2026-11", "--format", "csv")
    table = list(csv.DictReader(io.StringIO(out)))
    assert [r["job_id"] for r in table] == ["50", "51"]
    assert (table[0]["elapsed_seconds"], table[0]["allocated_gpu_seconds"], table[0]["mem_peak_bytes"]) == (
        "3600",
        "7200",
        str(8 * GIB),
    )
    assert not any(c.endswith(("_hours", "_gib", "_percent")) for c in table[0])

    code, out, _ = cli(ALICE, "me", "--jobs", "--month", "2026-11")
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == "Jobs of alice in 2026-11 (so far) (Europe/Berlin): 2 attempts"
    header = lines[1].split()
    assert header[:9] == [
        "cluster",
        "job_id",
        "attempt",
        "name",
        "account",
        "partition",
        "state",
        "start_at",
        "elapsed_hours",
    ]
    assert header[-4:] == [
        "cpu_efficiency_percent",
        "mem_peak_gib",
        "mem_requested_gib",
        "mem_efficiency_percent",
    ]
    # hours and GiB in the table; the start in the site zone
    assert lines[2].split() == (
        [
            "lab",
            "50",
            "1",
            "train",
            "physics",
            "gpu",
            "COMPLETED",
            "2026-11-01",
            "11:00:00",
            "CET",
            "1",
            "2",
            "2",
            "40",
            "50",
            "20",
            "8",
            "64",
            "12.5",
        ]
    )
    assert "bob" not in out and "chem" not in out


def test_me_jobs_access(cli, engine: Engine, config: Config) -> None:
    store(engine, config, month_jobs(), telemetry_50())
    code, out, err = cli(ALICE, "me", "--jobs", "-u", "bob", "--month", "2026-11")
    assert (code, out) == (1, "")
    assert "alice may only see their own usage, not bob's" in err
    code, out, _ = cli(BOB, "me", "--jobs", "--month", "2026-11", "--format", "json")
    assert [r["job_id"] for r in json.loads(out)] == ["52"]
    # a coordinator sees the users of the accounts they coordinate only
    code, out, _ = cli(
        PHYSICS_COORDINATOR, "me", "--jobs", "-u", "bob", "--month", "2026-11", "--format", "json"
    )
    assert (code, json.loads(out)) == (0, [])
    code, out, _ = cli(
        PHYSICS_COORDINATOR, "me", "--jobs", "-u", "alice", "--month", "2026-11", "--format", "json"
    )
    assert [r["job_id"] for r in json.loads(out)] == ["50", "51"]
    code, out, _ = cli(ADMIN, "me", "--jobs", "-u", "bob", "--month", "2026-11", "--format", "json")
    assert [r["job_id"] for r in json.loads(out)] == ["52"]
    code, _, err = cli(ALICE, "me", "--month", "2026-11", "--format", "csv")
    assert code == 2 and "--format csv needs --jobs" in err
