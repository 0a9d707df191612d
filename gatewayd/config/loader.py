"""Read `tools.d/` and `policies/` into one validated, immutable Snapshot.

Owns: which files count (`*.toml`, not hidden), TOML decoding, turning validation failures
into messages that name the file, the key and the line, and cross-file checks (duplicate
names, roles that do not exist). A config that fails is never half-applied: the loader
returns a whole Snapshot or raises ConfigInvalid with every problem found.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import sys
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from gatewayd.config.models import SERVER_NAME, Client, Operator, PolicyFile, Role, Scraper, ServerConfig
from gatewayd.config.suggest import nearest_keys
from gatewayd.errors import ConfigError

TOOLS_DIR = "tools.d"
POLICIES_DIR = "policies"
# A `command` whose program is this runs on the interpreter the daemon itself runs on (sys.executable), so the
# shipped examples (`python -m gatewayd.examples.*`) find the very gatewayd that serves them, however installed.
PYTHON_PLACEHOLDER = "{python}"
# Interpreters whose first operand is a script file (after options): a missing script is as fatal as a missing program.
SCRIPT_INTERPRETERS = re.compile(r"(python|pypy)(\d+(\.\d+)?)?|node|nodejs|bash|sh|dash|zsh|ruby|perl")
# The options after which no script file follows: the code comes from a module, a string or stdin.
NO_SCRIPT_OPTIONS = frozenset({"-m", "-c", "-e", "--eval", "-p", "--print", "-"})
# What a script operand ends with: an option's value (`-X importtime`) is not mistaken for one.
SCRIPT_SUFFIXES = (".py", ".pyz", ".js", ".mjs", ".cjs", ".sh", ".bash", ".rb", ".pl")

# Files not yet on disk, by absolute path, read instead of the disk: what `gatewayctl token new` is about to write.
Pending = Mapping[Path, bytes]

M = TypeVar("M", bound=BaseModel)

# The parsed TOML of each config file, by path, with the bytes it was parsed from: a reload parses again only the
# files whose bytes changed. tomllib takes ~0.5 ms a file, ~80% of reading 100 tool servers (bench.scale `tools`).
# Bounded; what is kept and what is handed out are copies of each other, since models built from a parse may share
# its lists and tables.
_PARSED: dict[Path, tuple[bytes, dict[str, Any]]] = {}
MAX_PARSED_FILES = 4096


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

    def summary(self) -> str:
        """What it holds, for a person: "4 tool servers, 1 client"."""
        return f"{counted(len(self.servers), 'tool server')}, {counted(len(self.clients), 'client')}"


def counted(number: int, noun: str) -> str:
    """"1 tool server", "2 tool servers"."""
    return f"{number} {noun}" if number == 1 else f"{number} {noun}s"


def config_files(directory: Path, pending: Pending | None = None) -> list[Path]:
    """The `*.toml` files of a directory in name order; editor temp and hidden files are ignored. Pending files
    of that directory count as if written."""
    found = set()
    if directory.is_dir():
        found = {p for p in directory.glob("*.toml") if not p.name.startswith(".") and p.is_file()}
    for path in pending or {}:
        if path.parent == directory.absolute() and path.suffix == ".toml" and not path.name.startswith("."):
            found.add(directory / path.name)
    return sorted(found)


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


def _read_toml(
    path: Path, errors: list[ConfigError], digest: Any = None, pending: Pending | None = None
) -> tuple[dict[str, Any], str] | None:
    try:
        raw = (pending or {}).get(path.absolute())
        if raw is None:
            raw = path.read_bytes()
        if digest is not None:
            _hash_file(digest, path, raw)
        text = raw.decode("utf-8")
        return _parsed(path.absolute(), raw, text), text
    except tomllib.TOMLDecodeError as exc:
        line = _toml_error_line(str(exc))
        errors.append(ConfigError(str(path), "", f"not valid TOML: {exc}", line))
    except (OSError, UnicodeDecodeError) as exc:
        errors.append(ConfigError(str(path), "", f"cannot read: {exc}"))
    return None


def _parsed(key: Path, raw: bytes, text: str) -> dict[str, Any]:
    """`text` (the decoded `raw`) as TOML: parsed again only if the file's bytes changed since the last time."""
    kept = _PARSED.get(key)
    if kept is not None and kept[0] == raw:
        return _copy_table(kept[1])
    data = tomllib.loads(text)
    if len(_PARSED) >= MAX_PARSED_FILES:
        _PARSED.clear()
    _PARSED[key] = (raw, _copy_table(data))
    return data


def _copy_table(table: dict[str, Any]) -> dict[str, Any]:
    return {key: _copy(item) for key, item in table.items()}


def _copy(value: Any) -> Any:
    """A copy of parsed TOML: its tables and arrays new, its values (str, numbers, dates: immutable) shared."""
    if isinstance(value, dict):
        return _copy_table(value)
    if isinstance(value, list):
        return [_copy(item) for item in value]
    return value


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
            message = _unknown_key(model, loc) if item["type"] == "extra_forbidden" else item["msg"]
            errors.append(ConfigError(str(path), key, message, _find_line(text, loc)))
    return None


def _unknown_key(model: type[BaseModel], location: tuple[int | str, ...]) -> str:
    """ "unknown key", and the known keys there that look like it: a typo names its fix."""
    near = [repr(key) for key in nearest_keys(model, location)]
    if not near:
        return "unknown key"
    listed = near[0] if len(near) == 1 else f"{', '.join(near[:-1])} or {near[-1]}"
    return f"unknown key; did you mean {listed}?"


def load_servers(
    directory: Path, errors: list[ConfigError], digest: Any = None, pending: Pending | None = None
) -> dict[str, ServerConfig]:
    """Every tool server of `tools.d/`, named by file stem."""
    servers: dict[str, ServerConfig] = {}
    for path in config_files(directory, pending):
        if not SERVER_NAME.fullmatch(path.stem) or "__" in path.stem or path.stem.endswith("_"):
            # `__` joins server and tool in MCP tool names, so a server name must not contain or end with it.
            errors.append(ConfigError(
                str(path), "", "file name must be a server name: A-Z a-z 0-9 _ -, no '__', not ending in '_'"
            ))
            continue
        loaded = _read_toml(path, errors, digest, pending)
        if loaded is None:
            continue
        server = _validate(ServerConfig, path, *loaded, errors)
        if server is not None:
            server = _with_interpreter(server)
            _check_program(path, server, errors)
            servers[path.stem] = server
    _check_prefixes(directory, servers, errors)
    return servers


def _with_interpreter(server: ServerConfig) -> ServerConfig:
    """`command = ["{python}", …]` made to run on the daemon's own interpreter."""
    if server.command[0] != PYTHON_PLACEHOLDER or not sys.executable:
        return server
    return server.model_copy(update={"command": [sys.executable, *server.command[1:]]})


def _check_program(path: Path, server: ServerConfig, errors: list[ConfigError]) -> None:
    """A program that cannot be run is a config error, not a call that fails later: found on the PATH the child
    gets (its `env` may set one), or, named with a `/`, a file relative to the directory it starts in."""
    program = server.command[0]
    where = Path(server.cwd) if server.cwd else Path.cwd()
    if server.cwd and not where.is_absolute():
        where = path.parent.parent / where
    if "/" not in program:
        search = server.env.get("PATH", os.environ.get("PATH", os.defpath))
        if shutil.which(program, path=search) is None:
            errors.append(ConfigError(str(path.absolute()), "command", f"program {program!r} is not on PATH ({search}) "
                                      "or is not executable"))
            return
    else:
        full = where / program
        if not full.is_file():
            errors.append(ConfigError(str(path.absolute()), "command", f"program {str(full)!r} does not exist"))
            return
        if not os.access(full, os.X_OK):
            errors.append(ConfigError(str(path.absolute()), "command", f"program {str(full)!r} is not executable"))
            return
    _check_script(path, server, where, errors)


def _check_script(path: Path, server: ServerConfig, where: Path, errors: list[ConfigError]) -> None:
    """`python srv.py` with no `srv.py` fails at its first call as surely as a missing program: say so now."""
    if not SCRIPT_INTERPRETERS.fullmatch(Path(server.command[0]).name):
        return
    for operand in server.argv[1:]:
        if operand in NO_SCRIPT_OPTIONS:
            return
        if operand.startswith("-"):
            continue
        if operand.endswith(SCRIPT_SUFFIXES) and not (where / operand).is_file():
            errors.append(ConfigError(str(path.absolute()), "command",
                                      f"script {str(where / operand)!r} of {server.command[0]!r} does not exist"))
        return


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


def defined_in(config_dir: Path, kind: str, name: str) -> Path | None:
    """The policy file that defines `[kind.name]` (kind: clients, operators, scrapers), read leniently: a broken
    file elsewhere does not hide where a name lives."""
    for path in config_files(config_dir / POLICIES_DIR):
        try:
            table = tomllib.loads(path.read_text(encoding="utf-8")).get(kind)
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
            continue
        if isinstance(table, dict) and name in table:
            return path
    return None


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
    # Roles a file defines that failed validation: their own errors say what is wrong, so a client naming one
    # is not also told that the role does not exist.
    broken_roles: set[str] = field(default_factory=set)


def load_policies(
    directory: Path, errors: list[ConfigError], digest: Any = None, pending: Pending | None = None
) -> Policies:
    """All policy files merged; a name defined twice is an error naming both files."""
    merged = Policies()
    for path in config_files(directory, pending):
        loaded = _read_toml(path, errors, digest, pending)
        if loaded is None:
            continue
        policy = _validate(PolicyFile, path, *loaded, errors)
        if policy is None:
            roles = loaded[0].get("roles")
            merged.broken_roles.update(roles if isinstance(roles, dict) else ())
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
            if role not in policies.roles and role not in policies.broken_roles
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


def load_snapshot(config_dir: Path, pending: Pending | None = None) -> Snapshot:
    """Load and validate the whole config directory (with `pending` files as if written). Raises ConfigInvalid
    listing every problem."""
    errors: list[ConfigError] = []
    tools_dir = config_dir / TOOLS_DIR
    if not tools_dir.is_dir():
        # The full path: `--check` run from the wrong directory must say where it looked.
        errors.append(ConfigError(str(tools_dir.absolute()), "", "directory not found"))
    digest = hashlib.sha256()
    servers = load_servers(tools_dir, errors, digest, pending)
    policies = load_policies(config_dir / POLICIES_DIR, errors, digest, pending)
    if errors:
        raise ConfigInvalid(errors)
    return Snapshot(servers=servers, roles=policies.roles, clients=policies.clients, operators=policies.operators,
                    scrapers=policies.scrapers, sources=policies.sources, config_dir=config_dir,
                    digest=digest.hexdigest())
