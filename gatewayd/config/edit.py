"""Writing policy files: the one place gatewayd changes an operator's TOML (token hashes).

Owns reading a policy file, setting a client's token hash and roles (as the bytes the file would
hold, so a caller can validate them with the whole config before anything is written), and writing it back
atomically (temp file + rename, so a watcher never sees half a file). Comments in the
edited file are not preserved by tomli-w; the README says so.
"""

from __future__ import annotations

import os
import stat
import tempfile
import tomllib
from pathlib import Path
from typing import Any

import tomli_w

from gatewayd.config.models import CLIENT_NAME
from gatewayd.errors import ConfigError

# Policy files hold token hashes: readable by the owner (the daemon's user) only.
POLICY_FILE_MODE = 0o600


def client_token_text(path: Path, client: str, digest: str, roles: list[str] | None = None) -> bytes:
    """The policy file at `path` with `client` given the token whose SHA-256 is `digest` (replacing its old ones)
    and, if given, these roles (else it keeps its own)."""
    data, entry = _token_holder(path, "clients", client)
    entry["token_sha256"] = digest
    if roles is not None:
        entry["roles"] = roles
    entry.setdefault("roles", [])
    return tomli_w.dumps(data).encode("utf-8")


def operator_token_text(path: Path, operator: str, digest: str, kind: str = "operators") -> bytes:
    """The policy file at `path` with operator (or, with kind="scrapers", metrics scraper) `operator` given the
    token whose SHA-256 is `digest` (replacing its old ones)."""
    data, entry = _token_holder(path, kind, operator)
    entry["token_sha256"] = digest
    return tomli_w.dumps(data).encode("utf-8")


def set_client_token(path: Path, client: str, digest: str, roles: list[str] | None = None) -> None:
    """Write what client_token_text makes."""
    write_atomic(path, client_token_text(path, client, digest, roles))


def set_operator_token(path: Path, operator: str, digest: str, kind: str = "operators") -> None:
    """Write what operator_token_text makes."""
    write_atomic(path, operator_token_text(path, operator, digest, kind))


def _token_holder(path: Path, kind: str, name: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The policy file's data and its `[kind.name]` table, created if missing."""
    if not CLIENT_NAME.fullmatch(name):
        raise ConfigError(str(path), f"{kind}.{name}", "name may use only A-Z a-z 0-9 _ . -")
    data = _read(path)
    table = data.setdefault(kind, {})
    if not isinstance(table, dict):
        raise ConfigError(str(path), kind, "must be a table")
    entry = table.setdefault(name, {})
    if not isinstance(entry, dict):
        raise ConfigError(str(path), f"{kind}.{name}", "must be a table")
    return data, entry


def _same_access(tmp: str, path: Path) -> None:
    """A rewritten file keeps its group and mode (root editing /etc/gatewayd must not lock the daemon's group
    out); a new one is readable by its owner only."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        os.chmod(tmp, POLICY_FILE_MODE)
        return
    if info.st_gid != os.stat(tmp).st_gid:
        os.chown(tmp, -1, info.st_gid)
    os.chmod(tmp, stat.S_IMODE(info.st_mode))


def _read(path: Path) -> dict[str, Any]:
    if not path.exists():
        return {}
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(str(path), "", f"not valid TOML: {exc}") from exc


def write_atomic(path: Path, data: bytes) -> None:
    """Replace `path` with `data` in one rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        _same_access(tmp, path)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
