"""``messagex serve`` with test-only module constants taken from the environment.

Used only where a scenario needs a timeout shorter than the broker's fixed one (the 30 s
WebSocket send timeout): ``python -m tests.faults.launch serve --port P``.
"""

from __future__ import annotations

import os
import sys

from app.api.ws import connection
from app.cli import main

if "MXT_SEND_TIMEOUT_SECONDS" in os.environ:
    connection.SEND_TIMEOUT_SECONDS = float(os.environ["MXT_SEND_TIMEOUT_SECONDS"])

if __name__ == "__main__":
    sys.exit(main())
