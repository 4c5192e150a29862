"""The database's disk fills up (issue 23, item 5), on a PostgreSQL the test owns whose data
directory is a small tmpfs the test mounts (as root; CI runs as root).

Two ways a full disk meets PostgreSQL 18:

- ``data``: pg_wal lives elsewhere, so only the data files fill. ``could not extend file …:
  No space left on device`` (SQLSTATE 53100) fails the statement; PostgreSQL stays up, reads
  and deletes (acks) still work.
- ``wal``: everything on the one small disk. Data files fill first (as above); failed inserts
  go on writing WAL until the current segment is used up and no new one can be made: PANIC,
  crash recovery, which needs a new segment too, fails, and the postmaster shuts down. The
  test then frees space and starts it (an operator's job), as in test_pg_restart.

Both: publishes answer 503 problem+json quickly (never 500, never a hang), nothing confirmed
is lost (the checker judges the ledger after a drain), and once space is freed the broker
recovers by itself: publishes succeed and push resumes within a bound, without a restart.
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import os
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.exceptions import ConnectionClosed

from app.errors import DiskFull
from tests.faults.checker import Delivery, Ledger, Report, check
from tests.faults.harness import (
    BrokerProc,
    Consumer,
    Publisher,
    brokers,
    drain,
    join_all,
    queue_pair,
    record_delivery,
    remaining_rows,
    sql,
)
from tests.faults.pg import OwnPostgres, migrate
from tests.support import unavailable_here, wait_for
from tests.wsclient import WsClient

#: bound on any answer while the disk is full or PostgreSQL is down (test_pg_restart's)
FAIL_FAST_SECONDS = 6.0
#: bound on the broker's recovery once space is freed (and PostgreSQL runs again)
RECOVER_SECONDS = 20.0
#: bodies that fill the disk fast: random, so that TOAST cannot compress them
BODY_BYTES = 512 * 1024
#: deliveries a consumer holds unacked when the disk fills (it acks them while full)
HELD = 4
_dbs = itertools.count()


def _cannot(reason: str) -> None:
    """No tmpfs here: skip, but in CI (root, ``CI`` set) the scenario must run."""
    unavailable_here(reason)


def incompressible(n: int) -> str:
    return base64.b64encode(os.urandom(n)).decode()[:n]


@dataclass
class SmallDisk:
    pg: OwnPostgres
    log: Path  # PostgreSQL's log, off the small disk (a full disk would swallow it)
    ballast: Path  # a file on the small disk: deleting it is "freeing space"

    def free_mib(self) -> float:
        st = os.statvfs(self.pg.pgdata)
        return st.f_bavail * st.f_frsize / 2**20

    def pg_log(self) -> str:
        return self.log.read_text(errors="replace")

    def pg_events(self) -> list[str]:
        """PostgreSQL's log lines that tell what the full disk did to it (no timestamps)."""
        keys = ("No space", "PANIC", "startup process", "shut", "terminated by", "recovery")
        lines = [line.split("] ", 1)[-1] for line in self.pg_log().splitlines()]
        return list(dict.fromkeys(line for line in lines if any(k in line for k in keys)))


@contextmanager
def small_disk(size_mib: int, ballast_mib: int, *, wal_elsewhere: bool) -> Iterator[SmallDisk]:
    """An own PostgreSQL whose data directory is a ``size_mib`` tmpfs holding a
    ``ballast_mib`` ballast file; with ``wal_elsewhere`` its pg_wal is moved off the tmpfs."""
    if os.geteuid() != 0:
        _cannot("the disk-full scenario mounts a tmpfs: it needs root (CI runs as root)")
    root = Path(tempfile.mkdtemp(prefix="messagex-disk-"))
    pgdata = root / "pgdata"
    pgdata.mkdir()
    options = f"size={size_mib}m,mode=0700"
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(pgdata)],
        capture_output=True,
        text=True,
        check=False,
    )
    if mounted.returncode != 0:
        shutil.rmtree(root, ignore_errors=True)
        _cannot(f"mount -t tmpfs failed: {mounted.stderr.strip()}")
    pg = OwnPostgres(root)
    try:
        pg.start()  # initdb on the tmpfs (the wheel chowns the mount point to its user)
        pg.stop_server("fast")
        log = root / "postgresql.log"
        log.touch()
        pg.chown_to_server(log)
        if wal_elsewhere:
            # mv keeps the owner across file systems; the data directory keeps a symlink
            subprocess.run(["mv", str(pgdata / "pg_wal"), str(root / "pg_wal")], check=True)
            (pgdata / "pg_wal").symlink_to(root / "pg_wal")
        pg.start_server(log)
        ballast = pgdata / "ballast"
        with ballast.open("wb") as f:
            for _ in range(ballast_mib):
                f.write(os.urandom(2**20))
        yield SmallDisk(pg, log, ballast)
    finally:
        pg.stop()
        for _ in range(50):
            if subprocess.run(["umount", str(pgdata)], check=False).returncode == 0:
                break
            time.sleep(0.1)  # a server process may still hold a file for a moment
        else:
            subprocess.run(["umount", "-l", str(pgdata)], check=False)
        shutil.rmtree(root, ignore_errors=True)


def probe(
    api: httpx.Client, ledger: Ledger, queue: str, mid: str, pad: str
) -> tuple[int, dict[str, Any], float]:
    """One publish recorded in the ledger: (status or 0, problem body, seconds)."""
    record = ledger.invoked(mid, queue, str(api.base_url))
    body = {"body": {"mid": mid, "pad": pad}, "properties": {"message_id": mid}}
    started = time.monotonic()
    try:
        r = api.post(f"/queues/{queue}/messages", json=body)
    except httpx.TransportError as exc:
        ledger.published(record, "unknown", code=type(exc).__name__)
        return 0, {}, time.monotonic() - started
    seconds = time.monotonic() - started
    if r.status_code == 200:
        ledger.published(record, "ok", 200)
        return 200, {}, seconds
    problem: dict[str, Any] = r.json() if "problem+json" in r.headers["content-type"] else {}
    outcome = "unknown" if "may have been" in str(problem.get("detail")) else "failed"
    ledger.published(record, outcome, r.status_code, problem.get("code"))
    return r.status_code, problem, seconds


def hold(ws: WsClient, ledger: Ledger, n: int, timeout: float = 20) -> list[Delivery]:
    """Take ``n`` deliveries on the holder's socket, recorded in the ledger (unsettled)."""
    frames = ws.deliveries_n(n, timeout=timeout)
    return [record_delivery(ledger, f, "holder", "holder/1") for f in frames]


def ack_held(ws: WsClient, ledger: Ledger, held: list[Delivery]) -> list[str]:
    """ACK each held delivery; the outcomes (``acked``, ``ack_rejected:<code>``, ...)."""
    for d in held:
        try:
            reply = ws.request({"type": "ACK", "delivery_tag": d.tag}, timeout=15)
        except (AssertionError, ConnectionClosed, OSError):
            ledger.settled(d, "ack_unconfirmed")
            continue
        ok = reply["type"] == "ACKED"
        ledger.settled(d, "acked" if ok else f"ack_rejected:{reply.get('code')}")
    return [d.outcome for d in held]


def cross_wal_segment(disk: SmallDisk, url: str) -> bool:
    """Make the next WAL record need a new segment, as a busy server's traffic does every
    16 MiB (the refused publishes write little WAL: their first new page fails first), and
    write one: True once PostgreSQL has panicked."""
    with contextlib.suppress(Exception):  # it may be panicking, recovering or down
        sql(url, "SELECT pg_switch_wal()")
        sql(url, "SELECT pg_logical_emit_message(false, 'messagex-test', 'wal')")
    return "PANIC:" in disk.pg_log()


def status_of(call: Any) -> int:
    try:
        return int(call().status_code)
    except httpx.TransportError:
        return 0


@dataclass
class Outcome:
    full_after: float  # seconds of publishing until the first 503
    ack_outcomes: list[str]
    readyz_full: int
    list_full: int
    probe_status: int
    probe_detail: str
    probe_seconds: float
    panicked: bool
    pg_start_seconds: float | None
    publish_after: float  # seconds from freeing space to the first 200
    push_after: float  # ... to the first delivery
    ready_after: float
    while_full: list[tuple[int, int]]  # distinct (publish, /readyz) statuses while full
    #: WAL variant: (publish, /readyz, list queues, publish seconds) just after the PANIC
    after_panic: tuple[int, int, int, float] | None
    panicked_before_acks: bool


def run_disk_full(variant: str, *, full_seconds: float, load_consumers: int) -> Outcome:
    wal = variant == "wal"
    size, ballast = (96, 24) if wal else (64, 8)
    with (
        small_disk(size, ballast, wal_elsewhere=not wal) as disk,
        tempfile.TemporaryDirectory(prefix="messagex-disk-logs-") as logs,
    ):
        url = disk.pg.database(f"disk_{variant}_{next(_dbs)}")
        migrate(url)
        env = {"ACK_TIMEOUT_SECONDS": 30, "ACK_TIMEOUT_CHECK_INTERVAL_MS": 200}
        with brokers(url, Path(logs), 1, **env) as (a,):
            return _scenario(disk, url, a, wal, full_seconds, load_consumers)


def _scenario(
    disk: SmallDisk, url: str, a: BrokerProc, wal: bool, full_seconds: float, load: int
) -> Outcome:
    pad = incompressible(BODY_BYTES)
    ledger, stop = Ledger(), threading.Event()
    with a.client(timeout=30) as api, httpx.Client(base_url=a.base_url, timeout=30) as ops:
        specs = queue_pair(api, "disk", max_delivery_count=10)
        names = [s.name for s in specs]
        holder = WsClient.admin(a.ws_url)
        holder.subscribe("disk", prefetch=HELD)
        for i in range(HELD):
            assert probe(api, ledger, "disk", f"held-{i}", pad)[0] == 200
        held = hold(holder, ledger, HELD)

        # publish until writes fail (and, with WAL on the small disk, until PostgreSQL panics)
        started = time.monotonic()
        pubs = [
            Publisher(ledger, [a.api], "disk", stop, count=2000, seconds=120, timeout=30)
            for _ in range(2)
        ]
        for p in pubs:
            p.pad = pad
            p.start()
        consumers = [
            Consumer(ledger, [a.ws_url], names, stop, prefetch=2, seconds=120) for _ in range(load)
        ]
        for c in consumers:
            c.start()
        wait_for(lambda: ledger.count("failed") > 0, 60, message="a publish refused")
        full_after = time.monotonic() - started
        full_since = time.monotonic()

        # data files full: the holder acks what it holds; a publish, /readyz and a read
        panicked_early = "PANIC:" in disk.pg_log()
        ack_outcomes = ack_held(holder, ledger, held)
        readyz_full = status_of(lambda: ops.get("/readyz"))
        list_full = status_of(lambda: api.get("/queues"))
        status, problem, probe_seconds = probe(api, ledger, "disk", "probe-full", pad)
        after_panic = None
        if wal:
            # WAL on the full disk: PostgreSQL panics, then what the broker answers
            wait_for(lambda: cross_wal_segment(disk, url), 30, interval=0.5, message="a PANIC")
            got, _, seconds = probe(api, ledger, "disk", "probe-panic", pad)
            after_panic = (
                got,
                status_of(lambda: ops.get("/readyz")),
                status_of(lambda: api.get("/queues")),
                round(seconds, 2),
            )
        # the full period goes on: (publish, /readyz) statuses
        while_full: list[tuple[int, int]] = []
        while time.monotonic() - full_since < full_seconds:
            got = probe(api, ledger, "disk", f"full-{len(while_full)}", pad)[0]
            while_full.append((got, status_of(lambda: ops.get("/readyz"))))
        stop.set()
        join_all([*pubs, *consumers], 60)

        # free space; PostgreSQL down (it panicked and could not recover): start it
        pg_start_seconds = None
        if wal:
            wait_for(
                lambda: (
                    not disk.pg.postmaster_running()
                    or "ready to accept connections" in disk.pg_log().split("PANIC:")[-1]
                ),
                30,
                message="PostgreSQL settled after its PANIC",
            )
        for _ in range(HELD):  # what reached the holder while full was pushed before freeing
            with contextlib.suppress(AssertionError, ConnectionClosed, OSError):
                hold(holder, ledger, 1, timeout=0.05)
        disk.ballast.unlink()
        freed = time.monotonic()
        if not disk.pg.postmaster_running():
            pg_start_seconds = disk.pg.start_server(disk.log)

        pusher_stop = threading.Event()
        pusher = Consumer(ledger, [a.ws_url], names, pusher_stop, prefetch=5, seconds=60)
        pusher.start()
        mids = itertools.count()

        def published() -> bool:
            return probe(api, ledger, "disk", f"after-{next(mids)}", pad)[0] == 200

        wait_for(published, RECOVER_SECONDS, interval=0.2, message="a publish after freeing")
        publish_after = time.monotonic() - freed
        wait_for(lambda: ops.get("/readyz").status_code == 200, RECOVER_SECONDS, interval=0.1)
        ready_after = time.monotonic() - freed

        def pushed() -> bool:
            # to the fresh consumer, or to the holder (its prefetch is free again)
            with contextlib.suppress(AssertionError, ConnectionClosed, OSError):
                hold(holder, ledger, 1, timeout=0.05)
            return any(d.at > freed for d in list(ledger.deliveries))

        wait_for(pushed, RECOVER_SECONDS, message="a delivery after freeing")
        push_after = time.monotonic() - freed
        pusher_stop.set()
        join_all([pusher], 30)
        with contextlib.suppress(Exception):
            holder.close()

        drain(ledger, a.ws_url, url, specs, timeout=60)
        report = check(ledger, specs, remaining_rows(url, names))
        assert a.alive()
        log = a.log_text()
        events = disk.pg_events()

    outcome = Outcome(
        full_after=full_after,
        ack_outcomes=ack_outcomes,
        readyz_full=readyz_full,
        list_full=list_full,
        probe_status=status,
        probe_detail=str(problem.get("detail")),
        probe_seconds=probe_seconds,
        panicked=any("PANIC:" in e for e in events),
        pg_start_seconds=pg_start_seconds,
        publish_after=publish_after,
        push_after=push_after,
        ready_after=ready_after,
        while_full=sorted(set(while_full)),
        after_panic=after_panic,
        panicked_before_acks=panicked_early,
    )
    judge(outcome, ledger, report, log, events, wal=wal, problem=problem)
    return outcome


def judge(
    outcome: Outcome,
    ledger: Ledger,
    report: Report,
    log: str,
    events: list[str],
    *,
    wal: bool,
    problem: dict[str, Any],
) -> None:
    """Print the run's figures and assert what the scenario promises."""
    answers = {(p.status, p.code) for p in ledger.publishes.values() if p.outcome != "ok"}
    slowest = max(p.seconds or 0 for p in ledger.publishes.values())
    print(
        f"disk full ({'WAL' if wal else 'data files'}): {outcome}; "
        f"{ledger.count('ok')} publishes confirmed, refused with {sorted(answers)}, slowest "
        f"{slowest:.2f} s; {report.summary()}"
    )
    print("PostgreSQL:\n  " + "\n  ".join(events))
    assert report.clean, report.summary()
    assert ledger.count("failed") > 0
    # refused with 503 problem+json, quickly: never a 500, never a hang, nothing in doubt left
    assert {status for status, _ in answers} == {503}, answers
    assert slowest < FAIL_FAST_SECONDS
    assert outcome.probe_status == 503, problem
    assert problem["code"] == "unavailable", problem
    assert outcome.probe_seconds < FAIL_FAST_SECONDS
    # the broker logs what happened in a line, with no stack trace (nor does any client get one)
    at = log.find("Traceback")
    assert at < 0, log[max(at - 300, 0) : at + 3000]
    assert "500 Internal" not in log
    # the data files full, PostgreSQL up: the publish says why; reads, acks and /readyz work
    assert outcome.probe_detail == DiskFull().message
    if not outcome.panicked_before_acks:
        assert outcome.ack_outcomes == ["acked"] * HELD
    assert (outcome.readyz_full, outcome.list_full) == (200, 200)
    assert outcome.panicked == wal
    if not wal:
        assert ledger.count("unknown") == 0  # PostgreSQL answered every refusal: none in doubt
    if outcome.after_panic is not None:
        assert outcome.after_panic[:3] == (503, 503, 503), outcome.after_panic


@pytest.mark.parametrize("variant", ["data", "wal"])
def test_disk_full(variant: str) -> None:
    run_disk_full(variant, full_seconds=2, load_consumers=0)


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["data", "wal"])
def test_disk_full_for_long_under_load(variant: str) -> None:
    run_disk_full(variant, full_seconds=30, load_consumers=2)
