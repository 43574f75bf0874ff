"""Synthetic Slurm data in the real formats, for benchmarks, scale tests and the demo.

Generated data goes through the real parsers: `render_sacct_json` writes the `sacct --json`
envelope of Slurm 24.11 (data_parser v0.0.42), starting each job from a real job object
captured from slurmrestd (slurmtel/data/sacct-v0.0.42-job-completed.json) and changing only
the values.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from importlib import resources
from typing import Any

import orjson

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
        for step in job["steps"]:
            step["step"]["id"] = f"{sim.job_id_raw}.batch"
            step["nodes"]["range"] = job["nodes"]
    return job


def render_sacct_json(jobs: Iterable[SimJob], *, cluster: str = "sim", with_steps: bool = False) -> bytes:
    """The `sacct --json` output (Slurm 24.11, data_parser v0.0.42) for JOBS.

    Without steps by default: slurmtel runs `sacct -X` (allocations only), whose JSON carries
    empty step lists; WITH_STEPS keeps the template's batch step, as plain `sacct --json` does.
    """
    document, template = _template(with_steps)
    document = dict(document)
    document["jobs"] = [_job_object(template, job) for job in jobs]
    document["meta"]["slurm"]["cluster"] = cluster
    return orjson.dumps(document)


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
