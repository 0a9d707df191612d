"""Who may call what: the one pure decision over (principal, canonical target).

Owns pattern syntax and matching, Principal, and `decide`. Pure: no I/O, no state. Every
route to a tool server (direct call, `tools/call`, each batch element) reaches `decide`
with the canonical `server.method` name after routing and before anything is sent.

Pattern syntax (documented in the README): a pattern is a canonical name in which `*`
matches any run of name characters (possibly empty). Nothing else is special. Names are
compared byte for byte: no case folding, no Unicode normalisation, no trimming.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass, field
from functools import lru_cache

from gatewayd.config.loader import Snapshot
from gatewayd.config.models import METHOD_NAME, ClientLimits

CANONICAL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]*\.[A-Za-z0-9_./-]+$")


class Decision(enum.Enum):
    """What happens to a call."""

    ALLOW = "allow"
    DENY = "deny"
    CONFIRM = "confirm"


@dataclass(frozen=True)
class Principal:
    """An authenticated client, the patterns its roles grant, and its limits (None: the daemon's default)."""

    name: str
    allow: tuple[str, ...]
    confirm: tuple[str, ...]
    limits: ClientLimits = field(default_factory=ClientLimits)


@lru_cache(maxsize=4096)
def _compile(pattern: str) -> re.Pattern[str] | None:
    if not METHOD_NAME.fullmatch(pattern.replace("*", "x")):
        return None
    return re.compile("".join("[A-Za-z0-9_./-]*" if part == "*" else re.escape(part) for part in _split(pattern)))


def _split(pattern: str) -> list[str]:
    return [part for part in re.split(r"(\*)", pattern) if part]


def matches(pattern: str, name: str) -> bool:
    """Whether a policy pattern matches a canonical name exactly."""
    compiled = _compile(pattern)
    return compiled is not None and compiled.fullmatch(name) is not None


def is_canonical(name: str) -> bool:
    """Whether `name` has the shape `server.method` in the allowed alphabet (ASCII only)."""
    return name.isascii() and CANONICAL.fullmatch(name) is not None and ".." not in name


def decide(principal: Principal, target: str) -> Decision:
    """The decision for `principal` calling canonical `target`. Deny unless a pattern grants it."""
    if not is_canonical(target):
        return Decision.DENY
    if any(matches(pattern, target) for pattern in principal.confirm):
        return Decision.CONFIRM
    if any(matches(pattern, target) for pattern in principal.allow):
        return Decision.ALLOW
    return Decision.DENY


def principal_for(snapshot: Snapshot, client_name: str) -> Principal:
    """The Principal of a configured client, its roles' patterns merged."""
    client = snapshot.clients[client_name]
    allow: list[str] = []
    confirm: list[str] = []
    for role_name in client.roles:
        role = snapshot.roles[role_name]
        allow.extend(role.allow)
        confirm.extend(role.confirm)
    return Principal(client_name, tuple(allow), tuple(confirm), client.limits)
