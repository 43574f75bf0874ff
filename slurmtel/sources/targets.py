"""Per-node HTTP endpoints of the scraped sources (dcgm-exporter, slurmtel-agent).

Targets come from config (`targets`) and, with `discover_nodes`, from Slurm's list of nodes
with GPUs. A target is "node" (host = node name), "node=host:port" or a full URL.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import urlparse

from slurmtel.config import ScrapeTargetsConfig
from slurmtel.errors import ConfigError, SlurmtelError, SourceUnavailable
from slurmtel.sources.base import RunResult
from slurmtel.sources.io import run_command
from slurmtel.threads import signals_held

if TYPE_CHECKING:
    pass


@dataclass(frozen=True)
class Target:
    node: str
    base_url: str


def parse_target(entry: str, *, port: int) -> Target:
    entry = entry.strip()
    if "://" in entry:
        parsed = urlparse(entry)
        if not parsed.hostname:
            raise ConfigError(f"target '{entry}': no host")
        node = parsed.hostname.split(".")[0]
        return Target(node, entry.rstrip("/"))
    node, sep, address = entry.partition("=")
    if not node:
        raise ConfigError(f"target '{entry}': no node name")
    host = address if sep else node
    if ":" not in host:
        host = f"{host}:{port}"
    return Target(node, f"http://{host}")


def resolve_targets(config: ScrapeTargetsConfig, extra: list[str] | None = None) -> list[Target]:
    """Configured targets, plus discovered GPU nodes; one target per node (config wins)."""
    targets = [parse_target(t, port=config.port) for t in [*config.targets, *(extra or [])]]
    if config.discover_nodes:
        known = {t.node for t in targets}
        for node in discover_gpu_nodes(config.sinfo_command, config.timeout_seconds):
            if node not in known:
                targets.append(parse_target(node, port=config.port))
    return targets


def discover_gpu_nodes(sinfo: str, timeout_seconds: int) -> list[str]:
    from slurmtel.parsers.sinfo_nodes import SINFO_NODE_FORMAT, parse_sinfo_gpu_nodes

    raw = run_command([sinfo, "-N", "-o", SINFO_NODE_FORMAT], timeout_seconds=timeout_seconds)
    return parse_sinfo_gpu_nodes(raw.decode("utf-8", "replace"))


def add_target_argument(parser: argparse.ArgumentParser, verb: str) -> None:
    parser.add_argument(
        "--target",
        dest="extra_targets",
        action="append",
        default=[],
        help=f"{verb} this target too ('node', 'node=host:port' or a URL); repeatable",
    )


def targets_for(config: ScrapeTargetsConfig, section: str, options: argparse.Namespace) -> list[Target]:
    targets = resolve_targets(config, options.extra_targets)
    if not targets:
        raise ConfigError(f"{section}: no targets (set targets, or discover_nodes = true)")
    return targets


def for_each_target(
    targets: Sequence[Target],
    work: Callable[[Target, RunResult], None],
    result: RunResult,
    what: str,
    *,
    concurrency: int = 1,
) -> None:
    """Run WORK(target, its own RunResult) for every target, CONCURRENCY targets at a time, and
    add up their results in RESULT in target order. A target that fails is noted in RESULT
    (the run is then partial) and never stops the others. Raises SourceUnavailable when none
    answered.

    Threads, not processes: a worker spends its time waiting for a node or for PostgreSQL,
    and while one waits another decodes. Each target's work runs in its own transactions.
    """

    def attempt(target: Target) -> tuple[RunResult, str | None]:
        part = RunResult()
        try:
            work(target, part)
        except SlurmtelError as exc:
            return part, f"{target.node}: {exc}"
        return part, None

    workers = max(1, min(concurrency, len(targets)))
    if workers == 1:
        outcomes = [attempt(target) for target in targets]
    else:
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix=f"slurmtel-{what}") as pool:
            with signals_held():  # (the workers start as map submits)
                running = pool.map(attempt, targets)
            outcomes = list(running)
    add_up(outcomes, result, what)


def add_up(outcomes: Sequence[tuple[RunResult, str | None]], result: RunResult, what: str) -> None:
    """Add each target's (its own RunResult, its failure or None), in target order, to RESULT;
    the failures as errors (the run is then partial). Raises SourceUnavailable when every
    target failed."""
    failures = []
    for part, failure in outcomes:
        result.rows_read += part.rows_read
        result.rows_written += part.rows_written
        result.rows_quarantined += part.rows_quarantined
        result.notes.extend(part.notes)
        result.errors.extend(part.errors)
        if failure is not None:
            failures.append(failure)
    result.errors.extend(failures)
    if failures and len(failures) == len(outcomes):
        raise SourceUnavailable(f"no {what} answered: " + "; ".join(failures[:5]))
