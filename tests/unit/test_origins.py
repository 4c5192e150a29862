"""app.api.ws.origins.origin_allowed: the WebSocket Origin rule (contract §8, §12)."""

from __future__ import annotations

import pytest

from app.api.ws.origins import origin_allowed


def test_no_origin_is_always_allowed() -> None:
    assert origin_allowed(None, "127.0.0.1:8000", "")
    assert origin_allowed(None, "127.0.0.1:8000", "https://app.example.com")
    assert origin_allowed(None, None, "")


@pytest.mark.parametrize(
    ("origin", "host", "allowed"),
    [
        ("http://127.0.0.1:8000", "127.0.0.1:8000", True),
        ("http://localhost:8000", "localhost:8000", True),
        ("http://LOCALHOST:8000", "localhost:8000", True),
        ("http://localhost:8000", "LocalHost:8000", True),
        ("http://localhost:8000/", "localhost:8000", True),
        (" http://localhost:8000 ", "localhost:8000", True),
        # default ports: an Origin without a port means the scheme's default
        ("http://example.com", "example.com:80", True),
        ("https://example.com", "example.com:443", True),
        ("http://example.com:80", "example.com", True),
        ("https://example.com", "example.com", True),
        ("http://example.com", "example.com", True),
        ("https://example.com:443/", "example.com", True),
        # different host or port
        ("http://evil.example", "127.0.0.1:8000", False),
        ("http://127.0.0.1:8001", "127.0.0.1:8000", False),
        ("http://127.0.0.1", "127.0.0.1:8000", False),
        ("https://example.com", "example.com:80", False),
        ("http://example.com:8080", "example.com", False),
        ("http://sub.example.com", "example.com", False),
        # not an origin at all
        ("null", "127.0.0.1:8000", False),
        ("", "127.0.0.1:8000", False),
        ("http://", "127.0.0.1:8000", False),
        ("http://127.0.0.1:notaport", "127.0.0.1:8000", False),
        ("http://127.0.0.1:8000", None, False),
        ("http://127.0.0.1:8000", "", False),
    ],
)
def test_same_origin_by_host(origin: str, host: str | None, allowed: bool) -> None:
    assert origin_allowed(origin, host, "") is allowed


def test_ipv6_same_origin() -> None:
    assert origin_allowed("http://[::1]:8000", "[::1]:8000", "")
    assert not origin_allowed("http://[::1]:8001", "[::1]:8000", "")


LIST = "https://app.example.com, http://localhost:3000/ ,HTTPS://Admin.Example.COM:8443"


@pytest.mark.parametrize(
    ("origin", "allowed"),
    [
        ("https://app.example.com", True),
        ("https://app.example.com:443", True),
        ("https://APP.example.com/", True),
        ("http://localhost:3000", True),
        ("https://admin.example.com:8443", True),
        ("http://app.example.com", False),  # scheme differs
        ("https://app.example.com:8443", False),  # port differs
        ("http://localhost:3001", False),
        ("https://evil.example.com", False),
        ("null", False),
    ],
)
def test_allow_list(origin: str, allowed: bool) -> None:
    assert origin_allowed(origin, "broker.internal:8000", LIST) is allowed


def test_allow_list_replaces_same_origin() -> None:
    # When MESSAGEX_ALLOWED_ORIGINS is set, only its entries are allowed (contract §12).
    assert not origin_allowed("http://broker:8000", "broker:8000", "https://app.example.com")


def test_empty_entries_in_the_list_are_ignored() -> None:
    assert origin_allowed("https://a.example", "h:1", ",https://a.example,,")
    assert not origin_allowed("https://b.example", "h:1", ",https://a.example,,")


@pytest.mark.parametrize("star", ["*", " * "])
def test_star_allows_any_origin(star: str) -> None:
    assert origin_allowed("https://anything.example", "127.0.0.1:8000", star)
    assert origin_allowed("null", "127.0.0.1:8000", star)
