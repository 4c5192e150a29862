"""When a broker process counts as alive: the one rule that the heartbeat and its reaper
(broker/presence.py), the subscriber counts of queue stats (storage/topology.py) and the
overview (storage/overview.py) share, so they can never disagree about who is alive.
"""

from __future__ import annotations

from datetime import timedelta

#: Every broker process writes its heartbeat this often.
HEARTBEAT_INTERVAL = timedelta(seconds=2)

#: A broker process whose heartbeat is older than this is dead: a survivor releases what its
#: WebSockets held, and its connections and subscriptions no longer count. Several heartbeats
#: long, so that a pause (a slow disk, a long GC) is not taken for a death.
PROCESS_STALE_AFTER = timedelta(seconds=15)
