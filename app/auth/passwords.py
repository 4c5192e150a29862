"""Argon2id password hashing that never blocks the event loop.

Hashing and verification run in a worker thread (``asyncio.to_thread``): one Argon2id
computation with the default parameters takes a few hundred milliseconds of CPU. At most
``concurrency`` of them run at once (by default one fewer than the cores this process may
use, at least one), the rest wait their turn: a burst of password checks, wrong ones
included, cannot take every core from the broker's event loop.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
from collections.abc import Callable
from typing import Any, TypeVar

from pwdlib import PasswordHash
from pwdlib.exceptions import UnknownHashError
from pwdlib.hashers.argon2 import Argon2Hasher

log = logging.getLogger("messagex.auth")

T = TypeVar("T")


def default_concurrency() -> int:
    """One fewer than the usable cores (one is left to the event loop), at least one."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    return max(1, cores - 1)


class Passwords:
    """The one place passwords are hashed and verified."""

    def __init__(self, hasher: PasswordHash | None = None, concurrency: int | None = None) -> None:
        self._hash = hasher or PasswordHash((Argon2Hasher(),))
        self.concurrency = concurrency or default_concurrency()
        self._slots = asyncio.Semaphore(self.concurrency)
        self._dummy: str | None = None
        self._dummy_lock = asyncio.Lock()

    @classmethod
    def argon2(cls, *, time_cost: int, memory_kib: int, parallelism: int) -> Passwords:
        return cls(
            PasswordHash(
                (
                    Argon2Hasher(
                        time_cost=time_cost, memory_cost=memory_kib, parallelism=parallelism
                    ),
                )
            )
        )

    async def _run(self, fn: Callable[..., T], *args: str) -> T:
        """``fn(*args)`` in a worker thread, holding a slot until the thread is done: a
        caller that goes away (cancelled) does not free its slot while Argon2 still runs."""
        await self._slots.acquire()
        try:
            future = asyncio.ensure_future(asyncio.to_thread(fn, *args))
        except BaseException:
            self._slots.release()
            raise
        future.add_done_callback(self._done)
        return await asyncio.shield(future)

    def _done(self, future: asyncio.Future[Any]) -> None:
        self._slots.release()
        if not future.cancelled():
            future.exception()  # seen, even when its caller went away

    async def hash(self, password: str) -> str:
        return await self._run(self._hash.hash, password)

    async def verify(self, password: str, password_hash: str) -> bool:
        ok, _ = await self.verify_and_update(password, password_hash)
        return ok

    async def verify_and_update(self, password: str, password_hash: str) -> tuple[bool, str | None]:
        """(matches, new hash when the stored one uses outdated parameters)."""
        return await self._run(self._verify_and_update, password, password_hash)

    def _verify_and_update(self, password: str, password_hash: str) -> tuple[bool, str | None]:
        try:
            return self._hash.verify_and_update(password, password_hash)
        except UnknownHashError:
            # Never log the hash itself.
            log.warning("a stored password hash has an unknown format; refusing it")
            return False, None

    async def verify_dummy(self, password: str) -> None:
        """Spend the time a real verification takes, so that timing does not reveal whether
        a user exists."""
        await self.verify(password, await self._dummy_hash())

    async def _dummy_hash(self) -> str:
        if self._dummy is None:
            async with self._dummy_lock:
                if self._dummy is None:
                    self._dummy = await self.hash(secrets.token_urlsafe(16))
        return self._dummy
