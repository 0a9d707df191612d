"""Who may call what, with which arguments: the one pure decision over (principal, target, params).

Owns pattern syntax and matching, Principal and its grants, argument rules, and `decide`.
Pure: no I/O except resolving paths for `path_under`, no state but memos (a Principal remembers
its decisions that do not depend on arguments; a reload makes new Principals). Every route to a tool server
(direct call, `tools/call`, each batch element) reaches `decide` with the canonical
`server.method` name after routing and before anything is sent.

Pattern syntax: a pattern is a canonical name in which `*` matches any run of name characters
(possibly empty). Nothing else is special. Names are compared byte for byte: no case folding,
no Unicode normalisation, no trimming.

Roles only grant. A call is allowed if some role of the client grants it (an `allow` or
`confirm` pattern matches) and that role's argument rules for the method pass; it needs a
person's confirmation if the granting roles say `confirm`, or if its tools.d definition does,
which no policy can waive. Anything else is denied.
"""

from __future__ import annotations

import enum
import functools
import os
import re
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from gatewayd.config.loader import Snapshot
from gatewayd.config.models import METHOD_NAME, ArgRule, ClientLimits, ConfirmOptions, Role

CANONICAL = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*\.[A-Za-z0-9_./-]+")
# A policy file's place in a decision when no file is known (tests, built-in principals).
UNKNOWN_FILE = "<policy>"
# Decisions a Principal remembers (method names come from clients, so the memo is emptied when full)…
DECISION_MEMO = 1024
# …and the longest name it remembers one for, so the memo's size is bounded in bytes too.
MEMO_NAME_CHARS = 512


class Decision(enum.Enum):
    """What happens to a call."""

    ALLOW = "allow"
    DENY = "deny"
    CONFIRM = "confirm"


@dataclass(frozen=True)
class Grant:
    """One role of a client, with where it was defined."""

    role: str
    file: str
    allow: tuple[str, ...] = ()
    confirm: tuple[str, ...] = ()
    args: tuple[tuple[str, tuple[tuple[str, ArgRule], ...]], ...] = ()
    confirmation: tuple[tuple[str, ConfirmOptions], ...] = ()

    @classmethod
    def from_role(cls, name: str, file: str, role: Role) -> Grant:
        """A grant from a configured role."""
        args = tuple((pattern, tuple(rules.items())) for pattern, rules in role.args.items())
        return cls(name, file, tuple(role.allow), tuple(role.confirm), args, tuple(role.confirmation.items()))


@dataclass(frozen=True)
class Principal:
    """An authenticated client, the grants of its roles, and its limits (None: the daemon's default)."""

    name: str
    grants: tuple[Grant, ...] = ()
    limits: ClientLimits = field(default_factory=ClientLimits)
    # (target, confirm_required) → the verdict, for targets no argument rule of the principal applies to.
    _decisions: dict[tuple[str, bool], Verdict] = field(default_factory=dict, compare=False, hash=False, repr=False)

    @property
    def patterns(self) -> tuple[str, ...]:
        """Every allow and confirm pattern of every role."""
        return tuple(p for grant in self.grants for p in (*grant.allow, *grant.confirm))


@dataclass(frozen=True)
class Rule:
    """What made a decision: the role, its file, the pattern, and for arguments the argument and rule."""

    role: str
    file: str
    pattern: str
    argument: str | None = None
    check: str | None = None

    def describe(self) -> str:
        """One line for logs, errors and `gatewayctl explain`."""
        return self.description

    @functools.cached_property
    def description(self) -> str:
        """describe(), made once: a remembered decision's rule is described on every call it decides."""
        where = f"role {self.role!r} ({self.file}) pattern {self.pattern!r}"
        if self.argument is not None:
            where += f", argument {self.argument!r}: {self.check}"
        return where


@dataclass(frozen=True)
class Verdict:
    """A decision and why: the rule that granted it, or for an argument refusal the rule that failed."""

    decision: Decision
    rule: Rule | None = None
    reason: str = ""

    @property
    def refused_arguments(self) -> bool:
        """Denied although a role grants the method: its arguments broke a rule."""
        return self.decision is Decision.DENY and self.rule is not None


@lru_cache(maxsize=4096)
def _compile(pattern: str) -> re.Pattern[str] | None:
    if not METHOD_NAME.fullmatch(pattern.replace("*", "x")):
        return None
    return re.compile("".join("[A-Za-z0-9_./-]*" if part == "*" else re.escape(part) for part in _split(pattern)))


def _split(pattern: str) -> list[str]:
    return [part for part in re.split(r"(\*)", pattern) if part]


def matches(pattern: str, name: str) -> bool:
    """Whether a policy pattern matches a canonical name exactly."""
    compiled = _compile(pattern)
    return compiled is not None and compiled.fullmatch(name) is not None


def is_canonical(name: str) -> bool:
    """Whether `name` has the shape `server.method` in the allowed alphabet (ASCII only)."""
    return name.isascii() and CANONICAL.fullmatch(name) is not None and ".." not in name


def _first_match(patterns: tuple[str, ...], target: str) -> str | None:
    return next((pattern for pattern in patterns if matches(pattern, target)), None)


def may_call(principal: Principal, target: str, *, confirm_required: bool = False) -> Decision:
    """The decision by name alone (arguments not yet known): for listing tools. DENY, ALLOW or CONFIRM."""
    if not is_canonical(target):
        return Decision.DENY
    granted = [g for g in principal.grants if _first_match(g.allow + g.confirm, target)]
    if not granted:
        return Decision.DENY
    if confirm_required or any(_first_match(g.confirm, target) for g in granted):
        return Decision.CONFIRM
    return Decision.ALLOW


def may_see_server(principal: Principal, server: str) -> bool:
    """Whether any pattern of the principal could match a method of `server` (cheap; no server is started)."""
    prefix = f"{server}."
    # A name can match a pattern only if it starts with the pattern's text before its first `*`.
    literals = (pattern.split("*", 1)[0] for pattern in principal.patterns)
    return any(prefix.startswith(lit) or lit.startswith(prefix) for lit in literals)


def decide(principal: Principal, target: str, params: Any = None, *, confirm_required: bool = False) -> Verdict:
    """The decision for `principal` calling canonical `target` with `params`. Deny unless a role grants it."""
    key = (target, confirm_required)
    verdict = principal._decisions.get(key)
    if verdict is None:
        verdict = _decide(principal, target, params, confirm_required)
        if len(target) <= MEMO_NAME_CHARS and not any(
                matches(pattern, target) for grant in principal.grants for pattern, _ in grant.args):
            if len(principal._decisions) >= DECISION_MEMO:
                principal._decisions.clear()
            principal._decisions[key] = verdict
    return verdict


def _decide(principal: Principal, target: str, params: Any, confirm_required: bool) -> Verdict:
    if not is_canonical(target):
        return Verdict(Decision.DENY, reason="not a canonical method name")
    allowed: Rule | None = None
    confirmed: Rule | None = None
    refusal: Verdict | None = None
    for grant in principal.grants:
        confirm_pattern = _first_match(grant.confirm, target)
        pattern = confirm_pattern or _first_match(grant.allow, target)
        if pattern is None:
            continue
        broken = _broken_rule(grant, target, params)
        if broken is not None:
            refusal = refusal or Verdict(Decision.DENY, Rule(grant.role, grant.file, *broken), "arguments")
            continue
        rule = Rule(grant.role, grant.file, pattern)
        if confirm_pattern is not None:
            confirmed = confirmed or rule
        else:
            allowed = allowed or rule
    return _verdict(allowed, confirmed, refusal, confirm_required)


def _verdict(allowed: Rule | None, confirmed: Rule | None, refusal: Verdict | None, confirm_required: bool) -> Verdict:
    granted = confirmed or allowed
    if granted is None:
        return refusal or Verdict(Decision.DENY, reason="no role grants it")
    if confirmed is not None:
        return Verdict(Decision.CONFIRM, confirmed, "a role requires confirmation")
    if confirm_required:
        return Verdict(Decision.CONFIRM, granted, "its tools.d definition requires confirmation")
    return Verdict(Decision.ALLOW, granted)


def confirm_options(principal: Principal, verdict: Verdict, target: str) -> ConfirmOptions:
    """How to ask a person about a CONFIRM verdict: the granting role's first `confirmation` pattern that
    matches `target`, else the first such pattern of any role of the principal, else the defaults."""
    granting = [g for g in principal.grants if verdict.rule is not None and g.role == verdict.rule.role]
    for grant in (*granting, *principal.grants):
        for pattern, options in grant.confirmation:
            if matches(pattern, target):
                return options
    return DEFAULT_CONFIRM_OPTIONS


DEFAULT_CONFIRM_OPTIONS = ConfirmOptions()


def _broken_rule(grant: Grant, target: str, params: Any) -> tuple[str, str, str] | None:
    """(pattern, argument, what failed) for the first argument rule of `grant` the params break."""
    for pattern, rules in grant.args:
        if not matches(pattern, target):
            continue
        for argument, rule in rules:
            failure = check_argument(rule, params, argument)
            if failure is not None:
                return pattern, argument, failure
    return None


def check_argument(rule: ArgRule, params: Any, argument: str) -> str | None:
    """Why `params[argument]` breaks `rule`, or None when it passes."""
    if params is None:
        params = {}
    if not isinstance(params, dict):
        return "needs named arguments"
    if argument not in params:
        return None if rule.optional else "is required"
    value = params[argument]
    for check in (_check_equals, _check_one_of, _check_string_rules, _check_path):
        failure = check(rule, value)
        if failure is not None:
            return failure
    return None


def _same(a: Any, b: Any) -> bool:
    # `True == 1` in Python; a policy that says 1 must not accept true.
    return type(a) is type(b) and bool(a == b)


def _check_equals(rule: ArgRule, value: Any) -> str | None:
    if rule.equals is not None and not _same(value, rule.equals):
        return f"equals {rule.equals!r}"
    return None


def _check_one_of(rule: ArgRule, value: Any) -> str | None:
    if rule.one_of is not None and not any(_same(value, option) for option in rule.one_of):
        return f"one_of {rule.one_of!r}"
    return None


def _check_string_rules(rule: ArgRule, value: Any) -> str | None:
    if rule.prefix is None and rule.regex is None and rule.max_length is None:
        return None
    if not isinstance(value, str):
        return "must be a string"
    if rule.max_length is not None and len(value) > rule.max_length:
        return f"max_length {rule.max_length}"
    if rule.prefix is not None and not value.startswith(rule.prefix):
        return f"prefix {rule.prefix!r}"
    if rule.regex is not None and re.fullmatch(rule.regex, value) is None:
        return f"regex {rule.regex!r}"
    return None


def _check_path(rule: ArgRule, value: Any) -> str | None:
    if rule.path_under is None:
        return None
    if not isinstance(value, str) or not value.startswith("/") or "\x00" in value:
        return f"path_under {rule.path_under!r}: needs an absolute path"
    return None if path_is_under(value, rule.path_under) else f"path_under {rule.path_under!r}"


def path_is_under(path: str, root: str) -> bool:
    """Whether `path`, with `..`, doubled slashes and symlinks resolved, lies in or under `root` (also resolved).

    The check is as good as the file system at this moment: a symlink created after it is the tool's to refuse.
    """
    real_root = os.path.realpath(root)
    real = os.path.realpath(path)
    return real == real_root or real.startswith(real_root.rstrip("/") + "/")


def principal_for(snapshot: Snapshot, client_name: str) -> Principal:
    """The Principal of a configured client: one grant per role, in the client's order."""
    client = snapshot.clients[client_name]
    grants = tuple(
        Grant.from_role(role, snapshot.sources.get(f"roles.{role}", UNKNOWN_FILE), snapshot.roles[role])
        for role in client.roles
    )
    return Principal(client_name, grants, client.limits)


def confirm_required(snapshot: Snapshot, server: str, method: str) -> bool:
    """Whether the tools.d definition of `server.method` demands a person's confirmation."""
    config = snapshot.servers.get(server)
    return config is not None and config.needs_confirmation(method)
