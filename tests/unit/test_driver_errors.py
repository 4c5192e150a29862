"""storage.driver_errors: the SQLAlchemy path and the asyncpg hot path classify a driver error
alike (the same asyncpg exception, bare or wrapped as SQLAlchemy wraps it), and every
constraint it names exists in the tables."""

from __future__ import annotations

import logging

import asyncpg
import pytest
from sqlalchemy import exc as sa_exc

from app.errors import DiskFull, InternalError, Unavailable
from app.storage import driver_errors
from app.storage.tables import metadata

E = asyncpg.exceptions


def wrapped(cause: BaseException, statement: str | None = "SELECT 1") -> sa_exc.DBAPIError:
    """``cause`` as SQLAlchemy's asyncpg dialect raises it: a DBAPIError whose ``orig`` (the
    adapted DBAPI error) was raised from the asyncpg exception."""
    orig = Exception("adapted")
    orig.__cause__ = cause
    return sa_exc.DBAPIError(statement, None, orig)


UNAVAILABLE = [
    E.AdminShutdownError("terminating connection due to administrator command"),
    E.CannotConnectNowError("the database system is starting up"),
    E.TooManyConnectionsError("too many clients"),
    E.InvalidCatalogNameError("database does not exist"),
    E.ReadOnlySQLTransactionError("read-only transaction"),
    E.QueryCanceledError("canceling statement due to statement timeout"),
    E.ConnectionDoesNotExistError("connection was closed in the middle of operation"),
    E.InterfaceError("connection is closed"),
    E.TargetServerAttributeNotMatched("None of the hosts match"),  # mid-failover: no primary
    ConnectionResetError("reset by peer"),
    E.DiskFullError('could not extend file "base/1/2": No space left on device'),
    E.InsufficientResourcesError("out of shared memory"),
    E.PostgresIOError('could not read block 0 in file "base/1/2": Input/output error'),
]

NOT_UNAVAILABLE = [
    E.UniqueViolationError("duplicate key"),
    E.DataError("invalid input for query argument $1"),  # an InterfaceError, but ours
    E.SyntaxOrAccessError("syntax error"),
]


@pytest.mark.parametrize("exc", UNAVAILABLE, ids=lambda e: type(e).__name__)
def test_connection_failures_are_unavailable_on_both_paths(exc: Exception) -> None:
    assert driver_errors.is_unavailable(exc)
    assert driver_errors.is_unavailable(wrapped(exc))
    assert isinstance(driver_errors.domain_error(exc), Unavailable)
    assert isinstance(driver_errors.domain_error(wrapped(exc)), Unavailable)


@pytest.mark.parametrize("exc", NOT_UNAVAILABLE, ids=lambda e: type(e).__name__)
def test_other_driver_errors_are_internal_on_both_paths(
    exc: Exception, caplog: pytest.LogCaptureFixture
) -> None:
    assert not driver_errors.is_unavailable(exc)
    assert not driver_errors.is_unavailable(wrapped(exc))
    with caplog.at_level(logging.ERROR, logger="messagex.storage"):
        assert isinstance(driver_errors.domain_error(wrapped(exc)), InternalError)
    assert type(exc).__name__ in caplog.text
    assert "adapted" not in caplog.text  # no driver text
    assert str(exc) not in caplog.text


def test_not_accepting_connections_is_unavailable_only_while_connecting() -> None:
    exc = E.ObjectNotInPrerequisiteStateError("database is not accepting connections")
    assert driver_errors.is_unavailable(exc, connecting=True)
    assert not driver_errors.is_unavailable(exc, connecting=False)
    assert driver_errors.is_unavailable(wrapped(exc, statement=None))
    assert not driver_errors.is_unavailable(wrapped(exc, statement="SELECT 1"))


def test_sqlalchemy_pool_failures_are_unavailable() -> None:
    assert driver_errors.is_unavailable(sa_exc.TimeoutError("QueuePool limit"))
    assert driver_errors.is_unavailable(sa_exc.DisconnectionError("closed"))


def test_an_error_that_is_not_the_driver_s_is_left_alone() -> None:
    assert driver_errors.domain_error(ValueError("a bug")) is None


def test_sqlstate_and_constraint_read_both_forms() -> None:
    exc = E.ForeignKeyViolationError("violates foreign key constraint")
    exc.constraint_name = driver_errors.FK_MESSAGES_QUEUE
    for form in (exc, wrapped(exc)):
        assert driver_errors.sqlstate(form) == "23503"
        assert driver_errors.constraint(form) == driver_errors.FK_MESSAGES_QUEUE
    assert driver_errors.constraint(ValueError()) is None


def test_every_constraint_in_the_table_exists() -> None:
    names = {c.name for table in metadata.tables.values() for c in table.constraints}
    assert set(driver_errors.CONSTRAINTS) <= names


def test_a_full_disk_is_a_503_that_says_so(caplog: pytest.LogCaptureFixture) -> None:
    """53100 (tests/faults/test_disk_full.py): the client and the log are told the database
    is out of disk space, without the driver's text (it names files)."""
    exc = E.DiskFullError('could not extend file "base/1/2": No space left on device')
    for form in (exc, wrapped(exc)):
        with caplog.at_level(logging.WARNING, logger="messagex.storage"):
            mapped = driver_errors.domain_error(form)
        assert isinstance(mapped, DiskFull)
        assert isinstance(mapped, Unavailable)
        assert mapped.code == "unavailable"
        assert "out of disk space (sqlstate 53100)" in caplog.text
        assert "base/1/2" not in caplog.text + mapped.message
