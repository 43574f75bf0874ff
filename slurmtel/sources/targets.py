"""Per-node HTTP endpoints of the scraped sources (dcgm-exporter, slurmtel-agent).

Targets come from config (`targets`) and, with `discover_nodes`, from Slurm's list of nodes
with GPUs. A target is "node" (host = node name), "node=host:port" or a full URL.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlparse

from slurmtel.config import ScrapeTargetsConfig
from slurmtel.errors import ConfigError
from slurmtel.parsers.sinfo_nodes import SINFO_NODE_FORMAT, parse_sinfo_gpu_nodes
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
