"""Daemon settings: where to listen, where the config lives, and every limit.

Owns the settings model and where values come from: command-line flags (highest), then
`GATEWAYD_*` environment variables, then an optional `gatewayd.toml` in the config directory
(or the file named by `GATEWAYD_SETTINGS_FILE`), then the defaults below. The sources are merged
here (`_sources`) rather than by pydantic-settings, whose import cost the daemon ~5 MB of idle RSS
and tens of ms of every start for these few lines (bench/README.md). Does not own tool server or
policy config (config/).
"""

from __future__ import annotations

import json
import os
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from gatewayd import urls
from gatewayd.config.models import Duration

DEFAULT_PORT = 8765
SETTINGS_FILE_NAME = "gatewayd.toml"
# Local clients may always use these names: a DNS-rebinding page arrives under its own name, never a loopback one.
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")
LOOPBACK_ADDRESSES = ("127.0.0.1", "localhost", "::1")
WILDCARD_ADDRESSES = ("0.0.0.0", "::")


def _settings_file() -> Path:
    explicit = os.environ.get("GATEWAYD_SETTINGS_FILE")
    if explicit:
        return Path(explicit)
    return Path(os.environ.get("GATEWAYD_CONFIG_DIR", ".")) / SETTINGS_FILE_NAME


ENV_PREFIX = "GATEWAYD_"


def _from_environment(fields: dict[str, Any]) -> dict[str, Any]:
    """`GATEWAYD_<NAME>` of each setting, the name in any case; a list setting's value is JSON (`["a", "b"]`), the
    others are their text, which validation converts."""
    found: dict[str, Any] = {}
    for key, value in os.environ.items():
        if not key.upper().startswith(ENV_PREFIX):
            continue
        name = key[len(ENV_PREFIX):].lower()
        field = fields.get(name)
        if field is None:
            continue
        if field.annotation is not None and getattr(field.annotation, "__origin__", None) is list:
            try:
                value = json.loads(value)
            except ValueError:
                pass  # validation says it is no list
        found[name] = value
    return found


def _from_file() -> dict[str, Any]:
    """The settings file's values, if it exists."""
    path = _settings_file()
    if not path.is_file():
        return {}
    with path.open("rb") as file:
        return tomllib.load(file)


class Settings(BaseModel):
    """Everything the daemon reads at start; each field documents itself in `gatewayd --help`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _sources(cls, given: Any) -> Any:
        """Flags (what the constructor is given), then environment, then the optional TOML file."""
        if not isinstance(given, dict):
            return given
        return {**_from_file(), **_from_environment(cls.model_fields), **given}

    host: str = Field("127.0.0.1", description="address to listen on (loopback by default)")
    port: int = Field(DEFAULT_PORT, ge=0, le=65535, description="TCP port to listen on (0 picks a free one)")
    config_dir: Path = Field(Path("."), description="directory holding tools.d/ and policies/")
    log_level: str = Field("INFO", description="DEBUG, INFO, WARNING or ERROR")
    # A proxy in front makes the address the daemon listens on useless to its clients: links must name the proxy.
    public_url: str = Field(
        "", description="the https:// URL clients reach the daemon at through a reverse proxy, e.g. "
        "https://gw.example.org, or https://gw.example.org/gw when the proxy publishes it under the path /gw (a "
        "path ending in /mcp names the same): every link the daemon hands out uses it, and its "
        "host and origin are accepted as Host and Origin besides the loopback names (empty: none)",
    )
    log_format: Literal["text", "json"] = Field("text", description="text, or json: one JSON object a line")
    allowed_hosts: list[str] = Field(
        default_factory=list,
        description="Host header values accepted besides the loopback names with the listen port and the "
        "public_url's host",
    )
    allowed_origins: list[str] = Field(
        default_factory=list,
        description="Origin header values accepted when present, besides the public_url's origin "
        "(default: http:// and https:// of each accepted host)",
    )
    tool_name_separator: str = Field("__", description="joins server and method into an MCP tool name")
    # LLM function-calling APIs accept ^[A-Za-z0-9_-]{1,64}$; MCP 2025-11-25 allows 128 characters and dots.
    tool_name_max_chars: int = Field(
        64, ge=1, le=128, description="longest MCP tool name listed (1..128; the MCP limit is 128, LLM APIs take 64)"
    )
    tool_name_dots: bool = Field(False, description="allow '.' in MCP tool names, as MCP does (LLM APIs do not)")
    # Big enough that ordinary deployments answer every list in one page; a client pages with `cursor`.
    list_page_size: int = Field(
        1000, ge=1, description="most items in one answer to tools/list, resources/list, resources/templates/list, "
        "prompts/list or tasks/list (then nextCursor)",
    )
    # A few MiB holds any sane tool call; larger bodies are refused before they are read.
    max_body_bytes: int = Field(4 * 1024 * 1024, ge=1024, description="largest request body (413 above)")
    max_json_depth: int = Field(64, ge=2, description="deepest JSON nesting accepted in a request")
    # Each JSON object costs a Python call to parse (duplicate keys are refused): 50,000 of them take ~0.2 s.
    max_json_objects: int = Field(50_000, ge=16, description="most JSON objects in one request body (400 above)")
    max_batch: int = Field(32, ge=1, description="most elements in one JSON-RPC batch")
    # Slow-loris: a client that trickles its headers would otherwise hold a connection for ever.
    header_timeout: Duration = Field(
        10.0, gt=0, description="seconds a client has to send a request's headers (then 408 and close)"
    )
    # Bounds a trickled body too; the clock starts with the request's first byte, so it includes the headers.
    request_timeout: Duration = Field(
        30.0, gt=0, description="seconds a client has to send a whole request, body included (then 408 and close)"
    )
    # Long enough to reuse a connection between calls, short enough that idle ones do not hold connection slots.
    keepalive_timeout: Duration = Field(75.0, gt=0, description="seconds an idle keep-alive connection stays open")
    # Each connection costs a file descriptor; past this the daemon sheds new ones instead of failing on EMFILE.
    max_connections: int = Field(
        1024, ge=1, description="most open client connections; past it new ones get 503 and are closed"
    )
    # Idle sockets cost an attacker nothing: until a request on it presents a valid token, a connection counts in
    # this small share, and a new one closes the share's longest-idle member, so they cannot lock clients out.
    max_unauthenticated_connections: int = Field(
        64, ge=1, description="most open connections that have not presented a valid token; "
        "past it a new one closes the one waiting longest (503 if none has waited 0.1 s)"
    )
    # A real client sends its request the moment it connects; only a socket held open for its own sake waits.
    unauthenticated_idle_timeout: Duration = Field(
        2.0, gt=0, description="seconds a connection that has presented no valid token may wait between requests "
        "(then closed)"
    )
    # aiohttp's own default; a request line longer than this is an attack, not an MCP call.
    max_line_bytes: int = Field(8190, ge=256, description="longest request line (400 above)")
    max_header_bytes: int = Field(8190, ge=256, description="longest single header, name and value (400 above)")
    # MCP clients send about ten headers; this bounds the header block to max_headers × max_header_bytes.
    max_headers: int = Field(64, ge=8, description="most header lines in one request (400 above)")
    # Per-client defaults; `[clients.NAME.limits]` in a policy file overrides them for one client.
    client_max_concurrent: int = Field(
        32, ge=1, description="POSTs carrying requests one client may have in flight (429 above)"
    )
    client_rate: float = Field(
        50.0, gt=0, description="JSON-RPC messages per second one client may send, sustained (429 above)"
    )
    client_burst: int = Field(100, ge=1, description="JSON-RPC messages one client may send at once above the rate")
    # Messages alone do not bound the work of parsing them: a client is charged for its bytes too. A MiB of payload
    # costs the event loop ~20 ms (parsed, sent on, its answer parsed and sent back), so by default one client's
    # payloads take at most ~5 ms of each second from everyone else.
    client_bytes_rate: int = Field(
        256 * 1024, ge=1024, description="request bytes per second one client may send, sustained (429 above)"
    )
    client_bytes_burst: int = Field(
        8 * 1024 * 1024, ge=1024,
        description="request bytes one client may send at once above the rate (at least max_body_bytes)",
    )
    # A comment line this often keeps proxies and clients from dropping a quiet stream.
    sse_keepalive: Duration = Field(15.0, gt=0, description="seconds between SSE keep-alive comments")
    # SEP-1699 polling: a long call's stream in a session ends its connection, and the client comes back for the rest
    # with Last-Event-ID (resumable.py). Off by default: a client that cannot resume would lose the answer.
    sse_poll_after: Duration = Field(
        0.0, ge=0, description="seconds after which a session call's event stream closes its connection for the "
        "client to resume it with Last-Event-ID (0: never)")
    max_sessions: int = Field(1024, ge=1, description="most MCP sessions held at once")
    # One client's share, so a client that opens sessions in a loop cannot lock everyone else out of `initialize`.
    max_sessions_per_client: int = Field(64, ge=1, description="most MCP sessions one client may hold at once")
    # Every per-client or per-session child is a process: this bounds them all, whatever each tools.d file allows.
    max_isolated_children: int = Field(
        256, ge=1, description="most children of isolation = \"client\" or \"session\" servers running at once")
    # A session nobody used for this long is forgotten, so abandoned clients do not pile up.
    session_idle_timeout: Duration = Field(3600.0, gt=0, description="seconds before an unused session ends")
    audit_path: str = Field(
        "audit.jsonl",
        description="append-only JSON Lines audit log, relative to config_dir; empty turns auditing off "
        "(then dangerous calls are not refused for want of a record)",
    )
    # Room kept for the records dangerous calls need: a flood of ordinary records must not fill the disk first.
    audit_reserve_bytes: int = Field(
        64 * 1024 * 1024, ge=0,
        description="free space kept on the audit log's file system: below it ordinary records are dropped, "
        "and those of dangerous and confirmed calls are still written (0: no reserve)",
    )
    admin_socket: str = Field(
        "gatewayd.sock",
        description="unix socket of the admin API (gatewayctl), relative to config_dir; empty turns it off",
    )
    # Only the daemon's own user may drive it unless the operator opens it to a group on purpose.
    admin_socket_mode: str = Field("0600", pattern=r"^0?[0-7]{3}$", description="file mode of the admin socket")
    admin_socket_group: str = Field("", description="group owning the admin socket (empty: the daemon's)")
    # A person who leaves the approval page open sees it live; the page itself holds no data without a token.
    approval_page: bool = Field(True, description="serve the web approval page at /approvals (operator tokens)")
    watch_config: bool = Field(True, description="reload when files under tools.d/ or policies/ change")
    # A reload that changes or removes a server lets its calls in flight finish on the old child this long.
    reload_drain: Duration = Field(60.0, ge=0, description="seconds a replaced server's calls may run after a reload")
    # A tool server's question put to a caller (relay.py) waits this long for the client's answer; the call's own
    # timeout may end it first. Long by default: a person may be answering it.
    relay_timeout: Duration = Field(300.0, gt=0, description="seconds a relayed request waits for the client's answer")
    # A tool call that may become a task of a 2026-07-28 caller (tools.d `task`, modern_tasks.py) is answered inline
    # if it says something this soon; one still running then becomes a task. 0: a task as soon as it is decided.
    task_after: Duration = Field(0.5, ge=0, le=60, description="seconds a call that may become a task of a "
                                 "2026-07-28 caller has to answer inline before it becomes one")
    # How long shutdown waits for calls in flight before stopping the tool servers anyway.
    shutdown_grace: Duration = Field(10.0, ge=0, description="seconds to drain calls on stop")

    def audit_file(self) -> Path | None:
        """Where the audit log goes, or None when auditing is off."""
        if not self.audit_path:
            return None
        return self.config_dir / self.audit_path

    def admin_socket_path(self) -> Path | None:
        """Where the admin socket listens, or None when it is off."""
        if not self.admin_socket:
            return None
        return self.config_dir / self.admin_socket

    @field_validator("public_url")
    @classmethod
    def _public_url(cls, value: str) -> str:
        """Checked at start, so a typo is a settings error and not links that lead nowhere; kept as its origin and
        path prefix."""
        return urls.parse_public_url(value).base if value.strip() else ""

    def public(self) -> urls.PublicUrl | None:
        """The public URL, parsed; None when the daemon is reached where it listens."""
        return urls.parse_public_url(self.public_url) if self.public_url else None

    def links(self, port: int) -> urls.Links:
        """The URLs the daemon hands out once the real port is known."""
        return urls.Links(urls.listen_base(self.host, port), self.public())

    def hosts(self, port: int) -> list[str]:
        """The Host header values to accept once the real port is known: the loopback names (local clients keep
        working whatever else is listed), the listen address, `allowed_hosts` and the public URL's host."""
        public = self.public()
        return _unique(self._listed_hosts(port) + (public.host_values() if public else []))

    def origins(self, port: int) -> list[str]:
        """The Origin header values to accept once the real port is known: `allowed_origins` or, by default,
        http:// of the loopback and listed hosts and https:// of `allowed_hosts` (a page of a host the daemon
        serves, as a TLS proxy serves it, is no foreign page); and always the public URL's origin."""
        public = self.public()
        if self.allowed_origins:
            listed = list(self.allowed_origins)
        else:
            listed = [f"http://{host}" for host in self._listed_hosts(port)]
            listed += [f"https://{host}" for host in self.allowed_hosts]
        return _unique(listed + ([public.origin] if public else []))

    def _listed_hosts(self, port: int) -> list[str]:
        names = list(LOOPBACK_NAMES)
        if self.host not in LOOPBACK_ADDRESSES + WILDCARD_ADDRESSES:
            names.append(self.host)
        return [f"{name}:{port}" for name in names] + names + list(self.allowed_hosts)


def _unique(values: list[str]) -> list[str]:
    return list(dict.fromkeys(values))


def describe() -> list[tuple[str, str, Any]]:
    """(flag name, description, default) for each setting, for `gatewayd --help`."""
    rows = []
    for name, field in Settings.model_fields.items():
        default = field.default_factory() if field.default_factory else field.default  # type: ignore[call-arg]
        rows.append((name, field.description or "", default))
    return rows
