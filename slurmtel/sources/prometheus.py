"""The prometheus source: dcgm-exporter's series from a Prometheus-compatible server.

Where the site's Prometheus (or Thanos, Mimir, VictoriaMetrics: anything that answers
`/api/v1/query_range`) already scrapes dcgm-exporter, the head reads the DCGM series from it
instead of scraping every node itself. Each run reads the steps from the stored cursor to now
minus `delay_seconds`, in queries of at most `max_points_per_series` points per series and
`nodes_per_query` nodes (the node label's values in the window come from
`/api/v1/label/NAME/values` first), and moves the cursor on after each stretch of time. A
window [t, t + step) gets `last_over_time(METRIC[step - 1ms])` at t: the latest reading in
(t - step, t], never an older one (no five-minute staleness carried into a gap), and each
reading stands for one window only. Each query asks for the window before its first too, for
the energy counter's increase. The series come back with their DCGM field in a label of their
own (FIELD_LABEL), so a renamed metric (`metric_names`) is read with its field's unit.

The samples of one node at one instant become the DcgmScrape a `/metrics` scrape gives, and
go through the dcgm summariser into the same gpu_summary and gpu_inventory rows (source
"prometheus"); the natural keys keep an overlapping or repeated range from being stored twice.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from slurmtel.config import Config
from slurmtel.errors import ConfigError, SlurmtelError, SourceUnavailable
from slurmtel.parsers.prometheus import (
    matrix_scrapes,
    parse_prometheus_matrix,
)
from slurmtel.records import GpuInventory, GpuSummary
from slurmtel.sources.base import RunContext, RunResult, time_option
from slurmtel.sources.promapi import PrometheusApi, _ceil, _floor, _span, screened_nodes, time_chunks

if TYPE_CHECKING:
    from slurmtel.store.telemetry import PartitionBudget

NAME = "prometheus"
# stretches of time (max_points_per_series steps each) per run: bounds one run after a long
# pause (the rest comes next run, the cursor moved on stretch by stretch)
MAX_CHUNKS_PER_RUN = 100


class PrometheusSource:
    name = NAME
    description = "dcgm-exporter's GPU series read from a Prometheus-compatible server (/api/v1/query_range)"

    def enabled(self, config: Config) -> bool:
        return config.sources.prometheus.enabled

    def interval_seconds(self, config: Config) -> int:
        return config.sources.prometheus.interval_seconds

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "-S",
            "--starttime",
            dest="start",
            default=None,
            help="read the windows from this time on (sacct time forms), leaving the cursor alone: a "
            "backfill; default: after the cursor",
        )
        parser.add_argument(
            "-E",
            "--endtime",
            dest="end",
            default=None,
            help="read the windows up to this time (default: now minus sources.prometheus.delay_seconds)",
        )

    def collect(self, ctx: RunContext, options: argparse.Namespace) -> RunResult:
        from slurmtel.sources.plausible import plausible_range
        from slurmtel.store.runs import get_cursor, set_cursor
        from slurmtel.store.telemetry import PartitionBudget

        cfg = ctx.config.sources.prometheus
        if not cfg.url:
            raise ConfigError("sources.prometheus.url is not set")
        api = PrometheusApi(cfg)
        step = cfg.step_seconds
        now = ctx.clock()
        scope = api.base_url
        explicit_start = time_option(getattr(options, "start", None), now, ctx.config.zone, "-S")
        explicit_end = time_option(getattr(options, "end", None), now, ctx.config.zone, "-E")
        # an explicit window is a backfill: it neither reads nor moves the cursor
        backfill = explicit_start is not None or explicit_end is not None
        cursor = None
        if not backfill:
            with ctx.engine.connect() as conn:
                cursor = get_cursor(conn, NAME, scope)
        earliest, _ = plausible_range(now, ctx.config.telemetry)
        end = _floor(explicit_end or now - timedelta(seconds=cfg.delay_seconds), step)
        if explicit_start is not None:
            start = _ceil(explicit_start, step)
        elif cursor is not None:
            start = cursor + timedelta(seconds=step)
        else:
            start = _floor(now - timedelta(seconds=cfg.initial_lookback_seconds), step)
        # windows older than the retention would be quarantined one by one: not asked for
        start = max(start, _ceil(earliest + timedelta(seconds=step), step))
        result = RunResult()
        if start > end:
            what = (
                "the window is empty"
                if backfill
                else f"the cursor is at {cursor.isoformat() if cursor else '-'}"
            )
            result.notes.append(f"nothing new: {what}")
            return result
        chunks = list(time_chunks(start, end, step, cfg.max_points_per_series))
        if len(chunks) > MAX_CHUNKS_PER_RUN and not backfill:
            chunks = chunks[:MAX_CHUNKS_PER_RUN]
            result.notes.append("backlog left for the next run")
        result.window_start_at, result.window_end_at = chunks[0][0], chunks[-1][1]
        budget = PartitionBudget(ctx.config.telemetry.max_new_partitions_per_run)
        node_values = api.node_values(chunks[0][0] - timedelta(seconds=step), chunks[-1][1])
        groups = [
            node_values[i : i + cfg.nodes_per_query] for i in range(0, len(node_values), cfg.nodes_per_query)
        ]
        try:
            for chunk_start, chunk_end in chunks:
                for group in groups:
                    raw = api.query_range(group, chunk_start - timedelta(seconds=step), chunk_end)
                    origin = f"{api.base_url} {_span(chunk_start, chunk_end)}"
                    store_matrix(ctx, raw, result, budget, origin=origin, since=chunk_start)
                if not backfill:
                    with ctx.engine.begin() as conn:
                        set_cursor(conn, NAME, scope, chunk_end)
        except SlurmtelError as exc:
            # what the stretches before stored stays, and so does the cursor they moved
            exc.partial_result = result
            raise
        result.notes.append(
            f"{len(chunks)} stretch(es) of up to {cfg.max_points_per_series} steps x {len(groups)} node "
            f"group(s) = {api.queries} queries; {len(node_values)} nodes"
        )
        return result

    def ingest(self, ctx: RunContext, path: Path, options: argparse.Namespace) -> RunResult:
        """Store a saved `/api/v1/query_range` answer (its series must carry their names and the
        node label); the cursor is left alone."""
        from slurmtel.store.telemetry import PartitionBudget

        try:
            raw = path.read_bytes()
        except OSError as exc:
            raise SourceUnavailable(f"cannot read {path}: {exc.strerror}") from exc
        result = RunResult()
        budget = PartitionBudget(ctx.config.telemetry.max_new_partitions_per_run)
        store_matrix(ctx, raw, result, budget, origin=str(path), since=None)
        return result


def store_matrix(
    ctx: RunContext,
    raw: bytes,
    result: RunResult,
    budget: PartitionBudget,
    *,
    origin: str,
    since: datetime | None,
) -> None:
    """Parse one query_range answer and store its windows (from SINCE on) and inventory, every
    node's in the one transaction of the answer: the inventory in one statement, the windows
    as one group per node, the allocations waiting for those nodes' GPU UUIDs in one."""
    from slurmtel.store.checks import rejections
    from slurmtel.store.quarantine import quarantine
    from slurmtel.store.samples import sample_store
    from slurmtel.store.telemetry import resolve_allocation_uuids, write_inventory

    cfg = ctx.config.sources.prometheus
    matrix = parse_prometheus_matrix(raw, origin=origin)
    scrapes, rejected = matrix_scrapes(matrix, node_label=cfg.node_label, origin=origin)
    rejected = [*matrix.rejected, *rejected]
    result.rows_read += matrix.points
    inventory: list[GpuInventory] = []
    groups: list[tuple[str, Sequence[GpuSummary]]] = []
    for node, kept, screened in screened_nodes(
        scrapes, ctx.config, since=since, now=ctx.clock(), origin=origin, inventory=True
    ):
        inventory += screened.inventory
        groups.append((node, screened.summaries))
        rejected += [r for s in kept for r in s.rejected]
        rejected += screened.rejected
        dropped: dict[str, int] = {}
        for scrape in kept:
            for name, count in scrape.dropped.items():
                dropped[name] = dropped.get(name, 0) + count
        if dropped:
            text = ", ".join(f"{k} {v}" for k, v in sorted(dropped.items()))
            result.notes.append(f"{node}: impossible values dropped: {text}")
    with ctx.engine.begin() as conn:
        write_inventory(conn, inventory, source=NAME)
        stats = sample_store(ctx.config).write_groups(conn, groups, source=NAME, partition_budget=budget)
        resolve_allocation_uuids(conn, nodes=[node for node, _ in groups])
        for (node, _), node_stats in zip(groups, stats, strict=True):
            result.rows_written += node_stats.inserted
            rejected += rejections(node_stats.refused, source=NAME, origin=f"{origin} {node}")
        quarantine(conn, rejected)
    result.rows_quarantined += len(rejected)
    for warning in matrix.warnings:
        result.notes.append(f"{origin}: the server warns: {warning}")
