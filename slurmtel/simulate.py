"""Synthetic Slurm data in the real formats, for benchmarks, scale tests and the demo.

Generated data goes through the real parsers: `render_sacct_json` writes the `sacct --json`
envelope of Slurm 24.11 (data_parser v0.0.42), starting each job from a real job object
captured from slurmrestd (slurmtel/data/sacct-v0.0.42-job-completed.json) and changing only
the values.
"""

from __future__ import annotations

import dataclasses
import math
import random
import uuid
import zlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from importlib import resources
from typing import Any

import orjson

from slurmtel.clock import read_clock_file, write_atomically
from slurmtel.records import GpuInventory, GpuSummary, JobHostWindow, PortCounters

_TEMPLATE_FILE = "data/sacct-v0.0.42-job-completed.json"


@dataclass(frozen=True)
class SimJob:
    """One attempt to render; None times are unset (0 in sacct JSON)."""

    job_id_raw: int
    user: str
    account: str
    partition: str
    name: str
    state: str
    submit_at: datetime
    eligible_at: datetime | None
    start_at: datetime | None
    end_at: datetime | None
    gpus: int
    nodes: Sequence[str]
    gpu_model: str = "h100"
    cpus: int = 8
    array_job_id: int = 0
    array_task_id: int | None = None
    time_limit_minutes: int = 1440
    exit_code: int = 0
    cluster: str = "sim"
    # the job's steps with their usage, as sacct without -X shows them; () = the template's
    steps: tuple[SimStep, ...] = ()
    # StdOut as sbatch -o gives it (%j: the job id); "" = Slurm's default, slurm-%j.out in the
    # user's home (the working directory)
    stdout: str = ""


@dataclass(frozen=True)
class SimStep:
    """One job step as sacct prints it: its tasks' usage (TotalCPU, TRESUsageIn max/total mem).
    A running step has none yet: slurmdbd records a step's usage when it ends."""

    name: str
    tasks: int
    cpu_seconds: float
    # the largest task's peak RSS (TRESUsageInMax mem) and the step's tasks together (TRESUsageInTot)
    mem_task_bytes: int
    mem_total_bytes: int
    running: bool = False


def _template(with_steps: bool) -> tuple[dict[str, Any], bytes]:
    document = orjson.loads(resources.files("slurmtel").joinpath(_TEMPLATE_FILE).read_bytes())
    job = document["jobs"][0]
    if not with_steps:
        job["steps"] = []
    return document, orjson.dumps(job)


def _epoch(at: datetime | None) -> int:
    return int(at.timestamp()) if at is not None else 0


def _set_number(value: int | None) -> dict[str, Any]:
    return {"set": value is not None, "infinite": False, "number": value or 0}


def _job_object(template: bytes, sim: SimJob) -> dict[str, Any]:
    job: dict[str, Any] = orjson.loads(template)
    job["job_id"] = sim.job_id_raw
    job["name"] = sim.name
    job["user"] = sim.user
    job["group"] = sim.user
    job["account"] = sim.account
    job["partition"] = sim.partition
    job["cluster"] = sim.cluster
    job["association"].update(account=sim.account, cluster=sim.cluster, user=sim.user)
    job["array"]["job_id"] = sim.array_job_id
    job["array"]["task_id"] = _set_number(sim.array_task_id)
    job["nodes"] = ",".join(sim.nodes) if sim.nodes else "None assigned"
    job["allocation_nodes"] = len(sim.nodes)
    job["state"] = {"current": [sim.state], "reason": "None"}
    job["exit_code"]["return_code"] = _set_number(sim.exit_code)
    job["exit_code"]["status"] = ["SUCCESS"] if sim.exit_code == 0 else ["ERROR"]
    elapsed = 0
    if sim.start_at is not None:
        elapsed = int(((sim.end_at or sim.start_at) - sim.start_at).total_seconds())
    job["time"].update(
        submission=_epoch(sim.submit_at),
        eligible=_epoch(sim.eligible_at),
        start=_epoch(sim.start_at),
        end=_epoch(sim.end_at),
        elapsed=elapsed,
        limit=_set_number(sim.time_limit_minutes),
    )
    job["working_directory"] = f"/home/{sim.user}"
    stdout = sim.stdout or f"/home/{sim.user}/slurm-%j.out"
    job["stdout"] = stdout
    job["stdout_expanded"] = stdout.replace("%x", sim.name).replace("%j", str(sim.job_id_raw))
    job["submit_line"] = f"sbatch --gpus={sim.gpus} {sim.name}.sh"
    requested = [
        {"type": "cpu", "name": "", "id": 1, "count": sim.cpus},
        {"type": "mem", "name": "", "id": 2, "count": sim.cpus * 4096},
        {"type": "node", "name": "", "id": 4, "count": max(1, len(sim.nodes))},
        {"type": "billing", "name": "", "id": 5, "count": sim.cpus},
    ]
    if sim.gpus:
        requested.append({"type": "gres", "name": "gpu", "id": 1001, "count": sim.gpus})
    job["tres"]["requested"] = requested
    if sim.start_at is None:
        job["tres"]["allocated"] = []
        job["steps"] = []
    else:
        allocated = [dict(t) for t in requested]
        if sim.gpus:
            allocated.append({"type": "gres", "name": f"gpu:{sim.gpu_model}", "id": 1002, "count": sim.gpus})
        job["tres"]["allocated"] = allocated
        if sim.steps and job["steps"]:
            job["steps"] = [_sim_step(job["steps"][0], sim, step, n) for n, step in enumerate(sim.steps)]
        for step in job["steps"]:
            step["nodes"]["range"] = job["nodes"]
            if not sim.steps:
                step["step"]["id"] = f"{sim.job_id_raw}.batch"
    return job


def _sim_step(template: dict[str, Any], sim: SimJob, spec: SimStep, number: int) -> dict[str, Any]:
    """SPEC as sacct --json prints a step: the batch step first, then srun steps 0, 1, ...; a
    running step with no usage (empty TRESUsage lists, TotalCPU 0), as a running job's steps show."""
    step: dict[str, Any] = orjson.loads(orjson.dumps(template))
    step["step"]["id"] = f"{sim.job_id_raw}.{'batch' if number == 0 else number - 1}"
    step["step"]["name"] = spec.name
    step["tasks"]["count"] = spec.tasks
    nodes = list(sim.nodes) if number else list(sim.nodes[:1])
    step["nodes"].update(count=len(nodes), list=nodes)
    start = _epoch(sim.start_at)
    end = 0 if spec.running or sim.end_at is None else _epoch(sim.end_at)
    step["time"].update(
        start=_set_number(start), end=_set_number(end or None), elapsed=max(0, end - start) if end else 0
    )
    step["state"] = ["RUNNING"] if spec.running else [sim.state if number else _batch_state(sim.state)]
    cpu = 0.0 if spec.running else spec.cpu_seconds
    seconds, micros = int(cpu), int(cpu % 1 * 1_000_000)
    step["time"]["total"] = {"seconds": seconds, "microseconds": micros}
    step["time"]["user"] = {"seconds": int(cpu * 0.9), "microseconds": 0}
    step["time"]["system"] = {"seconds": seconds - int(cpu * 0.9), "microseconds": 0}
    if spec.running:
        step["tres"]["requested"] = {"max": [], "min": [], "average": [], "total": []}
        return step

    def mem(count: int, task: bool) -> list[dict[str, Any]]:
        item: dict[str, Any] = {"type": "mem", "name": "", "id": 2, "count": count}
        cpu_item: dict[str, Any] = {
            "type": "cpu",
            "name": "",
            "id": 1,
            "count": int(cpu * 1000 / max(1, spec.tasks)),
        }
        if task:
            item.update(task=0, node=nodes[0] if nodes else "")
            cpu_item.update(task=0, node=nodes[0] if nodes else "")
        return [cpu_item, item]

    average = spec.mem_total_bytes // max(1, spec.tasks)
    step["tres"]["requested"] = {
        "max": mem(spec.mem_task_bytes, True),
        "min": mem(min(average, spec.mem_task_bytes), True),
        "average": mem(average, False),
        "total": mem(spec.mem_total_bytes, False),
    }
    return step


def _batch_state(state: str) -> str:
    """A batch step's state when its job ended in STATE (sacct shows a cancelled or timed-out
    job's batch step CANCELLED, a failed one's FAILED)."""
    return {"TIMEOUT": "CANCELLED", "NODE_FAIL": "CANCELLED", "OUT_OF_MEMORY": "OUT_OF_MEMORY"}.get(
        state, state
    )


def render_sacct_json(
    jobs: Iterable[SimJob], *, cluster: str = "sim", with_steps: bool = False, usage_steps: int = 0
) -> bytes:
    """The `sacct --json` output (Slurm 24.11, data_parser v0.0.42) for JOBS.

    Without steps by default (`sacct -X`, allocations only: empty step lists); WITH_STEPS keeps
    the template's batch step, as plain `sacct --json` does. USAGE_STEPS gives each started job
    that many steps carrying usage (TotalCPU, TRESUsageIn max/min/average/total, consumed) in
    the shape and size of a real 22.05 capture's steps, for measuring what reading steps costs.
    """
    document, template = _template(with_steps or usage_steps > 0)
    document = dict(document)
    sims = list(jobs)
    document["jobs"] = [_job_object(template, job) for job in sims]
    if usage_steps:
        for job, sim in zip(document["jobs"], sims, strict=True):
            if sim.start_at is not None:
                job["steps"] = [_usage_step(job["steps"][0], sim, n) for n in range(usage_steps)]
    document["meta"]["slurm"]["cluster"] = cluster
    return orjson.dumps(document)


def _usage_step(template: dict[str, Any], sim: SimJob, number: int) -> dict[str, Any]:
    """A step like the lab capture's (tests/fixtures/sacct/slurm-22.05: per-task usage with the
    node and task of each maximum and minimum), its figures from the job."""
    step: dict[str, Any] = orjson.loads(orjson.dumps(template))
    node = sim.nodes[0] if sim.nodes else "gpu001"
    elapsed = int(((sim.end_at or sim.start_at) - sim.start_at).total_seconds()) if sim.start_at else 0
    cpu_seconds = elapsed * sim.cpus * (0.2 + (sim.job_id_raw % 7) / 10)
    rss = (1 + sim.job_id_raw % 13) * 2**30
    usage = [
        ("cpu", None, int(cpu_seconds * 1000)),
        ("mem", None, rss),
        ("energy", None, 0),
        ("fs", "disk", 15465 + sim.job_id_raw % 1000),
        ("vmem", None, rss * 3),
        ("pages", None, sim.job_id_raw % 5),
    ]

    def items(with_task: bool) -> list[dict[str, Any]]:
        out = []
        for kind, name, count in usage:
            item: dict[str, Any] = {"type": kind, "name": name or "", "id": 1, "count": count}
            if with_task:
                item.update(task=0, node=node)
            out.append(item)
        return out

    step["step"]["id"] = f"{sim.job_id_raw}.{'batch' if number == 0 else number - 1}"
    step["step"]["name"] = "batch" if number == 0 else "python"
    step["time"]["total"] = {"seconds": int(cpu_seconds), "microseconds": sim.job_id_raw % 1_000_000}
    step["time"]["user"] = {"seconds": int(cpu_seconds * 0.9), "microseconds": 0}
    step["time"]["system"] = {"seconds": int(cpu_seconds * 0.1), "microseconds": 0}
    step["tres"]["requested"] = {
        "max": items(True),
        "min": items(True),
        "average": items(False),
        "total": items(False),
    }
    consumed = [
        {"type": "energy", "name": "", "id": 3, "count": 0},
        {"type": "fs", "name": "disk", "id": 6, "count": 106},
    ]
    step["tres"]["consumed"] = {"max": consumed, "min": consumed, "average": consumed, "total": consumed}
    return step


USERS = {
    "physics": ("alice", "dave", "erin"),
    "chemistry": ("bob", "frank"),
    "biology": ("carol", "grace", "heidi"),
    "ml": ("ivan", "judy", "mallory", "oscar"),
}
STATES = (
    ("COMPLETED", 0.70),
    ("FAILED", 0.10),
    ("TIMEOUT", 0.06),
    ("CANCELLED", 0.07),
    ("OUT_OF_MEMORY", 0.03),
    ("NODE_FAIL", 0.02),
    ("RUNNING", 0.02),
)


def synthetic_jobs(
    count: int, *, start: datetime, seed: int = 1, first_job_id: int = 1000
) -> Iterator[SimJob]:
    """COUNT plausible, independent attempts submitted after START (no scheduling model:
    for throughput and scale, where placement does not matter)."""
    rng = random.Random(seed)
    states = [s for s, _ in STATES]
    weights = [w for _, w in STATES]
    accounts = list(USERS)
    at = start
    for i in range(count):
        at += timedelta(seconds=rng.randint(1, 20))
        account = rng.choice(accounts)
        user = rng.choice(USERS[account])
        state = rng.choices(states, weights)[0]
        wait = timedelta(seconds=int(rng.expovariate(1 / 600)))
        run = timedelta(seconds=rng.randint(60, 36000))
        gpus = rng.choice((0, 1, 1, 2, 4, 8))
        nodes_needed = 2 if gpus == 8 and rng.random() < 0.3 else 1
        first = rng.randint(1, 120)
        nodes = [f"gpu{first + k:03d}" for k in range(nodes_needed)]
        start_at = at + wait
        running = state == "RUNNING"
        array_task = rng.randint(1, 50) if rng.random() < 0.1 else None
        yield SimJob(
            job_id_raw=first_job_id + i,
            user=user,
            account=account,
            partition="gpu" if gpus else "cpu",
            name=f"job-{rng.randint(1, 500)}",
            state=state,
            submit_at=at,
            eligible_at=at,
            start_at=start_at,
            end_at=None if running else start_at + run,
            gpus=gpus,
            nodes=nodes,
            cpus=max(1, gpus) * 8,
            array_job_id=first_job_id + i - 1 if array_task else 0,
            array_task_id=array_task,
            exit_code=1 if state == "FAILED" else 0,
        )


# ---------------------------------------------------------------- a small cluster over time
#
# A scheduling model: jobs arrive, wait for free GPUs (FIFO with a little backfill), run on
# concrete GPU indices, end in every outcome Slurm has, and are requeued after a node failure.
# Every GPU has a utilisation story (busy, one GPU of four used, stalled on data, never used)
# that the node agent's window summaries tell, so attribution has something real to find.


@dataclass(frozen=True)
class SimNode:
    name: str
    gpus: int
    partitions: tuple[str, ...]
    gpu_model: str = "h100"


@dataclass(frozen=True)
class SimOutage:
    node: str
    start_at: datetime
    end_at: datetime
    reason: str


@dataclass(frozen=True)
class SimAttempt:
    job: SimJob
    # node -> GPU indices the attempt holds there
    placement: dict[str, tuple[int, ...]]
    # how the job uses its GPUs: busy | one_gpu | dataloader | idle
    profile: str
    # seconds after start before the job's processes touch the GPUs
    setup_seconds: int
    # an acceptance job: the shipped nccl-tests capture its StdOut holds (slurmtel/data/nccl)
    nccl_log: str = ""


@dataclass(frozen=True)
class SimAcceptance:
    """An admin's nccl-tests acceptance job on whole NODES, queued at SUBMIT_AT to start at
    ELIGIBLE_AT (sbatch --begin) or later: while it waits, its nodes start no other job (a
    reservation), so it starts once they are empty. Its StdOut is the capture LOG."""

    submit_at: datetime
    eligible_at: datetime
    nodes: tuple[str, ...]
    log: str
    # a job with a planted idle cause (PLANTED_CAUSES) instead of an acceptance run: it holds
    # its whole NODES for PLANTED_WINDOWS windows (planted_runs)
    planted: str = ""


ACCEPTANCE_USER, ACCEPTANCE_ACCOUNT = "hpcadmin", "ops"
ACCEPTANCE_JOB_NAME = "nccl-allreduce"
# real nccl-tests logs of 2 nodes x 4 GPUs (CSCS, CC0; slurmtel/data/PROVENANCE.md): the fabric
# as it should be, and the same run with a broken network path (busbw 5 instead of 123 GB/s)
NCCL_LOG_GOOD = "cscs_alps_gh200_2node_srun_v2.17.1_cxi_hook.txt"
NCCL_LOG_SLOW = "cscs_alps_gh200_2node_srun_v2.17.1_no_cxi_hook_slow.txt"
_NCCL_LOG_HOSTS = ("nid005471", "nid005487")
_NCCL_LOG_GPU = "NVIDIA GH200 120GB"
ACCEPTANCE_MINUTES = 4


def acceptance_runs(
    nodes: Sequence[SimNode], start: datetime, outages: Sequence[SimOutage]
) -> list[SimAcceptance]:
    """The admins' acceptance runs: every pair of nodes when the week starts (the baseline), and
    after each maintenance window the pair of the node that was down, queued with the
    maintenance. The firmware update broke that node's network path: its run is the slow one."""
    pairs = [tuple(n.name for n in nodes[i : i + 2]) for i in range(0, len(nodes) - 1, 2)]
    runs = [SimAcceptance(start, start, pair, NCCL_LOG_GOOD) for pair in pairs]
    for outage in outages:
        pair = next((p for p in pairs if outage.node in p), None)
        if pair is not None:
            runs.append(SimAcceptance(outage.start_at, outage.end_at, pair, NCCL_LOG_SLOW))
    return runs


def nccl_acceptance_log(attempt: SimAttempt) -> bytes:
    """What an acceptance attempt printed: its capture, with the simulated host and GPU names."""
    text = resources.files("slurmtel").joinpath(f"data/nccl/{attempt.nccl_log}").read_text()
    for real, simulated in zip(_NCCL_LOG_HOSTS, attempt.job.nodes, strict=True):
        text = text.replace(real, simulated)
    return text.replace(_NCCL_LOG_GPU, "NVIDIA H100 80GB HBM3").encode()


@dataclass(frozen=True)
class SimPending:
    job: SimJob
    reason: str


@dataclass(frozen=True)
class Simulation:
    cluster: str
    nodes: tuple[SimNode, ...]
    start_at: datetime
    end_at: datetime
    attempts: tuple[SimAttempt, ...]
    outages: tuple[SimOutage, ...]
    pending_at_end: tuple[SimPending, ...]


def demo_nodes() -> tuple[SimNode, ...]:
    """4 nodes of 4 H100s: three in `gpu`, one shared by `gpu` and `debug`."""
    return (
        SimNode("gpu01", 4, ("gpu",)),
        SimNode("gpu02", 4, ("gpu",)),
        SimNode("gpu03", 4, ("gpu",)),
        SimNode("gpu04", 4, ("debug", "gpu")),
    )


_PROFILES = (("busy", 0.55), ("one_gpu", 0.15), ("dataloader", 0.2), ("idle", 0.1))
_OUTCOMES = (
    ("COMPLETED", 0.77),
    ("FAILED", 0.1),
    ("TIMEOUT", 0.02),
    ("OUT_OF_MEMORY", 0.04),
    ("CANCELLED", 0.07),
)
_JOB_NAMES = ("train", "finetune", "eval", "md-sim", "docking", "preprocess", "sweep")


def simulate_cluster(
    *,
    start: datetime,
    days: int = 7,
    nodes: tuple[SimNode, ...] | None = None,
    cluster: str = "demo",
    seed: int = 7,
    jobs_per_hour: float = 4.5,
    first_job_id: int = 5000,
    until: datetime | None = None,
    acceptance_dir: str = "",
    planted: bool = False,
) -> Simulation:
    """Simulate DAYS of a small GPU cluster from START, minute by minute.

    UNTIL (default: START + DAYS) runs the same cluster on past its DAYS: the simulation up to
    any instant is the same whatever UNTIL is (the same seed, the same maintenance window), so
    a world simulated further goes on from where a shorter one stopped (the demo's stand-ins).
    With ACCEPTANCE_DIR, the admins also run nccl-tests acceptance jobs (acceptance_runs), their
    StdOut in that folder; they draw nothing from the random stream the other jobs use. With
    PLANTED, the five jobs with known idle causes (planted_runs) are queued when the week starts
    and run on whole nodes as those empty; they draw nothing from it either.
    """
    rng = random.Random(seed)
    nodes = nodes or demo_nodes()
    end = until or start + timedelta(days=days)
    minute = timedelta(minutes=1)
    # one maintenance window (drained, then down) on the last node, mid-week
    outage_start = start + timedelta(days=days // 2, hours=9)
    outages = (SimOutage(nodes[-1].name, outage_start, outage_start + timedelta(hours=6), "firmware update"),)
    free: dict[str, set[int]] = {n.name: set(range(n.gpus)) for n in nodes}
    partitions_of = {n.name: n.partitions for n in nodes}
    queue: list[tuple[SimJob, int, float, bool]] = []  # job, gpus per node, planned seconds, requeue
    running: list[tuple[SimAttempt, datetime, str]] = []  # attempt, planned end, final state
    finished: list[SimAttempt] = []
    next_id = first_job_id
    accounts = list(USERS)
    to_submit = acceptance_runs(nodes, start, outages) if acceptance_dir else []
    to_submit += planted_runs(nodes, start) if planted else []
    waiting: list[tuple[SimJob, SimAcceptance]] = []  # acceptance jobs queued, not started
    now = start
    while now < end:
        # acceptance jobs: queued at their time, ahead of everything else
        for run in [r for r in to_submit if r.submit_at <= now]:
            to_submit.remove(run)
            per_node = next(n.gpus for n in nodes if n.name == run.nodes[0])
            if run.planted:
                account, user = PLANTED_OWNERS[run.planted]
                job = SimJob(
                    job_id_raw=next_id, user=user, account=account, partition="gpu",
                    name=f"planted-{run.planted}", state="PENDING", submit_at=now, eligible_at=run.eligible_at,
                    start_at=None, end_at=None, gpus=per_node * len(run.nodes), nodes=(),
                    cpus=PLANTED_CPUS * len(run.nodes), time_limit_minutes=240, cluster=cluster,
                )  # fmt: skip
                next_id += 1
                waiting.append((job, run))
                continue
            job = SimJob(
                job_id_raw=next_id, user=ACCEPTANCE_USER, account=ACCEPTANCE_ACCOUNT, partition="gpu",
                name=ACCEPTANCE_JOB_NAME, state="PENDING", submit_at=now, eligible_at=run.eligible_at,
                start_at=None, end_at=None, gpus=per_node * len(run.nodes), nodes=(),
                cpus=8 * per_node * len(run.nodes), time_limit_minutes=30, cluster=cluster,
                stdout=f"{acceptance_dir}/%x-%j.out",
            )  # fmt: skip
            next_id += 1
            waiting.append((job, run))
        # arrivals
        for _ in range(_poisson(rng, jobs_per_hour / 60)):
            account = rng.choice(accounts)
            user = rng.choice(USERS[account])
            partition = "debug" if rng.random() < 0.15 else "gpu"
            per_node = rng.choice((1, 1, 2, 2, 4)) if partition == "gpu" else 1
            node_count = 2 if per_node == 4 and rng.random() < 0.25 else 1
            limit = 30 if partition == "debug" else rng.choice((240, 480, 720, 1440))
            planned = min(limit * 60.0, rng.lognormvariate(7.5, 1.0) + 120)
            job = SimJob(
                job_id_raw=next_id, user=user, account=account, partition=partition,
                name=rng.choice(_JOB_NAMES), state="PENDING", submit_at=now, eligible_at=now,
                start_at=None, end_at=None, gpus=per_node * node_count, nodes=(),
                cpus=8 * per_node * node_count, time_limit_minutes=limit, cluster=cluster,
            )  # fmt: skip
            next_id += 1
            queue.append((job, per_node, planned, rng.random() < 0.8))
        # endings (planned, or a node going down under the job)
        down_now = {o.node for o in outages if o.start_at <= now < o.end_at}
        still: list[tuple[SimAttempt, datetime, str]] = []
        for attempt, planned_end, final in running:
            failed_node = next((n for n in attempt.placement if n in down_now), None)
            if failed_node is None and now < planned_end:
                still.append((attempt, planned_end, final))
                continue
            state = "NODE_FAIL" if failed_node else final
            ended = dataclasses.replace(
                attempt, job=dataclasses.replace(attempt.job, state=state, end_at=now,
                                                 exit_code=1 if state in ("FAILED", "OUT_OF_MEMORY") else 0)
            )  # fmt: skip
            finished.append(ended)
            for node, indices in attempt.placement.items():
                free[node].update(indices)
            if failed_node:
                # requeued: a new attempt, same job id, submit time reset, eligible after cred_expire
                job = dataclasses.replace(
                    attempt.job, state="PENDING", submit_at=now, eligible_at=now + timedelta(seconds=20),
                    start_at=None, end_at=None, nodes=(),
                )  # fmt: skip
                per_node = len(next(iter(attempt.placement.values())))
                remaining = max(60.0, (planned_end - now).total_seconds())
                queue.insert(0, (job, per_node, remaining, True))
        running = still
        # acceptance jobs start as soon as their whole nodes are up and empty
        for job, run in list(waiting):
            if job.eligible_at and job.eligible_at > now:
                continue
            spec = {n.name: n for n in nodes}
            if any(n in down_now or len(free[n]) < spec[n].gpus for n in run.nodes):
                continue
            placement = {n: tuple(sorted(free[n])) for n in run.nodes}
            for n in run.nodes:
                free[n].clear()
            started_job = dataclasses.replace(job, start_at=now, nodes=run.nodes, state="RUNNING")
            if run.planted:
                attempt = SimAttempt(
                    job=started_job, placement=placement, profile=f"planted-{run.planted}", setup_seconds=0
                )
                minutes = PLANTED_WINDOWS // 2
            else:
                attempt = SimAttempt(
                    job=started_job, placement=placement, profile="busy", setup_seconds=30, nccl_log=run.log
                )
                minutes = ACCEPTANCE_MINUTES
            running.append((attempt, now + timedelta(minutes=minutes), "COMPLETED"))
            waiting.remove((job, run))
        # nodes a queued acceptance job waits for start nothing else
        reserved = {n for _, run in waiting for n in run.nodes}
        # scheduling: FIFO, the first 5 waiting jobs may start out of order (backfill)
        started = 0
        for item in list(queue):
            job, per_node, planned, _ = item
            if started >= 5 or (job.eligible_at and job.eligible_at > now):
                continue
            need = job.gpus // per_node
            usable = [
                n.name for n in nodes
                if job.partition in partitions_of[n.name] and n.name not in down_now and n.name not in reserved
                and not _draining(outages, n.name, now) and len(free[n.name]) >= per_node
            ]  # fmt: skip
            if len(usable) < need:
                started += 1
                continue
            chosen = usable[:need]
            placement = {n: tuple(sorted(free[n])[:per_node]) for n in chosen}
            for n, indices in placement.items():
                free[n].difference_update(indices)
            final = _pick(rng, _OUTCOMES)
            seconds = planned
            if final == "TIMEOUT":
                seconds = job.time_limit_minutes * 60.0
            elif final in ("FAILED", "OUT_OF_MEMORY"):
                seconds = min(planned, rng.uniform(60, 1800))
            elif final == "CANCELLED":
                seconds = planned * rng.uniform(0.1, 0.9)
            attempt = SimAttempt(
                job=dataclasses.replace(job, start_at=now, nodes=tuple(chosen), state="RUNNING"),
                placement=placement,
                profile=_pick(rng, _PROFILES) if job.gpus > 1 else _pick(rng, _PROFILES[:1] + _PROFILES[2:]),
                setup_seconds=rng.choice((30, 60, 120, 300)),
            )
            running.append((attempt, now + timedelta(seconds=int(seconds)), final))
            queue.remove(item)
        now += minute
    for attempt, _, _ in running:
        finished.append(attempt)  # still running when the simulation ends
    reasons = ("Resources", "Priority", "AssocGrpGRES", "QOSMaxGRESPerUser")
    pending = tuple(
        SimPending(job, "Resources" if i == 0 else rng.choice(reasons))
        for i, (job, *_rest) in enumerate(queue)
    ) + tuple(
        SimPending(job, "BeginTime" if job.eligible_at and job.eligible_at > end else "Reservation")
        for job, _ in waiting
    )
    attempts = tuple(sorted(finished, key=lambda a: (a.job.job_id_raw, a.job.submit_at)))
    return Simulation(cluster, nodes, start, end, attempts, outages, pending)


def _poisson(rng: random.Random, rate: float) -> int:
    count, threshold, product = 0, math.exp(-rate), rng.random()
    while product > threshold:
        count += 1
        product *= rng.random()
    return count


def _pick(rng: random.Random, weighted: Sequence[tuple[str, float]]) -> str:
    return rng.choices([v for v, _ in weighted], [w for _, w in weighted])[0]


def _draining(outages: Sequence[SimOutage], node: str, now: datetime) -> bool:
    return any(o.node == node and o.start_at - timedelta(minutes=20) <= now < o.start_at for o in outages)


def gpu_uuid(cluster: str, node: str, index: int) -> str:
    """A stable, UUID-shaped GPU UUID for a simulated GPU."""
    return "GPU-" + str(uuid.uuid5(uuid.NAMESPACE_DNS, f"{cluster}.{node}.gpu{index}"))


def sim_inventory(sim: Simulation, *, at: datetime) -> list[GpuInventory]:
    return [
        GpuInventory(
            node=node.name,
            gpu_uuid=gpu_uuid(sim.cluster, node.name, i),
            index=i,
            model="NVIDIA H100 80GB HBM3",
            observed_at=at,
            memory_total_bytes=81559 * 2**20,
            minor_number=i,
            pci_bus_id=f"00000000:{0x18 + i:02X}:00.0",
            driver_version="550.90.07" if node.name != "gpu03" else "535.183.01",
            cuda_version="12.4",
            vbios_version="96.00.99.00.01",
            mig_mode="disabled",
            power_limit_watts=700.0,
        )
        for node in sim.nodes
        for i in range(node.gpus)
    ]


def sim_summaries(
    sim: Simulation, node: str, *, window_seconds: int = 30, seed: int = 11
) -> Iterator[GpuSummary]:
    """The node agent's window summaries for NODE over the whole simulation."""
    rng = random.Random(f"{seed}.{node}")
    spec = next(n for n in sim.nodes if n.name == node)
    down = [(o.start_at, o.end_at) for o in sim.outages if o.node == node]
    # (gpu index) -> list of (start, end, attempt, rank of the GPU within the attempt's GPUs)
    busy: dict[int, list[tuple[datetime, datetime, SimAttempt, int]]] = {i: [] for i in range(spec.gpus)}
    for attempt in sim.attempts:
        indices = attempt.placement.get(node)
        if not indices or attempt.job.start_at is None:
            continue
        rank_base = sum(len(v) for n, v in attempt.placement.items() if n < node)
        for rank, index in enumerate(indices):
            busy[index].append(
                (attempt.job.start_at, attempt.job.end_at or sim.end_at, attempt, rank_base + rank)
            )
    step = timedelta(seconds=window_seconds)
    for index in range(spec.gpus):
        uuid_ = gpu_uuid(sim.cluster, node, index)
        spans = sorted(busy[index], key=lambda s: s[0])
        # the spans of one GPU do not overlap: walk them with the windows, the first that has
        # not ended yet at `first` (as a search from the start would find, only cheaper)
        first = 0
        t = sim.start_at
        while t < sim.end_at:
            if any(lo <= t < hi for lo, hi in down):
                t += step  # the node is down: the agent reports nothing
                continue
            while first < len(spans) and spans[first][1] <= t:
                first += 1
            span = next((s for s in spans[first : first + 2] if s[0] <= t < s[1]), None)
            yield sim_window(rng, node, uuid_, t, span, window_seconds)
            t += step


def sim_window(
    rng: random.Random,
    node: str,
    gpu_uuid_: str,
    t: datetime,
    span: tuple[datetime, datetime, SimAttempt, int] | None,
    window_seconds: int,
) -> GpuSummary:
    """The agent's window at T of a GPU that SPAN (start, end, attempt, rank of the GPU within
    the attempt's) holds then, or None: idle."""
    util, no_process = 0.0, float(window_seconds)
    job_ids: tuple[str, ...] = ()
    if span is not None:
        start_at, _, attempt, rank = span
        if attempt.profile.startswith("planted-"):
            k = int((t - start_at).total_seconds() // window_seconds)
            planted = planted_window(attempt.profile.removeprefix("planted-"), k, attempt.job.job_id_raw)
            util = 0.0 if planted.idle else rng.uniform(60, 95)
            if not planted.no_process:
                job_ids, no_process = (str(attempt.job.job_id_raw),), 0.0
        elif (t - start_at).total_seconds() >= attempt.setup_seconds:
            util = _utilisation(rng, attempt.profile, rank, t)
            job_ids = (str(attempt.job.job_id_raw),)
            no_process = 0.0
    power = 70.0 + 6.2 * util
    return GpuSummary(
        source="agent", node=node, gpu_uuid=gpu_uuid_, window_start_at=t, window_seconds=float(window_seconds),
        util_metric="gr_engine_active", sample_count=window_seconds, covered_seconds=float(window_seconds),
        util_mean_percent=round(util, 1), util_max_percent=round(min(100.0, util * 1.15), 1),
        idle_seconds=float(window_seconds) if util < 5.0 else 0.0, no_process_seconds=no_process,
        memory_used_mean_bytes=int((2 + util * 0.6) * 2**30), memory_used_max_bytes=int((2 + util * 0.7) * 2**30),
        memory_total_bytes=81559 * 2**20, power_mean_watts=round(power, 1),
        energy_joules=round(power * window_seconds, 1), energy_method="counter",
        temperature_max_celsius=round(32 + util * 0.4, 1), sm_clock_max_mhz=1980.0, job_ids=job_ids,
    )  # fmt: skip


def _utilisation(rng: random.Random, profile: str, rank: int, t: datetime) -> float:
    if profile == "idle" or (profile == "one_gpu" and rank > 0):
        return 0.0
    if profile == "dataloader":
        # stalls on input every other minute
        return rng.uniform(35, 60) if (t.minute % 2 == 0) else rng.uniform(0, 3)
    return min(100.0, max(5.0, rng.gauss(86, 8)))


def sim_sacct_json(sim: Simulation, *, until: datetime, steps: bool = True) -> bytes:
    """What `sacct --json -a -D` prints for every attempt submitted before UNTIL, as of UNTIL:
    with each started attempt's steps (sim_steps), or without (STEPS false: `-X`)."""
    jobs = []
    for attempt in sim.attempts:
        job = attempt.job
        if job.submit_at >= until:
            continue
        if job.start_at is not None and job.start_at >= until:
            job = dataclasses.replace(job, state="PENDING", start_at=None, end_at=None, nodes=())
        elif job.end_at is None or job.end_at > until:
            job = dataclasses.replace(job, state="RUNNING", end_at=None)
        if steps and job.start_at is not None:
            job = dataclasses.replace(job, steps=sim_steps(dataclasses.replace(attempt, job=job)))
        jobs.append(job)
    jobs += [p.job for p in sim.pending_at_end if p.job.submit_at < until]
    return render_sacct_json(jobs, cluster=sim.cluster, with_steps=steps)


# CPU time / (CPUs x elapsed) of a job's main step, by how it uses its GPUs (a share between
# the two, the job's own): a job stalled on input has too few data-loader workers busy
_CPU_SHARE = {"busy": (0.55, 0.9), "one_gpu": (0.2, 0.4), "dataloader": (0.06, 0.2), "idle": (0.02, 0.08)}
# mem requested per CPU (MiB), as the simulated jobs ask for it (sbatch --mem-per-cpu=4G)
MEM_PER_CPU_MIB = 4096


def sim_steps(attempt: SimAttempt) -> tuple[SimStep, ...]:
    """The steps sacct shows for a started attempt: its batch script and one srun step, with
    usage drawn from the job's id (no random stream: the same every time it is printed), or
    none while they run. An OUT_OF_MEMORY job's peak is what it asked for."""
    job = attempt.job
    if job.start_at is None:
        return ()
    running = job.end_at is None
    elapsed = 0.0 if running else (job.end_at - job.start_at).total_seconds()  # type: ignore[operator]
    draw = zlib.crc32(f"{job.cluster}.{job.job_id_raw}.usage".encode()) / 2**32
    low, high = _CPU_SHARE.get(attempt.profile, (0.5, 0.9))
    requested = job.cpus * MEM_PER_CPU_MIB * 2**20
    peak_share = 1.0 if job.state == "OUT_OF_MEMORY" else 0.08 + 0.8 * ((draw * 7) % 1)
    tasks = max(1, len(job.nodes))
    total = int(requested * peak_share)
    batch = SimStep("batch", 1, elapsed * 0.02, 350 * 2**20, 350 * 2**20, running)
    name = "all_reduce_perf" if attempt.nccl_log else "python"
    main = SimStep(
        name, tasks, elapsed * job.cpus * (low + (high - low) * draw), total // tasks, total, running
    )
    return (batch, main)


_ACCOUNT_TREE_HEADER = (
    "Account|Descr|Org|Cluster|ParentName|User|Share|Priority|GrpJobs|GrpNodes|GrpCPUs|GrpMem|"
    "GrpSubmit|GrpWall|GrpCPUMins|MaxJobs|MaxNodes|MaxCPUs|MaxSubmit|MaxWall|MaxCPUMins|QOS|Def QOS"
)


def sim_account_tree(cluster: str) -> str:
    """`sacctmgr -P show account withassoc` for the simulated accounts (each under root, its
    users beneath it), in the columns of Slurm 22.05's (tests/fixtures/slurmctld/slurm-22.05)."""
    lines = [_ACCOUNT_TREE_HEADER]
    accounts = {**{a: list(u) for a, u in USERS.items()}, ACCEPTANCE_ACCOUNT: [ACCEPTANCE_USER]}
    for account, users in sorted(accounts.items()):
        row = f"{account}|{account}|demo|{cluster}|{{parent}}|{{user}}|1|||||||||||||||normal|"
        lines.append(row.format(parent="root", user=""))
        lines += [row.format(parent="", user=user) for user in users]
    return "\n".join(lines) + "\n"


def _slurm_time(at: datetime | None) -> str:
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S") if at else "Unknown"


def _uid(user: str) -> int:
    return 1000 + zlib.crc32(user.encode()) % 9000


def _ranges(indices: Sequence[int]) -> str:
    parts, run = [], [indices[0]]
    for i in indices[1:]:
        if i == run[-1] + 1:
            run.append(i)
        else:
            parts.append(run)
            run = [i]
    parts.append(run)
    return ",".join(str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in parts)


def _running_at(job: SimJob, at: datetime) -> bool:
    """Whether JOB runs at AT. A job still running when the simulation ends (end_at None) runs
    at its end too: sacct, the controller and the agents all see it there (demo issue 15)."""
    return job.start_at is not None and job.start_at <= at and (job.end_at is None or at < job.end_at)


def sim_scontrol_jobs(sim: Simulation, *, at: datetime) -> str:
    """`scontrol show job -d` (times in UTC) at AT: running jobs with their GRES indices, pending jobs."""
    blocks = []
    for attempt in sim.attempts:
        job = attempt.job
        if not _running_at(job, at):
            continue
        lines = [
            f"JobId={job.job_id_raw} JobName={job.name}",
            f"   UserId={job.user}({_uid(job.user)}) GroupId={job.user}(1000) MCS_label=N/A",
            f"   Priority=1 Nice=0 Account={job.account} QOS=normal",
            "   JobState=RUNNING Reason=None Dependency=(null)",
            f"   SubmitTime={_slurm_time(job.submit_at)} EligibleTime={_slurm_time(job.eligible_at)}",
            f"   StartTime={_slurm_time(job.start_at)} EndTime=Unknown Deadline=N/A",
            f"   Partition={job.partition} AllocNode:Sid=login1:1234",
            f"   NodeList={','.join(job.nodes)}",
            f"   NumNodes={len(job.nodes)} NumCPUs={job.cpus} NumTasks=1 CPUs/Task=1 ReqB:S:C:T=0:0:*:*",
            f"   TRES=cpu={job.cpus},mem={job.cpus * 4096}M,node={len(job.nodes)},billing={job.cpus},"
            f"gres/gpu={job.gpus},gres/gpu:{job.gpu_model}={job.gpus}",
            f"   JOB_GRES=gpu:{job.gpu_model}:{job.gpus}",
        ]
        for node, indices in attempt.placement.items():
            lines.append(
                f"     Nodes={node} CPU_IDs=0-{len(indices) * 8 - 1} Mem={len(indices) * 32768} "
                f"GRES=gpu:{job.gpu_model}:{len(indices)}(IDX:{_ranges(indices)})"
            )
        lines.append(f"   TresPerNode=gres:gpu:{len(next(iter(attempt.placement.values())))}")
        blocks.append("\n".join(lines))
    for pending in sim.pending_at_end:
        job = pending.job
        if job.submit_at > at:
            continue
        blocks.append(
            "\n".join(
                [
                    f"JobId={job.job_id_raw} JobName={job.name}",
                    f"   UserId={job.user}({_uid(job.user)}) GroupId={job.user}(1000) MCS_label=N/A",
                    f"   Priority=1 Nice=0 Account={job.account} QOS=normal",
                    f"   JobState=PENDING Reason={pending.reason} Dependency=(null)",
                    f"   SubmitTime={_slurm_time(job.submit_at)} EligibleTime={_slurm_time(job.eligible_at)}",
                    "   StartTime=Unknown EndTime=Unknown Deadline=N/A",
                    f"   Partition={job.partition} AllocNode:Sid=login1:1234",
                    "   NodeList=",
                    f"   TRES=cpu={job.cpus},mem={job.cpus * 4096}M,node=1,billing={job.cpus},gres/gpu={job.gpus}",
                    f"   TresPerJob=gres:gpu:{job.gpus}",
                ]
            )
        )
    return "\n\n".join(blocks) + "\n" if blocks else "No jobs in the system\n"


def sim_scontrol_nodes(sim: Simulation, *, at: datetime) -> str:
    """`scontrol show node -d` at AT (states, GPU capacity and use, partitions, reasons)."""
    blocks = []
    for node in sim.nodes:
        used: list[int] = []
        for attempt in sim.attempts:
            job = attempt.job
            if _running_at(job, at):
                used += attempt.placement.get(node.name, ())
        outage = next((o for o in sim.outages if o.node == node.name and o.start_at <= at < o.end_at), None)
        draining = _draining(sim.outages, node.name, at)
        if outage:
            state = "DOWN+DRAIN"
        elif draining:
            state = ("MIXED" if used else "IDLE") + "+DRAIN"
        else:
            state = "ALLOCATED" if len(used) == node.gpus else "MIXED" if used else "IDLE"
        gres_used = f"gpu:{node.gpu_model}:{len(used)}(IDX:{_ranges(sorted(used)) if used else 'N/A'})"
        lines = [
            f"NodeName={node.name} Arch=x86_64 CoresPerSocket=32 ",
            f"   Gres=gpu:{node.gpu_model}:{node.gpus}",
            f"   GresUsed={gres_used}",
            f"   NodeAddr={node.name} NodeHostName={node.name} Version=24.11.5",
            f"   State={state} ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A",
            f"   Partitions={','.join(node.partitions)} ",
            f"   CfgTRES=cpu=64,mem=512000M,billing=64,gres/gpu={node.gpus},gres/gpu:{node.gpu_model}={node.gpus}",
        ]
        if outage or draining:
            reason = outage.reason if outage else "firmware update"
            lines.append(f"   Reason={reason} [root@{_slurm_time(at)}]")
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks) + "\n"


# ---------------------------------------------------------------- a simulated world on disk
#
# The demo leaves its cluster behind in its state directory: world.json (what to simulate),
# the clock file site.clock names (the world's "now"), and stand-in `sacct` / `scontrol`
# commands that print the world as of that instant. Each stand-in prints the capture
# captures/<kind>.* when captures/<kind>.at names the clock's instant, and otherwise has
# `python -m slurmtel.simulate --world world.json KIND` simulate the world up to the clock
# first: so `collect --once` and `run` (which move the clock on) see the cluster go on from
# where it stopped.

CAPTURE_KINDS = ("sacct", "scontrol")


@dataclass(frozen=True)
class World:
    """What world.json holds: the simulation's inputs, and where its clock and captures are."""

    start_at: datetime
    days: int
    seed: int
    cluster: str
    clock_file: str
    captures: str
    # the acceptance jobs' StdOut folder ("" = no acceptance jobs: a world.json from before them)
    acceptance: str = ""
    # the five jobs with known idle causes (False: a world.json from before them)
    planted: bool = False

    def to_json(self) -> bytes:
        data = dataclasses.asdict(self)
        data["start_at"] = self.start_at.isoformat()
        return orjson.dumps(data, option=orjson.OPT_INDENT_2)

    @classmethod
    def from_json(cls, raw: bytes) -> World:
        data = orjson.loads(raw)
        data["start_at"] = datetime.fromisoformat(data["start_at"])
        return cls(**data)

    def simulate(self, until: datetime) -> Simulation:
        return simulate_cluster(
            start=self.start_at, days=self.days, seed=self.seed, cluster=self.cluster, until=until,
            acceptance_dir=self.acceptance, planted=self.planted,
        )  # fmt: skip


def write_captures(
    sim: Simulation, captures: str, at: datetime, kinds: Sequence[str] = CAPTURE_KINDS
) -> None:
    """What the stand-ins print as of AT: captures/sacct.json, captures/scontrol-job.txt and
    captures/scontrol-node.txt, each kind's AT in captures/<kind>.at (written last). Only
    KINDS are simulated and written."""
    from pathlib import Path

    folder = Path(captures)
    stamp = at.isoformat()
    for kind in kinds:
        if kind == "sacct":
            files = [("sacct.json", sim_sacct_json(sim, until=at))]
            write_acceptance_logs(sim, at)
        else:
            files = [
                ("scontrol-job.txt", sim_scontrol_jobs(sim, at=at).encode()),
                ("scontrol-node.txt", sim_scontrol_nodes(sim, at=at).encode()),
            ]
        for name, content in [*files, (f"{kind}.at", stamp.encode() + b"\n")]:
            write_atomically(folder / name, content)


def write_acceptance_logs(sim: Simulation, at: datetime) -> None:
    """The StdOut of every acceptance attempt that ended by AT, as the job left it (once)."""
    from pathlib import Path

    for attempt in sim.attempts:
        job = attempt.job
        if not attempt.nccl_log or job.end_at is None or job.end_at > at:
            continue
        path = Path(job.stdout.replace("%x", job.name).replace("%j", str(job.job_id_raw)))
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            write_atomically(path, nccl_acceptance_log(attempt))


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m slurmtel.simulate --world WORLD KIND`: simulate WORLD up to its clock and
    write KIND's captures (the stand-ins call this when the clock has moved on)."""
    import argparse
    from pathlib import Path

    parser = argparse.ArgumentParser(prog="python -m slurmtel.simulate")
    parser.add_argument("--world", required=True, help="the world.json `slurmtel demo` wrote")
    parser.add_argument("kind", choices=CAPTURE_KINDS)
    args = parser.parse_args(argv)
    world = World.from_json(Path(args.world).read_bytes())
    at = read_clock_file(Path(world.clock_file))
    write_captures(world.simulate(until=at), world.captures, at, [args.kind])
    return 0


def sampled_windows(
    node: str, gpu_uuid_: str, start_at: datetime, count: int, *, seed: int = 7, window_seconds: int = 30
) -> Iterator[GpuSummary]:
    """COUNT windows of one GPU as the NVML agent summarises its 1 s samples: utilisation the mean
    of integer percents, power of milliwatt readings, memory in MiB pages, energy from the mJ
    counter, a job changing every few minutes and idle stretches between. Unrounded, so storage
    figures measured on them are not flattered by repeated values."""
    rng = random.Random(f"{seed}.{gpu_uuid_}")
    job = ""
    level = 0.0
    for i in range(count):
        if i % 8 == 0:  # a job may start or end every 4 minutes
            job = str(rng.randrange(1_000_000, 9_999_999)) if rng.random() < 0.8 else ""
            level = rng.uniform(20, 99) if job else 0.0
        utils = [max(0, min(100, round(rng.gauss(level, 8)))) if level else 0 for _ in range(window_seconds)]
        power_mw = [70_000 + 6_200 * u + rng.randrange(-900, 900) for u in utils]
        memory_mib = [2_048 + int(level * 700) + rng.randrange(0, 64) for _ in range(window_seconds)]
        busy = sum(1 for u in utils if u >= 5)
        mean_w = sum(power_mw) / len(power_mw) / 1000
        yield GpuSummary(
            source="agent", node=node, gpu_uuid=gpu_uuid_,
            window_start_at=start_at + timedelta(seconds=window_seconds * i), window_seconds=float(window_seconds),
            util_metric="gr_engine_active", sample_count=window_seconds, covered_seconds=float(window_seconds),
            util_mean_percent=sum(utils) / len(utils), util_max_percent=float(max(utils)),
            idle_seconds=float(window_seconds - busy), no_process_seconds=0.0 if job else float(window_seconds),
            memory_used_mean_bytes=sum(memory_mib) * 2**20 // len(memory_mib),
            memory_used_max_bytes=max(memory_mib) * 2**20, memory_total_bytes=81_559 * 2**20,
            power_mean_watts=mean_w, energy_joules=round(mean_w * window_seconds + rng.uniform(-0.5, 0.5), 3),
            energy_method="counter", temperature_max_celsius=float(35 + int(level * 0.45) + rng.randrange(0, 3)),
            sm_clock_max_mhz=1_980.0 if job else 345.0, job_ids=(job,) if job else (),
        )  # fmt: skip


# ---------------------------------------------------------------- jobs with known idle causes (issue 26)

# what each planted job is, and the cause of its idle windows with a process
PLANTED_CAUSES = {
    "loader": "cpu_bound",  # a data-loader-bound job: GPUs wait while its CPUs are saturated
    "stall": "storage_wait",  # a job stalled on storage: IO pressure while its GPUs wait
    "ckpt": "storage_wait",  # periodic checkpoints: write bursts while the GPUs dip
    "link": "network_wait",  # a two-node job on a slow link: fabric busy while its GPUs wait
    "empty": "no_process",  # a job that never started a process on its GPUs
}


# how long each planted job runs (windows of 30 s), the CPUs its cgroup holds per node, and
# whose it is in the demo's world (simulate_cluster(planted=True))
PLANTED_WINDOWS = 240
PLANTED_CPUS = 16
PLANTED_OWNERS = {
    "loader": ("ml", "ivan"),
    "stall": ("physics", "alice"),
    "link": ("physics", "dave"),
    "ckpt": ("ml", "judy"),
    "empty": ("biology", "carol"),
}
# the nodes each planted job holds, as indices into the cluster's nodes (loader, stall and link
# run first; ckpt and empty when loader's and stall's nodes are free again)
_PLANTED_NODES = {"loader": (0,), "stall": (1,), "link": (2, 3), "ckpt": (0,), "empty": (1,)}


def planted_runs(nodes: Sequence[SimNode], start: datetime) -> list[SimAcceptance]:
    """The planted jobs of a cluster of at least 4 nodes, queued at START on whole nodes."""
    return [
        SimAcceptance(start, start, tuple(nodes[i].name for i in where), "", planted=kind)
        for kind, where in _PLANTED_NODES.items()
    ]


@dataclass(frozen=True)
class PlantedWindow:
    """One window of a planted job (all its nodes): whether its GPUs idle and why, and its
    host signals: CPU and IO pressure as shares of the window, bytes read (all nodes) and
    written (per node) in it, each node's fabric port rate (bytes/s)."""

    idle: bool
    no_process: bool
    cause: str
    cpu_share: float
    io_share: float
    read_bytes: float
    write_bytes: float
    port_rate: float
    # the first window of a checkpoint episode
    episode: bool = False


def planted_window(kind: str, k: int, job_id: int, window_seconds: int = 30) -> PlantedWindow:
    """Window K of the planted job KIND (idle_cause_scenario says what each does), drawn from
    (JOB_ID, K) alone: the GPU windows, the cgroup windows and the ports agree on it."""
    rng = random.Random(f"planted.{job_id}.{k}")
    w = float(window_seconds)
    idle, no_process, cause, episode = False, False, "", False
    cpu_share, io_share, io_bytes, written, port_rate = (
        rng.uniform(0.2, 0.6), rng.uniform(0, 0.03), rng.uniform(0, 50e6) * w, 0.0, rng.uniform(0, 50e6),
    )  # fmt: skip
    if kind == "loader" and k % 3 == 2:
        idle, cause, cpu_share = True, "cpu_bound", rng.uniform(0.93, 1.0)
    elif kind == "stall" and (60 <= k < 80 or 150 <= k < 170):
        idle, cause, io_share = True, "storage_wait", rng.uniform(0.2, 0.7)
        cpu_share = rng.uniform(0.05, 0.3)
    elif kind == "ckpt" and k < 4:
        idle, cause, io_share, io_bytes = True, "storage_wait", rng.uniform(0.15, 0.4), 2.5e9
    elif kind == "ckpt" and k % 40 in (38, 39):
        idle, cause, io_share = True, "storage_wait", rng.uniform(0.15, 0.4)
        written, episode = rng.uniform(2e9, 4e9), k % 40 == 38
    elif kind == "link" and k % 4 == 3:
        idle, cause, port_rate = True, "network_wait", rng.uniform(2e9, 6e9)
        cpu_share = rng.uniform(0.05, 0.4)
    elif kind == "empty":
        idle, no_process, cause = True, True, "no_process"
    return PlantedWindow(idle, no_process, cause, cpu_share, io_share, io_bytes, written, port_rate, episode)


def planted_host_records(
    node: str, job_id: int, nodes: int, t: datetime, window: PlantedWindow, window_seconds: int = 30
) -> tuple[JobHostWindow, PortCounters]:
    """What the agent on NODE ships for a planted job's window at T: the job's cgroup window
    (the empty job's too: its batch script runs) and the node's fabric port."""
    w = float(window_seconds)
    host = JobHostWindow(
        node=node, job_id=str(job_id), window_start_at=t, window_seconds=w, cgroup_version=2,
        read_bytes=int(window.read_bytes / nodes), write_bytes=int(window.write_bytes),
        read_ops=int(window.read_bytes // 2**20), write_ops=int(window.write_bytes // 2**20),
        cpu_usage_seconds=round(window.cpu_share * PLANTED_CPUS * w, 3), cpus=PLANTED_CPUS,
        memory_peak_bytes=64 * 2**30, io_some_stall_seconds=round(window.io_share * w, 3),
        io_full_stall_seconds=round(window.io_share * w / 2, 3),
        cpu_some_stall_seconds=round(min(window.cpu_share, 0.3) * w * 0.5, 3),
    )  # fmt: skip
    words = int(window.port_rate * w / 4)  # port_*_data count 4-byte words
    port = PortCounters(
        node=node, device="mlx5_0", port=1, window_start_at=t, window_seconds=w, link_layer="InfiniBand",
        state="ACTIVE", rate_gbps=200.0, deltas={"port_xmit_data": words // 2, "port_rcv_data": words - words // 2},
    )  # fmt: skip
    return host, port


def sim_host_records(
    sim: Simulation, node: str, *, window_seconds: int = 30
) -> Iterator[JobHostWindow | PortCounters]:
    """The agent's job cgroup windows and fabric port counters on NODE for the planted jobs
    (the simulation's other jobs have no host signals: their idle time is `unmeasured`)."""
    for attempt in sim.attempts:
        job = attempt.job
        if (
            not attempt.profile.startswith("planted-")
            or node not in attempt.placement
            or job.start_at is None
        ):
            continue
        end = min(job.end_at or sim.end_at, sim.end_at)
        windows = int((end - job.start_at).total_seconds() // window_seconds)
        kind = attempt.profile.removeprefix("planted-")
        for k in range(windows):
            t = job.start_at + timedelta(seconds=window_seconds * k)
            window = planted_window(kind, k, job.job_id_raw, window_seconds)
            yield from planted_host_records(node, job.job_id_raw, len(job.nodes), t, window, window_seconds)


@dataclass(frozen=True)
class PlantedTruth:
    """What a planted job's report must show: idle GPU-seconds per cause, checkpoint episodes
    and start-up seconds (None: its GPUs never became active)."""

    causes: dict[str, float]
    episodes: int
    startup_seconds: float | None


def planted_truth(attempt: SimAttempt, *, window_seconds: int = 30) -> PlantedTruth:
    job, kind = attempt.job, attempt.profile.removeprefix("planted-")
    assert job.start_at is not None and job.end_at is not None, "a planted job that ended"
    windows = int((job.end_at - job.start_at).total_seconds() // window_seconds)
    causes: dict[str, float] = {}
    episodes = 0
    for k in range(windows):
        window = planted_window(kind, k, job.job_id_raw, window_seconds)
        if window.idle:
            causes[window.cause] = causes.get(window.cause, 0.0) + job.gpus * window_seconds
        episodes += window.episode
    startup = 4.0 * window_seconds if kind == "ckpt" else (None if kind == "empty" else 0.0)
    return PlantedTruth(causes, episodes, startup)


@dataclass(frozen=True)
class CauseScenario:
    """Jobs with known idle causes, as the agent and sacct would report them."""

    jobs: tuple[SimJob, ...]
    inventory: tuple[GpuInventory, ...]
    summaries: tuple[GpuSummary, ...]
    job_hosts: tuple[JobHostWindow, ...]
    ports: tuple[PortCounters, ...]
    # job id -> cause -> idle GPU-seconds planted
    planted: dict[str, dict[str, float]]
    # job id -> checkpoint episodes planted, and start-up seconds (None: the GPUs never worked)
    checkpoints: dict[str, int]
    startup_seconds: dict[str, float | None]


def idle_cause_scenario(
    start: datetime, *, windows: int = 240, seed: int = 26, cluster: str = "sim", window_seconds: int = 30
) -> CauseScenario:
    """Five jobs of WINDOWS windows each (2 hours by default) from START (a multiple of the
    window), 4 GPUs per node, whose idle windows have one planted cause each, with noise in
    every signal that stays on its side of the default thresholds ([idle_causes]):

    - loader: GPUs idle every third window while its 16 CPUs run at 93-100 %;
    - stall: GPUs idle in two stretches of 20 windows with IO pressure 20-70 % of the window;
    - ckpt: restores for 4 windows (reads 10 GB, GPUs idle), then every 40 windows writes 2-4 GB
      a window for 2 windows while its GPUs dip (checkpoint episodes), IO pressure 15-40 %;
    - link: two nodes, GPUs idle every fourth window while each node's ports move 2-6 GB/s;
    - empty: no process on its GPUs at all.
    Outside the planted windows the GPUs run at 60-95 %, CPUs at 20-60 %, IO pressure under 3 %,
    ports under 50 MB/s."""
    rng = random.Random(seed)
    w = float(window_seconds)
    step = timedelta(seconds=window_seconds)
    end = start + step * windows
    layout = {
        "loader": ("sim-h01",),
        "stall": ("sim-h02",),
        "ckpt": ("sim-h03",),
        "link": ("sim-h04", "sim-h05"),
        "empty": ("sim-h06",),
    }
    jobs, inventory, summaries, hosts, ports = [], [], [], [], []
    planted: dict[str, dict[str, float]] = {}
    checkpoints: dict[str, int] = {}
    startup: dict[str, float | None] = {}
    for number, (kind, nodes) in enumerate(layout.items()):
        job_id = 9000 + number
        jobs.append(
            SimJob(
                job_id_raw=job_id, user=f"user{number}", account="ml" if number % 2 else "vision",
                partition="gpu", name=f"planted-{kind}", state="COMPLETED", submit_at=start - step,
                eligible_at=start - step, start_at=start, end_at=end, gpus=4 * len(nodes), nodes=nodes,
                cpus=16 * len(nodes), cluster=cluster,
            )
        )  # fmt: skip
        totals: dict[str, float] = {}
        episodes = 0
        for node in nodes:
            for i in range(4):
                inventory.append(
                    GpuInventory(
                        node=node, gpu_uuid=gpu_uuid(cluster, node, i), index=i, model="NVIDIA H100 80GB HBM3",
                        observed_at=start - step, memory_total_bytes=81559 * 2**20, minor_number=i,
                        mig_mode="disabled",
                    )
                )  # fmt: skip
        for k in range(windows):
            t = start + step * k
            window = planted_window(kind, k, job_id, window_seconds)
            idle, cause = window.idle, window.cause
            episodes += window.episode
            for node in nodes:
                for i in range(4):
                    util = 0.0 if idle else rng.uniform(60, 95)
                    summaries.append(
                        GpuSummary(
                            source="agent", node=node, gpu_uuid=gpu_uuid(cluster, node, i), window_start_at=t,
                            window_seconds=w, util_metric="gr_engine_active", sample_count=window_seconds,
                            covered_seconds=w, util_mean_percent=round(util, 2),
                            util_max_percent=round(min(100.0, util * 1.1), 2), idle_seconds=w if idle else 0.0,
                            no_process_seconds=w if window.no_process else 0.0, memory_used_max_bytes=40 * 2**30,
                            memory_total_bytes=81559 * 2**20, power_mean_watts=round(70 + 6 * util, 1),
                            energy_joules=round((70 + 6 * util) * w, 1), energy_method="counter",
                            job_ids=() if window.no_process else (str(job_id),),
                        )
                    )  # fmt: skip
                    if idle:
                        totals[cause] = totals.get(cause, 0.0) + w
                host, port = planted_host_records(node, job_id, len(nodes), t, window, window_seconds)
                hosts.append(host)
                ports.append(port)
        planted[str(job_id)] = totals
        checkpoints[str(job_id)] = episodes
        startup[str(job_id)] = 4 * w if kind == "ckpt" else (None if kind == "empty" else 0.0)
    return CauseScenario(
        tuple(jobs),
        tuple(inventory),
        tuple(summaries),
        tuple(hosts),
        tuple(ports),
        planted,
        checkpoints,
        startup,
    )


if __name__ == "__main__":
    raise SystemExit(main())
