"""The one decision: patterns, deny by default, argument rules, and name tricks that must never match."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from gatewayd.config.models import ArgRule, Role
from gatewayd.policy import DECISION_MEMO, Decision, Grant, Principal, decide, matches, may_call, path_is_under


def principal(*roles: tuple[str, Role]) -> Principal:
    return Principal("dev", tuple(Grant.from_role(name, "policies/test.toml", role) for name, role in roles))


DEV = principal(("developer", Role(allow=["calc.*", "fs.read_*", "clock.now"], confirm=["shell.run"])))


@pytest.mark.parametrize(
    ("target", "decision"),
    [
        ("calc.add", Decision.ALLOW),
        ("calc.divide", Decision.ALLOW),
        ("fs.read_file", Decision.ALLOW),
        ("fs.write_file", Decision.DENY),
        ("clock.now", Decision.ALLOW),
        ("clock.countdown", Decision.DENY),
        ("shell.run", Decision.CONFIRM),
        ("shell.kill", Decision.DENY),
        ("unknown.method", Decision.DENY),
    ],
)
def test_decisions(target: str, decision: Decision) -> None:
    assert decide(DEV, target).decision is decision
    assert may_call(DEV, target) is decision


def test_the_verdict_names_the_rule() -> None:
    verdict = decide(DEV, "calc.add")
    assert verdict.rule is not None
    assert verdict.rule.describe() == "role 'developer' (policies/test.toml) pattern 'calc.*'"


@pytest.mark.parametrize(
    "trick",
    [
        "Shell.run", "SHELL.RUN", "shell.run ", " shell.run", "shell..run", "shell.run\n", "shell.run\x00",
        "ѕhell.run",  # Cyrillic s
        "shell.rսn",  # Armenian u
        "shell．run",  # fullwidth full stop
        "shell\u2024run", "shell\u200b.run", "shell/run", "./shell.run", "shell%2Erun",
        "calc", "calc.", ".add", "calc add", "calc.add;rm", "calc.a*d", "",
    ],
)
def test_name_tricks_are_denied(trick: str) -> None:
    broad = principal(("all", Role(allow=["calc.*", "shell.*"])))
    assert decide(broad, trick).decision is Decision.DENY


def test_nothing_is_allowed_without_a_role() -> None:
    assert decide(Principal("nobody"), "calc.add").decision is Decision.DENY


def test_star_matches_name_characters_only() -> None:
    assert matches("calc.*", "calc.add")
    assert matches("calc.*", "calc.sub/dir")
    assert not matches("calc.*", "calcx.add")
    assert matches("*.now", "clock.now")
    assert not matches("calc.add", "calc.add2")


def test_patterns_with_other_characters_never_match() -> None:
    assert not matches("calc.[a-z]dd", "calc.add")
    assert not matches("calc.?dd", "calc.add")
    assert not matches("calc.add ", "calc.add")


def test_tools_d_confirmation_cannot_be_waived_by_a_policy() -> None:
    everything = principal(("admin", Role(allow=["shell.*"])))
    assert decide(everything, "shell.run").decision is Decision.ALLOW
    assert decide(everything, "shell.run", confirm_required=True).decision is Decision.CONFIRM
    assert may_call(everything, "shell.run", confirm_required=True) is Decision.CONFIRM


def test_confirm_in_any_granting_role_wins() -> None:
    both = principal(("a", Role(allow=["shell.run"])), ("b", Role(confirm=["shell.*"])))
    assert decide(both, "shell.run").decision is Decision.CONFIRM


def test_a_decision_by_name_alone_is_remembered_and_the_memo_stays_bounded() -> None:
    dev = principal(("developer", Role(allow=["calc.*"], confirm=["shell.run"])))
    first = decide(dev, "calc.add")
    assert decide(dev, "calc.add", {"a": 1}) is first
    assert decide(dev, "shell.run").decision is Decision.CONFIRM
    assert decide(dev, "calc.add", confirm_required=True).decision is Decision.CONFIRM
    assert decide(dev, "calc.add").decision is Decision.ALLOW
    for n in range(DECISION_MEMO + 10):
        assert decide(dev, f"calc.unknown{n}").decision is Decision.ALLOW
        assert decide(dev, f"nope.m{n}").decision is Decision.DENY
    assert len(dev._decisions) <= DECISION_MEMO


def test_decisions_that_depend_on_arguments_are_never_remembered() -> None:
    bounded = principal(("files", Role(allow=["fs.*", "calc.*"], args={"fs.*": {"path": ArgRule(prefix="/srv/")}})))
    for _ in range(3):
        assert decide(bounded, "fs.read", {"path": "/srv/a"}).decision is Decision.ALLOW
        assert decide(bounded, "fs.read", {"path": "/etc/passwd"}).refused_arguments
    assert decide(bounded, "calc.add") is decide(bounded, "calc.add")


# -- argument rules ----------------------------------------------------------------------------


def rules(**by_argument: dict[str, Any]) -> Principal:
    args = {"fs.*": {name: ArgRule.model_validate(rule) for name, rule in by_argument.items()}}
    return principal(("files", Role(allow=["fs.*"], args=args)))


@pytest.mark.parametrize(
    ("rule", "good", "bad"),
    [
        ({"equals": "utf-8"}, "utf-8", "latin-1"),
        ({"equals": 1}, 1, True),
        ({"one_of": ["json", "text"]}, "text", "xml"),
        ({"one_of": [1, 2]}, 2, 2.0),
        ({"prefix": "report-"}, "report-2026", "xreport-2026"),
        ({"regex": "[a-z]{1,8}"}, "abc", "abc\n"),
        ({"regex": "[a-z]{1,8}"}, "abcdefgh", "abcdefghi"),
        ({"max_length": 3}, "abc", "abcd"),
        ({"max_length": 3}, "abc", 12),
    ],
)
def test_each_rule_passes_and_refuses(rule: dict[str, Any], good: Any, bad: Any) -> None:
    policy = rules(x=rule)
    assert decide(policy, "fs.read", {"x": good}).decision is Decision.ALLOW
    refused = decide(policy, "fs.read", {"x": bad})
    assert refused.decision is Decision.DENY and refused.refused_arguments
    assert refused.rule is not None and refused.rule.argument == "x" and refused.rule.pattern == "fs.*"


def test_an_argument_with_rules_must_be_present_unless_optional() -> None:
    assert decide(rules(x={"prefix": "a"}), "fs.read", {}).refused_arguments
    assert decide(rules(x={"prefix": "a"}), "fs.read", None).refused_arguments
    assert decide(rules(x={"prefix": "a", "optional": True}), "fs.read", {}).decision is Decision.ALLOW
    assert decide(rules(x={"prefix": "a"}), "fs.read", ["a"]).refused_arguments


def test_another_role_may_still_grant_what_one_role_bounds() -> None:
    bounded = Role(allow=["fs.*"], args={"fs.*": {"path": ArgRule(prefix="/srv/")}})
    both = principal(("bounded", bounded), ("free", Role(allow=["fs.read"])))
    assert decide(both, "fs.read", {"path": "/etc/passwd"}).decision is Decision.ALLOW
    assert decide(both, "fs.write", {"path": "/etc/passwd"}).refused_arguments


def test_path_under_resolves_dots_slashes_and_symlinks(tmp_path: Path) -> None:
    root = tmp_path / "data"
    (root / "sub").mkdir(parents=True)
    (root / "escape").symlink_to("/etc")
    policy = rules(path={"path_under": str(root)})
    for inside in (f"{root}/a.txt", f"{root}//sub///b", f"{root}/sub/../c", str(root)):
        assert decide(policy, "fs.read", {"path": inside}).decision is Decision.ALLOW, inside
    for outside in (f"{root}/../x", f"{root}/escape/passwd", f"{root}x/a", "/etc/passwd", "data/a.txt",
                    f"{root}/a\x00b", f"{root}/sub/../../x"):
        assert decide(policy, "fs.read", {"path": outside}).refused_arguments, outside


def test_path_is_under_with_a_symlinked_root(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    os.symlink(tmp_path / "real", tmp_path / "link")
    assert path_is_under(str(tmp_path / "real" / "f"), str(tmp_path / "link"))
    assert not path_is_under(str(tmp_path / "other"), str(tmp_path / "link"))
