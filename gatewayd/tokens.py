"""Bearer tokens: make them, hash them, and turn an Authorization header into a Principal.

Owns the token format and the lookup. Tokens are stored only as SHA-256 hex digests in
`policies/*.toml`; a presented token is hashed and its digest looked up in a table. The look-up's time
tells nothing usable about a stored token: what a caller controls is the token, and its digest, not the
token, is what is compared (learning how much of a stored digest matches its own would take finding
SHA-256 preimages). Comparing every digest in turn, as the table replaced, cost ~63 µs a request with 1,000
clients; the table's look-up ~1 µs whatever their number. A refused header (none, another scheme, a wrong
token, bytes that are not UTF-8) raises `Unauthenticated`, which the web layer answers with 401
(errors.refusal). Does not own what a principal may do (policy.py).
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Iterable, Mapping

from gatewayd.config.loader import Snapshot
from gatewayd.errors import Unauthenticated
from gatewayd.policy import Principal, principal_for

# 32 random bytes: a token nobody can guess or brute-force through its hash.
TOKEN_BYTES = 32
TOKEN_PREFIX = "gwd_"


def new_token() -> str:
    """A fresh random token; shown once, stored only as its hash."""
    return TOKEN_PREFIX + secrets.token_urlsafe(TOKEN_BYTES)


def hash_token(token: str) -> str:
    """The SHA-256 hex digest kept in policy files."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


class TokenTable:
    """The clients, operators and scrapers of one snapshot, by token digest; no two share a token."""

    def __init__(self, snapshot: Snapshot) -> None:
        # The loader refuses two holders of one token, so each digest names one holder.
        self._entries = _by_digest((name, client.token_sha256) for name, client in snapshot.clients.items())
        self._operators = _by_digest((name, op.token_sha256) for name, op in snapshot.operators.items())
        self._scrapers = _by_digest((name, scraper.token_sha256) for name, scraper in snapshot.scrapers.items())
        self._principals: dict[str, Principal] = {name: principal_for(snapshot, name) for name in snapshot.clients}

    def authenticate(self, header: str | None) -> Principal:
        """The Principal for an `Authorization` header. Raises Unauthenticated for none or a wrong one."""
        return self._principals[_lookup(header, self._entries)]

    def principal(self, name: str) -> Principal | None:
        """The Principal of client `name` in this snapshot, if it still exists."""
        return self._principals.get(name)

    def scraper(self, header: str | None) -> str:
        """The metrics scraper named by an `Authorization` header. Raises Unauthenticated otherwise."""
        return _lookup(header, self._scrapers)

    def operator(self, header: str | None) -> str:
        """The operator named by an `Authorization` header. Raises Unauthenticated otherwise (client tokens too)."""
        return _lookup(header, self._operators)


def _by_digest(holders: Iterable[tuple[str, list[str]]]) -> dict[bytes, str]:
    return {bytes.fromhex(digest): name for name, digests in holders for digest in digests}


def _lookup(header: str | None, entries: Mapping[bytes, str]) -> str:
    if not header:
        raise Unauthenticated("missing bearer token")
    scheme, _, token = header.partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        raise Unauthenticated("expected: Authorization: Bearer <token>")
    try:
        # The bytes the client sent: aiohttp decodes header bytes that are not UTF-8 as lone surrogates.
        raw = token.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        raise Unauthenticated("invalid token", invalid_token=True) from None
    found = entries.get(hashlib.sha256(raw).digest())
    if found is None:
        raise Unauthenticated("invalid token", invalid_token=True)
    return found
