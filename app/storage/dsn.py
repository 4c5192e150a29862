"""``DATABASE_URL`` and its forms: the one place that knows which schemes we take and how each
driver wants the URL written.

A user may write ``postgresql://``, ``postgres://`` or ``postgresql+asyncpg://``. SQLAlchemy's
engine needs the asyncpg dialect named in the scheme; asyncpg itself (the hot path, the
LISTEN connection, the tests' and the benchmark's admin connections) refuses that scheme.
"""

from __future__ import annotations

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
    return f"{_SQLALCHEMY_SCHEME}://{rest}"


def asyncpg_dsn(url: str) -> str:
    """The URL for ``asyncpg.connect`` / ``asyncpg.create_pool`` (no dialect in the scheme)."""
    return url.replace(f"{_SQLALCHEMY_SCHEME}://", "postgresql://", 1)


def redacted(url: str) -> str:
    """The URL with its password hidden, fit for a log line."""
    from sqlalchemy.engine import make_url

    return make_url(sqlalchemy_url(url)).render_as_string(hide_password=True)
