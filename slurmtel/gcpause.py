"""`gc_paused`: CPython's cyclic collector off for a stretch of bulk work.

A neutral utility: the parsers, the agent and the store all use it, and it imports nothing of
slurmtel (tests/test_layers.py keeps the store and the agent free of parser imports).
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_gc_lock = threading.Lock()
_gc_pauses = 0
_gc_resume = False


@contextmanager
def gc_paused() -> Iterator[None]:
    """Keep CPython's cyclic collector off for a stretch of bulk work.

    Decoding or writing a bulk sacct result builds hundreds of thousands of small acyclic
    objects; with the collector on, CPython scans the growing heap again and again while they
    are built (half the time of a parse, more with a large heap). Pauses nest and may overlap
    across threads (a parse in one thread, a write in another): the collector comes back on
    when the last pause ends, and only if it was on when the first one began.
    """
    global _gc_pauses, _gc_resume
    with _gc_lock:
        if _gc_pauses == 0:
            _gc_resume = gc.isenabled()
            gc.disable()
        _gc_pauses += 1
    try:
        yield
    finally:
        with _gc_lock:
            _gc_pauses -= 1
            if _gc_pauses == 0 and _gc_resume:
                gc.enable()
