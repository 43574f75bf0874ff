"""systemd's notify protocol (sd_notify(3)), without libsystemd: one datagram per message.

`notify("READY=1")` tells systemd a Type=notify service is up, `notify("WATCHDOG=1")` pets
the watchdog (WatchdogSec=), `notify("STOPPING=1")` announces a clean stop. Outside systemd
($NOTIFY_SOCKET unset) every call is a no-op that returns False; a send that fails is logged
at debug level and never raises, because a service must not die for want of a notification.
"""

from __future__ import annotations

import logging
import os
import socket

log = logging.getLogger(__name__)

ENV_SOCKET = "NOTIFY_SOCKET"


def notify(*states: str) -> bool:
    """Send STATES (e.g. "READY=1", "STATUS=collecting") as one message; True when sent."""
    address = os.environ.get(ENV_SOCKET, "")
    if not address or not states:
        return False
    if address.startswith("@"):  # an abstract socket: a leading NUL byte instead of the '@'
        address = "\0" + address[1:]
    elif not address.startswith("/"):
        log.debug("%s=%r is neither a path nor an abstract socket", ENV_SOCKET, address)
        return False
    message = "\n".join(states).encode()
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.connect(address)
            sock.sendall(message)
    except OSError as exc:
        log.debug("sd_notify %s failed: %s", states, exc)
        return False
    return True


def watchdog_seconds() -> float | None:
    """The watchdog timeout systemd set for this process (WatchdogSec=), or None.

    Ping at least twice per timeout. $WATCHDOG_PID, when set, must be our pid: the variable
    may have been inherited from a parent service.
    """
    usec = os.environ.get("WATCHDOG_USEC", "")
    pid = os.environ.get("WATCHDOG_PID", "")
    if not usec:
        return None
    if pid and pid != str(os.getpid()):
        return None
    try:
        seconds = int(usec) / 1_000_000
    except ValueError:
        return None
    return seconds if seconds > 0 else None
