"""The HTTP routes: OpenAI's chat and text completions, Anthropic's Messages (Claude Code), OpenAI's
Responses (Codex), models and health; Ollama's are ollama.py's, on the same queue.

Every generating route does the same four things: check its body (schema.py, apis/anthropic.py,
apis/responses.py), make the prompt's token ids through the chat template (prompting.py) off the event
loop, queue a Turn on the one worker (generation/turn.py) and answer through its API's Builder
(apis/chat_stream.py, apis/anthropic_stream.py, apis/responses_stream.py), whole or streamed. So all of them
share the engine, its speculation, the queue and its limits, the prompt cache and kept drafters
across turns, cancellation when a client leaves. Errors are each API's own shape, chosen by the
path (Anthropic's under /v1/messages, Ollama's under /api/, OpenAI's elsewhere): 400 for what a request says, 401
without the key (Bearer, or Anthropic's x-api-key; with CORS headers, so a browser can read it),
404 for another path, 413 for a body over the limit, 429 when the queue is full, 503 when the
worker cannot serve. Every route serves any model name (but "") with the loaded model.
"""

from __future__ import annotations

import logging
import secrets
import time
from contextlib import asynccontextmanager
from datetime import datetime, timezone

from fastapi import FastAPI
from fastapi import Request as HttpRequest
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException
from starlette.middleware.cors import CORSMiddleware

from specgen.engine.batch.probe import batch_unsupported
from specgen.engine.engine import Engine
from specgen.serve.apis import anthropic, ollama
from specgen.serve.apis.anthropic import CountRequest, MessagesRequest
from specgen.serve.apis.anthropic_stream import MessageBuilder
from specgen.serve.apis.chat import ChatRequest, CompletionRequest
from specgen.serve.apis.chat_stream import ChatBuilder
from specgen.serve.apis.responses import ResponsesRequest
from specgen.serve.apis.responses_stream import ResponseBuilder
from specgen.serve.apis.structured import constrained
from specgen.serve.config import ServeConfig
from specgen.serve.generation.batch_worker import BatchWorker
from specgen.serve.generation.turn import Builder, Turn, respond
from specgen.serve.generation.worker import Worker
from specgen.serve.limits import BodyLimit
from specgen.serve.metrics import CONTENT_TYPE as METRICS_TYPE
from specgen.serve.metrics import Metrics
from specgen.serve.ollama import ollama_routes
from specgen.serve.prompting import Splitter, agent_ids, chat_ids, completion_ids, fits
from specgen.serve.schema import ApiError, Generation, validation_error

_log = logging.getLogger("specgen.serve")
RETRY_AFTER_S = 1  # what a 429 tells the client to wait
GUARDED = ("/v1/", "/api/", "/metrics")  # behind --api-key (/health and Ollama's "/" are not)


def error_body(path: str, e: ApiError) -> dict:
    """`e` in the error shape of the API `path` belongs to."""
    if path.startswith("/v1/messages"):
        return anthropic.error_body(e)
    return ollama.error_body(e) if path.startswith("/api/") else e.body()


def _worker(engine: Engine, config: ServeConfig) -> Worker:
    """The generation thread: requests decoded together up to --max-batch, where the model's
    caches batch (else one at a time, said once), their batched step costs read or measured now
    (a first request that drafts would otherwise wait for it, and every request behind it)."""
    why = batch_unsupported(engine.loaded.model) if config.max_batch > 1 else None
    if why:
        _log.warning("requests run one at a time: %s", why)
    if config.max_batch > 1 and not why:
        worker = BatchWorker(engine, max_queue=config.max_queue, prompt_cache_bytes=config.prompt_cache_bytes,
                             max_batch=config.max_batch)
        if config.draft is None and not engine.costs().off:  # drafts priced by rows, before it answers
            worker.streams.price()
        return worker
    return Worker(engine, max_queue=config.max_queue, prompt_cache_bytes=config.prompt_cache_bytes)


def create_app(engine: Engine, config: ServeConfig) -> FastAPI:
    """The server's ASGI app around one loaded engine (its worker starts with the app)."""
    worker = _worker(engine, config)
    known = {"draft": config.draft, "memory": config.memory}  # the server's settings every request gets
    context = engine.loaded.context_length
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
    metrics = Metrics(config.model_name, running=lambda: worker.in_flight, waiting=lambda: worker.queued)
    app.add_middleware(BodyLimit, max_bytes=config.max_body_bytes, error_body=error_body)

    @app.exception_handler(ApiError)
    async def api_error(request: HttpRequest, e: ApiError):
        return JSONResponse(error_body(request.url.path, e), e.status,
                            headers={"Retry-After": str(RETRY_AFTER_S)} if e.status == 429 else None)

    @app.exception_handler(RequestValidationError)
    async def invalid(request, e: RequestValidationError):
        return await api_error(request, validation_error(e.errors()))

    @app.exception_handler(HTTPException)
    async def http_error(request, e: HTTPException):
        kind = "not_found_error" if e.status_code == 404 else "invalid_request_error"
        return await api_error(request, ApiError(e.status_code, str(e.detail), kind=kind))

    @app.middleware("http")
    async def authorize(request: HttpRequest, call_next):
        # CORS preflights carry no key; Anthropic's clients send theirs as x-api-key
        if config.api_key and request.url.path.startswith(GUARDED) and request.method != "OPTIONS":
            headers = request.headers
            given = headers.get("x-api-key") or headers.get("authorization", "").removeprefix("Bearer ")
            if not secrets.compare_digest(given.encode(), config.api_key.encode()):
                e = ApiError(401, "missing or wrong API key (Authorization: Bearer KEY, or x-api-key: KEY)",
                             code="invalid_api_key", kind="authentication_error")
                return JSONResponse(error_body(request.url.path, e), 401)
        return await call_next(request)

    if config.allowed_origins:  # added last, so outermost: every answer gets its headers, a 401 too
        app.add_middleware(CORSMiddleware, allow_origins=list(config.allowed_origins), allow_methods=["*"],
                           allow_headers=["*"])

    async def answer(request: HttpRequest, ids: list[int], generation: Generation, splitter: Splitter | None,
                     builder: Builder):
        generic = splitter.tools if splitter is not None and splitter.generic else None
        if generation.options.response_format is not None or generic:  # compiled here: the worker gets no bad one
            generation = await run_in_threadpool(constrained, engine, generation, generic)
        turn = Turn.submit(engine, worker, ids, generation, splitter, builder.label, metrics)
        return await respond(request, turn, builder, generation.stream)

    @app.get("/health")
    async def health():
        state = {"queued": worker.queued, "running": worker.running is not None, "served": worker.served,
                 "cancelled": worker.cancelled, "failed": worker.failed, "prompt_cache_bytes": worker.prompts.nbytes}
        if worker.dead is not None:
            return JSONResponse({"status": "dead", "error": worker.dead, **state}, 503)
        return {"status": "ok", **state}

    @app.get("/metrics")
    async def exposition():
        return Response(metrics.exposition(), media_type=METRICS_TYPE)

    @app.get("/v1/models")
    async def models():
        # OpenAI's list (data), Anthropic's fields on the same entry, and Codex's `models` (empty:
        # it keeps its own defaults for the name it was given)
        name = config.model_name
        entry = {"id": name, "object": "model", "created": started, "owned_by": "specgen", "type": "model",
                 "display_name": name, "created_at": datetime.fromtimestamp(started, timezone.utc).isoformat()}
        return {"object": "list", "data": [entry], "has_more": False, "first_id": name, "last_id": name, "models": []}

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatRequest, request: HttpRequest):
        generation = body.generation(config.max_tokens, **known)
        ids, tools = await run_in_threadpool(chat_ids, engine, body)
        builder = ChatBuilder(body.model, chat=True, include_usage=generation.include_usage)
        splitter = Splitter(engine, ids, tools, one_call=body.parallel_tool_calls is False)
        return await answer(request, ids, generation, splitter, builder)

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: HttpRequest):
        generation = body.generation(config.max_tokens, **known)
        ids = await run_in_threadpool(completion_ids, engine, body)
        builder = ChatBuilder(body.model, chat=False, include_usage=generation.include_usage)
        return await answer(request, ids, generation, None, builder)

    @app.post("/v1/messages")
    async def messages(body: MessagesRequest, request: HttpRequest):
        ids, tools = await run_in_threadpool(agent_ids, engine, *body.conversation())
        generation = body.generation(len(ids), context, **known)
        splitter = Splitter(engine, ids, tools, one_call=body.one_tool_call)
        # max_tokens clamped to the room left: reaching it, the context ended the answer
        builder = MessageBuilder(body.model, context_bound=generation.options.max_tokens < body.max_tokens)
        return await answer(request, ids, generation, splitter, builder)

    @app.post("/v1/messages/count_tokens")
    async def count_tokens(body: CountRequest):
        ids, _ = await run_in_threadpool(agent_ids, engine, *body.conversation())
        return {"input_tokens": len(ids)}

    @app.post("/v1/responses")
    async def responses(body: ResponsesRequest, request: HttpRequest):
        messages, tools, custom = body.conversation_messages()
        ids, tools = await run_in_threadpool(agent_ids, engine, messages, tools)
        generation = body.generation(len(fits(engine, ids, "input")), context, config.max_tokens, **known)
        builder = ResponseBuilder(body, custom, generation.options.temp)
        splitter = Splitter(engine, ids, tools, one_call=body.parallel_tool_calls is False)
        return await answer(request, ids, generation, splitter, builder)

    app.include_router(ollama_routes(engine, config, answer, known))
    return app

