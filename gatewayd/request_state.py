"""The `requestState` of the input-required results the gateway answers MCP 2026-07-28 callers with (SEP-2322).

Owns sealing and opening that state. A caller echoes it back on its retry, so it is attacker controlled: the gateway
signs it with an HMAC-SHA256 key made when the daemon starts (never written anywhere; a restart invalidates every
state, as it forgets every pending approval), and the signature binds the state to the client, the method and name
of the request and the hash of its exact params (without `_meta`, `inputResponses` and `requestState`). Opening
checks the signature, the age and the binding, and answers -32602 with a clear reason otherwise: forged, altered,
stale, another client's, or another call's. What the state says (an approval's id, a tool server's own state) is
the business of confirmation.py and the modern era (modern.py); whether an approval was used already is
confirmation.py's. Does not own HTTP (web/modern.py).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import secrets
import time
from dataclasses import dataclass
from typing import Any, Final

from gatewayd import audit
from gatewayd.errors import InvalidParams

# The prefix of every state this gateway makes: a version, so a future format can tell its own from these.
PREFIX: Final = "gw1."
# A state older than this is refused: the longest a person may take to approve (an approval's timeout is shorter)
# plus the time to come back, and no forgotten state stays good forever.
MAX_AGE: Final = 3600.0
# A state a caller sends back is at most this long: what a tool server may keep in its own state, plus ours.
MAX_STATE_CHARS: Final = 64 * 1024
KEY_BYTES: Final = 32
# The params keys that are the retry's, not the call's: not part of what a state binds.
RETRY_KEYS: Final = frozenset({"_meta", "inputResponses", "requestState"})
# What the state says it is for: an approval (confirmation.py), a modern child's own state, a parked call
# (continuations.py).
APPROVAL, CHILD, CONTINUATION = "approval", "child", "continuation"


def binding(client: str, method: str, params: Any) -> str:
    """What a state is bound to: the client, the method and the hash of its params without the retry's keys."""
    call = {key: value for key, value in params.items() if key not in RETRY_KEYS} if isinstance(params, dict) else {}
    return f"{client}\n{method}\n{audit.params_hash(call)}"


@dataclass(frozen=True)
class Opened:
    """A state that was ours, unaltered, fresh, and bound to this very call."""

    kind: str
    data: dict[str, Any]


class Sealer:
    """Seals and opens request states with the key made when it was made."""

    def __init__(self, key: bytes | None = None, max_age: float = MAX_AGE) -> None:
        self._key = key if key is not None else secrets.token_bytes(KEY_BYTES)
        self.max_age = max_age

    def seal(self, kind: str, bound: str, data: dict[str, Any]) -> str:
        """A state saying `data` (of `kind`), good only for the call `bound` names (`binding`)."""
        body = json.dumps({"k": kind, "b": _digest(bound), "t": time.time(), "d": data},
                          separators=(",", ":")).encode()
        return f"{PREFIX}{_b64(body)}.{_b64(self._mac(body))}"

    def open(self, state: Any, bound: str) -> Opened:
        """The state a caller sent back, if it is ours and for this call; -32602 saying why not otherwise."""
        if not isinstance(state, str):
            raise InvalidParams("requestState must be a string")
        if len(state) > MAX_STATE_CHARS:
            raise InvalidParams(f"requestState is longer than {MAX_STATE_CHARS} characters",
                                {"limit": MAX_STATE_CHARS})
        body, mac = _split(state)
        if body is None or mac is None or not hmac.compare_digest(mac, self._mac(body)):
            raise InvalidParams("requestState was not made by this gateway, or was altered",
                                {"reason": "tampered"})
        try:
            said = json.loads(body)
        except ValueError:
            raise InvalidParams("requestState was not made by this gateway", {"reason": "tampered"}) from None
        if not isinstance(said, dict) or not isinstance(said.get("d"), dict):
            raise InvalidParams("requestState was not made by this gateway", {"reason": "tampered"})
        issued = said.get("t")
        if not isinstance(issued, int | float) or time.time() - issued > self.max_age:
            raise InvalidParams(f"requestState is older than {self.max_age:g}s: send the request without it",
                                {"reason": "stale"})
        if not hmac.compare_digest(str(said.get("b")), _digest(bound)):
            raise InvalidParams("requestState belongs to another client or another call (method, name or "
                                "arguments differ)", {"reason": "not_this_call"})
        return Opened(str(said.get("k")), said["d"])

    def _mac(self, body: bytes) -> bytes:
        return hmac.new(self._key, body, hashlib.sha256).digest()


def _digest(bound: str) -> str:
    return hashlib.sha256(bound.encode("utf-8", "surrogatepass")).hexdigest()


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _unb64(text: str) -> bytes | None:
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError):
        return None


def _split(state: str) -> tuple[bytes | None, bytes | None]:
    if not state.startswith(PREFIX) or state.count(".") != 2:
        return None, None
    body, mac = state[len(PREFIX):].split(".")
    return _unb64(body), _unb64(mac)
