"""The soak's plot: latency, the hot tables' sizes and the broker's RSS over time (PNG)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display: files only

import matplotlib.pyplot as plt

MIB = 1 << 20


def _series(rows: list[dict[str, Any]], key: str, scale: float = 1.0) -> list[float | None]:
    return [None if r.get(key) is None else r[key] / scale for r in rows]


def plot(meta: dict[str, Any], rows: list[dict[str, Any]], path: Path) -> None:
    """Three panels over the run's minutes, small enough to commit (about 50 KB)."""
    minutes = [r["minute"] for r in rows]
    fig, (lat, size, rss) = plt.subplots(3, 1, figsize=(8, 7.5), sharex=True)
    title = (
        f"soak {meta['started_at'][:16].replace('T', ' ')} UTC: {meta.get('rate')} msg/s "
        f"(max {meta.get('max_rate')}), schema {meta.get('schema_revision')}"
    )
    fig.suptitle(title, fontsize=10)
    lat.plot(minutes, _series(rows, "p50_ms"), label="p50", marker=".")
    lat.plot(minutes, _series(rows, "p99_ms"), label="p99", marker=".")
    lat.set_ylabel("publish → delivery, ms")
    lat.set_yscale("log")
    lat.legend(loc="upper left", fontsize=8)
    lat.grid(True, which="both", alpha=0.3)

    size.plot(minutes, _series(rows, "messages_heap_bytes", MIB), label="messages heap")
    size.plot(minutes, _series(rows, "messages_indexes_bytes", MIB), label="messages indexes")
    size.plot(minutes, _series(rows, "publish_receipts_total_bytes", MIB), label="publish_receipts")
    size.set_ylabel("MiB")
    size.set_ylim(bottom=0)
    size.grid(True, alpha=0.3)
    dead = size.twinx()
    dead.plot(
        minutes, _series(rows, "messages_dead"), color="grey", linestyle=":", label="dead tuples"
    )
    dead.set_ylabel("messages dead tuples", fontsize=8)
    dead.set_ylim(bottom=0)
    lines = size.get_legend_handles_labels()[0] + dead.get_legend_handles_labels()[0]
    size.legend(lines, [str(line.get_label()) for line in lines], loc="upper left", fontsize=8)

    memory = _series(rows, "broker_rss_bytes", MIB)
    rss.plot(minutes, memory, label="broker RSS", color="C3", marker=".")
    rss.set_ylabel("broker RSS, MiB")
    rss.set_ylim(0, 1.25 * max((m for m in memory if m is not None), default=1.0))
    rss.grid(True, alpha=0.3)
    rss.set_xlabel("minutes of paced load")
    fig.tight_layout()
    fig.savefig(path, dpi=72)
    plt.close(fig)
