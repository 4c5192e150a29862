"""``--rounds``: ratios are taken within each round, then summarised by their median."""

from __future__ import annotations

from bench.report import ratios
from bench.stats import Result


def _mx(rate: float, number: int) -> Result:
    params = {"transport": "websocket", "publish": "batch", "prefetch": 100, "ack": "each"}
    return Result(
        "messagex",
        "mx ws publish=batch prefetch=100",
        params,
        rate=rate,
        cpu_s_per_1k={"broker": 0.08, "postgres": 0.09},
        extra={"round": number},
    )


def _ceiling(rate: float, number: int) -> Result:
    return Result(
        "ceiling",
        "ceiling batch=100 connections=4",
        {"batch": 100, "connections": 4},
        rate=rate,
        cpu_s_per_1k={"postgres": 0.08},
        extra={"round": number},
    )


def test_each_round_is_compared_with_itself_and_the_median_summarises_them() -> None:
    results = [
        _ceiling(10_000, 1),
        _mx(6_000, 1),
        _ceiling(20_000, 2),
        _mx(8_000, 2),
        _ceiling(14_000, 3),
        _mx(7_000, 3),
    ]
    rows = ratios(results)
    per_round = {r["round"]: r["rate"] for r in rows}
    assert per_round == {1: 0.6, 2: 0.4, 3: 0.5, "median": 0.5}
    (median,) = [r for r in rows if r["round"] == "median"]
    assert median["rate_range"] == [0.4, 0.6]
    assert median["rounds"] == 3


def test_a_single_round_has_no_median_row() -> None:
    rows = ratios([_ceiling(10_000, 1), _mx(6_000, 1)])
    assert [r["round"] for r in rows] == [1]
