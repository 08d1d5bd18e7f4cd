"""The HTTP/1.1 protocol the server speaks: uvicorn's h11 one, but a request head (its line and
headers) over the limit is answered 431 in the error shape of the API asked.

uvicorn answers h11's complaint about such a head with a plain-text 400 and closes at once, while
the client is still sending the head: the close resets the connection and the client reads
nothing. Here the rest of the head is read and dropped for a while after the 431, so the client
gets to read it. The server always runs this h11 protocol (uvicorn's "auto" would pick httptools
where it is installed, which has no such limit).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from specgen.serve.schema import ApiError

DRAIN_S = 5.0  # after a 431, how long the rest of the request is read and dropped before closing
_log = logging.getLogger("specgen.serve")


class _Connection(h11.Connection):
    """h11's connection, keeping the status its last complaint about the client suggests."""

    hint: int | None = None

    def next_event(self):
        try:
            return super().next_event()
        except h11.RemoteProtocolError as e:
            self.hint = e.error_status_hint
            raise


def protocol(max_head_bytes: int, error_body: Callable[[str, ApiError], dict]) -> type[H11Protocol]:
    """The protocol class for uvicorn (its `http`): heads up to `max_head_bytes`, the 431 beyond
    shaped by `error_body(path, error)`."""

    class Protocol(H11Protocol):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.conn = _Connection(h11.SERVER, max_head_bytes)
            self.head = b""  # the start of the request being received: its path chooses the error's shape
            self.draining = False

        def data_received(self, data: bytes) -> None:
            if self.draining:
                return
            if self.conn.their_state is h11.IDLE and len(self.head) < 2048:
                self.head += data[:2048]
            super().data_received(data)

        def on_response_complete(self) -> None:
            self.head = b""
            super().on_response_complete()

        def send_400_response(self, msg: str) -> None:
            if self.conn.hint != 431:
                return super().send_400_response(msg)
            target = self.head.split(b"\r\n", 1)[0].split(b" ")
            path = target[1].split(b"?")[0].decode("latin-1") if len(target) > 1 else ""
            _log.warning("a request head over %d bytes was refused (431)", max_head_bytes)
            error = ApiError(431, f"the request's line and headers are over {max_head_bytes} bytes",
                             code="request_header_fields_too_large")
            body = json.dumps(error_body(path, error)).encode()
            headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                       (b"connection", b"close")]
            response = h11.Response(status_code=431, headers=headers)
            for event in (response, h11.Data(data=body), h11.EndOfMessage()):
                self.transport.write(self.conn.send(event))
            self.draining = True
            if self.transport.can_write_eof():
                self.transport.write_eof()
            self.loop.call_later(DRAIN_S, self.transport.close)

    return Protocol
