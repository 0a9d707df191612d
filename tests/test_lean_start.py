"""What a starting daemon does not load: modules its first call does not need stay out of its memory and its start
(issue 20's idle RSS and launch goals). Each check runs a fresh interpreter, as the daemon starts."""

from __future__ import annotations

import subprocess
import sys

# A fresh interpreter importing the daemon's entry point and app is quick; generous for a loaded machine.
IMPORT_DEADLINE = 60.0


def loaded_after(code: str) -> set[str]:
    """The top-level modules a fresh interpreter holds after running `code`."""
    probe = code + "\nimport sys\nprint(' '.join(sorted({name.split('.')[0] for name in sys.modules})))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=IMPORT_DEADLINE,
                          check=True)
    return set(done.stdout.split())


def test_the_daemon_imports_neither_watchfiles_nor_pydantic_settings_nor_ssl() -> None:
    loaded = loaded_after("import gatewayd.cli, gatewayd.app, gatewayd.reloader")
    # watchfiles (and anyio under it) only once watching starts; settings are merged without pydantic-settings.
    assert not loaded & {"watchfiles", "anyio", "pydantic_settings", "dotenv", "ssl"}, loaded
