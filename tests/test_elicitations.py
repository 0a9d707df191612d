"""The URL-mode elicitations table (gatewayd/elicitations.py), in memory with real sessions: each completion goes to
the session asked, once; another server's id, an unknown one, a form-mode elicitation, an ended session and an
expired entry tell no one; the table's bound is crossed, the oldest forgotten."""

from __future__ import annotations

from typing import Any

import pytest

from gatewayd import elicitations
from gatewayd.elicitations import COMPLETE, MAX_OPEN, UrlElicitations
from gatewayd.sessions import Session


def session(name: str) -> Session:
    return Session(name * 43, "laptop", "2025-11-25", {"elicitation": {"url": {}}}, {})


def told(of: Session) -> list[Any]:
    out: list[Any] = []
    while not of.outbound.empty():
        out.append(of.outbound.get_nowait()["params"]["elicitationId"])  # type: ignore[index]
    return out


def done(elicitation_id: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "method": COMPLETE, "params": {"elicitationId": elicitation_id, "_meta": {"x": 1}}}


def url(elicitation_id: str) -> dict[str, Any]:
    return {"mode": "url", "elicitationId": elicitation_id, "url": "https://example.test", "message": "sign in"}


async def test_a_completion_goes_to_the_session_asked_once_and_to_no_one_else() -> None:
    table, alice, bob = UrlElicitations(), session("a"), session("b")
    table.asked("srv", url("e1"), alice)
    table.required("srv", {"code": -32042, "message": "sign in", "data": {"elicitations": [url("e2")]}}, bob)
    table.asked("srv", {"mode": "form", "elicitationId": "e3", "message": "?"}, alice)  # not URL mode: no completion
    assert not table.completed("other", done("e1")), "another server's completion is not this one's"
    assert [table.completed("srv", done(name)) for name in ("e1", "e1", "e2", "e3", 7)] == \
        [True, False, True, False, False]
    assert (told(alice), told(bob), len(table)) == (["e1"], ["e2"], 0)


async def test_an_ended_session_or_an_expired_entry_tells_no_one(monkeypatch: pytest.MonkeyPatch) -> None:
    table, alice = UrlElicitations(), session("a")
    table.asked("srv", url("e1"), alice)
    alice.end()
    assert not table.completed("srv", done("e1"))
    monkeypatch.setattr(elicitations, "OPEN_FOR", -1.0)  # asked already past its time
    bob = session("b")
    table.asked("srv", url("e2"), bob)
    assert not table.completed("srv", done("e2")) and told(bob) == []


async def test_past_max_open_the_oldest_is_forgotten() -> None:
    table, alice = UrlElicitations(), session("a")
    for number in range(MAX_OPEN + 1):
        table.asked("srv", url(f"e{number}"), alice)
    assert len(table) == MAX_OPEN
    assert not table.completed("srv", done("e0")) and table.completed("srv", done(f"e{MAX_OPEN}"))
    # An id no client could be shown is not remembered at all.
    table.asked("srv", url("x" * (elicitations.MAX_ID_CHARS + 1)), alice)
    assert len(table) == MAX_OPEN - 1
