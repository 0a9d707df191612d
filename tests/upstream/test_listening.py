"""The gateway's listen on a 2026-07-28 child (gatewayd/upstream/listening.py), in memory: what is opened, and when.

The child's side is a stand-in for the connection that records each listen opened and ended, and lets the test end
one as the child would: the end-to-end runs with real children are tests/e2e/test_modern_child_changes.py and
tests/e2e/test_child_tasks.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, cast

from gatewayd.upstream.connection import Connection
from gatewayd.upstream.listening import Listening

OFFERS = {"tools": {"listChanged": True}, "resources": {"subscribe": True}}


class Child:
    """The listens opened on a child, by id, with how each ends; those ended from the gateway's side."""

    alive, pid = True, 4242

    def __init__(self) -> None:
        self.opened: dict[int, tuple[dict[str, Any], Callable[[dict[str, Any]], None]]] = {}
        self.ended: list[int] = []

    def listen(self, method: str, params: Any, on_end: Callable[[dict[str, Any]], None]) -> int:
        listen_id = len(self.opened) + 1
        self.opened[listen_id] = params["notifications"], on_end
        return listen_id

    def unlisten(self, listen_id: int) -> None:
        self.ended.append(listen_id)

    def ends(self, listen_id: int) -> None:
        """The child ends a listen itself (a graceful end: a result)."""
        self.opened[listen_id][1]({"jsonrpc": "2.0", "id": listen_id, "result": {}})


async def turns(count: int = 3) -> None:
    for _ in range(count):
        await asyncio.sleep(0)


async def test_a_subscription_reopens_the_listen_at_once_even_during_the_backoff() -> None:
    child = Child()
    conn = cast(Connection, child)
    listening = Listening("watch", lambda params: params)
    listening.start(conn, OFFERS)
    assert child.opened[1][0] == {"toolsListChanged": True}
    child.ends(1)  # opened again only after REOPEN_FIRST (1 s): the child may keep ending it
    await turns()
    assert len(child.opened) == 1
    listening.subscription(conn, "resources/subscribe", {"uri": "file:///a"})
    await turns()
    # A session's subscription does not wait out a backoff of the child's making.
    assert child.opened[2][0] == {"toolsListChanged": True, "resourceSubscriptions": ["file:///a"]}
    assert child.ended == []  # the one it replaces had ended already


async def test_changes_of_one_turn_reopen_the_listen_once_the_new_before_the_old_ends() -> None:
    child = Child()
    conn = cast(Connection, child)
    listening = Listening("watch", lambda params: params)
    listening.start(conn, OFFERS)
    for uri in ("file:///a", "file:///b"):
        listening.subscription(conn, "resources/subscribe", {"uri": uri})
    await turns()
    assert len(child.opened) == 2 and child.opened[2][0]["resourceSubscriptions"] == ["file:///a", "file:///b"]
    assert child.ended == [1]
