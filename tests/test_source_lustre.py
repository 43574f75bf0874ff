"""`collect lustre`: the real captures stored through the source, idempotent; a configured
command run for real (cat of a capture); a bad entry quarantined, the rest stored; a job's
traffic as increases across a counter reset."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from pathlib import Path

from sqlalchemy import Engine, text

from slurmtel.config import config_from_dict
from slurmtel.sources import default_options, get_source
from slurmtel.sources.base import RunContext
from slurmtel.sources.runner import run_recorded
from slurmtel.store.hostside import lustre_job_totals
from tests.conftest import fixture_path

WHAMCLOUD = fixture_path("lustre", "whamcloud_lctl_get_param_obdfilter_mdt_job_stats_slurm.txt")
HPE_OST = fixture_path("lustre", "hpe_lustre_exporter_obdfilter_OST0000_job_stats")


def test_ingest_and_command_store_once(ctx: RunContext, engine: Engine) -> None:
    source = get_source("lustre")
    options = default_options(source)
    result = source.ingest(ctx, WHAMCLOUD, options)
    assert result.rows_written == 16 and result.rows_quarantined == 0
    # the daemon's way: the configured command (here cat of the same capture): nothing new
    config = config_from_dict({"sources": {"lustre": {"enabled": True, "command": ["cat", str(WHAMCLOUD)]}}})
    c = replace(ctx, config=config)
    outcome = run_recorded(c, "lustre", "once", lambda: source.collect(c, options))
    assert outcome.status == "ok", outcome.message
    with engine.connect() as conn:
        rows = conn.execute(
            text("SELECT job_id, count(*) FROM lustre_job_stat GROUP BY job_id ORDER BY job_id")
        ).all()
    assert ("10", 2) in [tuple(r) for r in rows] and len(rows) == 8


def test_bad_entry_quarantined_rest_stored(ctx: RunContext, engine: Engine, tmp_path: Path) -> None:
    lines = HPE_OST.read_text().splitlines()
    lines[17] = "  write_bytes:     { samples: lots, unit: bytes }"
    capture = tmp_path / "ost.txt"
    capture.write_text("\n".join(lines) + "\n")
    source = get_source("lustre")
    options = default_options(source)
    options.target = "lustrefs-OST0000"
    result = source.ingest(ctx, capture, options)
    assert (result.rows_written, result.rows_quarantined) == (34, 1)
    with engine.connect() as conn:
        reason = conn.execute(text("SELECT reason FROM quarantine WHERE source = 'lustre'")).scalar_one()
    assert "not a counter" in reason


def test_job_totals_across_a_reset(ctx: RunContext, engine: Engine, tmp_path: Path) -> None:
    source = get_source("lustre")
    options = default_options(source)
    options.target = "lustrefs-OST0000"
    source.ingest(ctx, HPE_OST, options)
    # 60 s later job 24 wrote 1 GiB more; 60 s after that its entry was recreated (cleanup) at 4 KiB
    first = HPE_OST.read_text()
    later = first.replace("1510782606", "1510782666").replace("215147593728", str(215147593728 + 2**30))
    reset = first.replace("1510782606", "1510782726").replace("215147593728", "4096")
    for name, body in (("later", later), ("reset", reset)):
        path = tmp_path / name
        path.write_text(body)
        source.ingest(ctx, path, options)
    with engine.connect() as conn:
        start = conn.execute(
            text("SELECT min(snapshot_at) FROM lustre_job_stat WHERE job_id = '24'")
        ).scalar_one()
        totals = lustre_job_totals(conn, job_id="24", start_at=start, end_at=start + timedelta(minutes=5))
    assert totals.write_bytes == 2**30 + 4096 and totals.targets == 1
