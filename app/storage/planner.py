"""Planner settings of the broker's connections: the messages table's statistics mislead.

The messages table swings between empty and millions of rows within minutes. When autovacuum
finds it empty it truncates it and records 0 pages and 0 rows; PostgreSQL then replans every
cached statement that reads it, for a table it believes empty, where every plan costs next to
nothing. A prepared statement that has settled on a generic plan keeps that plan while a
backlog builds up: claims, ACKs and due-time probes then read the whole table, or walk a whole
index by its second column. In the benchmark: 500 instead of 7,000 messages a second once the
table had been VACUUMed between two scenarios (docs/performance.md, round 7). Turning
sequential scans off does not help: the planner then walks a whole index instead.

So the broker's connections plan each call for the table as it is now (``plan_cache_mode =
force_custom_plan``): a plan is made from the table's current size, not from statistics taken
when it was empty, and no plan outlives the state it was made for. That holds only for a
statement with parameters: PostgreSQL plans one without any once and keeps that plan (until
the table's statistics change), so every statement that reads messages takes at least one
parameter (the full poll's ``:after``, the expiry probe's ``:lead_s``). It costs a planning per
statement, 0.1 to 0.3 ms spread over the messages a hot-path statement carries.

One statement is exempt: the publish ``INSERT`` without a hand-off reads nothing of messages,
so every plan of it is safe, and its connections (``HotPath.connection(stable=True)``) keep
PostgreSQL's default. Under custom plans, the foreign-key check it makes for every row was
planned for every row too: 2.0 → 5.2 ms of a 200-row INSERT's 6.8 → 9.0 ms.

``tests/integration/test_query_plans.py`` makes each statement's plan while the table looks
empty, fills the table, and checks that none of them then reads it from end to end.
"""

from __future__ import annotations

#: server settings of the broker's connections (hot path, engine, migrations)
SETTINGS: dict[str, str] = {"plan_cache_mode": "force_custom_plan"}
#: server settings of the connections for statements whose every plan is safe: the default
STABLE: dict[str, str] = {}
