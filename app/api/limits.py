"""A pure ASGI middleware that never lets a request body grow past a limit.

A declared ``Content-Length`` over the limit is refused before the body is read; a chunked
body is counted while it streams and refused the moment it passes the limit.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.api.problems import problem


class BodyTooLarge(Exception):
    pass


def _declared_length(scope: Scope) -> int:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return -1
    return -1


class BodyLimitMiddleware:
    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if _declared_length(scope) > self.max_bytes:
            await self._refuse(scope, receive, send)
            return
        received = 0
        response_started = False
        refused = False

        async def counting_receive() -> Message:
            nonlocal received, refused
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    # Answer 413 now: FastAPI turns any error raised while it reads the body
                    # into its own 400, which tracking_send then drops.
                    if not response_started and not refused:
                        refused = True
                        await self._refuse(scope, receive, send, drain=False)
                    raise BodyTooLarge
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal response_started
            if refused:
                return
            if message["type"] == "http.response.start":
                response_started = True
            await send(message)

        try:
            await self.app(scope, counting_receive, tracking_send)
        except BodyTooLarge:
            if not response_started and not refused:
                await self._refuse(scope, receive, send, drain=False)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send, drain: bool = True) -> None:
        response = problem(
            413,
            "Content Too Large",
            f"the request body is larger than {self.max_bytes} bytes",
            "message_too_large",
        )
        response.headers["Connection"] = "close"
        await response(scope, receive, send)
