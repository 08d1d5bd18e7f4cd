"""Refusing request bodies over a size before the routes read them (413, in the error shape of the
API asked)."""

from __future__ import annotations

import json
from collections.abc import Callable

from specgen.serve.schema import ApiError


class BodyLimit:
    """ASGI middleware: a body longer than `max_bytes` (by its Content-Length, or as it arrives)
    is answered 413 and never handed to the routes. `error_body(path, error)` shapes the answer."""

    def __init__(self, app, max_bytes: int, error_body: Callable[[str, ApiError], dict]):
        self.app, self.max_bytes, self.error_body = app, max_bytes, error_body

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope.get("headers", ())).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            return await self._refuse(scope, send)
        # The body is read whole here, not counted as the routes read it: FastAPI answers anything
        # raised while it reads a body as a 400.
        received, seen = [], 0
        while True:
            message = await receive()
            received.append(message)
            if message["type"] != "http.request":  # the client left
                break
            seen += len(message.get("body", b""))
            if seen > self.max_bytes:
                return await self._refuse(scope, send)
            if not message.get("more_body"):
                break

        async def replayed():
            return received.pop(0) if received else await receive()

        await self.app(scope, replayed, send)

    async def _refuse(self, scope, send):
        error = ApiError(413, f"the request body is over {self.max_bytes} bytes", code="request_too_large")
        body = json.dumps(self.error_body(scope.get("path", ""), error)).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})
