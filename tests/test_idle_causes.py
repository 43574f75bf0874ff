"""Idle GPU time by cause: a job whose idle windows each have one planted reason (no process,
an XID, HW-slowdown throttling, IO pressure, saturated CPUs, nothing, no host signal) and a
two-node job on a busy fabric. Every idle second lands in exactly the planted cause, the
causes add up to the idle figure `report idle` prints, and runs are idempotent."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import Engine, text

from slurmtel.access import EVERYTHING
from slurmtel.attribution import run_attribution
from slurmtel.config import Config
from slurmtel.records import GpuEvent, GpuHostWindow, JobHostWindow, LustreJobStat, PortCounters
from slurmtel.store.fabric import write_port_counters
from slurmtel.store.hostside import write_gpu_host_windows, write_job_host_windows
from slurmtel.store.jobs import write_attempts
from slurmtel.store.reports_idle import idle_cause_rows, idle_report
from slurmtel.store.telemetry import write_events, write_inventory, write_summaries
from tests.factories import T0, attempt, inventory, windows

W = 30.0


def host(job: str, i: int, node: str = "gpu01", **values: float) -> JobHostWindow:
    base: dict[str, float | int | None] = {
        "read_bytes": 1000, "write_bytes": 0, "read_ops": 1, "write_ops": 0, "cpu_usage_seconds": 10.0,
        "cpus": 8, "memory_peak_bytes": 2**30, "io_some_stall_seconds": 0.0, "io_full_stall_seconds": 0.0,
        "cpu_some_stall_seconds": 0.0,
    }  # fmt: skip
    base.update(values)
    return JobHostWindow(node, job, T0 + timedelta(seconds=W * i), W, 2, **base)  # type: ignore[arg-type]


def test_each_idle_second_in_its_planted_cause(engine: Engine, config: Config) -> None:
    # job 61: one GPU on gpu01 for 14 windows; windows 12, 13 busy
    job = attempt(
        job_id_raw=61, nodes=("gpu01",), alloc_gpus=1, start_at=T0, end_at=T0 + timedelta(seconds=14 * W)
    )
    gpu = windows("GPU-61", T0, 14, busy={12, 13}, job="61", no_process={0, 1})
    planted = {
        2: ("hardware", {}),  # an XID event in the window (below)
        3: ("hardware", {}),  # HW-slowdown throttling (below)
        4: ("storage_wait", {"io_some_stall_seconds": 9.0}),  # 30 % of the window stalled on IO
        5: ("storage_wait", {"read_bytes": 40_000_000_000}),  # 1.3 GB/s of block IO
        6: ("cpu_bound", {"cpu_usage_seconds": 8 * W * 0.97}),  # 8 CPUs at 97 %
        7: ("cpu_bound", {"cpu_some_stall_seconds": 20.0}),  # CPU pressure 67 %
        8: ("idle_unexplained", {}),
        9: ("idle_unexplained", {}),
        # 10, 11: no cgroup window of the job: unmeasured
    }
    hosts = [host("61", i, **v) for i, (_, v) in planted.items()] + [host("61", i) for i in (0, 1, 12, 13)]
    # job 62: two nodes, one GPU each, 4 idle windows; gpu02's ports move 2 GB/s in windows 0, 1
    two = attempt(
        job_id_raw=62,
        nodes=("gpu02", "gpu03"),
        alloc_gpus=2,
        start_at=T0,
        end_at=T0 + timedelta(seconds=4 * W),
    )
    gpu += windows("GPU-62a", T0, 4, job="62", node="gpu02") + windows(
        "GPU-62b", T0, 4, job="62", node="gpu03"
    )
    hosts += [host("62", i, node=n) for i in range(4) for n in ("gpu02", "gpu03")]
    words = int(2e9 * W / 4)  # port_*_data count 4-byte words
    ports = [
        PortCounters("gpu02", "mlx5_0", 1, T0 + timedelta(seconds=W * i), W, deltas={"port_xmit_data": words})
        for i in (0, 1)
    ]
    with engine.begin() as conn:
        write_attempts(conn, [job, two])
        for node, uuids in (("gpu01", ["GPU-61"]), ("gpu02", ["GPU-62a"]), ("gpu03", ["GPU-62b"])):
            write_inventory(conn, inventory(node, uuids), source="agent")
        for node in ("gpu01", "gpu02", "gpu03"):
            write_summaries(conn, [s for s in gpu if s.node == node], source="agent", node=node)
        write_job_host_windows(conn, hosts)
        write_gpu_host_windows(
            conn,
            [
                GpuHostWindow(
                    "gpu01", "GPU-61", T0 + timedelta(seconds=3 * W), W, throttle_hw_slowdown_seconds=12.0
                )
            ],
        )
        write_events(conn, [GpuEvent("gpu01", "GPU-61", T0 + timedelta(seconds=2 * W + 5), "xid", 79, "")])
        write_port_counters(conn, ports)
    now = T0 + timedelta(hours=1)
    run_attribution(engine, config, now=now)
    day = T0.date()
    with engine.connect() as conn:
        causes = idle_cause_rows(conn, first_day=day, last_day=day, scope=EVERYTHING)
        idle = idle_report(conn, first_day=day, last_day=day, scope=EVERYTHING)
        parts = conn.execute(
            text("SELECT count(*) FROM gpu_attribution_part WHERE cause_unmeasured_seconds IS NOT NULL")
        ).scalar_one()
    # job 62: gpu02's windows 0, 1 network_wait; its windows 2, 3 and gpu03's (quiet ports) unexplained
    expected = {"no_process": 2 * W, "hardware": 2 * W, "storage_wait": 2 * W, "network_wait": 2 * W,
                "cpu_bound": 2 * W, "idle_unexplained": 2 * W + 6 * W, "unmeasured": 2 * W}  # fmt: skip
    got = {r["idle_cause"]: r["idle_gpu_seconds"] for r in causes["by_cause"]}
    assert got == pytest.approx(expected)
    # the causes add up to the idle figure of `report idle`, for the site and every group
    (account,) = idle["by_account"]
    assert sum(got.values()) == account["idle_gpu_seconds"] == 12 * W + 8 * W
    for name in ("by_account", "by_user", "by_partition"):
        for group in causes[name]:
            parts_sum = sum(
                v for k, v in group.items() if k.endswith("_gpu_seconds") and k != "idle_gpu_seconds"
            )
            assert parts_sum == pytest.approx(group["idle_gpu_seconds"], abs=1e-9)
    # a second run (and a full one) gives the same rows
    run_attribution(engine, config, now=now)
    run_attribution(engine, config, now=now, full=True)
    with engine.connect() as conn:
        again = idle_cause_rows(conn, first_day=day, last_day=day, scope=EVERYTHING)
        assert (
            conn.execute(
                text("SELECT count(*) FROM gpu_attribution_part WHERE cause_unmeasured_seconds IS NOT NULL")
            ).scalar_one()
            == parts
        )
    assert again == causes


def test_checkpoint_episodes_and_startup_in_job_view(engine: Engine, config: Config) -> None:
    """A job that restores for 2 windows (reads 5 GB, GPU idle), trains, checkpoints twice (3 GB
    written over windows 6-7 with its GPU idle, then 2 GB at window 14): 2 episodes, 90 GPU-s."""
    import io
    from zoneinfo import ZoneInfo

    from slurmtel.access import Identity, Role
    from slurmtel.reports.researcher import job_document, job_query, write_job_text

    n = 20
    busy = set(range(2, n)) - {6, 7, 14}
    job = attempt(
        job_id_raw=71, nodes=("gpu01",), alloc_gpus=1, start_at=T0, end_at=T0 + timedelta(seconds=n * W)
    )
    gpu = windows("GPU-71", T0, n, busy=busy, job="71")
    writes = {6: 1_500_000_000, 7: 1_500_000_000, 14: 2_000_000_000}
    hosts = [
        host("71", i, read_bytes=2_500_000_000 if i < 2 else 0, write_bytes=writes.get(i, 0),
             io_some_stall_seconds=12.0 if i in writes or i < 2 else 0.0)
        for i in range(n)
    ]  # fmt: skip
    with engine.begin() as conn:
        write_attempts(conn, [job])
        write_inventory(conn, inventory("gpu01", ["GPU-71"]), source="agent")
        write_summaries(conn, gpu, source="agent", node="gpu01")
        write_job_host_windows(conn, hosts)
    now = T0 + timedelta(hours=1)
    run_attribution(engine, config, now=now)
    with engine.connect() as conn:
        stored = conn.execute(text("SELECT * FROM job_checkpoint WHERE job_id_raw = 71")).mappings().one()
        query = job_query(Identity("root", Role.ADMIN), "71", clusters=(), now=now, zone=ZoneInfo("UTC"))
        (report,) = job_document(conn, query)
    assert (stored["episodes"], stored["checkpoint_gpu_seconds"], stored["checkpoint_write_bytes"]) == (
        2, 3 * W, 5_000_000_000,
    )  # fmt: skip
    assert (stored["startup_seconds"], stored["startup_read_bytes"]) == (2 * W, 5_000_000_000)
    # the job view says the same, and why its GPUs idled: all of it waiting on storage
    assert report["checkpoint_episodes"] == 2 and report["startup_seconds"] == 2 * W
    causes = {c["idle_cause"]: c["idle_gpu_seconds"] for c in report["idle_by_cause"]}
    assert causes["storage_wait"] == 5 * W and sum(causes.values()) == 5 * W
    out = io.StringIO()
    write_job_text([report], out, ZoneInfo("UTC"))
    text_out = out.getvalue()
    assert "idle cause  storage_wait 100 % of idle GPU time (estimate)" in text_out
    assert "checkpoints 2 episode(s), GPUs idle 00:01:30" in text_out
    assert "start-up    00:01:00 until the GPUs first worked" in text_out
    # the fleet report: GPU time checkpointing and starting, by account and partition
    from slurmtel.store.reports_idle import checkpoint_report

    with engine.connect() as conn:
        fleet = checkpoint_report(conn, start=T0, end=now, scope=EVERYTHING)
    (account,) = fleet["by_account"]
    assert (account["account"], account["jobs"], account["checkpoint_episodes"]) == ("physics", 1, 2)
    assert (account["checkpoint_gpu_seconds"], account["startup_gpu_seconds"]) == (3 * W, 2 * W)
    assert fleet["by_partition"][0]["checkpoint_write_bytes"] == 5_000_000_000


def test_job_view_checkpoints_after_the_first_hour_match_the_attribution_run(
    engine: Engine, config: Config
) -> None:
    """A 2.5-hour job on two GPUs (its hours packed): the job view reads the GPUs' windows of
    the start-up hour and of the write bursts only, and finds what the attribution run stored:
    start-up after 2 windows; bursts at windows 150-151 (GPUs idle: one episode), 200 (GPUs
    busy: none), 250 (idle: a second episode)."""
    from zoneinfo import ZoneInfo

    from slurmtel.access import Identity, Role
    from slurmtel.reports.researcher import job_document, job_query

    n = 300
    idle = {0, 1, 150, 151, 250, 260}
    job = attempt(
        job_id_raw=72, nodes=("gpu01",), alloc_gpus=2, start_at=T0, end_at=T0 + timedelta(seconds=n * W)
    )
    gpu = windows("GPU-72a", T0, n, busy=set(range(n)) - idle, job="72") + windows(
        "GPU-72b", T0, n, busy=set(range(n)) - idle, job="72"
    )
    writes = {150: 1_500_000_000, 151: 1_500_000_000, 200: 2_000_000_000, 250: 2_000_000_000}
    hosts = [
        host("72", i, read_bytes=2_500_000_000 if i < 2 else 0, write_bytes=writes.get(i, 0))
        for i in range(n)
    ]
    with engine.begin() as conn:
        write_attempts(conn, [job])
        write_inventory(conn, inventory("gpu01", ["GPU-72a", "GPU-72b"]), source="agent")
        write_summaries(conn, gpu, source="agent", node="gpu01")
        write_job_host_windows(conn, hosts)
    now = T0 + timedelta(hours=4)
    run_attribution(engine, config, now=now)
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM gpu_window")).scalar_one() < len(gpu)  # packed
        stored = conn.execute(text("SELECT * FROM job_checkpoint WHERE job_id_raw = 72")).mappings().one()
        query = job_query(Identity("root", Role.ADMIN), "72", clusters=(), now=now, zone=ZoneInfo("UTC"))
        (report,) = job_document(conn, query)
    expected = (2, 2 * 3 * W, 5_000_000_000, 2 * W, 5_000_000_000)
    assert (
        stored["episodes"], stored["checkpoint_gpu_seconds"], stored["checkpoint_write_bytes"],
        stored["startup_seconds"], stored["startup_read_bytes"],
    ) == expected  # fmt: skip
    assert (
        report["checkpoint_episodes"], report["checkpoint_gpu_seconds"], report["checkpoint_write_bytes"],
        report["startup_seconds"], report["startup_read_bytes"],
    ) == expected  # fmt: skip


def test_the_job_views_attempt_read_says_which_attempts_have_cgroup_windows(
    engine: Engine, config: Config
) -> None:
    """read_attempts gives with each attempt the host-side figures attempts_efficiency gives and
    whether a cgroup window of it exists (from a minute before its start to its end, or NOW
    while it runs): the checkpoint estimate is read only then, and is None exactly when not."""
    from slurmtel.store.efficiency import attempts_efficiency
    from slurmtel.store.hostside import CheckpointThresholds, checkpoint_estimate
    from slurmtel.store.jobview import read_attempts

    ended = attempt(job_id_raw=73, nodes=("gpu01",), start_at=T0, end_at=T0 + timedelta(seconds=4 * W))
    bare = attempt(job_id_raw=74, nodes=("gpu01",), start_at=T0, end_at=T0 + timedelta(seconds=4 * W))
    running = attempt(job_id_raw=75, nodes=("gpu02",), start_at=T0, end_at=None, state="RUNNING")
    # job 74's only cgroup window is on a node it did not run on; job 75's from after its start
    hosts = [host("73", i) for i in range(4)] + [host("74", 1, node="gpu02"), host("75", 30, node="gpu02")]
    with engine.begin() as conn:
        write_attempts(conn, [ended, bare, running])
        write_job_host_windows(conn, hosts)
    now = T0 + timedelta(hours=1)
    with engine.connect() as conn:
        for raw, measured in ((73, True), (74, False), (75, True)):
            (read,) = read_attempts(conn, str(raw), scope=EVERYTHING, now=now)
            a = read.attempt
            assert read.cgroup_measured is measured, raw
            assert read.efficiency == attempts_efficiency(conn, [a.key], now=now)[a.key]
            assert a.start_at is not None
            estimate = checkpoint_estimate(
                conn, cluster=a.cluster, job_id_raw=a.job_id_raw, submit_at=a.submit_at, nodes=a.nodes,
                start_at=a.start_at, end_at=a.end_at or now, gpus=1.0, thresholds=CheckpointThresholds(),
            )  # fmt: skip
            assert (estimate is not None) is measured, raw
        # before job 75's window, it has none yet
        (early,) = read_attempts(conn, "75", scope=EVERYTHING, now=T0 + timedelta(seconds=30 * W))
        assert not early.cgroup_measured


def test_startup_ignores_the_previous_jobs_windows_on_the_same_gpus() -> None:
    """The windows read from a minute before the start are the GPUs' previous job's when they
    ended by the start: busy there is not this job becoming active (the demo's planted
    checkpoint job follows another on the same GPUs)."""
    from types import SimpleNamespace

    from slurmtel.store.hostside import CheckpointThresholds, estimate_from_windows

    start = datetime(2026, 11, 3, 8, 0, tzinfo=UTC)

    def row(offset: int, util: float, read: int | None) -> SimpleNamespace:
        return SimpleNamespace(
            at=start + timedelta(seconds=offset), written=0 if read is not None else None, read=read,
            util=util, idle=0.0, measured=read is not None,
        )  # fmt: skip

    rows = [
        row(-60, 90.0, None),
        row(-30, 90.0, None),
        row(0, 0.0, 10**9),
        row(30, 0.0, 10**9),
        row(60, 80.0, 0),
    ]
    estimate = estimate_from_windows(rows, start, 4.0, CheckpointThresholds())
    assert estimate is not None
    assert estimate.startup_seconds == 60.0
    assert estimate.startup_read_bytes == 2 * 10**9


def test_lustre_traffic_per_window_is_storage_wait(engine: Engine, config: Config, tmp_path: Path) -> None:
    """Lustre writes are invisible to the cgroup's io.stat: job 24 of the real 2.10 OST capture
    (HPE's lustre_exporter) and, 60 s later, the same capture with 60 GB more written by job 24
    (1 GB/s over those 60 s, spread evenly). The idle windows that interval covers by at least
    15 GB (500 MB/s x 30 s) are storage_wait though the cgroup saw no IO; the window it covers
    by 6 s is not; one with no cgroup window but the Lustre traffic is storage_wait, not
    unmeasured. The first snapshot (2.10: no start_time) says nothing about when its bytes
    moved: no window gets them."""
    from slurmtel.sources import default_options, get_source
    from slurmtel.sources.base import RunContext
    from tests.conftest import fixture_path

    capture = fixture_path("lustre", "hpe_lustre_exporter_obdfilter_OST0000_job_stats")
    first = capture.read_text()
    snapshot = datetime.fromtimestamp(1510782606, UTC)
    later = first.replace("1510782606", "1510782666").replace("215147593728", str(215147593728 + 60 * 10**9))
    (tmp_path / "later").write_text(later)
    # job 24 for 8 windows from the window before the one the first snapshot (:06 s) falls in
    start = snapshot.replace(second=0) - timedelta(seconds=30)
    job = attempt(
        job_id_raw=24, nodes=("gpu01",), alloc_gpus=1, start_at=start, end_at=start + timedelta(seconds=8 * W),
        submit_at=start - timedelta(minutes=1), eligible_at=start - timedelta(minutes=1),
    )  # fmt: skip
    gpu = windows("GPU-24", start, 8, job="24")
    # a quiet cgroup window for every window but 2 and 6 (no host signals there)
    hosts = [
        JobHostWindow("gpu01", "24", start + timedelta(seconds=W * i), W, 2, read_bytes=0, write_bytes=0,
                      cpu_usage_seconds=1.0, cpus=8, io_some_stall_seconds=0.0, cpu_some_stall_seconds=0.0)
        for i in range(8) if i not in (2, 6)
    ]  # fmt: skip
    with engine.begin() as conn:
        write_attempts(conn, [job])
        write_inventory(conn, inventory("gpu01", ["GPU-24"], seen=start), source="agent")
        write_summaries(conn, gpu, source="agent", node="gpu01")
        write_job_host_windows(conn, hosts)
    source = get_source("lustre")
    options = default_options(source)
    options.target = "lustrefs-OST0000"
    ctx = RunContext(config=config, engine=engine)
    for path in (capture, tmp_path / "later"):
        result = source.ingest(ctx, path, options)
        assert result.rows_written == 35
    run_attribution(engine, config, now=start + timedelta(hours=1))
    with engine.connect() as conn:
        rows = conn.execute(
            text("SELECT cause_storage_wait_seconds, cause_idle_unexplained_seconds, cause_unmeasured_seconds "
                 "FROM gpu_attribution_part WHERE job_id_raw = 24")
        ).all()  # fmt: skip
    storage, unexplained, unmeasured = (sum(float(r[i]) for r in rows) for i in range(3))
    # window i starts at :30 + 30 s x i (minute m); the interval is m+1:06 - m+2:06: window 1
    # holds 24 s of it (24 GB), window 2 30 s (no cgroup window: storage_wait all the same),
    # window 3 6 s (6 GB, under 15 GB: unexplained); window 6, no cgroup window, no Lustre
    assert storage == pytest.approx(2 * W)
    assert unexplained == pytest.approx(5 * W)
    assert unmeasured == pytest.approx(W)


def test_nfs_traffic_counts_only_for_a_job_alone_on_its_node(engine: Engine, config: Config) -> None:
    """A node's NFS counters are every job's on it: 20 GB in a window (over 500 MB/s x 30 s) is
    storage_wait for job 71, alone on gpu05, and nobody's for jobs 72 and 73 sharing gpu06."""
    from slurmtel.records import NodeFsWindow
    from slurmtel.store.hostside import write_node_fs_windows

    jobs, gpu, hosts, mounts = [], [], [], []
    for raw, node in ((71, "gpu05"), (72, "gpu06"), (73, "gpu06")):
        jobs.append(
            attempt(
                job_id_raw=raw, nodes=(node,), alloc_gpus=1, start_at=T0, end_at=T0 + timedelta(seconds=4 * W)
            )
        )
        gpu += windows(f"GPU-{raw}", T0, 4, job=str(raw), node=node)
        hosts += [host(str(raw), i, node=node) for i in range(4)]
    for node in ("gpu05", "gpu06"):
        mounts += [
            NodeFsWindow(node, "/home", "nfs4", "nfs1:/export/home", T0 + timedelta(seconds=W * i), W,
                           read_bytes=15 * 10**9, write_bytes=5 * 10**9)
            for i in (0, 1)
        ]  # fmt: skip
    with engine.begin() as conn:
        write_attempts(conn, jobs)
        write_inventory(conn, inventory("gpu05", ["GPU-71"]), source="agent")
        write_inventory(conn, inventory("gpu06", ["GPU-72", "GPU-73"]), source="agent")
        for node in ("gpu05", "gpu06"):
            write_summaries(conn, [s for s in gpu if s.node == node], source="agent", node=node)
        write_job_host_windows(conn, hosts)
        assert write_node_fs_windows(conn, mounts) == 4
        assert write_node_fs_windows(conn, mounts) == 0  # idempotent on its natural key
    run_attribution(engine, config, now=T0 + timedelta(hours=1))
    with engine.connect() as conn:
        rows = conn.execute(
            text("SELECT job_id_raw, sum(cause_storage_wait_seconds), sum(cause_idle_unexplained_seconds) "
                 "FROM gpu_attribution_part GROUP BY job_id_raw ORDER BY job_id_raw")
        ).all()  # fmt: skip
    assert [(r[0], float(r[1]), float(r[2])) for r in rows] == [
        (71, 2 * W, 2 * W),
        (72, 0.0, 4 * W),
        (73, 0.0, 4 * W),
    ]


def _causes_by_job(engine: Engine) -> dict[int, dict[str, float]]:
    from slurmtel.store.attribution import CAUSES

    sums = ", ".join(f"sum(cause_{c}_seconds)" for c in CAUSES)
    with engine.connect() as conn:
        rows = conn.execute(
            text(f"SELECT job_id_raw, {sums} FROM gpu_attribution_part GROUP BY job_id_raw ORDER BY 1")
        ).all()
    return {int(r[0]): {c: float(r[i + 1]) for i, c in enumerate(CAUSES)} for r in rows}


def test_cgroup_windows_stored_late_recompute_the_causes(engine: Engine, config: Config) -> None:
    """Jobs 81 (gpu01) and 82 (gpu02) idle alike, with the same cgroup windows. Job 81's are
    stored with its GPU windows; job 82's only after a run attributed its GPU windows (an agent
    restarted, its spool replayed): that run says unmeasured, the next one recomputes job 82
    alone, and its causes are job 81's, counted once."""
    # no re-reading of recently written jobs: a run selects what is new only
    config = replace(config, attribution=replace(config.attribution, overlap_seconds=0))
    planted = {
        1: {"io_some_stall_seconds": 9.0},  # storage_wait
        2: {"read_bytes": 40_000_000_000},  # storage_wait
        3: {"cpu_usage_seconds": 8 * W * 0.97},  # cpu_bound
        4: {},  # idle_unexplained
        5: {},  # idle_unexplained
    }
    jobs, gpu, hosts = [], [], {}
    for raw, node in ((81, "gpu01"), (82, "gpu02")):
        jobs.append(
            attempt(
                job_id_raw=raw, nodes=(node,), alloc_gpus=1, start_at=T0, end_at=T0 + timedelta(seconds=8 * W)
            )
        )
        # window 0 has no process, 6 and 7 are busy
        gpu += windows(f"GPU-{raw}", T0, 8, busy={6, 7}, job=str(raw), node=node, no_process={0})
        hosts[raw] = [host(str(raw), i, node=node, **v) for i, v in planted.items()] + [
            host(str(raw), i, node=node) for i in (0, 6, 7)
        ]
    with engine.begin() as conn:
        write_attempts(conn, jobs)
        for raw, node in ((81, "gpu01"), (82, "gpu02")):
            write_inventory(conn, inventory(node, [f"GPU-{raw}"]), source="agent")
            write_summaries(conn, [s for s in gpu if s.node == node], source="agent", node=node)
        write_job_host_windows(conn, hosts[81])
    run_attribution(engine, config, now=T0 + timedelta(hours=1))
    expected = {"no_process": W, "hardware": 0.0, "storage_wait": 2 * W, "network_wait": 0.0,
                "cpu_bound": W, "idle_unexplained": 2 * W, "unmeasured": 0.0}  # fmt: skip
    before = _causes_by_job(engine)
    assert before[81] == pytest.approx(expected)
    assert before[82] == pytest.approx({**{c: 0.0 for c in expected}, "no_process": W, "unmeasured": 5 * W})
    with engine.begin() as conn:
        assert conn.execute(text("SELECT count(*) FROM host_batch")).scalar_one() == 0  # folded in
        write_job_host_windows(conn, hosts[82])
        batch = conn.execute(text("SELECT node, job_id, window_min_at, window_max_at FROM host_batch")).one()
    assert tuple(batch) == ("gpu02", "82", T0, T0 + timedelta(seconds=8 * W))
    late = run_attribution(engine, config, now=T0 + timedelta(hours=2))
    assert late.attempts == 1  # job 82 only: job 81 is not read again
    after = _causes_by_job(engine)
    assert after[82] == pytest.approx(after[81]) and after[81] == pytest.approx(expected)
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM host_batch")).scalar_one() == 0
        parts = conn.execute(
            text(
                "SELECT job_id_raw, count(*), sum(idle_seconds) FROM gpu_attribution_part GROUP BY 1 ORDER BY 1"
            )
        ).all()
        rows = conn.execute(text("SELECT * FROM gpu_attribution ORDER BY job_id_raw")).all()
    # nothing counted twice: the same slices, and the causes add up to the idle time
    assert [(r[1], float(r[2])) for r in parts] == [(1, 6 * W), (1, 6 * W)]
    assert sum(after[82].values()) == pytest.approx(6 * W)
    # a run with nothing new changes nothing, and a full recompute gives the same rows
    assert run_attribution(engine, config, now=T0 + timedelta(hours=2)).attempts == 0
    run_attribution(engine, config, now=T0 + timedelta(hours=2), full=True)
    assert _causes_by_job(engine) == after
    with engine.connect() as conn:
        again = conn.execute(text("SELECT * FROM gpu_attribution ORDER BY job_id_raw")).all()
    drop = [i for i, c in enumerate(again[0]._fields) if c == "computed_at"]
    assert [tuple(v for i, v in enumerate(r) if i not in drop) for r in again] == [
        tuple(v for i, v in enumerate(r) if i not in drop) for r in rows
    ]


def test_late_nfs_windows_and_lustre_snapshots_mark_their_attempts(
    engine: Engine, config: Config, tmp_path: Path
) -> None:
    """A node's NFS windows stored late mark every attempt on the node over their span; a late
    Lustre snapshot marks its job's attempt from the entry's previous snapshot on."""
    config = replace(config, attribution=replace(config.attribution, overlap_seconds=0))
    from slurmtel.records import NodeFsWindow
    from slurmtel.store.hostside import write_lustre_stats, write_node_fs_windows

    job = attempt(
        job_id_raw=91, nodes=("gpu05",), alloc_gpus=1, start_at=T0, end_at=T0 + timedelta(seconds=4 * W)
    )
    with engine.begin() as conn:
        write_attempts(conn, [job])
        write_inventory(conn, inventory("gpu05", ["GPU-91"]), source="agent")
        write_summaries(conn, windows("GPU-91", T0, 4, job="91", node="gpu05"), source="agent", node="gpu05")
        write_job_host_windows(conn, [host("91", i, node="gpu05") for i in range(4)])
    run_attribution(engine, config, now=T0 + timedelta(hours=1))
    assert _causes_by_job(engine)[91]["idle_unexplained"] == pytest.approx(4 * W)
    mounts = [
        NodeFsWindow("gpu05", "/home", "nfs4", "nfs1:/export/home", T0 + timedelta(seconds=W * i), W,
                     read_bytes=15 * 10**9, write_bytes=5 * 10**9)
        for i in (0, 1)
    ]  # fmt: skip
    with engine.begin() as conn:
        write_node_fs_windows(conn, mounts)
    assert run_attribution(engine, config, now=T0 + timedelta(hours=2)).attempts == 1
    causes = _causes_by_job(engine)[91]
    assert (causes["storage_wait"], causes["idle_unexplained"]) == pytest.approx((2 * W, 2 * W))
    # Lustre: an entry started at window 2, 40 GB written by the end of window 3 (20 GB a
    # window, over 15 GB), read late: windows 2 and 3 become storage_wait
    stat = LustreJobStat(
        target="fs-OST0000", job_name="91", snapshot_at=T0 + timedelta(seconds=4 * W), job_id="91",
        start_at=T0 + timedelta(seconds=2 * W), read_bytes=0, write_bytes=40 * 10**9, read_ops=0,
        write_ops=40, metadata_ops=None, read_wait_seconds=None, write_wait_seconds=None,
    )  # fmt: skip
    with engine.begin() as conn:
        write_lustre_stats(conn, [stat])
        batch = conn.execute(text("SELECT node, job_id, window_min_at, window_max_at FROM host_batch")).one()
        assert tuple(batch) == ("", "91", stat.start_at, stat.snapshot_at)
        # the same counters again, later: they moved nothing, no batch
        write_lustre_stats(conn, [replace(stat, snapshot_at=stat.snapshot_at + timedelta(seconds=W))])
        assert conn.execute(text("SELECT count(*) FROM host_batch")).scalar_one() == 1
    assert run_attribution(engine, config, now=T0 + timedelta(hours=2)).attempts == 1
    causes = _causes_by_job(engine)[91]
    assert (causes["storage_wait"], causes["idle_unexplained"]) == pytest.approx((4 * W, 0.0))
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM host_batch")).scalar_one() == 0
