"""Quarantine: records a parser could not accept, kept with their reason and raw text."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Connection, text

from slurmtel.records import Rejected


@dataclass(frozen=True)
class QuarantinedRecord:
    id: int
    source: str
    origin: str
    record_key: str
    reason: str
    raw: str
    first_seen_at: datetime
    last_seen_at: datetime
    seen_count: int


def quarantine(conn: Connection, rejected: Iterable[Rejected]) -> int:
    """Store rejected records; the same record seen again only bumps its counter."""
    rows = [
        {
            "source": r.source,
            "origin": r.origin,
            "record_key": r.record_key,
            "reason": r.reason,
            "raw": r.raw,
            "sha": hashlib.sha256(r.raw.encode("utf-8", "surrogateescape")).hexdigest(),
        }
        for r in rejected
    ]
    if not rows:
        return 0
    conn.execute(
        text(
            """
            INSERT INTO quarantine (source, origin, record_key, reason, raw, raw_sha256)
            VALUES (:source, :origin, :record_key, :reason, :raw, :sha)
            ON CONFLICT (source, reason, raw_sha256) DO UPDATE
            SET last_seen_at = now(), seen_count = quarantine.seen_count + 1, origin = EXCLUDED.origin
            """
        ),
        rows,
    )
    return len(rows)


def list_quarantine(
    conn: Connection, source: str | None = None, limit: int = 100
) -> Sequence[QuarantinedRecord]:
    result = conn.execute(
        text(
            """
            SELECT id, source, origin, record_key, reason, raw, first_seen_at, last_seen_at, seen_count
            FROM quarantine
            WHERE (CAST(:source AS text) IS NULL OR source = :source)
            ORDER BY last_seen_at DESC, id DESC
            LIMIT :limit
            """
        ),
        {"source": source, "limit": limit},
    )
    return [QuarantinedRecord(*row) for row in result]
