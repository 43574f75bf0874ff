"""The job view's row types (`slurmtel job`: slurmtel.store.jobview returns them, the job
report, its plot and its advice read them), apart from slurmtel.rows: the command loads these
two and not the budget and chargeback rows (their six dataclasses and hashlib: about 9 ms of the
command's CPU at start, issue 28). They import nothing of slurmtel; slurmtel.rows re-exports them.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime


@dataclass(frozen=True)
class GpuFigures:
    """What one GPU did for one attempt (gpu_attribution summed over days).

    mapping 'unmapped' (gpu_uuid '') is the part of the allocation no GPU could be mapped to.
    """

    gpu_uuid: str
    node: str
    mapping: str
    allocated_seconds: float
    covered_seconds: float
    idle_seconds: float
    no_process_seconds: float
    unmeasured_seconds: float
    util_weighted_sum: float
    util_max_percent: float | None
    memory_used_max_bytes: int | None
    energy_joules: float | None
    memory_total_bytes: int | None = None
    gpu_fraction: float = 1.0
    model: str = ""
    # the GPU's index on its node (the job's allocation, else the node's inventory)
    gpu_index: int | None = None
    # the highest window mean power of the GPU during the attempt
    power_max_watts: float | None = None
    # the GPU's power cap (its inventory; None where no source gave it)
    power_limit_watts: float | None = None

    @property
    def mapped(self) -> bool:
        return self.mapping != "unmapped"

    @property
    def name(self) -> str:
        """`node/index` as nvidia-smi numbers it; the UUID where the index is unknown."""
        if not self.mapped:
            return f"{self.node}/(unmapped)"
        return f"{self.node}/{self.gpu_index}" if self.gpu_index is not None else self.gpu_uuid

    @property
    def power_mean_watts(self) -> float | None:
        """Energy over the measured seconds."""
        if self.energy_joules is None or self.covered_seconds <= 0:
            return None
        return self.energy_joules / self.covered_seconds

    @property
    def mean_util_percent(self) -> float | None:
        return self.util_weighted_sum / self.covered_seconds if self.covered_seconds > 0 else None

    @property
    def idle_share(self) -> float | None:
        """Idle seconds / measured (covered) seconds."""
        return self.idle_seconds / self.covered_seconds if self.covered_seconds > 0 else None

    @property
    def coverage(self) -> float | None:
        """Measured seconds / allocated seconds."""
        return self.covered_seconds / self.allocated_seconds if self.allocated_seconds > 0 else None


@dataclass(frozen=True)
class UtilWindow:
    """One telemetry window of one GPU (a gpu_summary row)."""

    gpu_uuid: str
    window_start_at: datetime
    window_seconds: float
    util_mean_percent: float | None
    source: str = "agent"
    memory_used_max_bytes: int | None = None
    power_mean_watts: float | None = None
