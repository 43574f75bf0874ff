"""The ingest boundary of telemetry: what a node's clock can plausibly say, and what it cannot.

A GPU node whose clock is off (a dead RTC battery, no NTP, a VM restored from a snapshot)
dates its windows and events years away from the head's clock. Stored, such a window would
need a partition of its own and would fall outside every report; created for every day in
between, partitions would exhaust PostgreSQL's lock memory. So before anything is written,
windows, events and inventory dated before `now - telemetry.retention_days` (windows would be
dropped with their partition at once) or after `now + telemetry.max_future_seconds` are
quarantined with their reason, and the rest of their page or scrape is stored as usual.

This check sits here, in front of the store, so it holds whatever the store does with the
windows it gets.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, TypeVar

from slurmtel.config import TelemetryConfig
from slurmtel.records import GpuEvent, GpuInventory, GpuSummary

if TYPE_CHECKING:
    from slurmtel.records import Rejected

T = TypeVar("T", GpuSummary, GpuEvent, GpuInventory)


def plausible_range(now: datetime, telemetry: TelemetryConfig) -> tuple[datetime, datetime]:
    """(earliest, latest) time a window or event may carry when the head's clock says NOW."""
    return (
        now - timedelta(days=telemetry.retention_days),
        now + timedelta(seconds=telemetry.max_future_seconds),
    )


def _when(record: GpuSummary | GpuEvent | GpuInventory) -> object:
    if isinstance(record, GpuSummary):
        return record.window_start_at
    return record.at if isinstance(record, GpuEvent) else record.observed_at


def split_plausible(
    records: Iterable[T], *, now: datetime, telemetry: TelemetryConfig, source: str, origin: str
) -> tuple[list[T], list[Rejected]]:
    """RECORDS dated inside the plausible range, and a Rejected for each one outside it.

    A record whose time is no aware datetime at all passes: the store refuses it by name.
    """
    from slurmtel.store.checks import rejection

    earliest, latest = plausible_range(now, telemetry)
    kept: list[T] = []
    refused: list[Rejected] = []
    # the windows of a page share few starts: each start is compared once
    plausible: dict[datetime, bool] = {}
    for record in records:
        at = record.window_start_at if type(record) is GpuSummary else _when(record)
        if not isinstance(at, datetime) or at.tzinfo is None:
            kept.append(record)
            continue
        fits = plausible.get(at)
        if fits is None:
            fits = plausible[at] = earliest <= at <= latest
        if fits:
            kept.append(record)
            continue
        what = {GpuSummary: "window starts", GpuEvent: "event is dated"}.get(
            type(record), "inventory was seen"
        )
        if at < earliest:
            reason = (
                f"clock skew: its {what} at {at.isoformat()}, more than telemetry.retention_days "
                f"({telemetry.retention_days}) before the head's clock ({now.isoformat()})"
            )
        else:
            reason = (
                f"clock skew: its {what} at {at.isoformat()}, more than telemetry.max_future_seconds "
                f"({telemetry.max_future_seconds}) after the head's clock ({now.isoformat()})"
            )
        refused.append(rejection(record, reason, source=source, origin=origin))
    return kept, refused


@dataclass(frozen=True)
class Screened:
    """What of a page or scrape may go to the store, and what is quarantined instead."""

    summaries: list[GpuSummary]
    events: list[GpuEvent]
    inventory: list[GpuInventory]
    rejected: list[Rejected]


def screen_telemetry(
    *,
    now: datetime,
    telemetry: TelemetryConfig,
    source: str,
    origin: str,
    summaries: Sequence[GpuSummary] = (),
    events: Sequence[GpuEvent] = (),
    inventory: Sequence[GpuInventory] = (),
) -> Screened:
    """The ingest boundary of one page or scrape: records dated outside the plausible range,
    and events and inventory no column can hold (checked here: they are written row by row),
    become Rejected; the rest goes on to the store (which checks summaries itself)."""
    from slurmtel.store.checks import EVENT_COLUMNS, INVENTORY_COLUMNS, split_storable

    kept_summaries, rejected = split_plausible(
        summaries, now=now, telemetry=telemetry, source=source, origin=origin
    )
    # (most pages hold windows alone: no passes over what a page does not hold)
    kept_events: list[GpuEvent] = []
    kept_inventory: list[GpuInventory] = []
    if events:
        kept_events, skewed = split_plausible(
            events, now=now, telemetry=telemetry, source=source, origin=origin
        )
        rejected += skewed
    if inventory:
        kept_inventory, skewed = split_plausible(
            inventory, now=now, telemetry=telemetry, source=source, origin=origin
        )
        rejected += skewed
    if kept_events:
        kept_events, refused = split_storable(kept_events, EVENT_COLUMNS, source=source, origin=origin)
        rejected += refused
    if kept_inventory:
        kept_inventory, refused = split_storable(
            kept_inventory, INVENTORY_COLUMNS, source=source, origin=origin
        )
        rejected += refused
    return Screened(kept_summaries, kept_events, kept_inventory, rejected)


__all__ = ["Screened", "plausible_range", "screen_telemetry", "split_plausible"]
