"""What the era probe found, per server config: so the same program is not probed again at each start.

Owns the daemon's memory of which MCP era (`server/discover` answered with 2026-07-28, or not) each tools.d server
of `era = "auto"` was found to speak, keyed by the server's name and a digest of what makes it the same program
(command line, environment, working directory). A server's children share it across idle stops, crash restarts,
per-client and per-session children and reloads that left its file alone; a changed command is another key, so it
is probed anew. Held in memory only: the daemon has no state directory, and a restarted daemon probes each server
once again. Does not own the probe or what an era means on the wire (dialects.py).
"""

from __future__ import annotations

import collections
import hashlib
import json
from typing import Literal

# What a probe finds: the child lists 2026-07-28 in its `server/discover` answer, or it does not (or never answers).
Found = Literal["2026-07-28", "legacy"]
# Configs remembered at once: every reload that changes a server's command adds one; the oldest are forgotten first
# (forgetting only costs one probe).
MAX_REMEMBERED_ERAS = 1024


def era_key(name: str, argv: list[str], env: dict[str, str], cwd: str | None) -> str:
    """The key of one server's program: its name and a digest of its command line, environment and directory."""
    digest = hashlib.sha256(json.dumps([argv, sorted(env.items()), cwd]).encode()).hexdigest()
    return f"{name}:{digest[:32]}"


class Eras:
    """The era each server config was found to speak, at most `limit` of them (oldest forgotten first)."""

    def __init__(self, limit: int = MAX_REMEMBERED_ERAS) -> None:
        self.limit = limit
        self._found: collections.OrderedDict[str, Found] = collections.OrderedDict()

    def __len__(self) -> int:
        return len(self._found)

    def get(self, key: str) -> Found | None:
        """What a probe of this config found last; None: never probed (or forgotten)."""
        return self._found.get(key)

    def remember(self, key: str, era: Found) -> None:
        self._found[key] = era
        self._found.move_to_end(key)
        while len(self._found) > self.limit:
            self._found.popitem(last=False)

    def forget(self, key: str) -> None:
        """The remembered era turned out wrong (the child refused `initialize`): the next start probes again."""
        self._found.pop(key, None)
