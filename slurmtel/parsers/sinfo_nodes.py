"""`sinfo -N -o '%N %P %T %c %m %G %E'`: which nodes have GPUs (for finding node endpoints)."""

from __future__ import annotations

from slurmtel.parsers.gres import gpu_count

SINFO_NODE_FORMAT = "%N %P %T %c %m %G %E"


def parse_sinfo_gpu_nodes(raw: str) -> list[str]:
    """Names of the nodes whose GRES include GPUs, once each, in the order sinfo lists them.

    Accepts the output with or without its header line; a node appears once per partition.
    """
    nodes: list[str] = []
    for line in raw.splitlines():
        fields = line.split(None, 6)
        if len(fields) < 6 or fields[0] == "NODELIST":
            continue
        if gpu_count(fields[5]) > 0 and fields[0] not in nodes:
            nodes.append(fields[0])
    return nodes
