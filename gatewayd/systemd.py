"""The systemd notify protocol: READY, RELOADING, STOPPING, STATUS and the watchdog.

Owns talking to `$NOTIFY_SOCKET` (a unix datagram socket; a leading `@` means the abstract
namespace) and the watchdog's pace from `$WATCHDOG_USEC`. Outside systemd (no variable) every
call is a no-op. Never raises: a unit that cannot be told is no reason to stop serving.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time

logger = logging.getLogger(__name__)

# systemd wants a ping at least every WATCHDOG_USEC; pinging at half of it leaves room for a slow turn.
WATCHDOG_FRACTION = 0.5


def notify(*fields: str) -> bool:
    """Send `FIELD=value` lines to the service manager. False when not under systemd or the send failed."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return False
    if address.startswith("@"):
        address = "\0" + address[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.connect(address)
            sock.sendall("\n".join(fields).encode("utf-8"))
    except OSError as exc:
        logger.warning("cannot notify systemd on %s: %s", os.environ.get("NOTIFY_SOCKET"), exc)
        return False
    return True


def monotonic_usec() -> str:
    """`MONOTONIC_USEC=…` for RELOADING=1: CLOCK_MONOTONIC in microseconds, as systemd reads it."""
    return f"MONOTONIC_USEC={time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000}"


def watchdog_interval() -> float | None:
    """Seconds between watchdog pings, or None when systemd asked for none (or asked another process)."""
    usec = os.environ.get("WATCHDOG_USEC")
    pid = os.environ.get("WATCHDOG_PID")
    if not usec or (pid and pid != str(os.getpid())):
        return None
    try:
        return int(usec) / 1_000_000 * WATCHDOG_FRACTION
    except ValueError:
        logger.warning("ignoring WATCHDOG_USEC=%r: not a number", usec)
        return None


async def watchdog(interval: float) -> None:
    """Ping the watchdog from the event loop forever: if the loop hangs, the pings stop and systemd acts."""
    while True:
        notify("WATCHDOG=1")
        await asyncio.sleep(interval)
