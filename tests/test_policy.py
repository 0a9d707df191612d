"""The one decision: patterns, deny by default, and name tricks that must never match."""

from __future__ import annotations

import pytest

from gatewayd.policy import Decision, Principal, decide, matches

DEV = Principal("dev", allow=("calc.*", "fs.read_*", "clock.now"), confirm=("shell.run",))


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
    assert decide(DEV, target) is decision


@pytest.mark.parametrize(
    "trick",
    [
        "Shell.run", "SHELL.RUN", "shell.run ", " shell.run", "shell..run", "shell.run\n", "shell.run\x00",
        "ѕhell.run",  # Cyrillic s
        "shell.rսn",  # Armenian u
        "shell．run",  # fullwidth full stop
        "calc", "calc.", ".add", "calc add", "calc.add;rm", "calc.a*d", "",
    ],
)
def test_name_tricks_are_denied(trick: str) -> None:
    broad = Principal("all", allow=("calc.*", "shell.*"), confirm=())
    assert decide(broad, trick) is Decision.DENY


def test_nothing_is_allowed_without_a_pattern() -> None:
    assert decide(Principal("nobody", (), ()), "calc.add") is Decision.DENY


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
