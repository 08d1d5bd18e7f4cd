"""Refusing request bodies over a size before they are read whole (413, in OpenAI's error shape)."""

from __future__ import annotations

import json


class BodyLimit:
    """ASGI middleware: a body longer than `max_bytes` (by its Content-Length, or as it arrives)
    is answered 413 and never handed to the routes."""

    def __init__(self, app, max_bytes: int):
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope.get("headers", ())).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            return await self._refuse(send)
        seen = 0

        async def counted():
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.max_bytes:
                raise _TooLarge
            return message

        try:
            await self.app(scope, counted, send)
        except _TooLarge:
            await self._refuse(send)

    async def _refuse(self, send):
        body = json.dumps({"error": {"message": f"the request body is over {self.max_bytes} bytes",
                                     "type": "invalid_request_error", "param": None,
                                     "code": "request_too_large"}}).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})


class _TooLarge(Exception):
    pass
