"""JSON responses serialized once by orjson (``orjson.Fragment`` splices stored JSON bodies)."""

from __future__ import annotations

from typing import Any

import orjson
from starlette.responses import Response


def json_response(content: Any, status_code: int = 200) -> Response:
    return Response(orjson.dumps(content), status_code=status_code, media_type="application/json")
