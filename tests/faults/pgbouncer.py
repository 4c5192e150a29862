"""The fault suite's PgBouncer harness: bench/pgbouncer.py (the benchmark starts it too)."""

from bench.pgbouncer import MISSING, PGBOUNCER, PgBouncer, PoolMode

__all__ = ["MISSING", "PGBOUNCER", "PgBouncer", "PoolMode"]
