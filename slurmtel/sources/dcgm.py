"""The dcgm source: scrape each GPU node's dcgm-exporter `/metrics`.

A scrape is one sample per GPU standing for one collection interval; it is stored in the same
shape as the node agent's window summaries. Energy is the delta of the GPU's total-energy
counter since the previous scrape this process made of it; without one (the first scrape after
a start, or a counter that went backwards) it is power x interval.
"""

from __future__ import annotations

import argparse
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from slurmtel.config import Config
from slurmtel.errors import ConfigError, SourceUnavailable
from slurmtel.sources.base import RunContext, RunResult
from slurmtel.sources.io import http_request
from slurmtel.sources.targets import Target, add_target_argument, for_each_target, targets_for
from slurmtel.timeparse import parse_slurm_time

if TYPE_CHECKING:
    from slurmtel.parsers.dcgm import DcgmScrape
    from slurmtel.records import GpuSummary
    from slurmtel.store.telemetry import PartitionBudget

NAME = "dcgm"


class DcgmSource:
    name = NAME
    description = "GPU utilisation, memory, power and energy scraped from dcgm-exporter /metrics"

    def __init__(self) -> None:
        # (gpu_uuid) -> (scrape time, energy counter in joules) of the last scrape
        self._last_energy: dict[str, tuple[datetime, float]] = {}

    def enabled(self, config: Config) -> bool:
        return config.sources.dcgm.enabled

    def interval_seconds(self, config: Config) -> int:
        return config.sources.dcgm.interval_seconds

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        add_target_argument(parser, "scrape")
        parser.add_argument(
            "--node", dest="input_node", default=None, help="with --input: the node it was scraped from"
        )
        parser.add_argument(
            "--at", dest="input_at", default=None, help="with --input: when it was scraped (sacct time forms)"
        )

    def check_options(self, options: argparse.Namespace, config: Config) -> None:
        if options.input is not None and (not options.input_node or not options.input_at):
            raise ConfigError("--input needs --node NODE and --at TIME")

    def collect(self, ctx: RunContext, options: argparse.Namespace) -> RunResult:
        from slurmtel.parsers.dcgm import parse_dcgm_metrics
        from slurmtel.store.telemetry import PartitionBudget

        cfg = ctx.config.sources.dcgm
        result = RunResult()

        budget = PartitionBudget(ctx.config.telemetry.max_new_partitions_per_run)

        def scrape(target: Target, part: RunResult) -> None:
            raw = http_request(_metrics_url(target, cfg.path), timeout_seconds=cfg.timeout_seconds)
            at = ctx.clock()
            self._store(
                ctx,
                parse_dcgm_metrics(raw.decode("utf-8", "replace"), node=target.node, at=at),
                part,
                budget,
            )

        for_each_target(
            targets_for(cfg, "sources.dcgm", options),
            scrape,
            result,
            "dcgm-exporter",
            concurrency=cfg.concurrency,
        )
        return result

    def ingest(self, ctx: RunContext, path: Path, options: argparse.Namespace) -> RunResult:
        from slurmtel.parsers.dcgm import parse_dcgm_metrics
        from slurmtel.store.telemetry import PartitionBudget

        if not options.input_node or not options.input_at:
            raise ConfigError("--input needs --node NODE and --at TIME")
        try:
            at = parse_slurm_time(options.input_at, now=ctx.clock(), zone=ctx.config.zone)
        except ValueError as exc:
            raise ConfigError(f"--at: {exc}") from exc
        try:
            raw = path.read_text(encoding="utf-8", errors="replace")
        except OSError as exc:
            raise SourceUnavailable(f"cannot read {path}: {exc.strerror}") from exc
        result = RunResult()
        budget = PartitionBudget(ctx.config.telemetry.max_new_partitions_per_run)
        self._store(ctx, parse_dcgm_metrics(raw, node=options.input_node, at=at), result, budget)
        return result

    def _store(self, ctx: RunContext, scrape: DcgmScrape, result: RunResult, budget: PartitionBudget) -> None:
        from slurmtel.parsers.dcgm import dcgm_inventory, dcgm_summaries
        from slurmtel.sources.plausible import screen_telemetry
        from slurmtel.store.checks import rejections
        from slurmtel.store.quarantine import quarantine
        from slurmtel.store.samples import sample_store
        from slurmtel.store.telemetry import resolve_allocation_uuids, write_inventory

        window = float(ctx.config.sources.dcgm.interval_seconds)
        origin = f"dcgm-exporter on {scrape.node}"
        # each summary's energy counter by its GPU, looked up once per GPU (a scan of the
        # scrape per summary made 20,000 GPUs cost minutes)
        totals = {g.gpu_uuid: g.energy_joules_total for g in scrape.gpus}
        summaries = [
            self._with_energy(s, scrape.at, totals.get(s.gpu_uuid))
            for s in dcgm_summaries(
                scrape,
                window_seconds=window,
                idle_threshold_percent=ctx.config.attribution.idle_threshold_percent,
            )
        ]
        # a scrape dated where no clock can be (collect dcgm --input --at 9999-12-31) is kept out
        screened = screen_telemetry(
            now=ctx.clock(),
            telemetry=ctx.config.telemetry,
            source=NAME,
            origin=origin,
            summaries=summaries,
            inventory=dcgm_inventory(scrape),
        )
        summaries, inventory = screened.summaries, screened.inventory
        rejected = [*scrape.rejected, *screened.rejected]
        with ctx.engine.begin() as conn:
            write_inventory(conn, inventory, source=NAME)
            stats = sample_store().write(
                conn, summaries, source=NAME, node=scrape.node, partition_budget=budget
            )
            resolve_allocation_uuids(conn, nodes=[scrape.node])
            rejected += rejections(stats.refused, source=NAME, origin=origin)
            quarantine(conn, rejected)
        result.rows_read += scrape.sample_lines
        result.rows_written += stats.inserted
        result.rows_quarantined += len(rejected)
        dropped = ", ".join(f"{k} {v}" for k, v in sorted(scrape.dropped.items()))
        result.notes.append(
            f"{scrape.node}: {len(scrape.gpus)} GPUs, {stats.inserted} new windows"
            + (f"; impossible values dropped: {dropped}" if dropped else "")
        )

    def _with_energy(self, summary: GpuSummary, at: datetime, total: float | None) -> GpuSummary:
        from slurmtel.parsers.dcgm import with_window_energy

        previous = self._last_energy.get(summary.gpu_uuid)
        if total is not None:
            self._last_energy[summary.gpu_uuid] = (at, total)
        return with_window_energy(summary, total_joules=total, previous=previous)


def _metrics_url(target: Target, path: str) -> str:
    if target.base_url.count("/") > 2:  # a full URL with its own path
        return target.base_url
    return target.base_url + path
