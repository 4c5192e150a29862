"""Ratios computed from one run's results, the printed table, and the JSON document."""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from bench.mx import BATCH
from bench.stats import Result

#: the ceiling a MessageX scenario is held against: same publish batch, 4 connections
CEILING_CONNECTIONS = 4


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return round(a / b, 3)


def _lat(result: Result, key: str) -> float | None:
    return (result.latency_ms or {}).get(key)


def _server_cpu(result: Result) -> float | None:
    """CPU per 1,000 messages of everything on the server side of a scenario."""
    cpu = result.cpu_s_per_1k
    if "rabbitmq" in cpu:
        return cpu["rabbitmq"]
    broker, postgres = cpu.get("broker"), cpu.get("postgres")
    if broker is None or postgres is None:
        return None
    return round(broker + postgres, 4)


def compare(mine: Result, base: Result, cpu: str = "server") -> dict[str, Any]:
    """MessageX / baseline: rate (higher is better), latency and CPU (lower is better)."""
    if cpu == "postgres":
        cpu_ratio = _ratio(mine.cpu_s_per_1k.get("postgres"), base.cpu_s_per_1k.get("postgres"))
    else:
        cpu_ratio = _ratio(_server_cpu(mine), _server_cpu(base))
    return {
        "messagex": mine.name,
        "baseline": base.name,
        "rate": _ratio(mine.rate, base.rate),
        "p50": _ratio(_lat(mine, "p50"), _lat(base, "p50")),
        "p99": _ratio(_lat(mine, "p99"), _lat(base, "p99")),
        "cpu_per_1k": cpu_ratio,
        "cpu_basis": "broker+postgres (vs rabbitmq)" if cpu == "server" else "postgres vs postgres",
    }


def _ws_key(r: Result) -> tuple[Any, Any, Any]:
    """What pairs a MessageX WebSocket scenario with its RabbitMQ one."""
    return r.params["publish"], r.params["prefetch"], r.params.get("ack", "each")


def ratios(results: Iterable[Result]) -> list[dict[str, Any]]:
    """The ratios of each round (``round``: its number), each from results of that round
    only; with several rounds, then one row per pair with the median of each ratio over the
    rounds (``round``: "median") and the range of the rate ratio (``rate_range``)."""
    by_round: dict[int, list[Result]] = {}
    for r in results:
        by_round.setdefault(r.extra.get("round", 1), []).append(r)
    out: list[dict[str, Any]] = []
    for number in sorted(by_round):
        out += [{**row, "round": number} for row in _round_ratios(by_round[number])]
    if len(by_round) > 1:
        out += _medians(out)
    return out


def _round_ratios(results: list[Result]) -> list[dict[str, Any]]:
    ok = [r for r in results if r.status == "ok"]
    rabbit = {_ws_key(r): r for r in ok if r.group == "rabbitmq"}
    ceilings = {(r.params["batch"], r.params["connections"]): r for r in ok if r.group == "ceiling"}
    out: list[dict[str, Any]] = []
    for r in ok:
        if r.group != "messagex":
            continue
        mode = r.params["publish"]
        if r.params["transport"] == "websocket" and _ws_key(r) in rabbit:
            out.append(compare(r, rabbit[_ws_key(r)]))
        ceiling = ceilings.get((1 if mode == "single" else BATCH, CEILING_CONNECTIONS))
        if ceiling is not None:
            out.append(compare(r, ceiling, cpu="postgres"))
    grouped = {r.params["group_commit"]: r for r in ok if r.group == "groupcommit"}
    if True in grouped and False in grouped:
        out.append(compare(grouped[True], grouped[False]))
    idle = {r.name.split()[0]: r for r in ok if r.group == "idle"}
    if "mx" in idle and "rabbitmq" in idle:
        out.append(compare(idle["mx"], idle["rabbitmq"]))
    expiry = {r.name: r for r in ok if r.group == "expiry"}
    for name, r in expiry.items():  # mx expire N / rabbitmq expire N, and deliver
        base = expiry.get(name.replace("mx ", "rabbitmq ", 1))
        if name.startswith("mx ") and base is not None:
            out.append(compare(r, base))
    return out


def _medians(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    pairs: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for row in rows:
        pairs.setdefault((row["messagex"], row["baseline"]), []).append(row)
    out = []
    for (mine, base), group in pairs.items():
        summary: dict[str, Any] = {"messagex": mine, "baseline": base, "round": "median"}
        for key in ("rate", "p50", "p99", "cpu_per_1k"):
            values = [row[key] for row in group if row[key] is not None]
            summary[key] = round(statistics.median(values), 3) if values else None
        rates = [row["rate"] for row in group if row["rate"] is not None]
        summary["rate_range"] = [min(rates), max(rates)] if rates else None
        summary["rounds"] = len(group)
        summary["cpu_basis"] = group[0]["cpu_basis"]
        out.append(summary)
    return out


# ----------------------------------------------------------------------------- printing


def _fmt(value: float | None, spec: str = ".1f") -> str:
    return "-" if value is None else format(value, spec)


THROUGHPUT_HEADER = (
    f"{'scenario':<44} {'status':<10} {'msgs':>6} {'msg/s':>8} {'p50 ms':>8} {'p95 ms':>8} "
    f"{'p99 ms':>8} {'broker':>7} {'pg':>7} {'rabbit':>7} {'client':>7}"
)


def _throughput_row(r: Result) -> str:
    cpu = r.cpu_s_per_1k
    cells = [_fmt(cpu.get(k), ".3f") for k in ("broker", "postgres", "rabbitmq", "client")]
    lat = r.latency_ms or {}
    return (
        f"{r.name:<44} {r.status:<10} {r.messages:>6} {_fmt(r.rate):>8} "
        f"{_fmt(lat.get('p50'), '.2f'):>8} {_fmt(lat.get('p95'), '.2f'):>8} "
        f"{_fmt(lat.get('p99'), '.2f'):>8} " + " ".join(f"{c:>7}" for c in cells)
    )


def _pooler_row(r: Result) -> str:
    cpu = r.cpu_s_per_1k
    cells = [_fmt(cpu.get(k), ".3f") for k in ("broker", "postgres", "pgbouncer")]
    lat = r.latency_ms or {}
    ratios = [_fmt(r.extra.get(k), ".2f") for k in ("rate_ratio_to_direct", "p50_ratio_to_direct")]
    return (
        f"{r.name.removeprefix('pooler '):<56} {r.status:<8} {r.messages:>6} {_fmt(r.rate):>8} "
        f"{_fmt(lat.get('p50'), '.2f'):>7} {_fmt(lat.get('p99'), '.2f'):>7} "
        + " ".join(f"{c:>7}" for c in cells)
        + " "
        + " ".join(f"{c:>7}" for c in ratios)
    )


def _backlog_row(r: Result) -> str:
    lat = r.latency_ms or {}
    return (
        f"{r.name:<44} {r.status:<10} {r.messages:>6} {_fmt(lat.get('p50'), '.2f'):>8} "
        f"{_fmt(lat.get('p95'), '.2f'):>8} {_fmt(lat.get('p99'), '.2f'):>8} "
        f"{_fmt(r.extra.get('fill_s'), '.1f'):>8}"
    )


def _scale_row(r: Result) -> str:
    lat = r.latency_ms or {}
    ratios = [v for k, v in sorted(r.extra.items()) if "_ratio_to_" in k]
    p50_ratio, p99_ratio = [*ratios, None, None][:2]
    return (
        f"{r.name:<44} {r.status:<10} {r.messages:>6} {_fmt(lat.get('p50'), '.2f'):>8} "
        f"{_fmt(lat.get('p99'), '.2f'):>8} {_fmt(p50_ratio, '.2f'):>7} "
        f"{_fmt(p99_ratio, '.2f'):>7} {_fmt(r.elapsed_s, '.1f'):>8} {_fmt(r.rate, '.0f'):>8} "
        f"{_fmt(r.extra.get('busy_ratio'), '.3f'):>7}"
    )


def _expiry_row(r: Result) -> str:
    cpu = r.cpu_s_per_1k
    cells = [_fmt(cpu.get(k), ".3f") for k in ("broker", "postgres", "rabbitmq", "client")]
    server_ratio = (r.extra.get("cpu_vs_delivery") or {}).get("server")
    return (
        f"{r.name:<44} {r.status:<10} {r.messages:>7} {_fmt(r.rate, '.0f'):>9} "
        + " ".join(f"{c:>7}" for c in cells)
        + f" {_fmt(server_ratio, '.3f'):>7} {_fmt(r.extra.get('rate_vs_delivery'), '.2f'):>8}"
    )


def _filterops_row(r: Result) -> str:
    extra = r.extra
    return (
        f"{r.name:<44} {r.status:<10} {r.messages:>7} {_fmt(r.elapsed_s, '.2f'):>7} "
        f"{_fmt(r.rate, '.0f'):>9} {_fmt(extra.get('publish_ratio'), '.2f'):>9} "
        f"{_fmt(extra.get('consume_ratio'), '.2f'):>9}"
    )


def _ratio_row(r: dict[str, Any], rounds: bool) -> str:
    row = (
        f"{r['messagex']:<44} {r['baseline']:<40} {_fmt(r['rate'], '.3f'):>7} "
        f"{_fmt(r['p50'], '.2f'):>7} {_fmt(r['p99'], '.2f'):>7} "
        f"{_fmt(r['cpu_per_1k'], '.2f'):>7}"
    )
    if not rounds:
        return row
    spread = r.get("rate_range")
    spread_text = f"  rate {spread[0]:.3f} to {spread[1]:.3f}" if spread else ""
    return f"{r['round']!s:>6} {row}{spread_text}"


def table(meta: dict[str, Any], results: list[Result], ratio_rows: list[dict[str, Any]]) -> str:
    lines = [
        f"MessageX benchmark — mode {meta['mode']}, {meta['count']} messages of "
        f"{meta['message_bytes']} B per throughput scenario, {meta['publishers']} publishers, "
        f"{meta['consumers']} consumers; {meta['machine']['cpu_count']} CPUs, load average "
        f"{meta['machine']['loadavg_start']} at start",
        "msg/s: first publish → last delivery; latency: publish → delivery; CPU columns: "
        "CPU seconds per 1,000 messages",
    ]
    throughput = [
        r
        for r in results
        if r.group in ("ceiling", "messagex", "groupcommit", "rabbitmq", "idle", "sqlpublish")
    ]
    if throughput:
        lines += ["", THROUGHPUT_HEADER, "-" * len(THROUGHPUT_HEADER)]
        lines += [_throughput_row(r) for r in throughput]
    sections = (
        (
            "backlog",
            f"{'backlog probe (claim latency)':<44} {'status':<10} {'n':>6} {'p50 ms':>8} "
            f"{'p95 ms':>8} {'p99 ms':>8} {'fill s':>8}",
            _backlog_row,
        ),
        (
            "scale",
            f"{'scale (issue 19)':<44} {'status':<10} {'n':>6} {'p50 ms':>8} {'p99 ms':>8} "
            f"{'p50/10':>7} {'p99/10':>7} {'total s':>8} {'msg/s':>8} {'busy/10':>7}",
            _scale_row,
        ),
        (
            "expiry",
            f"{'expiry vs delivery (issue 20)':<44} {'status':<10} {'copies':>7} {'copies/s':>9} "
            f"{'broker':>7} {'pg':>7} {'rabbit':>7} {'client':>7} {'cpu e/d':>7} {'rate e/d':>8}",
            _expiry_row,
        ),
        (
            "pooler",
            f"{'behind PgBouncer (issue 23)':<56} {'status':<8} {'msgs':>6} {'msg/s':>8} "
            f"{'p50 ms':>7} {'p99 ms':>7} {'broker':>7} {'pg':>7} {'bouncer':>7} "
            f"{'rate/d':>7} {'p50/d':>7}",
            _pooler_row,
        ),
        (
            "filterops",
            f"{'by filter, beside a busy queue (issue 22)':<44} {'status':<10} {'copies':>7} "
            f"{'s':>7} {'copies/s':>9} {'pub ratio':>9} {'con ratio':>9}",
            _filterops_row,
        ),
    )
    for group, header, row in sections:
        chosen = [r for r in results if r.group == group]
        if chosen:
            lines += ["", header, "-" * len(header)]
            lines += [row(r) for r in chosen]
    if ratio_rows:
        rounds = meta.get("rounds", 1) > 1
        header = (
            f"{'MessageX scenario':<44} {'/ baseline':<40} {'rate':>7} {'p50':>7} {'p99':>7} "
            f"{'cpu':>7}"
        )
        if rounds:
            header = f"{'round':>6} {header}"
        lines += ["", header, "-" * len(header)]
        lines += [_ratio_row(r, rounds) for r in ratio_rows]
    problems = [r for r in results if r.status != "ok" or r.note]
    if problems:
        lines += [""] + [f"! {r.name}: {r.status} {r.note}".rstrip() for r in problems]
    rabbit = meta.get("rabbitmq") or {}
    if rabbit.get("skipped"):
        lines += ["", f"RabbitMQ scenarios skipped: {rabbit['skipped']}"]
    return "\n".join(lines)


def write_json(
    path: Path, meta: dict[str, Any], results: list[Result], ratio_rows: list[dict[str, Any]]
) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    document = {
        "meta": meta,
        "scenarios": [r.to_json() for r in results],
        "ratios": ratio_rows,
    }
    path.write_text(json.dumps(document, indent=2) + "\n")
