"""A generated day of a large GPU cluster, replayed through the daemon's real paths.

Default: 10,000 GPUs in 1,250 nodes of 8, a realistic job mix (about 30,000 jobs a day per
10,000 GPUs, scaled with --gpus; at the start of the day about half the GPUs are held by
multi-day jobs that started up to 6 days earlier, many of them still running at its end).
Simulated time moves in steps of the attribution interval (config attribution.interval_seconds,
--step-minutes); in each step, as the daemon does:

  sacct:  the attempts submitted, started or ended in the step, rendered as `sacct --json`
          (slurmtel.simulate.render_sacct_json) and stored by the sacct source's own path
          (store_documents: parse_sacct_json, COPY, upsert, linking);
  agent:  every node's agent serves its 30 s window summaries (and its inventory, first) as
          /v1/summaries pages (slurmtel.agent.protocol), pulled every --pull-seconds
          (sources.agent.interval_seconds) by the agent source (`collect agent`: decode,
          screen, one COPY per group of nodes' pages, cursors, ack, several nodes at a
          time); only the HTTP socket is replaced by an in-process call to the prepared pages;
  attribution: `run_attribution(engine, config, now=step_end)`, as the daemon's schedule runs it.

Printed: per step the ingest rate, attribution seconds and attempts recomputed, and whether
the step kept up with real time x --speedup; ingest rows/s against binary COPY of the same
rows into the same table (measured in the same run, before the replay); attribution seconds
per run early vs late in the day; the oldest window not packed yet; lag from a window's end to
the attribution run that folded it in; storage bytes per GPU-day after VACUUM; and each admin report's seconds over the month
(slurmtel.reports.catalog REPORTS through run_report).

Targets: ingest >= 0.5x COPY; a steady-state attribution run < 10 s for 5 minutes of new data;
no window unpacked for 2 hours or more; reports < 1 s.

    python benchmarks/scale.py [--gpus 10000] [--hours 24] [--step-minutes 5] [--speedup 1]
                               [--pull-seconds 60] [--dsn URL] [--keep]

The job watermark overlap (attribution.overlap_seconds, 600 s of wall-clock time in the
daemon: the job changes of the last 2 runs are re-read) is given to each run as the wall-clock
seconds since the start of the run that many runs back, so the replay, whose runs come faster
than every 5 minutes, re-reads as many runs' job changes as the daemon would.
"""

from __future__ import annotations

import argparse
import bisect
import heapq
import math
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

from cputime import Meter, Usage
from scratch import configured_server, scratch_database
from sqlalchemy import Connection, Engine, text

import slurmtel.sources.agent as agent_source
from slurmtel.access import Identity, Role
from slurmtel.agent.protocol import (
    ACK_PATH,
    AckResult,
    encode_ack_response,
    encode_summaries_response,
    record_to_json,
)
from slurmtel.attribution import run_attribution
from slurmtel.config import AgentSourceConfig, Config, config_from_dict
from slurmtel.records import GpuInventory, GpuSummary
from slurmtel.reports.catalog import REPORTS
from slurmtel.reports.spec import build_query, run_report
from slurmtel.simulate import (
    _OUTCOMES,
    _PROFILES,
    SimAttempt,
    SimJob,
    _pick,
    _poisson,
    gpu_uuid,
    render_sacct_json,
    sim_window,
)
from slurmtel.sources import default_options, get_source
from slurmtel.sources.base import RunContext, RunResult
from slurmtel.sources.sacct import SacctDocument, store_documents
from slurmtel.store.copy import copy_rows
from slurmtel.store.samples import sample_store
from slurmtel.store.telemetry import _COPY_COLUMNS, ensure_partitions, summary_rows

TARGET_RATIO = 0.5
TARGET_ATTRIBUTION_SECONDS = 10.0
TARGET_REPORT_SECONDS = 1.0
GPUS_PER_NODE = 8
WINDOW = 30
JOBS_PER_DAY_PER_10K = 30_000
# the baseline COPY commits as many rows a transaction as the agent source stores in one group
COPY_PAGE = agent_source.STORE_GROUP_ITEMS
CLUSTER = "scale"
START = datetime(2026, 11, 2, tzinfo=UTC)
USERS = [f"u{i:03d}" for i in range(400)]
ACCOUNTS = [f"acct{i:02d}" for i in range(40)]
# GPUs per job of the jobs arriving in the day (multi-node jobs hold whole nodes)
SIZES = ((1, 0.45), (2, 0.20), (4, 0.15), (8, 0.15), (16, 0.04), (32, 0.01))
# GPUs per job of the multi-day jobs running when the day begins
LONG_SIZES = ((4, 0.2), (8, 0.4), (16, 0.2), (32, 0.15), (64, 0.05))


# ---------------------------------------------------------------- the job mix


@dataclass
class Cluster:
    """Free GPU indices per node, with the nodes bucketed by free count (best fit)."""

    nodes: list[str]
    free: list[set[int]] = field(init=False)
    by_free: list[set[int]] = field(init=False)

    def __post_init__(self) -> None:
        self.free = [set(range(GPUS_PER_NODE)) for _ in self.nodes]
        self.by_free = [set() for _ in range(GPUS_PER_NODE + 1)]
        self.by_free[GPUS_PER_NODE] = set(range(len(self.nodes)))

    def place(self, gpus: int) -> dict[str, tuple[int, ...]] | None:
        if gpus > GPUS_PER_NODE:
            count = math.ceil(gpus / GPUS_PER_NODE)
            if len(self.by_free[GPUS_PER_NODE]) < count:
                return None
            chosen = sorted(self.by_free[GPUS_PER_NODE])[:count]
            return {self.nodes[n]: self._take(n, GPUS_PER_NODE) for n in chosen}
        for have in range(gpus, GPUS_PER_NODE + 1):
            if self.by_free[have]:
                n = min(self.by_free[have])
                return {self.nodes[n]: self._take(n, gpus)}
        return None

    def _take(self, n: int, gpus: int) -> tuple[int, ...]:
        self.by_free[len(self.free[n])].discard(n)
        taken = tuple(sorted(self.free[n])[:gpus])
        self.free[n].difference_update(taken)
        self.by_free[len(self.free[n])].add(n)
        return taken

    def release(self, placement: dict[str, tuple[int, ...]]) -> None:
        for node, indices in placement.items():
            n = int(node[1:]) - 1
            self.by_free[len(self.free[n])].discard(n)
            self.free[n].update(indices)
            self.by_free[len(self.free[n])].add(n)


def node_name(n: int) -> str:
    return f"n{n + 1:04d}"


def job_mix(gpus: int, start: datetime, end: datetime, seed: int = 3) -> list[SimAttempt]:
    """Attempts of one generated cluster over [START, END) (final states; an attempt still
    running at END has end_at after it): multi-day jobs already running at START (about 45 % of
    the GPUs), shorter jobs already running (to about 85 %), then Poisson arrivals of
    JOBS_PER_DAY_PER_10K per 10,000 GPUs, placed best-fit as GPUs free up (FIFO with backfill)."""
    rng = random.Random(seed)
    cluster = Cluster([node_name(n) for n in range(gpus // GPUS_PER_NODE)])
    total = len(cluster.nodes) * GPUS_PER_NODE
    attempts: list[SimAttempt] = []
    ends: list[tuple[datetime, int]] = []  # (end, index in attempts) of the attempts holding GPUs
    next_id = 1_000_000

    def make(size: int, submit: datetime, begin: datetime | None, run: timedelta, limit: int) -> SimJob:
        """A job of SIZE GPUs; not begun (BEGIN None), its planned run time is in end_at - submit_at."""
        nonlocal next_id
        account = rng.choice(ACCOUNTS)
        state = _pick(rng, _OUTCOMES)
        if state in ("FAILED", "OUT_OF_MEMORY"):
            run = min(run, timedelta(seconds=rng.uniform(60, 1800)))
        next_id += 1
        return SimJob(
            job_id_raw=next_id, user=rng.choice(USERS), account=account, partition="gpu",
            name=rng.choice(("train", "finetune", "eval", "md-sim", "sweep")), state=state,
            submit_at=submit, eligible_at=submit, start_at=begin,
            end_at=(begin or submit) + run, gpus=size, nodes=(),
            cpus=8 * size, time_limit_minutes=limit, exit_code=1 if state in ("FAILED", "OUT_OF_MEMORY") else 0,
            cluster=CLUSTER,
        )  # fmt: skip

    def start_job(job: SimJob, placement: dict[str, tuple[int, ...]]) -> None:
        profile = _pick(rng, _PROFILES) if job.gpus > 1 else _pick(rng, _PROFILES[:1] + _PROFILES[2:])
        attempt = SimAttempt(
            job=replace(job, nodes=tuple(placement)),
            placement=placement,
            profile=profile,
            setup_seconds=rng.choice((30, 60, 120, 300)),
        )
        attempts.append(attempt)
        assert job.end_at is not None
        heapq.heappush(ends, (job.end_at, len(attempts) - 1))

    def sizes(weighted: tuple[tuple[int, float], ...]) -> int:
        size = rng.choices([s for s, _ in weighted], [w for _, w in weighted])[0]
        return min(size, total // 2 if total >= 2 * GPUS_PER_NODE else GPUS_PER_NODE)

    # multi-day jobs running at START: began up to 6 days before, run 1 to 7 days in all
    held = 0
    while held < 0.45 * total:
        size = sizes(LONG_SIZES)
        begin = start - timedelta(seconds=rng.uniform(3600, 6 * 86400))
        run = max(start - begin + timedelta(minutes=rng.uniform(10, 600)), timedelta(days=rng.uniform(1, 7)))
        job = make(size, begin - timedelta(minutes=rng.uniform(1, 120)), begin, run, 7 * 1440)
        placement = cluster.place(size)
        if placement is None:
            break
        start_job(job, placement)
        held += size
    # shorter jobs running at START, to about 85 % of the GPUs
    while held < 0.85 * total:
        size = sizes(SIZES)
        run = timedelta(seconds=min(86400.0, rng.lognormvariate(8.2, 1.0) + 300))
        begin = start - run * rng.uniform(0.05, 0.95)
        job = make(size, begin - timedelta(minutes=rng.uniform(0, 60)), begin, run, 1440)
        if job.end_at is not None and job.end_at <= start:
            continue
        placement = cluster.place(size)
        if placement is None:
            break
        start_job(job, placement)
        held += size
    # arrivals, minute by minute
    per_minute = JOBS_PER_DAY_PER_10K * total / 10_000 / 1440
    queue: list[SimJob] = []
    now = start
    while now < end:
        while ends and ends[0][0] <= now:
            _, index = heapq.heappop(ends)
            cluster.release(attempts[index].placement)
        for _ in range(_poisson(rng, per_minute)):
            size = sizes(SIZES)
            if rng.random() < 0.01:  # a multi-day job
                run = timedelta(days=rng.uniform(1, 5))
            else:
                run = timedelta(seconds=min(86400.0, rng.lognormvariate(7.5, 1.3) + 60))
            queue.append(make(size, now + timedelta(seconds=rng.uniform(0, 59)), None, run, 7 * 1440))
        waiting = []
        for job in queue:
            placement = cluster.place(job.gpus) if len(waiting) < 500 and job.submit_at <= now else None
            if placement is None:
                waiting.append(job)
                continue
            assert job.end_at is not None and job.start_at is None
            began = max(job.submit_at, now)
            start_job(replace(job, start_at=began, end_at=began + (job.end_at - job.submit_at)), placement)
        queue = waiting
        now += timedelta(minutes=1)
    for job in queue:  # still pending at END
        attempts.append(SimAttempt(replace(job, end_at=None), placement={}, profile="idle", setup_seconds=0))
    return attempts


def sacct_document(attempts: list[SimAttempt], lo: datetime | None, hi: datetime) -> tuple[bytes, int]:
    """What `sacct --json -a -X` prints at HI for the attempts submitted, started or ended in
    (LO, HI] (every attempt not ended before the day with LO None), and how many."""
    jobs = []
    for attempt in attempts:
        job = attempt.job
        if job.submit_at > hi:
            continue
        events = [t for t in (job.submit_at, job.start_at, job.end_at) if t is not None]
        if lo is None:
            if job.end_at is not None and job.end_at <= START:
                continue
        elif not any(lo < t <= hi for t in events):
            continue
        if job.start_at is None or job.start_at > hi:
            job = replace(job, state="PENDING", start_at=None, end_at=None, nodes=())
        elif job.end_at is None or job.end_at > hi:
            job = replace(job, state="RUNNING", end_at=None)
        jobs.append(job)
    return render_sacct_json(jobs, cluster=CLUSTER), len(jobs)


# ---------------------------------------------------------------- the agents' windows


class Windows:
    """Every GPU's window summaries, generated one pull at a time (the same windows for the
    same pull whatever was generated before: a random stream per pull)."""

    def __init__(self, attempts: list[SimAttempt], gpus: int, seed: int = 11) -> None:
        self.seed = seed
        self.gpus = [(node_name(n), i) for n in range(gpus // GPUS_PER_NODE) for i in range(GPUS_PER_NODE)]
        self.uuids = {g: gpu_uuid(CLUSTER, *g) for g in self.gpus}
        # per GPU: its attempts' (start, end, attempt, rank), by start
        self.spans: dict[tuple[str, int], list[tuple[datetime, datetime, SimAttempt, int]]] = {
            g: [] for g in self.gpus
        }
        for attempt in attempts:
            job = attempt.job
            if job.start_at is None or job.end_at is None:
                continue
            rank = 0
            for node, indices in attempt.placement.items():
                for index in indices:
                    self.spans[(node, index)].append((job.start_at, job.end_at, attempt, rank))
                    rank += 1
        self.starts = {g: [s[0] for s in sorted(v, key=lambda s: s[0])] for g, v in self.spans.items()}
        for spans in self.spans.values():
            spans.sort(key=lambda s: s[0])

    def inventory(self, at: datetime) -> dict[str, list[GpuInventory]]:
        by_node: dict[str, list[GpuInventory]] = {}
        for node, index in self.gpus:
            by_node.setdefault(node, []).append(
                GpuInventory(
                    node=node,
                    gpu_uuid=self.uuids[(node, index)],
                    index=index,
                    model="NVIDIA H100 80GB HBM3",
                    observed_at=at,
                    memory_total_bytes=81559 * 2**20,
                    minor_number=index,
                    driver_version="550.90.07",
                    cuda_version="12.4",
                    mig_mode="disabled",
                )
            )
        return by_node

    def between(self, lo: datetime, hi: datetime) -> dict[str, list[GpuSummary]]:
        """Per node, the windows that start in [LO, HI)."""
        rng = random.Random(f"{self.seed}.{lo.isoformat()}")
        by_node: dict[str, list[GpuSummary]] = {}
        step = timedelta(seconds=WINDOW)
        for g in self.gpus:
            node, _ = g
            spans, starts = self.spans[g], self.starts[g]
            out = by_node.setdefault(node, [])
            t = lo
            while t < hi:
                k = bisect.bisect_right(starts, t) - 1
                span = spans[k] if k >= 0 and spans[k][1] > t else None
                out.append(sim_window(rng, node, self.uuids[g], t, span, WINDOW))
                t += step
        return by_node


class FakeAgents:
    """Each node's agent spool as /v1/summaries pages, served in-process in place of HTTP."""

    def __init__(self, page_size: int) -> None:
        self.page_size = page_size
        self.seq: dict[str, int] = {}
        self.pages: dict[str, dict[int, bytes]] = {}

    def load(self, records: dict[str, list[Any]]) -> int:
        """Spool RECORDS (per node) and encode their pages as the agent would (not timed)."""
        count = 0
        self.pages = {}
        for node, items in records.items():
            first = self.seq.get(node, 0)
            encoded = [
                (first + k + 1, "summary" if isinstance(r, GpuSummary) else "inventory", record_to_json(r))
                for k, r in enumerate(items)
            ]
            pages = {}
            for i in range(0, len(encoded), self.page_size):
                chunk = encoded[i : i + self.page_size]
                pages[first + i] = self._page(node, chunk, first + i + len(chunk), len(encoded) - i)
            self.pages[node] = pages
            self.seq[node] = first + len(encoded)
            count += len(items)
        return count

    @staticmethod
    def _page(node: str, items: list[tuple[int, str, str]], next_cursor: int, left: int) -> bytes:
        return encode_summaries_response(
            node=node, agent_version="bench", items=items, next_cursor=next_cursor, evicted_total=0,
            spool_items=left, spool_bytes=0, spool_id=f"bench-{node}",
        )  # fmt: skip

    def request(
        self, url: str, *, timeout_seconds: float, data: bytes | None = None, headers: Any = None
    ) -> bytes:
        parsed = urlparse(url)
        node = parsed.hostname or ""
        if parsed.path == ACK_PATH:
            return encode_ack_response(AckResult(self.seq.get(node, 0), 0, 0))
        after = int(parse_qs(parsed.query)["after"][0])
        return self.pages.get(node, {}).get(after) or self._page(node, [], after, 0)


# ---------------------------------------------------------------- measurements


def telemetry_storage_bytes(conn: Connection) -> dict[str, int]:
    """Bytes on disk (table, TOAST and indexes) of the window store (slurmtel.store.samples:
    windows one row each and packed hours), of the ingest batches naming them and of the
    attribution tables derived from them."""
    sizes = {"window store": sample_store().size(conn)[0]}
    for table in ("ingest_batch", "gpu_job_span", "gpu_attribution", "gpu_attribution_part"):
        sizes[table] = int(
            conn.execute(
                text("SELECT pg_total_relation_size(CAST(:t AS regclass))"), {"t": table}
            ).scalar_one()
        )
    return sizes


def copy_baseline(engine: Engine, windows: Windows, lo: datetime, hi: datetime) -> tuple[int, float, Usage]:
    """Binary COPY of the windows in [LO, HI) into an empty gpu_window, COPY_PAGE rows per
    transaction; emptied again afterwards. Returns (rows, rows/s, its wall and CPU seconds)."""
    rows: list[tuple[Any, ...]] = []
    with engine.begin() as conn:
        batch = conn.execute(
            text("INSERT INTO ingest_batch (source, node, rows) VALUES ('copy', '', 0) RETURNING id")
        ).scalar_one()
    for records in windows.between(lo, hi).values():
        rows += summary_rows(records, batch)
    with Meter(engine).measure() as section:
        for i in range(0, len(rows), COPY_PAGE):
            with engine.begin() as conn:
                copy_rows(conn, "gpu_window", _COPY_COLUMNS, rows[i : i + COPY_PAGE])
    rate = len(rows) / section.usage.wall
    with engine.begin() as conn:
        conn.execute(text("TRUNCATE gpu_window, gpu_window_hour, ingest_batch CASCADE"))
    return len(rows), rate, section.usage


@dataclass
class Step:
    index: int
    end: datetime
    jobs: int
    sacct_seconds: float
    windows: int
    ingest_seconds: float
    attribution_seconds: float
    attempts: int
    rollup_rows: int
    lag_mean: float
    lag_max: float
    ingest_usage: Usage
    attribution_usage: Usage
    # the age of the oldest window not packed yet at the step's end (None: every one packed)
    unpacked_age_seconds: float | None = None
    # windows the run packed (hours that ended PACK_DELAY before it)
    packed_windows: int = 0

    @property
    def busy_seconds(self) -> float:
        return self.sacct_seconds + self.ingest_seconds + self.attribution_seconds


def step_ranges(steps: list[Step]) -> str:
    """The steps' numbers as ranges: "2-5", "25, 34-36"."""
    ranges: list[list[int]] = []
    for step in steps:
        if ranges and step.index == ranges[-1][-1] + 1:
            ranges[-1].append(step.index)
        else:
            ranges.append([step.index])
    return ", ".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in ranges)


def runs_back_overlap(config: Config, step: timedelta, run_starts: list[float]) -> int:
    """attribution.overlap_seconds for the run that started last in RUN_STARTS (time.time()):
    the daemon re-reads the job changes of the last overlap_seconds of wall-clock time, that
    many runs back (2 by default); a replay's runs come faster, so it re-reads the job changes
    since the start of that many runs back (all of them until there were that many)."""
    runs_back = math.ceil(config.attribution.overlap_seconds / step.total_seconds())
    back = run_starts[-1 - runs_back] if len(run_starts) > runs_back else run_starts[0] - 3600
    return math.ceil(run_starts[-1] - back) + 1


def replay(
    engine: Engine,
    config: Config,
    attempts: list[SimAttempt],
    windows: Windows,
    *,
    steps: int,
    step: timedelta,
    pull: timedelta,
    token_file: str,
) -> Iterator[Step]:
    agents = FakeAgents(AgentSourceConfig.page_size)
    targets = [f"{node}={node}:{AgentSourceConfig.port}" for node in sorted({n for n, _ in windows.gpus})]
    agent_config = config_from_dict({"sources": {"agent": {"targets": targets, "token_file": token_file}}})
    run_starts: list[float] = []
    source = get_source("agent")
    options = default_options(source)
    agent_source.http_request = agents.request  # type: ignore[assignment]  # the one replaced seam
    inventory = windows.inventory(START)
    clock_at = START

    def clock() -> datetime:
        return clock_at

    ctx = RunContext(config=agent_config, engine=engine, clock=clock)
    meter = Meter(engine)
    lo: datetime | None = None
    for k in range(steps):
        step_start = START + k * step
        step_end = step_start + step
        # sacct: the daemon's sacct run at the end of the step
        document, jobs = sacct_document(attempts, lo, step_end)
        clock_at = step_end
        t0 = time.perf_counter()
        result = RunResult()
        store_documents(ctx, [SacctDocument(f"sacct step {k}", document, step_end)], result)
        sacct_seconds = time.perf_counter() - t0
        lo = step_end
        # agents: pulled every PULL within the step
        stored = 0
        ingest_seconds = 0.0
        ingest_usage = Usage(0.0, 0.0)
        pull_at = step_start + pull
        while pull_at <= step_end:
            records: dict[str, list[Any]] = dict(windows.between(pull_at - pull, pull_at))
            if inventory:
                records = {node: [*inventory[node], *rows] for node, rows in records.items()}
                inventory = {}
            windows_in = agents.load(records)
            clock_at = pull_at
            with meter.measure() as pull_section:
                pulled = source.collect(ctx, options)
            ingest_usage += pull_section.usage
            ingest_seconds += pull_section.usage.wall
            assert pulled.rows_quarantined == 0, pulled.notes[:5]
            stored += windows_in
            pull_at += pull
        inventory_rows = len(windows.gpus) if k == 0 else 0
        stored -= inventory_rows
        # attribution, on its schedule
        clock_at = step_end
        running = meter.start()
        run_starts.append(time.time())
        attribution_config = config_from_dict(
            {"attribution": {"overlap_seconds": runs_back_overlap(config, step, run_starts)}}
        )
        attribution = run_attribution(engine, attribution_config, now=step_end)
        attribution_usage = running.stop()
        attribution_seconds = attribution_usage.wall
        with engine.connect() as conn:
            left = conn.execute(
                text(
                    "SELECT count(*) FROM ingest_batch b WHERE b.source = 'agent' "
                    "AND NOT EXISTS (SELECT 1 FROM attribution_batch a WHERE a.batch_id = b.id)"
                )
            ).scalar_one()
            oldest = conn.execute(text("SELECT min(window_start_at) FROM gpu_window")).scalar_one()
        assert left == 0, f"{left} batches not folded in"
        # lag: a window [t, t + 30 s) ending in (step_start, step_end] is folded in by this run
        processing = sacct_seconds + ingest_seconds + attribution_seconds
        sim_lags = [float(s) for s in range(0, int(step.total_seconds()), WINDOW)]
        yield Step(
            index=k + 1,
            end=step_end,
            jobs=jobs,
            sacct_seconds=sacct_seconds,
            windows=stored,
            ingest_seconds=ingest_seconds,
            attribution_seconds=attribution_seconds,
            attempts=attribution.attempts,
            rollup_rows=attribution.rows,
            lag_mean=statistics.fmean(sim_lags) + processing,
            lag_max=max(sim_lags) + processing,
            ingest_usage=ingest_usage,
            attribution_usage=attribution_usage,
            unpacked_age_seconds=None if oldest is None else (step_end - oldest).total_seconds(),
            packed_windows=attribution.packed_windows,
        )


def time_reports(engine: Engine, config: Config, now: datetime) -> dict[str, Usage]:
    """Each report's best of 2 by wall seconds, with that run's CPU seconds."""
    month = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    month_end = (month + timedelta(days=32)).replace(day=1)
    root = Identity("root", Role.ADMIN)
    meter = Meter(engine)
    seconds = {}
    for name, spec in REPORTS.items():
        query = build_query(spec, root, start=month, end=month_end, now=now, zone=config.zone)
        best = Usage(math.inf, 0.0)
        for _ in range(2):
            with engine.connect() as conn, meter.measure() as section:
                run_report(conn, spec, query)
            best = min(best, section.usage, key=lambda usage: usage.wall)
        seconds[name] = best
    return seconds


def _fmt_mb(n: float) -> str:
    return f"{n / 1e6:,.1f} MB"


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    config = Config()
    parser.add_argument("--gpus", type=int, default=10_000)
    parser.add_argument("--hours", type=float, default=24)
    parser.add_argument(
        "--step-minutes",
        type=float,
        default=config.attribution.interval_seconds / 60,
        help="attribution interval",
    )
    parser.add_argument("--pull-seconds", type=int, default=AgentSourceConfig.interval_seconds)
    parser.add_argument("--speedup", type=float, default=1.0, help="replay at real time x N")
    parser.add_argument("--dsn", default=None)
    parser.add_argument("--keep", action="store_true", help="keep the scratch database")
    args = parser.parse_args()
    dsn = configured_server(args.dsn)
    if not dsn:
        print("give --dsn or SLURMTEL_TEST_DSN: this benchmark needs a PostgreSQL server with room for it")
        return 2
    gpus = max(GPUS_PER_NODE, args.gpus // GPUS_PER_NODE * GPUS_PER_NODE)
    step = timedelta(minutes=args.step_minutes)
    pull = timedelta(seconds=args.pull_seconds)
    if step % pull or pull % timedelta(seconds=WINDOW):
        print("--pull-seconds must divide the step and be a multiple of 30")
        return 2
    steps = max(1, int(timedelta(hours=args.hours) / step))
    end = START + steps * step

    t0 = time.perf_counter()
    attempts = job_mix(gpus, START, end)
    windows = Windows(attempts, gpus)
    started = [a for a in attempts if a.job.start_at is not None]
    in_day = [a for a in started if a.job.start_at is not None and a.job.start_at >= START]
    before = [a for a in started if a.job.start_at is not None and a.job.start_at < START]
    still = [a for a in started if a.job.end_at is not None and a.job.end_at > end]
    multi_day = [a for a in still if a.job.start_at is not None and end - a.job.start_at > timedelta(days=1)]
    print(f"{gpus:,} GPUs in {gpus // GPUS_PER_NODE:,} nodes, {steps} steps of {step.total_seconds() / 60:g} min "
          f"({steps * step.total_seconds() / 3600:g} h), agents pulled every {pull.total_seconds():g} s, "
          f"30 s windows, replay at real time x {args.speedup:g}")  # fmt: skip
    print(f"job mix: {len(in_day):,} attempts started in the replay ({len(in_day) * 86400 / (steps * step.total_seconds()):,.0f}/day), "
          f"{len(before):,} running at its start, {len(still):,} still running at its end "
          f"({len(multi_day):,} of them running for over a day), {len(attempts) - len(started):,} left pending "
          f"(generated in {time.perf_counter() - t0:.1f} s)", flush=True)  # fmt: skip

    with scratch_database(dsn, keep=args.keep) as engine, tempfile.TemporaryDirectory() as tokens:
        token_file = Path(tokens) / "agent-token"
        token_file.write_text("benchmark-token-0123456789\n")
        token_file.chmod(0o600)
        with engine.begin() as conn:
            ensure_partitions(conn, START.date(), (end - timedelta(microseconds=1)).date())
        baseline_steps = min(steps, 3)
        copied, copy_rate, copy_usage = copy_baseline(engine, windows, START, START + baseline_steps * step)
        print(f"binary COPY of the first {baseline_steps} steps' windows ({copied:,} rows, {COPY_PAGE} per "
              f"transaction) into the empty table: {copy_rate:,.0f} rows/s; {copy_usage}", flush=True)  # fmt: skip

        print(f"\n{'step':>5} {'sim end':>6} {'jobs':>6} {'sacct s':>8} {'windows':>8} {'ingest s':>9} "
              f"{'rows/s':>8} {'attr s':>7} {'attr CPU':>8} {'attempts':>8} {'rollups':>8} {'keeps up':>9}")  # fmt: skip
        budget = step.total_seconds() / args.speedup
        done: list[Step] = []
        for s in replay(
            engine, config, attempts, windows, steps=steps, step=step, pull=pull, token_file=str(token_file),
        ):  # fmt: skip
            done.append(s)
            print(f"{s.index:>5} {s.end:%H:%M} {s.jobs:>6,} {s.sacct_seconds:>8.2f} {s.windows:>8,} "
                  f"{s.ingest_seconds:>9.2f} {s.windows / s.ingest_seconds:>8,.0f} {s.attribution_seconds:>7.2f} "
                  f"{s.attribution_usage.cpu:>8.2f} "
                  f"{s.attempts:>8,} {s.rollup_rows:>8,} {'yes' if s.busy_seconds < budget else 'NO':>9}",
                  flush=True)  # fmt: skip

        windows_total = sum(s.windows for s in done)
        ingest_total = sum(s.ingest_seconds for s in done)
        first = done[:baseline_steps]
        ingest_first = sum(s.windows for s in first) / sum(s.ingest_seconds for s in first)
        ingest_rate = windows_total / ingest_total
        print("\ningest (agent source: decode, screen, COPY, cursor, ack)")
        print(f"  first {baseline_steps} steps (the rows COPY wrote): {ingest_first:10,.0f} rows/s  "
              f"ratio to COPY {ingest_first / copy_rate:.2f}")  # fmt: skip
        print(f"  whole replay ({windows_total:,} windows):  {ingest_rate:10,.0f} rows/s  "
              f"ratio to COPY {ingest_rate / copy_rate:.2f}")  # fmt: skip
        first_ingest = sum((s.ingest_usage for s in first), Usage(0.0, 0.0))
        all_ingest = sum((s.ingest_usage for s in done), Usage(0.0, 0.0))
        copy_cpu_rate = copied / copy_usage.cpu
        print(f"  first {baseline_steps} steps: {first_ingest}; COPY: {copy_usage}")
        print(f"  from CPU seconds: first {baseline_steps} steps {sum(s.windows for s in first) / first_ingest.cpu:,.0f} "
              f"rows per CPU-second, ratio to COPY {sum(s.windows for s in first) / first_ingest.cpu / copy_cpu_rate:.2f}; "
              f"whole replay ratio {windows_total / all_ingest.cpu / copy_cpu_rate:.2f}")  # fmt: skip
        verdict = "met" if ingest_first / copy_rate >= TARGET_RATIO else "NOT met"
        print(f"  target: ratio >= {TARGET_RATIO}: {verdict}")

        attr = [s.attribution_seconds for s in done]
        k = max(1, min(6, len(done) // 4))
        early, late = done[1 : 1 + k] or done[:1], done[-k:]
        early_s = statistics.fmean(s.attribution_seconds for s in early)
        late_s = statistics.fmean(s.attribution_seconds for s in late)
        print(f"\nattribution per run ({step.total_seconds() / 60:g} min of new data each)")
        print(f"  early (steps {early[0].index}-{early[-1].index}): {early_s:.2f} s mean, "
              f"{statistics.fmean(s.attempts for s in early):,.0f} attempts recomputed")  # fmt: skip
        print(f"  late  (steps {late[0].index}-{late[-1].index}): {late_s:.2f} s mean, "
              f"{statistics.fmean(s.attempts for s in late):,.0f} attempts recomputed")  # fmt: skip
        print(f"  first run (the day's initial jobs): {attr[0]:.2f} s; max {max(attr):.2f} s; "
              f"growth late/early x{late_s / early_s if early_s else math.inf:.2f}")  # fmt: skip
        attr_cpu = [s.attribution_usage.cpu for s in done]
        early_cpu = statistics.fmean(s.attribution_usage.cpu for s in early)
        late_cpu = statistics.fmean(s.attribution_usage.cpu for s in late)
        print(f"  CPU seconds (client + backend): early {early_cpu:.2f} s mean, late {late_cpu:.2f} s mean, "
              f"first run {attr_cpu[0]:.2f} s, max {max(attr_cpu):.2f} s, growth late/early "
              f"x{late_cpu / early_cpu if early_cpu else math.inf:.2f}; slowest run {max(done, key=lambda s: s.attribution_seconds).attribution_usage}")  # fmt: skip
        # packing runs cost more than the others by design (eight of them an hour, from the
        # second hour): growth within the day is each kind's own, early against late
        for kind, runs in (
            ("runs that pack nothing", [s for s in done[1:] if not s.packed_windows]),
            ("runs that pack", [s for s in done if s.packed_windows]),
        ):
            if not runs:
                print(f"  {kind}: none")
                continue
            n = max(1, min(6, len(runs) // 4))
            first_runs, last_runs = runs[:n], runs[-n:]

            def mean_of(these: list[Step]) -> str:
                wall = statistics.fmean(s.attribution_seconds for s in these)
                cpu = statistics.fmean(s.attribution_usage.cpu for s in these)
                return f"{wall:.2f} s wall, {cpu:.2f} s CPU"

            first_cpu = statistics.fmean(s.attribution_usage.cpu for s in first_runs)
            last_cpu = statistics.fmean(s.attribution_usage.cpu for s in last_runs)
            packed = (
                f", {statistics.fmean(s.packed_windows for s in runs):,.0f} windows packed a run"
                if runs[0].packed_windows
                else ""
            )
            print(f"  {kind} ({len(runs)}{packed}): early (steps {step_ranges(first_runs)}) "
                  f"{mean_of(first_runs)}, late (steps {step_ranges(last_runs)}) {mean_of(last_runs)}; "
                  f"growth late/early in CPU x{last_cpu / first_cpu if first_cpu else math.inf:.2f}")  # fmt: skip
        verdict = "met" if max(attr[1:] or attr) < TARGET_ATTRIBUTION_SECONDS else "NOT met"
        cpu_verdict = "met" if max(attr_cpu[1:] or attr_cpu) < TARGET_ATTRIBUTION_SECONDS else "NOT met"
        print(
            f"  target: steady-state run < {TARGET_ATTRIBUTION_SECONDS:g} s: {verdict} (in CPU seconds: {cpu_verdict})"
        )
        slow = [s for s in done if s.busy_seconds >= budget]
        print(f"  keeps up with real time x {args.speedup:g} ({budget:.0f} s per step): "
              f"{'every step' if not slow else f'NOT in {len(slow)} of {len(done)} steps'}")  # fmt: skip

        ages = [(s.unpacked_age_seconds, s.index) for s in done if s.unpacked_age_seconds is not None]
        if ages:
            age, at_step = max(ages)
            print(f"  oldest window not packed yet: {age / 3600:.2f} h (step {at_step}); target < 2 h: "
                  f"{'met' if age < 2 * 3600 else 'NOT met'}")  # fmt: skip

        print("\nlag from a window's end to the attribution run that folded it in "
              "(simulated time to the run + sacct, ingest and attribution seconds of the step)")  # fmt: skip
        print(f"  mean {statistics.fmean(s.lag_mean for s in done):.0f} s, "
              f"max {max(s.lag_max for s in done):.0f} s")  # fmt: skip

        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(text("VACUUM ANALYZE"))
            sizes = telemetry_storage_bytes(conn)
            stored_windows = sample_store().size(conn)[1]
            packed = conn.execute(
                text("SELECT coalesce(sum(cardinality(sample_counts)), 0) FROM gpu_window_hour")
            ).scalar_one()
        gpu_days = gpus * steps * step.total_seconds() / 86400
        print("\nstorage after VACUUM (table + TOAST + indexes)")
        for table, size in sizes.items():
            print(f"  {table:<16} {_fmt_mb(size):>12}  {size / gpu_days:12,.0f} bytes per GPU-day"
                  + (f"  ({size / stored_windows:.0f} bytes per window)" if table == "window store" else ""))  # fmt: skip
        print(f"  windows stored: {stored_windows:,} ({gpu_days:,.1f} GPU-days), {packed:,} of them packed "
              "(hours that ended PACK_DELAY before a run)")  # fmt: skip

        seconds = time_reports(engine, config, end)
        print(f"\nreports over {end:%Y-%m} (best of 2), target < {TARGET_REPORT_SECONDS:g} s")
        for name, u in seconds.items():
            print(
                f"  {name:<10} {u.wall:7.3f} s  {'met' if u.wall < TARGET_REPORT_SECONDS else 'NOT met'}  ({u})"
            )
        return 0


if __name__ == "__main__":
    sys.exit(main())
