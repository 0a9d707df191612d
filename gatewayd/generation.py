"""A config generation: everything one config decides, built whole and swapped as one reference.

Owns `Generation` (its number, the validated snapshot, the token table with each client's
principal, and the tool servers) and building the next one from a new snapshot. A request reads
the current generation once, when it begins, and keeps it to its end; a reload builds the next one,
then swaps the one reference that `DaemonState.generation` is (caddy's model). Does not own
deciding to reload (reloader.py) or the servers' lives (upstream/pool.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from gatewayd.config.loader import Snapshot
from gatewayd.policy import Principal
from gatewayd.tokens import TokenTable
from gatewayd.upstream.pool import Pool, PoolDiff, Server


@dataclass(frozen=True, eq=False)
class Generation:
    """One config, in force from its swap until the next."""

    number: int
    snapshot: Snapshot
    tokens: TokenTable
    servers: Mapping[str, Server]

    @classmethod
    def first(cls, snapshot: Snapshot, pool: Pool) -> Generation:
        """Generation 1, from the config the daemon starts with."""
        servers, _ = pool.build(snapshot, 1)
        return cls(1, snapshot, TokenTable(snapshot), servers)

    def next(self, snapshot: Snapshot, pool: Pool) -> tuple[Generation, PoolDiff]:
        """The generation after this one, and how its servers differ; nothing is swapped, started or stopped."""
        servers, diff = pool.build(snapshot, self.number + 1, self.servers)
        return Generation(self.number + 1, snapshot, TokenTable(snapshot), servers), diff

    def principal(self, client: str) -> Principal | None:
        """The client's principal in this generation, if it still exists."""
        return self.tokens.principal(client)
