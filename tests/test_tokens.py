"""Turning an Authorization header into its holder: every client, operator and scraper of a config with many of
each found by its own token, and every other header refused with the reason a client is told."""

from __future__ import annotations

from pathlib import Path

import pytest

from gatewayd.config.loader import load_snapshot
from gatewayd.errors import Unauthenticated
from gatewayd.tokens import TokenTable, hash_token, new_token
from tests.daemon import write_config

# Enough holders that a look-up which walked them would show; few enough to write quickly.
MANY = 300


def holders(kind: str, count: int) -> tuple[str, dict[str, str]]:
    """TOML for `count` holders of `kind`, and each one's token."""
    tokens = {f"{kind[:-1]}{index}": new_token() for index in range(count)}
    roles = '\nroles = ["r"]' if kind == "clients" else ""
    return "".join(f'[{kind}.{name}]\ntoken_sha256 = "{hash_token(token)}"{roles}\n\n'
                   for name, token in tokens.items()), tokens


@pytest.fixture
def table(tmp_path: Path) -> tuple[TokenTable, dict[str, dict[str, str]]]:
    write_config(tmp_path, {}, '[roles.r]\nallow = ["calc.*"]\n')
    issued = {}
    for kind in ("clients", "operators", "scrapers"):
        text, issued[kind] = holders(kind, MANY)
        (tmp_path / "policies" / f"{kind}.toml").write_text(text)
    return TokenTable(load_snapshot(tmp_path)), issued


def test_every_holder_is_found_by_its_own_token_and_only_in_its_own_kind(
        table: tuple[TokenTable, dict[str, dict[str, str]]]) -> None:
    tokens, issued = table
    for name, token in issued["clients"].items():
        assert tokens.authenticate(f"Bearer {token}").name == name
        with pytest.raises(Unauthenticated):
            tokens.operator(f"Bearer {token}")
    for name, token in issued["operators"].items():
        assert tokens.operator(f"Bearer {token}") == name
        with pytest.raises(Unauthenticated):
            tokens.authenticate(f"Bearer {token}")
    for name, token in issued["scrapers"].items():
        assert tokens.scraper(f"bearer  {token} ") == name  # the scheme in any case, the token trimmed
        with pytest.raises(Unauthenticated):
            tokens.authenticate(f"Bearer {token}")


@pytest.mark.parametrize(("header", "reason", "invalid"), [
    (None, "missing bearer token", False),
    ("", "missing bearer token", False),
    ("Basic dXNlcjpwYXNz", "expected: Authorization: Bearer <token>", False),
    ("Bearer ", "expected: Authorization: Bearer <token>", False),
    ("Bearer gwd_not-a-token-anyone-holds", "invalid token", True),
    ("Bearer gwd_\udcff\udcfe", "invalid token", True),  # bytes that are not UTF-8, as aiohttp passes them on
])
def test_any_other_header_is_refused_with_its_reason(table: tuple[TokenTable, dict[str, dict[str, str]]],
                                                      header: str | None, reason: str, invalid: bool) -> None:
    tokens, _ = table
    with pytest.raises(Unauthenticated) as refused:
        tokens.authenticate(header)
    assert (refused.value.reason, refused.value.invalid_token) == (reason, invalid)
