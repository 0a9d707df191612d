"""An installed copy runs its own examples: `pip install` into a fresh venv elsewhere, started from another directory
with that venv nowhere on PATH, answers `calc.add` from the shipped tools.d (its `{python}` is the daemon's own)."""

from __future__ import annotations

import asyncio
import shutil
import sys
from pathlib import Path

import aiohttp

from tests.daemon import REPO, Daemon, rpc, write_config

# Creating the venv and installing the package and its dependencies from the local index: ~15 s on an idle machine.
INSTALL_DEADLINE = 300.0
# What the daemon's children find on PATH: the system's python3, which has no gatewayd.
SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin"


async def run(*argv: str) -> None:
    proc = await asyncio.create_subprocess_exec(*argv, stdin=asyncio.subprocess.DEVNULL,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    try:
        async with asyncio.timeout(INSTALL_DEADLINE):
            out, _ = await proc.communicate()
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    assert proc.returncode == 0, out.decode(errors="replace")[-4000:]


async def test_an_installed_copy_runs_the_shipped_calc_from_another_directory(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    venv = tmp_path / "venv"
    await run(sys.executable, "-m", "venv", "--without-pip", str(venv))
    # This interpreter's pip installs into the new venv: no pip of its own to bootstrap first.
    await run(sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q",
              "--disable-pip-version-check", str(REPO))
    config = tmp_path / "etc"
    tokens = write_config(config, {}, '[roles.r]\nallow = ["calc.*"]\n', {"c": ["r"]})
    shutil.copy(REPO / "tools.d" / "calc.toml", config / "tools.d" / "calc.toml")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    async with Daemon(config, program=(str(venv / "bin" / "gatewayd"),), cwd=elsewhere,
                      env={"PATH": SYSTEM_PATH}) as daemon:
        answer = await rpc(http, daemon.url, tokens["c"], "calc.add", {"a": 2, "b": 3})
        assert answer == {"jsonrpc": "2.0", "id": 1, "result": 5}, answer
        started = await daemon.wait_log(r"pid=\d+ started: ")
        assert str(venv / "bin" / "python") in started
