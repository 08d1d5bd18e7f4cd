"""The HTTP routes: OpenAI's chat and text completions, Anthropic's Messages (Claude Code), OpenAI's
Responses (Codex), models, health and metrics; Ollama's are ollama.py's, over the same models.

Every generating route does the same five things: check its body (schema.py, apis/anthropic.py,
apis/responses.py), claim the model it names (models.py: loaded if need be; on these routes a
name the server does not serve is the default model), make the prompt's token ids through the
chat template (prompting.py) off the event loop, queue a Turn on that model's worker
(generation/turn.py) and answer through its API's Builder (apis/chat_stream.py,
apis/anthropic_stream.py, apis/responses_stream.py), whole or streamed. So all of them share the
model's engine, its speculation, its queue and limits, its prompt cache and kept drafters across
turns, cancellation when a client leaves. Errors are each API's own shape, chosen by the path
(Anthropic's under /v1/messages, Ollama's under /api/, OpenAI's elsewhere): 400 for what a
request says (a model name "" too), 401 without the key (Bearer, or Anthropic's x-api-key; with
CORS headers, so a browser can read it), 404 for another path, 413 for a body over the limit,
429 when the queue is full, 500 for a model that cannot load, 503 when the worker cannot serve.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from contextlib import asynccontextmanager
from datetime import datetime, timezone
from typing import Callable

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
from specgen.serve.models import Models, Resident
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


def _no_loader(spec: str) -> Engine:
    raise ApiError(500, "this server was given its model loaded, and cannot load another", kind="server_error")


def create_app(engine: Engine, config: ServeConfig, load: Callable[[str], Engine] | None = None) -> FastAPI:
    """The server's ASGI app: `engine` is the default model, loaded (its worker starts with the
    app); the others (config.others) load through `load` when first asked for (models.py)."""
    known = {"draft": config.draft, "memory": config.memory}  # the server's settings every request gets
    started = int(time.time())
    metrics = Metrics()

    def watch(resident: Resident) -> None:
        worker = resident.worker
        metrics.watch(resident.name, running=lambda: worker.in_flight, waiting=lambda: worker.queued)

    models = Models(engine, config.model_name, {config.model_name: config.model, **dict(config.others)},
                    load=load or _no_loader, worker=lambda e: _worker(e, config), max_models=config.max_models,
                    keep_alive=config.keep_alive_s, memory=config.memory, on_load=watch,
                    on_unload=lambda r: metrics.forget(r.name))

    @asynccontextmanager
    async def lifespan(_app):
        models.start()
        sweeper = asyncio.create_task(models.sweep())
        try:
            yield
        finally:
            sweeper.cancel()
            await models.stop()

    app = FastAPI(title="specgen", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.models = models  # (nothing else holds a model: one unloaded is let go)
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

    async def answer(model: Resident, request: HttpRequest, ids: list[int], generation: Generation,
                     splitter: Splitter | None, builder: Builder):
        generic = splitter.tools if splitter is not None and splitter.generic else None
        if generation.options.response_format is not None or generic:  # compiled here: the worker gets no bad one
            generation = await run_in_threadpool(constrained, model.engine, generation, generic)
        turn = Turn.submit(model.engine, model.worker, ids, generation, splitter, builder.label,
                           metrics.of(model.name))
        return await respond(request, turn, builder, generation.stream)

    @app.get("/health")
    async def health():
        workers = [r.worker for r in list(models.resident.values())]
        state = {key: sum(getattr(w, key) for w in workers) for key in ("queued", "served", "cancelled", "failed")}
        state |= {"running": any(w.running is not None for w in workers),
                  "prompt_cache_bytes": sum(w.prompts.nbytes for w in workers), "models": list(models.resident)}
        dead = next((f"{r.name}: {r.worker.dead}" for r in models.resident.values() if r.worker.dead), None)
        if dead is not None:
            return JSONResponse({"status": "dead", "error": dead, **state}, 503)
        return {"status": "ok", **state}

    @app.get("/metrics")
    async def exposition():
        return Response(metrics.exposition(), media_type=METRICS_TYPE)

    @app.get("/v1/models")
    async def listed():
        # OpenAI's list (data), Anthropic's fields on the same entries, and Codex's `models` (empty:
        # it keeps its own defaults for the name it was given)
        when = datetime.fromtimestamp(started, timezone.utc).isoformat()
        data = [{"id": name, "object": "model", "created": started, "owned_by": "specgen", "type": "model",
                 "display_name": name, "created_at": when} for name in models.names()]
        return {"object": "list", "data": data, "has_more": False, "first_id": data[0]["id"],
                "last_id": data[-1]["id"], "models": []}

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatRequest, request: HttpRequest):
        generation = body.generation(config.max_tokens, **known)
        async with models.claim(body.model) as (model, _):
            ids, tools = await run_in_threadpool(chat_ids, model.engine, body)
            builder = ChatBuilder(body.model, chat=True, include_usage=generation.include_usage)
            splitter = Splitter(model.engine, ids, tools, one_call=body.parallel_tool_calls is False)
            return await answer(model, request, ids, generation, splitter, builder)

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: HttpRequest):
        generation = body.generation(config.max_tokens, **known)
        async with models.claim(body.model) as (model, _):
            ids = await run_in_threadpool(completion_ids, model.engine, body)
            builder = ChatBuilder(body.model, chat=False, include_usage=generation.include_usage)
            return await answer(model, request, ids, generation, None, builder)

    @app.post("/v1/messages")
    async def messages(body: MessagesRequest, request: HttpRequest):
        async with models.claim(body.model) as (model, _):
            engine = model.engine
            ids, tools = await run_in_threadpool(agent_ids, engine, *body.conversation())
            generation = body.generation(len(ids), engine.loaded.context_length, **known)
            splitter = Splitter(engine, ids, tools, one_call=body.one_tool_call)
            # max_tokens clamped to the room left: reaching it, the context ended the answer
            builder = MessageBuilder(body.model, context_bound=generation.options.max_tokens < body.max_tokens)
            return await answer(model, request, ids, generation, splitter, builder)

    @app.post("/v1/messages/count_tokens")
    async def count_tokens(body: CountRequest):
        async with models.claim(body.model) as (model, _):
            ids, _ = await run_in_threadpool(agent_ids, model.engine, *body.conversation())
            return {"input_tokens": len(ids)}

    @app.post("/v1/responses")
    async def responses(body: ResponsesRequest, request: HttpRequest):
        messages, tools, custom = body.conversation_messages()
        async with models.claim(body.model) as (model, _):
            engine = model.engine
            ids, tools = await run_in_threadpool(agent_ids, engine, messages, tools)
            generation = body.generation(len(fits(engine, ids, "input")), engine.loaded.context_length,
                                         config.max_tokens, **known)
            builder = ResponseBuilder(body, custom, generation.options.temp)
            splitter = Splitter(engine, ids, tools, one_call=body.parallel_tool_calls is False)
            return await answer(model, request, ids, generation, splitter, builder)

    app.include_router(ollama_routes(models, config, answer, known))
    return app

