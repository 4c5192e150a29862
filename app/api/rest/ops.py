"""Operations: health, readiness, metrics (outside /api/v1) and the overview."""

from __future__ import annotations

from fastapi import APIRouter

router = APIRouter(tags=["operations"])
api_router = APIRouter(tags=["operations"])


@router.get("/healthz", operation_id="healthz", summary="The process is alive")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}
