"""Quarantine: records a parser could not accept, kept with their reason and raw text."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Connection, text

from slurmtel.records import Rejected
from slurmtel.store.text import storable_text


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
    """Store rejected records; the same record seen again only bumps its counter.

    Whatever the record holds (NUL, text that is not UTF-8, unpaired surrogates, megabytes),
    it is stored: as escapes, bounded (store.text), so this insert never fails on its text.
    """
    by_key: dict[tuple[str, str, str], dict[str, str]] = {}
    for r in rejected:
        raw = r.raw if isinstance(r.raw, str) else storable_text(r.raw)
        row = {
            "source": storable_text(r.source, 200),
            "origin": storable_text(r.origin, 2000),
            "record_key": storable_text(r.record_key, 2000),
            "reason": storable_text(r.reason, 4000),
            "raw": storable_text(raw),
            # of the whole raw text as it came (surrogatepass: even an unpaired one has bytes)
            "sha": hashlib.sha256(raw.encode("utf-8", "surrogatepass")).hexdigest(),
        }
        # one row per natural key: a batch with the same record twice must not hit it twice
        by_key[(row["source"], row["reason"], row["sha"])] = row
    rows = list(by_key.values())
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
