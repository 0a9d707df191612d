"""The continuations registry in memory (gatewayd/continuations.py): how a call's questions end without an answer.

The call is a real coroutine that waits on a future the test controls; the child is the `reply` callback that
records what it is sent. The HTTP side and the whole path through the daemon are tests/e2e/test_mrtr_relay.py.
"""

from __future__ import annotations

import asyncio
from typing import Any, Final

import pytest

from gatewayd import relay
from gatewayd.continuations import MAX_HELD_EVENTS, STATUS_TOKEN, Continuations
from gatewayd.errors import Overloaded, RequestCancelled

ASK: Final = {"jsonrpc": "2.0", "id": "ask-1", "method": "sampling/createMessage",
              "params": {"messages": [], "maxTokens": 5}}
ALLOWED: Final = ("sampling", "elicitation", "roots")


def declares(_kind: str, _params: Any) -> bool:
    return True


class Child:
    """What the child is sent back."""

    def __init__(self) -> None:
        self.replies: list[dict[str, Any]] = []

    def reply(self, message: dict[str, Any]) -> bool:
        self.replies.append(message)
        return True


async def held(release: asyncio.Future[dict[str, Any]]) -> dict[str, Any]:
    return await release


async def test_a_question_becomes_a_round_and_its_answer_goes_to_the_child_under_its_id() -> None:
    registry, child = Continuations(timeout=60), Child()
    release: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
    continuation = registry.start("ada", held(release))
    assert continuation.ask("s", ALLOWED, ASK, declares, None, child.reply) is None
    asked = await continuation.wait()
    assert isinstance(asked, list)
    [question] = asked
    registry.park(continuation)
    assert registry.take(continuation.id, "ada") is continuation
    continuation.answer({question.key: {"role": "assistant"}})
    assert child.replies == [{"jsonrpc": "2.0", "id": "ask-1", "result": {"role": "assistant"}}]
    release.set_result({"result": "done"})
    assert await continuation.wait() == {"result": "done"}


async def test_a_parked_call_is_abandoned_after_the_timeout_and_its_child_told() -> None:
    registry, child = Continuations(timeout=0.01), Child()
    release: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
    continuation = registry.start("ada", held(release))
    continuation.ask("s", ALLOWED, ASK, declares, None, child.reply)
    await continuation.wait()
    registry.park(continuation)
    async with asyncio.timeout(5):
        await asyncio.gather(continuation.task, return_exceptions=True)
    assert continuation.task.cancelled()
    [reply] = child.replies
    assert reply["id"] == "ask-1" and reply["error"]["code"] == relay.TIMED_OUT
    with pytest.raises(Exception, match="no longer waits"):
        registry.take(continuation.id, "ada")


async def test_the_per_client_limit_is_crossed_with_a_clear_error_and_others_are_not_held() -> None:
    registry = Continuations(timeout=60, max_per_client=1)
    release: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
    first, second, other = (registry.start(client, held(release)) for client in ("ada", "ada", "bob"))
    registry.park(first)
    child = Child()
    second.ask("s", ALLOWED, ASK, declares, None, child.reply)
    with pytest.raises(Overloaded) as refused:
        registry.park(second)
    assert refused.value.data == {"limit": 1}
    assert child.replies[0]["error"]["code"] == relay.ENDED
    registry.park(other)
    await registry.close()
    assert all(c.task.done() for c in (first, second, other))


async def test_a_call_that_ends_answers_its_open_questions_and_a_refused_kind_is_never_asked() -> None:
    registry, child = Continuations(timeout=60), Child()
    release: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
    continuation = registry.start("ada", held(release))
    refused = continuation.ask("s", ("roots",), ASK, declares, None, child.reply)
    assert refused is not None and refused["error"]["code"] == relay.REFUSED
    continuation.ask("s", ALLOWED, ASK, declares, None, child.reply)
    release.set_result({"result": "early"})
    async with asyncio.timeout(5):
        await continuation.task
    assert await continuation.wait() == {"result": "early"}
    [reply] = child.replies
    assert reply["error"]["code"] == relay.ENDED


async def test_closing_answers_a_waiting_request_with_an_error_not_its_own_cancel() -> None:
    registry = Continuations(timeout=60)
    release: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
    continuation = registry.start("ada", held(release))
    waiting = asyncio.ensure_future(continuation.wait())
    await registry.close()
    with pytest.raises(RequestCancelled):
        await waiting


async def test_events_of_a_parked_call_are_held_for_the_retrys_stream_in_order_the_oldest_dropped_past_the_bound(
) -> None:
    registry = Continuations(timeout=60)
    release: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
    continuation = registry.start("ada", held(release))
    first: list[dict[str, Any]] = []
    continuation.attach(first.append)
    continuation.emit({"n": 0})
    continuation.detach()
    for n in range(1, MAX_HELD_EVENTS + 3):  # two more than are kept while parked
        continuation.emit({"n": n})
    retry: list[dict[str, Any]] = []
    continuation.attach(retry.append)
    continuation.emit({"n": "live"})
    assert first == [{"n": 0}]
    assert retry == [{"n": n} for n in range(3, MAX_HELD_EVENTS + 3)] + [{"n": "live"}]
    continuation.abandon("test", "done")
    with pytest.raises(asyncio.CancelledError):
        await continuation.task


async def test_progress_says_how_the_call_goes_and_the_gateways_own_reaches_no_stream() -> None:
    registry = Continuations(timeout=60)
    release: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
    continuation = registry.start("ada", held(release))
    changes: list[str | None] = []
    continuation.on_change = lambda: changes.append(continuation.status)
    streamed: list[dict[str, Any]] = []
    continuation.attach(streamed.append)

    def progress(token: str, message: str) -> dict[str, Any]:
        return {"jsonrpc": "2.0", "method": "notifications/progress",
                "params": {"progressToken": token, "progress": 1, "message": message}}

    # Asked for by the gateway only (the caller gave no token): the status, and nothing on the stream.
    continuation.emit(progress(STATUS_TOKEN, "1/3"))
    continuation.emit(progress(STATUS_TOKEN, "1/3"))  # the same again is no change
    assert continuation.status == "1/3" and streamed == [] and changes == ["1/3"]
    # The caller's own token: its stream hears it, and the status follows.
    continuation.emit(progress("mine", "2/3"))
    assert continuation.status == "2/3" and [m["params"]["message"] for m in streamed] == ["2/3"]
    release.set_result({"result": "done"})
    assert await continuation.wait() == {"result": "done"}


async def test_a_withdrawn_question_is_settled_and_never_put_to_the_caller() -> None:
    registry, child = Continuations(timeout=60), Child()
    release: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
    withdrawn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    continuation = registry.start("ada", held(release))
    assert continuation.ask("s", ALLOWED, ASK, declares, None, child.reply, withdrawn) is None
    withdrawn.set_result(None)
    await asyncio.sleep(0)  # the future's callbacks run in the loop's next turn
    # Withdrawn before any round took it: the caller's next round does not hold it; the child is told it ended.
    assert await continuation.wait(timeout=0.05) is None
    [reply] = child.replies
    assert reply["id"] == "ask-1" and reply["error"]["code"] == relay.ENDED and "withdrew" in reply["error"]["message"]
    release.set_result({"result": "done"})
    assert await continuation.wait() == {"result": "done"}
