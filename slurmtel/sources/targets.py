"""Per-node HTTP endpoints of the scraped sources (dcgm-exporter, slurmtel-agent).

Targets come from config (`targets`) and, with `discover_nodes`, from Slurm's list of nodes
with GPUs. A target is "node" (host = node name), "node=host:port" or a full URL.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from urllib.parse import urlparse

from slurmtel.config import ScrapeTargetsConfig
from slurmtel.errors import ConfigError, SlurmtelError, SourceUnavailable
from slurmtel.parsers.sinfo_nodes import SINFO_NODE_FORMAT, parse_sinfo_gpu_nodes
from slurmtel.sources.base import RunResult
from slurmtel.sources.io import run_command


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
    targets: Sequence[Target], work: Callable[[Target], None], result: RunResult, what: str
) -> None:
    """Run WORK for every target; a target that fails is noted in RESULT (the run is then
    partial) and never stops the others. Raises SourceUnavailable when none answered."""
    failures = []
    for target in targets:
        try:
            work(target)
        except SlurmtelError as exc:
            failures.append(f"{target.node}: {exc}")
    result.errors.extend(failures)
    if failures and len(failures) == len(targets):
        raise SourceUnavailable(f"no {what} answered: " + "; ".join(failures[:5]))
