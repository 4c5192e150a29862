"""asyncpg's array encoder with the broker's fast nested-array test (storage.fastpath,
``use_fast_array_checks``, applied at start-up): the arrays the broker passes encode exactly as
before, against real PostgreSQL; the one change, that an array parameter must be a list or a
tuple, is pinned; importing the module patches nothing."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import AsyncIterator

import asyncpg
import pytest

from app.storage import fastpath
from app.storage.dsn import asyncpg_dsn


@pytest.fixture
async def conn(database_url: str) -> AsyncIterator[asyncpg.Connection]:
    fastpath.use_fast_array_checks()  # as the broker's start-up does (app/lifespan.py)
    connection = await asyncpg.connect(asyncpg_dsn(database_url))
    yield connection
    await connection.close()


def test_the_patch_is_in_effect_with_the_locked_asyncpg() -> None:
    from asyncpg.protocol import protocol

    assert fastpath.use_fast_array_checks()
    assert protocol.IterableABC == (list, tuple)


def test_importing_the_hot_path_patches_nothing() -> None:
    code = (
        "import app.storage.fastpath\n"
        "from asyncpg.protocol import protocol\n"
        "assert protocol.IterableABC != (list, tuple), 'patched on import'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


async def test_the_broker_s_arrays_encode_as_before(conn: asyncpg.Connection) -> None:
    texts = ["a", "", "ü", None]
    assert await conn.fetchval("SELECT $1::text[]", texts) == texts
    blobs = [b"\x00\x01", b"", None]
    assert await conn.fetchval("SELECT $1::bytea[]", blobs) == blobs
    assert await conn.fetchval("SELECT $1::bigint[]", [1, None, 2**62]) == [1, None, 2**62]
    assert await conn.fetchval("SELECT $1::float8[]", [0.5, None]) == [0.5, None]
    assert await conn.fetchval("SELECT $1::boolean[]", (True, False)) == [True, False]
    uuid = "00000000-0000-4000-8000-000000000000"
    assert [str(u) for u in await conn.fetchval("SELECT $1::uuid[]", [uuid])] == [uuid]
    nested = [[1, 2], [3, 4]]
    assert await conn.fetchval("SELECT $1::int[]", nested) == nested
    assert await conn.fetchval("SELECT array_ndims($1::int[])", nested) == 2
    assert await conn.fetchval("SELECT $1::text[]", []) == []


async def test_an_array_must_be_a_list_or_a_tuple(conn: asyncpg.Connection) -> None:
    with pytest.raises(asyncpg.DataError):
        await conn.fetchval("SELECT $1::int[]", {1, 2})
    with pytest.raises(asyncpg.DataError):
        await conn.fetchval("SELECT $1::int[]", range(3))
