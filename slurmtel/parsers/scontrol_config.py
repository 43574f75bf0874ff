"""`scontrol show config`: the settings slurmtel needs from the controller."""

from __future__ import annotations

from slurmtel.errors import ParseError


def parse_scontrol_config(raw: str) -> dict[str, str]:
    """`Key = value` lines -> {Key: value} (the header and blank lines are skipped)."""
    settings: dict[str, str] = {}
    for line in raw.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() and " " not in key.strip():
            settings.setdefault(key.strip(), value.strip())
    return settings


def cluster_name(raw: str) -> str:
    name = parse_scontrol_config(raw).get("ClusterName", "")
    if not name:
        raise ParseError("scontrol show config: no ClusterName")
    return name
