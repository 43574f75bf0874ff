"""Hand-made records for store and report tests whose expected numbers must be exact."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Engine

from slurmtel.config import Config
from slurmtel.records import (
    GpuEvent,
    GpuInventory,
    GpuSummary,
    JobAttempt,
    JobHostWindow,
    NodeState,
    PendingJob,
)


def at(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def attempt(**overrides: Any) -> JobAttempt:
    values: dict[str, Any] = {
        "cluster": "lab",
        "job_id_raw": 1,
        "submit_at": at("2026-11-01T10:00:00"),
        "job_id": str(overrides.get("job_id_raw", 1)),
        "name": "train",
        "user": "alice",
        "account": "physics",
        "partition": "gpu",
        "state": "COMPLETED",
        "eligible_at": at("2026-11-01T10:00:00"),
        "start_at": at("2026-11-01T10:00:00"),
        "end_at": at("2026-11-01T11:00:00"),
        "alloc_gpus": 1,
        "alloc_tres": {"cpu": 1, "gres/gpu": 1},
    }
    values.update(overrides)
    return JobAttempt(**values)


T0 = datetime(2026, 11, 1, 10, 0, tzinfo=UTC)


def windows(
    uuid: str,
    start: datetime,
    count: int,
    busy: set[int] | None = None,
    *,
    job: str = "",
    node: str = "gpu01",
    no_process: set[int] | None = None,
    energy: float = 300.0,
) -> list[GpuSummary]:
    """COUNT 30 s windows from START; windows in BUSY are at 80 %, the rest idle at 0 %."""
    busy = busy or set()
    no_process = no_process or set()
    result = []
    for i in range(count):
        is_busy = i in busy
        result.append(
            GpuSummary(
                source="agent",
                node=node,
                gpu_uuid=uuid,
                window_start_at=start + timedelta(seconds=30 * i),
                window_seconds=30.0,
                util_metric="gr_engine_active",
                sample_count=30,
                covered_seconds=30.0,
                util_mean_percent=80.0 if is_busy else 0.0,
                util_max_percent=95.0 if is_busy else 0.0,
                idle_seconds=0.0 if is_busy else 30.0,
                no_process_seconds=30.0 if i in no_process else 0.0,
                memory_used_max_bytes=(40 if is_busy else 1) * 2**30,
                energy_joules=energy,
                energy_method="counter",
                job_ids=(job,) if job and i not in no_process else (),
            )
        )
    return result


def inventory(node: str, uuids: list[str], seen: datetime = T0) -> list[GpuInventory]:
    return [
        GpuInventory(node=node, gpu_uuid=u, index=i, model="NVIDIA H100", observed_at=seen)
        for i, u in enumerate(uuids)
    ]


# ---------------------------------------------------------------- admin reports (additive)


def node_state(
    node: str,
    when: str,
    states: tuple[str, ...],
    gpus: int,
    partitions: tuple[str, ...] = ("gpu",),
    cluster: str = "lab",
) -> NodeState:
    """One controller observation of NODE at WHEN (UTC text, see `at`)."""
    return NodeState(
        cluster=cluster,
        node=node,
        observed_at=at(when),
        states=states,
        gpus_total=gpus,
        gpus_allocated=0,
        partitions=partitions,
    )


def pending(
    job_id_raw: int,
    reason: str,
    observed: str,
    *,
    user: str,
    account: str,
    partition: str = "gpu",
    gpus: int = 1,
    eligible: str | None = None,
    cluster: str = "lab",
) -> PendingJob:
    eligible_at = at(eligible) if eligible else None
    return PendingJob(
        cluster=cluster,
        job_id_raw=job_id_raw,
        job_id=str(job_id_raw),
        submit_at=eligible_at or at(observed),
        observed_at=at(observed),
        user=user,
        account=account,
        partition=partition,
        reason=reason,
        gpus_requested=gpus,
        eligible_at=eligible_at,
    )


@dataclass
class AdminDay:
    """One site day (2026-11-01, UTC) on cluster "lab", built so that every admin report's
    figures are whole or half hours (see tests/test_report_*.py for the arithmetic):

    nodes   gpu01 2 GPUs MIXED all day; gpu02 2 GPUs in (debug, gpu), DOWN from 12:00;
            gpu03 1 GPU drained all day; gpu04 1 GPU DOWN until 18:00; gpu05 1 GPU with a
            MIG slice worth half of it (other driver); gpu06 never seen by the controller.
    jobs    101 alice/physics J1 1 GPU gpu01 00:00-02:00 COMPLETED (1 h busy, 0.5 h idle,
            0.5 h no process); 102 bob/chem 4 GPUs gpu01+gpu02 08:00-10:00 FAILED;
            103 carol/bio 1 GPU gpu02 10:00-12:00 NODE_FAIL, requeued: gpu01 14:00-15:00
            COMPLETED; 104 dave/physics 1 GPU gpu04 10:00-20:00 NODE_FAIL (more than the
            node's 6 available hours); 105 erin/physics MIG slice gpu05 12:00-13:00 busy;
            106 frank/chem 1 GPU gpu06 05:00-06:00 COMPLETED.
    host    J1's cgroup windows on gpu01: quiet, but 2 GB written in each of its first two
            idle windows (01:00, 01:00:30): one checkpoint episode, 1 GPU-minute waited.
    """

    attempts: list[JobAttempt] = field(default_factory=list)
    inventory: list[GpuInventory] = field(default_factory=list)
    summaries: dict[str, list[GpuSummary]] = field(default_factory=dict)
    node_states: list[NodeState] = field(default_factory=list)
    pending: dict[str, list[PendingJob]] = field(default_factory=dict)
    events: list[GpuEvent] = field(default_factory=list)
    job_hosts: list[JobHostWindow] = field(default_factory=list)


def admin_day() -> AdminDay:
    day = AdminDay()
    day.attempts = [
        attempt(job_id_raw=101, name="prep", user="alice", account="physics",
                submit_at=at("2026-10-31T23:50:00"), eligible_at=at("2026-10-31T23:58:00"),
                start_at=at("2026-11-01T00:00:00"), end_at=at("2026-11-01T02:00:00"),
                alloc_gpus=1, nodes=("gpu01",), nodelist="gpu01"),
        attempt(job_id_raw=102, name="train", user="bob", account="chem", state="FAILED", exit_code="1:0",
                submit_at=at("2026-11-01T07:00:00"), eligible_at=at("2026-11-01T07:00:00"),
                start_at=at("2026-11-01T08:00:00"), end_at=at("2026-11-01T10:00:00"),
                alloc_gpus=4, nodes=("gpu01", "gpu02"), nodelist="gpu[01-02]"),
        attempt(job_id_raw=103, name="sim", user="carol", account="bio", state="NODE_FAIL",
                submit_at=at("2026-11-01T09:00:00"), eligible_at=at("2026-11-01T09:00:00"),
                start_at=at("2026-11-01T10:00:00"), end_at=at("2026-11-01T12:00:00"),
                alloc_gpus=1, nodes=("gpu02",), nodelist="gpu02"),
        attempt(job_id_raw=103, name="sim", user="carol", account="bio",
                submit_at=at("2026-11-01T12:00:30"), eligible_at=at("2026-11-01T12:00:30"),
                start_at=at("2026-11-01T14:00:00"), end_at=at("2026-11-01T15:00:00"),
                alloc_gpus=1, nodes=("gpu01",), nodelist="gpu01"),
        attempt(job_id_raw=104, name="long", user="dave", account="physics", state="NODE_FAIL",
                submit_at=at("2026-11-01T09:50:00"), eligible_at=at("2026-11-01T09:50:00"),
                start_at=at("2026-11-01T10:00:00"), end_at=at("2026-11-01T20:00:00"),
                alloc_gpus=1, nodes=("gpu04",), nodelist="gpu04"),
        attempt(job_id_raw=105, name="mig", user="erin", account="physics",
                submit_at=at("2026-11-01T12:00:00"), eligible_at=at("2026-11-01T12:00:00"),
                start_at=at("2026-11-01T12:00:00"), end_at=at("2026-11-01T13:00:00"),
                alloc_gpus=1, nodes=("gpu05",), nodelist="gpu05"),
        attempt(job_id_raw=106, name="post", user="frank", account="chem",
                submit_at=at("2026-11-01T04:00:00"), eligible_at=at("2026-11-01T04:00:00"),
                start_at=at("2026-11-01T05:00:00"), end_at=at("2026-11-01T06:00:00"),
                alloc_gpus=1, nodes=("gpu06",), nodelist="gpu06"),
    ]  # fmt: skip
    seen = at("2026-11-01T00:00:00")
    new, old = ("550.54.15", "12.4"), ("535.129.03", "12.2")
    day.inventory = [
        GpuInventory("gpu01", "GPU-A0", 0, "NVIDIA H100", seen, driver_version=new[0], cuda_version=new[1]),
        GpuInventory("gpu01", "GPU-A1", 1, "NVIDIA H100", seen, driver_version=new[0], cuda_version=new[1]),
        GpuInventory("gpu03", "GPU-C0", 0, "NVIDIA H100", seen, driver_version=new[0], cuda_version=new[1]),
        GpuInventory("gpu05", "GPU-E0", 0, "NVIDIA H100", seen, driver_version=old[0], cuda_version=old[1],
                     mig_mode="enabled"),
        # a MIG instance whose share of its GPU (by SMs) is one half
        GpuInventory("gpu05", "MIG-E0-1", 0, "NVIDIA H100", seen, driver_version=old[0], cuda_version=old[1],
                     mig_mode="enabled", parent_gpu_uuid="GPU-E0", mig_profile="3g.40gb", gpu_fraction=0.5),
    ]  # fmt: skip
    day.summaries = {
        # J1: 120 busy windows, 60 idle, 60 idle with no process
        "gpu01": windows("GPU-A0", at("2026-11-01T00:00:00"), 240, busy=set(range(120)),
                         no_process=set(range(180, 240)), job="101", node="gpu01"),
        "gpu05": windows("MIG-E0-1", at("2026-11-01T12:00:00"), 120, busy=set(range(120)),
                         job="105", node="gpu05"),
    }  # fmt: skip
    polls = ("00:00", "11:59", "12:00", "17:59", "18:00", "23:59")
    for t in polls:
        when = f"2026-11-01T{t}:00"
        down_02 = t >= "12:00"
        down_04 = t < "18:00"
        day.node_states += [
            node_state("gpu01", when, ("MIXED",), 2),
            node_state("gpu02", when, ("DOWN", "NOT_RESPONDING") if down_02 else ("IDLE",), 2, ("debug", "gpu")),
            node_state("gpu03", when, ("IDLE", "DRAIN"), 1),
            node_state("gpu04", when, ("DOWN",) if down_04 else ("IDLE",), 1),
            node_state("gpu05", when, ("MIXED",), 1),
        ]  # fmt: skip
    day.pending = {
        "2026-11-01T22:00:00": [
            pending(201, "Resources", "2026-11-01T22:00:00", user="alice", account="physics",
                    eligible="2026-11-01T21:00:00"),
            pending(202, "AssocGrpGRES", "2026-11-01T22:00:00", user="alice", account="physics", gpus=4,
                    eligible="2026-11-01T20:00:00"),
        ],
        "2026-11-01T23:59:00": [
            pending(202, "AssocGrpGRES", "2026-11-01T23:59:00", user="alice", account="physics", gpus=4,
                    eligible="2026-11-01T20:00:00"),
            pending(203, "QOSMaxGRESPerUser", "2026-11-01T23:59:00", user="bob", account="chem", gpus=2,
                    eligible="2026-11-01T22:00:00"),
            pending(204, "Resources", "2026-11-01T23:59:00", user="carol", account="bio", gpus=8,
                    eligible="2026-11-01T23:00:00"),
            pending(205, "Priority", "2026-11-01T23:59:00", user="dave", account="physics", partition="debug",
                    eligible="2026-11-01T23:30:00"),
            pending(206, "Resources", "2026-11-01T23:59:00", user="erin", account="physics", gpus=2,
                    eligible="2026-11-01T23:29:00"),
        ],
    }  # fmt: skip
    day.job_hosts = [
        JobHostWindow(
            "gpu01", "101", at("2026-11-01T00:00:00") + timedelta(seconds=30 * i), 30.0, 2,
            read_bytes=0, write_bytes=2_000_000_000 if i in (120, 121) else 0, read_ops=0, write_ops=0,
            cpu_usage_seconds=30.0, cpus=8, memory_peak_bytes=2**30, io_some_stall_seconds=0.0,
        )
        for i in range(240)
    ]  # fmt: skip
    day.events = [
        GpuEvent("gpu01", "GPU-A0", at("2026-11-01T08:30:00"), "xid", 79),
        GpuEvent("gpu01", "GPU-A1", at("2026-11-01T09:00:00"), "xid", 79),
        GpuEvent("gpu01", "GPU-A0", at("2026-11-01T09:10:00"), "xid", 48),
        GpuEvent("gpu04", "GPU-D0", at("2026-11-01T09:55:00"), "ecc_double_bit", 1),
        # outside the day
        GpuEvent("gpu01", "GPU-A0", at("2026-10-30T12:00:00"), "xid", 13),
    ]
    return day


def load_admin_day(engine: Engine, config: Config, day: AdminDay | None = None) -> AdminDay:
    """Store AdminDay through the real writers and run attribution over it."""
    from slurmtel.attribution import run_attribution
    from slurmtel.store.hostside import write_job_host_windows
    from slurmtel.store.jobs import sync_outcome_classes, write_attempts
    from slurmtel.store.telemetry import (
        write_events,
        write_inventory,
        write_node_states,
        write_pending,
        write_summaries,
    )

    day = day or admin_day()
    with engine.begin() as conn:
        sync_outcome_classes(conn, config.outcomes.mapping())
        write_attempts(conn, day.attempts)
        write_inventory(conn, day.inventory, source="agent")
        for node, summaries in day.summaries.items():
            write_summaries(conn, summaries, source="agent", node=node)
        write_node_states(conn, day.node_states)
        for observed, jobs in day.pending.items():
            write_pending(conn, jobs, cluster="lab", observed_at=at(observed))
        write_events(conn, day.events)
        write_job_host_windows(conn, day.job_hosts)
    run_attribution(engine, config, now=at("2026-11-02T06:00:00"))
    return day


def with_hours(result: Any) -> Any:
    """A report's rows (a list of rows, or sections of them) with every GPU-time column in
    seconds also in GPU-hours to 4 places, as a table shows it (`failed_gpu_seconds` ->
    `failed_gpu_hours`): the tests' expectations read in hours."""
    from slurmtel.columns import COLUMNS, Kind, table_name, table_value

    if isinstance(result, dict) and all(isinstance(v, list) for v in result.values()) and result:
        return {name: with_hours(rows) for name, rows in result.items()}
    if isinstance(result, list):
        return [with_hours(r) for r in result]
    row = dict(result)
    for column, value in result.items():
        registered = COLUMNS.get(column)
        if registered is not None and registered.kind is Kind.SECONDS and "gpu_seconds" in column:
            row[table_name(column)] = table_value(column, value)
    return row
