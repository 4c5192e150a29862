"""``python -m bench soak`` (bench/soak.py, issue 23 item 1): a short run checks the report's
shape and the plot; the slow test runs it for 10 minutes and asserts its targets."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import pytest

from bench.soak import HOT_TABLES, windows_of
from tests.bench.test_bench_smoke import run_bench

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def run_soak(out: Path, *args: str, timeout: float) -> dict[str, Any]:
    code, stdout, stderr = run_bench(
        ["soak", "--out", str(out), *args], timeout=timeout, database_prefix="mx_soak_"
    )
    assert code == 0, stdout[-3000:] + stderr[-3000:]
    doc: dict[str, Any] = json.loads((out / "soak.json").read_text())
    return doc


@pytest.mark.timeout(300)
def test_a_short_soak_reports_every_row_and_plots_them(tmp_path: Path) -> None:
    out = tmp_path / "soak"
    doc = run_soak(
        out, "--seconds", "12", "--report-every", "2", "--probe-seconds", "4", timeout=240
    )
    meta, rows = doc["meta"], doc["rows"]
    assert meta["max_rate"] > 0
    assert meta["rate"] == pytest.approx(meta["max_rate"] / 2, abs=1)
    assert meta["machine"]["nproc"] >= 1
    assert meta["postgres"]["autovacuum"] in ("on", "off")
    assert meta["schema_revision"]
    assert 5 <= len(rows) <= 7, [r["t_s"] for r in rows]
    for row in rows:
        assert row["published_per_s"] >= 0
        assert row["delivered_per_s"] >= 0
        assert row["broker_rss_bytes"] > 0
        assert row["messages_total_bytes"] > 0
        assert (
            row["messages_heap_bytes"] + row["messages_indexes_bytes"]
            <= row["messages_total_bytes"]
        )
        for table in HOT_TABLES:
            assert f"{table}_dead" in row
        assert "index_pk_messages_bytes" in row
        assert "index_ix_messages_claim_bytes" in row
    assert sum(r["delivered_per_s"] for r in rows) > 0
    assert any(r["p99_ms"] for r in rows)
    verdict = meta["verdict"]
    assert set(verdict["checks"]) == {
        "p99_ms",
        "broker_rss_bytes",
        "hot_tables_total_bytes",
        "messages_total_bytes",
        "kept_up",
    }
    assert isinstance(verdict["met"], bool)
    csv_lines = (out / "soak.csv").read_text().splitlines()
    assert len(csv_lines) == len(rows) + 1
    assert csv_lines[0].startswith("t_s,")
    png = (out / "soak.png").read_bytes()
    assert png[:8] == PNG_MAGIC
    assert 5_000 < len(png) < 200_000


def test_the_windows_are_minutes_5_to_10_and_25_to_30_of_half_an_hour() -> None:
    assert windows_of(1800) == ((300, 600), (1500, 1800))


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_ten_minutes_of_steady_load_do_not_drift(tmp_path: Path) -> None:
    """Issue 23 item 1's targets over 10 minutes: p99 and the broker's RSS of the last part
    within 20 % of an early window, and the hot tables with their indexes no longer growing
    beyond 20 % once the load is steady (autovacuum keeps up)."""
    doc = run_soak(tmp_path / "soak", "--minutes", "10", timeout=1000)
    verdict = doc["meta"]["verdict"]
    checks = verdict["checks"]
    report = json.dumps(verdict, indent=1)
    assert checks["kept_up"]["met"], report  # else latency and sizes measure a backlog
    assert checks["p99_ms"]["met"], report
    assert checks["broker_rss_bytes"]["met"], report
    if doc["meta"]["postgres"]["autovacuum"] != "on":
        # a server without autovacuum (the project's shared CI server) reclaims nothing:
        # the table grows by ~2 kB a message, as docs/reliability.md "Soak" measured
        warnings.warn("autovacuum is off on the test server: sizes not asserted", stacklevel=1)
        return
    assert checks["hot_tables_total_bytes"]["met"], report
    assert checks["messages_total_bytes"]["met"], report
