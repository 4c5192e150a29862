"""The command line and the run: provision, run the chosen groups, tear down, report.

``python -m bench all`` runs, in this order: the raw-SQL ceiling, MessageX end to end
(WebSocket and HTTP pull), RabbitMQ, idle latency, backlog behaviour. Every scenario is
bounded by a hard deadline and every target is on loopback.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import functools
import os
import platform
import re
import sys
import time
import traceback
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from app.server import tune_gc
from app.storage.fastpath import use_fast_array_checks
from bench import (
    backlog,
    brokers,
    ceiling,
    expiry,
    filterops,
    groupcommit,
    groups,
    limits,
    mx,
    pooler,
    rabbit,
    report,
    scale,
    scale_idle,
    sqlpublish,
)
from bench.infra import (
    DEFAULT_DATABASE_URL,
    DEFAULT_RABBITMQ_URL,
    ROOT,
    BrokerProcess,
    Meters,
    Postgres,
    PostgresSampler,
    beam_sample,
    self_sample,
    tree_sample,
)
from bench.stats import MESSAGE_BYTES, BenchError, Result, scenario_name

GROUPS = (
    "ceiling",
    "messagex",
    "groupcommit",
    "rabbitmq",
    "idle",
    "backlog",
    "scale",
    "limits",
    "expiry",
    "filterops",
    "groups",
    "sqlpublish",
)
#: groups only run when named (not by ``all``): ``pooler`` needs /usr/sbin/pgbouncer,
#: ``brokers`` /usr/sbin/haproxy and two more broker processes
NAMED_ONLY = ("pooler", "brokers")
NEEDS_BROKER = {
    "ceiling",
    "messagex",
    "groupcommit",
    "idle",
    "backlog",
    "scale",
    "limits",
    "expiry",
    "filterops",
    "groups",
    "sqlpublish",
    "pooler",
    "brokers",
}
NEEDS_RABBITMQ = {"rabbitmq", "idle", "scale", "limits", "expiry"}

CEILING_BATCHES = (1, 10, 100)
CEILING_CONNECTIONS = (1, 4)
PUBLISH_MODES = ("single", "batch")
PREFETCHES = (1, 10, 100)
#: batch publishes with consumers that ack in groups (ack=batch), beside the per-message acks
ACK_BATCHED_PREFETCHES = (10, 100)

#: (full, smoke) defaults
DEFAULTS: dict[str, tuple[Any, Any]] = {
    "count": (2000, 60),
    "deadline": (120.0, 10.0),
    "idle_count": (500, 50),
    "probes": (200, 10),
    "backlog_sizes": ([0, 100_000, 1_000_000], [0, 2_000]),
    # the scale group (issue 19)
    "binding_sizes": ([10, 1_000, 10_000, 100_000], [10, 1_000]),
    "headers_sizes": ([10, 10_000], [10, 1_000]),
    "scale_probes": (200, 20),
    "declare_queues": (10_000, 200),
    "list_queues": (100_000, 2_000),
    "overview": ((1_000_000, 10_000), (10_000, 100)),
    "expiry_count": (100_000, 2_000),  # issue 20: copies expired vs delivered
    "filterops_count": (100_000, 2_000),  # issue 22: copies moved, then deleted, by filter
}


def ws_scenarios() -> list[tuple[str, int, str]]:
    """(publish mode, prefetch, ack mode) of the WebSocket scenarios, run alike for MessageX
    and RabbitMQ: every prefetch with per-message acks, and batch publishes with grouped acks."""
    each = [(mode, prefetch, "each") for mode in PUBLISH_MODES for prefetch in PREFETCHES]
    return each + [("batch", prefetch, "batch") for prefetch in ACK_BATCHED_PREFETCHES]


def pull_scenarios() -> list[tuple[str, int, str]]:
    """(publish mode, max_messages, ack mode) of the pull scenarios: an ack request per
    delivery for every size, and one POST /deliveries/ack per get for batch publishes."""
    each = [(mode, size, "each") for mode in PUBLISH_MODES for size in PREFETCHES]
    return each + [("batch", size, "batch") for size in ACK_BATCHED_PREFETCHES]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bench",
        description="MessageX vs the raw-SQL ceiling vs RabbitMQ, in one run (loopback only).",
    )
    p.add_argument("group", nargs="?", default="all", choices=("all", *GROUPS, *NAMED_ONLY))
    p.add_argument("--smoke", action="store_true", help="tiny counts, 10 s deadlines, no 1 M")
    p.add_argument("--count", type=int, help="messages per throughput scenario (2000; smoke 60)")
    p.add_argument("--json", type=Path, default=ROOT / "bench" / "results" / "latest.json")
    p.add_argument("--database-url", default=DEFAULT_DATABASE_URL, help="a loopback PostgreSQL")
    p.add_argument("--rabbitmq-url", default=DEFAULT_RABBITMQ_URL, help="a loopback RabbitMQ")
    p.add_argument("--no-rabbitmq", action="store_true", help="skip every RabbitMQ scenario")
    p.add_argument(
        "--backlog-1m",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="include the 1 M-message backlog (default: on in full mode, off in smoke mode)",
    )
    p.add_argument("--publishers", type=int, default=4, help="concurrent publishers (4)")
    p.add_argument("--workers", type=int, default=1, help="broker processes (messagex serve)")
    p.add_argument(
        "--broker-env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra environment for the broker, e.g. MESSAGEX_PUBLISH_GROUP_MAX=1",
    )
    p.add_argument("--consumers", type=int, default=2, help="consumers per scenario (2)")
    p.add_argument(
        "--gc-clients",
        type=int,
        default=groupcommit.CLIENTS,
        help=f"concurrent publishers in the group-commit scenarios ({groupcommit.CLIENTS})",
    )
    p.add_argument("--deadline", type=float, help="hard limit per scenario, s (120; smoke 10)")
    p.add_argument("--idle-count", type=int, help="messages in the idle test (500; smoke 50)")
    p.add_argument("--probes", type=int, help="claims per backlog probe (200; smoke 10)")
    p.add_argument(
        "--scale-probes", type=int, help="timed calls per scale scenario (200; smoke 20)"
    )
    p.add_argument(
        "--binding-sizes",
        type=lambda text: [int(n) for n in text.split(",")],
        help="bindings per exchange in the scale group (10,1000,10000,100000; smoke 10,1000)",
    )
    p.add_argument(
        "--fail-fast", action="store_true", help="stop at the first scenario that is not ok"
    )
    p.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="run the selected scenarios this many times, round after round; ratios are "
        "computed per round and summarised by their median (1)",
    )
    p.add_argument(
        "--backlog",
        type=int,
        help="copies per queue in the groups scenarios (1,000,000; smoke 2,000)",
    )
    p.add_argument(
        "--only",
        metavar="REGEX",
        help="run only the scenarios whose name matches, e.g. 'batch.*prefetch=100'",
    )
    return p


#: the groups whose scenarios use the bench database's messages table
ON_POSTGRES = frozenset(
    {
        "ceiling",
        "messagex",
        "groupcommit",
        "idle",
        "limits",
        "expiry",
        "filterops",
        "groups",
        "sqlpublish",
        "pooler",
        "brokers",
    }
)


class Deferred:
    """An awaitable that makes its coroutine only when awaited: ``Run.scenario`` closes a
    skipped one (``close``) without a coroutine ever being made."""

    def __init__(self, make: Callable[[], Awaitable[Any]]) -> None:
        self._make = make

    def __await__(self) -> Any:
        return self._make().__await__()

    def close(self) -> None:
        """Nothing was made: nothing to close."""


@dataclass
class Config:
    groups: list[str]
    smoke: bool
    count: int
    deadline: float
    idle_count: int
    probes: int
    backlog_sizes: list[int]
    publishers: int
    consumers: int
    database_url: str
    rabbitmq_url: str
    no_rabbitmq: bool
    json_path: Path
    fail_fast: bool = False
    workers: int = 1
    broker_env: dict[str, str] = field(default_factory=dict)
    only: str | None = None
    gc_clients: int = groupcommit.CLIENTS
    rounds: int = 1
    binding_sizes: list[int] = field(default_factory=list)
    headers_sizes: list[int] = field(default_factory=list)
    scale_probes: int = 200
    declare_queues: int = 10_000
    list_queues: int = 100_000
    overview: tuple[int, int] = (1_000_000, 10_000)
    #: copies per queue in the groups scenarios (None: bench/groups.py's default)
    group_backlog: int | None = None

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Config:
        pick = 1 if args.smoke else 0

        def value(name: str) -> Any:
            given = getattr(args, name, None)
            return DEFAULTS[name][pick] if given is None else given

        sizes = list(value("backlog_sizes"))
        with_1m = (not args.smoke) if args.backlog_1m is None else args.backlog_1m
        if not with_1m:
            sizes = [n for n in sizes if n < 1_000_000]
        elif 1_000_000 not in sizes:
            sizes.append(1_000_000)
        if min(value("count"), args.publishers, args.consumers, args.rounds) < 1:
            raise BenchError("--count, --publishers, --consumers and --rounds must be at least 1")
        return cls(
            groups=list(GROUPS) if args.group == "all" else [args.group],
            smoke=args.smoke,
            count=value("count"),
            deadline=value("deadline"),
            idle_count=value("idle_count"),
            probes=value("probes"),
            backlog_sizes=sizes,
            publishers=args.publishers,
            consumers=args.consumers,
            database_url=args.database_url,
            rabbitmq_url=args.rabbitmq_url,
            no_rabbitmq=args.no_rabbitmq,
            json_path=args.json,
            fail_fast=args.fail_fast,
            workers=args.workers,
            broker_env=dict(kv.split("=", 1) for kv in args.broker_env),
            only=args.only,
            gc_clients=args.gc_clients,
            rounds=args.rounds,
            binding_sizes=value("binding_sizes"),
            headers_sizes=DEFAULTS["headers_sizes"][pick],
            scale_probes=value("scale_probes"),
            declare_queues=DEFAULTS["declare_queues"][pick],
            list_queues=DEFAULTS["list_queues"][pick],
            overview=DEFAULTS["overview"][pick],
            group_backlog=args.backlog,
        )


@dataclass
class Run:
    """One run's state: what it started (to tear down) and what it measured."""

    cfg: Config
    pg: Postgres | None = None
    broker: BrokerProcess | None = None
    client: mx.Mx | None = None
    rabbit_skipped: str | None = None
    results: list[Result] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)
    round: int = 1

    # -- meters -----------------------------------------------------------------------------

    def mx_meters(self, broker: BrokerProcess | None = None) -> Meters:
        samplers: dict[str, Callable[[], dict[int, float]]] = {}
        broker = broker or self.broker
        if broker is not None and broker.pid is not None:
            pid = broker.pid
            samplers["broker"] = lambda: tree_sample(pid)
        if self.pg is not None and self.pg.info.get("postmaster_pid"):
            postmaster, dbname = self.pg.info["postmaster_pid"], self.pg.dbname
            samplers["postgres"] = PostgresSampler(postmaster, dbname)
        samplers["client"] = self_sample
        return Meters(samplers)

    def rabbit_meters(self) -> Meters:
        return Meters({"rabbitmq": beam_sample, "client": self_sample})

    def mx_settings(self) -> mx.Settings:
        assert self.client is not None
        c = self.cfg
        return mx.Settings(
            self.client, self.mx_meters(), c.count, c.publishers, c.consumers, c.deadline, c.workers
        )

    def rabbit_settings(self) -> rabbit.Settings:
        c = self.cfg
        return rabbit.Settings(
            c.rabbitmq_url, self.rabbit_meters(), c.count, c.publishers, c.consumers, c.deadline
        )

    # -- running scenarios ------------------------------------------------------------------

    async def scenario(self, group: str, name: str, work: Awaitable[Any]) -> None:
        """Run one scenario (or a batch of them); a failure is recorded, not fatal."""
        if self.cfg.only and not re.search(self.cfg.only, name):
            work.close()  # type: ignore[attr-defined]
            return
        print(f"… {name}", file=sys.stderr, flush=True)
        if self.broker is not None and not self.broker.running():
            work.close()  # type: ignore[attr-defined]
            self._failed(group, name, "broker died")
            return
        if self.pg is not None and group in ON_POSTGRES:
            # Every scenario starts on a vacuumed table: none pays for cleaning up the dead
            # rows of the one before (autovacuum still runs during it, as it would).
            await self.pg.vacuum_messages()
        started = time.monotonic()
        try:
            outcome = await work
        except Exception as exc:
            detail = str(exc) or type(exc).__name__
            if not isinstance(exc, BenchError):
                traceback.print_exc(file=sys.stderr)
            self._failed(group, name, detail[:500])
        else:
            wall = round(time.monotonic() - started, 2)
            print(f"  done in {wall} s", file=sys.stderr, flush=True)
            for result in outcome if isinstance(outcome, list) else [outcome]:
                result.extra["round"] = self.round
                result.extra["loadavg_1m"] = round(os.getloadavg()[0], 2)
                result.extra.setdefault("wall_s", wall)
                self.results.append(result)
        failed = [r for r in self.results if r.status != "ok"]
        if self.cfg.fail_fast and failed:
            raise BenchError(f"--fail-fast: {failed[0].name} is {failed[0].status}")

    def _failed(self, group: str, name: str, note: str) -> None:
        self.results.append(
            Result(group, name, {}, status="error", note=note, extra={"round": self.round})
        )

    async def run_ceiling(self) -> None:
        assert self.pg is not None
        c = self.cfg
        settings = ceiling.Settings(self.pg.url, self.mx_meters(), c.count, c.deadline)
        for conns in CEILING_CONNECTIONS:
            for batch in CEILING_BATCHES:
                name = f"ceiling batch={batch} connections={conns}"
                await self.scenario("ceiling", name, ceiling.run(settings, batch, conns))

    async def run_messagex(self) -> None:
        settings = self.mx_settings()
        for mode, prefetch, ack in ws_scenarios():
            name = scenario_name("mx ws", mode, prefetch, ack)
            work = mx.ws_throughput(settings, mode, prefetch, ack)
            await self.scenario("messagex", name, work)
        for mode, max_messages, ack in pull_scenarios():
            name = scenario_name("mx pull", mode, max_messages, ack, "max_messages")
            work = mx.pull_throughput(settings, mode, max_messages, ack)
            await self.scenario("messagex", name, work)

    async def run_groupcommit(self) -> None:
        """The same single-publish load on this run's broker (group commit on) and on a
        second broker on the same database with MESSAGEX_PUBLISH_GROUP_MAX=1."""
        assert self.pg is not None
        assert self.broker is not None
        c = self.cfg
        settings = groupcommit.Settings(c.count, c.gc_clients, c.deadline)
        off = BrokerProcess(
            self.pg.url,
            user=self.broker.user,
            password=self.broker.password,
            workers=c.workers,
            extra_env={**c.broker_env, "MESSAGEX_PUBLISH_GROUP_MAX": "1"},
        )
        await off.start()
        try:
            for broker, grouped in ((self.broker, True), (off, False)):
                mode = "on" if grouped else "off"
                name = f"mx publish single clients={c.gc_clients} group_commit={mode}"
                meters = self.mx_meters(broker)
                work = groupcommit.publish_load(settings, broker, meters, name, grouped)
                await self.scenario("groupcommit", name, work)
        finally:
            await off.stop()
            off.cleanup()

    async def run_rabbitmq(self) -> None:
        if self.rabbit_skipped:
            return
        settings = self.rabbit_settings()
        for mode, prefetch, ack in ws_scenarios():
            name = scenario_name("rabbitmq", mode, prefetch, ack)
            work = rabbit.throughput(settings, mode, prefetch, ack)
            await self.scenario("rabbitmq", name, work)

    async def run_idle(self) -> None:
        n = self.cfg.idle_count
        await self.scenario("idle", "mx idle", mx.idle_latency(self.mx_settings(), n))
        if not self.rabbit_skipped:
            work = rabbit.idle_latency(self.rabbit_settings(), n)
            await self.scenario("idle", "rabbitmq idle", work)

    async def run_backlog(self) -> None:
        assert self.pg is not None
        settings = backlog.Settings(
            self.mx_settings(), self.pg.url, self.cfg.backlog_sizes, self.cfg.probes
        )
        await self.scenario("backlog", "backlog", backlog.run(settings))

    async def run_expiry(self) -> None:
        assert self.pg is not None
        count = DEFAULTS["expiry_count"][1 if self.cfg.smoke else 0]
        settings = expiry.Settings(self.mx_settings(), self.pg.url, count)
        await self.scenario("expiry", "expiry mx", expiry.run(settings))
        if not self.rabbit_skipped:
            rabbit_settings = dataclasses.replace(self.rabbit_settings(), count=count)
            await self.scenario("expiry", "expiry rabbitmq", expiry.run_rabbit(rabbit_settings))

    async def run_filterops(self) -> None:
        assert self.pg is not None
        count = DEFAULTS["filterops_count"][1 if self.cfg.smoke else 0]
        settings = filterops.Settings(self.mx_settings(), self.pg.url, count)
        await self.scenario("filterops", "filterops", filterops.run(settings))

    async def run_scale(self) -> None:
        """Issue 19: bindings (MessageX beside RabbitMQ), many queues (declared, listed, and
        under a million messages in the overview), then idle subscriptions, delayed
        messages and many busy queues (bench/scale_idle.py)."""
        assert self.pg is not None
        assert self.client is not None
        c = self.cfg
        rabbit_url = None if self.rabbit_skipped else c.rabbitmq_url
        settings = scale.Settings(
            self.client,
            self.pg.url,
            rabbit_url,
            c.binding_sizes,
            c.headers_sizes,
            c.scale_probes,
            c.declare_queues,
            c.list_queues,
            c.overview[0],
            c.overview[1],
            c.deadline,
            self.mx_meters(),
        )
        deadline = max(c.deadline, 600.0)

        def bounded(work: Callable[[], Awaitable[Any]]) -> Awaitable[Any]:
            # made only for a scenario that runs: a coroutine made and never awaited (one
            # that --only skips) warns when it is collected
            return Deferred(lambda: asyncio.wait_for(work(), deadline))

        for kind, sizes in (
            ("topic", c.binding_sizes),
            ("direct", c.binding_sizes),
            ("headers", c.headers_sizes),
        ):
            for n in sizes:
                work = bounded(functools.partial(scale.mx_bindings, settings, kind, n))
                await self.scenario("scale", f"mx {kind} bindings={n}", work)
                if rabbit_url is not None:
                    work = bounded(functools.partial(scale.rabbit_bindings, settings, kind, n))
                    await self.scenario("scale", f"rabbitmq {kind} bindings={n}", work)
        scale.add_ratios(self.results)
        n = c.declare_queues
        work = bounded(lambda: scale.declare_queues(settings, n))
        await self.scenario("scale", f"mx declare queues={n}", work)
        work = bounded(lambda: scale.list_queues(settings, c.list_queues))
        await self.scenario("scale", f"mx list queues={c.list_queues}", work)
        messages, queues = c.overview
        work = bounded(lambda: scale.overview(settings, messages, queues))
        await self.scenario("scale", f"mx overview messages={messages} queues={queues}", work)
        await scale_idle.run(self)

    async def run_sqlpublish(self) -> None:
        await sqlpublish.run(self)  # issue 21, contract §18: bench/sqlpublish.py

    async def run_limits(self) -> None:
        await limits.run(self)  # issue 20, lc-limits: bench/limits.py

    async def run_groups(self) -> None:
        await groups.run(self)  # issue 22, contract §16: bench/groups.py

    async def run_pooler(self) -> None:
        await pooler.run(self)  # issue 23, item 3: behind PgBouncer: bench/pooler.py

    async def run_brokers(self) -> None:
        await brokers.run(self)  # issue 25: 1, 2, 3 brokers behind haproxy, bench/brokers.py

    # -- the whole run ----------------------------------------------------------------------

    async def provision(self) -> None:
        c = self.cfg
        if NEEDS_BROKER & set(c.groups):
            self.pg = await Postgres.provide(c.database_url)
            stale = await self.pg.drop_stale("mx_bench_")
            if stale:
                print(f"dropped databases of killed runs: {', '.join(stale)}", file=sys.stderr)
            await self.pg.create_database(f"mx_bench_{os.getpid()}")
            self.broker = BrokerProcess(
                self.pg.url,
                workers=c.workers,
                extra_env=c.broker_env,
            )
            await self.broker.start()
            self.client = mx.Mx(
                self.broker.base_url, self.broker.ws_url, self.broker.user, self.broker.password
            )
            await self.client.setup()
        if NEEDS_RABBITMQ & set(c.groups):
            if c.no_rabbitmq:
                self.rabbit_skipped = "--no-rabbitmq given"
            else:
                self.rabbit_skipped = await rabbit.unavailable(c.rabbitmq_url)
            if self.rabbit_skipped:
                print(f"RabbitMQ scenarios skipped: {self.rabbit_skipped}", file=sys.stderr)

    async def teardown(self) -> None:
        if self.client is not None:
            await self.client.close()
        if self.broker is not None:
            await self.broker.stop()
            self.broker.cleanup()
        if self.pg is not None:
            try:
                await self.pg.drop_database()
            finally:
                await asyncio.to_thread(self.pg.stop)

    async def execute(self) -> None:
        runners = {
            "ceiling": self.run_ceiling,
            "messagex": self.run_messagex,
            "groupcommit": self.run_groupcommit,
            "rabbitmq": self.run_rabbitmq,
            "idle": self.run_idle,
            "backlog": self.run_backlog,
            "scale": self.run_scale,
            "limits": self.run_limits,
            "expiry": self.run_expiry,
            "filterops": self.run_filterops,
            "groups": self.run_groups,
            "sqlpublish": self.run_sqlpublish,
            "pooler": self.run_pooler,
            "brokers": self.run_brokers,
        }
        started = time.monotonic()
        try:
            await self.provision()
            self.meta.update(self.describe())
            for number in range(1, self.cfg.rounds + 1):
                self.round = number
                if self.cfg.rounds > 1:
                    print(f"round {self.round} of {self.cfg.rounds}", file=sys.stderr, flush=True)
                for group in self.cfg.groups:
                    await runners[group]()
        finally:
            await self.teardown()
            if self.meta:
                self.meta["elapsed_s"] = round(time.monotonic() - started, 1)
                self.meta["machine"]["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]

    def describe(self) -> dict[str, Any]:
        c = self.cfg
        return {
            "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "command": " ".join(["python -m bench", *sys.argv[1:]]),
            "mode": "smoke" if c.smoke else "full",
            "groups": c.groups,
            "count": c.count,
            "rounds": c.rounds,
            "message_bytes": MESSAGE_BYTES,
            "publishers": c.publishers,
            "workers": c.workers,
            "broker_env": c.broker_env,
            "consumers": c.consumers,
            "publish_batch": mx.BATCH,
            "deadline_s": c.deadline,
            "idle_count": c.idle_count,
            "backlog_sizes": c.backlog_sizes,
            "backlog_probes": c.probes,
            "machine": {
                "cpu_count": os.cpu_count(),
                "platform": platform.platform(),
                "python": platform.python_version(),
                "loadavg_start": [round(x, 2) for x in os.getloadavg()],
            },
            "postgres": self.pg.info if self.pg else None,
            "broker": {"pid": self.broker.pid, "url": self.broker.base_url}
            if self.broker
            else None,
            "rabbitmq": {"url_host": "127.0.0.1", "skipped": self.rabbit_skipped},
            "cpu_accounting": (
                "CPU seconds (user+system, from /proc/<pid>/stat) per 1,000 messages, "
                "sampled before and after each scenario. broker: the messagex serve process "
                "tree. postgres: backends of the bench database plus the shared background "
                "processes (checkpointer, WAL writer, autovacuum, ...). rabbitmq: beam.smp. "
                "client: this harness (load generator; shares the machine)."
            ),
        }


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        cfg = Config.from_args(args)
    except BenchError as exc:
        print(f"bench: {exc}", file=sys.stderr)
        return 2
    run = Run(cfg)
    code = 0
    # The load generator shares the cores with what it measures: its collector is tuned as
    # the broker's is (for the MessageX and the RabbitMQ clients alike).
    tune_gc()
    # The ceiling's asyncpg encodes arrays as the broker's does (docs/performance.md).
    use_fast_array_checks()
    try:
        asyncio.run(run.execute())
    except BenchError as exc:
        print(f"bench: {exc}", file=sys.stderr)
        code = 1
    except KeyboardInterrupt:
        print("bench: interrupted", file=sys.stderr)
        code = 130
    if run.meta:
        ratio_rows = report.ratios(run.results)
        print(report.table(run.meta, run.results, ratio_rows))
        report.write_json(cfg.json_path, run.meta, run.results, ratio_rows)
        print(f"\nJSON written to {cfg.json_path}", file=sys.stderr)
    if code == 0 and any(r.status != "ok" for r in run.results):
        code = 1
    return code
