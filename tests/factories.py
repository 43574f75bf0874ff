"""Hand-made records for store and report tests whose expected numbers must be exact."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from slurmtel.records import JobAttempt


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
