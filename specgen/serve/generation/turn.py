"""One request's generation as every API's route sees it: prompt ids in, pieces of a message out.

`Turn.submit` queues a job on the worker (429 when the queue is full, 503 when it cannot serve).
`Turn.pieces` then yields `Started` when the worker takes the job (with the prompt cache's hit),
the assistant message's `Parts` as they come (text, reasoning, finished tool calls: prompting's
Splitter) and `Done` last; an error, or a job cancelled under it, comes out as ApiError.
`respond` turns the pieces into an API's answer through that API's `Builder`: its JSON body, or
its server-sent events, so a streamed answer is the events of the very message a plain one is.
A client that leaves cancels its job: a watcher on the request (plain answers) or the stream's
close (streamed ones). Chat completions, Anthropic's Messages and OpenAI's Responses all go
through here: one queue, engine, prompt cache and set of kept drafters.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import NamedTuple, Protocol, Union

from fastapi import Request as HttpRequest
from fastapi.responses import StreamingResponse

from specgen.engine.engine import Engine, Response
from specgen.errors import SettingError, SpecgenError
from specgen.serve.generation.worker import Finished, Job, Started, Worker, stopping_error
from specgen.serve.metrics import ModelMetrics
from specgen.serve.prompting import Parts, Splitter
from specgen.serve.schema import ApiError, Generation, setting_error

_log = logging.getLogger("specgen.serve")


class Done(NamedTuple):
    """The generation is over: its stats, the finish reason ("stop", "length" or "tool_calls") and
    the stop string that ended it, if one did."""

    stats: object
    finish: str
    stop_sequence: str | None = None


Piece = Union[Started, Parts, Done]
Event = tuple[Union[str, None], Union[dict, str]]  # (SSE event name or None, payload; a str goes as is)


class Builder(Protocol):
    """An API's shapes for one answer: what its stream says for each piece, and the whole body.
    A builder with a true `ndjson` attribute streams one JSON object a line (Ollama's), not
    server-sent events."""

    def opening(self) -> list[Event]:
        """Events a stream starts with, before the worker has taken the job."""

    def feed(self, piece: Piece) -> list[Event]:
        """Take one piece into the answer; the events that stream it."""

    def failed(self, error: ApiError) -> list[Event]:
        """The events that end a stream with `error`."""

    def whole(self) -> dict:
        """The complete answer, once `Done` was fed."""


def generated(stats) -> int:
    """Tokens the model generated, a stop token included (as OpenAI and mlx_lm.server count)."""
    return len(stats.output_ids) + (stats.stop_token is not None)


class Turn:
    """One request's job on the worker, and the pieces of the message it generates."""

    def __init__(self, engine: Engine, ids: list[int], generation: Generation, splitter: Splitter | None,
                 label: str, metrics: ModelMetrics | None = None):
        self.engine, self.splitter, self.label, self.metrics = engine, splitter, label, metrics
        self.arrived, self._first, self._counted = time.perf_counter(), True, False
        loop = asyncio.get_running_loop()
        self.items: asyncio.Queue = asyncio.Queue()
        self.job = Job(ids, generation.options, generation.prediction,
                       lambda item: loop.call_soon_threadsafe(self.items.put_nowait, item))

    @classmethod
    def submit(cls, engine: Engine, worker: Worker, ids: list[int], generation: Generation,
               splitter: Splitter | None, label: str, metrics: ModelMetrics | None = None) -> Turn:
        """Queue the generation (ApiError 429 / 503 when the worker cannot take it); its figures
        go to `metrics` as it ends."""
        turn = cls(engine, ids, generation, splitter, label, metrics)
        worker.submit(turn.job)
        return turn

    async def pieces(self, watch: HttpRequest | None = None) -> AsyncIterator[Piece]:
        """Started, Parts..., Done; cancels the job when closed early or when `watch`'s client leaves."""
        watcher = asyncio.create_task(_cancel_on_disconnect(watch, self.job)) if watch is not None else None
        try:
            while True:
                item = await self.items.get()
                if isinstance(item, Started):
                    yield item
                elif isinstance(item, Response):
                    if self._first and self.metrics is not None:
                        self.metrics.first_token(time.perf_counter() - self.arrived)
                    self._first = False
                    parts = self._parts(item)
                    if parts != Parts():
                        yield parts
                elif isinstance(item, Finished):
                    _log_line(self.label, item.stats, item.cancelled)
                    if item.cancelled:  # its client is gone, or the server is stopping
                        self._ended("abort")
                        raise stopping_error()
                    done = self._done(item.stats)
                    if self.metrics is not None:
                        self.metrics.finished(item.stats, done.finish, generated(item.stats),
                                              time.perf_counter() - self.arrived)
                    self._counted = True
                    yield done
                    return
                else:
                    self._ended("error")
                    raise as_api_error(item)
        finally:
            if watcher is not None:
                watcher.cancel()
            self.job.cancel()  # a no-op once finished; stops the work if the answer was abandoned
            self._ended("abort")  # a stream whose reader left before its end (counted once)

    def _ended(self, reason: str) -> None:
        if self.metrics is not None and not self._counted:
            self.metrics.ended(reason)
        self._counted = True

    def _parts(self, response: Response) -> Parts:
        if self.splitter is None:
            return Parts(response.text)
        return self.splitter.add(response.text, response.finish_reason is not None)

    def _done(self, stats) -> Done:
        reason = stats.finish_reason or "stop"
        if reason == "stop" and self.splitter is not None and self.splitter.called:
            return Done(stats, "tool_calls")
        return Done(stats, reason, stats.stop_string)


async def respond(request: HttpRequest, turn: Turn, builder: Builder, stream: bool):
    """The answer: `builder`'s whole body, or a stream of its events."""
    if not stream:
        async with aclosing(turn.pieces(watch=request)) as pieces:
            async for piece in pieces:
                builder.feed(piece)
        return builder.whole()

    ndjson = getattr(builder, "ndjson", False)
    encode = ndjson_line if ndjson else sse

    async def events():
        for event in builder.opening():
            yield encode(*event)
        async with aclosing(turn.pieces()) as pieces:
            try:
                async for piece in pieces:
                    for event in builder.feed(piece):
                        yield encode(*event)
            except ApiError as e:
                for event in builder.failed(e):
                    yield encode(*event)

    return StreamingResponse(events(), media_type="application/x-ndjson" if ndjson else "text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


def sse(name: str | None, payload: dict | str) -> str:
    """One server-sent event: `event: NAME` when named, then its data."""
    data = payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False)
    return f"{f'event: {name}' + chr(10) if name else ''}data: {data}\n\n"


def ndjson_line(_name: str | None, payload: dict | str) -> str:
    """One line of an NDJSON stream."""
    return (payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False)) + "\n"


def as_api_error(e: Exception) -> ApiError:
    """What a request's failure on the worker answers."""
    if isinstance(e, ApiError):
        return e
    if isinstance(e, SettingError):
        return setting_error(e)
    if isinstance(e, SpecgenError):
        return ApiError(400, str(e))
    return ApiError(500, f"generation failed: {type(e).__name__}: {e}", kind="server_error")


def _log_line(label: str, stats, cancelled: bool) -> None:
    c = stats.counts
    _log.info("%s: %d prompt tokens (%d cached), %d tokens, %.1f tok/s, %.2f tokens/step%s", label,
              stats.prompt_tokens, stats.cached_tokens, generated(stats), stats.decode_tps,
              c.tokens_per_step, " (cancelled)" if cancelled else "")


async def _cancel_on_disconnect(request: HttpRequest, job: Job) -> None:
    """Cancel `job` when its client goes away (the body is read: receive() waits for that)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            job.cancel()
            return
