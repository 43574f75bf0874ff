"""The slurmctld source: what only the controller knows, captured while it is there.

Each cycle records, for running jobs, which GPUs each job holds on each node (Slurm's index,
translated to the GPU's UUID through the node's inventory; sacct never stores indices and the
controller forgets them when a job ends), the GPU capacity and state of every node, and the
pending jobs with their reasons.
"""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from slurmtel.config import Config
from slurmtel.errors import ConfigError, SourceUnavailable
from slurmtel.records import GpuAllocation, NodeState, PendingJob, Rejected, SchemaNotice
from slurmtel.sources.base import RunContext, RunResult
from slurmtel.sources.io import run_command
from slurmtel.timeparse import parse_slurm_time

if TYPE_CHECKING:
    pass

NAME = "slurmctld"

log = logging.getLogger(__name__)


class SlurmctldSource:
    name = NAME
    description = "GPUs held by running jobs, node GPU capacity and state, pending jobs (squeue/scontrol)"

    def enabled(self, config: Config) -> bool:
        return config.sources.slurmctld.enabled

    def interval_seconds(self, config: Config) -> int:
        return config.sources.slurmctld.interval_seconds

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--nodes-input",
            type=Path,
            default=None,
            metavar="FILE",
            help="with --input (a saved `squeue --json` or `scontrol show job -d`): "
            "a saved `scontrol show node -d` of the same moment",
        )
        parser.add_argument(
            "--at",
            dest="input_at",
            default=None,
            help="with --input: when the capture was taken (sacct time forms; default now)",
        )
        parser.add_argument(
            "--cluster",
            dest="input_cluster",
            default=None,
            help="with --input: the cluster (default site.cluster)",
        )

    def check_options(self, options: argparse.Namespace, config: Config) -> None:
        if options.input is not None and not (options.input_cluster or config.site.cluster):
            raise ConfigError("--cluster is needed (or site.cluster in the config)")

    def collect(self, ctx: RunContext, options: argparse.Namespace) -> RunResult:
        from slurmtel.parsers.scontrol_config import cluster_name
        from slurmtel.parsers.slurmctld import (
            SQUEUE_JSON_UNAVAILABLE,
            parse_scontrol_jobs,
            parse_scontrol_nodes,
            parse_squeue_json,
            squeue_json_unavailable,
        )

        cfg = ctx.config.sources.slurmctld
        env = dict(os.environ, TZ="UTC")  # scontrol prints local times: make them UTC
        cluster = ctx.config.site.cluster or cluster_name(
            run_command(
                [cfg.scontrol_command, "show", "config"], timeout_seconds=cfg.timeout_seconds, env=env
            ).decode("utf-8", "replace")
        )
        at = ctx.clock()
        if cfg.job_view == "squeue_json":
            try:
                raw_jobs = run_command(
                    [cfg.squeue_command, "-a", "--json"], timeout_seconds=cfg.timeout_seconds, env=env
                )
            except SourceUnavailable as exc:
                if squeue_json_unavailable(str(exc)):
                    raise SourceUnavailable(f"{SQUEUE_JSON_UNAVAILABLE}: {exc}") from exc
                raise
            jobs = parse_squeue_json(raw_jobs, cluster=cluster, at=at)
        else:
            raw_jobs = run_command(
                [cfg.scontrol_command, "show", "job", "-d"], timeout_seconds=cfg.timeout_seconds, env=env
            )
            jobs = parse_scontrol_jobs(
                raw_jobs.decode("utf-8", "replace"), cluster=cluster, at=at, timezone=UTC
            )
        raw_nodes = run_command(
            [cfg.scontrol_command, "show", "node", "-d"], timeout_seconds=cfg.timeout_seconds, env=env
        )
        nodes = parse_scontrol_nodes(raw_nodes.decode("utf-8", "replace"), cluster=cluster, at=at)
        return store_controller_view(ctx, [*jobs, *nodes], cluster=cluster, at=at)

    def ingest(self, ctx: RunContext, path: Path, options: argparse.Namespace) -> RunResult:
        from slurmtel.parsers.slurmctld import parse_scontrol_jobs, parse_scontrol_nodes, parse_squeue_json

        now = ctx.clock()
        try:
            at = (
                parse_slurm_time(options.input_at, now=now, zone=ctx.config.zone) if options.input_at else now
            )
        except ValueError as exc:
            raise ConfigError(f"--at: {exc}") from exc
        cluster = options.input_cluster or ctx.config.site.cluster
        if not cluster:
            raise ConfigError("--cluster is needed (or site.cluster in the config)")
        text = _read(path)
        zone = ctx.config.zone
        if text.lstrip().startswith("{"):
            records: list[ControllerRecord] = [
                *parse_squeue_json(text, cluster=cluster, at=at, origin=str(path))
            ]
        else:
            records = [*parse_scontrol_jobs(text, cluster=cluster, at=at, timezone=zone, origin=str(path))]
        if options.nodes_input is not None:
            records += parse_scontrol_nodes(
                _read(options.nodes_input), cluster=cluster, at=at, origin=str(options.nodes_input)
            )
        return store_controller_view(ctx, records, cluster=cluster, at=at)


ControllerRecord = GpuAllocation | PendingJob | NodeState | Rejected | SchemaNotice


def store_controller_view(
    ctx: RunContext, records: Sequence[ControllerRecord], *, cluster: str, at: datetime
) -> RunResult:
    """Write one controller snapshot in one transaction; what cannot be stored is quarantined.
    A document in a schema newer than slurmtel knows (a SchemaNotice) is logged and counted."""
    from slurmtel.store.checks import ALLOCATION_COLUMNS, NODE_STATE_COLUMNS, PENDING_COLUMNS, split_storable
    from slurmtel.store.quarantine import quarantine
    from slurmtel.store.telemetry import (
        resolve_allocation_uuids,
        write_allocations,
        write_node_states,
        write_pending,
    )

    origin = f"controller snapshot of {cluster}"
    notices = [r for r in records if isinstance(r, SchemaNotice)]
    for notice in notices:
        log.warning(
            "%s: slurmctld JSON schema '%s' is not one this slurmtel knows; read as %s",
            notice.origin,
            notice.schema,
            notice.read_as,
        )
    allocations, refused = split_storable(
        [r for r in records if isinstance(r, GpuAllocation)], ALLOCATION_COLUMNS, source=NAME, origin=origin
    )
    pending, refused_pending = split_storable(
        [r for r in records if isinstance(r, PendingJob)], PENDING_COLUMNS, source=NAME, origin=origin
    )
    nodes, refused_nodes = split_storable(
        [r for r in records if isinstance(r, NodeState)], NODE_STATE_COLUMNS, source=NAME, origin=origin
    )
    rejected = [r for r in records if isinstance(r, Rejected)] + refused + refused_pending + refused_nodes
    with ctx.engine.begin() as conn:
        write_allocations(conn, allocations)
        resolve_allocation_uuids(conn)
        write_node_states(conn, nodes)
        write_pending(conn, pending, cluster=cluster, observed_at=at)
        quarantine(conn, rejected)
    result = RunResult(
        rows_read=len(records) - len(notices),
        rows_written=len(allocations) + len(pending) + len(nodes),
        rows_quarantined=len(rejected),
    )
    jobs = len({(a.job_id_raw, a.submit_at) for a in allocations})
    result.notes.append(
        f"{cluster}: {len(allocations)} GPUs held by {jobs} running jobs, {len(pending)} pending jobs, "
        f"{len(nodes)} nodes; {len(rejected)} quarantined"
    )
    for notice in notices:
        result.unknown_schemas.append(notice.schema)
        result.notes.append(
            f"warning: {notice.origin} is in schema '{notice.schema}', which this slurmtel does not "
            f"know: read as {notice.read_as}, the newest it knows"
        )
    return result


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise SourceUnavailable(f"cannot read {path}: {exc.strerror}") from exc
