"""A flood of wrong passwords (issue 18, finding 2; contract §3).

Before: the limit was checked before Argon2 but the failure counted after it, so 100
concurrent wrong passwords for one user from one address were all verified (all 401, none
429) against limits of 10 and 30 — 12.7 s of Argon2 CPU. Now each attempt is counted before
its password is hashed, and at most ``Passwords.concurrency`` hashes run at once.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import psutil

from app.auth.passwords import Passwords, default_concurrency
from tests.faults.harness import brokers
from tests.support import ADMIN_PASSWORD, ADMIN_USER

#: the production Argon2 parameters (the harness's brokers use cheap ones)
ARGON2 = {"time_cost": 3, "memory_kib": 65536, "parallelism": 4}
ARGON2_ENV = {
    "MESSAGEX_ARGON2_TIME_COST": ARGON2["time_cost"],
    "MESSAGEX_ARGON2_MEMORY_KIB": ARGON2["memory_kib"],
    "MESSAGEX_ARGON2_PARALLELISM": ARGON2["parallelism"],
}
ATTEMPTS = 100


def cpu_seconds(pid: int) -> float:
    times = psutil.Process(pid).cpu_times()
    return float(times.user + times.system)


def one_verification_cpu() -> float:
    """CPU seconds of one Argon2id verification with the production parameters, here."""
    passwords = Passwords.argon2(**ARGON2)
    stored = asyncio.run(passwords.hash("the-right-password"))
    started = time.process_time()
    assert not asyncio.run(passwords.verify("a-wrong-password", stored))
    return time.process_time() - started


async def wrong_logins(api: str, n: int) -> list[int]:
    limits = httpx.Limits(max_connections=n, max_keepalive_connections=n)
    async with httpx.AsyncClient(base_url=api, limits=limits, timeout=120) as http:
        responses = await asyncio.gather(
            *(
                http.post("/auth/login", json={"username": "victim", "password": f"guess-{i:03d}"})
                for i in range(n)
            )
        )
    return [r.status_code for r in responses]


def test_concurrent_wrong_passwords_cannot_pass_the_limit(database_url: str, logs: Path) -> None:
    with brokers(database_url, logs, **ARGON2_ENV) as (broker,):
        with broker.client(auth=(ADMIN_USER, ADMIN_PASSWORD), timeout=60) as admin:
            r = admin.put("/users/victim", json={"password": "victim-password", "role": "user"})
            assert r.status_code == 201, r.text
        before = cpu_seconds(broker.pid)
        statuses = asyncio.run(wrong_logins(broker.api, ATTEMPTS))
        used = cpu_seconds(broker.pid) - before
        per_verification = one_verification_cpu()
        counts = Counter(statuses)
        print(
            f"\n{ATTEMPTS} concurrent wrong passwords: {dict(counts)}; broker CPU {used:.2f} s;"
            f" one verification {per_verification:.3f} s"
        )
        assert set(counts) <= {401, 429}, counts
        assert counts[401] <= 10, counts  # the per-user limit; 30 per address
        assert counts[429] >= ATTEMPTS - 10
        # Argon2 ran for at most the 10 counted attempts (plus the HTTP work of 100 requests)
        assert used < 20 * per_verification + 2.0, (used, per_verification)
        # the right password is locked out too until the window ends, with Retry-After
        r = httpx.post(
            f"{broker.api}/auth/login",
            json={"username": "victim", "password": "victim-password"},
            timeout=30,
        )
        assert r.status_code == 429
        assert 1 <= int(r.headers["retry-after"]) <= 60


class _SlowHasher:
    """A stand-in for pwdlib's PasswordHash that records how many calls overlap."""

    def __init__(self) -> None:
        self.active = 0
        self.most = 0
        self.lock = threading.Lock()

    def verify_and_update(self, password: str, password_hash: str) -> tuple[bool, None]:
        with self.lock:
            self.active += 1
            self.most = max(self.most, self.active)
        time.sleep(0.05)
        with self.lock:
            self.active -= 1
        return False, None

    def hash(self, password: str) -> str:
        return "x"


def test_argon2_runs_at_most_its_concurrency_at_once() -> None:
    hasher = _SlowHasher()
    fake: Any = hasher
    passwords = Passwords(fake, concurrency=2)

    async def burst() -> None:
        await asyncio.gather(*(passwords.verify("pw", "hash") for _ in range(12)))

    asyncio.run(burst())
    assert hasher.most == 2
    assert default_concurrency() == max(1, len(psutil.Process().cpu_affinity() or [1]) - 1)


def test_a_cancelled_check_keeps_its_slot_until_argon2_ends() -> None:
    hasher = _SlowHasher()
    fake: Any = hasher
    passwords = Passwords(fake, concurrency=1)

    async def cancel_then_verify() -> None:
        first = asyncio.ensure_future(passwords.verify("pw", "hash"))
        await asyncio.sleep(0.01)
        first.cancel()  # the client went away; its thread still runs
        await passwords.verify("pw", "hash")

    asyncio.run(cancel_then_verify())
    assert hasher.most == 1
