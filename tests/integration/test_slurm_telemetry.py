"""GPU attribution against real Slurm 22.05, 24.11 and 26.05: the real allocations, synthesised
telemetry. Every test runs on each lab (tests/slurm_lab).

The scenario's controller snapshots (`squeue -a --json` and `scontrol show node -d`, taken
every second while its jobs ran) go through the slurmctld source's parsers and store, so the
GPU indices are the ones Slurm really gave each job. The lab's GPUs are fake, so the node
agents' window summaries are synthesised for those GPUs with a known pattern (5 s windows,
every third one idle) - and attribution must then find exactly the busy and idle seconds the
pattern puts inside each job's real allocation.

Runs after test_slurm_sacct.py (file order): its GPU job must not be in the hour the sreport
comparison rolled up.
"""

from __future__ import annotations

import argparse
import os
import signal
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, text

from slurmtel.attribution import run_attribution
from slurmtel.commands.common import coordinated_accounts
from slurmtel.config import Config
from slurmtel.parsers.slurmctld import parse_scontrol_nodes, parse_squeue_json
from slurmtel.records import GpuInventory, GpuSummary
from slurmtel.sources import SOURCES, default_options
from slurmtel.sources.base import RunContext, utc_now
from slurmtel.sources.runner import RunOutcome, run_recorded
from slurmtel.sources.slurmctld import ControllerRecord, store_controller_view
from slurmtel.store.telemetry import resolve_allocation_uuids, write_inventory, write_summaries
from tests.integration.lab import SACCT_FORMATS, SlurmLab
from tests.integration.test_slurm_sacct import collect, live_ctx, wait_for

pytestmark = pytest.mark.slurm

WINDOW = 5
NODES = {"gpu01": 4, "gpu02": 4}


def uuid_of(node: str, index: int) -> str:
    return f"GPU-lab-{node}-{index}"


def busy(window_start: datetime) -> bool:
    """The synthesised pattern: every third 5 s window (by epoch) is idle."""
    return (int(window_start.timestamp()) // WINDOW) % 3 != 2


def expected_busy_seconds(start: datetime, end: datetime) -> float:
    total = 0.0
    t = datetime.fromtimestamp(int(start.timestamp()) // WINDOW * WINDOW, UTC)
    while t < end:
        overlap = (min(t + timedelta(seconds=WINDOW), end) - max(t, start)).total_seconds()
        if overlap > 0 and busy(t):
            total += overlap
        t += timedelta(seconds=WINDOW)
    return total


def snapshot_time(path: Path) -> datetime:
    return datetime.strptime(path.stem.split("-", 1)[1], "%Y%m%dT%H%M%S").replace(tzinfo=UTC)


def ingest_snapshots(ctx: RunContext, lab: SlurmLab) -> int:
    """Every controller snapshot of the scenario, through the slurmctld source's store path."""
    snapshots = sorted((lab.run_dir / "snapshots").glob("squeue-*.json"))
    assert len(snapshots) >= 30, f"only {len(snapshots)} controller snapshots in {lab.run_dir}"
    for jobs_file in snapshots:
        at = snapshot_time(jobs_file)
        records: list[ControllerRecord] = [
            *parse_squeue_json(jobs_file.read_text(), cluster=lab.cluster, at=at)
        ]
        nodes_file = jobs_file.with_name(f"nodes-{jobs_file.stem.split('-', 1)[1]}.txt")
        if nodes_file.exists():
            records += parse_scontrol_nodes(nodes_file.read_text(), cluster=lab.cluster, at=at)
        store_controller_view(ctx, records, cluster=lab.cluster, at=at)
    return len(snapshots)


def synthesise_telemetry(ctx: RunContext, lab: SlurmLab) -> None:
    """What node agents on the lab's nodes would report: inventory and 5 s windows per GPU."""
    start = datetime.fromtimestamp(int(lab.window_start.timestamp()) // WINDOW * WINDOW, UTC)
    with ctx.engine.begin() as conn:
        for node, gpus in NODES.items():
            inventory = [
                GpuInventory(
                    node=node, gpu_uuid=uuid_of(node, i), index=i, model="NVIDIA H100", observed_at=start
                )
                for i in range(gpus)
            ]
            write_inventory(conn, inventory, source="agent")
            summaries = []
            for i in range(gpus):
                t = start
                while t < lab.window_end:
                    on = busy(t)
                    summaries.append(
                        GpuSummary(
                            source="agent",
                            node=node,
                            gpu_uuid=uuid_of(node, i),
                            window_start_at=t,
                            window_seconds=float(WINDOW),
                            util_metric="gr_engine_active",
                            sample_count=WINDOW,
                            covered_seconds=float(WINDOW),
                            util_mean_percent=90.0 if on else 0.0,
                            util_max_percent=95.0 if on else 0.0,
                            idle_seconds=0.0 if on else float(WINDOW),
                            no_process_seconds=None,
                        )
                    )
                    t += timedelta(seconds=WINDOW)
            write_summaries(conn, summaries, source="agent", node=node)
        resolve_allocation_uuids(conn)


@pytest.fixture
def attributed(slurm_lab: SlurmLab, config: Config, engine: Engine) -> RunContext:
    ctx = live_ctx(config, engine)
    collect(ctx, slurm_lab.window_start, slurm_lab.window_end)
    ingest_snapshots(ctx, slurm_lab)
    synthesise_telemetry(ctx, slurm_lab)
    run_attribution(engine, config, now=utc_now())
    return ctx


def gpu_attempts(engine: Engine, cluster: str) -> list[Any]:
    with engine.connect() as conn:
        return list(
            conn.execute(
                text(
                    "SELECT job_id_raw, job_id, submit_at, start_at, end_at, alloc_gpus, nodes FROM job_attempt "
                    "WHERE cluster = :c AND alloc_gpus > 0 AND start_at IS NOT NULL ORDER BY start_at"
                ),
                {"c": cluster},
            )
        )


@pytest.mark.parametrize("sacct_format", SACCT_FORMATS)
def test_every_gpu_job_has_its_real_indices(slurm_lab: SlurmLab, attributed: RunContext) -> None:
    engine = attributed.engine
    with engine.connect() as conn:
        held = {
            (r.job_id_raw, r.submit_at, r.node): r.count
            for r in conn.execute(
                text(
                    "SELECT job_id_raw, submit_at, node, count(*) FROM gpu_allocation "
                    "WHERE cluster = :c AND gpu_uuid <> '' GROUP BY 1, 2, 3"
                ),
                {"c": slurm_lab.cluster},
            )
        }
        overlapping = conn.execute(
            text(
                """
                SELECT count(*) FROM gpu_allocation a JOIN gpu_allocation b
                  ON a.gpu_uuid = b.gpu_uuid AND (a.job_id_raw, a.submit_at) < (b.job_id_raw, b.submit_at)
                 AND a.first_seen_at <= b.last_seen_at AND b.first_seen_at <= a.last_seen_at
                WHERE a.cluster = :c
                """
            ),
            {"c": slurm_lab.cluster},
        ).scalar_one()
    # a GPU is never held by two jobs at the same moment
    assert overlapping == 0
    seen = 0
    for job in gpu_attempts(engine, slurm_lab.cluster):
        if (job.end_at - job.start_at).total_seconds() < 3:
            continue  # may have come and gone between two snapshots
        for node in job.nodes:
            assert held.get((job.job_id_raw, job.submit_at, node)) == job.alloc_gpus // len(job.nodes), (
                f"job {job.job_id} on {node}"
            )
        seen += 1
    assert seen >= 12


@pytest.mark.parametrize("sacct_format", SACCT_FORMATS)
def test_attribution_finds_exactly_the_synthesised_busy_and_idle_seconds(
    slurm_lab: SlurmLab, attributed: RunContext
) -> None:
    engine = attributed.engine
    with engine.connect() as conn:
        rows = list(
            conn.execute(
                text(
                    "SELECT job_id_raw, submit_at, node, gpu_uuid, mapping, allocated_seconds, covered_seconds, "
                    "busy_seconds, idle_seconds, unmeasured_seconds FROM gpu_attribution WHERE cluster = :c"
                ),
                {"c": slurm_lab.cluster},
            )
        )
    jobs = {(j.job_id_raw, j.submit_at): j for j in gpu_attempts(engine, slurm_lab.cluster)}
    mapped = [r for r in rows if r.mapping == "slurmctld"]
    assert len({(r.job_id_raw, r.submit_at) for r in mapped}) >= 12
    for row in mapped:
        job = jobs[(row.job_id_raw, row.submit_at)]
        duration = (job.end_at - job.start_at).total_seconds()
        expected = expected_busy_seconds(job.start_at, job.end_at)
        assert row.allocated_seconds == duration
        assert row.covered_seconds == pytest.approx(duration, abs=1e-6)
        assert row.unmeasured_seconds == pytest.approx(0, abs=1e-6)
        assert row.busy_seconds == pytest.approx(expected, abs=1e-6), f"job {job.job_id} {row.gpu_uuid}"
        assert row.idle_seconds == pytest.approx(duration - expected, abs=1e-6)
    # every allocated GPU-second of every attempt is in exactly one row
    for key, job in jobs.items():
        total = sum(r.allocated_seconds for r in rows if (r.job_id_raw, r.submit_at) == key)
        assert total == pytest.approx(job.alloc_gpus * (job.end_at - job.start_at).total_seconds(), abs=1e-6)


def collect_controller(ctx: RunContext) -> RunOutcome:
    source = SOURCES["slurmctld"]
    return run_recorded(ctx, "slurmctld", "once", lambda: source.collect(ctx, default_options(source)))


def test_live_controller_snapshot_of_a_running_gpu_job(
    slurm_lab: SlurmLab, config: Config, engine: Engine, tmp_path: Path
) -> None:
    lab = slurm_lab
    release_in_lab, release = lab.release_file(f"slurmtel-release-ctld-{tmp_path.name}-{os.getpid()}")
    release.unlink(missing_ok=True)
    job_id = lab.sbatch(
        "alice",
        "--gres=gpu:2",
        "-t",
        "2",
        "-J",
        "slurmtel-ctld",
        wrap=f"while [ ! -e {release_in_lab} ]; do sleep 0.2; done",
    )
    try:
        wait_for(
            f"job {job_id} RUNNING in squeue",
            lambda: lab.run(["squeue", "-h", "-j", str(job_id), "-o", "%T"]).strip() == "RUNNING",
        )
        for view in ("squeue_json", "scontrol_text"):
            ctx = RunContext(
                config=lab.config({"sources": {"slurmctld": {"job_view": view}}}),
                engine=engine,
                clock=utc_now,
            )
            outcome = collect_controller(ctx)
            assert outcome.status == "ok", outcome.message
            with engine.connect() as conn:
                held = conn.execute(
                    text("SELECT node, gpu_index FROM gpu_allocation WHERE cluster = :c AND job_id_raw = :j"),
                    {"c": lab.cluster, "j": job_id},
                ).all()
                nodes: dict[str, int] = dict(
                    conn.execute(
                        text("SELECT DISTINCT node, gpus_total FROM node_state WHERE cluster = :c"),
                        {"c": lab.cluster},
                    ).all()
                )
            assert len(held) == 2 and len({node for node, _ in held}) == 1, (view, held)
            assert {index for _, index in held} <= {0, 1, 2, 3}
            assert nodes == {"gpu01": 4, "gpu02": 4}
    finally:
        release.touch()
    wait_for(
        f"job {job_id} gone from squeue", lambda: lab.run(["squeue", "-h", "-j", str(job_id)]).strip() == ""
    )
    release.unlink()


@pytest.mark.parametrize("sacct_format", SACCT_FORMATS)
def test_slurmdbd_down_is_source_unavailable_and_caught_up_after(
    slurm_lab: SlurmLab, config: Config, engine: Engine
) -> None:
    lab = slurm_lab
    ctx = live_ctx(config, engine)
    collect(ctx, lab.window_start, lab.window_end)
    with engine.connect() as conn:
        before = conn.execute(text("SELECT count(*) FROM job_attempt")).scalar_one()
    pid = lab.slurmdbd_pid()
    os.kill(pid, signal.SIGTERM)
    wait_for("slurmdbd stopped", lambda: not Path(f"/proc/{pid}").exists())
    try:
        source = SOURCES["sacct"]
        options = argparse.Namespace(**{**vars(default_options(source)), "start": lab.window_start.isoformat(),
                                        "end": lab.window_end.isoformat()})  # fmt: skip
        down = run_recorded(ctx, "sacct", "once", lambda: source.collect(ctx, options))
        assert (down.status, down.error_kind) == ("error", "source_unavailable"), down.message
    finally:
        lab.start_slurmdbd()
        deadline = time.monotonic() + 60
        while not lab.succeeds(["sacctmgr", "-n", "show", "cluster"]):
            assert time.monotonic() < deadline, "slurmdbd did not come back"
            time.sleep(0.5)
    collect(ctx, lab.window_start, lab.window_end)
    with engine.connect() as conn:
        after = conn.execute(text("SELECT count(*) FROM job_attempt")).scalar_one()
        statuses = [r[0] for r in conn.execute(text("SELECT status FROM collect_run ORDER BY id"))]
    assert after == before
    assert statuses[-2:] == ["error", "ok"]


def test_a_slurm_coordinator_gets_their_accounts(slurm_lab: SlurmLab, config: Config) -> None:
    lab = slurm_lab
    lab.run(["sacctmgr", "-i", "add", "coordinator", "account=chemistry", "names=bob"])
    try:
        assert coordinated_accounts(config, "bob") == {"chemistry"}
        assert coordinated_accounts(config, "carol") == frozenset()
        # as in Slurm, a coordinator of an account also coordinates its sub-accounts
        lab.run(["sacctmgr", "-i", "add", "account", "organic", "parent=chemistry"])
        lab.run(["sacctmgr", "-i", "add", "account", "polymers", "parent=organic"])
        assert coordinated_accounts(config, "bob") == {"chemistry", "organic", "polymers"}
    finally:
        for account in ("polymers", "organic"):  # whichever was added
            lab.run(["sacctmgr", "-i", "remove", "account", account], check=False)
        lab.run(["sacctmgr", "-i", "remove", "coordinator", "account=chemistry", "names=bob"])
    assert coordinated_accounts(config, "bob") == frozenset()
