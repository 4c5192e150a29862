"""A consumer in a process of its own, so that a test can SIGSTOP it.

``python -m tests.faults.paused_consumer WS_URL QUEUE``: subscribes, prints the first
MESSAGE_DELIVERED frame as one JSON line, then waits for a line on stdin; on ``ack`` it sends
the ACK of that delivery and prints the reply frame as one JSON line, then exits.
"""

from __future__ import annotations

import json
import sys

from tests.wsclient import WsClient


def main() -> int:
    url, queue = sys.argv[1], sys.argv[2]
    with WsClient.admin(url) as ws:
        ws.subscribe(queue, 1)
        delivery = ws.delivery(timeout=30)
        print(json.dumps(delivery), flush=True)
        if sys.stdin.readline().strip() != "ack":
            return 1
        reply = ws.request({"type": "ACK", "delivery_tag": delivery["delivery_tag"]}, timeout=10)
        print(json.dumps(reply), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
