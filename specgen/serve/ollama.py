"""Ollama's routes on the same port as the others, over the same engine, queue and prompt cache:
`GET|HEAD /` ("Ollama is running"), `/api/version`, `/api/tags`, `/api/show`, `/api/ps`,
`/api/chat` and `/api/generate` (NDJSON streams by default; `"stream": false` one object).

Each served model is named `NAME:latest` (NAME its alias or folder name, case kept) and every
route takes the name with or without the tag; another name is Ollama's 404. A request loads its
model if it is not resident (models.py; its `load_duration` says how long it waited) and its
`keep_alive` sets how long the model stays once idle. An empty `messages` or `prompt` only loads
the model and answers `done_reason: "load"`, as Ollama does. `/api/version` answers the Ollama
release whose API this follows (OLLAMA_VERSION), so that clients gating features on it (tools,
structured outputs, `think`) offer them.
"""

from __future__ import annotations

import hashlib
import time
from datetime import datetime, timezone
from typing import Awaitable, Callable

from fastapi import APIRouter
from fastapi import Request as HttpRequest
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import PlainTextResponse

from specgen.engine.engine import Engine
from specgen.serve.apis.ollama import TAG, ChatRequest, GenerateRequest, ShowRequest, keep_alive
from specgen.serve.apis.ollama_stream import OllamaBuilder, now_iso
from specgen.serve.config import ServeConfig
from specgen.serve.models import Models
from specgen.serve.prompting import Splitter, chat_ids, fits, known_ids, template_ids, templated, text_ids

LISTED = ("name", "model", "size", "digest", "details")  # what /api/tags and /api/ps show of a model
OLLAMA_VERSION = "0.12.0"  # the API followed: tool calls streamed, `format` schemas, `think`
Answer = Callable[..., Awaitable[object]]


def describe(engine: Engine, name: str) -> dict:
    """What /api/tags, /api/show and /api/ps say of a loaded model: its size, digest, details,
    and what /api/show adds (kept after it unloads: /api/show does not load it again)."""
    import mlx.core as mx
    from mlx.utils import tree_flatten

    loaded, config = engine.loaded, engine.loaded.config
    flat = tree_flatten(loaded.model.parameters())
    bits = (config.get("quantization") or {}).get("bits")
    count = 0
    for path, v in flat:  # quantized weights: 32 / bits to a uint32; their scales and biases are no weights
        if not (bits and path.endswith((".scales", ".biases"))):
            count += v.size * (32 // bits if bits and v.dtype == mx.uint32 else 1)
    family, tools = config.get("model_type", "unknown"), templated(engine)
    level = f"Q{bits}" if bits else (loaded.dtype or str(config.get("torch_dtype", "float32"))).upper()
    return {"name": f"{name}:{TAG}", "model": f"{name}:{TAG}", "size": sum(v.nbytes for _, v in flat),
            "digest": hashlib.sha256(f"{loaded.calibration_key}|{name}".encode()).hexdigest(),
            "details": {"parent_model": "", "format": "safetensors", "family": family, "families": [family],
                        "parameter_size": _short(count), "quantization_level": level.replace("FLOAT", "F")},
            "parameter_count": count, "context_length": loaded.context_length, "tools": tools,
            "template": (getattr(loaded.tokenizer, "chat_template", None) or "") if tools else ""}


def _short(count: int) -> str:
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if count >= size:
            return f"{count / size:.3g}{unit}"
    return str(count)


def ollama_routes(models: Models, config: ServeConfig, answer: Answer, known: dict) -> APIRouter:
    """The router of Ollama's API over `models`; `answer` queues a generation as the other routes
    do (app.py), `known` are the server's settings every request gets."""
    router = APIRouter()
    started = now_iso()
    described: dict[str, dict] = {}  # kept after a model unloads: /api/tags still shows its size

    def entry(name: str) -> dict:
        resident = models.resident.get(name)
        if resident is not None and name not in described:
            described[name] = describe(resident.engine, name)
        found = described.get(name) or {"name": f"{name}:{TAG}", "model": f"{name}:{TAG}", "size": 0,
                                        "digest": hashlib.sha256(name.encode()).hexdigest(), "details": {}}
        return {k: v for k, v in found.items() if k in LISTED}

    async def only_load(body, chat: bool) -> dict:
        """Ollama's answer to no prompt: the model loaded, or unloaded with keep_alive 0."""
        if keep_alive(body.keep_alive) == 0:
            await models.unload_named(body.model)
            reason = "unload"
        else:
            async with claim(body):
                reason = "load"
        reply = {"model": body.model, "created_at": now_iso(), "done_reason": reason, "done": True}
        return {**reply, "message": {"role": "assistant", "content": ""}} if chat else {**reply, "response": ""}

    def claim(body):
        return models.claim(body.model, any_name=False, keep_alive=keep_alive(body.keep_alive))

    @router.api_route("/", methods=["GET", "HEAD"], response_class=PlainTextResponse)
    async def running():
        return "Ollama is running"

    @router.get("/api/version")
    async def version():
        return {"version": OLLAMA_VERSION}

    @router.get("/api/tags")
    async def tags():
        return {"models": [{**entry(name), "modified_at": started} for name in models.names()]}

    @router.get("/api/ps")
    async def ps():
        out = []
        for name, resident in list(models.resident.items()):
            expires = resident.expires
            until = "2318-01-01T00:00:00Z" if expires is None else \
                datetime.fromtimestamp(time.time() + expires - time.monotonic(), timezone.utc).isoformat()
            found = entry(name)
            out.append({**found, "expires_at": until, "size_vram": found["size"],
                        "context_length": described[name]["context_length"]})
        return {"models": out}

    @router.post("/api/show")
    async def show(body: ShowRequest):
        name = models.named(body.which(), any_name=False)
        if name not in described:  # never loaded yet: once, to read it (then it may unload)
            async with models.claim(name, any_name=False):
                entry(name)
        found = described[name]
        arch, context = found["details"]["family"], found["context_length"]
        info = {"general.architecture": arch, "general.parameter_count": found["parameter_count"]}
        if context is not None:
            info[f"{arch}.context_length"] = context
        return {"modelfile": f"# served by specgen\nFROM {name}\n", "parameters": "",
                "template": found["template"], "details": found["details"], "model_info": info,
                "capabilities": ["completion"] + (["tools"] if found["tools"] else []), "modified_at": started}

    @router.post("/api/chat")
    async def chat(body: ChatRequest, request: HttpRequest):
        arrived = time.perf_counter()
        body.check()
        if not body.messages:
            return await only_load(body, chat=True)
        async with claim(body) as (resident, load_s):
            engine = resident.engine
            ids, tools = await run_in_threadpool(chat_ids, engine, body)
            generation = body.generation(len(ids), engine.loaded.context_length, config.max_tokens, **known)
            return await answer(resident, request, ids, generation, Splitter(engine, ids, tools),
                                OllamaBuilder(body.model, chat=True, arrived=arrived, load_s=load_s))

    @router.post("/api/generate")
    async def generate(body: GenerateRequest, request: HttpRequest):
        arrived = time.perf_counter()
        body.check()
        if not body.prompt:  # as Ollama: an empty prompt only loads the model, whatever context it has
            return await only_load(body, chat=False)
        async with claim(body) as (resident, load_s):
            engine = resident.engine
            ids = await run_in_threadpool(_generate_ids, engine, body)
            generation = body.generation(len(ids), engine.loaded.context_length, config.max_tokens, **known)
            return await answer(resident, request, ids, generation, None,
                                OllamaBuilder(body.model, chat=False, arrived=arrived, prompt_ids=ids,
                                              load_s=load_s))

    return router


def _generate_ids(engine: Engine, body: GenerateRequest) -> list[int]:
    """The prompt's ids: raw, or through the chat template; after `context` (an earlier answer's)."""
    if body.raw:
        ids = text_ids(engine, body.prompt, "prompt")
    else:
        ids = template_ids(engine, body.conversation(), None)
    if body.context:
        ids = known_ids(engine, body.context, "context") + ids
    return fits(engine, ids, "prompt")
