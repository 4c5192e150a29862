"""examples/consumer.py as a real process: it consumes, ACKs the work done, dead-letters the
work that failed, and stops cleanly on SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.support import ADMIN_PASSWORD, ADMIN_USER, LiveServer, client, wait_for

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "consumer.py"


def test_example_consumer_acks_dead_letters_and_stops_on_sigterm(broker: LiveServer) -> None:
    with client(broker.base_url, auth=(ADMIN_USER, ADMIN_PASSWORD)) as rest:
        assert rest.put("/queues/ex-failed", json={}).status_code == 201
        r = rest.put("/queues/ex-work", json={"dead_letter_queue": "ex-failed"})
        assert r.status_code == 201
        for n in range(5):
            rest.post("/queues/ex-work/messages", json={"body": {"n": n}})
        rest.post("/queues/ex-work/messages", json={"body": {"fail": True}})

        env = {
            **os.environ,
            "MESSAGEX_URL": broker.base_url,
            "MESSAGEX_USER": ADMIN_USER,
            "MESSAGEX_PASSWORD": ADMIN_PASSWORD,
        }
        proc = subprocess.Popen(
            [sys.executable, str(EXAMPLE), "ex-work", "--prefetch", "3"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        try:

            def settled() -> bool:
                work = rest.get("/queues/ex-work").json()["stats"]
                failed = rest.get("/queues/ex-failed").json()["stats"]
                return bool(work["ready"] + work["in_flight"] == 0 and failed["ready"] == 1)

            wait_for(settled, timeout=15, message="the consumer to settle everything")
            assert rest.get("/queues/ex-work").json()["stats"]["consumers"] == 1
            proc.send_signal(signal.SIGTERM)
            output, _ = proc.communicate(timeout=15)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        assert proc.returncode == 0, output
        assert "consuming ex-work (prefetch 3)" in output
        assert output.count("handled ") == 5
        assert "failed " in output
        assert "stopped" in output
        (dead,) = rest.get("/queues/ex-failed/messages").json()["items"]
        assert dead["body"] == {"fail": True}
        assert dead["headers"]["x-death"][0]["reason"] == "rejected"
        wait_for(
            lambda: rest.get("/queues/ex-work").json()["stats"]["consumers"] == 0,
            message="the consumer to be gone",
        )


def test_example_consumer_reports_bad_credentials(broker: LiveServer) -> None:
    env = {**os.environ, "MESSAGEX_URL": broker.base_url, "MESSAGEX_TOKEN": "wrong"}
    result = subprocess.run(
        [sys.executable, str(EXAMPLE), "anything"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 1
    assert "unauthorized" in result.stderr
