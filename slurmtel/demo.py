"""`slurmtel demo`: the first thing a new user runs. No Slurm, GPU or PostgreSQL needed.

It starts an embedded PostgreSQL of its own (<state_dir>/demo, emptied on every run, never a
configured database), simulates a week of a small GPU cluster (slurmtel.simulate), and feeds
what that cluster would print through the real parsers and the real daemon jobs:

- sacct: a `sacct` stand-in prints each day's `sacct --json -a -D` document, with each job's
  steps and their usage (TotalCPU, TRESUsageIn) as real sacct prints them, and the sacct
  source's daemon job polls it day by day (cursor, rescan window, upsert);
- slurmctld: a `scontrol` stand-in prints hourly `scontrol show job -d` / `show node -d`
  snapshots for the slurmctld source's daemon job;
- node agents: one real slurmtel-agent spool and HTTP server per node, filled with the week's
  window summaries, pulled over HTTP by the agent source's daemon job; five jobs with a known
  idle cause each (slurmtel.simulate.PLANTED_CAUSES: data loading, a storage stall, periodic
  checkpoints after a restore, a two-node job on a busy link, no process) run first on whole
  nodes, and their agents ship their cgroup windows and fabric port counters too, so `report
  idle --by cause`, `report checkpoints` and `job` have something to find (the other jobs
  have no host signals: their idle time is `unmeasured`);
- nccl-tests acceptance jobs (an admin's, on pairs of nodes, before and after the maintenance
  window): their StdOut files hold real published nccl-tests logs (slurmtel/data/nccl, CSCS's,
  CC0, only host and GPU names changed), read by the nccl source's daemon job;
- the attribution job, then every report, the researcher and finance views, a chargeback CSV
  and a job's utilisation plot. Its config has a `[cost]` example and budgets sized from the
  simulated usage (one account over, one running out this period, the others not).

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
import os
import shlex
import shutil
import stat
import sys
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta, tzinfo
from decimal import Decimal
from pathlib import Path
from typing import TextIO

from sqlalchemy import Engine, create_engine, text

from slurmtel.agent.metrics import AgentMetrics
from slurmtel.agent.server import AgentHttpServer
from slurmtel.agent.spool import Spool
from slurmtel.agent.token import ensure_token
from slurmtel.attribution import run_attribution
from slurmtel.clock import write_clock_file
from slurmtel.config import DEFAULT_CONFIG_PATH, Config, implicit_demo_config, load_config
from slurmtel.simulate import (
    ACCEPTANCE_ACCOUNT,
    Simulation,
    World,
    sim_account_tree,
    sim_host_records,
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
from slurmtel.timeparse import month_bounds

STEPS = 8


@dataclasses.dataclass
class DemoRun:
    """What the demo produced, for the caller (and the test)."""

    directory: Path
    simulation: Simulation
    engine: Engine
    config: Config
    outputs: dict[str, Path] = dataclasses.field(default_factory=dict)
    # the job the researcher's view shows (show_views picks it)
    job: str = ""


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
    started = time.monotonic()
    run = build_demo(config, out, days=days, directory=directory)
    show_views(run, out, run_cli)
    run.engine.dispose()
    write_next_steps(run, out, seconds=time.monotonic() - started)
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
    captures, bin_dir, out_dir, acceptance = (
        home / "captures",
        home / "bin",
        home / "out",
        home / "acceptance",
    )
    world = World(
        start, days, seed=7, cluster="demo", clock_file=str(home / "clock"), captures=str(captures),
        acceptance=str(acceptance), planted=True,
    )  # fmt: skip
    sim = world.simulate(until=end)
    failed = sum(a.job.state in ("FAILED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL") for a in sim.attempts)
    progress.note(
        f"{len(sim.attempts)} job attempts ({failed} failed), {len(sim.pending_at_end)} still pending"
    )

    for folder in (captures, bin_dir, out_dir, acceptance):
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
    world_file = home / "world.json"
    world_file.write_bytes(world.to_json())
    clock_file = Path(world.clock_file)
    write_clock_file(clock_file, start)
    sacct, scontrol, sacctmgr = _stand_ins(bin_dir, world, world_file)
    config_file = home / "slurmtel.toml"
    config_file.write_text(
        DEMO_CONFIG.format(
            cluster=sim.cluster,
            timezone=config.timezone_name,
            state_dir=home,
            sacct=sacct,
            scontrol=scontrol,
            sacctmgr=sacctmgr,
            lookback=86400 * (days + 1),
            clock=clock_file,
        )
        + demo_budgets(sim, config.zone)
    )
    demo_config = load_config(config_file)
    clock = _Clock(start, clock_file)
    ctx = RunContext(config=demo_config, engine=engine, clock=clock)

    progress.step(3, "sacct: the daemon's sacct job polls `sacct --json -a -D` (with job steps) once a day")
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
    _pull_agents(ctx, demo_config, sim, home, start, end, clock, progress)

    progress.step(6, "nccl: the acceptance jobs' StdOut (real nccl-tests logs), read by the nccl job")
    source = get_source("nccl")
    outcome = run_recorded(ctx, "nccl", "scheduled", lambda: source.collect(ctx, default_options(source)))
    _check(outcome.status, outcome.message)
    progress.note(f"{outcome.result.rows_written} runs stored; {outcome.result.notes[-1]}")

    progress.step(7, "attribution: which GPUs each job held, and what they did")
    result = run_attribution(engine, demo_config, now=end)
    clock.set(end)  # the demo world's "now", for every command run with its config
    progress.note(
        f"{result.attempts} attempts, {result.rows} attempt x GPU x day rows, {result.batches} batches"
    )
    return DemoRun(home, sim, engine, demo_config)


def _pull_agents(
    ctx: RunContext,
    demo_config: Config,
    sim: Simulation,
    home: Path,
    start: datetime,
    end: datetime,
    clock: _Clock,
    progress: Progress,
) -> None:
    """Step 5: one agent spool and HTTP server per node, filled with the week's windows and
    pulled by the agent source until every spool is acked and empty."""
    agents = []
    # the agents serve only with a token; the demo's head reads it as an admin would
    token_file = home / "agent-token"
    token, _ = ensure_token(token_file)
    try:
        for node in sim.nodes:
            spool = Spool(home / f"agent-{node.name}.sqlite")
            spool.append_records([g for g in sim_inventory(sim, at=start) if g.node == node.name])
            spool.append_records(list(sim_summaries(sim, node.name)))
            spool.append_records(list(sim_host_records(sim, node.name)))
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


# The demo's own config: its embedded database under state_dir, its clock, the stand-ins for
# the Slurm commands, a price list (sites configure their own, see [[chargeback.rates]]), the
# site's monthly costs for `report cost`, and (appended: demo_budgets) budgets.
DEMO_CONFIG = """\
# written by `slurmtel demo`; `slurmtel` finds it when no other config is given (no --config,
# $SLURMTEL_CONFIG or /etc/slurmtel/slurmtel.toml), else: slurmtel --config {state_dir}/slurmtel.toml
# `collect sacct --once`, `collect slurmctld --once` and `run` move the simulated cluster on
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

# the acceptance jobs' (nccl-allreduce) StdOut files, read once each job has ended
[sources.nccl]
enabled = true
lookback_seconds = {lookback}

# the account tree (budgets cover sub-accounts; statements roll up by parent)
[access]
sacctmgr_command = "{sacctmgr}"

# the daemon (`run`) on any free port of this host, next to a real one on 9768
[daemon]
listen_address = "127.0.0.1"
port = 0

# what the 16 GPUs cost the site a month (`report cost`); examples, not anyone's prices
[cost]
compute_per_month = "18000.00"
network_per_month = "1500.00"
storage_per_month = "2000.00"
support_per_month = "1200.00"
operations_per_month = "5300.00"
unit = "completed_jobs"
# a cloud's on-demand H100 GPU-hour, for comparison
baseline_price_per_gpu_hour = "4.00"
# useful GPU-hours a month the site must deliver: how many GPUs that takes
target_gpu_hours_per_month = "10000"

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
PRICE_PER_GPU_HOUR = Decimal("2.40")


def demo_budgets(sim: Simulation, zone: tzinfo) -> str:
    """[[chargeback.budgets]] for the simulated accounts, sized from their usage in the period
    that holds the demo's end (a month, else a quarter or year when the month began less than
    two days before it): the busiest account is already over, the next runs out before the
    period ends, one has a budget in money that lasts, the rest GPU-hour budgets that last."""
    end = sim.end_at
    local = end.astimezone(zone)
    periods = [
        ("month", f"{local:%Y-%m}"),
        ("quarter", f"{local.year}-{3 * ((local.month - 1) // 3) + 1:02d}"),
        ("year", f"{local.year}-01"),
    ]
    # the shortest period that began two days or more before the end (else the year)
    period, first_month = next(
        ((p, first) for p, first in periods if end - month_bounds(first, zone)[0] >= timedelta(days=2)),
        periods[-1],
    )
    period_start = month_bounds(first_month, zone)[0]
    months = {"month": 1, "quarter": 3, "year": 12}[period]
    year, month = divmod(int(first_month[:4]) * 12 + int(first_month[5:]) - 1 + months, 12)
    period_end = month_bounds(f"{year}-{month + 1:02d}", zone)[0]
    used: dict[str, float] = {}
    for attempt in sim.attempts:
        job = attempt.job
        if job.start_at is None or job.account == ACCEPTANCE_ACCOUNT:
            continue
        lo, hi = max(job.start_at, period_start), min(job.end_at or end, end)
        if hi > lo:
            used[job.account] = used.get(job.account, 0.0) + job.gpus * (hi - lo).total_seconds() / 3600
    elapsed_days = max((end - period_start).total_seconds() / 86400, 1.0)
    remaining_days = (period_end - end).total_seconds() / 86400
    lines = [
        f"\n# budgets per {period}, sized by the demo from each account's simulated use this {period}:",
        "# one already over, one running out before the period ends, the others lasting",
    ]
    for rank, account in enumerate(sorted(used, key=lambda a: (-used[a], a))):
        hours, burn = used[account], used[account] / elapsed_days
        if rank == 0:
            budget = f'gpu_hours = "{_nice(hours * 0.9)}"'
        elif rank == 1:
            budget = f'gpu_hours = "{_nice(hours + burn * remaining_days * 0.5)}"'
        elif rank == 2:
            amount = Decimal(_nice(2 * (hours + burn * remaining_days))) * PRICE_PER_GPU_HOUR
            budget = f'amount = "{amount:.2f}"'
        else:
            budget = f'gpu_hours = "{_nice(3 * (hours + burn * remaining_days))}"'
        lines += ["[[chargeback.budgets]]", f'account = "{account}"', f'period = "{period}"', budget, ""]
    return "\n".join(lines)


def _nice(hours: float) -> int:
    """HOURS rounded to a budget's round number: 2 significant digits, at least 10."""
    hours = max(hours, 10.0)
    step = 10 ** max(0, len(str(int(hours))) - 2)
    return int(round(hours / step) * step)


def show_views(run: DemoRun, out: TextIO, run_cli: Callable[[list[str]], int]) -> None:
    """Step 8: every report, what a researcher and finance see - the real commands, run here
    through RUN_CLI (slurmtel.cli.main, handed in: importing the CLI from here would be an
    import cycle). Each is printed as the user types it (next_command)."""

    out.write(f"[8/{STEPS}] the views (the same commands work on a real cluster)\n")
    sim, config_file = run.simulation, str(run.directory / "slurmtel.toml")
    start, end = (f"{t.astimezone(run.config.zone):%Y-%m-%dT%H:%M:%S}" for t in (sim.start_at, sim.end_at))
    window = ["-S", start, "-E", end]
    out_dir = run.directory / "out"
    job = _most_idle_job(run)
    month = f"{sim.start_at.astimezone(run.config.zone):%Y-%m}"
    run.outputs["plot"] = out_dir / f"job-{job}.png"
    run.outputs["chargeback"] = out_dir / f"chargeback-{month}.csv"
    run.job = job
    views = [
        ("admin: GPU-hours, failures and queue wait by account", ["report", "usage", *window]),
        ("admin: failed GPU-hours", ["report", "failures", *window, "--top", "5"]),
        ("admin: GPUs allocated but idle", ["report", "idle", *window, "--top", "5"]),
        ("admin: where every installed GPU-hour went", ["report", "taxonomy", *window]),
        ("admin: the queue", ["report", "queue", *window]),
        ("admin: the nodes", ["report", "nodes", *window]),
        ("admin: nodes that differ from their partition", ["report", "nodes", "--drift"]),
        ("admin: capacity, and what was useful", ["report", "capacity", *window]),
        ("admin: requeued and resubmitted work", ["report", "retries", *window]),
        ("admin: the fabric's acceptance runs against their baseline", ["report", "fabric", *window]),
        ("researcher: one job's GPUs, with advice", ["job", job, "--plot", str(run.outputs["plot"])]),
        ("researcher: my month", ["me", "--user", _busiest_user(run), "--month", month]),
        ("finance: what a useful GPU-hour cost, against a cloud's", ["report", "cost", *window]),
        ("finance: budgets: used, committed, remaining, projected", ["report", "budget"]),
        ("finance: the monthly statement", ["chargeback", "--month", month, "--format", "table"]),
        ("finance: the same as CSV, for the ledger",
         ["chargeback", "--month", month, "--output", str(run.outputs["chargeback"])]),
    ]  # fmt: skip
    for title, argv in views:
        out.write(f"\n### {title}\n$ {next_command(run, argv)}\n")
        out.flush()
        with _stdout(out):
            try:
                status = run_cli(["--config", config_file, "--log-level", "WARNING", *argv])
            except SystemExit as exc:  # a usage error argparse found: the demo goes on
                status = exc.code if isinstance(exc.code, int) else 2
        if status != 0:
            out.write(f"(exit status {status})\n")


def found_without_config(run: DemoRun) -> bool:
    """Whether a plain `slurmtel` (no --config) reads the demo's config (implicit_demo_config)."""
    found = implicit_demo_config()
    return found is not None and found.resolve() == (run.directory / "slurmtel.toml").resolve()


def program() -> str:
    """How to call slurmtel next: `slurmtel` when that is this program on PATH, else the path it
    was called by (`.venv/bin/slurmtel` from the checkout, without an activated venv)."""
    called = sys.argv[0] if sys.argv else ""
    if Path(called).name != "slurmtel":
        return "slurmtel"  # python -m slurmtel, or a test calling main()
    on_path = shutil.which("slurmtel")
    with contextlib.suppress(OSError):
        if on_path and os.path.samefile(on_path, called):
            return "slurmtel"
    return shlex.quote(called)


def next_command(run: DemoRun, argv: list[str]) -> str:
    """ARGV as the user types it after the demo: without --config when slurmtel finds the demo's."""
    config = (
        "" if found_without_config(run) else f" --config {shlex.quote(str(run.directory / 'slurmtel.toml'))}"
    )
    return f"{program()}{config} {shlex.join(argv)}"


def write_next_steps(run: DemoRun, out: TextIO, *, seconds: float) -> None:
    """The demo's last lines: how long it took, where its files are, what to type next."""
    out.write(f"\ndemo took {seconds:.1f} s. Everything it wrote is under {run.directory}\n")
    out.write(
        f"Its world stands still at {run.simulation.end_at:%Y-%m-%d %H:%M} UTC (site.clock) until "
        "`collect sacct --once` (or slurmctld, or `run`) moves it on.\n"
    )
    if found_without_config(run):
        out.write(
            "Next, try these (slurmtel reads the demo's config while there is no --config, "
            f"$SLURMTEL_CONFIG or {DEFAULT_CONFIG_PATH}):\n"
        )
    else:
        reason = _why_not_found(run)
        out.write(
            f"Next, try these (with --config: {reason}, so slurmtel does not read the demo's by itself):\n"
        )
    for argv in next_commands(run):
        out.write(f"  {next_command(run, argv)}\n")
    write_pages_steps(run, out)


def write_pages_steps(run: DemoRun, out: TextIO) -> None:
    """How to open the pages on the demo's data: serve with the local development identity
    (loopback only), then the job page, my month, the reports and the statement."""
    port = run.config.api.port
    month = f"{run.simulation.start_at.astimezone(run.config.zone):%Y-%m}"
    base = f"http://127.0.0.1:{port}"
    out.write(
        "The pages, in a browser on this machine (--dev-user is a local development identity: every "
        "request from this machine is that user, and serve refuses it on any address but 127.0.0.1 or ::1):\n"
        f"  start: {next_command(run, ['serve', '--dev-user', 'root', '--listen', '127.0.0.1'])}\n"
        f"  open:  {base}/jobs/{run.job} {base}/me?user={_busiest_user(run)} {base}/reports "
        f"{base}/finance/{month}\n"
        f"  (root is an admin and sees finance too; --dev-user {_busiest_user(run)} shows what that "
        "researcher sees: their own jobs)\n"
    )


def _why_not_found(run: DemoRun) -> str:
    """Why a plain `slurmtel` would not read the demo's config (implicit_demo_config's rules)."""
    if os.environ.get("SLURMTEL_CONFIG"):
        return "$SLURMTEL_CONFIG is set"
    if DEFAULT_CONFIG_PATH.exists():
        return f"{DEFAULT_CONFIG_PATH} is there"
    if os.environ.get("SLURMTEL_DATABASE_URL", "").strip():
        return "$SLURMTEL_DATABASE_URL is set"
    return f"the demo's folder {run.directory} is not in your own state directory"


def next_commands(run: DemoRun) -> list[list[str]]:
    """What to try after the demo (the README lists the same, for the default week)."""
    return [
        ["report", "usage", "-S", "now-7days"],
        ["report", "idle", "-S", "now-7days", "--top", "5"],
        ["report", "idle", "--by", "cause", "-S", "now-7days"],
        ["report", "budget"],
        ["job", run.job or "", "--plot", f"job-{run.job}.png"],
        ["me", "--user", _busiest_user(run), "--jobs"],
        ["collect", "sacct", "--once"],
    ]


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


def _stand_ins(bin_dir: Path, world: World, world_file: Path) -> tuple[str, str, str]:
    """`sacct` and `scontrol` stand-ins that print the world as of its clock: the capture
    written for that instant, or a fresh one simulated up to it (after `collect --once` or
    `run` moved the clock on); and `sacctmgr`'s, which prints the account tree (no
    coordinators, no GrpTRESMins). Everything they read is named in them: no environment."""
    captures, clock = shlex.quote(world.captures), shlex.quote(world.clock_file)
    simulate = f"{shlex.quote(sys.executable)} -m slurmtel.simulate --world {shlex.quote(str(world_file))}"

    def fresh(kind: str) -> str:
        return (
            f'[ "$(cat {captures}/{kind}.at 2>/dev/null)" = "$(cat {clock})" ] '
            f"|| {simulate} {kind} || exit 1\n"
        )

    sacct = _stand_in(bin_dir / "sacct", fresh("sacct") + f"exec cat {captures}/sacct.json\n")
    # the accounts do not change: their tree is printed as written once
    (Path(world.captures) / "sacctmgr-account-withassoc.psv").write_text(sim_account_tree(world.cluster))
    sacctmgr = _stand_in(
        bin_dir / "sacctmgr",
        'case "$*" in\n'
        f'*"show account withassoc"*) exec cat {captures}/sacctmgr-account-withassoc.psv;;\n'
        '*"show user withcoord"*|*"show assoc"*) ;;\n'
        '*) echo "sacctmgr: demo stand-in: $*" >&2; exit 1;;\nesac\n',
    )
    scontrol = _stand_in(
        bin_dir / "scontrol",
        'case "$1 $2" in\n'
        '"show job"|"show node")\n'
        f"  {fresh('scontrol')}"
        f'  exec cat {captures}/scontrol-"$2".txt;;\n'
        f'"show config") echo "ClusterName             = {world.cluster}";;\n'
        '*) echo "scontrol: demo stand-in: $*" >&2; exit 1;;\nesac\n',
    )
    return sacct, scontrol, sacctmgr


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
