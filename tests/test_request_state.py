"""request_state.py: the gateway's sealed `requestState` opens only unaltered, fresh, and for the very call it was
made for; each limit crossed is a -32602 saying why."""

from __future__ import annotations

from typing import Any

import pytest

from gatewayd import modern, request_state
from gatewayd.errors import InvalidParams
from gatewayd.request_state import APPROVAL, MAX_STATE_CHARS, Sealer, binding

PARAMS = {"name": "calc__add", "arguments": {"a": 1, "b": 2}}


def reason(sealer: Sealer, state: Any, bound: str) -> Any:
    with pytest.raises(InvalidParams) as refused:
        sealer.open(state, bound)
    return refused.value.data.get("reason") if refused.value.data else refused.value.message


def test_a_state_opens_for_its_own_call_whatever_the_retrys_keys() -> None:
    sealer = Sealer()
    state = sealer.seal(APPROVAL, binding("c", "tools/call", PARAMS), {"a": "abc"})
    retried = {**PARAMS, "inputResponses": {"x": {}}, "requestState": state, "_meta": {"k": 1}}
    opened = sealer.open(state, binding("c", "tools/call", retried))
    assert (opened.kind, opened.data) == (APPROVAL, {"a": "abc"})


def test_another_client_method_or_arguments_is_refused() -> None:
    sealer = Sealer()
    state = sealer.seal(APPROVAL, binding("c", "tools/call", PARAMS), {})
    other_args = {**PARAMS, "arguments": {"a": 1, "b": 3}}
    for bound in (binding("d", "tools/call", PARAMS), binding("c", "prompts/get", PARAMS),
                  binding("c", "tools/call", other_args)):
        assert reason(sealer, state, bound) == "not_this_call"


def test_altered_forged_and_another_daemons_states_are_refused() -> None:
    sealer = Sealer()
    bound = binding("c", "tools/call", PARAMS)
    state = sealer.seal(APPROVAL, bound, {"a": "abc"})
    body, mac = state[len(request_state.PREFIX):].split(".")
    altered = f"{request_state.PREFIX}{body[:-2]}AA.{mac}"
    for bad in (altered, "v1.something", "gw1.x.y", Sealer().seal(APPROVAL, bound, {})):
        assert reason(sealer, bad, bound) == "tampered"
    assert reason(sealer, 42, bound) == "requestState must be a string"


def test_a_state_past_its_age_is_stale() -> None:
    sealer = Sealer(max_age=-1.0)
    bound = binding("c", "tools/call", PARAMS)
    assert reason(sealer, sealer.seal(APPROVAL, bound, {}), bound) == "stale"


def test_a_state_longer_than_the_limit_is_refused_unread() -> None:
    sealer = Sealer()
    with pytest.raises(InvalidParams) as refused:
        sealer.open("gw1." + "a" * MAX_STATE_CHARS, "x")
    assert refused.value.data == {"limit": MAX_STATE_CHARS}


def test_input_responses_are_an_object_of_at_most_the_limit() -> None:
    assert modern.answers_of({"inputResponses": {str(n): {} for n in range(modern.MAX_INPUTS)}})
    with pytest.raises(InvalidParams):
        modern.answers_of({"inputResponses": {str(n): {} for n in range(modern.MAX_INPUTS + 1)}})
    with pytest.raises(InvalidParams):
        modern.answers_of({"inputResponses": ["not", "an", "object"]})


def test_a_childs_question_the_caller_cannot_answer_is_minus_32021() -> None:
    envelope = modern.envelope({"_meta": {modern.VERSION_KEY: "2026-07-28", modern.CAPABILITIES_KEY: {"sampling": {}}}})
    asks_sampling = {"inputRequests": {"q": {"method": "sampling/createMessage", "params": {}}}}
    modern.check_asks(asks_sampling, envelope)
    with pytest.raises(Exception) as refused:
        modern.check_asks({"inputRequests": {"q": {"method": "elicitation/create", "params": {}}}}, envelope)
    assert getattr(refused.value, "code", None) == -32021
