"""The web approval page for operators: a live list of pending confirmations with approve/deny.

Placeholder until the page is built; the routes are registered by web/app.py.
"""

from __future__ import annotations

from aiohttp import web

PAGE_PATH = "/approvals"


def add_routes(app: web.Application) -> None:
    """Register the page and its API on `app`."""
