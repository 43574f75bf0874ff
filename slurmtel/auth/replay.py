"""A bounded in-memory replay cache: each credential is good for one request.

munged refuses a credential it decoded before, but only that munged: a second head, a restarted
munged or a JWT (which has no such check at all) would take it again. The server remembers a
digest of every credential it accepted for as long as it would accept that credential anyway (its
own age limit plus the clock skew it allows: the client picks munged's TTL, `munge -t 3600`, so
munged's expiry is no bound), so memory is bounded by the rate of accepted requests x that time.

Bounded twice: in all (`max_entries`) and per owner (`max_per_owner`, the uid a credential
proved). When the cache is full of live entries it refuses new credentials (fails closed) rather
than forget a live one; when one owner's share is full only that owner is refused, so one busy
or hostile user cannot lock the others out.
"""

from __future__ import annotations

import enum
import hashlib
import heapq
import threading
from collections import Counter
from datetime import datetime

DEFAULT_MAX_ENTRIES = 100_000
DEFAULT_MAX_PER_OWNER = 5_000


class Verdict(enum.Enum):
    """What first_use decided; true only for FIRST."""

    FIRST = "first"
    REPLAYED = "replayed"
    # the owner's share is full: that owner is refused, nobody else
    OWNER_FULL = "owner_full"
    # the whole cache is full of live entries
    FULL = "full"

    def __bool__(self) -> bool:
        return self is Verdict.FIRST


class ReplayCache:
    """Thread-safe. Keys are hashed (SHA-256): the cache never holds a credential itself."""

    def __init__(self, max_entries: int = DEFAULT_MAX_ENTRIES, max_per_owner: int | None = None) -> None:
        if max_entries < 1:
            raise ValueError("max_entries must be at least 1")
        per_owner = min(max_entries, DEFAULT_MAX_PER_OWNER) if max_per_owner is None else max_per_owner
        if not 1 <= per_owner <= max_entries:
            raise ValueError("max_per_owner must be between 1 and max_entries")
        self.max_entries = max_entries
        self.max_per_owner = per_owner
        self._expiry: dict[bytes, tuple[float, str]] = {}
        self._heap: list[tuple[float, bytes]] = []
        self._per_owner: Counter[str] = Counter()
        self._lock = threading.Lock()
        # refused because the cache was full of live entries / an owner's share was
        self.full_refusals = 0
        self.owner_refusals = 0

    def __len__(self) -> int:
        with self._lock:
            return len(self._expiry)

    def held_by(self, owner: str) -> int:
        with self._lock:
            return self._per_owner[owner]

    def seen(self, key: str | bytes, now: datetime) -> bool:
        """Whether KEY is remembered and still live at NOW: a cheap check before the expensive
        one (a replayed credential is refused without asking munged)."""
        digest = _digest(key)
        with self._lock:
            entry = self._expiry.get(digest)
            return entry is not None and entry[0] >= now.timestamp()

    def first_use(
        self, keys: tuple[str | bytes, ...], expires_at: datetime, now: datetime, owner: str = ""
    ) -> Verdict:
        """FIRST (and remembered until EXPIRES_AT, counted against OWNER) when none of KEYS was
        seen before and is still live at NOW; REPLAYED for a replay; OWNER_FULL when OWNER holds
        max_per_owner live entries; FULL when the cache does."""
        digests = [_digest(k) for k in keys]
        until = expires_at.timestamp()
        with self._lock:
            self._purge(now.timestamp())
            if any(d in self._expiry for d in digests):
                return Verdict.REPLAYED
            if len(self._expiry) + len(digests) > self.max_entries:
                self.full_refusals += 1
                return Verdict.FULL
            if self._per_owner[owner] + len(digests) > self.max_per_owner:
                self.owner_refusals += 1
                return Verdict.OWNER_FULL
            for digest in digests:
                self._expiry[digest] = (until, owner)
                heapq.heappush(self._heap, (until, digest))
            self._per_owner[owner] += len(digests)
        return Verdict.FIRST

    def _purge(self, now: float) -> None:
        while self._heap and self._heap[0][0] < now:
            until, digest = heapq.heappop(self._heap)
            entry = self._expiry.get(digest)
            if entry is not None and entry[0] == until:
                del self._expiry[digest]
                owner = entry[1]
                self._per_owner[owner] -= 1
                if self._per_owner[owner] <= 0:
                    del self._per_owner[owner]


def _digest(key: str | bytes) -> bytes:
    return hashlib.sha256(key.encode() if isinstance(key, str) else key).digest()
