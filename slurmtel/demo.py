"""`slurmtel demo`: the first thing a new user runs. No Slurm, GPU or PostgreSQL needed.

It starts an embedded PostgreSQL of its own (<state_dir>/demo, emptied on every run, never a
configured database), simulates a week of a small GPU cluster (slurmtel.simulate), and feeds
what that cluster would print through the real parsers and the real daemon jobs:

- sacct: a `sacct` stand-in prints each day's `sacct --json -a -D -X` document, and the
  sacct source's daemon job polls it day by day (cursor, rescan window, upsert);
- slurmctld: a `scontrol` stand-in prints hourly `scontrol show job -d` / `show node -d`
  snapshots for the slurmctld source's daemon job;
- node agents: one real slurmtel-agent spool and HTTP server per node, filled with the week's
  window summaries, pulled over HTTP by the agent source's daemon job;
- the attribution job, then the admin, researcher and finance views, a chargeback CSV and a
  job's utilisation plot.

Its world is consistent at its end: the demo's "now" is the end of the simulated week, kept
in <state_dir>/demo/clock, which its config names as site.clock, so every command run with
that config reads that instant (jobs running then are shown as running as of it, and do not
grow while nobody collects). sacct, the controller and the agents agree on what runs then.
The stand-ins print the world as of the clock (slurmtel.simulate.World, world.json), with
nothing from the environment: `collect sacct|slurmctld --once` and `run` move the clock on and
the simulated cluster goes on from where it stopped. The node agents served only while the
demo ran (a live HTTP server per node), so the config leaves the agent source off.
"""

from __future__ import annotations

import contextlib
import dataclasses
import shlex
import shutil
import stat
import sys
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TextIO

from sqlalchemy import Engine, create_engine, text

from slurmtel.agent.metrics import AgentMetrics
from slurmtel.agent.server import AgentHttpServer
from slurmtel.agent.spool import Spool
from slurmtel.agent.token import ensure_token
from slurmtel.attribution import run_attribution
from slurmtel.clock import write_clock_file
from slurmtel.config import Config, load_config
from slurmtel.simulate import (
    Simulation,
    World,
    sim_inventory,
    sim_summaries,
    write_captures,
)
from slurmtel.sources import default_options, get_source
from slurmtel.sources.base import RunContext
from slurmtel.sources.runner import run_recorded
from slurmtel.store.embedded import embedded_url
from slurmtel.store.engine import make_engine
from slurmtel.store.migrate import upgrade

STEPS = 7


@dataclasses.dataclass
class DemoRun:
    """What the demo produced, for the caller (and the test)."""

    directory: Path
    simulation: Simulation
    engine: Engine
    config: Config
    outputs: dict[str, Path] = dataclasses.field(default_factory=dict)


class Progress:
    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.t0 = time.monotonic()

    def step(self, number: int, what: str) -> None:
        self.out.write(f"[{number}/{STEPS}] {what}\n")
        self.out.flush()

    def note(self, what: str) -> None:
        self.out.write(f"      {what}  ({time.monotonic() - self.t0:.0f} s)\n")
        self.out.flush()


def run_demo(
    config: Config,
    out: TextIO,
    run_cli: Callable[[list[str]], int],
    *,
    days: int = 7,
    directory: Path | None = None,
) -> int:
    run = build_demo(config, out, days=days, directory=directory)
    show_views(run, out, run_cli)
    run.engine.dispose()
    out.write(f"\nEverything the demo wrote is under {run.directory}\n")
    out.write(
        f"Its world stands still at {run.simulation.end_at:%Y-%m-%d %H:%M} UTC (site.clock) until you move it on:\n"
        f"  slurmtel --config {run.directory / 'slurmtel.toml'} collect sacct --once   (or slurmctld, or run)\n"
    )
    return 0


def build_demo(config: Config, out: TextIO, *, days: int = 7, directory: Path | None = None) -> DemoRun:
    progress = Progress(out)
    home = directory or config.state_dir() / "demo"
    home.mkdir(parents=True, exist_ok=True)
    progress.step(1, f"starting an embedded PostgreSQL in {home}")
    engine = _fresh_database(embedded_url(home))
    upgrade(engine)
    end = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    start = end - timedelta(days=days)
    progress.step(
        2, f"simulating {days} days of a 4-node, 16-GPU cluster ({start:%Y-%m-%d} .. {end:%Y-%m-%d})"
    )
    captures, bin_dir, out_dir = home / "captures", home / "bin", home / "out"
    world = World(start, days, seed=7, cluster="demo", clock_file=str(home / "clock"), captures=str(captures))
    sim = world.simulate(until=end)
    failed = sum(a.job.state in ("FAILED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL") for a in sim.attempts)
    progress.note(
        f"{len(sim.attempts)} job attempts ({failed} failed), {len(sim.pending_at_end)} still pending"
    )

    for folder in (captures, bin_dir, out_dir):
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
    world_file = home / "world.json"
    world_file.write_bytes(world.to_json())
    clock_file = Path(world.clock_file)
    write_clock_file(clock_file, start)
    sacct, scontrol = _stand_ins(bin_dir, world, world_file)
    config_file = home / "slurmtel.toml"
    config_file.write_text(
        DEMO_CONFIG.format(
            cluster=sim.cluster,
            timezone=config.timezone_name,
            state_dir=home,
            sacct=sacct,
            scontrol=scontrol,
            lookback=86400 * (days + 1),
            clock=clock_file,
        )
    )
    demo_config = load_config(config_file)
    clock = _Clock(start, clock_file)
    ctx = RunContext(config=demo_config, engine=engine, clock=clock)

    progress.step(3, "sacct: the daemon's sacct job polls `sacct --json -a -D -X` once a day")
    source = get_source("sacct")
    for day in range(1, days + 1):
        at = start + timedelta(days=day)
        clock.set(at)
        write_captures(sim, world.captures, at, ["sacct"])
        # what sacct printed that day, kept for the curious
        shutil.copyfile(captures / "sacct.json", captures / f"sacct-{at:%Y%m%d}.json")
        outcome = run_recorded(
            ctx, "sacct", "scheduled", lambda: source.collect(ctx, default_options(source))
        )
        _check(outcome.status, outcome.message)
    progress.note(outcome.result.notes[-1] if outcome.result.notes else "done")

    progress.step(
        4, "slurmctld: hourly controller snapshots (GPU indices of running jobs, node states, queue)"
    )
    source = get_source("slurmctld")
    at = start
    while at <= end:
        clock.set(at)
        write_captures(sim, world.captures, at, ["scontrol"])
        outcome = run_recorded(
            ctx, "slurmctld", "scheduled", lambda: source.collect(ctx, default_options(source))
        )
        _check(outcome.status, outcome.message)
        at += timedelta(hours=1)
    progress.note(f"{days * 24 + 1} snapshots; last: {outcome.result.notes[-1]}")

    progress.step(
        5, "node agents: a real slurmtel-agent spool and HTTP server per node, pulled by the agent job"
    )
    agents = []
    # the agents serve only with a token; the demo's head reads it as an admin would
    token_file = home / "agent-token"
    token, _ = ensure_token(token_file)
    try:
        for node in sim.nodes:
            spool = Spool(home / f"agent-{node.name}.sqlite")
            spool.append_records([g for g in sim_inventory(sim, at=start) if g.node == node.name])
            spool.append_records(list(sim_summaries(sim, node.name)))
            server = AgentHttpServer(spool, AgentMetrics(), node.name, "demo", "127.0.0.1", 0, token=token)
            server.start()
            agents.append((spool, server))
        progress.note(f"{len(agents)} agents spooled {sum(s.stats().items for s, _ in agents):,} items")
        targets = [f"{server.node}=127.0.0.1:{server.address[1]}" for _, server in agents]
        ctx = dataclasses.replace(
            ctx,
            config=dataclasses.replace(
                demo_config,
                sources=dataclasses.replace(
                    demo_config.sources,
                    # the config leaves the agent source off: these agents are gone after the demo
                    agent=dataclasses.replace(
                        demo_config.sources.agent, enabled=True, targets=targets, token_file=str(token_file)
                    ),
                ),
            ),
        )
        clock.set(end)
        source = get_source("agent")
        pulls = 0
        while any(s.stats().items for s, _ in agents) and pulls < 20:
            outcome = run_recorded(
                ctx, "agent", "scheduled", lambda: source.collect(ctx, default_options(source))
            )
            _check(outcome.status, outcome.message)
            pulls += 1
        progress.note(f"pulled in {pulls} daemon runs; every spool acked and empty")
    finally:
        for spool, server in agents:
            server.stop()
            spool.close()

    progress.step(6, "attribution: which GPUs each job held, and what they did")
    result = run_attribution(engine, demo_config, now=end)
    clock.set(end)  # the demo world's "now", for every command run with its config
    progress.note(
        f"{result.attempts} attempts, {result.rows} attempt x GPU x day rows, {result.batches} batches"
    )
    return DemoRun(home, sim, engine, demo_config)


# The demo's own config: its embedded database under state_dir, its clock, the stand-ins for
# the Slurm commands, and a price list (sites configure their own, see [[chargeback.rates]]).
DEMO_CONFIG = """\
# written by `slurmtel demo`; try: slurmtel --config {state_dir}/slurmtel.toml report idle
# and `collect sacct --once`, `collect slurmctld --once`, `run`: the simulated cluster goes on
[site]
cluster = "{cluster}"
timezone = "{timezone}"
state_dir = "{state_dir}"
# the demo world's "now" (the end of its simulated week), not the wall clock: reports print
# the same every time; `collect --once` and `run` move it on (demos and tests only)
clock = "{clock}"

[sources.sacct]
command = "{sacct}"
initial_lookback_seconds = {lookback}

[sources.slurmctld]
scontrol_command = "{scontrol}"
job_view = "scontrol_text"

# off: the demo's node agents (one HTTP server per node) served only while the demo ran, and
# their windows are in the database; after the demo no agent is there to pull, so time the
# world goes on for has no GPU telemetry (unmeasured in report taxonomy)
[sources.agent]
enabled = false
page_size = 10000

# the daemon (`run`) on any free port of this host, next to a real one on 9768
[daemon]
listen_address = "127.0.0.1"
port = 0

[chargeback]
currency = "EUR"

[[chargeback.rates]]
partition = "*"
gpu_model = "h100"
price_per_gpu_hour = "2.40"
valid_from = "2020-01-01"

[[chargeback.rates]]
partition = "debug"
gpu_model = "*"
price_per_gpu_hour = "1.20"
valid_from = "2020-01-01"
"""


def show_views(run: DemoRun, out: TextIO, run_cli: Callable[[list[str]], int]) -> None:
    """Step 7: what an admin, a researcher and finance see - the real commands, run here through
    RUN_CLI (slurmtel.cli.main, handed in: importing the CLI from here would be an import cycle)."""

    out.write(f"[7/{STEPS}] the views (the same commands work on a real cluster)\n")
    sim, config_file = run.simulation, str(run.directory / "slurmtel.toml")
    start, end = (f"{t.astimezone(run.config.zone):%Y-%m-%dT%H:%M:%S}" for t in (sim.start_at, sim.end_at))
    window = ["-S", start, "-E", end]
    out_dir = run.directory / "out"
    job = _most_idle_job(run)
    month = f"{sim.start_at.astimezone(run.config.zone):%Y-%m}"
    run.outputs["plot"] = out_dir / f"job-{job}.png"
    run.outputs["chargeback"] = out_dir / f"chargeback-{month}.csv"
    views = [
        ("admin: GPU-hours, failures and queue wait by account", ["report", "usage", *window]),
        ("admin: failed GPU-hours", ["report", "failures", *window, "--top", "5"]),
        ("admin: GPUs allocated but idle", ["report", "idle", *window, "--top", "5"]),
        ("admin: where every installed GPU-hour went", ["report", "taxonomy", *window]),
        ("admin: the queue", ["report", "queue", *window]),
        ("researcher: one job's GPUs, with advice", ["job", job, "--plot", str(run.outputs["plot"])]),
        ("researcher: my month", ["me", "--user", _busiest_user(run), "--month", month]),
        ("finance: the monthly statement", ["chargeback", "--month", month, "--format", "table"]),
        ("finance: the same as CSV, for the ledger",
         ["chargeback", "--month", month, "--output", str(run.outputs["chargeback"])]),
    ]  # fmt: skip
    for title, argv in views:
        out.write(f"\n### {title}\n$ slurmtel --config {config_file} {' '.join(argv)}\n")
        out.flush()
        with _stdout(out):
            status = run_cli(["--config", config_file, "--log-level", "WARNING", *argv])
        if status != 0:
            out.write(f"(exit status {status})\n")


def _most_idle_job(run: DemoRun) -> str:
    """The multi-GPU job that left the most GPU time idle: the researcher example."""
    with run.engine.connect() as conn:
        row = conn.execute(
            text(
                """
                SELECT a.job_id FROM gpu_attribution g JOIN job_attempt a USING (cluster, job_id_raw, submit_at)
                WHERE a.alloc_gpus > 1 GROUP BY a.job_id ORDER BY sum(g.idle_seconds) DESC, a.job_id LIMIT 1
                """
            )
        ).first()
    return str(row[0]) if row else str(run.simulation.attempts[0].job.job_id_raw)


def _busiest_user(run: DemoRun) -> str:
    counts: dict[str, int] = {}
    for attempt in run.simulation.attempts:
        counts[attempt.job.user] = counts.get(attempt.job.user, 0) + 1
    return max(sorted(counts), key=lambda u: counts[u])


@contextlib.contextmanager
def _stdout(out: TextIO) -> Iterator[None]:
    """The commands print to sys.stdout: send that to OUT while they run."""
    if out is sys.stdout:
        yield
        return
    with contextlib.redirect_stdout(out):
        yield


class _Clock:
    """The demo's clock while it builds its world: also written to the clock file the config
    names (site.clock), which the stand-ins print the world as of."""

    def __init__(self, now: datetime, path: Path) -> None:
        self.now, self.path = now, path

    def set(self, now: datetime) -> None:
        self.now = now
        write_clock_file(self.path, now)

    def __call__(self) -> datetime:
        return self.now


def _fresh_database(url: str) -> Engine:
    """Drop and recreate the demo database, so every run starts from nothing."""
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    admin = create_engine(parsed.set(database="postgres"), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{parsed.database}" WITH (FORCE)'))
        conn.execute(text(f'CREATE DATABASE "{parsed.database}"'))
    admin.dispose()
    return make_engine(Config(), url)


def _stand_ins(bin_dir: Path, world: World, world_file: Path) -> tuple[str, str]:
    """`sacct` and `scontrol` stand-ins that print the world as of its clock: the capture
    written for that instant, or a fresh one simulated up to it (after `collect --once` or
    `run` moved the clock on). Everything they read is named in them: no environment."""
    captures, clock = shlex.quote(world.captures), shlex.quote(world.clock_file)
    simulate = f"{shlex.quote(sys.executable)} -m slurmtel.simulate --world {shlex.quote(str(world_file))}"

    def fresh(kind: str) -> str:
        return (
            f'[ "$(cat {captures}/{kind}.at 2>/dev/null)" = "$(cat {clock})" ] '
            f"|| {simulate} {kind} || exit 1\n"
        )

    sacct = _stand_in(bin_dir / "sacct", fresh("sacct") + f"exec cat {captures}/sacct.json\n")
    scontrol = _stand_in(
        bin_dir / "scontrol",
        'case "$1 $2" in\n'
        '"show job"|"show node")\n'
        f"  {fresh('scontrol')}"
        f'  exec cat {captures}/scontrol-"$2".txt;;\n'
        f'"show config") echo "ClusterName             = {world.cluster}";;\n'
        '*) echo "scontrol: demo stand-in: $*" >&2; exit 1;;\nesac\n',
    )
    return sacct, scontrol


def _stand_in(path: Path, body: str) -> str:
    path.write_text(
        "#!/bin/sh\n# slurmtel demo: prints the simulated cluster as of its clock, in the real format\n"
        + body
    )
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return str(path)


def _check(status: str, message: str) -> None:
    if status == "error":
        raise RuntimeError(f"demo step failed: {message}")
