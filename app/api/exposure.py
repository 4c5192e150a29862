"""What a request must be to reach the broker at all (contract §3), in one pure ASGI middleware
in front of everything else:

1. **Client address.** ``X-Forwarded-For`` / ``Forwarded`` are believed only from a peer in
   ``MESSAGEX_TRUSTED_PROXIES`` (default: none, and uvicorn's own proxy headers are off): the
   client is then the right-most address in the chain that is not itself a trusted proxy.
   Otherwise the client is the socket's peer, whatever the headers say. Everything after this
   (the guest loopback rule, the failed-login counts) reads ``scope["client"]``.
2. **Host.** A request whose ``Host`` is not allowed is 400 ``bad_request``, a WebSocket
   upgrade too: a DNS-rebinding page (``attacker.example`` resolving to 127.0.0.1) reaches a
   loopback broker with its own name in ``Host``. ``MESSAGEX_ALLOWED_HOSTS``: names (any port)
   or ``*``; by default, on a loopback listen address only ``localhost``, ``127.0.0.1`` and
   ``[::1]``, elsewhere any. Once the ``Host`` is one of ours, the WebSocket same-origin rule
   (``Origin`` against ``Host``) cannot be beaten by a rebinding name.
3. **Cross-site writes.** A state-changing request (POST, PUT, PATCH, DELETE) under ``/api/``
   is refused when a cross-site page could have made the browser send it with its cached
   credentials: 403 ``forbidden`` when it carries an ``Origin`` the origin rule does not allow
   (same origin, or ``MESSAGEX_ALLOWED_ORIGINS``), or no ``Origin`` and ``Sec-Fetch-Site:
   cross-site`` / ``same-site``; 400 ``bad_request`` when its ``Content-Type`` is one an HTML
   form can send (``application/x-www-form-urlencoded``, ``multipart/form-data``,
   ``text/plain``). Requests without those headers (curl, services) are not affected.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

from starlette.types import ASGIApp, Receive, Scope, Send

from app.api.problems import broker_error_response
from app.api.ws.origins import origin_allowed
from app.config import Settings, split_list
from app.errors import BadRequest, BrokerError, Forbidden

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

LOOPBACK_HOSTS = frozenset({"localhost", "127.0.0.1", "::1"})
STATE_CHANGING = frozenset({"POST", "PUT", "PATCH", "DELETE"})
FORM_TYPES = frozenset(
    {b"application/x-www-form-urlencoded", b"multipart/form-data", b"text/plain"}
)
CROSS_SITE = frozenset({b"cross-site", b"same-site"})


# --- addresses -------------------------------------------------------------------------------


def parse_address(value: str) -> IPAddress | None:
    """An address as a proxy header writes it: ``1.2.3.4``, ``1.2.3.4:80``, ``"[::1]:80"``,
    ``::1``; an IPv4-mapped IPv6 address as its IPv4 one. None for ``unknown``, obfuscated
    identifiers (``_hidden``) and anything else."""
    text = value.strip().strip('"').strip()
    if text.startswith("["):
        text = text[1:].partition("]")[0]
    elif text.count(":") == 1:
        text = text.partition(":")[0]
    try:
        address = ipaddress.ip_address(text.split("%", 1)[0])
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def parse_networks(value: str) -> tuple[IPNetwork, ...]:
    return tuple(ipaddress.ip_network(entry, strict=False) for entry in split_list(value))


def _forwarded(headers: Iterable[tuple[bytes, bytes]], parameter: str) -> list[str]:
    """The values of one parameter (``for``, ``proto``) in ``Forwarded`` headers (RFC 7239),
    in order, the nearest proxy's last."""
    values: list[str] = []
    for name, raw in headers:
        if name == b"forwarded":
            for element in raw.decode("latin-1").split(","):
                for pair in element.split(";"):
                    key, _, value = pair.partition("=")
                    if key.strip().lower() == parameter:
                        values.append(value.strip().strip('"'))
    return values


def _x_forwarded(headers: Iterable[tuple[bytes, bytes]], name: bytes) -> list[str]:
    return [v for k, raw in headers if k == name for v in raw.decode("latin-1").split(",")]


def _forwarded_for(headers: Iterable[tuple[bytes, bytes]]) -> list[str]:
    """The chain of client addresses the proxy headers name, nearest last: ``Forwarded``'s
    ``for=`` when present, else ``X-Forwarded-For``."""
    headers = list(headers)
    return _forwarded(headers, "for") or _x_forwarded(headers, b"x-forwarded-for")


def _forwarded_proto(headers: Iterable[tuple[bytes, bytes]]) -> str | None:
    headers = list(headers)
    protos = _forwarded(headers, "proto") or _x_forwarded(headers, b"x-forwarded-proto")
    proto = protos[-1].strip().lower() if protos else None
    return proto if proto in ("http", "https") else None


def _trusted(address: IPAddress | None, networks: tuple[IPNetwork, ...]) -> bool:
    return address is not None and any(address in network for network in networks)


def client_behind_proxies(
    peer: str, headers: Iterable[tuple[bytes, bytes]], networks: tuple[IPNetwork, ...]
) -> str:
    """The client's address: the socket's ``peer``, or — when the peer is a trusted proxy —
    the right-most address of the forwarded chain that is not a trusted proxy itself. An entry
    that is not an address ends the walk at the last proxy that wrote one."""
    if not _trusted(parse_address(peer), networks):
        return peer
    client = peer
    for entry in reversed(_forwarded_for(headers)):
        address = parse_address(entry)
        if address is None:
            break
        client = address.compressed
        if not _trusted(address, networks):
            break
    return client


# --- hosts -----------------------------------------------------------------------------------


def host_name(host_header: str) -> str:
    """The name part of a ``Host`` header, lower case, without the port or IPv6 brackets."""
    host = host_header.strip().lower()
    if host.startswith("["):
        return host[1:].partition("]")[0]
    return host.rpartition(":")[0] if host.count(":") == 1 else host


def is_loopback_listen(listen_host: str) -> bool:
    if listen_host.strip().lower() == "localhost":
        return True
    address = parse_address(listen_host)
    return address is not None and address.is_loopback


def allowed_hosts(setting: str, listen_host: str) -> frozenset[str] | None:
    """The host names ``Host`` may carry; None: any."""
    entries = split_list(setting)
    if "*" in entries:
        return None
    if entries:
        return frozenset(host_name(entry) for entry in entries)
    return LOOPBACK_HOSTS if is_loopback_listen(listen_host) else None


# --- the middleware --------------------------------------------------------------------------


def _header(scope: Scope, wanted: bytes) -> bytes | None:
    for name, value in scope["headers"]:
        if name == wanted:
            return bytes(value)
    return None


class ExposureGuard:
    def __init__(self, app: ASGIApp, settings: Settings) -> None:
        self.app = app
        self.settings = settings
        self.proxies = parse_networks(settings.trusted_proxies)
        self._hosts: frozenset[str] | None = None
        self._hosts_known = False

    def _allowed_hosts(self, scope: Scope) -> frozenset[str] | None:
        """Worked out at the first request: the server records its listen address in the app's
        state (``app.server.BrokerServer``), falling back to ``MESSAGEX_HOST``."""
        if not self._hosts_known:
            state = getattr(scope.get("app"), "state", None)
            listen = getattr(state, "listen_host", None) or self.settings.host
            self._hosts = allowed_hosts(self.settings.allowed_hosts, listen)
            self._hosts_known = True
        return self._hosts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        if self.proxies:
            self._apply_proxy_headers(scope)
        try:
            self._check_host(scope)
            if scope["type"] == "http" and scope["method"] in STATE_CHANGING:
                self._check_cross_site(scope)
        except BrokerError as exc:
            await broker_error_response(exc)(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _apply_proxy_headers(self, scope: Scope) -> None:
        client = scope.get("client")
        if not client:
            return
        address = client_behind_proxies(client[0], scope["headers"], self.proxies)
        if address != client[0]:
            scope["client"] = (address, 0)
            proto = _forwarded_proto(scope["headers"])
            if proto is not None:
                secure = proto == "https"
                if scope["type"] == "websocket":
                    scope["scheme"] = "wss" if secure else "ws"
                else:
                    scope["scheme"] = proto

    def _check_host(self, scope: Scope) -> None:
        hosts = self._allowed_hosts(scope)
        if hosts is None:
            return
        raw = _header(scope, b"host")
        if raw is None:
            return  # HTTP/1.0 without Host: no browser sends that
        if host_name(raw.decode("latin-1")) not in hosts:
            raise BadRequest(
                "this Host is not allowed (set MESSAGEX_ALLOWED_HOSTS to the names clients use)"
            )

    def _check_cross_site(self, scope: Scope) -> None:
        if not scope["path"].startswith("/api/"):
            return
        origin = _header(scope, b"origin")
        if origin is not None:
            host = _header(scope, b"host")
            if not origin_allowed(
                origin.decode("latin-1"),
                host.decode("latin-1") if host is not None else None,
                self.settings.allowed_origins,
            ):
                raise Forbidden("a request from this Origin may not change anything")
        elif (_header(scope, b"sec-fetch-site") or b"").strip().lower() in CROSS_SITE:
            raise Forbidden("a cross-site request may not change anything")
        content_type = _header(scope, b"content-type")
        if content_type is not None:
            media = content_type.split(b";", 1)[0].strip().lower()
            if media in FORM_TYPES:
                raise BadRequest("a request body must be JSON: send Content-Type: application/json")
