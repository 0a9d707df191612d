"""Every example of section 7 of the JSON-RPC 2.0 specification, through the gateway's endpoint.

The methods live on a stdio server named `spec`, so `subtract` is called as `spec.subtract`;
everything else — params, ids, errors, batches, notifications — is the specification's text.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.daemon import REPO, python_command, write_config
from tests.stack import LocalClient, running_stack

SPEC_SERVER = python_command(str(REPO / "tests" / "fixtures" / "specsrv.py")) + """
protocol = "jsonrpc"
[methods.subtract]
[methods.sum]
[methods.get_data]
[methods.update]
notification = true
[methods.notify_hello]
notification = true
[methods.notify_sum]
notification = true
"""

Client = LocalClient


@pytest.fixture
async def spec(tmp_path: Path) -> AsyncIterator[tuple[Client, str]]:
    tokens = write_config(tmp_path, {"spec": SPEC_SERVER}, '[roles.r]\nallow = ["spec.*", "foo.*"]\n', {"c": ["r"]})
    async with running_stack(tmp_path) as (client, _):
        yield client, tokens["c"]


async def post(spec: tuple[Client, str], body: str) -> tuple[int, Any]:
    client, token = spec
    response = await client.post(
        "/mcp", data=body, headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    )
    text = await response.text()
    return response.status, (await response.json() if text else None)


async def test_positional_parameters(spec: tuple[Client, str]) -> None:
    assert await post(spec, '{"jsonrpc": "2.0", "method": "spec.subtract", "params": [42, 23], "id": 1}') == (
        200, {"jsonrpc": "2.0", "result": 19, "id": 1})
    assert await post(spec, '{"jsonrpc": "2.0", "method": "spec.subtract", "params": [23, 42], "id": 2}') == (
        200, {"jsonrpc": "2.0", "result": -19, "id": 2})


async def test_named_parameters(spec: tuple[Client, str]) -> None:
    body = '{"jsonrpc": "2.0", "method": "spec.subtract", "params": {"subtrahend": 23, "minuend": 42}, "id": 3}'
    assert await post(spec, body) == (200, {"jsonrpc": "2.0", "result": 19, "id": 3})
    body = '{"jsonrpc": "2.0", "method": "spec.subtract", "params": {"minuend": 42, "subtrahend": 23}, "id": 4}'
    assert await post(spec, body) == (200, {"jsonrpc": "2.0", "result": 19, "id": 4})


async def test_notifications_get_no_answer(spec: tuple[Client, str]) -> None:
    assert await post(spec, '{"jsonrpc": "2.0", "method": "spec.update", "params": [1,2,3,4,5]}') == (202, None)
    assert await post(spec, '{"jsonrpc": "2.0", "method": "spec.foobar"}') == (202, None)


async def test_non_existent_method(spec: tuple[Client, str]) -> None:
    status, body = await post(spec, '{"jsonrpc": "2.0", "method": "spec.foobar", "id": "1"}')
    assert status == 200
    assert body == {"jsonrpc": "2.0", "error": {"code": -32601, "message": "Method not found"}, "id": "1"}


async def test_invalid_json(spec: tuple[Client, str]) -> None:
    status, body = await post(spec, '{"jsonrpc": "2.0", "method": "foobar, "params": "bar", "baz]')
    assert status == 400
    assert body == {"jsonrpc": "2.0", "error": {"code": -32700, "message": "Parse error"}, "id": None}


async def test_invalid_request_object(spec: tuple[Client, str]) -> None:
    status, body = await post(spec, '{"jsonrpc": "2.0", "method": 1, "params": "bar"}')
    assert body == {"jsonrpc": "2.0", "error": {"code": -32600, "message": "Invalid Request"}, "id": None}


async def test_batch_with_invalid_json(spec: tuple[Client, str]) -> None:
    body = """[
      {"jsonrpc": "2.0", "method": "spec.sum", "params": [1,2,4], "id": "1"},
      {"jsonrpc": "2.0", "method"
    ]"""
    status, answer = await post(spec, body)
    assert status == 400
    assert answer == {"jsonrpc": "2.0", "error": {"code": -32700, "message": "Parse error"}, "id": None}


async def test_empty_array(spec: tuple[Client, str]) -> None:
    status, body = await post(spec, "[]")
    assert body["error"]["code"] == -32600 and body["id"] is None


async def test_invalid_batch_of_one(spec: tuple[Client, str]) -> None:
    status, body = await post(spec, "[1]")
    assert (status, body) == (200, [{"jsonrpc": "2.0", "error": {"code": -32600, "message": "Invalid Request"},
                                     "id": None}])


async def test_invalid_batch_of_three(spec: tuple[Client, str]) -> None:
    status, body = await post(spec, "[1,2,3]")
    assert status == 200
    assert [item["error"]["code"] for item in body] == [-32600, -32600, -32600]
    assert [item["id"] for item in body] == [None, None, None]


async def test_mixed_batch_is_answered_by_id(spec: tuple[Client, str]) -> None:
    body = """[
        {"jsonrpc": "2.0", "method": "spec.sum", "params": [1,2,4], "id": "1"},
        {"jsonrpc": "2.0", "method": "spec.notify_hello", "params": [7]},
        {"jsonrpc": "2.0", "method": "spec.subtract", "params": [42,23], "id": "2"},
        {"foo": "boo"},
        {"jsonrpc": "2.0", "method": "foo.get", "params": {"name": "myself"}, "id": "5"},
        {"jsonrpc": "2.0", "method": "spec.get_data", "id": "9"}
    ]"""
    status, answer = await post(spec, body)
    assert status == 200
    by_id = {item["id"]: item for item in answer if item["id"] is not None}
    assert len(answer) == 5
    assert by_id["1"]["result"] == 7
    assert by_id["2"]["result"] == 19
    assert by_id["5"]["error"]["code"] == -32601
    assert by_id["9"]["result"] == ["hello", 5]
    assert [item["error"]["code"] for item in answer if item["id"] is None] == [-32600]


async def test_batch_of_notifications_only(spec: tuple[Client, str]) -> None:
    body = """[
        {"jsonrpc": "2.0", "method": "spec.notify_sum", "params": [1,2,4]},
        {"jsonrpc": "2.0", "method": "spec.notify_hello", "params": [7]}
    ]"""
    assert await post(spec, body) == (202, None)


async def test_duplicate_keys_are_an_invalid_request(spec: tuple[Client, str]) -> None:
    status, body = await post(spec, '{"jsonrpc": "2.0", "method": "spec.sum", "method": "spec.get_data", "id": 1}')
    assert status == 400
    assert body["error"]["code"] == -32600 and body["id"] is None
