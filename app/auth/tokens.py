"""Session tokens and the ``Authorization`` header.

A token is 32 random bytes, URL-safe base64 (43 characters); only its SHA-256 digest is
stored, so a database leak does not leak usable tokens.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import ipaddress
import secrets
from dataclasses import dataclass

from app.errors import Unauthorized

TOKEN_BYTES = 32


def new_token() -> str:
    return secrets.token_urlsafe(TOKEN_BYTES)


def digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()


def same_digest(a: bytes, b: bytes) -> bool:
    return hmac.compare_digest(a, b)


@dataclass(frozen=True, slots=True)
class BearerCredentials:
    token: str


@dataclass(frozen=True, slots=True)
class BasicCredentials:
    username: str
    password: str


Credentials = BearerCredentials | BasicCredentials


class MalformedCredentials(Unauthorized):
    """The Authorization header names a known scheme but its credentials cannot be read."""


def parse_authorization(header: str | None) -> Credentials | None:
    """The credentials of an ``Authorization`` header.

    None when there is no header or it uses an unknown scheme (no credentials at all);
    ``MalformedCredentials`` when it says Bearer or Basic but carries nothing usable.
    """
    if not header:
        return None
    scheme, _, rest = header.strip().partition(" ")
    scheme = scheme.lower()
    value = rest.strip()
    if scheme == "bearer":
        if not value:
            raise MalformedCredentials("the bearer token is missing")
        return BearerCredentials(value)
    if scheme == "basic":
        return _parse_basic(value)
    return None


def _parse_basic(value: str) -> BasicCredentials:
    try:
        decoded = base64.b64decode(value.encode("ascii"), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeError, ValueError):
        raise MalformedCredentials("the basic credentials are not valid base64 UTF-8") from None
    username, sep, password = decoded.partition(":")
    if not sep:
        raise MalformedCredentials("the basic credentials lack a ':' separator")
    return BasicCredentials(username, password)


def is_loopback(host: str | None) -> bool:
    """True for 127.0.0.0/8 and ::1 (an IPv4-mapped loopback included)."""
    if not host:
        return False
    try:
        address = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped.is_loopback
    return address.is_loopback
