"""`slurmtel demo`: the first thing a new user runs.

It always works in its own embedded PostgreSQL under <state_dir>/demo, never in a configured
database, so trying it on a head node cannot touch production data.
"""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from importlib import resources
from pathlib import Path
from typing import TextIO

from slurmtel.access import EVERYTHING
from slurmtel.config import Config
from slurmtel.reports.render import render
from slurmtel.sources import default_options, get_source
from slurmtel.sources.base import RunContext, utc_now
from slurmtel.sources.runner import run_recorded
from slurmtel.store.embedded import embedded_url
from slurmtel.store.engine import make_engine
from slurmtel.store.migrate import upgrade
from slurmtel.store.usage import usage_report

# the bundled capture's scenario ran inside this window (fixtures/slurm-22.05/scenario-window.txt)
LAB_WINDOW = (datetime(2026, 12, 2, 12, 0, tzinfo=UTC), datetime(2026, 12, 2, 14, 0, tzinfo=UTC))


def run_demo(config: Config, out: TextIO) -> int:
    state = config.state_dir() / "demo"
    out.write(f"[1/3] starting the embedded PostgreSQL in {state}\n")
    demo_config = dataclasses.replace(
        config, database=dataclasses.replace(config.database, url=embedded_url(state))
    )
    engine = make_engine(demo_config)
    upgrade(engine)
    ctx = RunContext(config=demo_config, engine=engine, clock=utc_now)
    capture = Path(str(resources.files("slurmtel").joinpath("data/lab-sacct-a-D.json")))
    out.write(f"[2/3] ingesting a real sacct --json capture (Slurm 22.05, 17 jobs): {capture.name}\n")
    source = get_source("sacct")
    outcome = run_recorded(
        ctx, "sacct", "input", lambda: source.ingest(ctx, capture, default_options(source))
    )
    for note in outcome.result.notes:
        out.write(f"      {note}\n")
    out.write("[3/3] GPU-hours by account\n\n")
    start, end = LAB_WINDOW
    with engine.connect() as conn:
        rows = usage_report(conn, start=start, end=end, now=end, by="account", scope=EVERYTHING)
    columns = [
        "cluster",
        "account",
        "jobs",
        "attempts",
        "requeues",
        "allocated_gpu_hours",
        "failed_gpu_seconds",
        "queue_wait_p50_seconds",
        "queue_wait_max_seconds",
    ]
    render(rows, out, "table", columns=columns, title=f"GPU usage {start:%Y-%m-%d %H:%M} .. {end:%H:%M} UTC")
    engine.dispose()
    return 0 if outcome.status == "ok" else 1
