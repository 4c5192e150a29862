"""``DATABASE_URL`` and its forms: the one place that knows which schemes we take and how each
driver wants the URL written.

A user may write ``postgresql://``, ``postgres://`` or ``postgresql+asyncpg://``. SQLAlchemy's
engine needs the asyncpg dialect named in the scheme; asyncpg itself (the hot path, the
LISTEN connection, the tests' and the benchmark's admin connections) refuses that scheme.

Several hosts (a primary and its standbys, docs/operations.md "High availability of the
database") may be written either way: libpq's ``postgresql://u@h1:5432,h2:5432/db`` or
SQLAlchemy's ``postgresql://u@/db?host=h1:5432&host=h2:5432``, usually with
``target_session_attrs=read-write``. SQLAlchemy reads only the second, asyncpg only the
first (of repeated ``host=`` it keeps the last); ``sqlalchemy_url`` and ``asyncpg_dsn`` turn
either into the form their driver reads.
"""

from __future__ import annotations

from urllib.parse import parse_qsl, quote, urlencode

#: the schemes ``DATABASE_URL`` may start with
SCHEMES = ("postgresql", "postgres", "postgresql+asyncpg")

_SQLALCHEMY_SCHEME = "postgresql+asyncpg"
_REFUSED = "must start with postgresql:// or postgresql+asyncpg://"


def check(url: str) -> str:
    """``url`` itself, or ValueError when its scheme is not PostgreSQL's."""
    scheme = url.split("://", 1)[0]
    if "://" not in url or scheme not in SCHEMES:
        raise ValueError(_REFUSED)
    return url


def sqlalchemy_url(url: str) -> str:
    """The URL for ``create_async_engine`` (``postgresql+asyncpg://``)."""
    try:
        _, rest = check(url).split("://", 1)
    except ValueError:
        raise ValueError(f"DATABASE_URL {_REFUSED}") from None
    return f"{_SQLALCHEMY_SCHEME}://{_hosts_in_query(rest)}"


def asyncpg_dsn(url: str) -> str:
    """The URL for ``asyncpg.connect`` / ``asyncpg.create_pool`` (no dialect in the scheme)."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    if scheme == _SQLALCHEMY_SCHEME:
        scheme = "postgresql"
    return f"{scheme}://{_hosts_in_netloc(rest)}"


def libpq_url(url: str) -> str:
    """``url`` as any PostgreSQL client reads it (libpq, psycopg, asyncpg): unchanged, except
    that several ``host=`` parameters (SQLAlchemy's multi-host form) become libpq's host list,
    ``postgresql://u@h1:p1,h2:p2/db``. For ``messagex database-url``."""
    if len(_query_hosts(url)) < 2:
        return url
    return asyncpg_dsn(url)


def _split(rest: str) -> tuple[str, str, str, str]:
    """(user info with its ``@`` or "", host list, path, query) of a URL after its scheme."""
    rest, _, query = rest.partition("?")
    netloc, slash, path = rest.partition("/")
    auth, at, hostspec = netloc.rpartition("@")
    return auth + at, hostspec, slash + path, query


def _query_hosts(url: str) -> list[str]:
    return [v for k, v in parse_qsl(url.partition("?")[2], keep_blank_values=True) if k == "host"]


def _hosts_in_query(rest: str) -> str:
    """libpq's ``h1:p1,h2:p2`` host list (several hosts) moved into repeated ``host=h:p``
    parameters, each with its port (SQLAlchemy's asyncpg dialect wants every port)."""
    auth, hostspec, path, query = _split(rest)
    if "," not in hostspec:
        return rest
    hosts = [h if _has_port(h) else f"{h}:5432" for h in hostspec.split(",")]
    params = [("host", h) for h in hosts] + parse_qsl(query, keep_blank_values=True)
    return f"{auth}{path or '/'}?{urlencode(params)}"


def _hosts_in_netloc(rest: str) -> str:
    """SQLAlchemy's repeated ``host=h:p`` parameters moved into libpq's host list (asyncpg
    keeps only the last ``host=``); one ``host=`` (a Unix socket directory) stays."""
    auth, hostspec, path, query = _split(rest)
    params = parse_qsl(query, keep_blank_values=True)
    hosts = [v for k, v in params if k == "host"]
    if len(hosts) < 2 or hostspec:
        return rest
    others = [(k, v) for k, v in params if k != "host"]
    netloc = ",".join(quote(h, safe=":[]") for h in hosts)
    return f"{auth}{netloc}{path}" + (f"?{urlencode(others)}" if others else "")


def _has_port(host: str) -> bool:
    head, colon, port = host.rpartition(":")
    return bool(colon) and port.isdigit() and not head.endswith(":")  # not a bare IPv6


def redacted(url: str) -> str:
    """The URL with its password hidden, fit for a log line."""
    from sqlalchemy.engine import make_url

    return make_url(sqlalchemy_url(url)).render_as_string(hide_password=True)
