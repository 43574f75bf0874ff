"""`slurmtel report idle-now` (`/v1/reports/idle_now`): the running jobs holding GPUs that are
idle right now, which GPUs, and since when — the first question of the admin overview, and a
researcher's own running jobs.

Computed from the GPUs' windows themselves (slurmtel.store.actions.gpu_stretches_now, the
re-check the actions run before a cancel), not from the actions' folded state, so it answers
whether or not [actions] runs. A GPU is idle now when its newest window is at most
actions.telemetry_max_age_seconds old and the trailing run of idle windows (utilisation below
the idle threshold, memory at most actions.idle_memory_max_bytes) is not empty; it has been
idle since that run began, or since the job started, whichever is later, looking back at most
LOOKBACK_SECONDS.

Access: VIEW_JOBS, like `slurmtel job` (a user their own jobs, coordinators their accounts',
admins every job; finance none).
"""

from __future__ import annotations

import argparse
from datetime import timedelta
from typing import Any

from slurmtel.access import Action
from slurmtel.commands.common import add_format_argument, split_list
from slurmtel.commands.views import Connect, Document, View, ViewRequest, document, run_cli, scope_of, section
from slurmtel.config import Config
from slurmtel.filters import JobFilter
from slurmtel.reports.render import gpu_name, local_time

# how far back a GPU's idle run is looked for (a longer one is shown from then: at least this long)
LOOKBACK_SECONDS = 7 * 86400
COLUMNS = (
    "cluster",
    "job_id",
    "name",
    "user",
    "account",
    "partition",
    "start_at",
    "gpus",
    "idle_gpus_now",
    "idle_gpu_names",
    "idle_since_at",
    "idle_for_seconds",
)
KEY_COLUMNS = ("job_id", "user", "idle_gpus_now", "gpus", "idle_for_seconds")


def register(commands: argparse._SubParsersAction, reports: argparse._SubParsersAction) -> None:
    idle_now: argparse.ArgumentParser = reports.add_parser(
        "idle-now", help="running jobs whose GPUs are idle right now: which GPUs, since when"
    )
    idle_now.add_argument("-A", "--accounts", default=None, help="comma-separated accounts")
    idle_now.add_argument("-u", "--users", default=None, help="comma-separated users")
    idle_now.add_argument("-r", "--partition", default=None, help="comma-separated partitions")
    idle_now.add_argument("-M", "--clusters", default=None, help="comma-separated clusters")
    add_format_argument(idle_now)
    idle_now.set_defaults(handler=cmd_report_idle_now, through_api=True)


def cmd_report_idle_now(args: argparse.Namespace, config: Config) -> int:
    wanted = JobFilter(
        accounts=split_list(args.accounts),
        users=split_list(args.users),
        partitions=split_list(args.partition),
        clusters=split_list(args.clusters),
    )
    return run_cli(VIEW, config, {"job_filter": wanted}, args.format)


def idle_now_document(config: Config, request: ViewRequest, connect: Connect) -> Document:
    from slurmtel.store.actions import gpu_stretches_now
    from slurmtel.store.jobview import running_gpus_in_scope

    scope = scope_of(request.identity, Action.VIEW_JOBS)
    now, wanted = request.now, request.job_filter
    fresh_after = now - timedelta(seconds=config.actions.telemetry_max_age_seconds)

    def kept(g: dict[str, Any]) -> bool:
        return all(
            not values or g[column] in values
            for column, values in (
                ("account", wanted.accounts),
                ("user_name", wanted.users),
                ("partition", wanted.partitions),
                ("cluster", wanted.clusters),
            )
        )

    with connect(scope) as conn:
        gpus = [
            g
            for g in running_gpus_in_scope(conn, scope=scope, now=now, running_states=config.outcomes.running)
            if kept(g)
        ]
        stretches = (
            gpu_stretches_now(
                conn,
                sorted({g["gpu_uuid"] for g in gpus}),
                start=max(min(g["start_at"] for g in gpus), now - timedelta(seconds=LOOKBACK_SECONDS)),
                end=now,
                idle_memory_max_bytes=config.actions.idle_memory_max_bytes,
            )
            if gpus
            else {}
        )
    jobs: dict[tuple[str, str], dict[str, Any]] = {}
    for g in gpus:
        job = jobs.setdefault(
            (g["cluster"], g["job_id"]),
            {
                "cluster": g["cluster"],
                "job_id": g["job_id"],
                "name": g["name"],
                "user": g["user_name"],
                "account": g["account"],
                "partition": g["partition"],
                "start_at": g["start_at"],
                "gpus": int(g["alloc_gpus"]),
                "idle": [],
            },
        )
        st = stretches.get(g["gpu_uuid"])
        if st is None or st["last_window_end_at"] is None or st["idle_since_at"] is None:
            continue
        last, since = st["last_window_end_at"], max(st["idle_since_at"], g["start_at"])
        if last <= fresh_after or since >= last:
            continue
        job["idle"].append((gpu_name(g["node"], g["gpu_index"], g["gpu_uuid"]), since, last))
    rows = []
    for job in jobs.values():
        idle = job.pop("idle")
        if not idle:
            continue
        since = min(s for _, s, _ in idle)
        rows.append(
            {
                **job,
                "idle_gpus_now": len(idle),
                "idle_gpu_names": [name for name, _, _ in idle],
                "idle_since_at": since,
                "idle_for_seconds": round((max(last for _, _, last in idle) - since).total_seconds(), 3),
            }
        )
    rows.sort(key=lambda r: (-r["idle_gpus_now"] * r["idle_for_seconds"], r["cluster"], r["job_id"]))
    table = section(
        "idle_now",
        f"Running jobs with GPUs idle now ({local_time(now, config.zone)})",
        rows,
        COLUMNS,
        key_columns=KEY_COLUMNS,
    )
    return document("idle_now", [table], now=now, single=True)


VIEW = View(
    name="idle_now",
    help="running jobs whose GPUs are idle right now: which GPUs, since when",
    action=Action.VIEW_JOBS,
    build=idle_now_document,
    sections=(("idle_now", COLUMNS),),
    window=False,
    filters=("accounts", "users", "partitions", "clusters"),
)
