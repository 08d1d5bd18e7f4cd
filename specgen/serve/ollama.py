"""Ollama's routes on the same port as the others, over the same engine, queue and prompt cache:
`GET|HEAD /` ("Ollama is running"), `/api/version`, `/api/tags`, `/api/show`, `/api/ps`,
`/api/chat` and `/api/generate` (NDJSON streams by default; `"stream": false` one object).

The served model is named `NAME:latest` (NAME its alias or folder name, case kept) and every
route takes the name with or without the tag; another name is Ollama's 404. An empty `messages`
or `prompt` loads nothing new and answers `done_reason: "load"`, as Ollama does. `/api/version`
answers the Ollama release whose API this follows (OLLAMA_VERSION), so that clients gating
features on it (tools, structured outputs, `think`) offer them. `keep_alive` is checked and, as
`specgen serve` keeps its one model resident for its lifetime, said in the log once.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import re
import time
from typing import Awaitable, Callable

from fastapi import APIRouter
from fastapi import Request as HttpRequest
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import PlainTextResponse

from specgen.engine.engine import Engine
from specgen.serve.apis.ollama import TAG, ChatRequest, GenerateRequest, ShowRequest, base_name
from specgen.serve.apis.ollama_stream import OllamaBuilder, now_iso
from specgen.serve.config import ServeConfig
from specgen.serve.prompting import Splitter, chat_ids, fits, template_ids, text_ids
from specgen.serve.schema import ApiError, bad

DURATION = re.compile(r"-?(\d+(\.\d+)?(ns|us|µs|ms|s|m|h))+|-?\d+(\.\d+)?")  # Go's, or seconds
OLLAMA_VERSION = "0.12.0"  # the API followed: tool calls streamed, `format` schemas, `think`
_log = logging.getLogger("specgen.serve")
Answer = Callable[..., Awaitable[object]]


def describe(engine: Engine, name: str) -> dict:
    """What /api/tags, /api/show and /api/ps say of the served model: its size, digest, details."""
    import mlx.core as mx
    from mlx.utils import tree_flatten

    loaded, config = engine.loaded, engine.loaded.config
    flat = tree_flatten(loaded.model.parameters())
    bits = (config.get("quantization") or {}).get("bits")
    count = 0
    for path, v in flat:  # quantized weights: 32 / bits to a uint32; their scales and biases are no weights
        if not (bits and path.endswith((".scales", ".biases"))):
            count += v.size * (32 // bits if bits and v.dtype == mx.uint32 else 1)
    family = config.get("model_type", "unknown")
    level = f"Q{bits}" if bits else (loaded.dtype or str(config.get("torch_dtype", "float32"))).upper()
    return {"name": f"{name}:{TAG}", "model": f"{name}:{TAG}", "size": sum(v.nbytes for _, v in flat),
            "digest": hashlib.sha256(f"{loaded.calibration_key}|{name}".encode()).hexdigest(),
            "details": {"parent_model": "", "format": "safetensors", "family": family, "families": [family],
                        "parameter_size": _short(count), "quantization_level": level.replace("FLOAT", "F")},
            "parameter_count": count}


def _short(count: int) -> str:
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if count >= size:
            return f"{count / size:.3g}{unit}"
    return str(count)


def ollama_routes(engine: Engine, config: ServeConfig, answer: Answer, known: dict) -> APIRouter:
    """The router of Ollama's API for `engine`; `answer` queues a generation as the other routes
    do (app.py), `known` are the server's settings every request gets."""
    router = APIRouter()
    model = describe(engine, config.model_name)
    entry = {k: v for k, v in model.items() if k != "parameter_count"}
    context = engine.loaded.context_length
    started = now_iso()
    tools_too = bool(engine.loaded.spec.chat_template and getattr(engine.loaded.tokenizer, "has_chat_template", False))

    def served(name: str) -> str:
        if base_name(name) != config.model_name:
            raise ApiError(404, f"model '{name}' not found", kind="not_found_error")
        return name

    def loaded(name: str, chat: bool) -> dict:
        reply = {"model": name, "created_at": now_iso(), "done_reason": "load", "done": True}
        return {**reply, "message": {"role": "assistant", "content": ""}} if chat else {**reply, "response": ""}

    @router.api_route("/", methods=["GET", "HEAD"], response_class=PlainTextResponse)
    async def running():
        return "Ollama is running"

    @router.get("/api/version")
    async def version():
        return {"version": OLLAMA_VERSION}

    @router.get("/api/tags")
    async def tags():
        return {"models": [{**entry, "modified_at": started}]}

    @router.get("/api/ps")
    async def ps():
        return {"models": [{**entry, "expires_at": "2318-01-01T00:00:00Z", "size_vram": entry["size"],
                            "context_length": context}]}

    @router.post("/api/show")
    async def show(body: ShowRequest):
        served(body.which())
        arch = entry["details"]["family"]
        template = getattr(engine.loaded.tokenizer, "chat_template", None) if tools_too else None
        info = {"general.architecture": arch, "general.parameter_count": model["parameter_count"]}
        if context is not None:
            info[f"{arch}.context_length"] = context
        return {"modelfile": f"# served by specgen\nFROM {config.model_name}\n", "parameters": "",
                "template": template or "", "details": entry["details"], "model_info": info,
                "capabilities": ["completion"] + (["tools"] if tools_too else []), "modified_at": started}

    @router.post("/api/chat")
    async def chat(body: ChatRequest, request: HttpRequest):
        arrived = time.perf_counter()
        served(body.model)
        _keep_alive(body.keep_alive)
        if not body.messages:
            return loaded(body.model, chat=True)
        ids, tools = await run_in_threadpool(chat_ids, engine, body)
        generation = body.generation(len(ids), context, config.max_tokens, **known)
        return await answer(request, ids, generation, Splitter(engine, ids, tools),
                            OllamaBuilder(body.model, chat=True, arrived=arrived))

    @router.post("/api/generate")
    async def generate(body: GenerateRequest, request: HttpRequest):
        arrived = time.perf_counter()
        served(body.model)
        _keep_alive(body.keep_alive)
        body.refuse()
        if not body.prompt:  # as Ollama: an empty prompt only loads the model, whatever context it has
            return loaded(body.model, chat=False)
        ids = await run_in_threadpool(_generate_ids, engine, body)
        generation = body.generation(len(ids), context, config.max_tokens, **known)
        return await answer(request, ids, generation, None,
                            OllamaBuilder(body.model, chat=False, arrived=arrived, prompt_ids=ids))

    return router


def _generate_ids(engine: Engine, body: GenerateRequest) -> list[int]:
    """The prompt's ids: raw, or through the chat template; after `context` (an earlier answer's)."""
    if body.raw:
        ids = text_ids(engine, body.prompt, "prompt")
    else:
        ids = template_ids(engine, body.conversation(), None)
    if body.context:
        vocab = engine.loaded.config.get("vocab_size") or len(engine.loaded.tokenizer.get_vocab())
        if any(not 0 <= t < vocab for t in body.context):
            raise bad("context", f"holds token ids outside the vocabulary (0 to {vocab - 1})")
        ids = list(body.context) + ids
    return fits(engine, ids, "prompt")


def _keep_alive(value) -> None:
    """`keep_alive` is a duration ("5m", "1h", seconds, -1, 0); the one served model stays resident."""
    if value is None or value == "":
        return
    if isinstance(value, str) and not DURATION.fullmatch(value):
        raise bad("keep_alive", f"is not a duration (got {value!r}): write 5m, 1h, 30s, a number of seconds or -1")
    _resident_once()


@functools.cache
def _resident_once() -> None:
    _log.info("keep_alive: specgen serve keeps its model loaded for its lifetime, whatever keep_alive asks")
