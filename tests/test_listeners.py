"""listeners.py and modern.py without HTTP: the limits on listen streams, the filter, the envelope's checks."""

from __future__ import annotations

import pytest

from gatewayd import listeners, modern
from gatewayd.errors import INVALID_PARAMS, OVERLOADED, GatewayError
from gatewayd.sessions import Sessions

ENVELOPE = modern.Envelope("2026-07-28", {}, {}, None)
META = {modern.VERSION_KEY: "2026-07-28", modern.CAPABILITIES_KEY: {}}


def test_a_client_past_its_share_of_listen_streams_loses_its_oldest_and_past_the_limit_of_all_is_refused() -> None:
    registry = listeners.Listeners(limit=3, per_client=2)
    opened = [registry.open("a", ENVELOPE, n, {listeners.TOOLS_CHANGED}) for n in range(2)]
    # Past its share, a client's oldest stream ends (its stream is told: None), and no other client's.
    third = registry.open("a", ENVELOPE, 3, set())
    assert opened[0].ended and opened[0].outbound.get_nowait() is None
    assert not opened[1].ended and len(registry) == 2
    b = registry.open("b", ENVELOPE, 1, set())
    with pytest.raises(GatewayError) as full:
        registry.open("c", ENVELOPE, 1, set())
    assert full.value.code == OVERLOADED
    registry.close(opened[1])
    registry.open("c", ENVELOPE, 2, set())
    assert len(registry) == 3 and not third.ended and not b.ended


def test_too_many_resource_uris_are_refused() -> None:
    uris = [f"test://{n}" for n in range(listeners.MAX_RESOURCE_SUBSCRIPTIONS + 1)]
    assert listeners.requested({"notifications": {"resourceSubscriptions": uris[:-1]}})[1] == uris[:-1]
    with pytest.raises(GatewayError) as refused:
        listeners.requested({"notifications": {"resourceSubscriptions": uris}})
    assert refused.value.code == INVALID_PARAMS


def test_a_listener_hears_only_what_it_asked_for_tagged_with_its_id() -> None:
    sessions = Sessions(10, 60.0)
    registry = listeners.Listeners()
    sessions.attach(registry)
    tools = registry.open("a", ENVELOPE, "sub-1", {listeners.TOOLS_CHANGED})
    prompts = registry.open("b", ENVELOPE, "sub-2", {"notifications/prompts/list_changed"})
    sessions.broadcast({"jsonrpc": "2.0", "method": listeners.TOOLS_CHANGED})
    sessions.broadcast({"jsonrpc": "2.0", "method": listeners.TOOLS_CHANGED}, to=lambda who: who.client != "a")
    assert tools.outbound.qsize() == 1 and prompts.outbound.empty()
    assert tools.outbound.get_nowait() == {"jsonrpc": "2.0", "method": listeners.TOOLS_CHANGED,
                                           "params": {"_meta": {modern.SUBSCRIPTION_ID_KEY: "sub-1"}}}
    sessions.broadcast_close()
    assert tools.outbound.get_nowait() is None and prompts.outbound.get_nowait() is None


@pytest.mark.parametrize(("params", "code"), [
    (None, INVALID_PARAMS),
    ({"_meta": {modern.VERSION_KEY: "2026-07-28"}}, INVALID_PARAMS),
    ({"_meta": {**META, modern.VERSION_KEY: 20260728}}, INVALID_PARAMS),
    ({"_meta": {**META, modern.CLIENT_INFO_KEY: "me"}}, INVALID_PARAMS),
    ({"_meta": {**META, modern.LOG_LEVEL_KEY: "loud"}}, INVALID_PARAMS),
])
def test_a_malformed_envelope_is_invalid_params(params: object, code: int) -> None:
    with pytest.raises(GatewayError) as refused:
        modern.envelope(params)
    assert refused.value.code == code


def test_an_envelope_log_level_lets_through_that_level_and_above_and_none_without_one() -> None:
    chosen = modern.envelope({"_meta": {**META, modern.LOG_LEVEL_KEY: "warning"}})
    assert [chosen.wants_log(level) for level in ("info", "warning", "error")] == [False, True, True]
    assert not modern.envelope({"_meta": META}).wants_log("emergency")
