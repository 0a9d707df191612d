"""Config loading: strict models, durations, and errors that name the file, the key and the line."""

from __future__ import annotations

from pathlib import Path

import pytest

from gatewayd.config.loader import ConfigInvalid, load_snapshot
from gatewayd.config.models import parse_duration
from gatewayd.settings import Settings
from tests.daemon import REPO, write_config

CALC = 'command = ["python3", "-m", "gatewayd.examples.calc"]\nprotocol = "jsonrpc"\n[methods.add]\n'


def errors_of(root: Path) -> list[str]:
    with pytest.raises(ConfigInvalid) as caught:
        load_snapshot(root)
    return [str(error) for error in caught.value.errors]


def test_the_shipped_config_loads() -> None:
    snapshot = load_snapshot(REPO)
    assert {"calc", "shell", "clock"} <= set(snapshot.servers)
    assert snapshot.servers["calc"].protocol == "jsonrpc"
    assert snapshot.servers["shell"].timeout_for("run") == 600.0
    assert snapshot.servers["clock"].start == "eager"
    assert "developer" in snapshot.roles


def test_a_snapshot_says_what_it_holds_in_words(tmp_path: Path) -> None:
    write_config(tmp_path, {"calc": CALC}, clients={"alice": []})
    one = load_snapshot(tmp_path).summary()
    write_config(tmp_path, {"calc": CALC, "more": CALC}, clients={"alice": [], "bob": []})
    assert (one, load_snapshot(tmp_path).summary()) == ("1 tool server, 1 client", "2 tool servers, 2 clients")


def test_a_server_is_named_by_its_file_and_gets_defaults(tmp_path: Path) -> None:
    write_config(tmp_path, {"calc": CALC})
    server = load_snapshot(tmp_path).servers["calc"]
    assert server.argv == ["python3", "-m", "gatewayd.examples.calc"]
    assert (server.start, server.call_timeout, server.idle_timeout) == ("on-demand", 30.0, 600.0)


def test_a_lone_client_at_its_default_post_limit_is_not_queued_by_a_server_with_default_slots(tmp_path: Path) -> None:
    # A call waiting for a slot costs more than one the child queues (bench/README.md); the default share of a
    # server's slots must hold every call one client may have open by default.
    write_config(tmp_path, {"calc": CALC})
    server = load_snapshot(tmp_path).servers["calc"]
    assert (server.max_in_flight, server.client_slots, server.max_queued, server.client_queue) == (64, 48, 64, 32)
    assert server.client_slots >= Settings().client_max_concurrent


def test_command_may_be_a_string_with_args(tmp_path: Path) -> None:
    write_config(tmp_path, {"t": 'command = "python3"\nargs = ["-m", "x"]\n'})
    assert load_snapshot(tmp_path).servers["t"].argv == ["python3", "-m", "x"]


@pytest.mark.parametrize(
    ("text", "seconds"), [("30s", 30.0), ("5m", 300.0), ("1h", 3600.0), ("250ms", 0.25), (7, 7.0), ("1.5s", 1.5)]
)
def test_durations(text: object, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["5 minutes", "-1s", "", "s", True, "1d"])
def test_bad_durations_are_refused(text: object) -> None:
    with pytest.raises(ValueError):
        parse_duration(text)


def test_unknown_key_names_file_key_and_line(tmp_path: Path) -> None:
    write_config(tmp_path, {"calc": CALC + 'description = "x"\ncomand_typo = 1\n'})
    (message,) = errors_of(tmp_path)
    assert message == f"{tmp_path / 'tools.d' / 'calc.toml'}:5 [methods.add.comand_typo]: unknown key"


def test_unknown_top_level_key_points_at_its_line_and_names_the_key_it_looks_like(tmp_path: Path) -> None:
    write_config(tmp_path, {"calc": 'protocoll = "mcp"\n' + CALC})
    (message,) = errors_of(tmp_path)
    assert message == f"{tmp_path / 'tools.d' / 'calc.toml'}:1 [protocoll]: unknown key; did you mean 'protocol'?"


@pytest.mark.parametrize(("typo", "told"), [
    # The keys of the table the typo is in, nearest first: a method's own `timeout`, not the server's.
    ('[methods.add]\ntimout = "1s"', "[methods.add.timout]: unknown key; did you mean 'timeout'?"),
    ('timeout = "1s"', "[timeout]: unknown key; did you mean 'idle_timeout', 'call_timeout' or 'startup_timeout'?"),
    # Four keys are near: the three nearest are named.
    ("max_per_client = 2", "[max_per_client]: unknown key; did you mean 'max_queued_per_client', "
                           "'max_children_per_client' or 'max_in_flight_per_client'?"),
    # Nothing near: only what is wrong.
    ("enviroment = {}", "[enviroment]: unknown key"),
])
def test_an_unknown_key_names_the_known_keys_near_it_in_its_table(tmp_path: Path, typo: str, told: str) -> None:
    write_config(tmp_path, {"calc": 'command = ["python3", "-m", "gatewayd.examples.calc"]\nprotocol = "jsonrpc"\n'
                                    + typo + "\n"})
    (message,) = errors_of(tmp_path)
    assert message.split(" ", 1)[1] == told


def test_bad_value_names_the_nested_key(tmp_path: Path) -> None:
    write_config(tmp_path, {"calc": CALC + '[methods.sub]\ntimeout = "soon"\n'})
    (message,) = errors_of(tmp_path)
    assert "[methods.sub.timeout]" in message
    assert f"calc.toml:{CALC.count(chr(10)) + 2} " in message
    assert "duration" in message


def test_toml_syntax_error_names_the_line(tmp_path: Path) -> None:
    write_config(tmp_path, {"calc": CALC + "idle_timeout = \n"})
    (message,) = errors_of(tmp_path)
    assert "calc.toml:4:" in message and "not valid TOML" in message


def test_jsonrpc_server_must_declare_methods(tmp_path: Path) -> None:
    write_config(tmp_path, {"calc": 'command = ["true"]\nprotocol = "jsonrpc"\n'})
    (message,) = errors_of(tmp_path)
    assert "[methods.NAME]" in message


def test_every_broken_file_is_reported_at_once(tmp_path: Path) -> None:
    write_config(tmp_path, {"a": "command = 1\n", "b": "protocol = 'smtp'\ncommand=['x']\n"})
    messages = errors_of(tmp_path)
    assert any("a.toml" in m and "[command]" in m for m in messages)
    assert any("b.toml:1 [protocol]" in m for m in messages)


def test_bad_server_file_names_are_refused(tmp_path: Path) -> None:
    write_config(tmp_path, {"my.server": CALC, "a__b": CALC})
    messages = errors_of(tmp_path)
    assert len(messages) == 2 and all("file name must be a server name" in m for m in messages)


def test_hidden_and_non_toml_files_are_ignored(tmp_path: Path) -> None:
    write_config(tmp_path, {"calc": CALC})
    (tmp_path / "tools.d" / ".calc.toml.swp").write_text("garbage")
    (tmp_path / "tools.d" / "README").write_text("garbage")
    assert list(load_snapshot(tmp_path).servers) == ["calc"]


def test_missing_tools_dir_is_an_error(tmp_path: Path) -> None:
    (message,) = errors_of(tmp_path)
    assert "tools.d" in message and "directory not found" in message


def test_client_with_an_unknown_role(tmp_path: Path) -> None:
    write_config(tmp_path, {"calc": CALC}, '[clients.x]\nroles = ["nope"]\n')
    (message,) = errors_of(tmp_path)
    assert "roles.toml" in message and "[clients.x.roles]" in message and "no such role 'nope'" in message


def test_a_role_defined_twice_names_both_files(tmp_path: Path) -> None:
    write_config(tmp_path, {"calc": CALC}, "[roles.dev]\nallow = []\n")
    (tmp_path / "policies" / "zz.toml").write_text("[roles.dev]\nallow = ['calc.*']\n")
    (message,) = errors_of(tmp_path)
    assert "zz.toml" in message and "[roles.dev]" in message and "roles.toml" in message


def test_token_hash_must_be_sha256_hex(tmp_path: Path) -> None:
    write_config(tmp_path, {"calc": CALC}, '[clients.x]\ntoken_sha256 = "secret-in-plain-text"\n')
    (message,) = errors_of(tmp_path)
    assert "[clients.x.token_sha256]" in message and "64 lowercase hex" in message


def test_a_pattern_that_can_never_match_is_an_error(tmp_path: Path) -> None:
    write_config(tmp_path, {"calc": CALC}, '[roles.r]\nallow = ["calc.*", "Calc add"]\n')
    (message,) = errors_of(tmp_path)
    assert "[roles.r.allow]" in message and "'Calc add' can never match" in message


def test_argument_rules_are_validated(tmp_path: Path) -> None:
    roles = '[roles.r]\nallow = ["fs.*"]\n[roles.r.args."fs.*".path]\npath_under = "srv"\nregex = "("\n'
    write_config(tmp_path, {"calc": CALC}, roles)
    messages = errors_of(tmp_path)
    assert any("path_under must be an absolute directory" in m for m in messages)
    assert any("not a valid regular expression" in m for m in messages)


def test_confirmation_options_are_read_and_validated(tmp_path: Path) -> None:
    roles = ('[roles.r]\nconfirm = ["calc.*"]\n[roles.r.confirmation."calc.*"]\ntimeout = "2m"\nchannels = ["web"]\n'
             '[roles.bad.confirmation."calc add"]\ntimeout = "0s"\nchannels = ["email"]\n')
    write_config(tmp_path, {"calc": CALC}, roles)
    messages = errors_of(tmp_path)
    assert any("[roles.bad.confirmation.calc add.timeout]" in m for m in messages)
    assert any("[roles.bad.confirmation.calc add.channels.0]" in m and "'client' or 'web'" in m for m in messages)
    write_config(tmp_path, {"calc": CALC}, '[roles.bad.confirmation."calc add"]\ntimeout = "1s"\n')
    (message,) = errors_of(tmp_path)
    assert "[roles.bad.confirmation]" in message and "'calc add' can never match" in message
    write_config(tmp_path, {"calc": CALC}, roles.split("[roles.bad")[0])
    options = load_snapshot(tmp_path).roles["r"].confirmation["calc.*"]
    assert (options.timeout, options.channels) == (120.0, ["web"])


def test_an_agent_token_can_never_be_an_operator_token(tmp_path: Path) -> None:
    digest = "ab" * 32
    write_config(tmp_path, {"calc": CALC},
                 f'[clients.agent]\ntoken_sha256 = "{digest}"\n[operators.alice]\ntoken_sha256 = "{digest}"\n')
    (message,) = errors_of(tmp_path)
    assert "[operators.alice.token_sha256]" in message and "same token as client 'agent'" in message


def test_operators_are_loaded(tmp_path: Path) -> None:
    write_config(tmp_path, {"calc": CALC}, f'[operators.alice]\ntoken_sha256 = ["{"cd" * 32}"]\n')
    assert load_snapshot(tmp_path).operators["alice"].token_sha256 == ["cd" * 32]


def test_two_servers_exposing_the_same_prefix_is_an_error_naming_both_files(tmp_path: Path) -> None:
    (tmp_path / "tools.d").mkdir()
    (tmp_path / "policies").mkdir()
    (tmp_path / "tools.d" / "a.toml").write_text('command = ["true"]\nprefix = "b"\n')
    (tmp_path / "tools.d" / "b.toml").write_text('command = ["true"]\n')
    (tmp_path / "tools.d" / "c.toml").write_text('command = ["true"]\nprefix = ""\n')
    (tmp_path / "tools.d" / "d.toml").write_text('command = ["true"]\nprefix = ""\n')
    with pytest.raises(ConfigInvalid) as invalid:
        load_snapshot(tmp_path)
    [error] = invalid.value.errors
    assert error.key == "prefix" and "b.toml" in error.file and "a.toml" in error.detail


def test_a_prefix_outside_the_tool_name_alphabet_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "tools.d").mkdir()
    (tmp_path / "policies").mkdir()
    (tmp_path / "tools.d" / "a.toml").write_text('command = ["true"]\nprefix = "a.b"\n')
    with pytest.raises(ConfigInvalid) as invalid:
        load_snapshot(tmp_path)
    assert invalid.value.errors[0].key == "prefix"


def test_era_is_read_and_a_bad_value_names_file_and_key(tmp_path: Path) -> None:
    write_config(tmp_path, {"a": 'command = ["true"]\n', "b": 'command = ["true"]\nera = "legacy"\n',
                            "c": 'command = ["true"]\nera = 2026-07-28\n'})  # an unquoted TOML date is that version
    servers = load_snapshot(tmp_path).servers
    assert (servers["a"].era, servers["b"].era, servers["c"].era) == ("auto", "legacy", "2026-07-28")
    write_config(tmp_path, {"b": 'command = ["true"]\nera = "2025-11-25"\n'})
    (message,) = errors_of(tmp_path)
    assert message.startswith(f"{tmp_path / 'tools.d' / 'b.toml'}:2 [era]: ")
    assert "'auto', '2026-07-28' or 'legacy'" in message


def test_era_is_refused_on_a_server_that_is_not_mcp(tmp_path: Path) -> None:
    write_config(tmp_path, {"calc": 'era = "legacy"\n' + CALC})
    (message,) = errors_of(tmp_path)
    assert "calc.toml:1 [era]" in message and 'only to a protocol = "mcp" server, not "jsonrpc"' in message


def test_a_reload_sees_every_change_to_a_file_even_of_the_same_length(tmp_path: Path) -> None:
    # Files are parsed again only when their bytes change: a change that keeps the length must still count.
    write_config(tmp_path, {"calc": CALC + 'description = "aaaa"\n'})
    assert load_snapshot(tmp_path).servers["calc"].methods["add"].description == "aaaa"
    (tmp_path / "tools.d" / "calc.toml").write_text(CALC + 'description = "bbbb"\n')
    assert load_snapshot(tmp_path).servers["calc"].methods["add"].description == "bbbb"
    (tmp_path / "tools.d" / "calc.toml").write_text(CALC + 'description = "aaaa"\n')
    assert load_snapshot(tmp_path).servers["calc"].methods["add"].description == "aaaa"


def test_what_one_load_returns_cannot_change_the_next(tmp_path: Path) -> None:
    # The parse kept for the next load is not the one the models were built from.
    schema = ('[methods.add.input_schema]\ntype = "object"\nrequired = ["a"]\n'
              '[methods.add.input_schema.properties.a]\ntype = "number"\n')
    write_config(tmp_path, {"calc": CALC.replace("[methods.add]\n", "") + schema})
    first = load_snapshot(tmp_path).servers["calc"].methods["add"].input_schema
    assert first is not None
    first["required"].append("b")
    first["properties"]["a"]["type"] = "string"
    second = load_snapshot(tmp_path).servers["calc"].methods["add"].input_schema
    assert second == {"type": "object", "required": ["a"], "properties": {"a": {"type": "number"}}}


def test_a_methods_task_is_read_and_a_bad_value_names_file_line_and_key(tmp_path: Path) -> None:
    write_config(tmp_path, {"a": 'command = ["true"]\n[methods.build]\ntask = "optional"\n[methods.ship]\n'
                                 'task = "required"\n[methods.look]\ntimeout = "1s"\n'})
    server = load_snapshot(tmp_path).servers["a"]
    assert [server.task_mode(tool) for tool in ("build", "ship", "look", "unlisted")] == \
        ["optional", "required", "never", "never"]
    write_config(tmp_path, {"a": 'command = ["true"]\n[methods.build]\ntask = "always"\n'})
    (message,) = errors_of(tmp_path)
    assert message.startswith(f"{tmp_path / 'tools.d' / 'a.toml'}:3 [methods.build.task]: ")
    assert "'never', 'optional' or 'required'" in message


def test_a_terminal_lifetime_without_terminals_offered_is_refused_naming_the_file(tmp_path: Path) -> None:
    write_config(tmp_path, {"agent": 'command = ["true"]\nprotocol = "acp"\nterminal_lifetime = "session"\n'})
    (message,) = errors_of(tmp_path)
    assert message.startswith(str(tmp_path / "tools.d" / "agent.toml"))
    assert 'terminal_lifetime = "session" needs protocol = "acp" and terminals = true' in message
    write_config(tmp_path, {"agent": 'command = ["true"]\nprotocol = "acp"\nterminals = true\n'
                                     'terminal_lifetime = "session"\n'})
    assert load_snapshot(tmp_path).servers["agent"].terminal_lifetime == "session"
