"""Import aiohttp without loading the system's CA bundle: imported by the command line before anything else.

aiohttp builds its client's default SSL contexts when it is imported, and the verifying one parses every
certificate of the system bundle: 1.8 MiB of resident memory and ~0.05 s of start-up here. Neither
gatewayd nor gatewayctl ever opens an outbound TLS connection (the daemon serves plain HTTP on loopback,
gatewayctl talks to a unix socket), so OpenSSL is pointed at an empty bundle for the length of that
import and the environment is put back as it was: children and anything later see what they would have.
"""

from __future__ import annotations

import os

_BUNDLE = "SSL_CERT_FILE"
_given = os.environ.get(_BUNDLE)
os.environ[_BUNDLE] = os.devnull
try:
    import aiohttp  # noqa: F401  (imported here, once, for its side effect on start-up cost)
finally:
    if _given is None:
        del os.environ[_BUNDLE]
    else:
        os.environ[_BUNDLE] = _given
