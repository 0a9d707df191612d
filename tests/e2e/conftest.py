"""Fixtures the end-to-end modules share."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gatewayd.config.edit import set_client_token
from gatewayd.tokens import hash_token, new_token
from tests.daemon import REPO, Daemon


@pytest.fixture
async def shipped(tmp_path: Path) -> AsyncIterator[tuple[Daemon, str]]:
    """The real daemon on the shipped tools.d and roles; the token of a client `laptop` with the `developer` role."""
    shutil.copytree(REPO / "tools.d", tmp_path / "tools.d")
    (tmp_path / "policies").mkdir()
    shutil.copy(REPO / "policies" / "roles.toml", tmp_path / "policies" / "roles.toml")
    token = new_token()
    set_client_token(tmp_path / "policies" / "clients.toml", "laptop", hash_token(token), ["developer"])
    async with Daemon(tmp_path) as daemon:
        yield daemon, token
