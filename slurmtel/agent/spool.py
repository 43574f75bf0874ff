"""The agent's durable local spool: summaries, events and inventory wait here for the head.

Why SQLite (stdlib sqlite3) in WAL mode with synchronous=FULL rather than an append-only
log: a commit is atomic and fsync'd before append() returns, so after kill -9 or a power cut
the spool holds exactly the committed items, never a torn half-record to detect and skip;
acks and evictions are DELETEs in the same transactional store (a log would need compaction
and a separate, itself crash-safe, cursor file); and INTEGER PRIMARY KEY AUTOINCREMENT gives
sequence numbers that only grow, even after every row was deleted. WAL lets the HTTP threads
read while the sampling loop writes.

Bounded: when the payload bytes exceed `max_bytes`, the oldest items are deleted in the same
transaction as the insert and `evicted_total` (kept in the file) grows by their number.
Counters (items, bytes, evicted) live in the `meta` table and change in the same transactions
as the rows, so they stay right across processes and crashes.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slurmtel.agent.protocol import AgentRecord, record_kind, record_to_json

log = logging.getLogger(__name__)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS items (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    kind TEXT NOT NULL,
    created_at REAL NOT NULL,
    bytes INTEGER NOT NULL,
    payload TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value);
"""
# served_cursor: the highest cursor a page covered (read_page); an ack never goes beyond it
_COUNTERS = ("item_count", "payload_bytes", "evicted_total", "acked_cursor", "served_cursor")


@dataclass(frozen=True, slots=True)
class SpooledItem:
    seq: int
    kind: str
    # the record as JSON text (protocol.record_to_json)
    payload: str


@dataclass(frozen=True, slots=True)
class SpoolStats:
    items: int
    bytes: int
    evicted_total: int
    # highest sequence number ever assigned (0 when none)
    last_seq: int
    acked_cursor: int
    spool_id: str
    # highest cursor ever served (read_page); acks are clamped to it
    served_cursor: int = 0


class Spool:
    """Thread-safe; several processes may open the same file (SQLite locks)."""

    def __init__(self, path: str | Path, max_bytes: int = 64 * 1024 * 1024) -> None:
        self.path = Path(path)
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._db = self._open()
        except sqlite3.DatabaseError as exc:
            # an unreadable file must not keep the agent down: keep it aside, start afresh
            aside = self.path.with_name(f"{self.path.name}.corrupt-{int(time.time())}")
            log.error("spool %s is unreadable (%s); moved to %s, starting a new spool", self.path, exc, aside)
            self.path.rename(aside)
            for suffix in ("-wal", "-shm"):
                Path(f"{self.path}{suffix}").unlink(missing_ok=True)
            self._db = self._open()

    def _open(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, timeout=30.0, isolation_level=None, check_same_thread=False)
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=FULL")
            db.executescript(_SCHEMA)
            with _transaction(db):
                for key in _COUNTERS:
                    db.execute("INSERT OR IGNORE INTO meta (key, value) VALUES (?, 0)", (key,))
                db.execute(
                    "INSERT OR IGNORE INTO meta (key, value) VALUES ('spool_id', ?)",
                    (uuid.uuid4().hex,),
                )
                # a spool from before served_cursor: what was acked was served
                db.execute(
                    "UPDATE meta SET value = (SELECT value FROM meta WHERE key = 'acked_cursor') "
                    "WHERE key = 'served_cursor' AND value < (SELECT value FROM meta WHERE key = 'acked_cursor')"
                )
            db.execute("PRAGMA quick_check").fetchall()
        except sqlite3.DatabaseError:
            db.close()
            raise
        return db

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # writing ------------------------------------------------------------------------------

    def append(self, items: Sequence[tuple[str, str]], state: tuple[str, Any] | None = None) -> list[int]:
        """Store (kind, payload JSON) items in one fsync'd transaction; returns their seqs."""
        if not items and state is None:
            return []
        now = time.time()
        seqs: list[int] = []
        with self._lock, _transaction(self._db) as db:
            added = 0
            for kind, payload in items:
                size = len(payload.encode())
                cursor = db.execute(
                    "INSERT INTO items (kind, created_at, bytes, payload) VALUES (?, ?, ?, ?)",
                    (kind, now, size, payload),
                )
                seqs.append(int(cursor.lastrowid or 0))
                added += size
            _bump(db, item_count=len(items), payload_bytes=added)
            if state is not None:
                key, value = state
                db.execute(
                    "INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)",
                    (f"state:{key}", json.dumps(value, separators=(",", ":"))),
                )
            self._evict(db)
        return seqs

    def append_records(
        self, records: Sequence[AgentRecord], state: tuple[str, Any] | None = None
    ) -> list[int]:
        """Store RECORDS; with STATE (key, value), keep that agent state in the same transaction
        (the readings the records were computed from: never one without the other)."""
        return self.append([(record_kind(r), record_to_json(r)) for r in records], state=state)

    def _evict(self, db: sqlite3.Connection) -> None:
        total = _meta_int(db, "payload_bytes")
        excess = total - self.max_bytes
        if excess <= 0:
            return
        freed = 0
        count = 0
        last = 0
        for seq, size in db.execute("SELECT seq, bytes FROM items ORDER BY seq"):
            freed += size
            count += 1
            last = seq
            if freed >= excess:
                break
        db.execute("DELETE FROM items WHERE seq <= ?", (last,))
        _bump(db, item_count=-count, payload_bytes=-freed, evicted_total=count)
        log.warning(
            "spool full (%d bytes > %d): evicted %d oldest items up to seq %d",
            total,
            self.max_bytes,
            count,
            last,
        )

    def ack(self, cursor: int) -> int:
        """Drop every item with seq <= CURSOR; returns the cursor acked. Idempotent. A cursor
        beyond the last one served (read_page) is clamped to it: an item no head was ever
        given is never dropped, whatever a client claims."""
        with self._lock, _transaction(self._db) as db:
            cursor = max(0, min(int(cursor), _meta_int(db, "served_cursor"), _last_seq(db)))
            count, size = db.execute(
                "SELECT COUNT(*), COALESCE(SUM(bytes), 0) FROM items WHERE seq <= ?", (cursor,)
            ).fetchone()
            if count:
                db.execute("DELETE FROM items WHERE seq <= ?", (cursor,))
                _bump(db, item_count=-count, payload_bytes=-size)
            if cursor > _meta_int(db, "acked_cursor"):
                db.execute("UPDATE meta SET value = ? WHERE key = 'acked_cursor'", (cursor,))
        return cursor

    # reading ------------------------------------------------------------------------------

    def read(self, after: int, limit: int) -> list[SpooledItem]:
        """A look at the items after AFTER (tools, tests); it serves nothing: acks stay
        clamped to what read_page served."""
        with self._lock:
            rows = self._db.execute(
                "SELECT seq, kind, payload FROM items WHERE seq > ? ORDER BY seq LIMIT ?",
                (int(after), max(0, int(limit))),
            ).fetchall()
        return [SpooledItem(int(seq), str(kind), str(payload)) for seq, kind, payload in rows]

    def read_page(self, after: int, limit: int, kinds: Sequence[str]) -> tuple[list[SpooledItem], int]:
        """Up to LIMIT items of KINDS after AFTER, and the cursor that page covers: its last
        item, or, when fewer than LIMIT matched, the last item of any kind there is (the
        skipped kinds are not wanted by the reader). Both from one snapshot of the spool."""
        marks = ",".join("?" * len(kinds))
        # one write transaction: the page, its cursor and the served mark agree
        with self._lock, _transaction(self._db) as db:
            rows = (
                db.execute(
                    f"SELECT seq, kind, payload FROM items WHERE seq > ? AND kind IN ({marks}) "
                    "ORDER BY seq LIMIT ?",
                    (int(after), *kinds, max(0, int(limit))),
                ).fetchall()
                if kinds
                else []
            )
            if len(rows) >= limit and rows:
                covered = int(rows[-1][0])
            else:
                (last,) = db.execute("SELECT max(seq) FROM items WHERE seq > ?", (int(after),)).fetchone()
                covered = int(last) if last is not None else int(after)
            served = _meta_int(db, "served_cursor")
            if covered > served:
                # a page that starts past the served mark skips items; it moves the mark only
                # when no item lies in between (evicted or acked): nothing unserved is ever
                # covered by a later ack
                (skipped,) = db.execute(
                    "SELECT count(*) FROM items WHERE seq > ? AND seq <= ?", (served, int(after))
                ).fetchone()
                if not skipped:
                    covered_served = min(covered, _last_seq(db))
                    db.execute("UPDATE meta SET value = ? WHERE key = 'served_cursor'", (covered_served,))
        return [SpooledItem(int(seq), str(kind), str(payload)) for seq, kind, payload in rows], covered

    def stats(self) -> SpoolStats:
        with self._lock:
            meta = dict(self._db.execute("SELECT key, value FROM meta").fetchall())
            last = _last_seq(self._db)
        return SpoolStats(
            items=int(meta["item_count"]),
            bytes=int(meta["payload_bytes"]),
            evicted_total=int(meta["evicted_total"]),
            last_seq=last,
            acked_cursor=int(meta["acked_cursor"]),
            spool_id=str(meta["spool_id"]),
            served_cursor=int(meta["served_cursor"]),
        )

    # agent state (e.g. the summariser's open windows across a clean restart) -------------

    def get_state(self, key: str) -> Any:
        with self._lock:
            row = self._db.execute("SELECT value FROM meta WHERE key = ?", (f"state:{key}",)).fetchone()
        return None if row is None else json.loads(row[0])

    def set_state(self, key: str, value: Any) -> None:
        text = json.dumps(value, separators=(",", ":"))
        with self._lock, _transaction(self._db) as db:
            db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (f"state:{key}", text))

    def delete_state(self, key: str) -> None:
        with self._lock, _transaction(self._db) as db:
            db.execute("DELETE FROM meta WHERE key = ?", (f"state:{key}",))


@contextmanager
def _transaction(db: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    # IMMEDIATE takes the write lock up front, so two writers never deadlock on upgrade
    db.execute("BEGIN IMMEDIATE")
    try:
        yield db
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")


def _meta_int(db: sqlite3.Connection, key: str) -> int:
    row = db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
    return int(row[0]) if row else 0


def _bump(db: sqlite3.Connection, **deltas: int) -> None:
    for key, delta in deltas.items():
        if delta:
            db.execute("UPDATE meta SET value = value + ? WHERE key = ?", (delta, key))


def _last_seq(db: sqlite3.Connection) -> int:
    row = db.execute("SELECT seq FROM sqlite_sequence WHERE name = 'items'").fetchone()
    return int(row[0]) if row else 0
