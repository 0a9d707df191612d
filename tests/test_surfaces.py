"""Resources, templates, prompts and completion through the real gateway pipeline, behind scripted upstreams.

Two MCP-like servers `a` and `b` (both list `shared://x`), and a client that may use only some of what they
offer: what it may not use must not exist for it, on every route, with the answer an unknown thing gets.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gatewayd import surfaces
from gatewayd.audit import AuditLog
from gatewayd.calls import CallContext
from gatewayd.catalog import Catalog
from gatewayd.config.loader import load_snapshot
from gatewayd.explain import explain
from gatewayd.gateway import Gateway
from gatewayd.jsonrpc import Request
from gatewayd.policy import Grant, Principal
from gatewayd.sessions import Session, Sessions
from gatewayd.upstream.api import Upstream
from gatewayd.upstream.server import ToolServer
from tests.daemon import faultsrv_command, write_config
from tests.test_gateway import Scripted, in_memory_gateway
from tests.waiting import eventually


def _server(name: str, known: bool = False) -> Scripted:
    server = Scripted(name, ["tool"], known=known)
    server.surfaces = {
        "resources": [{"uri": f"{name}://doc", "name": "doc"}, {"uri": "shared://x", "name": f"x of {name}"}],
        "resourceTemplates": [{"uriTemplate": f"{name}://item/{{id}}/data", "name": "item"}],
        "prompts": [{"name": "greet", "description": "say hello"}],
    }
    return server


@dataclass
class Rig:
    gateway: Gateway
    servers: dict[str, Scripted]
    audit: AuditLog
    trail: Path

    def ctx(self, principal: Principal, session: Session | None = None) -> CallContext:
        servers: dict[str, Upstream] = dict(self.servers)
        return CallContext(principal, servers, session=session)

    async def request(self, principal: Principal, method: str, params: Any = None,
                      session: Session | None = None) -> dict[str, Any]:
        return await self.gateway.dispatch(self.ctx(principal, session), Request(1, method, params))

    async def records(self) -> list[dict[str, Any]]:
        await self.audit.flush()
        return [json.loads(line) for line in self.trail.read_text().splitlines()]


EVERYTHING = Principal("all", (Grant("all", "p.toml", allow=("a.*", "b.*")),))
# May read b's resources and get a's prompts, and complete a's: nothing else.
SOME = Principal("some", (Grant("some", "p.toml", allow=("b.resources/read", "a.prompts/get",
                                                          "a.completion/complete")),))
NOTHING = Principal("none", (Grant("none", "p.toml", allow=("a.tool",)),))


@pytest.fixture(params=[False, True], ids=["asked", "known"])
async def rig(tmp_path: Path, request: pytest.FixtureRequest) -> AsyncIterator[Rig]:
    """Servers whose lists are asked for each time, or known without waiting (a running child's kept lists)."""
    trail = tmp_path / "audit.jsonl"
    async with in_memory_gateway(trail) as (gateway, audit_log):
        yield Rig(gateway, {"a": _server("a", request.param), "b": _server("b", request.param)}, audit_log, trail)


async def test_what_each_client_may_use_is_its_own_and_a_reloaded_server_table_is_decided_anew() -> None:
    # Decided once per client and server table (a request's table is its generation's): not mixed between
    # clients, and not carried over to the next table.
    owners = surfaces.Surfaces(Catalog())
    table: dict[str, Upstream] = {"a": _server("a", known=True), "b": _server("b", known=True)}
    for _ in range(2):
        some = (await owners.list(SOME, table, "resources/list"))["resources"]
        assert [r["uri"] for r in some] == ["b://doc", "shared://x"]
        every = (await owners.list(EVERYTHING, table, "resources/list"))["resources"]
        assert [r["uri"] for r in every] == ["a://doc", "shared://x", "b://doc"]
    reloaded: dict[str, Upstream] = {"a": table["a"]}
    assert [r["uri"] for r in (await owners.list(SOME, reloaded, "resources/list"))["resources"]] == []
    assert [r["uri"] for r in (await owners.list(EVERYTHING, reloaded, "resources/list"))["resources"]] == [
        "a://doc", "shared://x"]


async def test_a_list_answer_is_kept_until_what_it_was_made_from_changes(caplog: pytest.LogCaptureFixture) -> None:
    owners = surfaces.Surfaces(Catalog())
    a, b = _server("a", known=True), _server("b", known=True)
    table: dict[str, Upstream] = {"a": a, "b": b}
    with caplog.at_level("WARNING", logger="gatewayd.surfaces"):
        first = await owners.list(EVERYTHING, table, "resources/list")
        assert await owners.list(EVERYTHING, table, "resources/list") is first
        # b's shared://x left out once, not once a call.
        assert sum("also lists 'shared://x'" in r.getMessage() for r in caplog.records) == 1
        with pytest.raises(TypeError):
            first["resources"].append({"uri": "x://y"})
        assert [r["uri"] for r in (await owners.list(SOME, table, "resources/list"))["resources"]] == [
            "b://doc", "shared://x"]
        assert await owners.list(EVERYTHING, table, "resources/list") is first, "another client's is its own"
        b.surfaces["resources"] = [{"uri": "b://new", "name": "new"}]  # the child said its list changed
        changed = await owners.list(EVERYTHING, table, "resources/list")
        assert [r["uri"] for r in changed["resources"]] == ["a://doc", "shared://x", "b://new"]
        reloaded = await owners.list(EVERYTHING, dict(table), "resources/list")
        assert reloaded is not changed and reloaded == changed
        assert await owners.list(EVERYTHING, table, "prompts/list") is await owners.list(
            EVERYTHING, table, "prompts/list")


async def test_a_server_that_cannot_list_is_asked_again_on_the_next_list() -> None:
    owners = surfaces.Surfaces(Catalog())
    broken = _server("b")
    table: dict[str, Upstream] = {"a": _server("a", known=True), "b": broken}
    del broken.surfaces["resources"]

    async def fails(kind: str) -> list[dict[str, Any]]:
        broken.asked += 1
        if kind not in broken.surfaces:
            raise RuntimeError("the child is not answering")
        return broken.surfaces[kind]

    broken.surface = fails  # type: ignore[method-assign]
    assert [r["uri"] for r in (await owners.list(EVERYTHING, table, "resources/list"))["resources"]] == [
        "a://doc", "shared://x"]
    broken.surfaces["resources"] = [{"uri": "b://back", "name": "back"}]
    assert [r["uri"] for r in (await owners.list(EVERYTHING, table, "resources/list"))["resources"]] == [
        "a://doc", "shared://x", "b://back"]
    assert broken.asked == 2


async def test_a_read_stops_at_its_owner_and_asks_a_list_not_known_only_when_it_gets_there() -> None:
    owners = surfaces.Surfaces(Catalog())
    a, b, c = _server("a", known=True), _server("b"), _server("c")
    table: dict[str, Upstream] = {"a": a, "b": b, "c": c}
    everyone = Principal("all", (Grant("all", "p.toml", allow=("*.*",)),))
    assert await owners.resource_owner(everyone, table, "shared://x") is a
    assert b.asked == c.asked == 0, "a read answered by a known list starts nobody after it"
    assert await owners.resource_owner(everyone, table, "c://doc") is c
    assert b.asked == c.asked == 1, "the lists not known are asked together, as before"
    assert await owners.resource_owner(everyone, table, "nobody://x") is None


async def test_a_templated_read_stops_at_the_first_server_whose_template_matches() -> None:
    owners = surfaces.Surfaces(Catalog())
    a, b, c = _server("a", known=True), _server("b"), _server("c")
    a.surfaces["resourceTemplates"] = [{"uriTemplate": "any://{+path}", "name": "all"}]
    c.surfaces["resourceTemplates"].append({"uriTemplate": "any://{+path}", "name": "all"})
    table: dict[str, Upstream] = {"a": a, "b": b, "c": c}
    everyone = Principal("all", (Grant("all", "p.toml", allow=("*.*",)),))
    # b's and c's resource lists are asked for (a URI no server lists), their templates never: a's matched first.
    assert await owners.resource_owner(everyone, table, "any://x/y") is a
    assert b.asked == c.asked == 1
    assert await owners.resource_owner(everyone, table, "b://item/7/data") is b
    assert await owners.resource_owner(everyone, table, "c://item/7/data") is c


async def test_thousands_of_templates_match_as_one_does(rig: Rig) -> None:
    # Two servers of 1,500 templates each (3,000 patterns: more than were ever kept compiled at once), sharing heads
    # so that one head holds many templates, and with heads that are prefixes of others'.
    for name in ("a", "b"):
        rig.servers[name].surfaces["resourceTemplates"] = [
            *({"uriTemplate": f"{name}://kind{index}/{{id}}/data{{?q}}", "name": "t"} for index in range(1500)),
            {"uriTemplate": f"{name}://{{kind}}", "name": "short"},
            {"uriTemplate": f"{name}:/p{{/path*}}", "name": "path"}]
    for uri, owner in (("b://kind1499/7/data?q=1", "b"), ("a://kind0/7/data", "a"), ("b://kind3", "b"),
                       ("a:/p/x/y", "a"), ("b://kind1499/7/8/data", None), ("c://kind1/7/data", None)):
        for _ in range(2):  # the first read makes the patterns it needs, the second uses them
            answer = await rig.request(EVERYTHING, "resources/read", {"uri": uri})
            assert ("result" in answer) is (owner is not None), uri
        if owner is not None:
            assert rig.servers[owner].received[-2:] == [("surface", "resources/read", {"uri": uri})] * 2
        else:
            assert answer["error"]["code"] == -32602


async def test_a_prompt_of_servers_without_a_prefix_goes_to_the_first_usable_one_that_lists_it() -> None:
    owners = surfaces.Surfaces(Catalog())
    hidden, known, later = (Scripted(name, [], exposed="", known=name != "c") for name in ("a", "b", "c"))
    for server in (hidden, known, later):
        server.surfaces = {"prompts": [{"name": "greet"}, {"name": f"only_{server.name}"}]}
    table: dict[str, Upstream] = {"a": hidden, "b": known, "c": later}
    client = Principal("bc", (Grant("bc", "p.toml", allow=("b.*", "c.*")),))
    for _ in range(2):
        assert await owners._prompt_owner(client, table, "greet") == (known, "greet")
    assert later.asked == 0, "a list not known is asked for only when the search gets to it"
    assert await owners._prompt_owner(client, table, "only_a") is None, "a server it may not use has none"
    assert await owners._prompt_owner(client, table, "only_c") == (later, "only_c")
    assert later.asked == 2 and hidden.asked == known.asked == 0


async def test_known_lists_are_looked_up_not_asked_for_and_a_new_list_is_seen(tmp_path: Path) -> None:
    async with in_memory_gateway(tmp_path / "audit.jsonl") as (gateway, audit):
        a, b = _server("a", known=True), _server("b", known=True)
        rig = Rig(gateway, {"a": a, "b": b}, audit, tmp_path / "audit.jsonl")
        a.surfaces["resources"] = [{"name": "no uri"}, {"uri": 7}, *a.surfaces["resources"]]
        assert (await rig.request(EVERYTHING, "resources/read", {"uri": "shared://x"}))["result"]
        assert (await rig.request(EVERYTHING, "prompts/get", {"name": "b__greet"}))["result"]
        listed = (await rig.request(EVERYTHING, "resources/list"))["result"]["resources"]
        assert [r["uri"] for r in listed] == ["a://doc", "shared://x", "b://doc"]
        assert a.asked == b.asked == 0
        # The child said its list changed: a new list object, read as it is now.
        b.surfaces["resources"] = [{"uri": "b://new", "name": "new"}]
        assert (await rig.request(EVERYTHING, "resources/read", {"uri": "b://new"}))["result"]
        assert (await rig.request(EVERYTHING, "resources/read", {"uri": "b://doc"}))["error"]["code"] == -32602
        assert [m for _, m, params in b.received] == ["prompts/get", "resources/read"]


async def test_initialize_declares_resources_prompts_and_completions(rig: Rig) -> None:
    capabilities = rig.gateway.initialize_result("2025-11-25")["capabilities"]
    assert capabilities["resources"] == {"subscribe": True, "listChanged": True}
    assert capabilities["prompts"] == {"listChanged": True}
    assert capabilities["completions"] == {}


async def test_lists_aggregate_in_server_order_and_a_shared_uri_is_the_first_servers(rig: Rig) -> None:
    listed = (await rig.request(EVERYTHING, "resources/list"))["result"]["resources"]
    assert [(r["uri"], r["name"]) for r in listed] == [
        ("a://doc", "doc"), ("shared://x", "x of a"), ("b://doc", "doc")]
    templates = (await rig.request(EVERYTHING, "resources/templates/list"))["result"]["resourceTemplates"]
    assert [t["uriTemplate"] for t in templates] == ["a://item/{id}/data", "b://item/{id}/data"]
    prompts = (await rig.request(EVERYTHING, "prompts/list"))["result"]["prompts"]
    assert prompts == [{"name": "a__greet", "description": "say hello"},
                       {"name": "b__greet", "description": "say hello"}]


async def test_a_read_goes_to_the_owner_and_is_recorded_under_its_canonical_name(rig: Rig) -> None:
    answer = await rig.request(EVERYTHING, "resources/read", {"uri": "shared://x", "_meta": {"k": 1}})
    assert answer["result"] == {"ok": "resources/read"}
    assert rig.servers["a"].received == [("surface", "resources/read", {"uri": "shared://x"})]
    assert rig.servers["b"].received == []
    [outcome] = await rig.records()  # an ordinary call: its decision is in its outcome record
    assert (outcome["decision"], outcome["method"], outcome["route"]) == ("allow", "a.resources/read",
                                                                          "resources/read")
    assert outcome["status"] == "ok"


async def test_a_template_instance_goes_to_the_server_whose_template_matches(rig: Rig) -> None:
    await rig.request(EVERYTHING, "resources/read", {"uri": "b://item/123/data"})
    assert rig.servers["b"].received == [("surface", "resources/read", {"uri": "b://item/123/data"})]
    unknown = await rig.request(EVERYTHING, "resources/read", {"uri": "b://item/1/2/data"})
    assert unknown["error"]["code"] == -32602


async def test_prompts_get_sends_the_servers_own_name(rig: Rig) -> None:
    await rig.request(EVERYTHING, "prompts/get", {"name": "b__greet", "arguments": {"who": "x"}})
    assert rig.servers["b"].received == [("surface", "prompts/get", {"name": "greet", "arguments": {"who": "x"}})]


async def test_completion_is_routed_by_its_reference(rig: Rig) -> None:
    await rig.request(EVERYTHING, "completion/complete", {"ref": {"type": "ref/prompt", "name": "a__greet"},
                                                          "argument": {"name": "who", "value": "w"}})
    await rig.request(EVERYTHING, "completion/complete", {"ref": {"type": "ref/resource",
                                                                  "uri": "b://item/{id}/data"},
                                                          "argument": {"name": "id", "value": "1"}})
    assert rig.servers["a"].received == [("surface", "completion/complete", {
        "ref": {"type": "ref/prompt", "name": "greet"}, "argument": {"name": "who", "value": "w"}})]
    assert [r[1] for r in rig.servers["b"].received] == ["completion/complete"]
    decision = (await rig.records())[0]
    assert decision["method"] == "a.completion/complete"


async def test_what_a_client_may_not_use_is_not_listed(rig: Rig) -> None:
    resources = (await rig.request(SOME, "resources/list"))["result"]["resources"]
    # b's shared://x is b's for this client: a's does not exist for it.
    assert [r["uri"] for r in resources] == ["b://doc", "shared://x"]
    assert [p["name"] for p in (await rig.request(SOME, "prompts/list"))["result"]["prompts"]] == ["a__greet"]
    for method, key in (("resources/list", "resources"), ("resources/templates/list", "resourceTemplates"),
                        ("prompts/list", "prompts")):
        assert (await rig.request(NOTHING, method))["result"] == {key: []}


DENIED_AND_UNKNOWN = [
    # (method, params the client may not use, params of something that does not exist)
    ("resources/read", {"uri": "a://doc"}, {"uri": "nowhere://doc"}),
    ("resources/read", {"uri": "a://item/1/data"}, {"uri": "nowhere://item/1/data"}),
    ("resources/subscribe", {"uri": "a://doc"}, {"uri": "nowhere://doc"}),
    ("resources/unsubscribe", {"uri": "a://doc"}, {"uri": "nowhere://doc"}),
    ("prompts/get", {"name": "b__greet"}, {"name": "b__nothing"}),
    ("completion/complete", {"ref": {"type": "ref/prompt", "name": "b__greet"}, "argument": {"name": "n", "value": ""}},
     {"ref": {"type": "ref/prompt", "name": "z__greet"}, "argument": {"name": "n", "value": ""}}),
    ("completion/complete", {"ref": {"type": "ref/resource", "uri": "a://item/{id}/data"},
                             "argument": {"name": "id", "value": ""}},
     {"ref": {"type": "ref/resource", "uri": "z://item/{id}/data"}, "argument": {"name": "id", "value": ""}}),
]


def _shape(error: dict[str, Any], name: str) -> str:
    return json.dumps(error).replace(name, "NAME")


def _name(params: dict[str, Any]) -> str:
    ref = params.get("ref", {})
    return str(params.get("uri") or params.get("name") or ref.get("name") or ref.get("uri"))


@pytest.mark.parametrize(("method", "denied", "absent"), DENIED_AND_UNKNOWN)
async def test_denied_answers_exactly_as_unknown_and_reaches_nothing(
    rig: Rig, method: str, denied: dict[str, Any], absent: dict[str, Any]
) -> None:
    refused = (await rig.request(SOME, method, denied))["error"]
    missing = (await rig.request(SOME, method, absent))["error"]
    assert refused["code"] == missing["code"] == -32602
    assert _shape(refused, _name(denied)) == _shape(missing, _name(absent))
    assert rig.servers["a"].received == rig.servers["b"].received == []
    assert all(record["decision"] == "deny" for record in await rig.records())


async def test_without_any_grant_nothing_of_a_server_can_be_reached(rig: Rig) -> None:
    for method, denied, _absent in DENIED_AND_UNKNOWN:
        assert (await rig.request(NOTHING, method, denied))["error"]["code"] == -32602
    assert (await rig.request(NOTHING, "resources/read", {"uri": "b://doc"}))["error"]["code"] == -32602
    assert rig.servers["a"].received == rig.servers["b"].received == []


async def test_completion_needs_its_own_grant_too(rig: Rig) -> None:
    reader = Principal("r", (Grant("r", "p.toml", allow=("b.resources/read",)),))
    answer = await rig.request(reader, "completion/complete", {
        "ref": {"type": "ref/resource", "uri": "b://item/{id}/data"}, "argument": {"name": "id", "value": ""}})
    assert answer["error"] == {"code": -32602, "message": "Unknown reference: b://item/{id}/data"}
    assert rig.servers["b"].received == []


async def test_updates_reach_only_subscribed_sessions_that_may_still_read(rig: Rig) -> None:
    sessions = Sessions(10, 3600)
    mine = sessions.create("all", {})
    other = sessions.create("all", {})
    assert "result" in await rig.request(EVERYTHING, "resources/subscribe", {"uri": "a://doc"}, session=mine)
    assert mine.subscriptions == {("a", "a://doc")}
    principals = {"all": EVERYTHING}

    class Tokens:
        def principal(self, client: str) -> Principal | None:
            return principals.get(client)

    updated = {"jsonrpc": "2.0", "method": surfaces.UPDATED, "params": {"uri": "a://doc"}}
    surfaces.tell(sessions, Tokens(), "a", updated)  # type: ignore[arg-type]
    surfaces.tell(sessions, Tokens(), "b", updated)  # type: ignore[arg-type]  # b's is not what mine subscribed to
    assert mine.outbound.get_nowait() == updated
    assert mine.outbound.empty() and other.outbound.empty()
    principals["all"] = NOTHING  # a reload took the grant away
    surfaces.tell(sessions, Tokens(), "a", updated)  # type: ignore[arg-type]
    assert mine.outbound.empty()
    principals["all"] = EVERYTHING
    changed = {"jsonrpc": "2.0", "method": surfaces.PROMPTS_CHANGED}
    surfaces.tell(sessions, Tokens(), "a", changed)  # type: ignore[arg-type]
    assert mine.outbound.get_nowait() == changed and other.outbound.get_nowait() == changed
    await rig.request(EVERYTHING, "resources/unsubscribe", {"uri": "a://doc"}, session=mine)
    assert mine.subscriptions == set()


@pytest.mark.parametrize(("template", "uri", "matches"), [
    ("test://template/{id}/data", "test://template/123/data", True),
    ("test://template/{id}/data", "test://template/1/2/data", False),
    ("file:///{+path}", "file:///a/b/c", True),
    ("search://q{?term,limit}", "search://q?term=x&limit=2", True),
    ("x://{a}", "y://b", False),
    ("x://{broken", "x://{broken", False),
    ("x://a}b/{id}", "x://a}b/7", True),
    ("{+whole}", "anything:at/all", True),
    ("x://{{id}", "x://{7", True),
    ("x://{.ext}", "x://.json", True),
])
def test_template_matching(template: str, uri: str, matches: bool) -> None:
    assert surfaces.template_matches(template, uri) is matches


def test_prompt_names_reverse_exactly() -> None:
    catalog = Catalog("_")
    test, bare = Scripted("test", []), Scripted("bare", [], exposed="")
    mine = Scripted("zz", [], exposed="my_server")  # a prefix holding the separator still reverses
    servers: dict[str, Upstream] = {"test": test, "bare": bare, "zz": mine}
    assert catalog.prompt_name("test", "simple_prompt") == "test_simple_prompt"
    assert catalog.prompt_name("", "simple_prompt") == "simple_prompt"
    assert catalog.prompt_name("test", "") is None and catalog.prompt_name("test", "p" * 257) is None
    assert catalog.prompt_candidates("test_simple_prompt", servers) == [
        (test, "simple_prompt"), (bare, "test_simple_prompt")]
    assert catalog.prompt_candidates("my_server_p", servers) == [(mine, "p"), (bare, "my_server_p")]
    assert catalog.prompt_candidates("nosep", servers) == [(bare, "nosep")]
    assert catalog.prompt_candidates("", servers) == []


def test_explain_says_what_a_surface_grant_covers(tmp_path: Path) -> None:
    calc = 'protocol = "jsonrpc"\ncommand = ["true"]\n[methods.add]\n'
    write_config(tmp_path, {"docs": faultsrv_command(), "calc": calc},
                 '[roles.r]\nallow = ["docs.resources/read", "calc.*"]\n', {"c": ["r"]})
    snapshot = load_snapshot(tmp_path)
    lines = list(explain(snapshot, "c", "docs.resources/read", None))
    assert lines[0] == "allow: c may call docs.resources/read"
    assert "pattern 'docs.resources/read'" in lines[1]
    assert "resources/subscribe" in lines[2]
    assert list(explain(snapshot, "c", "docs.prompts/get", None))[0].startswith(
        "deny: c may not call docs.prompts/get")
    assert "offers no resources" in list(explain(snapshot, "c", "calc.resources/read", None))[-1]


async def test_a_plain_json_rpc_server_lists_no_resources_or_prompts_and_is_not_started(tmp_path: Path) -> None:
    write_config(tmp_path, {"calc": 'protocol = "jsonrpc"\ncommand = ["true"]\n[methods.add]\n'})
    server = ToolServer("calc", load_snapshot(tmp_path).servers["calc"], tmp_path)
    for kind in ("resources", "resourceTemplates", "prompts"):
        assert await server.surface(kind) == []
    assert server.pid is None


async def test_one_sessions_unsubscribe_leaves_anothers_subscription_at_the_server(rig: Rig) -> None:
    sessions = Sessions(10, 3600)
    mine, theirs = sessions.create("all", {}), sessions.create("all", {})
    for session in (mine, theirs):
        assert "result" in await rig.request(EVERYTHING, "resources/subscribe", {"uri": "a://doc"}, session=session)
    sent = [entry[1] for entry in rig.servers["a"].received]
    assert await rig.request(EVERYTHING, "resources/unsubscribe", {"uri": "a://doc"}, session=mine) == {
        "jsonrpc": "2.0", "id": 1, "result": {}}
    assert [entry[1] for entry in rig.servers["a"].received] == sent  # the server still serves theirs
    assert mine.subscriptions == set() and theirs.subscriptions == {("a", "a://doc")}
    sessions.delete(theirs.id)  # the last subscriber ended: a new one is told to the server again
    again = sessions.create("all", {})
    await rig.request(EVERYTHING, "resources/subscribe", {"uri": "a://doc"}, session=again)
    await rig.request(EVERYTHING, "resources/unsubscribe", {"uri": "a://doc"}, session=again)
    assert [entry[1] for entry in rig.servers["a"].received][-1] == "resources/unsubscribe"


def test_explain_says_what_a_server_may_ask_the_caller_during_the_call(tmp_path: Path) -> None:
    write_config(tmp_path, {"asker": faultsrv_command() + '\nrelay = ["sampling", "roots"]\n',
                            "quiet": faultsrv_command()}, '[roles.r]\nallow = ["asker.*", "quiet.*"]\n',
                 {"c": ["r"]})
    snapshot = load_snapshot(tmp_path)
    assert list(explain(snapshot, "c", "asker.tool", None))[-1] == \
        "  during the call, asker may ask the caller's client for: sampling, roots"
    assert not any("may ask" in line for line in explain(snapshot, "c", "quiet.tool", None))


def _renewing(rig: Rig, principals: dict[str, Principal]) -> surfaces.Surfaces:
    """The gateway's Surfaces as the daemon wires it: who may still read, and the current servers."""
    owners = surfaces.Surfaces(rig.gateway.catalog, principals.get, lambda: rig.servers)
    rig.gateway.surfaces = owners
    return owners


async def test_the_last_session_to_end_unsubscribes_the_child_and_only_a_running_one(rig: Rig) -> None:
    owners = _renewing(rig, {"all": EVERYTHING})
    sessions = Sessions(10, 3600)
    mine, theirs = sessions.create("all", {}), sessions.create("all", {})
    for session in (mine, theirs):
        await rig.request(EVERYTHING, "resources/subscribe", {"uri": "a://doc"}, session=session)
    await rig.request(EVERYTHING, "resources/subscribe", {"uri": "b://doc"}, session=mine)
    rig.servers["a"].pid = 100  # a's child runs; b's was stopped (idle): it holds nothing to end
    subscribes = list(rig.servers["a"].received)
    sessions.delete(mine.id)
    await eventually(lambda: not owners._sending, what="the unsubscriptions sent")
    assert rig.servers["a"].received == subscribes  # theirs still holds a://doc
    assert [entry[1] for entry in rig.servers["b"].received] == ["resources/subscribe"]
    sessions.delete(theirs.id)
    await eventually(lambda: rig.servers["a"].received[-1] == ("surface", "resources/unsubscribe",
                                                                {"uri": "a://doc"}), what="unsubscribed")


async def test_a_new_child_is_subscribed_again_to_what_sessions_that_may_still_read_hold(rig: Rig) -> None:
    principals = {"all": EVERYTHING, "some": SOME}
    owners = _renewing(rig, principals)
    sessions = Sessions(10, 3600)
    everything, some = sessions.create("all", {}), sessions.create("some", {})
    await rig.request(EVERYTHING, "resources/subscribe", {"uri": "a://doc"}, session=everything)
    await rig.request(SOME, "resources/subscribe", {"uri": "b://doc"}, session=some)
    await rig.request(EVERYTHING, "resources/subscribe", {"uri": "shared://x"}, session=everything)
    for server in rig.servers.values():
        server.received.clear()
    owners.child_up(rig.servers["a"])
    owners.child_up(rig.servers["b"])
    await eventually(lambda: len(rig.servers["a"].received) == 2 and len(rig.servers["b"].received) == 1,
                     what="subscribed again")
    assert sorted(entry[2]["uri"] for entry in rig.servers["a"].received) == ["a://doc", "shared://x"]
    assert rig.servers["b"].received == [("surface", "resources/subscribe", {"uri": "b://doc"})]
    # A reload took `some`'s read grant away: b's next child is not subscribed for it.
    principals["some"] = NOTHING
    rig.servers["b"].received.clear()
    owners.child_up(rig.servers["b"])
    await owners.close()
    assert rig.servers["b"].received == []
