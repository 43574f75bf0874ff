"""The source registry: the scheduler and the CLI loop over SOURCES."""

from __future__ import annotations

from slurmtel.sources.base import Source
from slurmtel.sources.sacct import SacctSource

SOURCES: dict[str, Source] = {source.name: source for source in (SacctSource(),)}


def get_source(name: str) -> Source:
    try:
        return SOURCES[name]
    except KeyError:
        raise KeyError(f"unknown source '{name}' (known: {', '.join(sorted(SOURCES))})") from None
