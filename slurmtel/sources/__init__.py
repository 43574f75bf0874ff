"""The source registry: the scheduler and the CLI loop over SOURCES."""

from __future__ import annotations

import argparse

from slurmtel.sources.agent import AgentSource
from slurmtel.sources.base import Source
from slurmtel.sources.dcgm import DcgmSource
from slurmtel.sources.nccl import NcclSource
from slurmtel.sources.prometheus import PrometheusSource
from slurmtel.sources.sacct import SacctSource
from slurmtel.sources.slurmctld import SlurmctldSource

SOURCES: dict[str, Source] = {
    source.name: source
    for source in (
        SacctSource(),
        SlurmctldSource(),
        DcgmSource(),
        AgentSource(),
        NcclSource(),
        PrometheusSource(),
    )
}


def get_source(name: str) -> Source:
    try:
        return SOURCES[name]
    except KeyError:
        raise KeyError(f"unknown source '{name}' (known: {', '.join(sorted(SOURCES))})") from None


def default_options(source: Source) -> argparse.Namespace:
    """The options `slurmtel collect NAME --once` gets with no flags: what the daemon passes."""
    parser = argparse.ArgumentParser(add_help=False)
    source.add_arguments(parser)
    return parser.parse_args([])
