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
import threading
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from queue import SimpleQueue
from typing import TYPE_CHECKING, Any

from slurmtel.agent.token import read_token_file
from slurmtel.config import AgentSourceConfig, Config
from slurmtel.errors import ConfigError, ParseError, SlurmtelError, SourceUnavailable
from slurmtel.gcpause import gc_paused
from slurmtel.sources.base import RunContext, RunResult
from slurmtel.sources.io import http_request
from slurmtel.sources.targets import Target, add_target_argument, add_up, targets_for
from slurmtel.threads import signals_held, start_thread

if TYPE_CHECKING:
    from datetime import datetime

    from sqlalchemy import Connection

    from slurmtel.agent.protocol import SummariesPage
    from slurmtel.sources.plausible import Screened
    from slurmtel.store.telemetry import PartitionBudget

NAME = "agent"
# pages per node and run: bounds one run when an agent has a long backlog (the rest comes next run)
MAX_PAGES_PER_RUN = 50
# items (windows mostly) of several nodes' pages stored in one transaction, one COPY: each
# transaction costs its statements' round trips, each a wait for the GIL on a busy head
# (10,000 against 5,000: 0.57 against 0.52 x COPY at 10,000 GPUs, docs/scale.md)
STORE_GROUP_ITEMS = 10_000
# transactions storing groups at once, and groups fetched and waiting for theirs, at most
STORE_WRITERS = 2
STORE_QUEUE = 3


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
        pull_agents(ctx, targets, lambda target: _auth_headers(cfg, target.node, shared), result, budget)
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
            _store_pages(ctx, conn, [(page, str(path), _screen(ctx, page, str(path)))], [result], budget)
        return result


@dataclass
class _Pull:
    """One node's pull in a run: where it stands, and what it did."""

    target: Target
    headers: dict[str, str] = field(default_factory=dict)
    spool_id: str = ""
    cursor: int = 0
    pages: int = 0
    # fetched and not stored yet, or stored and not acked yet
    page: SummariesPage | None = None
    screened: Screened | None = None
    stored: bool = False
    done: bool = False
    result: RunResult = field(default_factory=RunResult)
    failure: str | None = None

    @property
    def origin(self) -> str:
        return f"agent {self.target.node}"

    @property
    def items(self) -> int:
        return _served(self.page) if self.page else 0


def pull_agents(
    ctx: RunContext,
    targets: Sequence[Target],
    headers: Callable[[Target], dict[str, str]],
    result: RunResult,
    budget: PartitionBudget | None = None,
) -> None:
    """Pull every target's agent, `concurrency` HTTP requests at a time, and add up the nodes'
    results in RESULT in target order (a node that fails is noted, alone; SourceUnavailable
    when none answered).

    Per node, as ever: GET a page after its cursor, store the page and the new cursor in one
    transaction, then POST the ack, and again while its spool has more. But the pages fetched
    meanwhile from several nodes are stored together (up to STORE_GROUP_ITEMS items a
    transaction: one COPY of their windows, one ingest batch per node, every cursor of the
    group), so storing costs a few round trips per group rather than two dozen per node. A
    node is acked only after the transaction holding its page and cursor has committed.
    """
    # the collector off for the whole pull, not only while each page is decoded and written:
    # the pages, records and rows of a pull are acyclic and die with their group, and between
    # those pauses every collection rescanned what the pull held (a fifth of its CPU at 10,000
    # GPUs, measured). What a pull leaves cyclic waits for the collection after it.
    with gc_paused():
        _pull_agents(ctx, targets, headers, result, budget)


def _pull_agents(
    ctx: RunContext,
    targets: Sequence[Target],
    headers: Callable[[Target], dict[str, str]],
    result: RunResult,
    budget: PartitionBudget | None,
) -> None:
    from slurmtel.store.telemetry import get_agent_cursors

    pulls = [_Pull(target) for target in targets]
    for pull in pulls:
        try:
            pull.headers = headers(pull.target)
        except SlurmtelError as exc:
            pull.failure = f"{pull.target.node}: {exc}"
    live = [pull for pull in pulls if pull.failure is None]
    if live:
        with ctx.engine.connect() as conn:
            stored = get_agent_cursors(conn, [pull.target.node for pull in live])
        for pull in live:
            if (cursor := stored.get(pull.target.node)) is not None:
                pull.spool_id, pull.cursor = cursor.spool_id, cursor.cursor
    workers = max(1, min(ctx.config.sources.agent.concurrency, len(live)))
    # the HTTP workers take nodes from TODO and put back what they did, the writers' futures
    # come back the same way: the loop takes one at a time. At the 60 s pull each node is two
    # short HTTP steps, and an executor's future per step, with a wait on the set of running
    # ones (a lock of each per wake), cost a sixth of a pull's CPU (measured)
    todo: SimpleQueue[_Pull | None] = SimpleQueue()
    finished: SimpleQueue[tuple[_Pull, BaseException | None] | Future[list[_Pull]]] = SimpleQueue()
    threads = [
        threading.Thread(
            target=_http_worker, args=(ctx, todo, finished), name=f"slurmtel-agent-{k}", daemon=True
        )
        for k in range(workers)
    ]
    for thread in threads:
        start_thread(thread)
    try:
        # while a group's transaction waits for PostgreSQL, another is prepared, and the HTTP
        # workers fetch, decode and screen the next pages
        with ThreadPoolExecutor(
            max_workers=STORE_WRITERS, thread_name_prefix="slurmtel-agent-store"
        ) as writer:
            waiting = deque(live)  # their next step: ack what was stored (if any), fetch the next page
            fetching = 0  # nodes the HTTP workers have
            storing = 0  # groups the writers have
            ready: deque[_Pull] = deque()  # fetched, to store
            ready_items = 0
            while waiting or fetching or storing or ready:
                # (fetched pages wait in memory for at most STORE_QUEUE groups)
                while waiting and fetching < workers and storing < STORE_QUEUE:
                    todo.put(waiting.popleft())
                    fetching += 1
                while ready and (ready_items >= STORE_GROUP_ITEMS or not (waiting or fetching)):
                    group = [ready.popleft()]
                    size = group[0].items
                    while ready and size + ready[0].items <= STORE_GROUP_ITEMS:
                        size += ready[0].items
                        group.append(ready.popleft())
                    ready_items -= size
                    with signals_held():  # (the writers' threads start in submit)
                        group_stored = writer.submit(_store_group, ctx, group, budget)
                    group_stored.add_done_callback(finished.put)
                    storing += 1
                if not (fetching or storing):
                    continue
                # (all that finished meanwhile, at one wake)
                finished_now = [finished.get()]
                while not finished.empty():
                    finished_now.append(finished.get())
                for done in finished_now:
                    # a node's own failure is in its _Pull; anything else ends the run, as it would
                    if isinstance(done, tuple):
                        fetching -= 1
                        pull, error = done
                        if error is not None:
                            raise error
                        if pull.page is not None:
                            ready.append(pull)
                            ready_items += pull.items
                    else:
                        storing -= 1
                        waiting.extend(pull for pull in done.result() if pull.failure is None)
    finally:
        for _ in threads:
            todo.put(None)
        for thread in threads:
            thread.join()
    add_up([(pull.result, pull.failure) for pull in pulls], result, "agent")


def _http_worker(
    ctx: RunContext,
    todo: SimpleQueue[_Pull | None],
    finished: SimpleQueue[tuple[_Pull, BaseException | None] | Future[list[_Pull]]],
) -> None:
    """Take the next node from TODO, take its next HTTP step, put it in FINISHED (with what
    it raised beyond its own failure, for the run to raise); until a None."""
    while (pull := todo.get()) is not None:
        try:
            finished.put((_step(ctx, pull), None))
        except BaseException as exc:  # ends the run, raised by its loop
            finished.put((pull, exc))


def _step(ctx: RunContext, pull: _Pull) -> _Pull:
    """A node's next HTTP step: ack the page stored (and stop if it was the last), then fetch
    the next page. A failure ends the node's pull, with its reason."""
    try:
        if pull.stored:
            assert pull.page is not None
            _ack(ctx, pull, pull.page)
            if not _advance(pull, pull.page, ctx.config.sources.agent.page_size):
                pull.page, pull.done = None, True
                return pull
        pull.page, pull.stored = _fetch(ctx, pull), False
        # screened here, by the HTTP worker: the writers' threads only write
        pull.screened = _screen(ctx, pull.page, pull.origin)
    except SlurmtelError as exc:
        pull.page, pull.failure = None, f"{pull.target.node}: {exc}"
    return pull


def _fetch(ctx: RunContext, pull: _Pull) -> SummariesPage:
    from slurmtel.agent.protocol import decode_summaries_response, salvage_envelope, summaries_query

    cfg = ctx.config.sources.agent
    while True:
        url = pull.target.base_url + summaries_query(pull.cursor, cfg.page_size)
        raw = http_request(url, timeout_seconds=cfg.timeout_seconds, headers=pull.headers)
        try:
            page = decode_summaries_response(raw, origin=pull.origin)
        except ParseError as exc:
            # a page this head cannot use (out-of-order items, a damaged envelope): refused
            # on every pull it would block the node for ever; quarantined and acked instead.
            # A page cut short is the transfer's fault: the node fails this run, and the page
            # is asked for again in the next
            envelope = salvage_envelope(raw)
            if envelope is None:
                raise
            return _unusable_page(ctx, pull, raw, str(exc), envelope)
        if page.spool_id != pull.spool_id:
            if pull.spool_id and pull.cursor:
                pull.result.notes.append(
                    f"{pull.target.node}: the agent's spool was recreated; reading it from the start"
                )
                pull.cursor = 0
                pull.spool_id = page.spool_id
                continue
            pull.spool_id = page.spool_id
        return page


def _unusable_page(
    ctx: RunContext, pull: _Pull, raw: bytes, reason: str, envelope: dict[str, Any]
) -> SummariesPage:
    """A page of no items that quarantines RAW with REASON and moves the node past it: its
    cursor is what the agent acks when asked for the page's own next_cursor (or, when even that
    cannot be read, for everything: the agent clamps an ack to the last cursor it served, which
    is this page's)."""
    from slurmtel.agent.protocol import (
        ACK_PATH,
        MAX_CURSOR,
        SummariesPage,
        decode_ack_response,
        encode_ack_request,
    )
    from slurmtel.records import Rejected

    cfg = ctx.config.sources.agent
    wanted = envelope.get("next_cursor")
    wanted = wanted if isinstance(wanted, int) and pull.cursor < wanted <= MAX_CURSOR else MAX_CURSOR
    ack = decode_ack_response(
        http_request(
            pull.target.base_url + ACK_PATH,
            timeout_seconds=cfg.timeout_seconds,
            data=encode_ack_request(wanted),
            headers={**pull.headers, "Content-Type": "application/json"},
        ),
        origin=pull.origin,
    )
    spool_id = envelope.get("spool_id")
    evicted = envelope.get("evicted_total")
    pull.result.notes.append(
        f"{pull.target.node}: a page it served could not be used ({reason}); quarantined, and the "
        f"node acked to cursor {ack.acked_cursor}"
    )
    return SummariesPage(
        node=pull.target.node,
        agent_version="",
        items=(),
        next_cursor=ack.acked_cursor,
        evicted_total=evicted if isinstance(evicted, int) and 0 <= evicted <= MAX_CURSOR else 0,
        spool_items=ack.spool_items,
        spool_bytes=ack.spool_bytes,
        spool_id=spool_id if isinstance(spool_id, str) and spool_id else pull.spool_id,
        rejected=(
            Rejected(
                source=NAME,
                origin=pull.origin,
                record_key=f"page after cursor {pull.cursor}",
                reason=f"page not used: {reason}",
                raw=raw[:65536].decode("utf-8", "replace"),
            ),
        ),
    )


def _ack(ctx: RunContext, pull: _Pull, page: SummariesPage) -> None:
    from slurmtel.agent.protocol import ACK_PATH, decode_ack_response, encode_ack_request

    cfg = ctx.config.sources.agent
    # ack every time, even an empty page: an ack lost after the last store is repeated here
    if page.next_cursor > 0:
        ack = http_request(
            pull.target.base_url + ACK_PATH,
            timeout_seconds=cfg.timeout_seconds,
            data=encode_ack_request(page.next_cursor),
            headers={**pull.headers, "Content-Type": "application/json"},
        )
        decode_ack_response(ack, origin=pull.origin)


def _advance(pull: _Pull, page: SummariesPage, page_size: int) -> bool:
    """Move PULL past PAGE (stored and acked); whether to fetch another page."""
    pull.pages += 1
    # (a page of skipped kinds only has no items and still moves the cursor)
    if page.next_cursor <= pull.cursor:
        return False
    pull.cursor = page.next_cursor
    # a page short of the limit that holds all the spool had (its count is taken before the
    # page is read) left nothing behind: no request for an empty page
    if _served(page) < page_size and _holds_whole_spool(page):
        return False
    if pull.pages >= MAX_PAGES_PER_RUN:
        pull.result.notes.append(f"{pull.target.node}: backlog left for the next run")
        return False
    return True


def _served(page: SummariesPage) -> int:
    """The items PAGE served: those decoded and those refused."""
    return len(page.items) + len(page.rejected)


def _holds_whole_spool(page: SummariesPage) -> bool:
    # (the spool's count is taken before the page is read)
    return page.spool_items <= _served(page)


def _spool_left(page: SummariesPage) -> tuple[int, int]:
    """The agent's spool (items, bytes) once PAGE is acked, as far as the page tells: empty
    after a page that held all of it (no request for an empty page follows to say so), else
    what the agent reported with the page."""
    if _holds_whole_spool(page):
        return 0, 0
    return page.spool_items, page.spool_bytes


def _store_group(ctx: RunContext, group: list[_Pull], budget: PartitionBudget | None) -> list[_Pull]:
    """Store the fetched pages of GROUP and their nodes' cursors in one transaction. Should
    that fail, each page is stored in a transaction of its own, so that one node's page costs
    the others nothing; a node whose page cannot be stored fails alone."""
    from sqlalchemy.exc import SQLAlchemyError

    from slurmtel.store.telemetry import AgentCursorUpdate, set_agent_cursors

    parts = [RunResult() for _ in group]
    pages = [pull.page for pull in group if pull.page is not None]
    screened = [pull.screened for pull in group if pull.screened is not None]
    assert len(pages) == len(screened) == len(group)
    try:
        with ctx.engine.begin() as conn:
            # what cannot be stored of a page is quarantined in this transaction: the page is
            # stored and acked all the same, and the agent trims it
            _store_pages(
                ctx,
                conn,
                [(page, pull.origin, s) for pull, page, s in zip(group, pages, screened, strict=True)],
                parts,
                budget,
            )
            set_agent_cursors(
                conn,
                [
                    AgentCursorUpdate(
                        node=pull.target.node,
                        spool_id=pull.spool_id,
                        cursor=page.next_cursor,
                        evicted_total=page.evicted_total,
                        spool_items=left[0],
                        spool_bytes=left[1],
                    )
                    for pull, page in zip(group, pages, strict=True)
                    for left in [_spool_left(page)]
                ],
            )
    except (SQLAlchemyError, SlurmtelError) as exc:
        if len(group) > 1:
            for pull in group:
                _store_group(ctx, [pull], budget)
            return group
        if not isinstance(exc, SlurmtelError):
            raise
        group[0].page, group[0].failure = None, f"{group[0].target.node}: {exc}"
        return group
    for pull, part in zip(group, parts, strict=True):
        pull.result.rows_read += part.rows_read
        pull.result.rows_written += part.rows_written
        pull.result.rows_quarantined += part.rows_quarantined
        pull.result.notes.extend(part.notes)
        pull.stored = True
    return group


def _screen(ctx: RunContext, page: SummariesPage, origin: str) -> Screened:
    from slurmtel.sources.plausible import screen_telemetry

    # a node whose clock is wrong: its windows and events are kept out, the rest of the page in
    return screen_telemetry(
        now=ctx.clock(),
        telemetry=ctx.config.telemetry,
        source=NAME,
        origin=origin,
        summaries=page.summaries,
        events=page.events,
        inventory=page.inventory,
    )


def _store_pages(
    ctx: RunContext,
    conn: Connection,
    pages: Sequence[tuple[SummariesPage, str, Screened]],
    results: Sequence[RunResult],
    budget: PartitionBudget | None,
) -> None:
    """Store PAGES (each with its origin, and what screening kept of it) in the caller's
    transaction, each page's counts and note in its RESULTS; no SQL for what a page does not
    hold."""
    from slurmtel.store.checks import rejections
    from slurmtel.store.fabric import write_nvlink_counters, write_port_counters, write_topology
    from slurmtel.store.hostside import (
        write_gpu_host_windows,
        write_job_host_windows,
        write_node_fs_windows,
    )
    from slurmtel.store.quarantine import quarantine
    from slurmtel.store.samples import sample_store
    from slurmtel.store.telemetry import resolve_allocation_uuids, write_events, write_inventory

    screened = [s for _, _, s in pages]
    # inventory (each node's first page, or after a change) of all pages by one statement
    if any(s.inventory for s in screened):
        write_inventory(conn, [g for s in screened for g in s.inventory], source=NAME)
        resolve_allocation_uuids(conn, nodes=sorted({page.node for page, _, s in pages if s.inventory}))
    all_stats = sample_store().write_groups(
        conn, [(page.node, s.summaries) for (page, _, _), s in zip(pages, screened, strict=True)], source=NAME,
        partition_budget=budget,
    )  # fmt: skip
    # the spans of the GPU windows just stored, per batch: host windows inside one record no host
    # batch (that batch marks their attempts already); asked only when a page has host windows
    spans: dict[int, tuple[datetime, datetime]] = {}
    if any(page.job_host_windows or page.gpu_host_windows or page.node_fs_windows for page, _, _ in pages):
        from slurmtel.store.telemetry import batch_spans

        ids = [st.batch_id for st in all_stats if st.batch_id is not None]
        spans = {b: (lo, hi) for b, _, lo, hi in batch_spans(conn, ids)} if ids else {}
    for (page, origin, s), stats, result in zip(pages, all_stats, results, strict=True):
        summaries, events, inventory = s.summaries, s.events, s.inventory
        rejected = [*page.rejected, *s.rejected]
        events_written = write_events(conn, events)
        ports = write_port_counters(conn, page.port_counters)
        nvlinks = write_nvlink_counters(conn, page.nvlink_counters)
        topologies = write_topology(conn, page.topologies)
        span = spans.get(stats.batch_id) if stats.batch_id is not None else None
        covered = {page.node: span} if span is not None else None
        hosts = (
            write_job_host_windows(conn, page.job_host_windows, covered=covered)
            + write_gpu_host_windows(conn, page.gpu_host_windows, covered=covered)
            + write_node_fs_windows(conn, page.node_fs_windows, covered=covered)
        )
        rejected += rejections(stats.refused, source=NAME, origin=origin)
        quarantine(conn, rejected)
        result.rows_read += _served(page)
        result.rows_written += (
            stats.inserted + events_written + len(inventory) + ports + nvlinks + topologies + hosts
        )
        result.rows_quarantined += len(rejected)
        if page.items or page.rejected:
            fabric = (
                f", {len(page.port_counters)} port windows, {len(page.nvlink_counters)} NVLink windows, "
                f"{topologies} topology"
                if ports or nvlinks or topologies or page.port_counters or page.nvlink_counters
                else ""
            )
            if page.job_host_windows or page.gpu_host_windows:
                fabric += f", {len(page.job_host_windows)} job host windows, {len(page.gpu_host_windows)} GPU host windows"
            if page.node_fs_windows:
                fabric += f", {len(page.node_fs_windows)} NFS mount windows"
            result.notes.append(
                f"{page.node}: {len(summaries)} windows ({stats.inserted} new), {len(events)} events, "
                f"{len(inventory)} inventory{fabric}; spool {page.spool_items} items, {page.evicted_total} evicted"
            )


def _shared_token(cfg: AgentSourceConfig) -> str:
    """sources.agent.token_file's token ("" when none is configured); read once per run."""
    if not cfg.token_file:
        return ""
    try:
        return read_token_file(Path(cfg.token_file), "sources.agent.token_file", private=False)
    except FileNotFoundError as exc:
        raise ConfigError(f"sources.agent.token_file: cannot read {cfg.token_file}: {exc.strerror}") from exc


def _auth_headers(cfg: AgentSourceConfig, node: str, shared: str) -> dict[str, str]:
    """NODE's token: <token_dir>/<node> when there is one, else the shared token. An agent
    serves nothing without one, so a node with neither fails (alone) with the reason."""
    if cfg.token_dir and _NODE_FILE_NAME.fullmatch(node):
        path = Path(cfg.token_dir) / node
        try:
            return {"Authorization": f"Bearer {read_token_file(path, 'its token', private=False)}"}
        except FileNotFoundError:
            pass
        except ConfigError as exc:
            raise SourceUnavailable(str(exc)) from None
    if shared:
        return {"Authorization": f"Bearer {shared}"}
    raise SourceUnavailable(f"no token for it (sources.agent.token_dir/{node} or sources.agent.token_file)")


# a node name that can be a file name in token_dir (never "..", never a path)
_NODE_FILE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")
