"""storage.dsn with several hosts (a primary and its standbys): each driver gets the form it
reads, whichever form DATABASE_URL was written in."""

from __future__ import annotations

import pytest
from sqlalchemy.dialects.postgresql.asyncpg import dialect
from sqlalchemy.engine import make_url

from app.storage import dsn
from app.storage.listener import wants_primary

LIBPQ = "postgresql://u:p@h1:5432,h2:5433/mx?target_session_attrs=read-write"
SQLALCHEMY = (
    "postgresql+asyncpg://u:p@/mx?host=h1:5432&host=h2:5433&target_session_attrs=read-write"
)


@pytest.mark.parametrize("url", [LIBPQ, SQLALCHEMY])
def test_engine_gets_every_host_with_its_port(url: str) -> None:
    args, kwargs = dialect().create_connect_args(make_url(dsn.sqlalchemy_url(url)))  # type: ignore[no-untyped-call]
    assert args == []
    assert kwargs["host"] == ["h1", "h2"]
    assert kwargs["port"] == [5432, 5433]
    assert kwargs["target_session_attrs"] == "read-write"
    assert (kwargs["user"], kwargs["password"], kwargs["database"]) == ("u", "p", "mx")


@pytest.mark.parametrize("url", [LIBPQ, SQLALCHEMY, dsn.sqlalchemy_url(LIBPQ)])
def test_asyncpg_and_libpq_get_the_host_list(url: str) -> None:
    # asyncpg keeps only the last of repeated host= parameters: the list goes in the netloc
    assert dsn.asyncpg_dsn(url) == LIBPQ
    assert dsn.libpq_url(url) == (url if url == LIBPQ else LIBPQ)


def test_a_host_without_a_port_gets_the_default_one() -> None:
    url = dsn.sqlalchemy_url("postgres://u@h1,h2:7/mx")
    assert make_url(url).query["host"] == ("h1:5432", "h2:7")


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://u:p@db:5432/mx",
        "postgresql://postgres@/postgres?host=/run/pg&port=5433",  # one Unix socket
    ],
)
def test_one_host_is_left_as_written(url: str) -> None:
    assert dsn.asyncpg_dsn(url) == url
    assert dsn.libpq_url(url) == url
    assert dsn.sqlalchemy_url(url) == url.replace("postgresql://", "postgresql+asyncpg://")


def test_redacted_hides_the_password_of_a_multi_host_url() -> None:
    shown = dsn.redacted(LIBPQ)
    assert ":p@" not in shown
    assert "h1" in shown
    assert "h2" in shown


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        (LIBPQ, True),
        (SQLALCHEMY, True),
        ("postgresql://u@h1,h2/mx?target_session_attrs=primary", True),
        ("postgresql://u@h1,h2/mx?target_session_attrs=any", False),
        ("postgresql://u@h1/mx", False),
    ],
)
def test_wants_primary(url: str, expected: bool) -> None:
    assert wants_primary(dsn.asyncpg_dsn(url)) is expected
