"""Publish latency against a running broker: single messages and batches of 100.

    python bench/publish_latency.py --url http://127.0.0.1:8000 --user guest --password guest

Declares a durable queue bound to ``amq.direct`` (key ``bench``), measures ``-n`` sequential
single-message publishes and ``-n / 10`` sequential batch publishes (100 messages each) over
one keep-alive connection, prints p50/p95/p99, then deletes the queue (and its messages).
Each publish is a publisher confirm: the 200 arrives after the commit.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from collections.abc import Callable

import httpx

BATCH = 100


def percentile(samples: list[float], p: float) -> float:
    ordered = sorted(samples)
    index = min(len(ordered) - 1, max(0, round(p / 100 * len(ordered)) - 1))
    return ordered[index]


def report(name: str, samples: list[float], messages_per_call: int) -> None:
    ms = [s * 1000 for s in samples]
    total = sum(samples)
    rate = len(samples) * messages_per_call / total if total else 0.0
    print(
        f"{name:<22} n={len(ms):<6} p50={percentile(ms, 50):7.2f} ms  "
        f"p95={percentile(ms, 95):7.2f} ms  p99={percentile(ms, 99):7.2f} ms  "
        f"mean={statistics.fmean(ms):7.2f} ms  ({rate:,.0f} msg/s sequential)"
    )


def measure(call: Callable[[], httpx.Response], count: int, warmup: int) -> list[float]:
    for _ in range(warmup):
        call().raise_for_status()
    samples: list[float] = []
    for _ in range(count):
        started = time.perf_counter()
        response = call()
        samples.append(time.perf_counter() - started)
        if response.status_code != 200:
            sys.exit(f"publish failed: {response.status_code} {response.text}")
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000", help="broker base URL")
    parser.add_argument("--user", default="guest")
    parser.add_argument("--password", default="guest")
    parser.add_argument("-n", type=int, default=1000, help="single publishes (batches: n/10)")
    args = parser.parse_args()

    queue = f"bench-{uuid.uuid4().hex[:8]}"
    body = {"order": 12345, "items": ["a", "b", "c"], "note": "x" * 100}
    single = {"routing_key": "bench", "body": body}
    batch = {"messages": [single] * BATCH}
    base = args.url.rstrip("/") + "/api/v1"
    with httpx.Client(base_url=base, auth=(args.user, args.password), timeout=30) as http:
        http.put(f"/queues/{queue}", json={}).raise_for_status()
        try:
            http.post(
                "/bindings", json={"exchange": "amq.direct", "queue": queue, "routing_key": "bench"}
            ).raise_for_status()
            singles = measure(
                lambda: http.post("/exchanges/amq.direct/publish", json=single),
                args.n,
                warmup=min(50, args.n),
            )
            batches = measure(
                lambda: http.post("/exchanges/amq.direct/publish-batch", json=batch),
                max(1, args.n // 10),
                warmup=min(5, args.n),
            )
            direct = measure(
                lambda: http.post(f"/queues/{queue}/messages", json={"body": body}),
                args.n,
                warmup=min(50, args.n),
            )
        finally:
            http.delete(f"/queues/{queue}")
    report("publish (1 message)", singles, 1)
    report("publish to queue", direct, 1)
    report(f"publish-batch ({BATCH})", batches, BATCH)


if __name__ == "__main__":
    main()
