"""What a starting daemon does not load: modules its first call does not need stay out of its memory and its start
(issue 20's idle RSS and launch goals). Each check runs a fresh interpreter, as the daemon starts."""

from __future__ import annotations

import os
import subprocess
import sys

# A fresh interpreter importing the daemon's entry point and app is quick; generous for a loaded machine.
IMPORT_DEADLINE = 60.0


def loaded_after(code: str, whole: bool = False) -> set[str]:
    """The top-level modules (`whole`: every module, by its dotted name) a fresh interpreter holds after running
    `code`."""
    names = "sys.modules" if whole else "{name.split('.')[0] for name in sys.modules}"
    probe = code + f"\nimport sys\nprint(' '.join(sorted({names})))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=IMPORT_DEADLINE,
                          check=True)
    return set(done.stdout.split())


DAEMON = "import gatewayd.cli, gatewayd.app, gatewayd.reloader"
# Loaded when first used: by gatewayctl alone (explain, writing config with tomli_w), by the first ACP agent.
LATER = {"gatewayd.explain", "gatewayd.config.edit", "tomli_w", "gatewayd.agents", "gatewayd.terminals",
         "gatewayd.upstream.acp"}


def test_the_daemon_imports_neither_watchfiles_nor_pydantic_settings_nor_ssl_nor_openssl_hashes() -> None:
    loaded = loaded_after(DAEMON)
    # watchfiles (and anyio under it) only once watching starts; settings are merged without pydantic-settings;
    # hashlib and hmac use Python's own hashes, not libcrypto's (`_hashlib`).
    assert not loaded & {"watchfiles", "anyio", "pydantic_settings", "dotenv", "ssl", "_hashlib"}, loaded


def test_python_own_hashes_give_the_same_digests_and_macs() -> None:
    # SHA-256 of "abc" (FIPS 180-2) and HMAC-SHA-256 of RFC 4231's test case 2.
    probe = ("import gatewayd.cli, hashlib, hmac, sys\n"
             "from gatewayd.tokens import hash_token\n"
             "assert '_hashlib' not in sys.modules\n"
             "print(hashlib.sha256(b'abc').hexdigest(), hash_token('abc'),"
             " hmac.new(b'Jefe', b'what do ya want for nothing?', hashlib.sha256).hexdigest())")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=IMPORT_DEADLINE,
                          check=True)
    sha = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    assert done.stdout.split() == [sha, sha, "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"]
    assert not done.stderr  # hashlib logs an error for each hash it cannot find


def test_the_daemon_imports_what_only_gatewayctl_or_an_agent_uses_when_it_is_first_used() -> None:
    # tests/e2e/test_acp.py and the gatewayctl tests use each of them through a real daemon and command line.
    loaded = loaded_after(DAEMON, whole=True)
    assert not loaded & LATER
    # frozenlist in its pure Python form: its compiled one loads libstdc++.
    assert "frozenlist" in loaded and "frozenlist._frozenlist" not in loaded


def test_the_approval_page_is_made_when_first_asked_for() -> None:
    probe = f"{DAEMON}\nfrom gatewayd.web import console\nprint(console.page.cache_info().currsize)"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=IMPORT_DEADLINE,
                          check=True)
    assert done.stdout.split() == ["0"]


def test_pydantic_plugins_are_not_looked_for_unless_the_environment_says_otherwise() -> None:
    probe = ("import os\nimport gatewayd.cli, gatewayd.app\nfrom pydantic.plugin import _loader\n"
             "print(repr(os.environ['PYDANTIC_DISABLE_PLUGINS']), _loader._plugins is None)")
    env = {key: value for key, value in os.environ.items() if key != "PYDANTIC_DISABLE_PLUGINS"}
    for given, seen in ((None, "'__all__' True"), ("", "'' False")):
        done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=IMPORT_DEADLINE,
                              check=True, env=env if given is None else {**env, "PYDANTIC_DISABLE_PLUGINS": given})
        # None: the installed distributions were never searched for plugins; "": an operator let them load.
        assert done.stdout.strip() == seen
