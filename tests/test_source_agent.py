"""The head pulling real node agents over HTTP (the agent's own server and spool, on 127.0.0.1)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import Engine, text

from slurmtel.agent.metrics import AgentMetrics
from slurmtel.agent.server import AgentHttpServer
from slurmtel.agent.spool import Spool
from slurmtel.config import config_from_dict
from slurmtel.errors import SourceUnavailable
from slurmtel.records import GpuEvent
from slurmtel.sources import default_options, get_source
from slurmtel.sources.base import RunContext
from slurmtel.sources.runner import RunOutcome, run_recorded
from slurmtel.store.telemetry import existing_partitions
from tests.factories import T0, inventory, windows

TOKEN = "shared-agent-token-0123"


class RunningAgent:
    def __init__(self, spool_path: Path, node: str = "gpu01", token: str = TOKEN) -> None:
        self.spool = Spool(spool_path)
        self.server = AgentHttpServer(self.spool, AgentMetrics(), node, "0.1.0", "127.0.0.1", 0, token=token)
        self.server.start()
        self.port = self.server.address[1]

    def close(self) -> None:
        self.server.stop()
        self.spool.close()


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[RunningAgent]:
    running = RunningAgent(tmp_path / "spool.sqlite")
    yield running
    running.close()


@pytest.fixture(autouse=True)
def token_file(tmp_path: Path) -> Path:
    """The head's copy of the agents' shared token (sources.agent.token_file)."""
    path = tmp_path / "agent-token"
    path.write_text(TOKEN + "\n")
    path.chmod(0o600)
    global TOKEN_FILE
    TOKEN_FILE = str(path)
    return path


TOKEN_FILE = ""


def pull(ctx: RunContext, *targets: str, **agent_config: object) -> RunOutcome:
    """One run of the agent source; with the shared token unless AGENT_CONFIG names one."""
    agent_config = {"token_file": TOKEN_FILE, **agent_config}
    config = config_from_dict({"sources": {"agent": {"targets": list(targets), **agent_config}}})
    c = replace(ctx, config=config)
    source = get_source("agent")
    return run_recorded(c, "agent", "once", lambda: source.collect(c, default_options(source)))


def count(engine: Engine, sql: str) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text(sql)).scalar_one())


def backlog(agent: RunningAgent, minutes: int = 10) -> int:
    """What an agent spools while the head is away: inventory, 2 GPUs' windows, one XID."""
    records = [*inventory("gpu01", ["GPU-0", "GPU-1"])]
    records += windows("GPU-0", T0, minutes * 2, busy={1, 2}, job="17") + windows("GPU-1", T0, minutes * 2)
    records.append(
        GpuEvent("gpu01", "GPU-1", T0 + timedelta(minutes=3), "xid", 79, "GPU has fallen off the bus")
    )
    agent.spool.append_records(records)
    return len(records)


def test_a_backlog_is_pulled_in_pages_stored_once_and_acked(ctx: RunContext, agent: RunningAgent) -> None:
    total = backlog(agent, minutes=10)
    outcome = pull(ctx, f"gpu01=127.0.0.1:{agent.port}", page_size=7)
    assert outcome.status == "ok", outcome.message
    assert count(ctx.engine, "SELECT count(*) FROM gpu_summary WHERE source = 'agent'") == 40
    assert count(ctx.engine, "SELECT count(*) FROM gpu_event") == 1
    assert count(ctx.engine, "SELECT count(*) FROM gpu_inventory") == 2
    with ctx.engine.connect() as conn:
        cursor = conn.execute(
            text("SELECT cursor, spool_items, spool_bytes FROM agent_cursor WHERE node = 'gpu01'")
        ).one()
    assert cursor.cursor == total
    # the last page held the rest of the spool, so no empty page was asked for: the backlog the
    # head shows (slurmtel_agent_spool_items) is what the ack left, none, not the page's count
    assert (cursor.spool_items, cursor.spool_bytes) == (0, 0)
    # everything acked: the agent's spool is empty
    assert agent.spool.stats().items == 0
    # a second pull finds nothing and stores nothing
    assert pull(ctx, f"gpu01=127.0.0.1:{agent.port}").result.rows_written == 0


def test_a_lost_ack_is_repeated_and_nothing_is_stored_twice(
    ctx: RunContext, agent: RunningAgent, monkeypatch: pytest.MonkeyPatch
) -> None:
    backlog(agent, minutes=2)
    import slurmtel.sources.agent as agent_source

    real_request = agent_source.http_request

    def ack_fails(url: str, **kw: object) -> bytes:
        if url.endswith("/v1/ack"):
            raise SourceUnavailable(f"{url}: connection reset")
        return real_request(url, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(agent_source, "http_request", ack_fails)
    failed = pull(ctx, f"gpu01=127.0.0.1:{agent.port}")
    assert failed.status == "error"  # the only agent failed: nothing acked
    stored = count(ctx.engine, "SELECT count(*) FROM gpu_summary")
    assert stored == 8 and agent.spool.stats().items > 0
    monkeypatch.setattr(agent_source, "http_request", real_request)
    again = pull(ctx, f"gpu01=127.0.0.1:{agent.port}")
    assert again.status == "ok"
    assert count(ctx.engine, "SELECT count(*) FROM gpu_summary") == stored
    assert agent.spool.stats().items == 0


def test_a_recreated_spool_resets_the_cursor(ctx: RunContext, tmp_path: Path) -> None:
    first = RunningAgent(tmp_path / "a.sqlite")
    backlog(first, minutes=1)
    assert pull(ctx, f"gpu01=127.0.0.1:{first.port}").status == "ok"
    first.close()
    # the node was reinstalled: a new spool whose sequence numbers start at 1 again
    second = RunningAgent(tmp_path / "b.sqlite")
    try:
        second.spool.append_records(windows("GPU-0", T0 + timedelta(hours=1), 2))
        outcome = pull(ctx, f"gpu01=127.0.0.1:{second.port}")
        assert outcome.status == "ok"
        assert any("spool was recreated" in n for n in outcome.result.notes)
        assert count(ctx.engine, "SELECT count(*) FROM gpu_summary") == 4 + 2
    finally:
        second.close()


def test_token_and_an_unreachable_agent(ctx: RunContext, tmp_path: Path) -> None:
    secured = RunningAgent(tmp_path / "s.sqlite", token="s3cret-of-gpu01-only")
    try:
        backlog(secured, minutes=1)
        refused = pull(ctx, f"gpu01=127.0.0.1:{secured.port}")
        assert refused.status == "error" and "401" in refused.message
        none = pull(ctx, f"gpu01=127.0.0.1:{secured.port}", token_file="")
        assert none.status == "error" and "no token for it" in none.message
        token = tmp_path / "token"
        token.write_text("s3cret-of-gpu01-only\n")
        outcome = pull(ctx, f"gpu01=127.0.0.1:{secured.port}", "gpu09=127.0.0.1:1", token_file=str(token))
        # the reachable agent was pulled; the dead one made the run partial
        assert outcome.status == "partial" and "gpu09" in outcome.message
        assert count(ctx.engine, "SELECT count(*) FROM gpu_summary") == 4
    finally:
        secured.close()


def test_per_node_tokens_from_token_dir(ctx: RunContext, tmp_path: Path) -> None:
    """Each agent made its own token (<state_dir>/agent-token); the head holds a copy of each
    in sources.agent.token_dir, named after the node; a node without one uses token_file."""
    own = [
        RunningAgent(tmp_path / f"{n}.sqlite", node=f"gpu0{n}", token=f"own-token-of-gpu0{n}-xyz")
        for n in (1, 2)
    ]
    shared = RunningAgent(tmp_path / "3.sqlite", node="gpu03")
    tokens = tmp_path / "agent-tokens"
    tokens.mkdir()
    for n in (1, 2):
        (tokens / f"gpu0{n}").write_text(f"own-token-of-gpu0{n}-xyz\n")
    try:
        for agent in (*own, shared):
            backlog(agent, minutes=1)
        targets = [f"{a.server.node}=127.0.0.1:{a.port}" for a in (*own, shared)]
        outcome = pull(ctx, *targets, token_dir=str(tokens))
        assert outcome.status == "ok", outcome.message
        # each agent's page was stored and acked: every spool is empty
        assert all(a.spool.stats().items == 0 for a in (*own, shared))
        # one node's token wrong: that node alone fails
        (tokens / "gpu02").write_text("stale-token-of-gpu02-xyz\n")
        backlog(own[0], minutes=1)
        backlog(own[1], minutes=1)
        partial = pull(ctx, *targets[:2], token_dir=str(tokens))
        assert partial.status == "partial" and "gpu02" in partial.message and "401" in partial.message
        assert own[0].spool.stats().items == 0 and own[1].spool.stats().items > 0
    finally:
        for agent in (*own, shared):
            agent.close()


def test_agents_are_pulled_several_at_once_each_stored_once(ctx: RunContext, tmp_path: Path) -> None:
    """Six agents, three pulled at a time, their windows on a day with no partition yet (so
    the writers race to create it), and one dead target: everything stored once, the run's
    counts are the sum of the nodes', the dead node makes it partial."""
    new_day = T0 + timedelta(days=40)
    # the head's clock on that day: windows dated after it would be clock skew
    ctx = replace(ctx, clock=lambda: new_day + timedelta(hours=1))
    agents = [RunningAgent(tmp_path / f"{n}.sqlite", node=f"gpu{n:02d}") for n in range(1, 7)]
    try:
        for n, running in enumerate(agents, start=1):
            node = f"gpu{n:02d}"
            running.spool.append_records(
                [
                    *inventory(node, [f"GPU-{node}-0", f"GPU-{node}-1"], seen=new_day),
                    *windows(f"GPU-{node}-0", new_day, 20, busy={3}, node=node),
                    *windows(f"GPU-{node}-1", new_day, 20, node=node),
                ]
            )
        targets = [f"gpu{n:02d}=127.0.0.1:{a.port}" for n, a in enumerate(agents, start=1)]
        outcome = pull(ctx, *targets, "gpu99=127.0.0.1:1", concurrency=3, page_size=9)
        assert outcome.status == "partial" and "gpu99" in outcome.message
        assert count(ctx.engine, "SELECT count(*) FROM gpu_summary") == 6 * 40
        assert count(ctx.engine, "SELECT count(DISTINCT node) FROM gpu_inventory") == 6
        assert outcome.result.rows_read == 6 * 42
        assert outcome.result.rows_written == 6 * 42
        # the notes of each node, in target order
        nodes_noted = [note.split(":")[0] for note in outcome.result.notes]
        assert nodes_noted == sorted(nodes_noted) and set(nodes_noted) == {f"gpu{n:02d}" for n in range(1, 7)}
        assert all(a.spool.stats().items == 0 for a in agents)
        again = pull(ctx, *targets, concurrency=3)
        assert again.status == "ok" and again.result.rows_written == 0
        assert count(ctx.engine, "SELECT count(*) FROM gpu_summary") == 6 * 40
    finally:
        for running in agents:
            running.close()


def test_a_window_from_a_wrong_clock_costs_nothing_else_of_its_page(
    ctx: RunContext, agent: RunningAgent
) -> None:
    """A node whose clock jumped ten years ahead for one window: that window is quarantined
    and gets no partition; the rest of the page is stored and acked (the agent trims it)."""
    good = windows("GPU-0", T0, 6)
    skewed = replace(good[3], window_start_at=T0 + timedelta(days=3650))
    agent.spool.append_records([*good[:3], skewed, *good[4:]])
    with ctx.engine.connect() as conn:
        days_before = set(existing_partitions(conn).values())
    outcome = pull(ctx, f"gpu01=127.0.0.1:{agent.port}")
    assert outcome.status == "partial" and "1 record(s) quarantined" in outcome.message
    assert count(ctx.engine, "SELECT count(*) FROM gpu_summary") == 5
    with ctx.engine.connect() as conn:
        (reason,) = conn.execute(text("SELECT reason FROM quarantine")).scalars()
        new_days = set(existing_partitions(conn).values()) - days_before
    assert reason.startswith("clock skew: its window starts at 2036-")
    assert all(day.year == T0.year for day in new_days)
    assert agent.spool.stats().items == 0


def test_pages_of_several_nodes_stored_together_a_bad_or_replayed_one_costs_the_others_nothing(
    ctx: RunContext, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three nodes' pages go to the store in one group: gpu01's page holds windows stored
    already (its cursor was lost after they were stored and not acked), gpu02's are new, and
    gpu03 serves a page that is not JSON. gpu03 fails alone with its reason; gpu01's repeats
    are not stored twice and gpu02's windows are all stored; both are acked."""
    import slurmtel.sources.agent as agent_source

    agents = [RunningAgent(tmp_path / f"{n}.sqlite", node=f"gpu0{n}") for n in (1, 2)]
    targets = [f"gpu0{n}=127.0.0.1:{a.port}" for n, a in zip((1, 2), agents, strict=True)]
    real_request = agent_source.http_request
    gpu01_ack = f"127.0.0.1:{agents[0].port}/v1/ack"

    def lost_ack(url: str, **kw: object) -> bytes:
        if url.endswith(gpu01_ack):
            raise SourceUnavailable(f"{url}: connection reset")
        return real_request(url, **kw)  # type: ignore[arg-type]

    def bad_gpu03(url: str, **kw: object) -> bytes:
        if "127.0.0.1:1/" in url:
            return b'{"node": "gpu03", "items": [{"seq": 1,'
        return real_request(url, **kw)  # type: ignore[arg-type]

    try:
        backlog(agents[0], minutes=2)
        monkeypatch.setattr(agent_source, "http_request", lost_ack)
        first = pull(ctx, targets[0])
        assert first.status == "error" and agents[0].spool.stats().items > 0
        stored = count(ctx.engine, "SELECT count(*) FROM gpu_summary")
        assert stored == 8
        with ctx.engine.begin() as conn:
            conn.execute(text("DELETE FROM agent_cursor WHERE node = 'gpu01'"))
        agents[1].spool.append_records(
            [*inventory("gpu02", ["GPU-2a"]), *windows("GPU-2a", T0, 6, node="gpu02")]
        )
        monkeypatch.setattr(agent_source, "http_request", bad_gpu03)
        outcome = pull(ctx, *targets, "gpu03=127.0.0.1:1", concurrency=3)
        assert outcome.status == "partial"
        assert outcome.result.errors == ["gpu03: agent gpu03: summaries response is not JSON (cut short)"]
        assert count(ctx.engine, "SELECT count(*) FROM gpu_summary") == stored + 6
        assert count(ctx.engine, "SELECT count(*) FROM gpu_summary WHERE node = 'gpu02'") == 6
        assert all(a.spool.stats().items == 0 for a in agents)
        with ctx.engine.connect() as conn:
            cursors = dict(conn.execute(text("SELECT node, cursor FROM agent_cursor")).all())
        assert cursors == {"gpu01": 11, "gpu02": 7}
        # each node's notes in target order, gpu01's page counted as read, none of it new
        assert [n.split(":")[0] for n in outcome.result.notes] == ["gpu01", "gpu02"]
        assert "8 windows (0 new)" in outcome.result.notes[0]
    finally:
        for running in agents:
            running.close()


def test_a_node_is_acked_only_after_its_page_and_cursor_are_committed(
    ctx: RunContext, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Several pages per node, several nodes per transaction: at every ack, the cursor it acks
    is already the node's stored cursor, as another connection sees it, and the page's windows
    are there; a second run stores nothing again."""
    import slurmtel.sources.agent as agent_source

    agents = [RunningAgent(tmp_path / f"{n}.sqlite", node=f"gpu0{n}") for n in range(1, 5)]
    ports = {a.port: a.server.node for a in agents}
    real_request = agent_source.http_request
    acks: list[tuple[str, int, int | None, int]] = []

    def checking_ack(url: str, **kw: object) -> bytes:
        if url.endswith("/v1/ack"):
            node = ports[int(url.split(":")[2].split("/")[0])]
            acked = int(json.loads(kw["data"])["cursor"])  # type: ignore[arg-type]
            with ctx.engine.connect() as conn:
                committed = conn.execute(
                    text("SELECT cursor FROM agent_cursor WHERE node = :n"), {"n": node}
                ).scalar()
                windows_in = conn.execute(
                    text("SELECT count(*) FROM gpu_summary WHERE node = :n"), {"n": node}
                ).scalar_one()
            acks.append((node, acked, committed, windows_in))
        return real_request(url, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(agent_source, "http_request", checking_ack)
    try:
        for running in agents:
            node = running.server.node
            running.spool.append_records(windows(f"GPU-{node}", T0, 12, node=node))
        targets = [f"{a.server.node}=127.0.0.1:{a.port}" for a in agents]
        outcome = pull(ctx, *targets, concurrency=2, page_size=5)
        assert outcome.status == "ok", outcome.message
        assert count(ctx.engine, "SELECT count(*) FROM gpu_summary") == 4 * 12
        assert all(a.spool.stats().items == 0 for a in agents)
        # pages of 5, 5 and 2 windows per node, each acked once it was committed
        for node in ports.values():
            mine = [(acked, committed, n) for who, acked, committed, n in acks if who == node]
            assert mine == [(5, 5, 5), (10, 10, 10), (12, 12, 12)]
        again = pull(ctx, *targets, concurrency=2, page_size=5)
        assert again.status == "ok" and again.result.rows_written == 0
        assert count(ctx.engine, "SELECT count(*) FROM gpu_summary") == 4 * 12
    finally:
        for running in agents:
            running.close()


def test_a_page_that_fails_its_group_is_stored_alone_and_fails_alone(
    ctx: RunContext, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Storing gpu02's page fails: the group's transaction is rolled back, each page is stored
    in a transaction of its own, gpu01's page is stored and acked, gpu02 fails with the reason
    and keeps its spool (nothing of it stored, no cursor)."""
    import slurmtel.store.telemetry as telemetry

    real_write_events = telemetry.write_events

    def failing_for_gpu02(conn: object, events: list[GpuEvent]) -> int:
        if any(e.node == "gpu02" for e in events):
            raise SourceUnavailable("its event cannot be written")
        return real_write_events(conn, events)  # type: ignore[arg-type]

    monkeypatch.setattr(telemetry, "write_events", failing_for_gpu02)
    agents = [RunningAgent(tmp_path / f"{n}.sqlite", node=f"gpu0{n}") for n in (1, 2)]
    try:
        backlog(agents[0], minutes=1)
        agents[1].spool.append_records(
            [
                *windows("GPU-2a", T0, 4, node="gpu02"),
                GpuEvent(
                    "gpu02", "GPU-2a", T0 + timedelta(minutes=1), "xid", 13, "graphics engine exception"
                ),
            ]
        )
        targets = [f"gpu0{n}=127.0.0.1:{a.port}" for n, a in zip((1, 2), agents, strict=True)]
        outcome = pull(ctx, *targets, concurrency=2)
        assert outcome.status == "partial"
        assert outcome.result.errors == ["gpu02: its event cannot be written"]
        assert count(ctx.engine, "SELECT count(*) FROM gpu_summary WHERE node = 'gpu01'") == 4
        assert count(ctx.engine, "SELECT count(*) FROM gpu_summary WHERE node = 'gpu02'") == 0
        assert count(ctx.engine, "SELECT count(*) FROM ingest_batch WHERE node = 'gpu02'") == 0
        assert count(ctx.engine, "SELECT count(*) FROM agent_cursor WHERE node = 'gpu02'") == 0
        assert agents[0].spool.stats().items == 0 and agents[1].spool.stats().items == 5
        assert outcome.result.rows_written == 4 + 1 + 2  # gpu01: windows, its event, inventory
    finally:
        for running in agents:
            running.close()


def test_the_collector_is_off_for_the_whole_pull_and_back_on_after_it(
    ctx: RunContext, agent: RunningAgent, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pull's pages and rows die with their group: the cyclic collector stays off while
    the source fetches, decodes and stores (it rescanned them between pages, a fifth of the
    pull's CPU), and is on again after the run, a run that fails included."""
    import gc

    import slurmtel.sources.agent as agent_source

    backlog(agent, minutes=2)
    real_request = agent_source.http_request
    seen: list[bool] = []

    def watching(url: str, **kw: object) -> bytes:
        seen.append(gc.isenabled())
        return real_request(url, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(agent_source, "http_request", watching)
    assert gc.isenabled()
    assert pull(ctx, f"gpu01=127.0.0.1:{agent.port}").status == "ok"
    assert seen and not any(seen)
    assert gc.isenabled()

    def failing(url: str, **kw: object) -> bytes:
        raise RuntimeError("a bug in the middle of a pull")

    monkeypatch.setattr(agent_source, "http_request", failing)
    failed = pull(ctx, f"gpu01=127.0.0.1:{agent.port}")
    assert failed.status == "error" and "a bug in the middle of a pull" in failed.message
    assert gc.isenabled()


def test_the_pulls_threads_leave_sigint_and_sigterm_to_the_main_thread(
    ctx: RunContext, agent: RunningAgent, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The HTTP workers and the store writers block SIGINT and SIGTERM: a signal one of them
    took would leave the main thread asleep on the pull and ^C unanswered (slurmtel.threads)."""
    import signal

    import slurmtel.sources.agent as agent_source

    backlog(agent, minutes=2)
    held = {signal.SIGINT, signal.SIGTERM}
    masks: dict[str, list[bool]] = {"http": [], "store": []}
    real_request, real_store = agent_source.http_request, agent_source._store_group

    def fetching(url: str, **kw: object) -> bytes:
        masks["http"].append(held <= signal.pthread_sigmask(signal.SIG_BLOCK, []))
        return real_request(url, **kw)  # type: ignore[arg-type]

    def storing(*args: object) -> object:
        masks["store"].append(held <= signal.pthread_sigmask(signal.SIG_BLOCK, []))
        return real_store(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(agent_source, "http_request", fetching)
    monkeypatch.setattr(agent_source, "_store_group", storing)
    assert pull(ctx, f"gpu01=127.0.0.1:{agent.port}").status == "ok"
    assert masks["http"] and all(masks["http"]) and masks["store"] and all(masks["store"])
    assert not held & signal.pthread_sigmask(signal.SIG_BLOCK, [])


def test_a_page_the_head_cannot_use_is_quarantined_acked_and_passed(
    ctx: RunContext, agent: RunningAgent, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An agent serves a page whose items are out of order (a damaged spool, another version):
    refused whole on every pull it blocked the node for ever. Now it is quarantined with its
    reason, acked, and the next pull goes on from after it."""
    total = backlog(agent, minutes=2)
    serve = agent.server.summaries
    damaged: list[int] = []

    def out_of_order(*args: object, **kwargs: object) -> bytes:
        page = json.loads(serve(*args, **kwargs))  # type: ignore[arg-type]
        if not damaged and len(page["items"]) > 1:
            page["items"][0], page["items"][-1] = page["items"][-1], page["items"][0]
            damaged.append(len(page["items"]))
        return json.dumps(page).encode()

    monkeypatch.setattr(agent.server, "summaries", out_of_order)
    target = f"gpu01=127.0.0.1:{agent.port}"
    outcome = pull(ctx, target)
    assert outcome.status == "partial", outcome.message
    with ctx.engine.connect() as conn:
        reasons = conn.execute(text("SELECT record_key, reason FROM quarantine WHERE source = 'agent'")).all()
        cursor = conn.execute(text("SELECT cursor FROM agent_cursor WHERE node = 'gpu01'")).scalar_one()
    assert len(reasons) == 1 and reasons[0].reason.startswith("page not used:"), reasons
    assert "does not follow" in reasons[0].reason
    # acked: the agent dropped the page, the head's cursor is past it
    assert cursor == total and agent.spool.stats().items == 0
    # the node is not blocked: what it spools next is pulled and stored
    more = windows("GPU-0", T0 + timedelta(minutes=30), 4)
    agent.spool.append_records(more)
    again = pull(ctx, target)
    assert again.status == "ok", again.message
    assert count(ctx.engine, "SELECT count(*) FROM gpu_summary WHERE source = 'agent'") == len(more)
