"""Attribution: fold telemetry into per attempt x GPU x day rollups (DESIGN §6).

Incremental and idempotent: each run recomputes only the attempts that may have changed
(see slurmtel.store.attribution), and of those only the hour slices from the end they were
computed to (or the first new telemetry) on, inside one transaction, and records which
telemetry batches it folded in. Running it twice gives identical rows; data that arrives late
is absorbed by the next run. Only one run at a time (a transaction-level advisory lock).

Then the sample store may reorganise what it has folded in (slurmtel.store.samples): PostgreSQL's
packs closed hours into one row per GPU and hour instead of one per window.

The same run keeps the resubmission links of retry chains (retry_link) up to date with the
jobs written since the last run, so retry figures in reports are as of the last run.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Engine

from slurmtel.config import Config
from slurmtel.store.attribution import (
    CauseThresholds,
    Recomputed,
    forget_host_batches,
    get_watermark,
    mark_batches,
    recompute_dirty,
    refresh_job_spans,
    select_dirty_attempts,
    set_watermark,
)
from slurmtel.store.hostside import CheckpointThresholds, refresh_checkpoints
from slurmtel.store.locks import ATTRIBUTION_LOCK_KEY, advisory_xact_lock
from slurmtel.store.retry_links import refresh_retry_links
from slurmtel.store.samples import sample_store


@dataclass(frozen=True)
class AttributionResult:
    attempts: int
    rows: int
    batches: int
    retry_links: int = 0  # links (re)written
    packed_windows: int = 0  # windows of closed hours moved into packed rows
    slices: int = 0  # attempt x GPU x hour slices recomputed (gpu_attribution_part rows written)
    windows: int = 0  # windows read into them


def run_attribution(
    engine: Engine,
    config: Config,
    *,
    now: datetime,
    full: bool = False,
    pack: bool = True,
    idle_causes: bool = True,
) -> AttributionResult:
    """Recompute the rollups of every attempt that may have changed and the retry links of
    every job that may have changed (all of them with FULL); then pack the closed hours folded
    in (unless not PACK: a benchmark's "before"). Idle GPU time by cause and checkpoint estimates
    are built beside the slices (unless not IDLE_CAUSES: a benchmark's "before")."""
    with engine.begin() as conn:
        advisory_xact_lock(conn, ATTRIBUTION_LOCK_KEY)
        job_mark = None if full else get_watermark(conn, "jobs")
        selection = select_dirty_attempts(
            conn,
            now=now,
            job_mark=job_mark,
            allocation_mark=None if full else get_watermark(conn, "allocations"),
            overlap_seconds=config.attribution.overlap_seconds,
            everything=full,
        )
        store = sample_store(config)
        # the windows of the new batches, for the job ids on each GPU (a remote store fetches them)
        store.prepare_batches(conn, selection.batches, now=now)
        refresh_job_spans(conn, selection, everything=full)
        done = (
            recompute_dirty(
                conn,
                timezone=config.timezone_name,
                full=full,
                before_read=lambda c: store.prepare_attempts(c, now=now),
                causes=CauseThresholds(
                    io_pressure_share=config.idle_causes.io_pressure_share,
                    io_bytes_per_second=config.idle_causes.io_bytes_per_second,
                    network_bytes_per_second=config.idle_causes.network_bytes_per_second,
                    cpu_saturated_share=config.idle_causes.cpu_saturated_share,
                    cpu_pressure_share=config.idle_causes.cpu_pressure_share,
                )
                if idle_causes
                else None,
            )
            if selection.attempts
            else Recomputed(0, 0, 0)
        )
        links = refresh_retry_links(
            conn,
            window_seconds=config.attribution.resubmission_window_seconds,
            job_mark=job_mark,
            overlap_seconds=config.attribution.overlap_seconds,
            full=full,
        )
        if selection.attempts and idle_causes:
            causes = config.idle_causes
            refresh_checkpoints(
                conn,
                CheckpointThresholds(
                    write_bytes=causes.checkpoint_write_bytes,
                    dip_percent=causes.checkpoint_dip_percent,
                    merge_windows=causes.checkpoint_merge_windows,
                    startup_active_percent=causes.startup_active_percent,
                ),
                now,
            )
        mark_batches(conn, selection.batches)
        forget_host_batches(conn, selection.host_batches)
        packed = store.after_attribution(conn, now=now) if pack else 0
        if selection.max_updated_at is not None:
            set_watermark(conn, "jobs", selection.max_updated_at)
        if selection.max_allocation_seen_at is not None:
            set_watermark(conn, "allocations", selection.max_allocation_seen_at)
    return AttributionResult(
        selection.attempts, done.rows, len(selection.batches), links.links, packed, done.slices, done.windows
    )
