"""slurmtel's sacct source against real Slurm 22.05, 24.11 and 26.05 (the labs in tests/slurm_lab).

Every test runs on each lab. The oracles are that lab's own tools on its own slurmdbd:
`sacct -a -D -X -P` for the attempts, `sreport ... AccountUtilizationByUser` for GPU time per
account, and the scenario's manifest (what each job was made to do) for the states.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from sqlalchemy import Engine, text

from slurmtel.access import EVERYTHING
from slurmtel.config import Config
from slurmtel.sources import SOURCES
from slurmtel.sources.base import RunContext, utc_now
from slurmtel.sources.runner import RunOutcome, run_recorded
from slurmtel.store.usage import usage_report
from slurmtel.timeparse import report_window
from tests.integration.lab import SACCT_FORMATS, SlurmLab

pytestmark = pytest.mark.slurm

ATTEMPT_SQL = """
    SELECT job_id_raw, job_id, submit_at, state, exit_code, user_name, account, start_at,
           end_at, eligible_at, alloc_gpus, nodes, array_job_id, array_task_id, job_submit_at,
           attempt_number, first_seen_at, updated_at
    FROM job_attempt WHERE cluster = :cluster ORDER BY submit_at, job_id_raw
"""
# sreport -P prints a few title lines, then this header, then one line per cluster/account/user
SREPORT_HEADER = "Cluster|Account|Login|Proper Name|TRES Name|Used"


def iso(at: datetime) -> str:
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S")


def live_ctx(config: Config, engine: Engine) -> RunContext:
    # the real clock: these attempts happened just now, not at the suite's fixed test time
    return RunContext(config=config, engine=engine, clock=utc_now)


def sacct_options(start: datetime, end: datetime) -> argparse.Namespace:
    """The options `slurmtel collect sacct --once -S START -E END` gets: the source's own
    argparse defaults plus the window."""
    parser = argparse.ArgumentParser()
    SOURCES["sacct"].add_arguments(parser)
    return parser.parse_args(["-S", iso(start), "-E", iso(end)])


def collect(ctx: RunContext, start: datetime, end: datetime) -> RunOutcome:
    """One recorded `collect sacct --once` run over [START, END], as the CLI and daemon do it."""
    source = SOURCES["sacct"]
    options = sacct_options(start, end)
    outcome = run_recorded(ctx, source.name, "once", lambda: source.collect(ctx, options))
    assert outcome.status == "ok", f"{outcome.error_kind}: {outcome.message} {outcome.result.notes}"
    return outcome


def attempts(engine: Engine, cluster: str) -> list[dict[str, Any]]:
    with engine.connect() as conn:
        return [dict(r) for r in conn.execute(text(ATTEMPT_SQL), {"cluster": cluster}).mappings()]


def sacct_attempts(lab: SlurmLab, start: datetime, end: datetime) -> list[tuple[int, int, str]]:
    """(JobIDRaw, Submit epoch, base state) of every allocation `sacct -a -D -X -P` shows."""
    out = subprocess.run(
        lab.spec.command(
            [
                "sacct",
                "-a",
                "-D",
                "-X",
                "-P",
                "-n",
                "-S",
                iso(start),
                "-E",
                iso(end),
                "--format=JobIDRaw,Submit,State",
            ]
        ),
        capture_output=True,
        text=True,
        check=True,
        env=dict(os.environ, TZ="UTC", SLURM_TIME_FORMAT="%s"),
    ).stdout
    rows = []
    for line in out.splitlines():
        raw, submit, state = line.split("|")
        # "CANCELLED by 0" -> "CANCELLED": slurmtel stores the base state
        rows.append((int(raw), int(submit), state.split()[0]))
    return rows


def stored_keys(rows: list[dict[str, Any]]) -> list[tuple[int, int, str]]:
    return [(r["job_id_raw"], int(r["submit_at"].timestamp()), r["state"]) for r in rows]


def wait_for(what: str, condition: Callable[[], bool]) -> None:
    # a guard against a lab that hangs, not a timing assertion: the jobs take seconds
    for _ in range(600):
        if condition():
            return
        time.sleep(0.5)
    pytest.fail(f"gave up waiting for {what}")


def sacct_state(lab: SlurmLab, job_id: int) -> str:
    out = lab.sacct("-n", "-X", "-P", "-j", str(job_id), "-o", "State").split()
    return out[0] if out else ""


@pytest.mark.parametrize("sacct_format", SACCT_FORMATS)
def test_cli_collect_stores_every_sacct_attempt_once(
    slurm_lab: SlurmLab, engine: Engine, database_url: str, tmp_path: Path, sacct_format: str
) -> None:
    lab = slurm_lab
    config_file = tmp_path / "slurmtel.toml"
    config_file.write_text(lab.config_toml({"sources": {"sacct": {"format": sacct_format}}}))
    env = dict(os.environ, SLURMTEL_DATABASE_URL=database_url, SLURMTEL_CONFIG=str(config_file))
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "slurmtel",
            "collect",
            "sacct",
            "--once",
            "-S",
            iso(lab.window_start),
            "-E",
            iso(lab.window_end),
        ],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr

    expected = sacct_attempts(lab, lab.window_start, lab.window_end)
    stored = stored_keys(attempts(engine, lab.cluster))
    assert len(set(expected)) == len(expected), "sacct listed an attempt twice"
    assert sorted(stored) == sorted(expected)
    # every scenario job (arrays: each task) is in the window, and requeued jobs have 2 attempts
    per_job = Counter(raw for raw, _, _ in expected)
    for job in lab.jobs:
        if job.array_tasks is None:
            assert per_job[job.job_id] == len(job.expected), job.label
    assert len(expected) == sum((job.array_tasks or 1) * len(job.expected) for job in lab.jobs)
    with engine.connect() as conn:
        runs = conn.execute(text("SELECT source, mode, status, rows_quarantined FROM collect_run")).all()
    assert [tuple(r) for r in runs] == [("sacct", "once", "ok", 0)]


@pytest.mark.parametrize("sacct_format", SACCT_FORMATS)
def test_attempts_match_the_scenario(slurm_lab: SlurmLab, config: Config, engine: Engine) -> None:
    lab = slurm_lab
    collect(live_ctx(config, engine), lab.window_start, lab.window_end)
    rows = attempts(engine, lab.cluster)
    assert sorted(stored_keys(rows)) == sorted(sacct_attempts(lab, lab.window_start, lab.window_end))
    for job in lab.jobs:
        if job.array_tasks is not None:
            tasks = [r for r in rows if r["array_job_id"] == job.job_id]
            assert len(tasks) == job.array_tasks, job.label
            assert sorted(r["array_task_id"] for r in tasks) == list(range(1, job.array_tasks + 1))
            assert len({r["job_id_raw"] for r in tasks}) == job.array_tasks, "each task has its own row"
            assert sorted(r["job_id"] for r in tasks) == [
                f"{job.job_id}_{t}" for t in range(1, job.array_tasks + 1)
            ]
            job_rows = tasks
            assert all(r["state"] == job.expected[0] for r in tasks), job.label
        else:
            job_rows = [r for r in rows if r["job_id_raw"] == job.job_id]
            assert [r["state"] for r in job_rows] == list(job.expected), job.label
            # attempts of one job are linked: numbered 1.., sharing the first attempt's submit time
            assert [r["attempt_number"] for r in job_rows] == list(range(1, len(job_rows) + 1))
            assert {r["job_submit_at"] for r in job_rows} == {job_rows[0]["submit_at"]}
        for r in job_rows:
            assert (r["user_name"], r["account"]) == (job.user, job.account), job.label
            assert r["alloc_gpus"] == job.gpus, job.label
            assert len(r["nodes"]) == job.nodes, (job.label, r["nodes"])
            if job.nodes:
                assert r["start_at"] is not None and r["end_at"] is not None, job.label
                assert r["start_at"] <= r["end_at"]
        if job.queue_wait:
            first = job_rows[0]
            assert first["start_at"] - first["eligible_at"] >= timedelta(seconds=1), job.label

    requeued = [job for job in lab.jobs if len(job.expected) == 2]
    assert sorted(job.label for job in requeued) == ["gpu1-requeue", "nodefail-requeue"]
    for job in requeued:
        first, second = (r for r in rows if r["job_id_raw"] == job.job_id)
        # Slurm resets the submit time on requeue: a new key, after the first attempt ended
        assert second["submit_at"] > first["submit_at"]
        assert second["submit_at"] >= first["end_at"]

    pending = next(r for r in rows if r["job_id_raw"] == lab.job("gpus4-cancel-pend").job_id)
    assert (pending["state"], pending["start_at"], pending["alloc_gpus"], pending["nodes"]) == (
        "CANCELLED",
        None,
        0,
        [],
    )
    multinode = next(r for r in rows if r["job_id_raw"] == lab.job("multinode-gpu").job_id)
    assert multinode["nodes"] == ["gpu01", "gpu02"]


@pytest.mark.parametrize("sacct_format", SACCT_FORMATS)
def test_out_of_memory_state_follows_the_cgroup_mode(
    slurm_lab: SlurmLab, config: Config, engine: Engine
) -> None:
    lab = slurm_lab
    config_plugin = next(
        line.split("=", 1)[1].strip()
        for line in lab.run(["scontrol", "show", "config"]).splitlines()
        if line.startswith("TaskPlugin ")
    )
    assert config_plugin == lab.task_plugin
    cgroup_conf = lab.spec.path("/etc/slurm/cgroup.conf")
    if lab.spec.suite is None:
        assert lab.cgroup == (lab.task_plugin == "task/cgroup") == cgroup_conf.is_file()
        if os.environ.get("SLURMLAB_CGROUP", "auto") == "auto":
            # up.sh's rule: task/cgroup exactly when the cgroup v1 memory hierarchy is writable
            assert lab.cgroup == os.access("/sys/fs/cgroup/memory/cgroup.procs", os.W_OK)
    else:
        # the chroot labs (24.11, 26.05) have no cgroup tree: no task plugin (task/none has no
        # .so any more, so TaskPlugin is unset) and cgroup.conf turns cgroups off, which slurmd
        # needs even with proctrack/linuxproc. OverMemoryKill is the only memory enforcement.
        assert (lab.task_plugin, lab.cgroup) == ("(null)", False)
        assert "CgroupPlugin=disabled" in cgroup_conf.read_text().splitlines()

    collect(live_ctx(config, engine), lab.window_start, lab.window_end)
    (oom,) = (r for r in attempts(engine, lab.cluster) if r["job_id_raw"] == lab.job("oom").job_id)
    if lab.cgroup:
        # the cgroup's OOM killer: a real OUT_OF_MEMORY
        assert (oom["state"], oom["exit_code"]) == ("OUT_OF_MEMORY", "0:125")
    else:
        # no cgroups: OverMemoryKill kills the step, and the job ends FAILED 0:9
        assert (oom["state"], oom["exit_code"]) == ("FAILED", "0:9")


def parse_sreport(out: str) -> tuple[str, dict[str, int]]:
    """(the period line, {account: Used}) with "root" for the cluster total."""
    lines = out.splitlines()
    period = next(line for line in lines if line.startswith("Cluster/Account/User Utilization"))
    rows = lines[lines.index(SREPORT_HEADER) + 1 :]
    used: dict[str, int] = {}
    for line in rows:
        _cluster, account, login, _, tres, value = line.split("|")
        assert tres == "gres/gpu"
        if not login:
            used[account] = int(value)
    return period, used


@pytest.mark.parametrize("sacct_format", SACCT_FORMATS)
def test_gpu_seconds_per_account_equal_sreport(slurm_lab: SlurmLab, config: Config, engine: Engine) -> None:
    lab = slurm_lab
    start, end = lab.hour_window()
    ctx = live_ctx(config, engine)
    # the jobs sreport counts: every attempt that overlaps these hours
    collect(ctx, start, end)
    with engine.connect() as conn:
        rows = usage_report(conn, start=start, end=end, now=ctx.clock(), by="account", scope=EVERYTHING)
    slurmtel_seconds = {r["account"]: r["allocated_gpu_seconds"] for r in rows if r["cluster"] == lab.cluster}
    assert {a for a, s in slurmtel_seconds.items() if s} == {"biology", "chemistry", "physics"}

    args = [
        "-P",
        "-T",
        "gres/gpu",
        "cluster",
        "AccountUtilizationByUser",
        f"start={iso(start)}",
        f"end={iso(end)}",
    ]
    period, minutes = parse_sreport(lab.sreport(*args))
    # sreport reports exactly the requested hours (it was not cut back to the real clock's hour)
    last = end - timedelta(seconds=1)
    assert period.startswith(f"Cluster/Account/User Utilization {iso(start)} - {iso(last)}"), period
    _, seconds = parse_sreport(lab.sreport("-t", "seconds", *args))

    accounts = set(slurmtel_seconds) | set(minutes) - {"root"}
    assert accounts >= {"biology", "chemistry", "physics"}
    for account in sorted(accounts):
        ours = slurmtel_seconds.get(account, 0)
        # sreport prints TRES seconds / 60 with "%.0lf": rounded to the nearest minute
        assert abs(minutes.get(account, 0) - ours / 60) <= 0.5, (account, minutes, slurmtel_seconds)
        # and in seconds the rolled-up usage is exactly slurmtel's figure
        assert seconds.get(account, 0) == ours, (account, seconds, slurmtel_seconds)
    total = sum(slurmtel_seconds.values())
    assert abs(minutes["root"] - total / 60) <= 0.5
    assert seconds["root"] == total


def zone_for_a_local_day(start: datetime, end: datetime) -> tuple[str, date]:
    """A zone a whole number of hours from UTC without DST (Etc/GMT-k is UTC+k) in which the
    hours [START, END) lie in one local day, and that day; preferably one whose date, read as a
    UTC day as a head without site.timezone did before, holds none of those hours (so that the
    test tells the two apart)."""
    valid: list[tuple[str, date]] = []
    for offset in [*range(1, 15), *range(-1, -13, -1)]:
        shift = timedelta(hours=offset)
        day = (start + shift).date()
        if (end - timedelta(seconds=1) + shift).date() != day:
            continue  # the window crosses local midnight
        name = f"Etc/GMT{'-' if offset > 0 else '+'}{abs(offset)}"
        utc_start = datetime.combine(day, datetime.min.time(), UTC)
        # the same wall times read as UTC: [day 00:00Z, END's local wall time as UTC)
        if utc_start >= end or end + shift <= start:
            return name, day
        valid.append((name, day))
    return valid[0]


def test_a_head_in_another_zone_without_site_timezone_agrees_with_sreport(
    slurm_lab: SlurmLab, engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A head node whose local zone is not UTC ($TZ, as a shell or a systemd unit may set it, or
    /etc/localtime) and whose config has no site.timezone: `-S DAY` is that zone's midnight, as
    it is for sreport run on the same host. GPU-seconds per account over a window that starts at
    a local midnight equal `sreport -t seconds` run under the same TZ."""
    lab = slurm_lab
    start, end = lab.hour_window()
    zone, day = zone_for_a_local_day(start, end)
    local_end = end.astimezone(ZoneInfo(zone)).strftime("%Y-%m-%dT%H:%M:%S")
    # the scenario's attempts, collected as the other tests do (their -S/-E are UTC times)
    ctx = live_ctx(lab.config(), engine)
    collect(ctx, start, end)
    # the head: its local zone is ZONE, and its config does not name one
    monkeypatch.setenv("TZ", zone)
    config = lab.config()
    assert (config.site.timezone, config.timezone_name) == ("", zone)
    # what `slurmtel report usage -S DAY -E LOCAL_END --by account` cuts, on this head
    window_start, window_end = report_window(day.isoformat(), local_end, now=ctx.clock(), zone=config.zone)
    assert window_start <= start and window_end == end, (zone, window_start, window_end)
    with engine.connect() as conn:
        rows = usage_report(
            conn, start=window_start, end=window_end, now=ctx.clock(), by="account", scope=EVERYTHING
        )
    ours = {r["account"]: r["allocated_gpu_seconds"] for r in rows if r["cluster"] == lab.cluster}
    assert {a for a, s in ours.items() if s} == {"biology", "chemistry", "physics"}

    args = ["-t", "seconds", "-P", "-T", "gres/gpu", "cluster", "AccountUtilizationByUser"]
    period, seconds = parse_sreport(
        lab.sreport(*args, f"start={day.isoformat()}", f"end={local_end}", tz=zone)
    )
    # sreport read and printed the window in the same zone: from the local midnight on
    assert period.startswith(f"Cluster/Account/User Utilization {day.isoformat()}T00:00:00 - "), period
    for account in sorted(set(ours) | set(seconds) - {"root"}):
        assert seconds.get(account, 0) == ours.get(account, 0), (zone, account, seconds, ours)
    assert seconds["root"] == sum(ours.values())


def parse_sreport_tres(out: str) -> dict[tuple[str, str, str], int]:
    """(account, login, TRES) -> Used of `sreport -P -T ALL ... AccountUtilizationByUser`:
    login "" for an account's own row (its users and sub-accounts summed), "root" the cluster."""
    lines = out.splitlines()
    rows = lines[lines.index(SREPORT_HEADER) + 1 :]
    used: dict[tuple[str, str, str], int] = {}
    for line in rows:
        _cluster, account, login, _, tres, value = line.split("|")
        used[account, login, tres] = int(value)
    return used


def test_every_tres_equals_sreport(slurm_lab: SlurmLab, config: Config, engine: Engine) -> None:
    """report usage --tres all per account and per user equals sreport -T ALL -t seconds, TRES
    by TRES, to the second (issue 27 item 1); the job mix has CPU-only jobs on one and two
    nodes and --mem jobs, so cpu, mem and node differ from the GPUs' figures."""
    from slurmtel.store.usage import NOT_ALLOCATED_TRES, tres_usage_report

    lab = slurm_lab
    start, end = lab.hour_window()
    ctx = live_ctx(config, engine)
    collect(ctx, start, end)
    ours: dict[str, dict[tuple[str, str], int]] = {}
    with engine.connect() as conn:
        for by in ("account", "user"):
            rows = tres_usage_report(
                conn, start=start, end=end, now=ctx.clock(), by=by, scope=EVERYTHING, zone=UTC
            )
            summed: dict[tuple[str, str], int] = {}
            for r in rows:
                if r["cluster"] == lab.cluster:
                    key = (r[by], r["tres"])
                    summed[key] = summed.get(key, 0) + r["allocated_tres_seconds"]
            ours[by] = summed

    sreport = parse_sreport_tres(
        lab.sreport(
            "-P", "-t", "seconds", "-T", "ALL", "cluster", "AccountUtilizationByUser",
            f"start={iso(start)}", f"end={iso(end)}",
        )
    )  # fmt: skip
    tres_names = {tres for _, _, tres in sreport}
    assert {"cpu", "mem", "node", "billing", "gres/gpu", "energy"} <= tres_names, tres_names
    # every TRES slurmtel counts is one sreport reports
    assert {tres for _, tres in ours["account"]} <= tres_names
    accounts = {"biology", "chemistry", "physics"}
    for tres in sorted(tres_names):
        if tres in NOT_ALLOCATED_TRES:
            # energy is consumed joules, not TRES-seconds; the lab gathers none
            assert {v for (_, _, t), v in sreport.items() if t == tres} <= {0}, tres
            continue
        theirs_by_account = {a: v for (a, login, t), v in sreport.items() if t == tres and not login}
        for account in sorted(accounts | {a for a, t in ours["account"] if t == tres}):
            assert ours["account"].get((account, tres), 0) == theirs_by_account.get(account, 0), (
                tres, account, ours["account"], theirs_by_account,
            )  # fmt: skip
        total = sum(v for (a, t), v in ours["account"].items() if t == tres)
        assert total == theirs_by_account.get("root", 0), (tres, total, theirs_by_account)
        theirs_by_user: dict[str, int] = {}
        for (account, login, t), v in sreport.items():
            if t == tres and login and account != "root":
                theirs_by_user[login] = theirs_by_user.get(login, 0) + v
        for user in sorted(set(theirs_by_user) | {u for u, t in ours["user"] if t == tres}):
            assert ours["user"].get((user, tres), 0) == theirs_by_user.get(user, 0), (
                tres, user, ours["user"], theirs_by_user,
            )  # fmt: skip
    # the job mix makes each TRES its own figure: CPU-only jobs, --mem, two nodes
    cpu_only = lab.job("multinode-cpu")
    assert (cpu_only.gpus, cpu_only.nodes) == (0, 2)
    for tres in ("cpu", "mem", "node", "billing", "gres/gpu"):
        assert all(ours["account"].get((a, tres), 0) > 0 for a in accounts), (tres, ours["account"])
    assert ours["user"][("bob", "cpu")] > ours["user"].get(("bob", "gres/gpu"), 0)


@pytest.mark.parametrize("sacct_format", SACCT_FORMATS)
def test_collecting_again_changes_nothing(slurm_lab: SlurmLab, config: Config, engine: Engine) -> None:
    lab = slurm_lab
    ctx = live_ctx(config, engine)
    first = collect(ctx, lab.window_start, lab.window_end)
    assert first.result.rows_written > 0
    before = attempts(engine, lab.cluster)
    with engine.connect() as conn:
        quarantined_before = conn.execute(text("SELECT count(*) FROM quarantine")).scalar_one()

    middle = lab.window_start + (lab.window_end - lab.window_start) / 2
    again = collect(ctx, lab.window_start, lab.window_end)
    overlapping = collect(ctx, lab.window_start - timedelta(hours=1), middle)
    assert again.result.rows_written == 0
    assert overlapping.result.rows_written == 0
    assert 0 < overlapping.result.rows_read <= again.result.rows_read

    after = attempts(engine, lab.cluster)
    assert len(after) == len(before)
    assert after == before  # every column, updated_at included
    with engine.connect() as conn:
        runs = conn.execute(
            text("SELECT status, rows_written, rows_quarantined FROM collect_run ORDER BY id")
        ).all()
        quarantined_after = conn.execute(text("SELECT count(*) FROM quarantine")).scalar_one()
    assert [r.status for r in runs] == ["ok", "ok", "ok"]
    assert [r.rows_written for r in runs][1:] == [0, 0]
    assert quarantined_before == quarantined_after == 0


@pytest.mark.parametrize("sacct_format", SACCT_FORMATS)
def test_running_job_is_updated_in_place(
    slurm_lab: SlurmLab, config: Config, engine: Engine, tmp_path: Path
) -> None:
    lab = slurm_lab
    ctx = live_ctx(config, engine)
    # The job runs until the test releases it: sacct may show a start a few seconds late, and a
    # fixed-length job could end before sacct ever showed it RUNNING.
    release_in_lab, release = lab.release_file(f"slurmtel-release-{tmp_path.name}-{os.getpid()}")
    release.unlink(missing_ok=True)
    # CPU only (-p debug, no GPU): a GPU job here would be in the hour sreport was rolled up for
    # without being in the rollup, and the sreport comparison could then depend on test order
    submitted_after = utc_now().replace(microsecond=0) - timedelta(seconds=1)
    job_id = lab.sbatch(
        "bob",
        "-p",
        "debug",
        "-t",
        "2",
        "-J",
        "slurmtel-running",
        wrap=f"while [ ! -e {release_in_lab} ]; do sleep 0.2; done",
    )
    try:
        wait_for(f"job {job_id} RUNNING in sacct", lambda: sacct_state(lab, job_id) == "RUNNING")
        # sacct -E T leaves out a job that became eligible in T's own second (24.11 often starts
        # a job in the second it was submitted): the window ends a second after now
        collect(ctx, submitted_after, utc_now() + timedelta(seconds=1))
        (running,) = (r for r in attempts(engine, lab.cluster) if r["job_id_raw"] == job_id)
        assert running["state"] == "RUNNING"
        assert running["start_at"] is not None and running["end_at"] is None
    finally:
        release.touch()
    wait_for(f"job {job_id} COMPLETED in sacct", lambda: sacct_state(lab, job_id) == "COMPLETED")
    release.unlink()

    collect(ctx, submitted_after, utc_now() + timedelta(seconds=1))
    (done,) = (r for r in attempts(engine, lab.cluster) if r["job_id_raw"] == job_id)
    # the same row (natural key and first_seen_at), updated: not a second attempt
    assert (done["submit_at"], done["first_seen_at"], done["start_at"]) == (
        running["submit_at"],
        running["first_seen_at"],
        running["start_at"],
    )
    assert done["state"] == "COMPLETED"
    assert done["end_at"] is not None and done["end_at"] >= done["start_at"]
    assert done["updated_at"] > running["updated_at"]
