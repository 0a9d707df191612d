"""The approvals registry alone: first answer wins, expiry, withdrawal, channels, bounds, watchers."""

from __future__ import annotations

import asyncio

import pytest

from gatewayd import approvals
from gatewayd.approvals import Approval, Approvals, State
from gatewayd.errors import Overloaded
from tests.waiting import eventually


def _open(registry: Approvals, timeout: float = 30.0, channels: frozenset[str] = frozenset(), **kw: str) -> Approval:
    return registry.open(client=kw.get("client", "agent"), method="shell.run", arguments={"command": "ls"},
                         params_sha256="ab" * 32, session_id=None, channels=channels, timeout=timeout)


async def test_approve_lets_the_waiter_go_and_later_answers_change_nothing() -> None:
    registry = Approvals()
    approval = _open(registry)
    waiter = asyncio.create_task(registry.wait(approval))
    answer = registry.decide(approval.id, approve=True, by="operator alice", channel=approvals.CLI)
    assert answer.ok and "approved" in answer.message
    assert (await waiter).state is State.APPROVED
    late = registry.decide(approval.id, approve=False, by="operator bob", channel=approvals.CLI)
    assert not late.ok and "already approved by operator alice" in late.message
    assert approval.state is State.APPROVED and approval.decided_by == "operator alice"
    assert len(registry) == 0 and registry.get(approval.id) is approval


async def test_deny_keeps_the_reason() -> None:
    registry = Approvals()
    approval = _open(registry)
    waiter = asyncio.create_task(registry.wait(approval))
    assert registry.decide(approval.id, approve=False, by="op", channel=approvals.CLI, reason="no").ok
    done = await waiter
    assert (done.state, done.reason, done.channel) == (State.DENIED, "no", approvals.CLI)


async def test_nobody_answering_expires_it() -> None:
    registry = Approvals()
    approval = _open(registry, timeout=0.05)
    assert (await registry.wait(approval)).state is State.EXPIRED
    late = registry.decide(approval.id, approve=True, by="op", channel=approvals.CLI)
    assert not late.ok and "already expired" in late.message


async def test_a_cancelled_waiter_withdraws_it() -> None:
    registry = Approvals()
    approval = _open(registry)
    waiter = asyncio.create_task(registry.wait(approval))
    await asyncio.sleep(0)  # let the waiter start waiting (one loop turn, not a wait for time)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert approval.state is State.WITHDRAWN
    assert "already withdrawn" in registry.decide(approval.id, approve=True, by="op", channel=approvals.CLI).message


async def test_withdraw_beats_a_late_approval() -> None:
    registry = Approvals()
    approval = _open(registry)
    registry.withdraw(approval, "the caller disconnected")
    answer = registry.decide(approval.id, approve=True, by="op", channel=approvals.CLI)
    assert not answer.ok and "withdrawn" in answer.message and "the caller disconnected" in answer.message
    assert (await registry.wait(approval)).state is State.WITHDRAWN


def test_channels_not_in_the_policy_cannot_answer_but_gatewayctl_always_can() -> None:
    registry = Approvals()
    approval = _open(registry, channels=frozenset({approvals.CLIENT}))
    assert approval.channels == {approvals.CLIENT, approvals.CLI}
    refused = registry.decide(approval.id, approve=True, by="op", channel=approvals.WEB)
    assert not refused.ok and "web" in refused.message and approval.state is State.PENDING
    assert registry.decide(approval.id, approve=True, by="op", channel=approvals.CLI).ok


def test_unknown_ids_are_said_to_be_unknown() -> None:
    answer = Approvals().decide("nosuch", approve=True, by="op", channel=approvals.CLI)
    assert not answer.ok and answer.approval is None and "no approval" in answer.message


def test_pending_is_bounded() -> None:
    registry = Approvals(max_pending=3)
    opened = [_open(registry) for _ in range(3)]
    with pytest.raises(Overloaded):
        _open(registry)
    registry.withdraw(opened[0], "gone")
    _open(registry)  # room again
    assert len({a.id for a in registry.pending()}) == 3


def test_ids_are_unique_and_the_list_is_oldest_first() -> None:
    registry = Approvals()
    opened = [_open(registry, client=f"c{i}") for i in range(200)]
    assert len({a.id for a in opened}) == 200
    assert [a.id for a in registry.pending()] == [a.id for a in sorted(opened, key=lambda a: a.created)]


def test_finished_ones_are_remembered_up_to_a_bound() -> None:
    registry = Approvals()
    first = _open(registry)
    registry.withdraw(first, "gone")
    for _ in range(approvals.FINISHED_KEPT):
        registry.withdraw(_open(registry), "gone")
    assert registry.get(first.id) is None


def test_watchers_hear_every_change_and_a_laggard_is_told_to_start_over() -> None:
    registry = Approvals(max_pending=approvals.WATCHER_BACKLOG * 2, per_client=approvals.WATCHER_BACKLOG * 2)
    queue = registry.watch()
    approval = _open(registry)
    registry.decide(approval.id, approve=True, by="op", channel=approvals.CLI)
    first, second = queue.get_nowait(), queue.get_nowait()
    assert first is not None and second is not None
    assert (first["type"], first["approval"]["state"]) == ("pending", "pending")
    assert (second["type"], second["approval"]["state"], second["approval"]["decided_by"]) == (
        "finished", "approved", "op")
    for _ in range(approvals.WATCHER_BACKLOG + 1):
        _open(registry)
    assert queue.qsize() == 1 and queue.get_nowait() is None  # dropped: read the whole list again
    registry.unwatch(queue)


def test_view_shows_arguments_and_hides_the_session() -> None:
    registry = Approvals()
    approval = registry.open(client="agent", method="shell.run", arguments={"command": "rm -rf /"},
                             params_sha256="cd" * 32, session_id="secret-session", channels=frozenset(), timeout=60)
    view = approval.view()
    assert view["arguments"] == {"command": "rm -rf /"} and "secret-session" not in str(view)
    assert 59 < view["expires_in_s"] <= 60 and view["channels"] == ["gatewayctl"]


async def test_an_operator_may_allow_the_very_same_call_again_for_a_while() -> None:
    registry = Approvals()
    first = _open(registry)
    answer = registry.decide(first.id, approve=True, by="operator alice", channel=approvals.CLI, allow_again_for=0.2)
    assert answer.ok and "again" in answer.message
    same = _open(registry)
    standing = registry.standing_for(same)
    assert standing is not None and standing.approval_id == first.id
    registry.approve_standing(same, standing)
    assert same.state is State.APPROVED and same.channel == approvals.STANDING and "alice" in (same.decided_by or "")
    other = registry.open(client="agent", method="shell.run", arguments={"command": "rm"}, params_sha256="ef" * 32,
                          session_id=None, channels=frozenset(), timeout=30)
    assert registry.standing_for(other) is None  # other arguments: asked again
    stranger = _open(registry, client="someone-else")
    assert registry.standing_for(stranger) is None  # another client: asked again
    later = _open(registry)
    await eventually(lambda: registry.standing_for(later) is None, what="the standing approval lapses")
    assert registry.standing() == []


def test_allow_again_is_bounded_and_for_operators_approving_only() -> None:
    registry = Approvals()
    approval = _open(registry, channels=frozenset({approvals.WEB}))
    for kwargs in ({"approve": False, "channel": approvals.CLI, "allow_again_for": 60.0},
                   {"approve": True, "channel": approvals.CLIENT, "allow_again_for": 60.0},
                   {"approve": True, "channel": approvals.CLI, "allow_again_for": approvals.STANDING_MAX + 1},
                   {"approve": True, "channel": approvals.CLI, "allow_again_for": 0.0}):
        with pytest.raises(ValueError):
            registry.decide(approval.id, by="op", **kwargs)  # type: ignore[arg-type]
    assert approval.state is State.PENDING
    assert registry.decide(approval.id, approve=True, by="op", channel=approvals.WEB, allow_again_for=600).ok
    assert [s.approval_id for s in registry.standing()] == [approval.id]
    assert registry.revoke(approval.id) and not registry.revoke(approval.id)
    assert registry.standing_for(_open(registry)) is None


def test_an_operators_answer_is_checked_in_one_place() -> None:
    assert approvals.parse_answer(None, approve=False) == (None, None)
    assert approvals.parse_answer({"reason": "  not\n now  "}, approve=False) == ("not now", None)
    assert approvals.parse_answer({"allow_again_for": 600}, approve=True) == (None, 600.0)
    for body, approve in ([1], False), ({"extra": 1}, False), ({"reason": 5}, False), \
            ({"reason": "x" * (approvals.MAX_REASON_CHARS + 1)}, False), ({"reason": "a\x00b"}, False), \
            ({"allow_again_for": 600}, False), ({"allow_again_for": True}, True), ({"allow_again_for": "1m"}, True):
        with pytest.raises(ValueError):
            approvals.parse_answer(body, approve=approve)
