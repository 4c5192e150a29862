"""The management web UI: ``/`` serves the single page, ``/static`` its assets.

Everything ships inside the package (``app/static``): plain ES modules and one CSS file,
no build step, no CDN. Neither route needs credentials (the page itself logs in and calls the
REST API with a Bearer token) and neither is an API operation, so both stay out of the
OpenAPI document.

Every UI response carries a strict Content-Security-Policy: scripts and styles only from
this origin (no inline script, no ``eval``), no plugins, no framing, and network access
(``fetch`` and WebSocket alike: CSP Level 3's ``'self'`` covers ``ws:``/``wss:`` to this host and
port) only to this origin. The page builds its DOM with ``textContent``, so escaping is
structural; the policy is the second wall should that ever slip.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, FastAPI
from starlette.responses import FileResponse, Response
from starlette.staticfiles import StaticFiles
from starlette.types import Scope

STATIC_DIR = Path(__file__).resolve().parent.parent / "static"

CONTENT_SECURITY_POLICY = "; ".join(
    (
        "default-src 'self'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self' data:",
        "connect-src 'self'",
        "object-src 'none'",
        "base-uri 'none'",
        "form-action 'self'",
        "frame-ancestors 'none'",
    )
)

SECURITY_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    # Revalidate on every load (ETag / Last-Modified make that cheap): an upgraded broker
    # never runs a stale script against a newer API.
    "Cache-Control": "no-cache",
}

router = APIRouter(include_in_schema=False)


def _secure(response: Response) -> Response:
    response.headers.update(SECURITY_HEADERS)
    return response


class UiStaticFiles(StaticFiles):
    """StaticFiles whose every response carries the UI's security headers."""

    async def get_response(self, path: str, scope: Scope) -> Response:
        return _secure(await super().get_response(path, scope))


@router.get("/", name="web_ui")
async def web_ui() -> Response:
    return _secure(FileResponse(STATIC_DIR / "index.html", media_type="text/html"))


def install(app: FastAPI) -> None:
    """Serve the UI at ``/`` and its assets at ``/static`` (no credentials, not in OpenAPI)."""
    app.include_router(router)
    app.mount("/static", UiStaticFiles(directory=STATIC_DIR), name="static")
