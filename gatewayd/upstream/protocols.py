"""Which dialect speaks each tools.d `protocol`: the one place a server's `protocol` is read.

Owns the table from protocol name to dialect type (dialects.py: MCP, plain JSON-RPC; acp.py: ACP agents)
and making a server's dialect. ACP's dialect is imported by the first server that speaks it: a daemon without an
agent does not hold it. Does not own any dialect.
"""

from __future__ import annotations

from gatewayd.config.models import ServerConfig
from gatewayd.upstream.api import Caller
from gatewayd.upstream.dialects import Dialect, JsonRpcDialect, McpDialect
from gatewayd.upstream.eras import Eras

DIALECTS: dict[str, type[Dialect]] = {dialect.protocol: dialect for dialect in (McpDialect, JsonRpcDialect)}
ACP = "acp"


def dialect_for(name: str, config: ServerConfig, owner: Caller | None = None, eras: Eras | None = None,
                era_key: str = "") -> Dialect:
    """The dialect a server's tools.d file asks for; `owner` is who a per-session child's requests outside any call
    go to (fleet.py); `eras` what the era probe found for the program `era_key` names (eras.py)."""
    if config.protocol == ACP and ACP not in DIALECTS:
        from gatewayd.upstream.acp import AcpDialect

        DIALECTS[ACP] = AcpDialect
    return DIALECTS[config.protocol](name, config, owner, eras, era_key)
