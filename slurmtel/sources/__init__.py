"""The source registry: the scheduler and the CLI loop over SOURCES.

SOURCES is made on first use (PEP 562 module __getattr__): importing a part of this package
(slurmtel.sources.io, .base) does not import every source, so a command that runs none of them
starts without them.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from slurmtel.sources.base import Source

    SOURCES: dict[str, Source]


def _registry() -> dict[str, Source]:
    registry: dict[str, Source] | None = globals().get("SOURCES")
    if registry is None:
        from slurmtel.sources.agent import AgentSource
        from slurmtel.sources.dcgm import DcgmSource
        from slurmtel.sources.lustre import LustreSource
        from slurmtel.sources.nccl import NcclSource
        from slurmtel.sources.prometheus import PrometheusSource
        from slurmtel.sources.sacct import SacctSource
        from slurmtel.sources.slurmctld import SlurmctldSource

        registry = {
            source.name: source
            for source in (
                SacctSource(),
                SlurmctldSource(),
                DcgmSource(),
                AgentSource(),
                NcclSource(),
                PrometheusSource(),
                LustreSource(),
            )
        }
        globals()["SOURCES"] = registry
    return registry


def __getattr__(name: str) -> Any:
    if name == "SOURCES":
        return _registry()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def get_source(name: str) -> Source:
    try:
        return _registry()[name]
    except KeyError:
        raise KeyError(f"unknown source '{name}' (known: {', '.join(sorted(_registry()))})") from None


def default_options(source: Source) -> argparse.Namespace:
    """The options `slurmtel collect NAME --once` gets with no flags: what the daemon passes."""
    parser = argparse.ArgumentParser(add_help=False)
    source.add_arguments(parser)
    return parser.parse_args([])
