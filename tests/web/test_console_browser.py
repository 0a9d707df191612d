"""The approval page in a real browser (headless Chromium via Playwright): sign in, a live list, approve, deny.

Needs Debian's chromium at /usr/bin/chromium; without it the test is skipped, unless
GATEWAYD_REQUIRE_BROWSER=1 (CI), which makes a missing browser a failure.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from playwright.async_api import Browser, ConsoleMessage, Page, Route, async_playwright, expect

from gatewayd.tokens import new_token
from gatewayd.web import console
from tests.stack import running_stack
from tests.waiting import eventually
from tests.web.test_console import console_config, pending_id, start_call

CHROMIUM = Path("/usr/bin/chromium")
LAUNCH_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
               "--disable-background-networking", "--disable-component-update", "--disable-sync"]
# Bound on every browser wait (an element showing up, a click, a navigation), in milliseconds.
STEP_TIMEOUT_MS = 5000
# Bound on launching the browser: a cold start on a loaded 2-core CI machine is slow.
LAUNCH_TIMEOUT_MS = 30000
SCREENSHOT = Path("/tmp/console.png")
# Arguments an attacker controls: markup in them must show as text, never run.
HOSTILE = {
    "command": "<img src=x onerror=\"document.title='pwned'\"><script>document.title='pwned'</script>",
    "nested": {"paths": ["/etc/passwd", "/srv/data/a b.txt"], "note": "line one\nline two", "n": 12.5},
}


@pytest.fixture
def chromium() -> Path:
    """Debian's chromium; skip without it, or fail when CI requires the browser tests."""
    if not CHROMIUM.exists():
        reason = f"{CHROMIUM} is missing (apt-get install chromium)"
        if os.environ.get("GATEWAYD_REQUIRE_BROWSER") == "1":
            pytest.fail(f"{reason}, and GATEWAYD_REQUIRE_BROWSER=1")
        pytest.skip(reason)
    return CHROMIUM


@pytest.fixture
async def browser(chromium: Path) -> AsyncIterator[Browser]:
    async with async_playwright() as playwright:
        launched = await playwright.chromium.launch(executable_path=str(chromium), args=LAUNCH_ARGS,
                                                    timeout=LAUNCH_TIMEOUT_MS)
        try:
            yield launched
        finally:
            await launched.close()


async def open_page(browser: Browser, url: str, width: int = 900) -> tuple[Page, list[str]]:
    """A fresh page on `url`, and the Content-Security-Policy violations it reports (there should be none)."""
    page = await browser.new_page(viewport={"width": width, "height": 1000})
    page.set_default_timeout(STEP_TIMEOUT_MS)
    violations: list[str] = []

    def on_console(message: ConsoleMessage) -> None:
        if "Content Security Policy" in message.text:
            violations.append(message.text)

    page.on("console", on_console)
    await page.goto(url)
    return page, violations


async def sign_in(page: Page, token: str) -> None:
    await page.get_by_label("Operator token").fill(token)
    await page.get_by_role("button", name="Connect").click()


async def test_an_operator_approves_and_denies_live_calls(tmp_path: Path, browser: Browser) -> None:
    tokens = console_config(tmp_path)
    async with running_stack(tmp_path) as (client, state):
        page, violations = await open_page(browser, client.base + console.PAGE_PATH)
        status = page.locator("#status")

        # A wrong token, or an agent's, is refused with a clear message and not kept.
        for wrong in (new_token(), tokens.agent):
            await sign_in(page, wrong)
            await expect(page.get_by_role("alert")).to_contain_text("refused this token (HTTP 401)",
                                                                    timeout=STEP_TIMEOUT_MS)
            await expect(status).to_have_attribute("data-state", "refused", timeout=STEP_TIMEOUT_MS)
            assert await page.evaluate("sessionStorage.length") == 0
        await page.screenshot(path=str(SCREENSHOT.with_name("console-login.png")))

        await sign_in(page, tokens.operator)
        await expect(status).to_have_attribute("data-state", "live", timeout=STEP_TIMEOUT_MS)
        await expect(page.locator("#count")).to_have_text("No calls are waiting for a decision.",
                                                          timeout=STEP_TIMEOUT_MS)
        assert page.url == client.base + console.PAGE_PATH  # the token never reaches the address bar

        # Calls made after the page loaded show up live, with their full arguments as plain text.
        echo = start_call(client, tokens.agent, "calc.echo", HOSTILE)
        echo_id = await pending_id(state, 1)
        add = start_call(client, tokens.agent, "calc.add", {"a": 2, "b": 3})
        add_id = await pending_id(state, 2)
        echo_item = page.locator(f'[data-approval-id="{echo_id}"]')
        add_item = page.locator(f'[data-approval-id="{add_id}"]')
        await expect(echo_item).to_be_visible(timeout=STEP_TIMEOUT_MS)
        await expect(add_item).to_be_visible(timeout=STEP_TIMEOUT_MS)
        await expect(echo_item).to_contain_text("calc.echo", timeout=STEP_TIMEOUT_MS)
        await expect(echo_item).to_contain_text("from agent", timeout=STEP_TIMEOUT_MS)
        await expect(echo_item).to_contain_text("Expires in", timeout=STEP_TIMEOUT_MS)
        shown = await echo_item.locator('[data-field="arguments"]').text_content()
        assert shown is not None and json.loads(shown) == HOSTILE and "<img src=x onerror=" in shown
        assert await page.locator("img").count() == 0 and await page.title() != "pwned"
        await expect(page.locator("#count")).to_have_text("2 calls are waiting for a decision.",
                                                          timeout=STEP_TIMEOUT_MS)

        # Approve, allowing the very same call again for 10 minutes: the waiting call gets its result, the page
        # shows gatewayd's answer and the outcome, and the same call then runs without asking.
        await echo_item.locator('[data-field="allow-again"]').select_option("600")
        await echo_item.locator('[data-action="approve"]').click()
        assert (await echo)["result"] == HOSTILE
        [standing] = state.approvals.standing()
        assert standing.approval_id == echo_id and standing.by == "operator alice (web page)"
        await expect(echo_item.locator('[data-field="message"]')).to_contain_text(f"approval {echo_id} approved",
                                                                                  timeout=STEP_TIMEOUT_MS)
        await expect(echo_item).to_have_attribute("data-state", "approved", timeout=STEP_TIMEOUT_MS)
        await expect(echo_item.locator('[data-action="approve"]')).to_be_disabled(timeout=STEP_TIMEOUT_MS)
        await expect(page.locator("#recent")).to_contain_text("Approved by operator alice (web page)",
                                                              timeout=STEP_TIMEOUT_MS)
        await page.screenshot(path=str(SCREENSHOT), full_page=True)

        # Deny with a reason: the call gets -32015 carrying that reason.
        await add_item.get_by_label("Reason for denying").fill("not during the release freeze")
        await add_item.locator('[data-action="deny"]').click()
        error = (await add)["error"]
        assert error["code"] == -32015 and error["data"]["approval_id"] == add_id
        assert error["data"]["reason"] == "not during the release freeze"
        await expect(add_item.locator('[data-field="message"]')).to_contain_text(f"approval {add_id} denied",
                                                                                 timeout=STEP_TIMEOUT_MS)
        await expect(add_item).to_have_attribute("data-state", "denied", timeout=STEP_TIMEOUT_MS)
        await expect(page.locator("#count")).to_have_text("No calls are waiting for a decision.",
                                                          timeout=STEP_TIMEOUT_MS)
        assert violations == []
        await page.close()


async def test_the_page_on_a_narrow_screen_keeps_everything_reachable(tmp_path: Path, browser: Browser) -> None:
    tokens = console_config(tmp_path)
    async with running_stack(tmp_path) as (client, state):
        page, violations = await open_page(browser, client.base + console.PAGE_PATH, width=360)
        await sign_in(page, tokens.operator)
        call = start_call(client, tokens.agent, "calc.echo", {"text": "x" * 400})
        approval_id = await pending_id(state)
        item = page.locator(f'[data-approval-id="{approval_id}"]')
        await expect(item).to_be_visible(timeout=STEP_TIMEOUT_MS)
        # Nothing overflows sideways: long arguments wrap inside the card.
        assert await page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
        await page.screenshot(path=str(SCREENSHOT.with_name("console-narrow.png")), full_page=True)
        await item.locator('[data-action="deny"]').click()
        assert (await call)["error"]["code"] == -32015
        assert violations == []
        await page.close()


async def test_the_page_reconnects_with_backoff_when_the_stream_fails(
    tmp_path: Path, browser: Browser, monkeypatch: pytest.MonkeyPatch
) -> None:
    tokens = console_config(tmp_path)
    async with running_stack(tmp_path) as (client, state):
        # First the stream is refused (503: too many pages open); the page keeps retrying.
        monkeypatch.setattr(console, "MAX_STREAMS", 0)
        page, violations = await open_page(browser, client.base + console.PAGE_PATH)
        await sign_in(page, tokens.operator)
        status = page.locator("#status")
        await expect(status).to_have_attribute("data-state", "retrying", timeout=STEP_TIMEOUT_MS)
        await expect(status).to_contain_text("HTTP 503", timeout=STEP_TIMEOUT_MS)
        monkeypatch.undo()
        await expect(status).to_have_attribute("data-state", "live", timeout=STEP_TIMEOUT_MS)
        first = start_call(client, tokens.agent, "calc.add", {"a": 1, "b": 2})
        first_id = await pending_id(state, 1)
        await expect(page.locator(f'[data-approval-id="{first_id}"]')).to_be_visible(timeout=STEP_TIMEOUT_MS)

        # Then the open stream breaks mid-way (an event the server cannot encode kills its handler).
        watchers = list(state.approvals._watchers)
        assert len(watchers) == 1
        broken: dict[str, Any] = {"type": "pending", "approval": object()}
        watchers[0].put_nowait(broken)
        await eventually(lambda: bool(state.approvals._watchers - set(watchers)), what="a new stream")
        # Only a reopened stream can show a call made after the break.
        second = start_call(client, tokens.agent, "calc.add", {"a": 3, "b": 4})
        second_id = await pending_id(state, 2)
        await expect(page.locator(f'[data-approval-id="{second_id}"]')).to_be_visible(timeout=STEP_TIMEOUT_MS)
        await expect(page.locator(f'[data-approval-id="{first_id}"]')).to_have_attribute(
            "data-state", "pending", timeout=STEP_TIMEOUT_MS)
        await expect(status).to_have_attribute("data-state", "live", timeout=STEP_TIMEOUT_MS)
        for approval_id in (first_id, second_id):
            await page.locator(f'[data-approval-id="{approval_id}"] [data-action="approve"]').click()
        assert [(await first)["result"], (await second)["result"]] == [3, 7]
        assert violations == []
        await page.close()


async def test_the_page_works_under_a_proxys_path_prefix(tmp_path: Path, browser: Browser) -> None:
    """Published at /gw/approvals by a proxy that takes /gw off (here the browser's own request routing, as nginx's
    and Caddy's shipped lines do in tests/e2e/test_proxy.py): the page's API calls go under the prefix too."""
    tokens = console_config(tmp_path)
    async with running_stack(tmp_path) as (client, state):
        page = await browser.new_page()
        page.set_default_timeout(STEP_TIMEOUT_MS)
        prefixed = client.base + "/gw"
        asked: list[str] = []

        async def take_the_prefix_off(route: Route) -> None:
            asked.append(route.request.url.removeprefix(prefixed))
            await route.continue_(url=client.base + route.request.url.removeprefix(prefixed))

        await page.route(prefixed + "/**", take_the_prefix_off)
        await page.goto(prefixed + console.PAGE_PATH)
        await sign_in(page, tokens.operator)
        await expect(page.locator("#status")).to_have_attribute("data-state", "live", timeout=STEP_TIMEOUT_MS)
        call = start_call(client, tokens.agent, "calc.add", {"a": 5, "b": 6})
        approval_id = await pending_id(state)
        await page.locator(f'[data-approval-id="{approval_id}"] [data-action="approve"]').click()
        assert (await call)["result"] == 11
        assert asked[0] == console.PAGE_PATH
        assert f"{console.API_PATH}/stream" in asked and f"{console.API_PATH}/{approval_id}/approve" in asked
        await page.close()
