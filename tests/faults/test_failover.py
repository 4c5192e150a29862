"""PostgreSQL primary failover under load (issue 25, item 2).

Two brokers are given a multi-host DATABASE_URL naming a primary and its streaming standby
(tests/faults/replica.py) with ``target_session_attrs=read-write``. Under load the primary is
stopped hard (``pg_ctl stop -m immediate``) and the standby promoted (``pg_ctl promote``).

Asserted, with a synchronous standby (``synchronous_standby_names`` set, ``synchronous_commit
= on``): both brokers find the new primary by themselves (no restart, no new URL) within
``FIND_SECONDS`` of the promotion, publishes, WebSocket push and REST pull resume, every
answer while no primary was reachable is a 503 (never a 500, never a hang), the publishes left
in doubt are settled by publishing them again with the same message_id, and the checker finds
nothing acknowledged lost.

CI runs the synchronous case and the fenced old primary (~35 s each); ``-m slow`` adds the
asynchronous case and a longer run of both (20 s of load, 5 s without a primary, 20 s more).

With an asynchronous standby, a commit returns once the primary alone has flushed it, so
what the standby had not received when the primary died is gone: publishes answered 200,
and acks and claims, in the last moments before the stop. That test measures and reports
that loss and asserts only its bound: every violation the checker reports concerns a message
whose publish was answered, or whose delivery was settled, at most ``ASYNC_WINDOW_SECONDS``
before the stop (docs/operations.md, "High availability of the database").
"""

from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.faults.checker import Ledger, QueueSpec, Report, check
from tests.faults.harness import (
    ADMIN,
    BrokerProc,
    Consumer,
    Publisher,
    TwinSampler,
    brokers,
    declare,
    drain,
    join_all,
    queue_pair,
    record_delivery,
    remaining_rows,
)
from tests.faults.pg import migrate
from tests.faults.replica import ReplicaPair, replica_pair
from tests.faults.test_blackhole import _retry_in_doubt
from tests.support import wait_for

#: the brokers must be publishing through the new primary this soon after its promotion
FIND_SECONDS = 10.0
#: how far before the stop a confirmed event may be lost with an asynchronous standby: the
#: standby's lag on loopback is milliseconds; this leaves room for a loaded 2-core machine
ASYNC_WINDOW_SECONDS = 2.0
#: the longest a publish may wait while there is no primary: a connect that fails at once
#: (refused, or not read-write) + the in-doubt settle's 5 s (IN_DOUBT_SECONDS) + the pool
#: timeout (2 s here) + slack for a loaded 2-core machine
ANSWER_BOUND = 12.0
#: how long the lagging standby's stream is held before the stop
LAG_SECONDS = 2.0
#: the primary stays down this long before the promotion (a failover manager's detection)
DOWN_SECONDS = 1.0


@dataclass
class Failover:
    report: Report
    ledger: Ledger
    stopped_at: float
    promoted_at: float
    first_publish: dict[str, float]  # broker → seconds from promotion to its first 200
    push: float  # seconds from promotion to the first delivery of a post-promotion publish
    pull: dict[str, float]  # broker → seconds from promotion to a pulled and acked message
    ready: dict[str, float]  # broker → seconds from promotion to /readyz 200
    retried: int
    statuses: dict[str, int]  # "<outcome>:<status>" → count, of publishes that met the outage
    slowest: float  # the longest any of those waited for its answer
    fenced: bool


def _first_ok_after(ledger: Ledger, target: str, since: float) -> float | None:
    """When the first publish sent to ``target`` after ``since`` was answered 200."""
    with ledger.lock:
        answered = [
            p.invoked_at + (p.seconds or 0)
            for p in ledger.publishes.values()
            if p.target == target and p.outcome == "ok" and p.invoked_at > since
        ]
    return min(answered) if answered else None


def _pull_one(broker: BrokerProc, ledger: Ledger, queue: str) -> bool:
    """Pull one message from ``queue`` through ``broker`` (REST) and ack it, recording both in
    the ledger; False while the broker answers 503 or the queue is empty."""
    with broker.client(timeout=15) as api:
        r = api.post(f"/queues/{queue}/get", json={"max_messages": 1})
        if r.status_code != 200 or not r.json()["messages"]:
            return False
        # a pulled message has the fields of a MESSAGE_DELIVERED frame
        d = record_delivery(ledger, r.json()["messages"][0], "pull", f"pull/{broker.port}")
        ack = api.post(f"/deliveries/{d.tag}/ack")
        ledger.settled(d, "acked" if ack.status_code == 204 else f"ack_rejected:{ack.status_code}")
        return ack.status_code == 204


def _answered_between(ledger: Ledger, start: float, end: float) -> int:
    with ledger.lock:
        return sum(
            1
            for p in ledger.publishes.values()
            if p.outcome == "ok" and start <= p.invoked_at + (p.seconds or 0) <= end
        )


def _first_push_after(ledger: Ledger, since: float) -> float | None:
    """When a message published (and confirmed) after ``since`` was first delivered."""
    with ledger.lock:
        fresh = {
            p.message_id
            for p in ledger.publishes.values()
            if p.outcome == "ok" and p.invoked_at > since
        }
        times = [d.at for d in ledger.deliveries if d.message_id in fresh]
    return min(times) if times else None


def run_failover(
    pair: ReplicaPair,
    logs: Path,
    *,
    load: int,
    before: float = 0.0,
    down: float = DOWN_SECONDS,
    after: float = 3.0,
    fence: bool = False,
    lag: float = 0.0,
) -> Failover:
    """Load on two brokers for ``before`` s (at least until 50 acks); the primary stopped
    hard (``fence``: left running but made read-only, as a failover manager fences an old
    primary it can reach), the standby promoted ``down`` s later; load for ``after`` s more;
    ``lag``: the standby's stream is held that long before the stop (it falls behind).
    Then the checks of the module's docstring."""
    seconds = before + down + after + 60  # the workers' own bound; ``stop`` ends them first
    url = pair.database("failover")
    migrate(url)  # the migrations' engine takes the multi-host URL too
    with brokers(url, logs, 2, ACK_TIMEOUT_SECONDS=3, ACK_TIMEOUT_CHECK_INTERVAL_MS=200) as (
        a,
        b,
    ):
        # "fo" is consumed all along; "fo.parked" only by the final drain, so what is
        # published there stays stored across the failover (and a lost publish stays lost,
        # where one already delivered would hide it)
        parked = QueueSpec("fo.parked")
        with a.client() as api:
            specs = queue_pair(api, "fo", max_delivery_count=10)
            declare(api, parked)
        names = [s.name for s in specs]
        ledger, stop = Ledger(), threading.Event()
        consumers = [
            Consumer(ledger, [x.ws_url], list(names), stop, prefetch=5, seconds=seconds + 30)
            for x in (a, b)
        ]
        pubs = [
            Publisher(ledger, [x.api], queue, stop, count=load, seconds=seconds, pace=pace)
            for x, queue, pace in [
                (a, names[0], 0.005),
                (b, names[0], 0.005),
                (a, names[0], 0.005),
                (b, parked.name, 0.02),
            ]
        ]
        specs.append(parked)
        names.append(parked.name)
        sampler = TwinSampler(ledger, url, names, stop)
        for w in [*consumers, *pubs, sampler]:
            w.start()
        started = time.monotonic()
        wait_for(lambda: sum(d.outcome == "acked" for d in ledger.deliveries) >= 50, 30)
        wait_for(lambda: time.monotonic() - started > before, before + 1, 0.1)

        if lag:
            pair.hold_stream()
            held_at = time.monotonic()
            wait_for(lambda: time.monotonic() - held_at > lag, lag + 1, 0.05)
            print(
                f"standby held {lag:.0f} s: {pair.replay_lag_bytes()} bytes of WAL behind, "
                f"{_answered_between(ledger, held_at, time.monotonic())} publishes answered 200 "
                "meanwhile"
            )
        if fence:
            pair.fence_primary()
        else:
            pair.primary.stop("immediate")
        stopped_at = time.monotonic()
        # no primary at all for a while: every request is answered 503, none hangs
        wait_for(lambda: time.monotonic() - stopped_at > down, down + 1, 0.05)
        pair.standby.promote()
        promoted_at = time.monotonic()

        first_publish = {}
        for broker in (a, b):
            at = wait_for(
                lambda broker=broker: _first_ok_after(ledger, broker.api, promoted_at),  # type: ignore[misc]
                FIND_SECONDS + 20,
                0.02,
                f"a publish through {broker.port} after the promotion",
            )
            first_publish[str(broker.port)] = at - promoted_at
        push_at = wait_for(
            lambda: _first_push_after(ledger, promoted_at), FIND_SECONDS + 20, 0.02, "push"
        )
        pull = {}
        for broker in (a, b):
            wait_for(
                lambda broker=broker: _pull_one(broker, ledger, parked.name),  # type: ignore[misc]
                FIND_SECONDS + 20,
                0.02,
                f"a pull through {broker.port}",
            )
            pull[str(broker.port)] = time.monotonic() - promoted_at
        ready = {}
        for broker in (a, b):
            with httpx.Client(base_url=broker.base_url, timeout=10) as ops:
                wait_for(lambda ops=ops: ops.get("/readyz").status_code == 200, 20, 0.05)  # type: ignore[misc]
            ready[str(broker.port)] = time.monotonic() - promoted_at
        # both LISTEN connections are on the new primary, where NOTIFYs now go
        wait_for(lambda: _listeners(pair) == 2, FIND_SECONDS + 5, 0.1, "LISTEN on the new primary")
        ready["listen"] = time.monotonic() - promoted_at

        # some load after the failover, then stop
        wait_for(lambda: time.monotonic() - promoted_at > after, after + 1, 0.05)
        stop.set()
        join_all([*pubs, *consumers, sampler], 60)
        with httpx.Client(base_url=a.api, auth=ADMIN, timeout=30) as api:
            retried = _retry_in_doubt(ledger, api)
        drain(ledger, b.ws_url, url, specs, timeout=30)
        report = check(ledger, specs, remaining_rows(url, names))
        _assert_no_server_errors([a, b])
        assert a.alive()
        assert b.alive()

    statuses: dict[str, int] = {}
    slowest = 0.0
    for p in ledger.publishes.values():
        if p.invoked_at + (p.seconds or 0) > stopped_at and p.invoked_at < promoted_at:
            key = f"{p.outcome}:{p.status}"
            statuses[key] = statuses.get(key, 0) + 1
            slowest = max(slowest, p.seconds or 0)
    # whatever met the outage was answered 200 (after the promotion) or 503, never a 500 or a
    # dropped connection
    assert all(p.status in (200, 503) for p in ledger.publishes.values()), statuses
    # the outage was felt: publishes met it (answered 503, or 200 once their commit in doubt
    # was found on the new primary)
    assert statuses, "no publish met the outage"
    result = Failover(
        report,
        ledger,
        stopped_at,
        promoted_at,
        first_publish,
        push_at - promoted_at,
        pull,
        ready,
        retried,
        statuses,
        slowest,
        fence,
    )
    print(_describe(pair, result))
    assert max(first_publish.values()) < FIND_SECONDS, first_publish
    assert result.push < FIND_SECONDS, result.push
    assert max(pull.values()) < FIND_SECONDS, pull
    assert slowest < ANSWER_BOUND, slowest  # answered, never left hanging
    return result


def _listeners(pair: ReplicaPair) -> int:
    rows = pair.standby.query(
        "SELECT count(*) AS n FROM pg_stat_activity WHERE application_name = 'messagex-listener'"
    )
    return int(rows[0]["n"])


def _assert_no_server_errors(started: list[BrokerProc]) -> None:
    """No driver error the broker did not take for unavailability (it would answer 500), and
    no traceback: a failover is an expected event, logged as warnings."""
    for broker in started:
        log = broker.log_text()
        assert "database error" not in log, log[-4000:]
        assert "Traceback" not in log, log[-4000:]


def _describe(pair: ReplicaPair, r: Failover) -> str:
    kind = "synchronous" if pair.synchronous else "asynchronous"
    kind += " standby, " + ("old primary fenced" if r.fenced else "old primary stopped")
    ok = r.ledger.count("ok")
    times = ", ".join(f"{port}: {s:.2f} s" for port, s in r.first_publish.items())
    ready = ", ".join(f"{port}: {s:.2f} s" for port, s in r.ready.items())
    pull = ", ".join(f"{port}: {s:.2f} s" for port, s in r.pull.items())
    return (
        f"failover ({kind}): {ok} publishes confirmed; after the promotion the first "
        f"200 per broker {times}; push {r.push:.2f} s; pull+ack {pull}; /readyz {ready}; "
        f"outcomes of the publishes that met the outage {r.statuses}, slowest answer "
        f"{r.slowest:.2f} s; {r.retried} in doubt published again; "
        f"{r.report.summary()}"
    )


def _mid(entry: str) -> str:
    """The message id a checker entry is about (entries start with it)."""
    return re.split(r"[: ]", entry, maxsplit=1)[0]


def _confirmed_at(ledger: Ledger, mid: str) -> list[float]:
    """When anything about ``mid`` was confirmed to a client: its publish answered, its
    deliveries' settles answered."""
    with ledger.lock:
        times = []
        pub = ledger.publishes.get(mid)
        if pub is not None and pub.seconds is not None:
            times.append(pub.invoked_at + pub.seconds)
        times += [d.settled_at for d in ledger.deliveries if d.message_id == mid and d.settled_at]
        times += [d.at for d in ledger.deliveries if d.message_id == mid]
    return times


@pytest.mark.timeout(120)
def test_failover_synchronous_standby_loses_nothing(logs: Path) -> None:
    with replica_pair(synchronous=True) as pair:
        result = run_failover(pair, logs, load=1500)
    assert result.report.clean, result.report.summary()


@pytest.mark.timeout(120)
def test_failover_fenced_primary(logs: Path) -> None:
    """The old primary stays up but read-only (fenced) while the standby is promoted: the
    brokers' pooled connections to it get "cannot execute ... in a read-only transaction"
    (503), are dropped, and new ones find the new primary; the LISTEN connection moves too."""
    with replica_pair(synchronous=False) as pair:
        result = run_failover(pair, logs, load=1500, fence=True)
    assert result.report.clean, result.report.summary()


@pytest.mark.slow
def test_failover_asynchronous_standby_loss_is_bounded(logs: Path) -> None:
    with replica_pair(synchronous=False) as pair:
        result = run_failover(pair, logs, load=1500)
    _assert_async_loss_bounded(result)


def _assert_async_loss_bounded(result: Failover, window: float = ASYNC_WINDOW_SECONDS) -> None:
    """What an asynchronous standby may lose is what was confirmed just before the stop:
    every violation is about a message confirmed (published, delivered or settled) within
    ``ASYNC_WINDOW_SECONDS`` before it. Measured, not required to be zero."""
    report = result.report
    window_start = result.stopped_at - window
    outside = []
    for name in report.VIOLATIONS:
        for entry in getattr(report, name):
            times = _confirmed_at(result.ledger, _mid(entry))
            if not any(window_start <= t <= result.stopped_at + 0.5 for t in times):
                outside.append(f"{name}: {entry}")
    print(
        f"asynchronous standby: {len(report.lost)} confirmed publishes lost, "
        f"{sum(len(getattr(report, n)) for n in report.VIOLATIONS)} violations in all, "
        f"{len(outside)} outside the {window:.0f} s before the stop"
    )
    assert not outside, outside[:10]


@pytest.mark.slow
def test_failover_lagging_asynchronous_standby_loses_its_lag(logs: Path) -> None:
    """The standby's stream held for LAG_SECONDS before the stop, as a standby behind a slow
    link or a busy disk falls behind: the failover loses what it had not received (publishes
    answered 200, ACKs, claims), and only that. The checker must see the loss."""
    with replica_pair(synchronous=False, relay=True) as pair:
        result = run_failover(pair, logs, load=1500, lag=LAG_SECONDS)
    _assert_async_loss_bounded(result, LAG_SECONDS + ASYNC_WINDOW_SECONDS)
    assert result.report.lost, result.report.summary()  # the parked queue's, at least


@pytest.mark.slow
@pytest.mark.parametrize("synchronous", [True, False], ids=["sync", "async"])
def test_failover_long(logs: Path, synchronous: bool) -> None:
    with replica_pair(synchronous=synchronous) as pair:
        result = run_failover(pair, logs, load=20000, before=20, down=5, after=20)
    if synchronous:
        assert result.report.clean, result.report.summary()
    else:
        _assert_async_loss_bounded(result)
