"""The links the daemon hands out, and the public URL a reverse proxy serves it at.

Owns the paths of the endpoint and of the approval page, parsing and checking the `public_url` setting
(the scheme, host, port and path prefix clients reach the daemon at through a TLS-terminating proxy), and `Links`:
the endpoint and approval-page URLs built from the public URL when there is one, else from the address
the daemon listens on. Everything that sends or prints a link (the `approval_pending` notice, the
systemd STATUS line, `gatewayctl dev-client`) builds it here. Standard library only: the settings
check values with it. Does not own which Host and Origin values are accepted (settings.py) or the
routes themselves (web/).
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from urllib.parse import urlsplit

MCP_PATH = "/mcp"
APPROVALS_PATH = "/approvals"
SCHEMES = {"http": 80, "https": 443}
# A proxy may publish the daemon's routes under a path prefix (https://host/gw/mcp, the proxy taking /gw off): the
# public URL then names the prefix, or the endpoint under it. Each segment of a prefix is plain (RFC 3986's
# unreserved characters), so the links built from it need no escaping and cannot climb out of it.
_PREFIX_SEGMENT = re.compile(r"[A-Za-z0-9._~-]+")


@dataclass(frozen=True)
class PublicUrl:
    """Where clients reach the daemon: `scheme://host[:port][/prefix]`, the port None when it is the scheme's
    default."""

    scheme: str
    host: str  # lower case; an IPv6 address in brackets
    port: int | None
    prefix: str = ""  # "" or "/gw": the path the proxy publishes the daemon's routes under

    @property
    def base(self) -> str:
        """What the daemon's paths follow in a link: the origin and the prefix."""
        return self.origin + self.prefix

    @property
    def origin(self) -> str:
        """The Origin header a browser sends for a page of this host (the default port left out)."""
        return f"{self.scheme}://{self.netloc}"

    @property
    def netloc(self) -> str:
        return self.host if self.port is None else f"{self.host}:{self.port}"

    def host_values(self) -> list[str]:
        """The Host header values that name it: as a browser sends it, and with the port spelled out (some proxies
        and clients write the default port, some leave a non-default one out, as nginx's `$host` does)."""
        port = self.port if self.port is not None else SCHEMES[self.scheme]
        return [self.host, f"{self.host}:{port}"]


def parse_public_url(text: str) -> PublicUrl:
    """`text` as a public URL; ValueError saying what is wrong with it."""
    try:
        parts = urlsplit(text.strip())
        port = parts.port
    except ValueError as exc:  # an unbalanced bracket, a port that is not a number or out of range
        raise ValueError(f"{text!r} is not a URL: {exc}") from None
    if parts.scheme not in SCHEMES:
        raise ValueError(f"{text!r} must start with https:// (or http://), e.g. https://gw.example.org")
    if not parts.hostname:
        raise ValueError(f"{text!r} names no host")
    if parts.username is not None or parts.password is not None:
        raise ValueError(f"{text!r} must not carry a user name or password")
    if parts.query or parts.fragment or text.rstrip().endswith(("?", "#")):
        raise ValueError(f"{text!r} must not carry a query or fragment")
    return PublicUrl(parts.scheme, _url_host(parts.hostname), None if port == SCHEMES[parts.scheme] else port,
                     _prefix(text, parts.path))


def _prefix(text: str, path: str) -> str:
    """The path prefix a public URL's path names: the path itself, or the endpoint's under it; ValueError when it
    is neither."""
    prefix = path.rstrip("/").removesuffix(MCP_PATH)
    segments = prefix.split("/")[1:]
    if prefix and (not prefix.startswith("/") or any(not _PREFIX_SEGMENT.fullmatch(segment)
                                                     or segment in (".", "..") for segment in segments)):
        raise ValueError(f"{text!r}: its path must be empty, {MCP_PATH}, or the prefix a proxy publishes gatewayd "
                         f"under (/gw or /gw{MCP_PATH}), each segment letters, digits, '-', '.', '_' or '~'")
    if prefix.endswith((APPROVALS_PATH, APPROVALS_PATH + "/api")):
        raise ValueError(f"{text!r}: name the endpoint ({MCP_PATH}) or the prefix it is under, not the approval page")
    return prefix


def _url_host(hostname: str) -> str:
    """The host as a URL writes it: lower case, an IPv6 address in brackets."""
    try:
        address = ipaddress.ip_address(hostname)
    except ValueError:
        return hostname.lower()
    return f"[{address.compressed}]" if address.version == 6 else address.compressed


def listen_base(host: str, port: int) -> str:
    """`http://host:port` for the address the daemon listens on (a wildcard address shown as loopback)."""
    if host in ("0.0.0.0", "::", ""):
        host = "127.0.0.1"
    return f"http://{_url_host(host)}:{port}"


@dataclass(frozen=True)
class Links:
    """The URLs the daemon hands out: through the public URL when there is one, else the listening address."""

    local: str  # http://127.0.0.1:PORT, where the daemon listens
    public: PublicUrl | None = None

    @property
    def base(self) -> str:
        return self.public.base if self.public is not None else self.local

    @property
    def endpoint(self) -> str:
        return self.base + MCP_PATH

    @property
    def approval_page(self) -> str:
        return self.base + APPROVALS_PATH

    def describe(self) -> str:
        """The endpoint for a status line: the listening one, and the public one when it differs."""
        local = self.local + MCP_PATH
        return local if self.public is None else f"{local} (public {self.endpoint})"
