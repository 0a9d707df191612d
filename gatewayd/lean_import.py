"""Import asyncio, aiohttp and hashlib without OpenSSL or C++: imported by the command line before anything else.

Neither gatewayd nor gatewayctl ever uses TLS: the daemon serves plain HTTP on loopback (a TLS front, if
one is wanted, is a reverse proxy's job), gatewayctl talks to a unix socket, and the tool servers are
children on pipes. Yet asyncio and aiohttp import `ssl` eagerly, and aiohttp builds its client's default
SSL contexts at import, parsing every certificate of the system bundle. Measured here: 3.7 MiB of
resident memory (libssl, libcrypto's tables, the parsed bundle) and ~0.1 s of start-up.

Both libraries treat a failing `import ssl` as "this Python has no TLS" (a supported build), so for the
length of their import `ssl` is made unimportable, then made importable again: anything imported later
gets the real module. Nothing changes when either was already imported (the test process, an embedding
program): this module then does nothing.

hashlib and hmac are imported the same way, with `_hashlib` (their OpenSSL backend) unimportable: they then
use Python's own SHA-2 and HMAC, which give the same digests. Loading libcrypto for them cost 3.6 MB of an idle
daemon's 48.8 (its code and its tables; bench.start, issue 20). What gatewayd hashes is short (tokens,
cursors, the canonical params of a call): up to ~100 bytes Python's own SHA-256 is as fast, at 500 bytes
~1 µs slower, and over large input ~5× slower (3 ms for the params of a 1 MiB call instead of 0.6). Only a
Python whose own hashes are all present is led there (hashlib would log an error for each missing one).

pydantic looks for plugins (the `pydantic` entry-point group) the first time it builds a model, which imports
importlib.metadata and reads the metadata of every installed distribution: ~7 ms of a 0.24 s start here, more in a
crowded environment. gatewayd uses pydantic only to check its own configuration, so PYDANTIC_DISABLE_PLUGINS is set
for the daemon's own process unless the environment sets it already (set it empty to let plugins load). Tool
servers never see it: they are given a minimal environment (upstream/process.py).

frozenlist (aiohttp's signals and middleware lists) is imported without its compiled form, which is C++ and loads
libstdc++ for it alone: ~1 MB of an idle daemon. It falls back to its pure Python form, which behaves the same,
when the compiled one cannot be imported; aiohttp reads those lists a few times per request, through a list
iterator either way.
"""

from __future__ import annotations

import os
import sys
from importlib.util import find_spec

# Python's own hash modules hashlib falls back to for the algorithms it always offers.
_OWN_HASHES = ("_md5", "_sha1", "_sha2" if sys.version_info >= (3, 12) else "_sha256",
               *(() if sys.version_info >= (3, 12) else ("_sha512",)), "_blake2", "_sha3")


def _blocked() -> list[str]:
    """The modules made unimportable while the libraries are imported."""
    blocked = [] if "ssl" in sys.modules else ["ssl"]
    if "frozenlist" not in sys.modules:
        blocked.append("frozenlist._frozenlist")
    if "hashlib" not in sys.modules and "_hashlib" not in sys.modules \
            and all(find_spec(name) is not None for name in _OWN_HASHES):
        blocked.append("_hashlib")
    return blocked


if "ssl" not in sys.modules and "aiohttp" not in sys.modules:
    _BLOCKED = _blocked()
    # A None entry makes `import ssl` raise ImportError (the documented way to block an import).
    for _name in _BLOCKED:
        sys.modules[_name] = None  # type: ignore[assignment]
    try:
        import asyncio  # noqa: F401  (imported here for the side effect: asyncio.sslproto without ssl)
        import hashlib  # noqa: F401  (and these for theirs: Python's own hashes and HMAC)
        import hmac  # noqa: F401

        import aiohttp
        import aiohttp.web  # noqa: F401
    finally:
        for _name in _BLOCKED:
            if sys.modules.get(_name, True) is None:
                del sys.modules[_name]

os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")
