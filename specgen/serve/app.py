"""The HTTP routes: OpenAI's chat and text completions (plain and streamed), models and health.

A route checks its request (schema.py), makes the prompt's ids (prompting.py) off the event loop,
queues a job on the worker (worker.py) and shapes the engine's responses as OpenAI's. Errors are
OpenAI's `{"error": {...}}` naming the field: 400 for what a request says, 401 without the key, 404
for another model, 413 for a body over the limit, 429 when the queue is full, 503 worker down.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import time
import uuid
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi import Request as HttpRequest
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.exceptions import HTTPException

from specgen.engine.engine import Engine, Response
from specgen.errors import SettingError, SpecgenError
from specgen.serve.config import ServeConfig
from specgen.serve.limits import BodyLimit
from specgen.serve.prompting import Splitter, chat_ids, completion_ids
from specgen.serve.schema import (
    ApiError,
    ChatRequest,
    CompletionRequest,
    Generation,
    setting_error,
)
from specgen.serve.worker import Job, Worker, stopping_error

_log = logging.getLogger("specgen.serve")
RETRY_AFTER_S = 1  # what a 429 tells the client to wait


def create_app(engine: Engine, config: ServeConfig) -> FastAPI:
    """The server's ASGI app around one loaded engine (its worker starts with the app)."""
    worker = Worker(engine, max_queue=config.max_queue, prompt_cache_bytes=config.prompt_cache_bytes)
    names = {config.model_name, engine.name, engine.loaded.spec.source, "default_model"}
    started = int(time.time())

    @asynccontextmanager
    async def lifespan(_app):
        worker.start()
        try:
            yield
        finally:
            await run_in_threadpool(worker.stop, 10.0)
            if config.memory:
                engine.save_memory()

    app = FastAPI(title="specgen", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.worker = worker
    app.add_middleware(BodyLimit, max_bytes=config.max_body_bytes)
    if config.allowed_origins:
        from starlette.middleware.cors import CORSMiddleware
        app.add_middleware(CORSMiddleware, allow_origins=list(config.allowed_origins), allow_methods=["*"],
                           allow_headers=["*"])

    @app.exception_handler(ApiError)
    async def api_error(_request, e: ApiError):
        return JSONResponse(e.body(), e.status, headers={"Retry-After": str(RETRY_AFTER_S)} if e.status == 429 else None)

    @app.exception_handler(RequestValidationError)
    async def invalid(_request, e: RequestValidationError):
        return await api_error(_request, _validation_error(e))

    @app.exception_handler(HTTPException)
    async def http_error(_request, e: HTTPException):
        kind = "not_found_error" if e.status_code == 404 else "invalid_request_error"
        return await api_error(_request, ApiError(e.status_code, str(e.detail), kind=kind))

    @app.middleware("http")
    async def authorize(request: HttpRequest, call_next):
        if config.api_key and request.url.path.startswith("/v1/") and request.method != "OPTIONS":  # CORS preflights carry no key
            given = request.headers.get("authorization", "")
            if not secrets.compare_digest(given.encode(), f"Bearer {config.api_key}".encode()):
                return JSONResponse(ApiError(401, "missing or wrong API key (Authorization: Bearer KEY)",
                                             code="invalid_api_key", kind="authentication_error").body(), 401)
        return await call_next(request)

    def check_model(name: str) -> None:
        if name not in names:
            raise ApiError(404, f"model: this server serves {config.model_name!r}, not {name!r}", "model",
                           "model_not_found", kind="not_found_error")

    @app.get("/health")
    async def health():
        state = {"queued": worker.queued, "running": worker.running is not None, "served": worker.served,
                 "cancelled": worker.cancelled, "failed": worker.failed, "prompt_cache_bytes": worker.prompts.nbytes}
        if worker.dead is not None:
            return JSONResponse({"status": "dead", "error": worker.dead, **state}, 503)
        return {"status": "ok", **state}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": config.model_name, "object": "model", "created": started,
                                            "owned_by": "specgen"}]}

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatRequest, request: HttpRequest):
        check_model(body.model)
        generation = body.generation(config.max_tokens, draft=config.draft, memory=config.memory)
        ids, tools = await run_in_threadpool(chat_ids, engine, body)
        splitter = Splitter(engine, ids, tools)
        return await _answer(request, worker, Shape("chat.completion", body.model), ids, generation, splitter)

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: HttpRequest):
        check_model(body.model)
        generation = body.generation(config.max_tokens, draft=config.draft, memory=config.memory)
        ids = await run_in_threadpool(completion_ids, engine, body)
        return await _answer(request, worker, Shape("text_completion", body.model), ids, generation, None)

    return app


def _validation_error(e: RequestValidationError) -> ApiError:
    """A 400 naming the first field pydantic refused (`messages[0].content`), or the body."""
    first = e.errors()[0]
    loc = [p for p in first.get("loc", ()) if p != "body"]
    if first.get("type") == "json_invalid":
        return ApiError(400, f"the body is not valid JSON: {first.get('ctx', {}).get('error', first['msg'])}")
    # Union members add their type's name to the location ("str", "list[TextPart]",
    # "function-after", ...): keep only the request's own path, lower-case field names and indices.
    loc = [p for p in loc if isinstance(p, int) or p.isidentifier() and p.islower() and p not in _TYPES]
    param = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc).lstrip(".") or None
    what = "is not a field specgen knows (and so would be ignored)" if first["type"] == "extra_forbidden" \
        else first["msg"][0].lower() + first["msg"][1:]
    return ApiError(400, f"{param or 'body'}: {what}", param)


_TYPES = {"str", "int", "float", "bool", "list", "dict"}


class Shape:
    """OpenAI's object shapes for one endpoint and request: ids, chunks, final bodies."""

    def __init__(self, kind: str, model: str):
        self.chat = kind == "chat.completion"
        self.kind, self.model = kind, model
        self.id = f"{'chatcmpl' if self.chat else 'cmpl'}-{uuid.uuid4().hex}"
        self.created = int(time.time())

    def head(self, chunk: bool) -> dict:
        kind = self.kind + (".chunk" if chunk and self.chat else "")
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}

    def chunk(self, content: str = "", reasoning: str = "", tool_calls=(), finish: str | None = None,
              first: bool = False) -> dict:
        if self.chat:
            delta = {"role": "assistant", "content": ""} if first else {}
            delta.update({k: v for k, v in (("content", content), ("reasoning", reasoning)) if v})
            if tool_calls:
                delta["tool_calls"] = list(tool_calls)
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": content, "logprobs": None, "finish_reason": finish}
        return {**self.head(True), "choices": [choice]}

    def whole(self, content: str, reasoning: str, tool_calls: list, finish: str, stats) -> dict:
        if self.chat:
            message = {"role": "assistant", "content": content or (None if tool_calls else "")}
            if reasoning:
                message["reasoning"] = reasoning
            if tool_calls:
                message["tool_calls"] = [{k: v for k, v in c.items() if k != "index"} for c in tool_calls]
            choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": content, "logprobs": None, "finish_reason": finish}
        return {**self.head(False), "choices": [choice], "usage": usage(stats), "specgen": specgen_stats(stats)}


def generated(stats) -> int:
    """Tokens the model generated, a stop token included (as OpenAI and mlx_lm.server count)."""
    return len(stats.output_ids) + (stats.stop_token is not None)


def usage(stats) -> dict:
    prompt, completion = stats.prompt_tokens, generated(stats)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": stats.cached_tokens},
            "completion_tokens_details": {"accepted_prediction_tokens": stats.prediction_accepted,
                                          "rejected_prediction_tokens": stats.prediction_drafted - stats.prediction_accepted,
                                          "reasoning_tokens": 0}}


def specgen_stats(stats) -> dict:
    c = stats.counts
    return {"steps": c.steps, "drafted": c.drafted, "accepted": c.accepted,
            "tokens_per_step": round(c.tokens_per_step, 4), "decode_tps": round(stats.decode_tps, 3),
            "prompt_tps": round(stats.prompt_tps, 3), "speculation": str(stats.speculation)}


def _log_line(shape: Shape, stats, cancelled: bool) -> None:
    c = stats.counts
    _log.info("%s %s: %d prompt tokens (%d cached), %d tokens, %.1f tok/s, %.2f tokens/step%s", shape.kind,
              shape.id[-8:], stats.prompt_tokens, stats.cached_tokens, generated(stats), stats.decode_tps,
              c.tokens_per_step, " (cancelled)" if cancelled else "")


def _finish(shape: Shape, splitter: Splitter | None, stats) -> str:
    reason = stats.finish_reason or "stop"
    return "tool_calls" if reason == "stop" and splitter is not None and splitter.called else reason


async def _answer(request: HttpRequest, worker: Worker, shape: Shape, ids: list[int], generation: Generation,
                  splitter: Splitter | None):
    loop = asyncio.get_running_loop()
    items: asyncio.Queue = asyncio.Queue()
    job = Job(ids, generation.options, generation.prediction, lambda item: loop.call_soon_threadsafe(items.put_nowait, item))
    worker.submit(job)

    def parts(response: Response):
        last = response.finish_reason is not None
        return splitter.add(response.text, last) if splitter is not None else (response.text, "", ())

    if not generation.stream:
        watcher = asyncio.create_task(_cancel_on_disconnect(request, job))
        content, reasoning, calls = "", "", []
        try:
            while True:
                item = await items.get()
                if isinstance(item, Response):
                    text, think, called = parts(item)
                    content, reasoning = content + text, reasoning + think
                    calls.extend(called)
                    continue
                if isinstance(item, Exception):
                    raise _as_api_error(item)
                _log_line(shape, item.stats, item.cancelled)
                if item.cancelled:  # its client is gone, or the server is stopping
                    raise stopping_error()
                break
        finally:
            watcher.cancel()
            job.cancel()  # a no-op once finished; stops the work if this handler was cancelled
        return shape.whole(content, reasoning, calls, _finish(shape, splitter, item.stats), item.stats)

    async def events():
        yield _sse(shape.chunk(first=True))
        try:
            while True:
                item = await items.get()
                if isinstance(item, Response):
                    text, think, called = parts(item)
                    if text or think or called:
                        yield _sse(shape.chunk(text, think, called))
                    continue
                if isinstance(item, Exception):
                    yield _sse(_as_api_error(item).body())
                    return
                stats = item.stats
                _log_line(shape, stats, item.cancelled)
                if item.cancelled:
                    yield _sse(stopping_error().body())
                    return
                final = shape.chunk(finish=_finish(shape, splitter, stats))
                final["specgen"] = specgen_stats(stats)
                yield _sse(final)
                if generation.include_usage:
                    yield _sse({**shape.head(True), "choices": [], "usage": usage(stats)})
                yield "data: [DONE]\n\n"
                return
        finally:
            job.cancel()  # the client left (Starlette cancels this stream) or it is over

    return StreamingResponse(events(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


def _sse(payload: dict) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


def _as_api_error(e: Exception) -> ApiError:
    if isinstance(e, ApiError):
        return e
    if isinstance(e, SettingError):
        return setting_error(e)
    if isinstance(e, SpecgenError):
        return ApiError(400, str(e))
    return ApiError(500, f"generation failed: {type(e).__name__}: {e}", kind="server_error")


async def _cancel_on_disconnect(request: HttpRequest, job: Job) -> None:
    """Cancel `job` when its client goes away (the body is read: receive() waits for that)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            job.cancel()
            return
