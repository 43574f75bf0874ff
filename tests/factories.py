"""Hand-made records for store and report tests whose expected numbers must be exact."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from slurmtel.records import GpuInventory, GpuSummary, JobAttempt


def at(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def attempt(**overrides: Any) -> JobAttempt:
    values: dict[str, Any] = {
        "cluster": "lab",
        "job_id_raw": 1,
        "submit_at": at("2026-11-01T10:00:00"),
        "job_id": str(overrides.get("job_id_raw", 1)),
        "name": "train",
        "user": "alice",
        "account": "physics",
        "partition": "gpu",
        "state": "COMPLETED",
        "eligible_at": at("2026-11-01T10:00:00"),
        "start_at": at("2026-11-01T10:00:00"),
        "end_at": at("2026-11-01T11:00:00"),
        "alloc_gpus": 1,
        "alloc_tres": {"cpu": 1, "gres/gpu": 1},
    }
    values.update(overrides)
    return JobAttempt(**values)


T0 = datetime(2026, 11, 1, 10, 0, tzinfo=UTC)


def windows(
    uuid: str,
    start: datetime,
    count: int,
    busy: set[int] | None = None,
    *,
    job: str = "",
    node: str = "gpu01",
    no_process: set[int] | None = None,
    energy: float = 300.0,
) -> list[GpuSummary]:
    """COUNT 30 s windows from START; windows in BUSY are at 80 %, the rest idle at 0 %."""
    busy = busy or set()
    no_process = no_process or set()
    result = []
    for i in range(count):
        is_busy = i in busy
        result.append(
            GpuSummary(
                source="agent",
                node=node,
                gpu_uuid=uuid,
                window_start_at=start + timedelta(seconds=30 * i),
                window_seconds=30.0,
                util_metric="gr_engine_active",
                sample_count=30,
                covered_seconds=30.0,
                util_mean_percent=80.0 if is_busy else 0.0,
                util_max_percent=95.0 if is_busy else 0.0,
                idle_seconds=0.0 if is_busy else 30.0,
                no_process_seconds=30.0 if i in no_process else 0.0,
                memory_used_max_bytes=(40 if is_busy else 1) * 2**30,
                energy_joules=energy,
                energy_method="counter",
                job_ids=(job,) if job and i not in no_process else (),
            )
        )
    return result


def inventory(node: str, uuids: list[str], seen: datetime = T0) -> list[GpuInventory]:
    return [
        GpuInventory(node=node, gpu_uuid=u, index=i, model="NVIDIA H100", observed_at=seen)
        for i, u in enumerate(uuids)
    ]
