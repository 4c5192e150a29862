"""Operations on a queue's messages by filter (contract §17): query, move (redrive) and
delete, over the broker's REST API. ``Client.topology`` has these methods.

A filter is a dict with any of ``status`` (list of ``ready``/``delayed``/``dead``, and for a
query ``in_flight``), ``routing_key`` (a topic pattern), ``headers`` (compared as a headers
binding with ``x-match: all``), ``message_ids``, ``published_after``/``published_before``
(RFC 3339 strings or aware datetimes), ``min_delivery_count``, ``death_reason``;
:func:`message_filter` builds one from keyword arguments.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal
from urllib.parse import quote

Status = Literal["ready", "delayed", "in_flight", "dead"]
DeathReason = Literal["rejected", "expired", "maxlen", "delivery_limit"]


def message_filter(
    *,
    status: Sequence[Status] | None = None,
    routing_key: str | None = None,
    headers: dict[str, Any] | None = None,
    message_ids: Sequence[str] | None = None,
    published_after: datetime | str | None = None,
    published_before: datetime | str | None = None,
    min_delivery_count: int | None = None,
    death_reason: DeathReason | None = None,
) -> dict[str, Any]:
    """The filter object with the conditions given (None leaves one out)."""
    found: dict[str, Any] = {}
    for key, value in (
        ("status", list(status) if status is not None else None),
        ("routing_key", routing_key),
        ("headers", headers),
        ("message_ids", list(message_ids) if message_ids is not None else None),
        ("published_after", published_after),
        ("published_before", published_before),
        ("min_delivery_count", min_delivery_count),
        ("death_reason", death_reason),
    ):
        if value is not None:
            found[key] = value.isoformat() if isinstance(value, datetime) else value
    return found


@dataclass(frozen=True, slots=True)
class MoveResult:
    matched: int
    moved: int
    skipped: int


@dataclass(frozen=True, slots=True)
class DeleteResult:
    matched: int
    deleted: int


class MessageOperations:
    """The §17 calls; mixed into ``Topology``, whose ``_call`` they use."""

    #: ``Topology._call(method, path, body)``: one REST call, its JSON answer
    _call: Callable[..., Awaitable[Any]]

    def _messages_path(self, queue: str, op: str) -> str:
        return f"/queues/{quote(queue, safe='')}/messages/{op}"

    async def query_messages(
        self,
        queue: str,
        filter: dict[str, Any] | None = None,
        *,
        limit: int = 100,
        after: int | None = None,
    ) -> tuple[list[dict[str, Any]], int | None]:
        """One page of the matching copies (browse items) and the next page's cursor."""
        body: dict[str, Any] = {"filter": filter or {}, "limit": limit}
        if after is not None:
            body["after"] = after
        page = await self._call("POST", self._messages_path(queue, "query"), body)
        return list(page["items"]), page["next_after"]

    async def move_messages(
        self,
        queue: str,
        filter: dict[str, Any] | None = None,
        *,
        to: str | None,
        limit: int = 1000,
        dry_run: bool = False,
    ) -> MoveResult:
        """Move up to ``limit`` matching copies to queue ``to``; ``to=None`` redrives each
        back to the queue its newest ``x-death`` entry names."""
        body = {"filter": filter or {}, "to": to, "limit": limit, "dry_run": dry_run}
        result = await self._call("POST", self._messages_path(queue, "move"), body)
        return MoveResult(int(result["matched"]), int(result["moved"]), int(result["skipped"]))

    async def delete_messages(
        self,
        queue: str,
        filter: dict[str, Any] | None = None,
        *,
        limit: int = 1000,
        dry_run: bool = False,
    ) -> DeleteResult:
        """Delete up to ``limit`` matching copies (never one in flight)."""
        body = {"filter": filter or {}, "limit": limit, "dry_run": dry_run}
        result = await self._call("POST", self._messages_path(queue, "delete"), body)
        return DeleteResult(int(result["matched"]), int(result["deleted"]))
