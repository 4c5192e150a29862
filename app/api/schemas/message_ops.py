"""Request and response bodies of the operations on messages by filter (contract §17).

One filter model for query, move and delete; unknown keys anywhere are 422.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AwareDatetime, BaseModel, Field, StrictBool, StrictInt, field_validator

from app.api import codec
from app.api.schemas.common import StrictModel
from app.api.schemas.messages import StorableText
from app.domain.arguments import DeathReason
from app.domain.filters import MessageFilter, build_filter
from app.domain.model import NAME_PATTERN, BrowseStatus

#: message ids one filter may list
MAX_MESSAGE_IDS = 10_000
#: the most copies one move or delete takes (contract §17)
MAX_OPERATION_LIMIT = 100_000


class MessageFilterBody(StrictModel):
    """Every condition given must hold; `{}` matches every ready, delayed and dead copy."""

    status: Annotated[
        list[BrowseStatus] | None,
        Field(
            min_length=1,
            max_length=4,
            description=(
                "Statuses to match (default ready, delayed and dead; `delayed` = ready but not "
                "yet due). `in_flight` only in a query: move and delete never touch a copy "
                "in flight (422)."
            ),
        ),
    ] = None
    routing_key: Annotated[
        StorableText | None,
        Field(
            max_length=1024,
            description="A topic pattern (§4): `*` one word, `#` zero or more",
        ),
    ] = None
    headers: Annotated[
        dict[str, Any] | None,
        Field(
            description=(
                "Compared as a headers binding with `x-match: all` (JSON value and type: "
                '`1` ≠ `"1"`); keys starting with `x-` are refused (422)'
            ),
            json_schema_extra={"propertyNames": {"pattern": "^(?!x-)"}},
        ),
    ] = None
    message_ids: Annotated[
        list[Annotated[StorableText, Field(max_length=1024)]] | None,
        Field(min_length=1, max_length=MAX_MESSAGE_IDS, description="Any of these message ids"),
    ] = None
    published_after: Annotated[
        AwareDatetime | None,
        Field(description="RFC 3339; copies first published after this instant (exclusive)"),
    ] = None
    published_before: Annotated[
        AwareDatetime | None,
        Field(description="RFC 3339; copies first published before this instant (exclusive)"),
    ] = None
    min_delivery_count: Annotated[
        StrictInt | None, Field(ge=0, le=2**31 - 1, description="`delivery_count` at least")
    ] = None
    death_reason: Annotated[
        DeathReason | None,
        Field(description="The reason of the copy's newest `x-death` entry"),
    ] = None

    @field_validator("headers")
    @classmethod
    def _check_headers(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value:
            codec.check_json_object(value)
        return value

    def to_filter(self) -> MessageFilter:
        """The domain filter; ValidationFailed for what the schema cannot say."""
        return build_filter(
            statuses=None if self.status is None else [BrowseStatus(s) for s in self.status],
            routing_key=self.routing_key,
            headers=self.headers,
            message_ids=self.message_ids,
            published_after=self.published_after,
            published_before=self.published_before,
            min_delivery_count=self.min_delivery_count,
            death_reason=self.death_reason,
        )


class SettleFilterBody(MessageFilterBody):
    """The filter of a move or delete: as a query's, but never in flight (contract §17)."""

    # a narrower list than the query's (pydantic validates the override; mypy sees a clash)
    status: Annotated[
        list[Literal["ready", "delayed", "dead"]] | None,
        Field(
            min_length=1,
            max_length=3,
            description=(
                "Statuses to match (default all three; `delayed` = ready but not yet due). "
                "A move or delete never touches a copy in flight."
            ),
        ),
    ] = None  # type: ignore[assignment]


_FILTER = Field(default_factory=MessageFilterBody, description="The copies to act on")
_SETTLE_FILTER = Field(default_factory=SettleFilterBody, description="The copies to act on")
_DRY_RUN = Field(description="Only count: change nothing")


class QueryBody(StrictModel):
    filter: MessageFilterBody = _FILTER
    limit: Annotated[StrictInt, Field(ge=1, le=1000, description="Page size")] = 100
    after: Annotated[
        StrictInt | None,
        # No upper bound in the schema (a JSON reader's doubles cannot hold 2**63 - 1 exactly,
        # so clients would disagree about it): past the largest id, a page is simply empty.
        Field(ge=0, description="`next_after` of the previous page"),
    ] = None


class MoveBody(StrictModel):
    filter: SettleFilterBody = _SETTLE_FILTER
    to: Annotated[
        str | None,
        Field(
            pattern=NAME_PATTERN,
            max_length=255,
            description=(
                "The target queue; null: redrive, each copy back to the queue its newest "
                "`x-death` entry names"
            ),
        ),
    ]
    limit: Annotated[
        StrictInt, Field(ge=1, le=MAX_OPERATION_LIMIT, description="The most copies moved")
    ] = 1000
    dry_run: Annotated[StrictBool, _DRY_RUN] = False


class DeleteBody(StrictModel):
    filter: SettleFilterBody = _SETTLE_FILTER
    limit: Annotated[
        StrictInt, Field(ge=1, le=MAX_OPERATION_LIMIT, description="The most copies deleted")
    ] = 1000
    dry_run: Annotated[StrictBool, _DRY_RUN] = False


class MoveResponse(BaseModel):
    matched: int = Field(description="Every matching copy, also beyond `limit`")
    moved: int = Field(description="Copies moved (0 with `dry_run`)")
    skipped: int = Field(
        description=(
            "Redrive: matching copies left where they are (no `x-death` entry, or its queue "
            "no longer exists); 0 for a move to a named queue"
        )
    )


class DeleteResponse(BaseModel):
    matched: int = Field(description="Every matching copy, also beyond `limit`")
    deleted: int = Field(description="Copies deleted (0 with `dry_run`)")
