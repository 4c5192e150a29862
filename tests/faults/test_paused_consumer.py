"""A consumer paused (SIGSTOP) past the ack timeout: the message is redelivered once, to
another consumer, and the paused one's late ACK is rejected (``unknown_delivery_tag``)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.faults.harness import REPO
from tests.support import LiveServer, running_server
from tests.support import test_settings as settings_for
from tests.wsclient import WsClient, declare_queue, publish, stats

ACK_TIMEOUT = 1


@pytest.fixture
def fast_timeouts(database_url: str) -> Iterator[LiveServer]:
    settings = settings_for(
        database_url, ack_timeout_seconds=ACK_TIMEOUT, ack_timeout_check_interval_ms=100
    )
    with running_server(settings) as live:
        yield live


def test_paused_consumer_late_ack_is_rejected_and_message_redelivered_once(
    fast_timeouts: LiveServer,
) -> None:
    server = fast_timeouts
    with httpx.Client(
        base_url=f"{server.base_url}/api/v1", auth=("admin", "admin-secret-password")
    ) as admin:
        declare_queue(admin, "paused")
        sent = publish(admin, "paused", {"n": 1})
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.faults.paused_consumer", server.ws_url, "paused"],
            cwd=REPO,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert proc.stdout is not None
            assert proc.stdin is not None
            first = json.loads(proc.stdout.readline())
            assert first["message_id"] == sent["message_id"]
            assert first["delivery_count"] == 1
            os.kill(proc.pid, signal.SIGSTOP)
            paused_at = time.monotonic()
            with WsClient.admin(server.ws_url) as other:
                other.subscribe("paused", 10)
                again = other.delivery(timeout=ACK_TIMEOUT + 5)
                waited = time.monotonic() - paused_at
                assert again["message_id"] == sent["message_id"]
                assert again["redelivered"] is True
                assert again["delivery_count"] == 2
                assert again["delivery_tag"] != first["delivery_tag"]
                assert other.ack(again["delivery_tag"])["type"] == "ACKED"
                assert other.quiet(ACK_TIMEOUT + 0.5) == []  # redelivered once, not again
            os.kill(proc.pid, signal.SIGCONT)
            proc.stdin.write("ack\n")
            proc.stdin.flush()
            late = json.loads(proc.stdout.readline())
            assert late["type"] == "ERROR", late
            assert late["code"] == "unknown_delivery_tag"
            assert late["delivery_tag"] == first["delivery_tag"]
            assert proc.wait(timeout=10) == 0
            assert stats(admin, "paused")["ready"] == 0
            assert stats(admin, "paused")["in_flight"] == 0
            print(
                f"SIGSTOP: redelivered {waited:.2f} s after the pause (ack timeout {ACK_TIMEOUT} s)"
            )
        finally:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGCONT)
                proc.kill()
                proc.wait(timeout=10)
            for pipe in (proc.stdin, proc.stdout):
                if pipe is not None:
                    pipe.close()
