"""Read `tools.d/` and `policies/` into one validated, immutable Snapshot.

Owns: which files count (`*.toml`, not hidden), TOML decoding, turning validation failures
into messages that name the file, the key and the line, and cross-file checks (duplicate
names, roles that do not exist). A config that fails is never half-applied: the loader
returns a whole Snapshot or raises ConfigInvalid with every problem found.
"""

from __future__ import annotations

import hashlib
import re
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from gatewayd.config.models import SERVER_NAME, Client, Operator, PolicyFile, Role, Scraper, ServerConfig
from gatewayd.errors import ConfigError

TOOLS_DIR = "tools.d"
POLICIES_DIR = "policies"

M = TypeVar("M", bound=BaseModel)


class ConfigInvalid(Exception):
    """Raised with every ConfigError found; nothing of that config was applied."""

    def __init__(self, errors: list[ConfigError]) -> None:
        super().__init__("\n".join(str(error) for error in errors))
        self.errors = errors


@dataclass(frozen=True)
class Snapshot:
    """One complete, validated config. Never mutated: a reload builds a new one."""

    servers: dict[str, ServerConfig]
    roles: dict[str, Role]
    clients: dict[str, Client]
    operators: dict[str, Operator] = field(default_factory=dict)
    scrapers: dict[str, Scraper] = field(default_factory=dict)
    # Which file defined each role and client, so errors and `explain` can name it.
    sources: dict[str, str] = field(default_factory=dict)
    config_dir: Path = Path(".")
    # SHA-256 of the files it was read from (config_digest); equal digests mean nothing changed.
    digest: str = ""


def config_files(directory: Path) -> list[Path]:
    """The `*.toml` files of a directory in name order; editor temp and hidden files are ignored."""
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.glob("*.toml") if not p.name.startswith(".") and p.is_file())


def _find_line(text: str, loc: tuple[str | int, ...]) -> int | None:
    """Best-effort line of the key at `loc`: a `[table]` header or a `key =` line."""
    keys = [str(part) for part in loc if not isinstance(part, int)]
    if not keys:
        return None
    lines = text.splitlines()
    for split in range(len(keys) - 1, -1, -1):
        table, key = keys[:split], keys[split]
        line = _key_in_table(lines, table, key)
        if line is not None:
            return line
    return None


def _header_re(table: list[str]) -> re.Pattern[str]:
    parts = r"\s*\.\s*".join(rf"\"?{re.escape(part)}\"?" for part in table)
    return re.compile(rf"^\s*\[\[?\s*{parts}\s*\]\]?\s*(#.*)?$")


def _key_in_table(lines: list[str], table: list[str], key: str) -> int | None:
    key_re = re.compile(rf"^\s*\"?{re.escape(key)}\"?\s*[=.]")
    header_of_key = _header_re([*table, key])
    in_table = not table
    header = _header_re(table) if table else None
    for number, line in enumerate(lines, start=1):
        if header_of_key.match(line):
            return number
        if line.lstrip().startswith("["):
            in_table = bool(header and header.match(line))
            continue
        if in_table and key_re.match(line):
            return number
    return None


def _read_toml(path: Path, errors: list[ConfigError], digest: Any = None) -> tuple[dict[str, Any], str] | None:
    try:
        raw = path.read_bytes()
        if digest is not None:
            _hash_file(digest, path, raw)
        text = raw.decode("utf-8")
        return tomllib.loads(text), text
    except tomllib.TOMLDecodeError as exc:
        line = _toml_error_line(str(exc))
        errors.append(ConfigError(str(path), "", f"not valid TOML: {exc}", line))
    except (OSError, UnicodeDecodeError) as exc:
        errors.append(ConfigError(str(path), "", f"cannot read: {exc}"))
    return None


def _hash_file(digest: Any, path: Path, raw: bytes) -> None:
    # The directory and file name count: renaming a server file changes the config.
    for part in (path.parent.name, path.name):
        digest.update(part.encode("utf-8", "surrogateescape") + b"\0")
    digest.update(len(raw).to_bytes(8, "big") + raw)


def config_digest(config_dir: Path) -> str:
    """SHA-256 over the config files as they are on disk now (names and bytes), as Snapshot.digest is made."""
    digest = hashlib.sha256()
    for directory in (config_dir / TOOLS_DIR, config_dir / POLICIES_DIR):
        for path in config_files(directory):
            try:
                _hash_file(digest, path, path.read_bytes())
            except OSError:
                digest.update(b"unreadable\0" + path.name.encode("utf-8", "surrogateescape"))
    return digest.hexdigest()


def _toml_error_line(message: str) -> int | None:
    match = re.search(r"line (\d+)", message)
    return int(match.group(1)) if match else None


def _validate(model: type[M], path: Path, data: dict[str, Any], text: str, errors: list[ConfigError]) -> M | None:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        for item in exc.errors():
            loc = tuple(item["loc"])
            key = ".".join(str(part) for part in loc)
            message = "unknown key" if item["type"] == "extra_forbidden" else item["msg"]
            errors.append(ConfigError(str(path), key, message, _find_line(text, loc)))
    return None


def load_servers(directory: Path, errors: list[ConfigError], digest: Any = None) -> dict[str, ServerConfig]:
    """Every tool server of `tools.d/`, named by file stem."""
    servers: dict[str, ServerConfig] = {}
    for path in config_files(directory):
        if not SERVER_NAME.fullmatch(path.stem) or "__" in path.stem or path.stem.endswith("_"):
            # `__` joins server and tool in MCP tool names, so a server name must not contain or end with it.
            errors.append(ConfigError(
                str(path), "", "file name must be a server name: A-Z a-z 0-9 _ -, no '__', not ending in '_'"
            ))
            continue
        loaded = _read_toml(path, errors, digest)
        if loaded is None:
            continue
        server = _validate(ServerConfig, path, *loaded, errors)
        if server is not None:
            servers[path.stem] = server
    _check_prefixes(directory, servers, errors)
    return servers


def _check_prefixes(directory: Path, servers: dict[str, ServerConfig], errors: list[ConfigError]) -> None:
    """Two servers exposing their tools under the same prefix would hand clients one name for two tools."""
    seen: dict[str, str] = {}
    for name in sorted(servers):
        prefix = exposed_prefix(name, servers[name])
        if not prefix:
            continue
        if prefix in seen:
            errors.append(ConfigError(str(directory / f"{name}.toml"), "prefix",
                                      f"exposes its tools as {prefix!r}, as {directory / (seen[prefix] + '.toml')} "
                                      "does: give one of them another prefix"))
        else:
            seen[prefix] = name


def exposed_prefix(name: str, config: ServerConfig) -> str:
    """The prefix of a server's tool names as clients see them: its `prefix`, else its name (the file's stem)."""
    return config.prefix if config.prefix is not None else name


def _merge(
    kind: str, items: Iterable[tuple[str, Any]], path: Path, into: dict[str, Any], sources: dict[str, str],
    errors: list[ConfigError],
) -> None:
    for name, value in items:
        key = f"{kind}.{name}"
        if key in sources:
            errors.append(ConfigError(str(path), key, f"already defined in {sources[key]}"))
            continue
        into[name] = value
        sources[key] = str(path)


@dataclass
class Policies:
    """Every policy file merged."""

    roles: dict[str, Role] = field(default_factory=dict)
    clients: dict[str, Client] = field(default_factory=dict)
    operators: dict[str, Operator] = field(default_factory=dict)
    scrapers: dict[str, Scraper] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)


def load_policies(directory: Path, errors: list[ConfigError], digest: Any = None) -> Policies:
    """All policy files merged; a name defined twice is an error naming both files."""
    merged = Policies()
    for path in config_files(directory):
        loaded = _read_toml(path, errors, digest)
        if loaded is None:
            continue
        policy = _validate(PolicyFile, path, *loaded, errors)
        if policy is None:
            continue
        _merge("roles", policy.roles.items(), path, merged.roles, merged.sources, errors)
        _merge("clients", policy.clients.items(), path, merged.clients, merged.sources, errors)
        _merge("operators", policy.operators.items(), path, merged.operators, merged.sources, errors)
        _merge("scrapers", policy.scrapers.items(), path, merged.scrapers, merged.sources, errors)
    _check_references(merged, errors)
    return merged


def _check_references(policies: Policies, errors: list[ConfigError]) -> None:
    for name, client in policies.clients.items():
        errors.extend(
            ConfigError(policies.sources[f"clients.{name}"], f"clients.{name}.roles", f"no such role {role!r}")
            for role in client.roles
            if role not in policies.roles
        )
    # One token, one identity: in particular an agent's token is never also an operator's.
    seen_tokens: dict[str, str] = {}
    holders = [("clients", n, c.token_sha256) for n, c in policies.clients.items()]
    holders += [("operators", n, o.token_sha256) for n, o in policies.operators.items()]
    holders += [("scrapers", n, o.token_sha256) for n, o in policies.scrapers.items()]
    for kind, name, digests in holders:
        for digest in digests:
            if digest in seen_tokens:
                errors.append(ConfigError(policies.sources[f"{kind}.{name}"], f"{kind}.{name}.token_sha256",
                                          f"same token as {seen_tokens[digest]}"))
            seen_tokens[digest] = f"{kind[:-1]} {name!r}"


def load_snapshot(config_dir: Path) -> Snapshot:
    """Load and validate the whole config directory. Raises ConfigInvalid listing every problem."""
    errors: list[ConfigError] = []
    tools_dir = config_dir / TOOLS_DIR
    if not tools_dir.is_dir():
        errors.append(ConfigError(str(tools_dir), "", "directory not found"))
    digest = hashlib.sha256()
    servers = load_servers(tools_dir, errors, digest)
    policies = load_policies(config_dir / POLICIES_DIR, errors, digest)
    if errors:
        raise ConfigInvalid(errors)
    return Snapshot(servers=servers, roles=policies.roles, clients=policies.clients, operators=policies.operators,
                    scrapers=policies.scrapers, sources=policies.sources, config_dir=config_dir,
                    digest=digest.hexdigest())
