"""A bounded in-memory replay cache: each credential is good for one request.

munged refuses a credential it decoded before, but only that munged: a second head, a restarted
munged or a JWT (which has no such check at all) would take it again. The server remembers a
digest of every credential it accepted until that credential would have expired anyway, so
memory is bounded by the rate of accepted requests x their lifetime. When the cache is full of
live entries it refuses new credentials (fails closed) rather than forget a live one.
"""

from __future__ import annotations

import hashlib
import heapq
import threading
from datetime import datetime

DEFAULT_MAX_ENTRIES = 100_000


class ReplayCache:
    """Thread-safe. Keys are hashed (SHA-256): the cache never holds a credential itself."""

    def __init__(self, max_entries: int = DEFAULT_MAX_ENTRIES) -> None:
        if max_entries < 1:
            raise ValueError("max_entries must be at least 1")
        self.max_entries = max_entries
        self._expiry: dict[bytes, float] = {}
        self._heap: list[tuple[float, bytes]] = []
        self._lock = threading.Lock()
        # refused because the cache was full of live entries
        self.full_refusals = 0

    def __len__(self) -> int:
        with self._lock:
            return len(self._expiry)

    def first_use(self, keys: tuple[str | bytes, ...], expires_at: datetime, now: datetime) -> bool:
        """True (and remembered until EXPIRES_AT) when none of KEYS was seen before and is
        still live at NOW; False for a replay, or when the cache is full."""
        digests = [_digest(k) for k in keys]
        until = expires_at.timestamp()
        with self._lock:
            self._purge(now.timestamp())
            if any(d in self._expiry for d in digests):
                return False
            if len(self._expiry) + len(digests) > self.max_entries:
                self.full_refusals += 1
                return False
            for digest in digests:
                self._expiry[digest] = until
                heapq.heappush(self._heap, (until, digest))
        return True

    def _purge(self, now: float) -> None:
        while self._heap and self._heap[0][0] < now:
            until, digest = heapq.heappop(self._heap)
            if self._expiry.get(digest) == until:
                del self._expiry[digest]


def _digest(key: str | bytes) -> bytes:
    return hashlib.sha256(key.encode() if isinstance(key, str) else key).digest()
