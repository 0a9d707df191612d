"""The `public_url` setting (urls.py, settings.py): what it accepts, what it refuses and why, the links built from it,
and the Host and Origin values the daemon then serves (the loopback names always among them)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from gatewayd.settings import Settings
from gatewayd.urls import Links, PublicUrl, listen_base, parse_public_url

PORT = 8765


@pytest.mark.parametrize(("text", "origin", "hosts"), [
    ("https://gw.example.org", "https://gw.example.org", ["gw.example.org", "gw.example.org:443"]),
    ("https://gw.example.org/", "https://gw.example.org", ["gw.example.org", "gw.example.org:443"]),
    ("https://gw.example.org/mcp", "https://gw.example.org", ["gw.example.org", "gw.example.org:443"]),
    (" HTTPS://GW.Example.ORG:443/mcp ", "https://gw.example.org", ["gw.example.org", "gw.example.org:443"]),
    ("https://gw.example.org:8443", "https://gw.example.org:8443", ["gw.example.org", "gw.example.org:8443"]),
    ("http://gw.internal:80", "http://gw.internal", ["gw.internal", "gw.internal:80"]),
    ("https://[2001:DB8:0::1]:9443/", "https://[2001:db8::1]:9443", ["[2001:db8::1]", "[2001:db8::1]:9443"]),
    ("https://192.0.2.7", "https://192.0.2.7", ["192.0.2.7", "192.0.2.7:443"]),
])
def test_a_public_url_names_an_origin_and_the_host_values_that_reach_it(
    text: str, origin: str, hosts: list[str]
) -> None:
    public = parse_public_url(text)
    assert public.origin == origin
    assert public.host_values() == hosts


@pytest.mark.parametrize(("text", "prefix"), [
    ("https://gw.example.org", ""),
    ("https://gw.example.org/mcp/", ""),
    ("https://gw.example.org/gw", "/gw"),
    ("https://gw.example.org/gw/", "/gw"),
    ("https://gw.example.org/gw/mcp", "/gw"),
    ("https://gw.example.org/tools/Gate_way-2.v~1/mcp/", "/tools/Gate_way-2.v~1"),
])
def test_a_public_url_may_name_the_path_prefix_a_proxy_publishes_the_daemon_under(text: str, prefix: str) -> None:
    public = parse_public_url(text)
    assert (public.prefix, public.base) == (prefix, "https://gw.example.org" + prefix)
    # The prefix is in the links, never in the origin or the Host values a browser and a proxy send.
    assert public.origin == "https://gw.example.org"
    assert public.host_values() == ["gw.example.org", "gw.example.org:443"]


@pytest.mark.parametrize(("text", "says"), [
    ("gw.example.org", "must start with https://"),
    ("ftp://gw.example.org", "must start with https://"),
    ("ws://gw.example.org", "must start with https://"),
    ("https://", "names no host"),
    ("https://:443/mcp", "names no host"),
    ("https://gw.example.org/approvals", "not the approval page"),
    ("https://gw.example.org/gw/approvals/", "not the approval page"),
    ("https://gw.example.org/gw/approvals/api", "not the approval page"),
    ("https://gw.example.org/g%20w", "each segment letters, digits"),
    ("https://gw.example.org/g w/mcp", "each segment letters, digits"),
    ("https://gw.example.org/gw/../mcp", "each segment letters, digits"),
    ("https://gw.example.org/./mcp", "each segment letters, digits"),
    ("https://gw.example.org//mcp", "each segment letters, digits"),
    ("https://gw.example.org/a//b", "each segment letters, digits"),
    ("https://gw.example.org/mcp?x=1", "query or fragment"),
    ("https://gw.example.org/#top", "query or fragment"),
    ("https://gw.example.org?", "query or fragment"),
    ("https://admin:secret@gw.example.org", "user name or password"),
    ("https://gw.example.org:99999", "is not a URL"),
    ("https://gw.example.org:http", "is not a URL"),
    ("https://[::1", "is not a URL"),
])
def test_a_bad_public_url_is_refused_saying_why(text: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        parse_public_url(text)


def test_a_bad_public_url_is_a_settings_error_from_flags_environment_and_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ValidationError, match="public_url"):
        Settings(public_url="ftp://gw.example.org")
    monkeypatch.setenv("GATEWAYD_PUBLIC_URL", "https://gw.example.org/pre fix")
    with pytest.raises(ValidationError, match="its path must be empty, /mcp, or the prefix"):
        Settings()
    monkeypatch.delenv("GATEWAYD_PUBLIC_URL")
    (tmp_path / "gatewayd.toml").write_text('public_url = "gw.example.org"\n')
    monkeypatch.setenv("GATEWAYD_SETTINGS_FILE", str(tmp_path / "gatewayd.toml"))
    with pytest.raises(ValidationError, match="must start with https://"):
        Settings()


def test_the_setting_comes_from_the_environment_or_the_file_and_is_kept_as_its_origin_and_prefix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "gatewayd.toml").write_text('public_url = "https://gw.example.org/mcp"\n')
    monkeypatch.setenv("GATEWAYD_SETTINGS_FILE", str(tmp_path / "gatewayd.toml"))
    assert Settings().public_url == "https://gw.example.org"
    monkeypatch.setenv("GATEWAYD_PUBLIC_URL", "https://other.example.org:8443")
    assert Settings().public_url == "https://other.example.org:8443"
    monkeypatch.setenv("GATEWAYD_PUBLIC_URL", "https://other.example.org:8443/gw/mcp")
    assert Settings().public_url == "https://other.example.org:8443/gw"
    assert Settings(public_url="").public() is None


def test_links_point_through_the_public_url_when_there_is_one() -> None:
    local = Links(listen_base("127.0.0.1", PORT))
    assert (local.endpoint, local.approval_page) == (f"http://127.0.0.1:{PORT}/mcp", f"http://127.0.0.1:{PORT}/approvals")
    assert local.describe() == f"http://127.0.0.1:{PORT}/mcp"
    public = Settings(public_url="https://gw.example.org").links(PORT)
    assert (public.endpoint, public.approval_page) == ("https://gw.example.org/mcp", "https://gw.example.org/approvals")
    assert public.describe() == f"http://127.0.0.1:{PORT}/mcp (public https://gw.example.org/mcp)"
    assert listen_base("0.0.0.0", PORT) == f"http://127.0.0.1:{PORT}"
    assert listen_base("::1", PORT) == f"http://[::1]:{PORT}"
    assert Links("http://x", PublicUrl("https", "gw.example.org", 8443)).endpoint == "https://gw.example.org:8443/mcp"
    prefixed = Settings(public_url="https://gw.example.org/gw/mcp").links(PORT)
    assert (prefixed.endpoint, prefixed.approval_page) == ("https://gw.example.org/gw/mcp",
                                                           "https://gw.example.org/gw/approvals")
    assert prefixed.describe() == f"http://127.0.0.1:{PORT}/mcp (public https://gw.example.org/gw/mcp)"


LOCAL_HOSTS = [f"127.0.0.1:{PORT}", f"localhost:{PORT}", f"[::1]:{PORT}", "127.0.0.1", "localhost", "[::1]"]


def test_without_a_public_url_only_loopback_names_are_served() -> None:
    settings = Settings()
    assert settings.hosts(PORT) == LOCAL_HOSTS
    assert settings.origins(PORT) == [f"http://{host}" for host in LOCAL_HOSTS]


def test_the_public_host_and_origin_are_served_besides_the_loopback_names() -> None:
    settings = Settings(public_url="https://gw.example.org")
    assert settings.hosts(PORT) == [*LOCAL_HOSTS, "gw.example.org", "gw.example.org:443"]
    origins = settings.origins(PORT)
    assert "https://gw.example.org" in origins and f"http://127.0.0.1:{PORT}" in origins
    # Only the origin the proxy serves: not its plain-HTTP twin, not another port.
    assert "http://gw.example.org" not in origins and "https://gw.example.org:8443" not in origins


def test_listed_hosts_keep_the_loopback_names_and_their_https_origins_are_accepted() -> None:
    """Issue 17 item 6: `--allowed-hosts gw.example.org` refused `Origin: https://gw.example.org` (403) and every
    local client (421)."""
    settings = Settings(allowed_hosts=["gw.example.org"])
    assert settings.hosts(PORT) == [*LOCAL_HOSTS, "gw.example.org"]
    assert {"https://gw.example.org", "http://gw.example.org", f"http://127.0.0.1:{PORT}"} <= set(
        settings.origins(PORT))


def test_listed_origins_replace_the_defaults_but_not_the_public_origin() -> None:
    settings = Settings(allowed_origins=["https://console.example.org"], public_url="https://gw.example.org")
    assert settings.origins(PORT) == ["https://console.example.org", "https://gw.example.org"]
