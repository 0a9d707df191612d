"""Where settings come from, highest first: flags (the constructor's arguments), `GATEWAYD_*` environment variables
(any case; a list as JSON), the optional settings file, the defaults. Merged by gatewayd/settings.py itself."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from gatewayd.settings import DEFAULT_PORT, Settings


@pytest.fixture
def settings_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "gatewayd.toml"
    monkeypatch.setenv("GATEWAYD_SETTINGS_FILE", str(path))
    return path


def test_flags_then_environment_then_file_then_defaults(settings_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert Settings().port == DEFAULT_PORT
    settings_file.write_text('port = 1001\nlog_level = "DEBUG"\nmax_batch = 7\n')
    assert (Settings().port, Settings().log_level) == (1001, "DEBUG")
    monkeypatch.setenv("GATEWAYD_PORT", "1002")
    assert (Settings().port, Settings().log_level, Settings().max_batch) == (1002, "DEBUG", 7)
    assert Settings(port=1003).port == 1003


def test_environment_names_in_any_case_lists_as_json_and_durations_as_text(
    settings_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("gatewayd_watch_config", "false")
    monkeypatch.setenv("GATEWAYD_ALLOWED_HOSTS", '["a.example", "b.example"]')
    monkeypatch.setenv("GATEWAYD_SHUTDOWN_GRACE", "2s")
    settings = Settings()
    assert (settings.watch_config, settings.allowed_hosts, settings.shutdown_grace) == (
        False, ["a.example", "b.example"], 2.0)
    # An empty value is a value: an empty audit path turns auditing off.
    monkeypatch.setenv("GATEWAYD_AUDIT_PATH", "")
    assert Settings().audit_file() is None


def test_unknown_environment_variables_are_ignored_and_unknown_file_keys_refused(
    settings_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GATEWAYD_NO_SUCH_SETTING", "1")
    assert Settings().port == DEFAULT_PORT
    settings_file.write_text("no_such_setting = 1\n")
    with pytest.raises(ValidationError, match="no_such_setting"):
        Settings()


def test_bad_values_are_validation_errors_naming_the_setting(
    settings_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GATEWAYD_ALLOWED_HOSTS", "not json")
    with pytest.raises(ValidationError, match="allowed_hosts"):
        Settings()
    monkeypatch.delenv("GATEWAYD_ALLOWED_HOSTS")
    monkeypatch.setenv("GATEWAYD_PORT", "65536")
    with pytest.raises(ValidationError, match="port"):
        Settings()
