"""``python -m bench.celery`` end to end with tiny counts, MessageX only (RabbitMQ and Kombu's
SQLAlchemy transport, whose 1 s polling would cost CI ~20 s, skipped): a broker of its own,
a real Celery worker, a table and JSON with positive rates."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(200)
def test_celery_bench_runs_on_messagex(tmp_path: Path) -> None:
    out = tmp_path / "celery.json"
    cmd = [sys.executable, "-m", "bench.celery", "--count", "20", "--latency-count", "2"]
    cmd += ["--no-rabbitmq", "--no-sqlalchemy", "--deadline", "60", "--json", str(out)]
    url = os.environ.get("MESSAGEX_TEST_DATABASE_URL")
    if url:
        cmd += ["--database-url", url]
    done = subprocess.run(
        cmd,
        check=False,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, done.stderr[-4000:] + done.stdout[-2000:]
    results = {r["broker"]: r for r in json.loads(out.read_text())}
    assert set(results) == {"messagex"}
    for result in results.values():
        assert result["status"] == "ok"
        assert result["tasks"] == 20
        assert result["tasks_per_s"] > 0
        assert 0 < result["idle_p50_ms"] <= result["idle_p99_ms"]
    assert "| messagex |" in done.stdout
