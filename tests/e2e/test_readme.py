"""The README's examples run as written: its Python SDK snippet is extracted and run against the real daemon."""

from __future__ import annotations

import asyncio
import re
import sys
from pathlib import Path
from urllib.parse import urlsplit

from gatewayd.cli import DEV_TOKEN_FILE
from tests.daemon import REPO, Daemon, daemon_env, write_config

SNIPPET_DEADLINE = 60.0


def sdk_snippet() -> str:
    readme = (REPO / "README.md").read_text()
    match = re.search(r"With the official Python SDK:\n\n```python\n(.*?)```", readme, re.DOTALL)
    assert match, "the README's SDK snippet is gone"
    return match.group(1)


async def test_the_sdk_snippet_runs_as_written(tmp_path: Path) -> None:
    tokens = write_config(tmp_path, {}, '[roles.developer]\nallow = ["calc.*"]\n', {"dev": ["developer"]})
    (tmp_path / "tools.d" / "calc.toml").write_text((REPO / "tools.d" / "calc.toml").read_text())
    (tmp_path / DEV_TOKEN_FILE).write_text(tokens["dev"] + "\n")
    async with Daemon(tmp_path) as daemon:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", sdk_snippet(), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            env=daemon_env({"PORT": str(urlsplit(daemon.url).port)}), cwd=str(tmp_path))
        async with asyncio.timeout(SNIPPET_DEADLINE):
            out, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()
    assert "text='3'" in out.decode() and "is_error=False" in out.decode(), out
