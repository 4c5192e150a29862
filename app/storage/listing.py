"""Filters shared by the list statements (the §17 filters of copies are in filters.py).

``?contains=`` (contract §20) on GET /exchanges, /queues, /users and /connections: the items
whose name (connections: username) contains the text, case-sensitive, with the list's own
ordering and paging. Any list statement applies it with :func:`name_contains`.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import ColumnElement, func, true


def name_contains(column: Any, text: str | None) -> ColumnElement[bool]:
    """``column`` contains ``text`` (case-sensitive); no filter when ``text`` is None or "".

    ``strpos``, not ``LIKE``: the text is matched as it is, so ``%``, ``_`` and ``\\`` need
    no escaping, and case is never folded.
    """
    if not text:
        return true()
    return func.strpos(column, text) > 0
