"""The approval page's style, script and body are package files: served inline as they are, under CSP hashes of
exactly what is served, and shipped in the wheel."""

from __future__ import annotations

import base64
import fnmatch
import hashlib
import json
import tomllib
from collections.abc import AsyncIterator
from html.parser import HTMLParser
from importlib.resources import files
from pathlib import Path
from urllib.parse import urljoin

import pytest

from gatewayd import approvals
from gatewayd.web import console
from tests.stack import LocalClient, running_stack
from tests.web.test_console import console_config

ASSETS = files("gatewayd.web") / "assets"
PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


class Inline(HTMLParser):
    """The text of each <script> and <style> element, and the attributes of its start tag."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=False)
        self.elements: dict[str, list[str]] = {}
        self.attributes: dict[str, list[list[tuple[str, str | None]]]] = {}
        self._open: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in ("script", "style"):
            self.elements.setdefault(tag, []).append("")
            self.attributes.setdefault(tag, []).append(attrs)
            self._open.append(tag)

    def handle_endtag(self, tag: str) -> None:
        if self._open and self._open[-1] == tag:
            self._open.pop()

    def handle_data(self, data: str) -> None:
        # Script and style text comes raw (no markup or references inside), perhaps in several pieces.
        if self._open:
            self.elements[self._open[-1]][-1] += data


def sha256_source(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode("utf-8")).digest()).decode() + "'"


@pytest.fixture
async def client(tmp_path: Path) -> AsyncIterator[LocalClient]:
    console_config(tmp_path)
    async with running_stack(tmp_path) as (local, _):
        yield local


async def test_the_page_serves_the_asset_files_inline_under_hashes_of_exactly_that_text(client: LocalClient) -> None:
    response = await client.get(console.PAGE_PATH)
    assert response.status == 200
    raw = await response.read()
    page = raw.decode("utf-8")
    parsed = Inline()
    parsed.feed(page)
    parsed.close()
    # One inline script and one inline style, nothing loaded from elsewhere.
    assert len(parsed.elements["script"]) == 1 and len(parsed.elements["style"]) == 1
    assert parsed.attributes["script"] == [[]] and parsed.attributes["style"] == [[]]
    script, style = parsed.elements["script"][0], parsed.elements["style"][0]

    css = (ASSETS / "approvals.css").read_text(encoding="utf-8")
    js = (ASSETS / "approvals.js").read_text(encoding="utf-8")
    body = (ASSETS / "approvals.html").read_text(encoding="utf-8")
    assert style == "\n" + css
    # The script's placeholders are filled in, and nothing else of it changes.
    for placeholder in ("__API__", "__MAX_REASON__", "__AGAIN_CHOICES__"):
        assert placeholder in js and placeholder not in script
    assert script == "\n" + (
        js.replace("__API__", console.PAGE_API)
        .replace("__MAX_REASON__", str(approvals.MAX_REASON_CHARS))
        .replace("__AGAIN_CHOICES__", json.dumps(console.ALLOW_AGAIN_CHOICES))
    )
    assert f'const API = "{console.PAGE_API}";' in script
    # The script's API is relative to the page, as a browser resolves it (fetch() takes the document's URL as its
    # base): the routes at the root, and the same routes under a proxy's path prefix.
    assert urljoin("https://gw.example.org/approvals", console.PAGE_API + "/stream") == \
        "https://gw.example.org" + console.API_PATH + "/stream"
    assert urljoin("https://gw.example.org/gw/approvals", console.PAGE_API + "/stream") == \
        "https://gw.example.org/gw" + console.API_PATH + "/stream"
    assert f"<body>\n{body}<script>" in page

    # Each hash in the CSP is that of the text the page carries, and is the only source its directive allows.
    directives = dict(part.strip().split(" ", 1) for part in response.headers["Content-Security-Policy"].split(";"))
    assert directives["script-src"] == sha256_source(script)
    assert directives["style-src"] == sha256_source(style)
    html, headers = console.page()
    assert response.headers["Content-Security-Policy"] == headers["Content-Security-Policy"] and raw == html


def test_the_wheel_ships_every_asset_file() -> None:
    names = sorted(entry.name for entry in ASSETS.iterdir())
    assert names == ["approvals.css", "approvals.html", "approvals.js"]
    patterns = tomllib.loads(PYPROJECT.read_text())["tool"]["setuptools"]["package-data"]["gatewayd.web"]
    for name in names:
        assert any(fnmatch.fnmatch(f"assets/{name}", pattern) for pattern in patterns), name
