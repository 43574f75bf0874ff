"""The head's sources (sacct, slurmctld, dcgm) end to end: capture or command in, rows out.

Parsers are tested on their own; here the real captures go through `slurmtel collect` and
the sources' collect paths into PostgreSQL. Live collection runs real commands and a real
HTTP server: the commands are small scripts that print the real captures (the real Slurm
commands are exercised by the integration suite), the HTTP server serves the real scrape.
"""

from __future__ import annotations

import http.server
import os
import signal
import stat
import threading
from collections.abc import Iterator
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import ClassVar

import pytest
from sqlalchemy import Engine, text

from slurmtel.cli import main
from slurmtel.config import Config, config_from_dict
from slurmtel.parsers.scontrol_config import cluster_name
from slurmtel.parsers.sinfo_nodes import parse_sinfo_gpu_nodes
from slurmtel.sources import default_options, get_source
from slurmtel.sources.base import RunContext
from slurmtel.sources.runner import run_recorded
from slurmtel.sources.targets import Target, parse_target
from slurmtel.store.telemetry import write_inventory
from tests.conftest import fixture_path
from tests.factories import at, inventory

LAB = fixture_path("slurmctld", "slurm-22.05")
DCGM = fixture_path("dcgm", "datadog_dcgm", "metrics.txt")
SACCT_LAB = fixture_path("sacct", "slurm-22.05", "sacct-a-D.json")


@pytest.fixture
def cli_env(monkeypatch: pytest.MonkeyPatch, database_url: str, engine: Engine) -> Engine:
    """`slurmtel` in-process against the (emptied) test database."""
    monkeypatch.setenv("SLURMTEL_DATABASE_URL", database_url)
    monkeypatch.delenv("SLURMTEL_CONFIG", raising=False)
    monkeypatch.setattr("slurmtel.config.DEFAULT_CONFIG_PATH", Path("/nonexistent/slurmtel.toml"))
    return engine


def rows(engine: Engine, sql: str) -> list[tuple]:
    with engine.connect() as conn:
        return [tuple(r) for r in conn.execute(text(sql))]


def script(tmp_path: Path, name: str, body: str) -> str:
    path = tmp_path / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


# ---------------------------------------------------------------- small parsers


def test_gpu_nodes_and_cluster_name_from_the_lab() -> None:
    assert parse_sinfo_gpu_nodes((LAB / "sinfo-N-final.txt").read_text()) == ["gpu01", "gpu02"]
    assert cluster_name((LAB / "scontrol-show-config.txt").read_text()) == "lab"


@pytest.mark.parametrize(
    ("entry", "expected"),
    [
        ("gpu01", Target("gpu01", "http://gpu01:9400")),
        ("gpu01=127.0.0.1:9401", Target("gpu01", "http://127.0.0.1:9401")),
        ("gpu02=10.1.0.2", Target("gpu02", "http://10.1.0.2:9400")),
        (
            "http://gpu03.cluster.example:9400/metrics",
            Target("gpu03", "http://gpu03.cluster.example:9400/metrics"),
        ),
    ],
)
def test_targets(entry: str, expected: Target) -> None:
    assert parse_target(entry, port=9400) == expected


# ---------------------------------------------------------------- sacct


def test_sacct_input_through_the_cli(cli_env: Engine, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["db", "upgrade"]) == 0
    assert main(["collect", "sacct", "--input", str(SACCT_LAB)]) == 0
    assert "22 attempts read: 22 new" in capsys.readouterr().out
    assert main(["collect", "sacct", "--input", str(SACCT_LAB)]) == 0
    assert "0 new, 0 changed, 22 unchanged" in capsys.readouterr().out
    assert rows(cli_env, "SELECT count(*), sum(alloc_gpus) FROM job_attempt") == [(22, 32)]
    assert rows(cli_env, "SELECT source, mode, status FROM collect_run ORDER BY id") == [
        ("sacct", "input", "ok"),
        ("sacct", "input", "ok"),
    ]


def test_sacct_input_with_a_bad_record_is_partial(cli_env: Engine, tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    # the real capture, cut inside its last job object: the complete jobs are kept
    truncated = tmp_path / "cut.json"
    raw = SACCT_LAB.read_bytes()
    truncated.write_bytes(raw[: int(len(raw) * 0.9)])
    assert main(["collect", "sacct", "--input", str(truncated)]) == 3
    err = capsys.readouterr().err
    assert "quarantined" in err
    assert rows(cli_env, "SELECT record_key, origin FROM quarantine") == [("truncated input", str(truncated))]
    assert rows(cli_env, "SELECT status FROM collect_run") == [("partial",)]
    assert main(["quarantine", "list", "--format", "json"]) == 0
    assert "truncated JSON" in capsys.readouterr().out


def test_sacct_unreadable_input_is_an_error_naming_the_file(cli_env: Engine, tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    bad = tmp_path / "not-json.json"
    bad.write_text("{ this is not json")
    assert main(["collect", "sacct", "--input", str(bad)]) == 1
    err = capsys.readouterr().err
    assert "parse_error" in err and str(bad) in err
    assert rows(cli_env, "SELECT status, error_kind FROM collect_run") == [("error", "parse_error")]


def fake_sacct(tmp_path: Path, capture: Path, *, extra: str = "") -> tuple[str, Path]:
    log = tmp_path / "sacct-argv.log"
    return script(tmp_path, "sacct", f'{extra}echo "$@" >> {log}\ncat {capture}\n'), log


def sacct_ctx(ctx: RunContext, command: str, **sacct: object) -> RunContext:
    config = config_from_dict({"sources": {"sacct": {"command": command, **sacct}}})
    return replace(ctx, config=config)


def test_sacct_polling_moves_a_cursor_and_rescans_a_trailing_window(ctx: RunContext, tmp_path: Path) -> None:
    command, log = fake_sacct(tmp_path, SACCT_LAB)
    now = at("2026-12-02T14:00:00")
    source = get_source("sacct")
    first = sacct_ctx(ctx, command, rescan_seconds=3600, initial_lookback_seconds=86400)
    first = replace(first, clock=lambda: now)
    run_recorded(first, "sacct", "once", lambda: source.collect(first, default_options(source)))
    later = replace(first, clock=lambda: now + timedelta(minutes=5))
    outcome = run_recorded(later, "sacct", "once", lambda: source.collect(later, default_options(source)))
    calls = log.read_text().splitlines()
    assert calls[0] == "-a -D -S 2026-12-01T14:00:00 -E 2026-12-02T14:00:00 --json"
    # the second poll starts rescan_seconds before the cursor the first one left
    assert calls[1] == "-a -D -S 2026-12-02T13:00:00 -E 2026-12-02T14:05:00 --json"
    assert outcome.status == "ok"
    assert outcome.result.rows_written == 0  # the same records again: nothing changed
    assert rows(ctx.engine, "SELECT scope, cursor_at FROM source_cursor") == [
        ("local", at("2026-12-02T14:05:00"))
    ]


def test_sacct_explicit_window_and_clusters_leave_the_cursor_alone(ctx: RunContext, tmp_path: Path) -> None:
    command, log = fake_sacct(tmp_path, SACCT_LAB)
    source = get_source("sacct")
    options = default_options(source)
    options.start, options.end, options.clusters = "2026-12-02T12:00:00", "2026-12-02T14:00:00", "lab,other"
    c = sacct_ctx(ctx, command)
    run_recorded(c, "sacct", "once", lambda: source.collect(c, options))
    assert log.read_text().splitlines() == [
        "-a -D -S 2026-12-02T12:00:00 -E 2026-12-02T14:00:00 -M lab --json",
        "-a -D -S 2026-12-02T12:00:00 -E 2026-12-02T14:00:00 -M other --json",
    ]
    assert rows(ctx.engine, "SELECT count(*) FROM source_cursor") == [(0,)]


@pytest.mark.parametrize(
    ("body", "kind", "message"),
    [
        (
            "echo 'sacct: error: Problem talking to the database: Connection refused' >&2; exit 1",
            "source_unavailable",
            "Connection refused",
        ),
        ("sleep 5", "source_unavailable", "did not answer within 1 s"),
    ],
)
def test_sacct_failures_are_recorded_and_classified(
    ctx: RunContext, tmp_path: Path, body: str, kind: str, message: str
) -> None:
    command = script(tmp_path, "sacct", body + "\n")
    c = sacct_ctx(ctx, command, timeout_seconds=1)
    source = get_source("sacct")
    outcome = run_recorded(c, "sacct", "once", lambda: source.collect(c, default_options(source)))
    assert (outcome.status, outcome.error_kind) == ("error", kind)
    assert message in outcome.message
    assert rows(ctx.engine, "SELECT status, error_kind FROM collect_run") == [("error", kind)]
    assert rows(ctx.engine, "SELECT count(*) FROM source_cursor") == [(0,)]


def test_a_missing_sacct_binary_is_source_unavailable(ctx: RunContext) -> None:
    c = sacct_ctx(ctx, "/nonexistent/sacct")
    source = get_source("sacct")
    outcome = run_recorded(c, "sacct", "once", lambda: source.collect(c, default_options(source)))
    assert (outcome.status, outcome.error_kind) == ("error", "source_unavailable")


# ---------------------------------------------------------------- slurmctld


RUNNING_1 = [
    (1, "gpu01", 0), (2, "gpu01", 1), (3, "gpu01", 2), (3, "gpu01", 3),
    (4, "gpu02", 0), (4, "gpu02", 1), (4, "gpu02", 2), (4, "gpu02", 3),
]  # fmt: skip


def test_slurmctld_input_stores_allocations_with_uuids_nodes_and_pending(cli_env: Engine) -> None:
    assert main(["db", "upgrade"]) == 0
    with cli_env.begin() as conn:
        write_inventory(
            conn,
            inventory("gpu01", [f"GPU-a{i}" for i in range(4)], at("2026-12-02T12:00:00")),
            source="agent",
        )
    argv = ["collect", "slurmctld", "--input", str(LAB / "squeue-running-1.json"),
            "--nodes-input", str(LAB / "scontrol-show-node-d-running-1.txt"),
            "--at", "2026-12-02T13:00:20", "--cluster", "lab"]  # fmt: skip
    assert main(argv) == 0
    got = rows(cli_env, "SELECT job_id_raw, node, gpu_index, gpu_uuid FROM gpu_allocation ORDER BY 1, 2, 3")
    assert [g[:3] for g in got] == RUNNING_1
    # gpu01 has an inventory: its indices became UUIDs; gpu02 has none yet
    assert {g[2]: g[3] for g in got if g[1] == "gpu01"} == {
        0: "GPU-a0",
        1: "GPU-a1",
        2: "GPU-a2",
        3: "GPU-a3",
    }
    assert {g[3] for g in got if g[1] == "gpu02"} == {""}
    assert rows(
        cli_env, "SELECT node, states, gpus_total, gpus_allocated, partitions FROM node_state ORDER BY 1"
    ) == [
        ("gpu01", ["MIXED"], 4, 4, ["gpu", "debug"]),
        ("gpu02", ["MIXED"], 4, 4, ["gpu", "debug"]),
    ]
    pending = rows(cli_env, "SELECT job_id, reason, gpus_requested FROM pending_job ORDER BY job_id_raw")
    assert ("5", "Resources", 1) in pending and ("8", "Priority", 4) in pending and len(pending) == 8
    # the same snapshot again changes nothing but the intervals' ends
    assert main(argv) == 0
    assert len(rows(cli_env, "SELECT 1 FROM gpu_allocation")) == 8
    assert len(rows(cli_env, "SELECT 1 FROM node_state")) == 2


def test_slurmctld_collect_runs_the_commands(ctx: RunContext, tmp_path: Path) -> None:
    squeue = script(
        tmp_path, "squeue", f'[ "$*" = "-a --json" ] || exit 9\ncat {LAB / "squeue-running-1.json"}\n'
    )
    scontrol = script(
        tmp_path,
        "scontrol",
        f'case "$*" in\n"show config") cat {LAB / "scontrol-show-config.txt"};;\n'
        f'"show node -d") cat {LAB / "scontrol-show-node-d-running-1.txt"};;\n*) exit 9;;\nesac\n',
    )
    config = config_from_dict(
        {"sources": {"slurmctld": {"squeue_command": squeue, "scontrol_command": scontrol}}}
    )
    c = replace(ctx, config=config)
    source = get_source("slurmctld")
    outcome = run_recorded(c, "slurmctld", "once", lambda: source.collect(c, default_options(source)))
    assert outcome.status == "ok", outcome.message
    # the cluster name came from `scontrol show config`
    assert rows(ctx.engine, "SELECT DISTINCT cluster FROM gpu_allocation") == [("lab",)]
    assert [
        r[:3]
        for r in rows(ctx.engine, "SELECT job_id_raw, node, gpu_index FROM gpu_allocation ORDER BY 1,2,3")
    ] == (RUNNING_1)


def test_slurmctld_scontrol_text_view(ctx: RunContext, tmp_path: Path) -> None:
    scontrol = script(
        tmp_path,
        "scontrol",
        f'case "$*" in\n"show job -d") cat {LAB / "scontrol-show-job-d-running-1.txt"};;\n'
        f'"show node -d") cat {LAB / "scontrol-show-node-d-running-1.txt"};;\n*) exit 9;;\nesac\n',
    )
    config = config_from_dict(
        {
            "site": {"cluster": "lab"},
            "sources": {"slurmctld": {"scontrol_command": scontrol, "job_view": "scontrol_text"}},
        }
    )
    c = replace(ctx, config=config)
    source = get_source("slurmctld")
    outcome = run_recorded(c, "slurmctld", "once", lambda: source.collect(c, default_options(source)))
    assert outcome.status == "ok", outcome.message
    assert [
        r[:3]
        for r in rows(ctx.engine, "SELECT job_id_raw, node, gpu_index FROM gpu_allocation ORDER BY 1,2,3")
    ] == (RUNNING_1)


# ---------------------------------------------------------------- dcgm


def test_dcgm_input_stores_summaries_and_inventory(cli_env: Engine) -> None:
    assert main(["db", "upgrade"]) == 0
    argv = ["collect", "dcgm", "--input", str(DCGM), "--node", "gpu01", "--at", "2026-12-02T13:00:00"]
    assert main(argv) == 0
    summaries = rows(
        cli_env,
        "SELECT gpu_uuid, util_metric, sample_count, covered_seconds, node FROM gpu_summary ORDER BY 1",
    )
    # the capture's one real T4 has utilisation; its two other series carry no reading: unmeasured
    assert summaries == [
        ("GPU-20c56d28-0da5-6d26-a36a-e7af1ce2586e", "gpu_util", 1, 30.0, "gpu01"),
        ("GPU-9ef1b6d0-3643-5dd7-b823-c0ec20dcf2d5", "", 0, 0.0, "gpu01"),
        ("GPU-abc", "", 0, 0.0, "gpu01"),
    ]
    assert rows(cli_env, "SELECT gpu_uuid, model FROM gpu_inventory ORDER BY 1")[0] == (
        "GPU-20c56d28-0da5-6d26-a36a-e7af1ce2586e",
        "Tesla T4",
    )
    assert main(argv) == 0  # the same scrape again is not stored twice
    assert rows(cli_env, "SELECT count(*) FROM gpu_summary") == [(3,)]


class _Exporter(http.server.BaseHTTPRequestHandler):
    bodies: ClassVar[list[bytes]] = []

    def do_GET(self) -> None:
        body = self.bodies.pop(0) if len(self.bodies) > 1 else self.bodies[0]
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def exporter() -> Iterator[http.server.ThreadingHTTPServer]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Exporter)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def test_dcgm_collect_scrapes_energy_deltas_and_survives_a_dead_node(
    ctx: RunContext, exporter: http.server.ThreadingHTTPServer
) -> None:
    real = DCGM.read_bytes()
    # the second scrape: the same real text with GPU 0's energy counter 30 J (30000 mJ) higher
    later = real.replace(b"} 128996013", b"} 129026013")
    assert later != real
    _Exporter.bodies = [real, later]
    port = exporter.server_address[1]
    dead = "gpu09=127.0.0.1:1"  # nothing listens on port 1
    config = config_from_dict(
        {
            "sources": {
                "dcgm": {"enabled": True, "targets": [f"gpu01=127.0.0.1:{port}", dead], "timeout_seconds": 2}
            }
        }
    )
    source = get_source("dcgm")
    times = iter([at("2026-12-02T13:00:00"), at("2026-12-02T13:00:30")])
    first_at = next(times)
    c = replace(ctx, config=config, clock=lambda: first_at)
    first = run_recorded(c, "dcgm", "once", lambda: source.collect(c, default_options(source)))
    assert first.status == "partial" and "gpu09" in first.message
    second_at = next(times)
    c = replace(c, clock=lambda: second_at)
    run_recorded(c, "dcgm", "once", lambda: source.collect(c, default_options(source)))
    energy = rows(
        ctx.engine,
        "SELECT window_start_at, energy_method, energy_joules FROM gpu_summary "
        "WHERE gpu_uuid = 'GPU-20c56d28-0da5-6d26-a36a-e7af1ce2586e' ORDER BY window_start_at",
    )
    assert energy[0][1] == "power_integral"
    assert energy[1][1:] == ("counter", pytest.approx(30.0))
    assert rows(ctx.engine, "SELECT status, error_kind FROM collect_run ORDER BY id")[0] == (
        "partial",
        "source_unavailable",
    )


def test_dcgm_with_every_node_down_is_an_error(ctx: RunContext) -> None:
    config = config_from_dict({"sources": {"dcgm": {"targets": ["gpu09=127.0.0.1:1"], "timeout_seconds": 1}}})
    c = replace(ctx, config=config)
    source = get_source("dcgm")
    outcome = run_recorded(c, "dcgm", "once", lambda: source.collect(c, default_options(source)))
    assert (outcome.status, outcome.error_kind) == ("error", "source_unavailable")


def test_no_config_file_means_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SLURMTEL_CONFIG", raising=False)
    assert os.environ.get("SLURMTEL_CONFIG") is None
    assert Config().sources.dcgm.enabled is False


def test_attribute_command_folds_in_telemetry(cli_env: Engine, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["db", "upgrade"]) == 0
    assert main(["collect", "sacct", "--input", str(SACCT_LAB)]) == 0
    capsys.readouterr()
    assert main(["attribute"]) == 0
    # 19 started GPU attempts in the lab capture, job 13 on two nodes; no telemetry yet: all unmapped
    assert "19 attempts recomputed, 20 attempt x GPU x day rows" in capsys.readouterr().out
    assert rows(cli_env, "SELECT DISTINCT mapping FROM gpu_attribution") == [("unmapped",)]
    assert main(["attribute", "--full"]) == 0


def test_targets_are_worked_on_concurrently_and_their_results_added_up() -> None:
    from slurmtel.errors import SourceUnavailable
    from slurmtel.sources.base import RunResult
    from slurmtel.sources.targets import for_each_target

    targets = [Target(f"n{i}", f"http://n{i}:1") for i in range(4)]
    # every worker waits here until three are inside at once: it only passes when they run together
    together = threading.Barrier(3, timeout=60)

    def work(target: Target, part: RunResult) -> None:
        if target.node == "n3":
            raise SourceUnavailable("connection refused")
        together.wait()
        part.rows_read, part.rows_written = 10, 7
        part.notes.append(f"{target.node}: pulled")

    result = RunResult()
    for_each_target(targets, work, result, "agent", concurrency=3)
    assert (result.rows_read, result.rows_written) == (30, 21)
    assert result.notes == ["n0: pulled", "n1: pulled", "n2: pulled"]
    assert result.errors == ["n3: connection refused"]

    def dead(target: Target, part: RunResult) -> None:
        raise SourceUnavailable("connection refused")

    with pytest.raises(SourceUnavailable, match="no agent answered"):
        for_each_target(targets, dead, RunResult(), "agent", concurrency=2)


def test_target_workers_leave_sigint_and_sigterm_to_the_main_thread() -> None:
    """A worker taking the process's SIGINT would leave the main thread asleep on the pool, and
    ^C unanswered until every node has answered (slurmtel.threads)."""
    from slurmtel.sources.base import RunResult
    from slurmtel.sources.targets import for_each_target

    masks: list[set[signal.Signals]] = []

    def work(target: Target, part: RunResult) -> None:
        masks.append(signal.pthread_sigmask(signal.SIG_BLOCK, []))

    for_each_target(
        [Target(f"n{i}", f"http://n{i}:1") for i in range(3)], work, RunResult(), "agent", concurrency=3
    )
    assert len(masks) == 3
    assert all({signal.SIGINT, signal.SIGTERM} <= mask for mask in masks)
    # the caller's own mask is as it was
    assert not {signal.SIGINT, signal.SIGTERM} & signal.pthread_sigmask(signal.SIG_BLOCK, [])
