"""What the loader checks beyond the schema: programs that can run, `{python}`, one error per mistake, full paths."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from gatewayd.config.loader import PYTHON_PLACEHOLDER, ConfigInvalid, load_snapshot
from gatewayd.errors import ToolServerUnavailable
from gatewayd.upstream.process import ChildProcess
from tests.daemon import write_config

JSONRPC = 'protocol = "jsonrpc"\n[methods.add]\n'


def errors_of(config_dir: Path) -> list[str]:
    with pytest.raises(ConfigInvalid) as invalid:
        load_snapshot(config_dir)
    return [str(error) for error in invalid.value.errors]


def test_a_program_not_on_path_is_an_error_naming_the_file_and_command(tmp_path: Path) -> None:
    write_config(tmp_path, {"calc": 'command = ["no-such-program-4711"]\n' + JSONRPC})
    [error] = errors_of(tmp_path)
    assert error.startswith(f"{tmp_path / 'tools.d' / 'calc.toml'} [command]: program 'no-such-program-4711' is not")


def test_the_path_the_child_gets_is_the_one_searched(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "mytool").write_text("#!/bin/sh\n")
    (bin_dir / "mytool").chmod(0o755)
    write_config(tmp_path, {"t": f'command = ["mytool"]\nenv = {{ PATH = "{bin_dir}" }}\n' + JSONRPC})
    assert load_snapshot(tmp_path).servers["t"].command == ["mytool"]
    write_config(tmp_path, {"t": 'command = ["mytool"]\n' + JSONRPC})
    assert "[command]: program 'mytool' is not on PATH" in errors_of(tmp_path)[0]


def test_a_file_that_is_missing_or_not_executable_is_an_error(tmp_path: Path) -> None:
    script = tmp_path / "srv.sh"
    script.write_text("#!/bin/sh\n")
    script.chmod(0o644)
    write_config(tmp_path, {"a": f'command = ["{script}"]\n' + JSONRPC,
                            "b": 'command = ["./missing.sh"]\ncwd = "."\n' + JSONRPC})
    errors = errors_of(tmp_path)
    assert errors == [f"{tmp_path / 'tools.d' / 'a.toml'} [command]: program '{script}' is not executable",
                      f"{tmp_path / 'tools.d' / 'b.toml'} [command]: program '{tmp_path / 'missing.sh'}' "
                      "does not exist"]
    script.chmod(0o755)
    (tmp_path / "missing.sh").symlink_to(script)
    assert set(load_snapshot(tmp_path).servers) == {"a", "b"}


@pytest.mark.parametrize(("argv", "script"), [(["{python}", "-u", "gone.py"], "gone.py"),
                                               (["sh", "gone.sh", "--flag"], "gone.sh"),
                                               (["sh", "-c", "exec gone.sh"], None),
                                               (["{python}", "-X", "importtime", "-m", "gone"], None)])
def test_an_interpreters_missing_script_is_an_error(tmp_path: Path, argv: list[str], script: str | None) -> None:
    quoted = ", ".join(f'"{arg}"' for arg in argv)
    write_config(tmp_path, {"s": f'command = [{quoted}]\ncwd = "."\n' + JSONRPC})
    if script is None:  # the code comes from a module or a string: nothing to look for
        assert set(load_snapshot(tmp_path).servers) == {"s"}
        return
    program = sys.executable if argv[0] == PYTHON_PLACEHOLDER else argv[0]
    assert errors_of(tmp_path) == [f"{tmp_path / 'tools.d' / 's.toml'} [command]: script "
                                   f"'{tmp_path / script}' of {program!r} does not exist"]
    (tmp_path / script).write_text("")
    assert set(load_snapshot(tmp_path).servers) == {"s"}


def test_python_placeholder_is_the_daemons_own_interpreter(tmp_path: Path) -> None:
    write_config(tmp_path, {"calc": f'command = ["{PYTHON_PLACEHOLDER}", "-m", "gatewayd.examples.calc"]\n' + JSONRPC})
    assert load_snapshot(tmp_path).servers["calc"].argv == [sys.executable, "-m", "gatewayd.examples.calc"]


def test_the_shipped_examples_name_no_python_of_the_path() -> None:
    shipped = load_snapshot(Path(__file__).resolve().parents[2])
    assert {config.command[0] for config in shipped.servers.values()} == {sys.executable}


def test_a_bad_key_in_a_role_is_reported_once_not_again_per_client(tmp_path: Path) -> None:
    write_config(tmp_path, {"calc": 'command = ["true"]\n' + JSONRPC},
                 '[roles.dev]\nallow = ["calc.*"]\nalow = ["x.y"]\n', {"a": ["dev"], "b": ["dev", "nosuch"]})
    errors = errors_of(tmp_path)
    assert errors == [f"{tmp_path / 'policies' / 'roles.toml'}:3 [roles.dev.alow]: unknown key; did you mean 'allow'?",
                      f"{tmp_path / 'policies' / 'clients.toml'} [clients.b.roles]: no such role 'nosuch'"]


def test_a_missing_tools_dir_is_named_in_full_from_any_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    [error] = errors_of(Path("."))
    assert error == f"{tmp_path / 'tools.d'}: directory not found"


@pytest.mark.parametrize("mode", [0o644, None])
async def test_a_spawn_that_cannot_run_is_not_retryable(tmp_path: Path, mode: int | None) -> None:
    program = tmp_path / "srv"
    if mode is not None:
        program.write_text("#!/bin/sh\n")
        program.chmod(mode)
    child = ChildProcess("srv", [str(program)])
    with pytest.raises(ToolServerUnavailable) as failed:
        await child.open(lambda lines: None)
    wire = failed.value.to_wire()
    assert wire["data"]["retryable"] is False and wire["data"]["server"] == "srv"
    assert os.strerror(13 if mode else 2) in wire["message"]
