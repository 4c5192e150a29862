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

#: Every broker process looks for dead ones this often (broker/presence.py ``Presence.reap``).
TAKEOVER_CHECK_INTERVAL = timedelta(seconds=1)

#: The fast rule: a process whose LISTEN connection's backend is gone from
#: ``pg_stat_activity`` (PostgreSQL ends a dead client's backend within milliseconds) is dead
#: once its heartbeat is older than this too. One heartbeat and a margin: a live process whose
#: LISTEN connection is reconnecting keeps beating, and writes its new pid (or none) within a
#: heartbeat, so it is never taken for dead by this rule. Kill to takeover: at most this plus
#: one check interval (≈ 4 s), against ``PROCESS_STALE_AFTER`` for the heartbeat-only rule.
LISTEN_GONE_STALE_AFTER = HEARTBEAT_INTERVAL + timedelta(seconds=1)
