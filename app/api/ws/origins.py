"""The WebSocket Origin rule (contract §8, §12): same origin by default, or an allowlist."""

from __future__ import annotations

from urllib.parse import urlsplit

_DEFAULT_PORTS = {"http": 80, "https": 443, "ws": 80, "wss": 443}


def _normalise(origin: str) -> tuple[str, str, int] | None:
    origin = origin.strip().rstrip("/")
    try:
        parts = urlsplit(origin)
        port = parts.port
    except ValueError:
        return None
    scheme = parts.scheme.lower()
    host = (parts.hostname or "").lower()
    if not scheme or not host:
        return None
    return scheme, host, port if port is not None else _DEFAULT_PORTS.get(scheme, 0)


def _host_port(host_header: str) -> tuple[str, int | None] | None:
    try:
        parts = urlsplit(f"//{host_header.strip()}")
        return (parts.hostname or "").lower(), parts.port
    except ValueError:
        return None


def origin_allowed(origin: str | None, host_header: str | None, allowed: str) -> bool:
    """``allowed`` is MESSAGEX_ALLOWED_ORIGINS: "" (same origin only), "*", or a list.

    Same origin: the Origin's host and port equal the request's Host. A Host without a port
    (as behind a TLS-terminating proxy) matches an Origin on its scheme's default port.
    """
    if origin is None:
        return True  # services send no Origin
    if allowed.strip() == "*":
        return True
    parsed = _normalise(origin)
    if parsed is None:
        return False
    if allowed.strip():
        entries = {_normalise(e) for e in allowed.split(",") if e.strip()}
        return parsed in entries
    request = _host_port(host_header or "")
    if request is None or not request[0] or request[0] != parsed[1]:
        return False
    if request[1] is None:
        return parsed[2] == _DEFAULT_PORTS.get(parsed[0], 0)
    return request[1] == parsed[2]
