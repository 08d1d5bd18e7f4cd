"""Ollama's REST API as its clients speak it (its docs/api.md): `/api/chat` and `/api/generate`
bodies, checked before a model is touched (no mlx here).

A chat request becomes the chat-template messages and tools that chat completions makes of the
same conversation, so both give the same prompt and text. `options` are Ollama's: the sampling
ones and `num_predict`, `stop`, `num_ctx` are honoured; those that only place or pace the work
(threads, GPU layers, batch size, memory mapping) change no text and are accepted; those that
would change the text in a way specgen cannot reproduce exactly (penalties, mirostat, typical_p,
tfs_z) are a 400 naming them, unless they hold the value that changes nothing. A field Ollama does
not define is a 400 too: nothing a client sets is ignored. `format` is `"json"` or a JSON schema:
the same structured outputs as the other APIs. Images are a 400 (specgen serves text models), and
so are `template`, `suffix` and thinking on. Errors are Ollama's `{"error": "..."}` (`error_body`).
"""

from __future__ import annotations

import json
import re
from typing import Any, Literal, Optional, Union

from pydantic import Field

from specgen.errors import SettingError
from specgen.serve.apis.chat import Tool  # Ollama's tools are OpenAI's
from specgen.serve.schema import (
    ApiError,
    Body,
    Generation,
    Messages,
    Schema,
    Stop,
    Stops,
    Strict,
    Tools,
    bad,
    make_generation,
    setting_error,
)
from specgen.structured.formats import Format, parse

DURATION = re.compile(r"-?(\d+(\.\d+)?(ns|us|µs|ms|s|m|h))+|-?\d+(\.\d+)?")  # Go's, or seconds
TAG = "latest"  # what /api/tags appends to a model's name; every route takes the name with or without it
# Options that change the text, with the values at which they change nothing.
NO_OP = {"repeat_penalty": (1, 1.0), "presence_penalty": (0, 0.0), "frequency_penalty": (0, 0.0),
         "typical_p": (1, 1.0), "tfs_z": (1, 1.0), "mirostat": (0,)}


def error_body(e: ApiError) -> dict:
    """Ollama's error shape."""
    return {"error": e.message}


def base_name(name: str) -> str:
    """A model name as routes compare it: without the `:latest` tag."""
    return name[: -len(TAG) - 1] if name.endswith(":" + TAG) else name


class Options(Strict):
    """Ollama's `options`; null is unset."""

    temperature: Optional[float] = Field(None, allow_inf_nan=False)
    top_p: Optional[float] = None
    top_k: Optional[int] = None
    min_p: Optional[float] = None
    seed: Optional[int] = None
    num_predict: Optional[int] = None
    stop: Union[Stop, Stops, None] = None
    num_ctx: Optional[int] = Field(None, ge=1)
    num_keep: Optional[int] = None
    num_batch: Optional[int] = None
    num_gpu: Optional[int] = None
    main_gpu: Optional[int] = None
    use_mmap: Optional[bool] = None
    use_mlock: Optional[bool] = None
    num_thread: Optional[int] = None
    numa: Optional[bool] = None
    low_vram: Optional[bool] = None
    f16_kv: Optional[bool] = None
    vocab_only: Optional[bool] = None
    logits_all: Optional[bool] = None
    embedding_only: Optional[bool] = None
    repeat_last_n: Optional[int] = None
    penalize_newline: Optional[bool] = None
    mirostat_tau: Optional[float] = None
    mirostat_eta: Optional[float] = None
    repeat_penalty: Optional[float] = None
    presence_penalty: Optional[float] = None
    frequency_penalty: Optional[float] = None
    typical_p: Optional[float] = None
    tfs_z: Optional[float] = None
    mirostat: Optional[int] = None

    def check(self) -> None:
        for name, allowed in NO_OP.items():
            value = getattr(self, name)
            if value is not None and value not in allowed:
                raise bad(f"options.{name}", f"is not supported by specgen (got {value}): its output is exactly "
                                             f"plain decoding's; leave it out or set it to {allowed[0]}")


class ToolFunction(Strict):
    name: str
    arguments: dict[str, Any] = {}
    index: Optional[int] = None
    description: Optional[str] = None


class ToolCall(Strict):
    function: ToolFunction
    id: Optional[str] = None
    type: Optional[Literal["function"]] = None


class Message(Strict):
    role: Literal["system", "user", "assistant", "tool"]
    content: str = ""
    images: Optional[list[str]] = None
    tool_calls: Optional[list[ToolCall]] = None
    thinking: Optional[str] = None
    tool_name: Optional[str] = None
    tool_call_id: Optional[str] = None


class _Common(Strict, Body):
    model: str = Field(min_length=1)
    format: Union[Literal["json", ""], Schema, None] = None
    options: Optional[Options] = None
    stream: bool = True
    keep_alive: Union[str, float, None] = None
    think: Union[bool, str, None] = None

    def check(self) -> None:
        """What can be refused before a model is touched (or loaded): options, think, format, stop."""
        (self.options or Options()).check()
        if self.think not in (None, False):
            raise bad("think", "is not supported: specgen serves its models without a thinking mode")
        if any(not s for s in self._stops()):
            raise bad("options.stop", "must be non-empty strings")
        self._format()
        keep_alive(self.keep_alive)

    def _stops(self) -> tuple[str, ...]:
        stop = (self.options or Options()).stop
        return (stop,) if isinstance(stop, str) else tuple(stop or ())

    def generation(self, prompt_tokens: int, context: int | None, default_max_tokens: int, **known) -> Generation:
        """What this request asks of the engine (checked: `check`): num_predict clamped to the
        room num_ctx (or the model's context) leaves, as Ollama stops where its context ends."""
        o = self.options or Options()
        limit = context if o.num_ctx is None else min(o.num_ctx, context or o.num_ctx)
        if limit is not None and prompt_tokens >= limit:  # (the model's own context was checked with the prompt)
            raise bad("options.num_ctx", f"the prompt is {prompt_tokens} tokens, leaving no room to generate in "
                                         f"a context of {limit} tokens")
        wanted = default_max_tokens if o.num_predict is None or o.num_predict < 0 else o.num_predict
        room = wanted if limit is None else min(wanted, limit - prompt_tokens)
        return make_generation(max_tokens=room, stop=self._stops(), temperature=o.temperature, top_p=o.top_p, top_k=o.top_k,
                               min_p=o.min_p, seed=o.seed, stream=self.stream, response_format=(self._format(), "format"),
                               fields={f: f"options.{f}" for f in ("temperature", "top_p", "top_k", "min_p", "seed",
                                                                   "stop")} | {"max_tokens": "options.num_predict"},
                               **known)

    def _format(self) -> Format | None:
        """`format`: "json" (any JSON object) or a JSON schema (the object itself)."""
        if not self.format:
            return None
        raw = {"type": "json_object"} if self.format == "json" else {"type": "json_schema", "schema": self.format}
        try:
            return parse(raw, "format")
        except SettingError as e:
            raise setting_error(e, {"format.schema": "format"}) from None


class ChatRequest(_Common):
    """An `/api/chat` body."""

    messages: Messages[Message] = []
    tools: Optional[Tools[Tool]] = None

    def conversation(self) -> tuple[list[dict], list[dict] | None]:
        """(messages as chat templates take them, tools or None): tool-call arguments as objects."""
        messages = []
        for i, m in enumerate(self.messages):
            if m.images:
                raise bad(f"messages[{i}].images", "are not supported: specgen serves text-only models")
            out: dict[str, Any] = {"role": m.role, "content": m.content}
            if m.tool_calls:
                out["tool_calls"] = [{"id": c.id or f"call_{i}_{j}", "type": "function",
                                      "function": {"name": c.function.name, "arguments": c.function.arguments}}
                                     for j, c in enumerate(m.tool_calls)]
            if m.role == "tool" and (m.tool_name or m.tool_call_id):
                out["name"] = m.tool_name
                out["tool_call_id"] = m.tool_call_id or m.tool_name
            messages.append(out)
        tools = [t.model_dump(exclude_none=True) for t in self.tools] if self.tools else None
        return messages, tools


class GenerateRequest(_Common):
    """An `/api/generate` body."""

    prompt: str = ""
    suffix: Optional[str] = None
    system: Optional[str] = None
    template: Optional[str] = None
    context: Optional[list[int]] = None
    raw: bool = False
    images: Optional[list[str]] = None

    def check(self) -> None:
        super().check()
        if self.images:
            raise bad("images", "are not supported: specgen serves text-only models")
        if self.suffix:
            raise bad("suffix", "is not supported: specgen does not fill in the middle")
        if self.template:
            raise bad("template", "is not supported: prompts go through the model's own chat template (or raw)")
        if self.raw and self.system:
            raise bad("system", "has no place in a raw prompt: put it in the prompt")

    def conversation(self) -> list[dict]:
        """The prompt as chat messages (a templated prompt)."""
        return ([{"role": "system", "content": self.system}] if self.system else []) + \
            [{"role": "user", "content": self.prompt}]


class ShowRequest(Strict, Body):
    """An `/api/show` body (`name` is the older spelling of `model`)."""

    model: Optional[str] = None
    name: Optional[str] = None
    verbose: Optional[bool] = None

    def which(self) -> str:
        name = self.model or self.name
        if not name:
            raise bad("model", "is required")
        return name


def duration_ns(seconds: float) -> int:
    """Ollama's durations: integer nanoseconds."""
    return max(0, int(seconds * 1e9))


def arguments(call: dict) -> dict:
    """A tool call's arguments as Ollama returns them: an object (ours are JSON text)."""
    try:
        value = json.loads(call["function"]["arguments"] or "{}")
    except json.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def seconds(value: str | float) -> float | None:
    """A keep-alive as seconds: Go's durations ("5m", "1h30m") or a number of seconds; negative:
    None (never unload). ValueError for anything else."""
    if isinstance(value, str):
        if not DURATION.fullmatch(value):
            raise ValueError(f"{value!r} is not a duration: write 5m, 1h, 30s, a number of seconds or -1")
        sign = -1 if value.startswith("-") else 1
        parts = re.findall(r"(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)?", value.lstrip("-"))
        value = sign * sum(float(n) * UNITS[unit or "s"] for n, unit in parts)
    return None if value < 0 else float(value)


def keep_alive(value) -> float | None | str:
    """A request's `keep_alive` as seconds (None: never unload); "server" where it sets none."""
    if value is None or value == "":
        return "server"
    try:
        return seconds(value)
    except ValueError as e:
        raise bad("keep_alive", f"is not a duration ({e})") from None
