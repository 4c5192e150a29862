"""BrokerError → RFC 9457 problem details (REST) or an ERROR frame (WebSocket): one table."""

from __future__ import annotations

import logging
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.routing import iter_route_contexts
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response

from app import errors

log = logging.getLogger("messagex.api")

PROBLEM_JSON = "application/problem+json"

#: status and title per error class; subclasses inherit through the MRO walk in ``status_of``.
STATUS: dict[type[errors.BrokerError], tuple[int, str]] = {
    errors.InternalError: (500, "Internal Server Error"),
    errors.BadRequest: (400, "Bad Request"),
    errors.Unauthorized: (401, "Unauthorized"),
    errors.Forbidden: (403, "Forbidden"),
    errors.NotFound: (404, "Not Found"),
    errors.PreconditionFailed: (409, "Conflict"),
    errors.MessageTooLarge: (413, "Content Too Large"),
    errors.ValidationFailed: (422, "Unprocessable Content"),
    errors.Unroutable: (422, "Unprocessable Content"),
    errors.RateLimited: (429, "Too Many Requests"),
    errors.LimitExceeded: (429, "Too Many Requests"),
    errors.Unavailable: (503, "Service Unavailable"),
    errors.AlreadySubscribed: (409, "Conflict"),
    errors.NotSubscribed: (409, "Conflict"),
    errors.UnknownDeliveryTag: (404, "Not Found"),
    errors.BadFrame: (400, "Bad Request"),
}

#: HTTP status → error for Starlette's own errors (404 route, 405 method, ...).
_HTTP_CODES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    413: "message_too_large",
    415: "unsupported_media_type",
}


def status_of(exc: errors.BrokerError) -> tuple[int, str]:
    for cls in type(exc).__mro__:
        if cls in STATUS:
            return STATUS[cls]
    return 500, "Internal Server Error"


def problem(status: int, title: str, detail: str, code: str, **extra: Any) -> Response:
    body: dict[str, Any] = {
        "type": "about:blank",
        "title": title,
        "status": status,
        "detail": detail,
        "code": code,
    }
    body.update(extra)
    headers = {}
    if status == 429 and "retry_after" in extra:
        headers["Retry-After"] = str(extra.pop("retry_after"))
        body.pop("retry_after", None)
    if status == 401:
        # Bearer only: a Basic challenge makes browsers prompt and then send the cached
        # credentials with every request, cross-site forms included (contract §3).
        headers["WWW-Authenticate"] = 'Bearer realm="messagex"'
    return Response(
        orjson.dumps(body), status_code=status, media_type=PROBLEM_JSON, headers=headers
    )


def broker_error_response(exc: errors.BrokerError) -> Response:
    status, title = status_of(exc)
    extra: dict[str, Any] = {}
    if isinstance(exc, errors.ValidationFailed):
        extra["errors"] = exc.errors
    if isinstance(exc, errors.RateLimited):
        extra["retry_after"] = exc.retry_after
    return problem(status, title, exc.message, exc.code, **extra)


def error_frame(
    exc: errors.BrokerError, frame_id: str | int | None = None, **fields: Any
) -> dict[str, Any]:
    """The WebSocket ``ERROR`` frame for ``exc``."""
    frame: dict[str, Any] = {"type": "ERROR", "code": exc.code, "message": exc.message}
    if frame_id is not None:
        frame["id"] = frame_id
    frame.update(fields)
    return frame


def _clean_errors(raw: list[Any]) -> list[dict[str, Any]]:
    """Pydantic's error list without the echoed input (it may hold a password) or ctx objects."""
    out = []
    for err in raw:
        out.append(
            {
                "loc": list(err.get("loc", ())),
                "msg": str(err.get("msg", "")),
                "type": str(err.get("type", "")),
            }
        )
    return out


def _is_json_error(raw: list[Any]) -> bool:
    return any(err.get("type") == "json_invalid" for err in raw)


async def _on_broker_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, errors.BrokerError)
    return broker_error_response(exc)


async def _on_validation_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestValidationError)
    raw = list(exc.errors())
    if _is_json_error(raw):
        return broker_error_response(errors.BadRequest("the request body is not valid JSON"))
    cleaned = _clean_errors(raw)
    first = cleaned[0] if cleaned else {"loc": [], "msg": "invalid"}
    where = ".".join(str(p) for p in first["loc"])
    detail = f"{where}: {first['msg']}" if where else str(first["msg"])
    return broker_error_response(errors.ValidationFailed(detail, errors=cleaned))


async def _on_http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, StarletteHTTPException)
    code = _HTTP_CODES.get(exc.status_code, "error")
    title = {405: "Method Not Allowed"}.get(exc.status_code, "Error")
    for cls, (status, t) in STATUS.items():
        if status == exc.status_code and cls.code == code:
            title = t
    detail = exc.detail if isinstance(exc.detail, str) else title
    response = problem(exc.status_code, title, detail, code)
    for name, value in (exc.headers or {}).items():
        if name.lower() == "allow":
            response.headers["Allow"] = _allowed_methods(request) or value
    return response


_METHODS = ("DELETE", "GET", "HEAD", "PATCH", "POST", "PUT")


def _allowed_methods(request: Request) -> str:
    """Every method some route serves on this path. Starlette's own ``Allow`` names only the
    first route that matched the path (``/bindings`` has a GET route and a POST route).

    Only the most specific templates count: ``/queues/q/messages/move`` also fits
    ``/queues/{name}/messages/{id}`` (whose GET would refuse ``move`` as an id with 422), but
    the path is the ``…/messages/move`` route's, so ``Allow`` names POST alone."""
    path = request.scope["path"]
    found: dict[str, int] = {}
    for route in iter_route_contexts(list(request.app.router.routes)):
        if not route.path_regex.match(path):
            continue
        literal = len([part for part in (route.path or "").split("/") if "{" not in part])
        for method in route.methods or ():
            found[method] = max(found.get(method, -1), literal)
    best = max(found.values(), default=-1)
    return ", ".join(m for m in _METHODS if found.get(m) == best)


async def _on_unexpected(request: Request, exc: Exception) -> Response:
    # The trace goes to the log, never to the client.
    log.error("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    return problem(500, "Internal Server Error", "an internal error occurred", "internal_error")


def install(app: FastAPI) -> None:
    app.add_exception_handler(errors.BrokerError, _on_broker_error)
    app.add_exception_handler(RequestValidationError, _on_validation_error)
    app.add_exception_handler(StarletteHTTPException, _on_http_error)
    app.add_exception_handler(Exception, _on_unexpected)


#: For OpenAPI: the error responses every operation documents.
def problem_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    from app.api.schemas.common import Problem

    descriptions = {
        400: "Malformed JSON, a form content type, or a Host that is not allowed",
        401: "Missing or bad credentials",
        403: "Not allowed (role, permissions, or a cross-site request)",
        404: "Not found",
        409: "Precondition failed",
        413: "Message too large",
        422: "Validation error (or unroutable)",
        429: "Rate limited",
        503: "Database unavailable",
    }
    return {
        s: {
            "model": Problem,
            "description": descriptions[s],
            "content": {PROBLEM_JSON: {"schema": {"$ref": "#/components/schemas/Problem"}}},
        }
        for s in statuses
    }
