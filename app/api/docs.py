"""``/docs``: Swagger UI for the OpenAPI document, entirely from the package; and
``/asyncapi.json``, the WebSocket protocol's AsyncAPI document (``app.api.asyncapi``).

FastAPI's own page loads Swagger UI from a CDN, without integrity hashes or a
Content-Security-Policy, and does not work offline. Here its assets are vendored under
``app/static/swagger-ui`` (swagger-ui-dist 5.35.0 from npm, Apache-2.0: see the LICENSE and
NOTICE there), the page names each with a Subresource Integrity hash, and the policy (the web
UI's, ``app.api.ui``) allows scripts, styles and requests to this origin only (no inline
script: ``app/static/docs.js`` starts the UI).
"""

from __future__ import annotations

import base64
import hashlib
from functools import lru_cache
from html import escape

from fastapi import APIRouter
from starlette.responses import HTMLResponse, JSONResponse, Response

from app.api import asyncapi
from app.api.ui import SECURITY_HEADERS, STATIC_DIR

SWAGGER_VERSION = "5.35.0"

#: the page's assets, in the order the page loads them: (URL path, file under STATIC_DIR)
ASSETS = (
    ("/static/swagger-ui/swagger-ui.css", "swagger-ui/swagger-ui.css"),
    ("/static/swagger-ui/swagger-ui-bundle.js", "swagger-ui/swagger-ui-bundle.js"),
    ("/static/docs.js", "docs.js"),
)

router = APIRouter(include_in_schema=False)


def integrity(relative: str) -> str:
    """The Subresource Integrity value of a file under STATIC_DIR."""
    digest = hashlib.sha384((STATIC_DIR / relative).read_bytes()).digest()
    return "sha384-" + base64.b64encode(digest).decode()


@lru_cache(maxsize=1)
def page() -> str:
    css, bundle, init = ((escape(url), escape(integrity(path))) for url, path in ASSETS)
    return f"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>MessageX - API documentation</title>
<link rel="stylesheet" href="{css[0]}" integrity="{css[1]}">
</head>
<body>
<div id="swagger-ui" data-url="/openapi.json"></div>
<script src="{bundle[0]}" integrity="{bundle[1]}"></script>
<script src="{init[0]}" integrity="{init[1]}"></script>
</body>
</html>
"""


@lru_cache(maxsize=1)
def asyncapi_document() -> dict[str, object]:
    return asyncapi.document()


@router.get("/asyncapi.json", name="asyncapi")
async def asyncapi_json() -> Response:
    """The WebSocket protocol's AsyncAPI 3.0 document (``openapi/asyncapi.json``)."""
    return JSONResponse(asyncapi_document())


@router.get("/docs", name="api_docs")
async def docs() -> Response:
    # the UI's own policy: scripts, styles and connections to this origin only
    return HTMLResponse(page(), headers=SECURITY_HEADERS)
