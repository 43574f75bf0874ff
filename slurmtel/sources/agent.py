"""The agent source: pull window summaries, events, inventory, fabric counters (InfiniBand/RoCE
ports, NVLinks) and GPU topology from each node's slurmtel-agent.

Per node: GET /v1/summaries?after=CURSOR, store the page and the new cursor in one
transaction, then POST /v1/ack so the agent can trim its spool. A crash between storing and
acking only makes the next pull ask again after the stored cursor; the agent keeps what was
not acked, so nothing is lost while the head or PostgreSQL is down, and the natural keys keep
a replayed page from being stored twice. A new spool_id (the agent's spool was recreated)
resets the cursor. The head names the record kinds it stores (protocol.ALL_KINDS), so an agent
never sends one it cannot read, and an older agent simply sends the original three.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import TYPE_CHECKING

from slurmtel.config import AgentSourceConfig, Config
from slurmtel.errors import ConfigError, SourceUnavailable
from slurmtel.sources.base import RunContext, RunResult
from slurmtel.sources.io import http_request
from slurmtel.sources.targets import Target, add_target_argument, for_each_target, targets_for

if TYPE_CHECKING:
    from sqlalchemy import Connection

    from slurmtel.agent.protocol import SummariesPage
    from slurmtel.store.telemetry import PartitionBudget

NAME = "agent"
# pages per node and run: bounds one run when an agent has a long backlog (the rest comes next run)
MAX_PAGES_PER_RUN = 50


class AgentSource:
    name = NAME
    description = (
        "per-GPU window summaries, XID/ECC events, inventory, fabric counters and topology pulled "
        "from slurmtel-agent"
    )

    def enabled(self, config: Config) -> bool:
        return config.sources.agent.enabled

    def interval_seconds(self, config: Config) -> int:
        return config.sources.agent.interval_seconds

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        add_target_argument(parser, "pull")

    def collect(self, ctx: RunContext, options: argparse.Namespace) -> RunResult:
        from slurmtel.store.telemetry import PartitionBudget

        cfg = ctx.config.sources.agent
        targets = targets_for(cfg, "sources.agent", options)
        shared = _shared_token(cfg)
        result = RunResult()
        budget = PartitionBudget(ctx.config.telemetry.max_new_partitions_per_run)
        # an unreachable agent keeps its spool: the next run pulls it
        for_each_target(
            targets,
            lambda target, part: pull_agent(
                ctx, target, _auth_headers(cfg, target.node, shared), part, budget
            ),
            result,
            "agent",
            concurrency=cfg.concurrency,
        )
        return result

    def ingest(self, ctx: RunContext, path: Path, options: argparse.Namespace) -> RunResult:
        """Store a saved /v1/summaries response (no cursor is moved, nothing is acked)."""
        from slurmtel.agent.protocol import decode_summaries_response
        from slurmtel.store.telemetry import PartitionBudget

        try:
            raw = path.read_bytes()
        except OSError as exc:
            raise SourceUnavailable(f"cannot read {path}: {exc.strerror}") from exc
        result = RunResult()
        page = decode_summaries_response(raw, origin=str(path))
        budget = PartitionBudget(ctx.config.telemetry.max_new_partitions_per_run)
        with ctx.engine.begin() as conn:
            _store_page(ctx, conn, page, result, budget, origin=str(path))
        return result


def pull_agent(
    ctx: RunContext,
    target: Target,
    headers: dict[str, str],
    result: RunResult,
    budget: PartitionBudget | None = None,
) -> None:
    from slurmtel.agent.protocol import (
        ACK_PATH,
        decode_ack_response,
        decode_summaries_response,
        encode_ack_request,
        summaries_query,
    )
    from slurmtel.store.telemetry import get_agent_cursor, set_agent_cursor

    cfg = ctx.config.sources.agent
    with ctx.engine.connect() as conn:
        stored = get_agent_cursor(conn, target.node)
    spool_id = stored.spool_id if stored else ""
    cursor = stored.cursor if stored else 0
    pages = 0
    while pages < MAX_PAGES_PER_RUN:
        url = target.base_url + summaries_query(cursor, cfg.page_size)
        origin = f"agent {target.node}"
        page = decode_summaries_response(
            http_request(url, timeout_seconds=cfg.timeout_seconds, headers=headers), origin=origin
        )
        if page.spool_id != spool_id:
            if spool_id and cursor:
                result.notes.append(
                    f"{target.node}: the agent's spool was recreated; reading it from the start"
                )
                cursor = 0
                spool_id = page.spool_id
                continue
            spool_id = page.spool_id
        with ctx.engine.begin() as conn:
            # what cannot be stored of the page is quarantined in this transaction: the page
            # is stored and acked all the same, and the agent trims it
            _store_page(ctx, conn, page, result, budget, origin=origin)
            set_agent_cursor(
                conn,
                target.node,
                spool_id=spool_id,
                cursor=page.next_cursor,
                evicted_total=page.evicted_total,
                spool_items=page.spool_items,
                spool_bytes=page.spool_bytes,
            )
        pages += 1
        # ack every time, even an empty page: an ack lost after the last store is repeated here
        if page.next_cursor > 0:
            ack = http_request(
                target.base_url + ACK_PATH,
                timeout_seconds=cfg.timeout_seconds,
                data=encode_ack_request(page.next_cursor),
                headers={**headers, "Content-Type": "application/json"},
            )
            decode_ack_response(ack, origin=origin)
        # (a page of skipped kinds only has no items and still moves the cursor)
        if page.next_cursor <= cursor:
            break
        cursor = page.next_cursor
    if pages == MAX_PAGES_PER_RUN:
        result.notes.append(f"{target.node}: backlog left for the next run")


def _store_page(
    ctx: RunContext,
    conn: Connection,
    page: SummariesPage,
    result: RunResult,
    budget: PartitionBudget | None,
    *,
    origin: str,
) -> None:
    from slurmtel.sources.plausible import screen_telemetry
    from slurmtel.store.checks import rejections
    from slurmtel.store.fabric import write_nvlink_counters, write_port_counters, write_topology
    from slurmtel.store.quarantine import quarantine
    from slurmtel.store.samples import sample_store
    from slurmtel.store.telemetry import (
        resolve_allocation_uuids,
        write_events,
        write_inventory,
    )

    # a node whose clock is wrong: its windows and events are kept out, the rest of the page in
    screened = screen_telemetry(
        now=ctx.clock(),
        telemetry=ctx.config.telemetry,
        source=NAME,
        origin=origin,
        summaries=page.summaries,
        events=page.events,
        inventory=page.inventory,
    )
    summaries, events, inventory = screened.summaries, screened.events, screened.inventory
    rejected = [*page.rejected, *screened.rejected]
    write_inventory(conn, inventory, source=NAME)
    stats = sample_store().write(conn, summaries, source=NAME, node=page.node, partition_budget=budget)
    events_written = write_events(conn, events)
    if inventory:
        resolve_allocation_uuids(conn, node=page.node)
    ports = write_port_counters(conn, page.port_counters)
    nvlinks = write_nvlink_counters(conn, page.nvlink_counters)
    topologies = write_topology(conn, page.topologies)
    rejected += rejections(stats.refused, source=NAME, origin=origin)
    quarantine(conn, rejected)
    result.rows_read += len(page.items) + len(page.rejected)
    result.rows_written += stats.inserted + events_written + len(inventory) + ports + nvlinks + topologies
    result.rows_quarantined += len(rejected)
    if page.items or page.rejected:
        fabric = (
            f", {len(page.port_counters)} port windows, {len(page.nvlink_counters)} NVLink windows, "
            f"{topologies} topology"
            if ports or nvlinks or topologies or page.port_counters or page.nvlink_counters
            else ""
        )
        result.notes.append(
            f"{page.node}: {len(summaries)} windows ({stats.inserted} new), {len(events)} events, "
            f"{len(inventory)} inventory{fabric}; spool {page.spool_items} items, {page.evicted_total} evicted"
        )


def _shared_token(cfg: AgentSourceConfig) -> str:
    """sources.agent.token_file's token ("" when none is configured); read once per run."""
    if not cfg.token_file:
        return ""
    try:
        return Path(cfg.token_file).read_text().strip()
    except OSError as exc:
        raise ConfigError(f"sources.agent.token_file: cannot read {cfg.token_file}: {exc.strerror}") from exc


def _auth_headers(cfg: AgentSourceConfig, node: str, shared: str) -> dict[str, str]:
    """NODE's token: <token_dir>/<node> when there is one, else the shared token. An agent
    serves nothing without one, so a node with neither fails (alone) with the reason."""
    if cfg.token_dir and _NODE_FILE_NAME.fullmatch(node):
        path = Path(cfg.token_dir) / node
        try:
            token = path.read_text().strip()
        except FileNotFoundError:
            token = ""
        except OSError as exc:
            raise SourceUnavailable(f"cannot read its token {path}: {exc.strerror}") from exc
        if token:
            return {"Authorization": f"Bearer {token}"}
    if shared:
        return {"Authorization": f"Bearer {shared}"}
    raise SourceUnavailable(f"no token for it (sources.agent.token_dir/{node} or sources.agent.token_file)")


# a node name that can be a file name in token_dir (never "..", never a path)
_NODE_FILE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")
