"""The aiohttp application keys shared by the daemon's HTTP apps (the public endpoint and the admin socket).

Owns the one key under which an app holds the daemon's state. Does not own the state (state.py).
"""

from __future__ import annotations

from aiohttp import web

from gatewayd.state import DaemonState

STATE = web.AppKey("state", DaemonState)
