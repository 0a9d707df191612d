"""Rewriting policy files: atomic, and a rewritten file keeps its group and mode."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from gatewayd.config.edit import set_client_token, set_operator_token


def test_a_new_policy_file_is_private(tmp_path: Path) -> None:
    path = tmp_path / "clients.toml"
    set_client_token(path, "laptop", "ab" * 32, ["r"])
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_a_rewritten_policy_file_keeps_its_group_and_mode(tmp_path: Path) -> None:
    path = tmp_path / "clients.toml"
    path.write_text("")
    os.chmod(path, 0o640)
    # As root (CI) the file can be given another group, as /etc/gatewayd's files are; otherwise our own.
    group = 1 if os.geteuid() == 0 else os.getgid()
    os.chown(path, -1, group)
    set_operator_token(path, "alice", "cd" * 32)
    info = path.stat()
    assert stat.S_IMODE(info.st_mode) == 0o640 and info.st_gid == group
    assert "[operators.alice]" in path.read_text()
