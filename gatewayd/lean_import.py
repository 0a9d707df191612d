"""Import asyncio and aiohttp without their TLS support: imported by the command line before anything else.

Neither gatewayd nor gatewayctl ever uses TLS: the daemon serves plain HTTP on loopback (a TLS front, if
one is wanted, is a reverse proxy's job), gatewayctl talks to a unix socket, and the tool servers are
children on pipes. Yet asyncio and aiohttp import `ssl` eagerly, and aiohttp builds its client's default
SSL contexts at import, parsing every certificate of the system bundle. Measured here: 3.7 MiB of
resident memory (libssl, libcrypto's tables, the parsed bundle) and ~0.1 s of start-up.

Both libraries treat a failing `import ssl` as "this Python has no TLS" (a supported build), so for the
length of their import `ssl` is made unimportable, then made importable again: anything imported later
gets the real module. Nothing changes when either was already imported (the test process, an embedding
program): this module then does nothing.
"""

from __future__ import annotations

import sys

if "ssl" not in sys.modules and "aiohttp" not in sys.modules:
    # A None entry makes `import ssl` raise ImportError (the documented way to block an import).
    sys.modules["ssl"] = None  # type: ignore[assignment]
    try:
        import asyncio  # noqa: F401  (imported here for the side effect: asyncio.sslproto without ssl)

        import aiohttp
        import aiohttp.web  # noqa: F401
    finally:
        if sys.modules.get("ssl", True) is None:
            del sys.modules["ssl"]
