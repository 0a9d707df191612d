"""Command lines: `gatewayd` runs the daemon, `gatewayctl` drives it. Parsing and printing only.

Every verb calls into the module that owns its logic; errors print as one line naming the
file and key, never a traceback, with a non-zero exit status. What the running daemon reports
(an agent's arguments, names a client or tool server chose) reaches the terminal only through
display.shown: no control or bidi character of theirs is printed raw; `--json` prints ASCII JSON.
"""

from __future__ import annotations

# First: asyncio and aiohttp are imported there, without TLS (see its docstring).
from gatewayd import lean_import  # noqa: F401

# isort: split
import argparse
import asyncio
import faulthandler
import json
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from gatewayd import __version__, display, urls
from gatewayd.admin import CLIENT_TIMEOUT, AdminClient, AdminUnavailable
from gatewayd.config.loader import POLICIES_DIR, ConfigInvalid, Snapshot, defined_in, load_snapshot
from gatewayd.config.models import parse_duration
from gatewayd.errors import ConfigError
from gatewayd.settings import Settings, describe
from gatewayd.tokens import hash_token, new_token

EXIT_CONFIG = 2
EXIT_USAGE = 64
# sysexits.h EX_UNAVAILABLE: the daemon is not running or its socket cannot be opened.
EXIT_UNAVAILABLE = 69
# An admin verb that reached the daemon but did not do what was asked (e.g. approving a finished approval).
EXIT_REFUSED = 1
# `gatewayctl call` waits this long by default: longer than the default confirmation timeout plus a call.
CALL_WAIT = 600.0
# A tool's description shown per row by `gatewayctl tools`; --json shows it whole.
DESCRIPTION_COLUMN = 60
# Arguments shown per row by `gatewayctl approvals`; --json shows them whole.
ARGUMENTS_COLUMN = 60
DEFAULT_POLICY_FILE = "clients.toml"
DEV_CLIENT = "dev"
DEV_ROLE = "developer"
DEV_POLICY_FILE = "dev.local.toml"
DEV_TOKEN_FILE = ".gatewayd-dev-token"
DEV_OPERATOR = "dev-operator"
DEV_OPERATOR_TOKEN_FILE = ".gatewayd-dev-operator-token"


class JsonLines(logging.Formatter):
    """One JSON object a line: time, level, logger, message (and the traceback, if any), for log shippers."""

    def format(self, record: logging.LogRecord) -> str:
        line = {"time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S") + f".{int(record.msecs):03d}",
                "level": record.levelname, "logger": record.name, "message": record.getMessage()}
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=True)


def setup_logging(level: str, log_format: str = "text") -> None:
    """One line per event on stderr, as text (journald adds its own timestamps) or as JSON."""
    handler = logging.StreamHandler(sys.stderr)
    if log_format == "json":
        handler.setFormatter(JsonLines())
    else:
        fmt = "%(levelname)s %(name)s: %(message)s"
        if "JOURNAL_STREAM" not in os.environ:
            fmt = "%(asctime)s " + fmt
        handler.setFormatter(logging.Formatter(fmt))
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)
    # watchfiles logs every batch of changes at INFO; the reloader logs what it did with them.
    logging.getLogger("watchfiles").setLevel(logging.WARNING)


def _config_errors(prog: str, exc: ConfigInvalid) -> int:
    """Print every config error, one line each, and give the config-error exit status."""
    for error in exc.errors:
        print(f"{prog}: config error: {error}", file=sys.stderr)
    return EXIT_CONFIG


# -- gatewayd -------------------------------------------------------------------------------


def _daemon_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gatewayd",
        description="Serve the tool servers of CONFIG_DIR/tools.d behind one authenticated JSON-RPC / MCP endpoint. "
        "Each setting can also be set as GATEWAYD_<NAME> in the environment or in CONFIG_DIR/gatewayd.toml.",
    )
    parser.add_argument("--version", action="version", version=f"gatewayd {__version__}")
    parser.add_argument("--check", action="store_true", help="validate the config and exit")
    for name, description, default in describe():
        flag = "--" + name.replace("_", "-")
        if isinstance(default, list):
            parser.add_argument(flag, dest=name, action="append", help=f"{description} (repeatable)")
        else:
            parser.add_argument(flag, dest=name, help=f"{description} (default: {default})")
    return parser


def _load_settings(args: argparse.Namespace) -> Settings:
    given: dict[str, Any] = {name: value for name, value in vars(args).items() if value is not None}
    given.pop("check", None)
    if "config_dir" in given:
        # The optional gatewayd.toml lives in the config directory, so it must be known first.
        os.environ.setdefault("GATEWAYD_CONFIG_DIR", str(given["config_dir"]))
    return Settings(**given)


def gatewayd_main(argv: list[str] | None = None) -> int:
    """Entry point of `gatewayd`."""
    args = _daemon_parser().parse_args(argv)
    try:
        settings = _load_settings(args)
    except ValidationError as exc:
        for detail in exc.errors():
            print(f"gatewayd: setting {'.'.join(map(str, detail['loc']))}: {detail['msg']}", file=sys.stderr)
        return EXIT_USAGE
    setup_logging(settings.log_level, settings.log_format)
    # A hang that the systemd watchdog ends with SIGABRT leaves every thread's stack in the journal.
    faulthandler.enable()
    try:
        if args.check:
            print(_config_ok(load_snapshot(settings.config_dir)))
            return 0
        from gatewayd.app import serve
        from gatewayd.upstream.process import watch_exits_by_pidfd

        with asyncio.Runner() as runner:
            watch_exits_by_pidfd(runner.get_loop())
            runner.run(serve(settings))
    except ConfigInvalid as exc:
        return _config_errors("gatewayd", exc)
    except OSError as exc:
        print(f"gatewayd: cannot start: {exc}", file=sys.stderr)
        return 1
    return 0


# -- gatewayctl -----------------------------------------------------------------------------


def _ctl_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gatewayctl", description="Administer gatewayd.")
    parser.add_argument("--version", action="version", version=f"gatewayctl {__version__}")
    parser.add_argument("--config-dir", type=Path, default=Path(os.environ.get("GATEWAYD_CONFIG_DIR", ".")),
                        help="directory holding tools.d/ and policies/ (default: $GATEWAYD_CONFIG_DIR or .)")
    verbs = parser.add_subparsers(dest="verb", required=True)
    token = verbs.add_parser("token", help="manage client tokens").add_subparsers(dest="token_verb", required=True)
    new = token.add_parser("new", help="make a token for CLIENT (or an operator), print it once, store its hash")
    new.add_argument("client")
    new.add_argument("--role", action="append", dest="roles", help="role to give the client (repeatable)")
    kind = new.add_mutually_exclusive_group()
    kind.add_argument("--operator", action="store_true",
                      help="make an operator token (approves calls on the web page) instead of a client's")
    kind.add_argument("--scraper", action="store_true", help="make a token that can only read /metrics")
    new.add_argument("--policy-file", type=Path,
                     help=f"policy file to write, in DIR/policies (default: the one defining NAME, else "
                          f"{DEFAULT_POLICY_FILE})")
    new.add_argument("--replace", action="store_true",
                     help="give an existing NAME a new token; its old one stops working (its roles stay unless "
                          "--role is given)")
    dev = verbs.add_parser("dev-client", help="make sure the local development client exists; print its token")
    dev.add_argument("--url", default="http://127.0.0.1:8765/mcp", help="endpoint to print")
    check = verbs.add_parser("check", help="validate a config directory without running it (exit 0: valid, 2: not)")
    check.add_argument("directory", nargs="?", type=Path, help="the directory to check (default: --config-dir)")
    explain = verbs.add_parser("explain", help="show the decision for CLIENT calling METHOD, and the rule behind it")
    explain.add_argument("client")
    explain.add_argument("method", help="canonical name, e.g. calc.add")
    explain.add_argument("arguments", nargs="?", default=None, help="the call's arguments as a JSON object")
    parser.add_argument("--socket", type=Path, help="the daemon's admin socket (default: from its settings)")
    pending = verbs.add_parser("approvals", help="list calls waiting for a person's confirmation")
    pending.add_argument("--json", action="store_true", help="print JSON, arguments in full")
    approve = verbs.add_parser("approve", help="let a waiting call run, once")
    approve.add_argument("id")
    approve.add_argument("--for", dest="allow_again_for", metavar="DURATION", type=_duration,
                         help="and let the same client make the very same call again without asking for this long "
                              "(e.g. 10m; at most 1h)")
    revoke = verbs.add_parser("revoke", help="end what `approve ID --for` allowed again")
    revoke.add_argument("id")
    deny = verbs.add_parser("deny", help="refuse a waiting call")
    deny.add_argument("id")
    deny.add_argument("--reason", help="told to the caller and written to the audit log")
    status = verbs.add_parser("status", help="what the running daemon is doing")
    status.add_argument("--json", action="store_true", help="print JSON")
    reload = verbs.add_parser("reload", help="make the daemon re-read its config; prints what changed")
    reload.add_argument("--json", action="store_true", help="print JSON")
    restart = verbs.add_parser("restart", help="restart a tool server's child (and leave the failed state)")
    restart.add_argument("server")
    verbs.add_parser("metrics", help="print the daemon's Prometheus metrics")
    tools = verbs.add_parser("tools", help="the tools each client (or CLIENT) sees, from the running daemon")
    tools.add_argument("client", nargs="?")
    tools.add_argument("--json", action="store_true", help="print the tools/list answers as JSON")
    call = verbs.add_parser("call", help="call METHOD as CLIENT through the daemon's pipeline (policy, confirmation, "
                                         "audit), recorded as made by you on its behalf")
    call.add_argument("client")
    call.add_argument("method", help="canonical name, e.g. calc.add")
    call.add_argument("arguments", nargs="?", default=None, help="the call's arguments as a JSON object")
    call.add_argument("--timeout", type=_duration, default=CALL_WAIT,
                      help=f"how long to wait for the answer, a confirmation included (default: {CALL_WAIT:g}s)")
    return parser


def _token_new(args: argparse.Namespace) -> int:
    """Make a token; the policy file is written only if the whole config, with it, is one a reload accepts."""
    kind = "operator" if args.operator else "scraper" if args.scraper else "client"
    table = f"{kind}s"
    key = f"{table}.{args.client}"
    if kind != "client" and args.roles:
        print(f"gatewayctl: a {kind} has no roles; drop --role", file=sys.stderr)
        return EXIT_USAGE
    existing = defined_in(args.config_dir, table, args.client)
    path = _policy_file(args, existing)
    if existing is not None and not args.replace:
        raise ConfigError(str(existing.absolute()), key, "already exists; pass --replace to give it a new token "
                          "(the old one stops working)")
    if existing is None and args.replace:
        raise ConfigError(str(path.absolute()), key, f"no {kind} {args.client!r} to replace")
    if kind == "client" and existing is None and not args.roles:
        raise ConfigError(str(path.absolute()), f"{key}.roles", "a new client needs at least one --role "
                          "(with none it may call nothing)")
    # Writing config (and tomli_w under it) is gatewayctl's alone: the daemon does not load it (test_lean_start.py).
    from gatewayd.config.edit import client_token_text, operator_token_text, write_atomic

    token = new_token()
    if kind == "client":
        text = client_token_text(path, args.client, hash_token(token), args.roles)
    else:
        text = operator_token_text(path, args.client, hash_token(token), kind=table)
    try:
        load_snapshot(args.config_dir, {path.absolute(): text})
    except ConfigInvalid as exc:
        _config_errors("gatewayctl", exc)
        print(f"gatewayctl: nothing written: a reload would refuse the config with {path} changed", file=sys.stderr)
        return EXIT_CONFIG
    write_atomic(path, text)
    print(token)
    print(f"gatewayctl: stored the hash for {kind} {args.client!r} in {path}; the token is shown only once",
          file=sys.stderr)
    return 0


def _policy_file(args: argparse.Namespace, existing: Path | None) -> Path:
    """Where the token goes: --policy-file (a bare name is one in DIR/policies), else the file that already defines
    the name, else the default. Only files in DIR/policies are read by the daemon."""
    policies = args.config_dir / POLICIES_DIR
    given: Path | None = args.policy_file
    if given is None:
        return existing or policies / DEFAULT_POLICY_FILE
    path = policies / given if given.parent == Path(".") else given
    if path.absolute().parent != policies.absolute():
        raise ConfigError(str(path.absolute()), "", f"the daemon reads policy files only from {policies.absolute()}")
    return path


def _dev_client(args: argparse.Namespace) -> int:
    from gatewayd.config.edit import set_client_token, set_operator_token

    policy_file = args.config_dir / POLICIES_DIR / DEV_POLICY_FILE
    token = _dev_token(args.config_dir / DEV_TOKEN_FILE, policy_file,
                       lambda digest: set_client_token(policy_file, DEV_CLIENT, digest, [DEV_ROLE]))
    operator = _dev_token(args.config_dir / DEV_OPERATOR_TOKEN_FILE, policy_file,
                          lambda digest: set_operator_token(policy_file, DEV_OPERATOR, digest))
    links = _dev_links(args)
    if links is None:
        return EXIT_CONFIG
    url = links.endpoint
    curl = f"curl -s {url} -H 'Authorization: Bearer {token}' -H 'Content-Type: application/json' -d "
    print(f"endpoint:  {url}" + (f"   (through the proxy; the daemon listens on {args.url})" if links.public else ""))
    print(f"token:     {token}   (client {DEV_CLIENT!r}, kept in {DEV_TOKEN_FILE})")
    print(f"try:       {curl}'{{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"calc.add\",\"params\":{{\"a\":2,\"b\":3}}}}'")
    print(f"confirm:   {curl}'{{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"shell.run\",\"params\":"
          "{\"command\":\"uname -a\"}}'")
    print("           waits for a person: `.venv/bin/gatewayctl approvals`, then `.venv/bin/gatewayctl approve ID`,")
    print(f"           or {links.approval_page} with the operator token {operator}")
    return 0


def _dev_links(args: argparse.Namespace) -> urls.Links | None:
    """Where the printed lines point: the settings' public_url when there is one, else --url; None (said why) if
    the settings are invalid."""
    os.environ.setdefault("GATEWAYD_CONFIG_DIR", str(args.config_dir))
    try:
        public = Settings(config_dir=args.config_dir).public()
    except ValidationError as exc:
        for detail in exc.errors():
            print(f"gatewayctl: setting {'.'.join(map(str, detail['loc']))}: {detail['msg']}", file=sys.stderr)
        return None
    return urls.Links(args.url.rsplit("/", 1)[0], public)


def _dev_token(token_file: Path, policy_file: Path, store: Callable[[str], None]) -> str:
    """The token kept in `token_file`, made and stored anew unless the policy file still holds its hash."""
    token = token_file.read_text().strip() if token_file.exists() else ""
    if not token or not policy_file.exists() or hash_token(token) not in policy_file.read_text():
        token = new_token()
        store(hash_token(token))
        token_file.write_text(token + "\n")
        token_file.chmod(0o600)
    return token


def _check(args: argparse.Namespace) -> int:
    print(_config_ok(load_snapshot(args.directory or args.config_dir)))
    return 0


def _config_ok(snapshot: Snapshot) -> str:
    return f"config OK: {snapshot.summary()}"


def _explain(args: argparse.Namespace) -> int:
    # gatewayctl's alone: the daemon does not load it.
    from gatewayd.explain import denied, explain

    snapshot = load_snapshot(args.config_dir)
    try:
        arguments = json.loads(args.arguments) if args.arguments is not None else None
    except ValueError as exc:
        print(f"gatewayctl: arguments are not JSON: {exc}", file=sys.stderr)
        return EXIT_USAGE
    for line in explain(snapshot, args.client, args.method, arguments):
        print(line)
    # A script can ask `gatewayctl explain … && …`: a call that would be refused is a refusal.
    return EXIT_REFUSED if denied(snapshot, args.client, args.method, arguments) else 0


# -- verbs that talk to the running daemon -----------------------------------------------------


def _admin(args: argparse.Namespace) -> AdminClient:
    timeout = getattr(args, "timeout", None) or CLIENT_TIMEOUT
    if args.socket is not None:
        return AdminClient(args.socket, timeout)
    os.environ.setdefault("GATEWAYD_CONFIG_DIR", str(args.config_dir))
    path = Settings(config_dir=args.config_dir).admin_socket_path()
    if path is None:
        raise AdminUnavailable("the admin socket is turned off in the settings (admin_socket = \"\")")
    return AdminClient(path, timeout)


def _ask(args: argparse.Namespace, method: str, route: str, body: dict[str, Any] | None = None) -> tuple[int, Any]:
    return asyncio.run(_admin(args).call(method, route, body))


def _ask_text(args: argparse.Namespace, route: str) -> tuple[int, str]:
    return asyncio.run(_admin(args).text(route))


def _say(text: str, *, ok: bool = True) -> None:
    """Print a line the daemon reported (to stderr when it says no), escaped for the terminal."""
    print(display.shown(text), file=sys.stdout if ok else sys.stderr)


def _print_json(value: Any) -> None:
    # ASCII: every control, bidi and format character arrives as a JSON escape, not as itself.
    print(json.dumps(value, indent=2, ensure_ascii=True))


def _approvals(args: argparse.Namespace) -> int:
    _, body = _ask(args, "GET", "/approvals")
    pending = body.get("approvals", [])
    if args.json:
        _print_json(pending)
        return 0
    for item in body.get("standing", []):
        _say(f"allowed again: {item['client']} {item['method']} (same arguments) for {item['expires_in_s']:.0f}s "
             f"more, by approval {item['approval_id']}; end it with: gatewayctl revoke {item['approval_id']}")
    if not pending:
        print("no calls are waiting for confirmation")
        return 0
    rows: list[tuple[str, ...]] = [("ID", "CLIENT", "METHOD", "AGE", "EXPIRES IN", "ARGUMENTS")]
    for item in pending:
        shown = display.shown_json(item["arguments"])
        if len(shown) > ARGUMENTS_COLUMN:
            shown = shown[:ARGUMENTS_COLUMN - 1] + "…"
        rows.append((item["id"], item["client"], item["method"], f"{item['age_s']:.0f}s",
                     f"{item['expires_in_s']:.0f}s", shown))
    _print_table(rows)
    return 0


def _duration(text: str) -> float:
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def _decide(args: argparse.Namespace) -> int:
    body: dict[str, Any] = {}
    if getattr(args, "reason", None):
        body["reason"] = args.reason
    if getattr(args, "allow_again_for", None) is not None:
        body["allow_again_for"] = args.allow_again_for
    _, answer = _ask(args, "POST", f"/approvals/{args.id}/{args.verb}", body or None)
    _say(str(answer.get("message", answer)), ok=bool(answer.get("ok")))
    return 0 if answer.get("ok") else EXIT_REFUSED


def _revoke(args: argparse.Namespace) -> int:
    _, answer = _ask(args, "DELETE", f"/approvals/{args.id}/standing")
    _say(str(answer.get("message", answer)), ok=bool(answer.get("ok")))
    return 0 if answer.get("ok") else EXIT_REFUSED


def _status(args: argparse.Namespace) -> int:
    _, body = _ask(args, "GET", "/status")
    if args.json:
        _print_json(body)
        return 0
    audit, config = body["audit"], body["config"]
    tasks = body.get("tasks", {"running": 0, "kept": 0})
    print(f"gatewayd {body['version']}  pid {body['pid']}  up {body['uptime_s']:.0f}s  sessions {body['sessions']}  "
          f"listen streams {body.get('listeners', 0)}  tasks {tasks['running']} running/{tasks['kept']} kept  "
          f"pending approvals {body['pending_approvals']}  audit {_audit_health(audit)}")
    sync = "matches the files" if config["in_sync"] else "files on disk differ: run gatewayctl reload"
    print(f"listening on {body.get('url') or '-'}")
    print(f"config {config['config_dir']}: generation {config['generation']} ({sync})")
    last = config["last_reload"]
    if last is not None and not last["ok"]:
        _say(f"last reload FAILED ({last['trigger']}):")
        for error in last["errors"]:
            _say(f"  {error}")
    rows: list[tuple[str, ...]] = [("SERVER", "STATE", "ERA", "PID", "UPTIME", "RESTARTS", "IN FLIGHT", "WAITING",
                                   "LAST EXIT")]
    for name, server in body["servers"].items():
        rows.append(_server_row(name, server))
        # A per-client or per-session server's children, one row each under it, named by their owner.
        rows += [_server_row(f"  {name} [{server['isolation']} {child['owner']}]", child)
                 for child in server.get("children", ())]
    rows += [_server_row(f"{server['name']} (retiring)", server) for server in body["retiring"]]
    _print_table(rows)
    for name, server in body["servers"].items():
        for child in (server, *server.get("children", ())):
            if child.get("kept_by"):
                owner = f" [{server['isolation']} {child['owner']}]" if child is not server else ""
                _say(f"{name}{owner} runs on while idle: {child['kept_by']}")
    for session in body["session_list"]:
        stream = "  GET stream open" if session["stream_open"] else ""
        kept = session.get("streams_kept")
        resumable = f"  {kept} call stream(s) kept for a reconnection" if kept else ""
        _say(f"session {session['id']}…  client {session['client']}  MCP {session['version']}  "
             f"up {session['age_s']:.0f}s  idle {session['idle_s']:.0f}s{stream}{resumable}")
    for approval in body["approvals"]:
        _say(f"waiting for approval: {approval['id']}  {approval['client']}  {approval['method']}  "
             f"{approval['expires_in_s']:.0f}s left")
    return 0


def _audit_health(audit: dict[str, Any]) -> str:
    if not audit["healthy"]:
        return "FAILING"
    if audit.get("space_low"):
        return f"LOW SPACE ({audit.get('records_dropped_for_space', 0)} ordinary records dropped)"
    return "ok"


def _server_row(name: str, server: dict[str, Any]) -> tuple[str, ...]:
    uptime = server.get("uptime_s")
    # The MCP era a child was last spoken to in (`-`: not MCP, or not started yet).
    return (name, server["state"], server.get("era") or "-", str(server.get("pid") or "-"),
            f"{uptime:.0f}s" if uptime is not None else "-",
            str(server.get("restarts", 0)), str(server.get("in_flight", 0)), str(server.get("waiting", 0)),
            str(server.get("last_exit") or ""))


def _reload(args: argparse.Namespace) -> int:
    _, result = _ask(args, "POST", "/reload")
    if args.json:
        print(json.dumps(result, indent=2))
    elif not result["ok"]:
        for error in result["errors"]:
            _say(f"gatewayctl: config error: {error}", ok=False)
        print(f"gatewayctl: reload refused; generation {result['generation']} keeps running", file=sys.stderr)
    elif not result["changed"]:
        print(f"config unchanged (generation {result['generation']})")
    else:
        print(f"reloaded: generation {result['generation']}")
        for line in _diff_lines(result):
            _say(f"  {line}")
    return 0 if result["ok"] else EXIT_CONFIG


def _diff_lines(result: dict[str, Any]) -> list[str]:
    servers = result["servers"]
    lines = [f"servers {kind}: {', '.join(servers[kind])}" for kind in ("added", "removed") if servers[kind]]
    if servers["changed"]:
        lines.append(f"servers changed (restarted on new children): {', '.join(servers['changed'])}")
    for kind in ("clients", "roles", "operators", "scrapers"):
        lines += [f"{kind} {change}: {', '.join(names)}" for change, names in result[kind].items() if names]
    return lines or ["no server, client, role or operator changed"]


def _metrics(args: argparse.Namespace) -> int:
    status, text = _ask_text(args, "/metrics")
    print(text, end="")
    return 0 if status == 200 else EXIT_REFUSED


def _restart(args: argparse.Namespace) -> int:
    _, answer = _ask(args, "POST", f"/servers/{args.server}/restart")
    _say(str(answer.get("message", answer)), ok=bool(answer.get("ok")))
    return 0 if answer.get("ok") else EXIT_REFUSED


def _tools(args: argparse.Namespace) -> int:
    route = "/tools" + (f"?client={args.client}" if args.client else "")
    _, body = _ask(args, "GET", route)
    if not body.get("ok"):
        _say(str(body.get("message", body)), ok=False)
        return EXIT_REFUSED
    if args.json:
        _print_json(body["clients"])
        return 0
    rows: list[tuple[str, ...]] = [("CLIENT", "TOOL", "DESCRIPTION")]
    for client, tools in body["clients"].items():
        rows += [(client, tool["name"], _first_line(str(tool.get("description", "")))) for tool in tools]
        if not tools:
            rows.append((client, "(none)", ""))
    _print_table(rows)
    return 0


def _call(args: argparse.Namespace) -> int:
    try:
        arguments = json.loads(args.arguments) if args.arguments is not None else None
    except ValueError as exc:
        print(f"gatewayctl: arguments are not JSON: {exc}", file=sys.stderr)
        return EXIT_USAGE
    _, body = _ask(args, "POST", "/call", {"client": args.client, "method": args.method, "arguments": arguments})
    if "answer" not in body:
        _say(str(body.get("message", body)), ok=False)
        return EXIT_REFUSED
    answer = body["answer"]
    if "error" in answer:
        print(json.dumps(answer["error"], indent=2, ensure_ascii=True), file=sys.stderr)
        return EXIT_REFUSED
    _print_json(answer.get("result"))
    return 0


def _first_line(text: str) -> str:
    line = text.splitlines()[0] if text else ""
    return line if len(line) <= DESCRIPTION_COLUMN else line[:DESCRIPTION_COLUMN - 1] + "…"


def _print_table(rows: list[tuple[str, ...]]) -> None:
    # Escaped before the widths are measured, so the columns line up as printed.
    rows = [tuple(display.shown(cell) for cell in row) for row in rows]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())


def _quiet_stdout() -> None:
    """Point stdout at /dev/null, so the interpreter's own flush at exit finds no broken pipe either."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def gatewayctl_main(argv: list[str] | None = None) -> int:
    """Entry point of `gatewayctl`."""
    args = _ctl_parser().parse_args(argv)
    verbs = {"token": _token_new, "dev-client": _dev_client, "check": _check, "explain": _explain,
             "approvals": _approvals, "approve": _decide, "deny": _decide, "status": _status, "reload": _reload,
             "restart": _restart, "metrics": _metrics, "revoke": _revoke, "tools": _tools, "call": _call}
    try:
        return verbs[args.verb](args)
    except BrokenPipeError:
        # `gatewayctl status --json | head` closed the pipe early: what was read was wanted; no traceback.
        _quiet_stdout()
        return 0
    except AdminUnavailable as exc:
        print(f"gatewayctl: {exc}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    except ConfigInvalid as exc:
        return _config_errors("gatewayctl", exc)
    except ConfigError as exc:
        print(f"gatewayctl: {exc}", file=sys.stderr)
        return EXIT_CONFIG
