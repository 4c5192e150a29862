"""The benchmark harness end to end in smoke mode: it starts a broker of its own on a scratch
database, runs every MessageX group with tiny counts (RabbitMQ skipped), prints a table and
writes JSON whose scenarios carry positive rates and latencies."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from bench.infra import DEFAULT_DATABASE_URL

ROOT = Path(__file__).resolve().parents[2]

THROUGHPUT_GROUPS = ("ceiling", "messagex", "groupcommit")
#: ceiling 3 batches x 2 connection counts; MessageX 2 publish modes x 3 prefetches x (ws, pull);
#: single publishes from many clients with group commit on and off
EXPECTED_COUNTS = {"ceiling": 6, "messagex": 16, "groupcommit": 2}


def run_smoke(out: Path) -> tuple[int, str, str]:
    # A generous per-scenario deadline so that a loaded machine does not make the test flaky,
    # and --fail-fast so that a broken broker costs one deadline, not one per scenario.
    args = ["all", "--smoke", "--no-rabbitmq", "--fail-fast", "--deadline", "60"]
    return run_bench([*args, "--json", str(out)], timeout=420, database_prefix="mx_bench_")


def run_bench(args: list[str], *, timeout: float, database_prefix: str) -> tuple[int, str, str]:
    """``python -m bench *args`` on the tests' server; (exit code, stdout, stderr). A run past
    ``timeout`` is killed, its database (``<database_prefix><pid>``) dropped, the test
    failed."""
    cmd = [sys.executable, "-m", "bench", *args]
    url = os.environ.get("MESSAGEX_TEST_DATABASE_URL")
    if url:
        cmd += ["--database-url", url]
    with subprocess.Popen(
        cmd,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
    ) as proc:
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()  # the broker it started gets SIGTERM (PR_SET_PDEATHSIG)
            stdout, stderr = proc.communicate()
            drop_database(url, f"{database_prefix}{proc.pid}")
            pytest.fail(
                f"{' '.join(args[:1])} did not finish in {timeout:.0f} s:\n{stderr[-6000:]}"
            )
        return proc.returncode, stdout, stderr


def drop_database(url: str | None, name: str) -> None:
    """What a killed run leaves behind (a normal run drops its database itself)."""

    async def drop() -> None:
        conn = await asyncpg.connect(url or DEFAULT_DATABASE_URL, timeout=5)
        try:
            await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            await conn.close()

    # Best effort: the server may have been an embedded one that is gone with the run.
    with contextlib.suppress(Exception):
        asyncio.run(drop())


# One smoke run serves every test here. Session scope: under pytest-xdist the tests of this
# file run on one worker (the "processes" group, tests/conftest.py), but other files' tests
# may come between them there, and a module fixture would run the bench again each time.
# Whichever test runs first pays for the run (about 3 minutes on the 2-core VM).
pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="session")
def smoke(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], str]:
    out = tmp_path_factory.mktemp("bench") / "smoke.json"
    code, stdout, stderr = run_smoke(out)
    assert code == 0, stdout[-4000:] + stderr[-4000:]
    return json.loads(out.read_text()), stdout


def by_group(doc: dict[str, Any], group: str) -> list[dict[str, Any]]:
    return [s for s in doc["scenarios"] if s["group"] == group]


def test_smoke_run_measures_every_throughput_scenario(smoke: tuple[dict[str, Any], str]) -> None:
    doc, _ = smoke
    assert set(doc) == {"meta", "scenarios", "ratios"}
    meta = doc["meta"]
    assert meta["mode"] == "smoke"
    assert meta["message_bytes"] == 1024
    assert meta["rabbitmq"]["skipped"]
    for group in THROUGHPUT_GROUPS:
        scenarios = by_group(doc, group)
        assert len(scenarios) == EXPECTED_COUNTS[group], [s["name"] for s in scenarios]
        for s in scenarios:
            assert s["status"] == "ok", s
            assert s["messages"] == meta["count"], s
            assert s["rate"] > 0, s
            assert s["elapsed_s"] > 0, s
            assert set(s["latency_ms"]) >= {"p50", "p95", "p99"}, s
            assert 0 < s["latency_ms"]["p50"] <= s["latency_ms"]["p95"] <= s["latency_ms"]["p99"]
            assert set(s["cpu_s_per_1k"]) == {"broker", "postgres", "client"}, s
            # CPU times tick in 10 ms: one tiny scenario may read 0, a whole group may not.
            assert all(v is not None and v >= 0 for v in s["cpu_s_per_1k"].values()), s
        assert sum(s["cpu_s_per_1k"]["postgres"] for s in scenarios) > 0
    assert sum(s["cpu_s_per_1k"]["broker"] for s in by_group(doc, "messagex")) > 0


def test_smoke_run_reports_idle_backlog_ratios_and_a_table(
    smoke: tuple[dict[str, Any], str],
) -> None:
    doc, stdout = smoke
    (idle,) = by_group(doc, "idle")  # RabbitMQ skipped: MessageX only
    assert idle["status"] == "ok"
    assert idle["latency_ms"]["p50"] > 0
    assert idle["latency_ms"]["n"] == doc["meta"]["idle_count"]
    backlog = by_group(doc, "backlog")
    sizes = {s["params"]["backlog"] for s in backlog}
    assert sizes == set(doc["meta"]["backlog_sizes"])
    assert 1_000_000 not in sizes  # off in smoke mode
    assert {s["params"]["probe"] for s in backlog} == {"http-get", "sql-claim", "ws-delivery"}
    assert {s["params"]["where"] for s in backlog} == {"none", "other", "same"}
    for s in backlog:
        assert s["status"] == "ok", s
        assert s["latency_ms"]["p50"] > 0, s
    baselines = {r["baseline"] for r in doc["ratios"]}
    assert baselines == {
        "ceiling batch=1 connections=4",
        "ceiling batch=100 connections=4",
        "mx publish single clients=32 group_commit=off",
    }
    for r in doc["ratios"]:
        assert r["rate"] > 0, r
    assert "ceiling batch=1 connections=1" in stdout
    assert "mx ws publish=batch prefetch=100" in stdout


def test_smoke_run_measures_the_scale_group(smoke: tuple[dict[str, Any], str]) -> None:
    doc, stdout = smoke
    scale = {s["name"]: s for s in by_group(doc, "scale")}
    bindings = [
        f"mx {kind} bindings={n}" for kind in ("topic", "direct", "headers") for n in (10, 1000)
    ]
    resources = [
        "mx declare queues=200",
        "mx list queues=2000 page=first",
        "mx list queues=2000 page=middle",
        "mx overview messages=10000 queues=100",
    ]
    idle = [
        "scale idle ws connections=200 queues=200",
        "scale idle ws connections=100 queues=200",
        "scale delayed messages=400 over=4s",
        "scale paced ws messages=200 over=2s",
        "scale busy queues=2",
        "scale busy queues=20",
    ]
    assert set(scale) == set(bindings + resources + idle), sorted(scale)
    for s in scale.values():
        assert s["status"] == "ok", s
        assert s["latency_ms"]["p50"] > 0, s
    for name in bindings:
        ratio = scale[name]["extra"]["p50_ratio_to_10"]
        assert ratio == 1.0 if name.endswith("=10") else ratio > 0, (name, ratio)
    assert scale["mx declare queues=200"]["elapsed_s"] > 0
    assert scale["scale busy queues=2"]["extra"]["busy_ratio"] == 1.0
    paced = scale["scale paced ws messages=200 over=2s"]
    assert paced["messages"] == 200, paced
    assert paced["extra"]["server_cpu_percent"] > 0, paced
    assert scale["scale busy queues=20"]["extra"]["busy_ratio"] > 0
    spent = scale["scale idle ws connections=200 queues=200"]["extra"]["idle_cpu_seconds"]
    assert spent["broker"] > 0, spent
    assert spent["postgres_backends"] is not None, spent
    assert "scale (issue 19)" in stdout


def test_smoke_run_measures_the_limits_group(smoke: tuple[dict[str, Any], str]) -> None:
    """Issue 20 (bench/limits.py): drop-head and plain publish rates, a limited queue under
    the headline load, and claims from a priority and a plain backlog (RabbitMQ skipped)."""
    doc, _ = smoke
    limits = {s["name"]: s for s in by_group(doc, "limits")}
    assert set(limits) == {
        "limits mx publish=batch queue=plain",
        "limits mx publish=batch queue=max-length drop-head",
        "limits mx publish=batch queue=dedup-window",
        "limits mx ws publish=batch prefetch=100 max-length=10000000",
        "limits mx claim backlog=2000 queue=plain",
        "limits mx claim backlog=2000 queue=x-max-priority=9",
    }, sorted(limits)
    for s in limits.values():
        assert s["status"] == "ok", s
    assert limits["limits mx publish=batch queue=max-length drop-head"]["rate"] > 0
    assert limits["limits mx publish=batch queue=dedup-window"]["extra"]["rate_ratio_to_plain"] > 0
    assert (
        limits["limits mx claim backlog=2000 queue=x-max-priority=9"]["extra"]["p50_ratio_to_plain"]
        > 0
    )


def test_smoke_run_measures_expiry_beside_delivery(smoke: tuple[dict[str, Any], str]) -> None:
    doc, stdout = smoke
    expiry = {s["name"]: s for s in by_group(doc, "expiry")}
    assert set(expiry) == {"mx expire 2000", "mx deliver 2000"}, sorted(expiry)
    for s in expiry.values():
        assert s["status"] == "ok", s
        assert s["messages"] == 2000
        assert s["rate"] > 0
    ratios = expiry["mx expire 2000"]["extra"]["cpu_vs_delivery"]
    assert set(ratios) >= {"broker", "postgres", "server"}, ratios
    assert "expiry vs delivery (issue 20)" in stdout


def test_smoke_run_moves_and_deletes_by_filter_beside_a_busy_queue(
    smoke: tuple[dict[str, Any], str],
) -> None:
    doc, stdout = smoke
    ops = {s["name"]: s for s in by_group(doc, "filterops")}
    assert set(ops) == {"mx move 2000", "mx delete 2000"}, sorted(ops)
    assert ops["mx move 2000"]["extra"]["answer"] == {"matched": 2000, "moved": 2000, "skipped": 0}
    assert ops["mx delete 2000"]["extra"]["answer"] == {"matched": 2000, "deleted": 2000}
    for s in ops.values():
        assert s["status"] == "ok", s
        assert s["elapsed_s"] > 0
        assert s["extra"]["publish_ratio"] > 0
        assert s["extra"]["consume_ratio"] > 0
    assert "by filter, beside a busy queue (issue 22)" in stdout


def test_smoke_run_measures_message_groups(smoke: tuple[dict[str, Any], str]) -> None:
    """Issue 22 (bench/groups.py): a plain, a 10,000-group and a 10-group backlog, through the
    broker and for the claim statement alone, with ratios to the plain queue."""
    doc, _ = smoke
    groups = {s["name"]: s for s in by_group(doc, "groups")}
    kinds = ("plain", "groups=10000", "groups=10")
    assert set(groups) == {
        f"groups {probe} backlog=2000 queue={kind}"
        for probe in ("mx ws", "sql claim")
        for kind in kinds
    }, sorted(groups)
    for s in groups.values():
        assert s["status"] == "ok", s
        assert s["rate"] > 0
    for probe in ("mx ws", "sql claim"):
        assert (
            groups[f"groups {probe} backlog=2000 queue=groups=10000"]["extra"][
                "rate_ratio_to_plain"
            ]
            > 0
        )
