"""A broker process tunes its cyclic collector once started (app/server.py, tune_gc)."""

from __future__ import annotations

import subprocess
import sys


def test_tune_gc_freezes_start_up_objects_and_raises_the_young_threshold() -> None:
    code = (
        "import gc\n"
        "from app.server import GC_THRESHOLDS, tune_gc\n"
        "assert gc.get_freeze_count() == 0\n"
        "tune_gc()\n"
        "assert gc.get_threshold() == GC_THRESHOLDS, gc.get_threshold()\n"
        "assert GC_THRESHOLDS[0] > 700\n"
        "assert gc.get_freeze_count() > 10_000, gc.get_freeze_count()\n"
        "print('ok')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"
