"""Writing policy files: the one place gatewayd changes an operator's TOML (token hashes).

Owns reading a policy file, setting a client's token hash and roles, and writing it back
atomically (temp file + rename, so a watcher never sees half a file). Comments in the
edited file are not preserved by tomli-w; the README says so.
"""

from __future__ import annotations

import os
import tempfile
import tomllib
from pathlib import Path
from typing import Any

import tomli_w

from gatewayd.config.models import CLIENT_NAME
from gatewayd.errors import ConfigError

# Policy files hold token hashes: readable by the owner (the daemon's user) only.
POLICY_FILE_MODE = 0o600


def set_client_token(path: Path, client: str, digest: str, roles: list[str] | None = None) -> None:
    """Give `client` the token whose SHA-256 is `digest` (replacing its old ones) in the policy file at `path`."""
    if not CLIENT_NAME.fullmatch(client):
        raise ConfigError(str(path), f"clients.{client}", "client name may use only A-Z a-z 0-9 _ . -")
    data = _read(path)
    clients = data.setdefault("clients", {})
    if not isinstance(clients, dict):
        raise ConfigError(str(path), "clients", "must be a table")
    entry = clients.setdefault(client, {})
    entry["token_sha256"] = digest
    if roles is not None:
        entry["roles"] = roles
    entry.setdefault("roles", [])
    write_atomic(path, tomli_w.dumps(data).encode("utf-8"))


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
        os.chmod(tmp, POLICY_FILE_MODE)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
