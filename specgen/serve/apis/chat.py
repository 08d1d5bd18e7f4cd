"""What an OpenAI-compatible request may say: `/v1/chat/completions` and `/v1/completions` bodies,
checked before a model is touched (no mlx here).

Every field OpenAI defines that specgen cannot honour is a 400 naming it, unless it holds the value
that changes nothing (n=1, logprobs=false, ...); fields nobody defines are 400s too (`extra="forbid"`).
Types are as strict as OpenAI's (`"stream": "yes"` or `"max_tokens": 1.5` is a 400; an integer is a
number), and so are its ranges (temperature up to 2). What every API shares (errors, limits, the
engine's settings) is schema.py's.
"""

from __future__ import annotations

import json
from typing import Any, Literal, Optional, Union

from pydantic import Field

from specgen.serve.apis.structured import ChatFormat, read
from specgen.serve.schema import (
    Body,
    Generation,
    Messages,
    ModelName,
    Schema,
    Stop,
    Stops,
    Strict,
    Tools,
    bad,
    make_generation,
)


class TextPart(Strict):
    type: Literal["text"]
    text: str


class FunctionCall(Strict):
    name: str
    arguments: str = "{}"


class ToolCall(Strict):
    id: Optional[str] = None
    type: Literal["function"] = "function"
    function: FunctionCall
    index: Optional[int] = None


class Message(Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Union[str, list[TextPart], None] = None
    name: Optional[str] = None
    tool_calls: Optional[list[ToolCall]] = None
    tool_call_id: Optional[str] = None
    refusal: Optional[str] = None


class Function(Strict):
    name: str
    description: Optional[str] = None
    parameters: Optional[Schema] = None
    strict: Optional[bool] = None


class Tool(Strict):
    type: Literal["function"]
    function: Function


class StreamOptions(Strict):
    include_usage: bool = False
    include_obfuscation: Optional[bool] = None


class Prediction(Strict):
    type: Literal["content"]
    content: Union[str, list[TextPart]]


def _text(content) -> str:
    return content if isinstance(content, str) else "".join(p.text for p in content or ())


# Fields OpenAI defines that change the output or its shape, with the values that change nothing.
_NO_OP = {"n": (None, 1), "logprobs": (None, False), "top_logprobs": (None, 0), "best_of": (None, 1),
          "echo": (None, False), "suffix": (None, ""), "presence_penalty": (None, 0),
          "frequency_penalty": (None, 0), "logit_bias": (None, {}), "modalities": (None, ["text"]),
          "audio": (None,), "reasoning_effort": (None,),
          "service_tier": (None, "auto", "default"), "store": (None, False), "web_search_options": (None,)}


class _Common(Strict, Body):
    """What both endpoints take."""

    model: ModelName
    max_tokens: Optional[int] = None
    # OpenAI's range; below 0 is settings.check's
    temperature: Optional[float] = Field(None, le=2, allow_inf_nan=False)
    top_p: Optional[float] = None
    top_k: Optional[int] = None
    min_p: Optional[float] = None
    seed: Optional[int] = None
    stop: Union[Stop, Stops, None] = None
    stream: bool = False
    stream_options: Optional[StreamOptions] = None
    prediction: Optional[Prediction] = None
    user: Optional[str] = None  # an end-user id for the caller's own records: changes nothing
    metadata: Optional[dict[str, str]] = None  # likewise
    # Accepted only at their no-op values (_NO_OP).
    n: Optional[int] = None
    logprobs: Union[bool, int, None] = None
    top_logprobs: Optional[int] = None
    presence_penalty: Optional[float] = None
    frequency_penalty: Optional[float] = None
    logit_bias: Optional[dict[str, float]] = None
    service_tier: Optional[str] = None
    store: Optional[bool] = None

    def _no_ops(self) -> None:
        for name in self.model_fields_set:
            allowed = _NO_OP.get(name)
            value = getattr(self, name)
            if allowed is not None and value not in allowed:
                raise bad(name, f"is not supported by specgen (got {json.dumps(value, default=str)}); "
                                f"leave it out{'' if len(allowed) < 2 else f' or set it to {json.dumps(allowed[1])}'}")

    def _stops(self) -> tuple[str, ...]:
        stops = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())
        if any(not s for s in stops):
            raise bad("stop", "must be non-empty strings")
        return stops

    def generation(self, default_max_tokens: int, max_tokens: int | None = None, **known) -> Generation:
        """What this request asks of the engine, its settings checked (settings.check, via Options)."""
        self._no_ops()
        if self.stream_options is not None and not self.stream:
            raise bad("stream_options", "is only allowed when stream is true")
        limit = max_tokens if max_tokens is not None else self.max_tokens
        return make_generation(max_tokens=default_max_tokens if limit is None else limit, stop=self._stops(),
                               temperature=self.temperature, top_p=self.top_p, top_k=self.top_k, min_p=self.min_p,
                               seed=self.seed, stream=self.stream,
                               include_usage=bool(self.stream_options and self.stream_options.include_usage),
                               prediction=_text(self.prediction.content) if self.prediction else None,
                               fields={"max_tokens": "max_completion_tokens"} if max_tokens is not None else {},
                               **known)


class ChatRequest(_Common):
    """A `/v1/chat/completions` body."""

    messages: Messages[Message] = Field(min_length=1)
    max_completion_tokens: Optional[int] = None
    tools: Optional[Tools[Tool]] = None
    tool_choice: Union[Literal["none", "auto"], dict, None] = None
    parallel_tool_calls: Optional[bool] = None  # false: only the first tool call is returned
    response_format: Optional[ChatFormat] = None  # structured.py's
    modalities: Optional[list[str]] = None
    audio: Optional[dict[str, Any]] = None
    reasoning_effort: Optional[str] = None
    web_search_options: Optional[dict[str, Any]] = None

    def generation(self, default_max_tokens: int, **known) -> Generation:
        if self.max_tokens is not None and self.max_completion_tokens not in (None, self.max_tokens):
            raise bad("max_tokens", "and max_completion_tokens disagree: send one of them")
        if isinstance(self.tool_choice, dict):
            raise bad("tool_choice", "naming a function is not supported: the model chooses (\"auto\") or "
                                     "no tools are offered (\"none\")")
        return super().generation(default_max_tokens, self.max_completion_tokens,
                                  response_format=read(self.response_format, "response_format"), **known)

    def conversation(self) -> tuple[list[dict], list[dict] | None]:
        """(messages as chat templates take them, tools or None): text parts joined, `developer`
        as `system`, tool-call arguments as objects (as mlx-lm's server passes them)."""
        messages = []
        for i, m in enumerate(self.messages):
            out: dict[str, Any] = {"role": "system" if m.role == "developer" else m.role,
                                   "content": _text(m.content)}
            if m.name is not None:
                out["name"] = m.name
            if m.tool_call_id is not None:
                out["tool_call_id"] = m.tool_call_id
            if m.tool_calls:
                calls = []
                for j, c in enumerate(m.tool_calls):
                    try:
                        arguments = json.loads(c.function.arguments or "{}")
                    except json.JSONDecodeError:
                        raise bad(f"messages[{i}].tool_calls[{j}].function.arguments", "is not JSON") from None
                    calls.append({"id": c.id, "type": "function",
                                  "function": {"name": c.function.name, "arguments": arguments}})
                out["tool_calls"] = calls
            messages.append(out)
        tools = None
        if self.tools and self.tool_choice != "none":
            tools = [t.model_dump(exclude_none=True) for t in self.tools]
        return messages, tools


class CompletionRequest(_Common):
    """A `/v1/completions` body: one prompt, text or token ids."""

    prompt: Union[str, list[int], list[str], list[list[int]]]
    best_of: Optional[int] = None
    echo: Optional[bool] = None
    suffix: Optional[str] = None

    def one_prompt(self) -> str | list[int]:
        """The prompt: a string or token ids (a list holding one of them is that one)."""
        p = self.prompt
        if isinstance(p, list) and p and isinstance(p[0], (str, list)):
            if len(p) != 1:
                raise bad("prompt", f"holds {len(p)} prompts; specgen answers one per request")
            p = p[0]
        if not p:
            raise bad("prompt", "is empty")
        return p
