"""The harness's PostgreSQL CPU meter counts the bench database's backends and the shared
background processes, and leaves out the backends of other databases."""

from __future__ import annotations

import asyncpg

from bench.infra import PostgresSampler, _parent_pid


async def test_the_sampler_counts_this_databases_backends_and_not_another_ones(
    database_url: str, empty_database_url: str
) -> None:
    ours = await asyncpg.connect(database_url)
    other = await asyncpg.connect(empty_database_url)
    try:
        our_pid = await ours.fetchval("SELECT pg_backend_pid()")
        other_pid = await other.fetchval("SELECT pg_backend_pid()")
        dbname = await ours.fetchval("SELECT current_database()")
        postmaster = _parent_pid(our_pid)
        assert postmaster is not None
        sampler = PostgresSampler(postmaster, dbname)
        before = sampler()
        await ours.fetchval("SELECT count(*) FROM generate_series(1, 3000000)")
        after = sampler()
        assert our_pid in before
        assert other_pid not in after
        assert after[our_pid] > before[our_pid]  # a reading follows the CPU it spent
        # the background processes (checkpointer, WAL writer, ...) are counted
        assert len(after) >= 2
        # psutil's reading (the fallback elsewhere than Linux) tells them apart the same way
        fallback = sampler._psutil_sample()
        assert our_pid in fallback
        assert other_pid not in fallback
        # backends_only: this database's backends, without the background processes
        assert set(PostgresSampler(postmaster, dbname, backends_only=True)()) == {our_pid}
    finally:
        await ours.close()
        await other.close()
