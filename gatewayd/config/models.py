"""Strict, frozen models of the TOML config: one tool server per `tools.d/*.toml`, and policies.

Owns the schema: field names, types, defaults and the duration syntax. Unknown keys are
errors. Does not own reading files or naming them in errors (loader.py).
"""

from __future__ import annotations

import datetime
import re
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}

# Server names become the prefix of canonical names (`server.method`) and of MCP tool names.
SERVER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,31}$")
# A canonical method may use only these characters; anything else is never matched.
METHOD_NAME = re.compile(r"^[A-Za-z0-9_./-]{1,128}$")
CLIENT_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
SHA256_HEX = re.compile(r"^[0-9a-f]{64}$")


def parse_duration(value: Any) -> float:
    """Seconds from `"30s"`, `"5m"`, `"1h"`, `"250ms"` or a plain number of seconds."""
    if isinstance(value, bool):
        raise ValueError("expected a duration like \"30s\", \"5m\" or a number of seconds")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str) and (match := _DURATION.match(value)):
        seconds = float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
    else:
        raise ValueError(f"expected a duration like \"30s\", \"5m\" or a number of seconds, got {value!r}")
    if seconds < 0:
        raise ValueError("a duration cannot be negative")
    return seconds


Duration = Annotated[float, BeforeValidator(parse_duration)]


def _date_as_text(value: Any) -> Any:
    """An unquoted TOML date (`era = 2026-07-28`) as the text of the version it names."""
    return value.isoformat() if isinstance(value, datetime.date) else value


# The MCP era an MCP child is spoken to in (dialects.py): probed at start, the legacy one, or the stateless one.
Era = Annotated[Literal["auto", "2026-07-28", "legacy"], BeforeValidator(_date_as_text)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=False)


class MethodConfig(_Strict):
    """One method of a tool server: declared (plain JSON-RPC) or tuned (MCP)."""

    description: str = ""
    input_schema: dict[str, Any] = Field(default_factory=lambda: {"type": "object"})
    timeout: Duration | None = None
    # A call that may run for long as long as it reports (an agent's turn): it ends after this much silence (no
    # progress, no update), `timeout` (or the server's `call_timeout`) staying its hard cap.
    activity_timeout: Duration | None = None
    notification: bool = False
    # Needs a person's confirmation whatever the policies say; no policy can waive it.
    confirm: bool = False
    # Runs only once its decision is fsync'd to the audit log; refused when that cannot be done.
    dangerous: bool = False
    # An MCP tool's call by a 2026-07-28 caller that declares the tasks extension (modern_tasks.py): "optional" or
    # "required" makes a call still running after a moment a task the caller polls; "required" also refuses (-32021)
    # such a caller that does not declare the extension. Legacy and direct callers run it as any call.
    task: Literal["never", "optional", "required"] = "never"


class ServerConfig(_Strict):
    """One stdio tool server, from `tools.d/<name>.toml`."""

    command: list[str] = Field(min_length=1)
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    cwd: str | None = None
    protocol: Literal["mcp", "jsonrpc", "acp"] = "mcp"
    # An MCP child's era: "auto" probes with `server/discover` (once per config, dialects.py); "legacy" goes straight
    # to `initialize` (a child that never answers an unknown request starts without the probe's wait);
    # "2026-07-28" speaks statelessly, and a child that does not list that version fails its start.
    era: Era = "auto"
    start: Literal["on-demand", "eager"] = "on-demand"
    idle_timeout: Duration = 600.0
    call_timeout: Duration = 30.0
    startup_timeout: Duration = 10.0
    # 64: one client's share (48) is above the POSTs a client may have open by default (`client_max_concurrent`, 32),
    # so a lone client's calls reach the child rather than wait in this server's queue, which cost ~7% more CPU a
    # call at 32 in flight (bench/README.md); several clients still share it, and the child still sees a bound.
    max_in_flight: int = Field(64, ge=1, le=4096)
    max_queued: int = Field(64, ge=0, le=65536)
    # One client's share of the slots and of the queue, so a client that fills them cannot stall the others:
    # by default three quarters of the slots and half of the queue (at least one of each).
    max_in_flight_per_client: int | None = Field(None, ge=1, le=4096)
    max_queued_per_client: int | None = Field(None, ge=0, le=65536)
    max_restarts: int = Field(5, ge=0)
    restart_window: Duration = 60.0
    methods: dict[str, MethodConfig] = Field(default_factory=dict)
    # What clients see before the server's tool names (`<prefix><separator><tool>`); None: the file's stem; "": the
    # server's own names, for clients that hard-code tool names.
    prefix: str | None = Field(None, pattern=r"^[A-Za-z0-9_-]{0,64}$")
    # What the server may ask of the caller's client during a call (gatewayd/relay.py): nothing by default.
    relay: list[Literal["sampling", "elicitation", "roots"]] = Field(default_factory=list)
    # An ACP agent is offered terminals (`terminal/*`): each command is still a call of the turn's caller,
    # `SERVER.terminal/create`, decided by its policy (agents.py). Off: the agent is told it has none.
    terminals: bool = False
    # How long an offered terminal lives: until the turn that made it ends (the command stops with the turn), or
    # until the agent releases it, its session is forgotten or the agent stops ("session": commands an agent runs
    # in the background and comes back to in a later turn; the agent is then not stopped idle while one runs).
    terminal_lifetime: Literal["turn", "session"] = "turn"
    # Who shares a child (upstream/fleet.py): everyone (one child), each client, or each MCP session (stateful
    # servers, and a child that may hold one session's roots).
    isolation: Literal["shared", "client", "session"] = "shared"
    # With isolation "client" or "session": children of this server at once, and of one client among them. A child
    # is a process; a client that opens sessions without end must not fork without end.
    max_children: int = Field(32, ge=1, le=4096)
    max_children_per_client: int = Field(4, ge=1, le=4096)

    @field_validator("command", mode="before")
    @classmethod
    def _command_list(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value

    @field_validator("methods")
    @classmethod
    def _method_names(cls, value: dict[str, MethodConfig]) -> dict[str, MethodConfig]:
        for name in value:
            if not METHOD_NAME.fullmatch(name):
                raise ValueError(f"method name {name!r} may use only A-Z a-z 0-9 _ . / -")
        return value

    @model_validator(mode="after")
    def _jsonrpc_declares_methods(self) -> ServerConfig:
        if self.protocol == "jsonrpc" and not self.methods:
            raise ValueError("a protocol = \"jsonrpc\" server must declare its [methods.NAME]")
        return self

    @field_validator("era")
    @classmethod
    def _era_is_mcp(cls, value: str, info: ValidationInfo) -> str:
        # Declared after `protocol`, so a valid protocol is known here (an invalid one is its own error).
        protocol = info.data.get("protocol", "mcp")
        if value != "auto" and protocol != "mcp":
            raise ValueError(f"era = \"{value}\" applies only to a protocol = \"mcp\" server, not \"{protocol}\"")
        return value

    @model_validator(mode="after")
    def _shares_fit(self) -> ServerConfig:
        if self.max_in_flight_per_client is not None and self.max_in_flight_per_client > self.max_in_flight:
            raise ValueError("max_in_flight_per_client cannot be more than max_in_flight")
        if self.max_queued_per_client is not None and self.max_queued_per_client > self.max_queued:
            raise ValueError("max_queued_per_client cannot be more than max_queued")
        return self

    @model_validator(mode="after")
    def _terminals_offered(self) -> ServerConfig:
        if self.terminal_lifetime != "turn" and not (self.protocol == "acp" and self.terminals):
            raise ValueError(f"terminal_lifetime = \"{self.terminal_lifetime}\" needs protocol = \"acp\" and "
                             "terminals = true")
        return self

    @model_validator(mode="after")
    def _children_fit(self) -> ServerConfig:
        if self.max_children_per_client > self.max_children:
            raise ValueError("max_children_per_client cannot be more than max_children")
        return self

    @property
    def client_slots(self) -> int:
        """Slots one client may hold at once."""
        if self.max_in_flight_per_client is not None:
            return self.max_in_flight_per_client
        return max(1, self.max_in_flight * 3 // 4)

    @property
    def client_queue(self) -> int:
        """Places in the queue one client may take."""
        if self.max_queued_per_client is not None:
            return self.max_queued_per_client
        return max(1, self.max_queued // 2) if self.max_queued else 0

    @property
    def argv(self) -> list[str]:
        """The full command line."""
        return [*self.command, *self.args]

    def needs_confirmation(self, method: str) -> bool:
        """Whether `method` is marked `confirm = true` here."""
        declared = self.methods.get(method)
        return declared is not None and declared.confirm

    def is_dangerous(self, method: str) -> bool:
        """Whether `method` is marked `dangerous = true` here."""
        declared = self.methods.get(method)
        return declared is not None and declared.dangerous

    def task_modes(self) -> dict[str, str]:
        """The methods that may become tasks of a modern caller, and how: "optional" or "required" (any other is
        "never")."""
        return {name: method.task for name, method in self.methods.items() if method.task != "never"}

    def task_mode(self, method: str) -> str:
        """How a modern caller's call of `method` may become a task: "never", "optional" or "required"."""
        declared = self.methods.get(method)
        return declared.task if declared is not None else "never"

    def timeout_for(self, method: str) -> float:
        """The call deadline for `method`: its own override, else the server's."""
        declared = self.methods.get(method)
        if declared is not None and declared.timeout is not None:
            return declared.timeout
        return self.call_timeout

    def silence_for(self, method: str) -> float | None:
        """How long a call of `method` may go without reporting before it ends (None: only its deadline)."""
        declared = self.methods.get(method)
        return declared.activity_timeout if declared is not None else None


Scalar = str | int | float | bool


class ArgRule(_Strict):
    """Rules one argument must satisfy for a role's grant to apply. Every rule given must hold."""

    equals: Scalar | None = None
    one_of: list[Scalar] | None = None
    prefix: str | None = None
    regex: str | None = None
    max_length: int | None = Field(None, ge=0)
    path_under: str | None = None
    # An argument with rules must be present, unless it may be left out.
    optional: bool = False

    @field_validator("regex")
    @classmethod
    def _compiles(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                re.compile(value)
            except re.error as exc:
                raise ValueError(f"not a valid regular expression: {exc}") from exc
        return value

    @field_validator("path_under")
    @classmethod
    def _absolute(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith("/"):
            raise ValueError("path_under must be an absolute directory")
        return value


# How long a call waits for a person by default, and the longest wait a policy may ask for.
DEFAULT_CONFIRM_TIMEOUT = 60.0
MAX_CONFIRM_TIMEOUT = 24 * 3600.0
# Channels a confirmation may use besides `gatewayctl approve`, which always works:
# the calling client's own user (MCP elicitation) and the daemon's web approval page.
Channel = Literal["client", "web"]
CONFIRM_CHANNELS: tuple[Channel, ...] = ("client", "web")


class ConfirmOptions(_Strict):
    """How a person is asked to confirm the calls a role's pattern matches."""

    timeout: Duration = Field(DEFAULT_CONFIRM_TIMEOUT, gt=0, le=MAX_CONFIRM_TIMEOUT,
                              description="no answer by then: denied as expired")
    channels: list[Channel] = Field(default_factory=lambda: list(CONFIRM_CHANNELS))


class Role(_Strict):
    """A named set of grants on canonical `server.method` names, and the argument rules that bound them.

    `args` maps a method pattern to {argument name: rules}: a call matched by the pattern is granted by
    this role only if its arguments pass. `confirmation` maps a method pattern to how a person is asked
    (timeout, channels) for calls of this role that need confirmation.
    """

    allow: list[str] = Field(default_factory=list)
    confirm: list[str] = Field(default_factory=list)
    args: dict[str, dict[str, ArgRule]] = Field(default_factory=dict)
    confirmation: dict[str, ConfirmOptions] = Field(default_factory=dict)

    @field_validator("allow", "confirm")
    @classmethod
    def _patterns(cls, value: list[str]) -> list[str]:
        for pattern in value:
            _check_pattern(pattern)
        return value

    @field_validator("args", "confirmation")
    @classmethod
    def _keyed_by_pattern(cls, value: dict[str, Any]) -> dict[str, Any]:
        for pattern in value:
            _check_pattern(pattern)
        return value


def _check_pattern(pattern: str) -> None:
    # A pattern that can never match is a typo the operator wants to hear about, not a silent no-op.
    if not METHOD_NAME.fullmatch(pattern.replace("*", "x")) or "." not in pattern:
        raise ValueError(f"pattern {pattern!r} can never match: use server.method with A-Z a-z 0-9 _ . / - and *")


class ClientLimits(_Strict):
    """Per-client overrides of the daemon's per-client limits (settings give the defaults)."""

    max_concurrent: int | None = Field(None, ge=1, description="calls in flight at once")
    rate: float | None = Field(None, gt=0, description="calls per second, sustained")
    burst: int | None = Field(None, ge=1, description="calls allowed at once above the rate")
    bytes_rate: int | None = Field(None, ge=1024, description="request bytes per second, sustained")
    bytes_burst: int | None = Field(None, ge=1024, description="request bytes allowed at once above the rate")


class _TokenHolder(_Strict):
    """Something that authenticates with bearer tokens, kept only as SHA-256 digests."""

    token_sha256: list[str] = Field(default_factory=list)

    @field_validator("token_sha256", mode="before")
    @classmethod
    def _one_or_many(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value

    @field_validator("token_sha256")
    @classmethod
    def _hex(cls, value: list[str]) -> list[str]:
        for digest in value:
            if not SHA256_HEX.fullmatch(digest):
                raise ValueError("token_sha256 must be 64 lowercase hex digits (gatewayctl token new writes it)")
        return value


class Client(_TokenHolder):
    """An agent identity: its token hashes, its roles and optional limits."""

    roles: list[str] = Field(default_factory=list)
    limits: ClientLimits = Field(default_factory=ClientLimits)


class Operator(_TokenHolder):
    """A person who approves or denies confirmations on the web approval page (the admin role).

    Operator tokens are a separate set from client tokens: an agent's token can never approve a call.
    """


class Scraper(_TokenHolder):
    """A metrics collector (Prometheus): its token reads /metrics and nothing else."""


class PolicyFile(_Strict):
    """One `policies/*.toml`; all such files are merged."""

    roles: dict[str, Role] = Field(default_factory=dict)
    clients: dict[str, Client] = Field(default_factory=dict)
    operators: dict[str, Operator] = Field(default_factory=dict)
    scrapers: dict[str, Scraper] = Field(default_factory=dict)

    @field_validator("clients", "operators", "scrapers")
    @classmethod
    def _client_names(cls, value: dict[str, Any]) -> dict[str, Any]:
        for name in value:
            if not CLIENT_NAME.fullmatch(name):
                raise ValueError(f"name {name!r} may use only A-Z a-z 0-9 _ . -")
        return value
