"""Threads that leave SIGINT and SIGTERM to the main thread.

The kernel hands a signal sent to the process to any thread that does not block it. Python runs
its handlers in the main thread only, and only once that thread executes bytecode again: a
signal taken by a helper thread leaves the main thread asleep in its wait (a sacct that takes
minutes, a pool's futures) and ^C or systemd's SIGTERM go unanswered until the wait ends. A
thread started inside `signals_held()` inherits the blocked mask, so the main thread is the only
one the kernel can choose. Only for threads that start no process: a child inherits the mask,
and a sacct that ignores the SIGTERM systemd sends its service would outlive the stop.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

HELD_SIGNALS = frozenset({signal.SIGINT, signal.SIGTERM})


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """SIGINT and SIGTERM wait (for this thread) until the block is done, then are delivered;
    threads started inside it block them for good."""
    try:
        previous = signal.pthread_sigmask(signal.SIG_BLOCK, HELD_SIGNALS)
    except (AttributeError, OSError, ValueError):  # no pthread_sigmask: as before
        yield
        return
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def start_thread(thread: threading.Thread) -> None:
    """Start THREAD blocking SIGINT and SIGTERM (they are the main thread's)."""
    with signals_held():
        thread.start()
