"""/metrics: a scraper's token reads it and nothing else; the series count what really happened."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

from gatewayd.admin import AdminClient
from gatewayd.config.edit import set_operator_token
from gatewayd.tokens import hash_token, new_token
from tests.daemon import FAULTSRV, python_command, write_config
from tests.stack import running_stack
from tests.waiting import eventually

SPY = '\nprotocol = "jsonrpc"\n[methods.echo]\n[methods.crash]\n'
ROLES = '[roles.r]\nallow = ["spy.*"]\n[roles.r.confirmation."spy.*"]\ntimeout = "10ms"\n'


def sample(text: str, series: str) -> float:
    """The value of one exact series line (name and labels) in the exposition."""
    match = re.search(rf"^{re.escape(series)} (\S+)$", text, re.MULTILINE)
    assert match is not None, f"{series} not in:\n{text}"
    return float(match.group(1))


async def test_metrics_count_calls_servers_and_config(tmp_path: Path) -> None:
    tokens = write_config(tmp_path, {"spy": python_command(str(FAULTSRV)) + SPY}, ROLES, {"c": ["r"]})
    scraper, operator = new_token(), new_token()
    policy = tmp_path / "policies" / "ops.toml"
    set_operator_token(policy, "prometheus", hash_token(scraper), kind="scrapers")
    set_operator_token(policy, "alice", hash_token(operator))
    async with running_stack(tmp_path) as (client, state):
        auth = {"Authorization": f"Bearer {tokens['c']}", "Content-Type": "application/json"}
        for n in range(3):
            await client.post("/mcp", json={"jsonrpc": "2.0", "id": n, "method": "spy.echo", "params": {}},
                              headers=auth)
        await client.post("/mcp", json={"jsonrpc": "2.0", "id": 9, "method": "spy.nosuch"}, headers=auth)
        for token in (None, tokens["c"], operator):
            headers = {"Authorization": f"Bearer {token}"} if token else {}
            assert (await client.get("/metrics", headers=headers)).status == 401
        response = await client.get("/metrics", headers={"Authorization": f"Bearer {scraper}"})
        assert response.status == 200 and response.content_type == "text/plain"
        text = await response.text()
        assert sample(text, 'gatewayd_calls_total{server="spy",method="echo",outcome="ok"}') == 3
        assert sample(text, "gatewayd_calls_denied_total") == 1
        assert sample(text, 'gatewayd_call_duration_seconds_count{server="spy"}') == 3
        assert sample(text, 'gatewayd_call_duration_seconds_bucket{server="spy",le="+Inf"}') == 3
        assert sample(text, 'gatewayd_servers{state="running"}') == 1
        assert sample(text, "gatewayd_children_running") == 1
        assert sample(text, "gatewayd_config_in_sync") == 1 and sample(text, "gatewayd_config_generation") == 1
        assert sample(text, "gatewayd_pending_approvals") == 0 and sample(text, "gatewayd_audit_healthy") == 1
        assert sample(text, "gatewayd_audit_space_low") == 0
        assert sample(text, "gatewayd_audit_records_failed_total") == 0
        assert "# TYPE gatewayd_call_duration_seconds histogram" in text
        # Python's cyclic collector, as Prometheus' own Python client names it: runs and objects by generation.
        for generation in range(3):
            assert sample(text, f'python_gc_collections_total{{generation="{generation}"}}') >= 0
            assert sample(text, f'python_gc_objects_collected_total{{generation="{generation}"}}') >= 0
        assert "# TYPE python_gc_objects_collected_total counter" in text
        # The same text on the admin socket; a config edited on disk shows as out of sync.
        (tmp_path / "policies" / "roles.toml").write_text(ROLES + "# edited\n")
        admin = AdminClient(state.settings.admin_socket_path() or Path("/nonexistent"))
        status, local = await admin.text("/metrics")
        assert status == 200 and sample(local, "gatewayd_config_in_sync") == 0


async def test_a_call_waiting_for_approval_is_a_pending_approval(tmp_path: Path) -> None:
    roles = '[roles.r]\nallow = ["spy.*"]\n'
    tokens = write_config(tmp_path, {"spy": python_command(str(FAULTSRV)) + SPY + "confirm = true\n"}, roles,
                          {"c": ["r"]})
    async with running_stack(tmp_path) as (client, state):
        auth = {"Authorization": f"Bearer {tokens['c']}", "Content-Type": "application/json"}
        call = asyncio.create_task(client.post("/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "spy.crash"},
                                               headers=auth))
        await eventually(lambda: bool(state.approvals.pending()), what="the call waits for approval")
        assert state.metrics_text is not None
        assert sample(await state.metrics_text(), "gatewayd_pending_approvals") == 1
        [approval] = state.approvals.pending()
        state.approvals.decide(approval.id, approve=False, by="test", channel="gatewayctl")
        await (await call).read()


async def test_calls_waiting_for_a_slot_are_counted_while_they_wait_and_after(tmp_path: Path) -> None:
    # One slot: a sleeping call holds it, the next waits for it; the operator sees that wait on /metrics (and
    # `gatewayctl status`), which says the server's max_in_flight is short for its load.
    server = python_command(str(FAULTSRV)) + '\nprotocol = "jsonrpc"\nmax_in_flight = 1\n[methods.sleep]\n' \
        '[methods.echo]\n'
    tokens = write_config(tmp_path, {"spy": server}, '[roles.r]\nallow = ["spy.*"]\n', {"c": ["r"]})
    async with running_stack(tmp_path) as (client, state):
        auth = {"Authorization": f"Bearer {tokens['c']}", "Content-Type": "application/json"}
        assert state.metrics_text is not None
        await client.post("/mcp", json={"jsonrpc": "2.0", "id": 0, "method": "spy.echo"}, headers=auth)
        text = await state.metrics_text()
        assert sample(text, 'gatewayd_server_calls_waiting{server="spy"}') == 0
        assert sample(text, 'gatewayd_server_calls_queued_total{server="spy"}') == 0

        async def call(request_id: int, method: str, params: dict[str, float]) -> dict[str, object]:
            response = await client.post("/mcp", json={"jsonrpc": "2.0", "id": request_id, "method": method,
                                                       "params": params}, headers=auth)
            answer: dict[str, object] = await response.json()
            return answer

        sleeping = asyncio.create_task(call(1, "spy.sleep", {"seconds": 0.5}))
        await eventually(lambda: state.generation.servers["spy"].status()["in_flight"] == 1, what="the sleep runs")
        waiting = asyncio.create_task(call(2, "spy.echo", {}))
        await eventually(lambda: state.generation.servers["spy"].status()["waiting"] == 1, what="the echo waits")
        text = await state.metrics_text()
        assert sample(text, 'gatewayd_server_calls_in_flight{server="spy"}') == 1
        assert sample(text, 'gatewayd_server_calls_waiting{server="spy"}') == 1
        assert sample(text, 'gatewayd_server_calls_queued_total{server="spy"}') == 1
        assert "# TYPE gatewayd_server_calls_queued_total counter" in text
        assert (await sleeping)["result"] == {"slept": 0.5} and (await waiting)["result"] == {}
        text = await state.metrics_text()
        assert sample(text, 'gatewayd_server_calls_waiting{server="spy"}') == 0
        assert sample(text, 'gatewayd_server_calls_queued_total{server="spy"}') == 1
