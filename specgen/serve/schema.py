"""What an OpenAI-compatible request may say, checked before a model is touched (no mlx here).

Pydantic models for `/v1/chat/completions` and `/v1/completions` bodies. Every field OpenAI
defines that specgen cannot honour is a 400 naming it, unless it holds the value that changes
nothing (n=1, logprobs=false, ...); fields nobody defines are 400s too (`extra="forbid"`). Types
are as strict as OpenAI's (pydantic's strict mode: `"stream": "yes"` or `"max_tokens": 1.5` is a
400; an integer is a number). `Lenient` is the same strictness for the agent APIs (anthropic.py,
responses.py), which ignore fields they do not know. `make_generation` is what every API's valid
request asks of the engine (`Generation`: Options, stream, prediction), its settings checked in
one place. `ApiError` is the one error type the routes turn into each API's error shape.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag

from specgen import defaults
from specgen.engine.options import Options
from specgen.errors import SettingError

# The request field for each Options setting that the API names differently.
FIELDS = {"temp": "temperature"}


class ApiError(Exception):
    """An error answered in OpenAI's shape: HTTP `status`, a message, the `param` it is about."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = status, message, param, code, kind

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


def bad(param: str, message: str, code: str | None = None) -> ApiError:
    """A 400 naming `param`: the message starts with it."""
    return ApiError(400, f"{param}: {message}", param, code)


def setting_error(e: SettingError, renamed: dict[str, str] | None = None) -> ApiError:
    """The 400 for a setting out of range, naming the request field it came from."""
    name = FIELDS.get(e.param, e.param)
    name = (renamed or {}).get(name, name)
    return bad(name, e.naming("").strip())


JOIN = "\n\n"  # between the text blocks of one message, in the agent APIs


def tagged(default: str | None = None, **by_type: type[BaseModel]) -> Any:
    """A union of models chosen by the value of their `type` field (absent: `default`): `by_type`
    maps each value to its model, and "other" to the model of every value not named."""
    names = {t: m.__name__ for t, m in by_type.items()}

    def pick(value) -> str:
        kind = value.get("type", default) if isinstance(value, dict) else getattr(value, "type", default)
        return names.get(kind, names["other"])

    members = tuple(Annotated[m, Tag(m.__name__)] for m in dict.fromkeys(by_type.values()))
    return Annotated[Union[members], Discriminator(pick)]  # tags are class names, left out of error paths


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class Lenient(BaseModel):
    """Strict about the types of the fields it defines, silent about fields it does not."""

    model_config = ConfigDict(extra="ignore", strict=True)


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class FunctionCall(_Strict):
    name: str
    arguments: str = "{}"


class ToolCall(_Strict):
    id: Optional[str] = None
    type: Literal["function"] = "function"
    function: FunctionCall
    index: Optional[int] = None


class Message(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Union[str, list[TextPart], None] = None
    name: Optional[str] = None
    tool_calls: Optional[list[ToolCall]] = None
    tool_call_id: Optional[str] = None
    refusal: Optional[str] = None


class Function(_Strict):
    name: str
    description: Optional[str] = None
    parameters: Optional[dict[str, Any]] = None
    strict: Optional[bool] = None


class Tool(_Strict):
    type: Literal["function"]
    function: Function


class StreamOptions(_Strict):
    include_usage: bool = False
    include_obfuscation: Optional[bool] = None


class Prediction(_Strict):
    type: Literal["content"]
    content: Union[str, list[TextPart]]


def _text(content) -> str:
    return content if isinstance(content, str) else "".join(p.text for p in content or ())


# Fields OpenAI defines that change the output or its shape, with the values that change nothing.
_NO_OP = {"n": (None, 1), "logprobs": (None, False), "top_logprobs": (None, 0), "best_of": (None, 1),
          "echo": (None, False), "suffix": (None, ""), "presence_penalty": (None, 0),
          "frequency_penalty": (None, 0), "logit_bias": (None, {}), "response_format": (None, {"type": "text"}),
          "modalities": (None, ["text"]), "audio": (None,), "reasoning_effort": (None,),
          "service_tier": (None, "auto", "default"), "store": (None, False), "web_search_options": (None,)}


class _Common(_Strict):
    """What both endpoints take."""

    model: str
    max_tokens: Optional[int] = None
    temperature: Optional[float] = None
    top_p: Optional[float] = None
    top_k: Optional[int] = None
    min_p: Optional[float] = None
    seed: Optional[int] = None
    stop: Union[str, list[str], None] = None
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


def make_generation(*, max_tokens: int, stop: tuple[str, ...] = (), temperature: float | None = None,
                    top_p: float | None = None, top_k: int | None = None, min_p: float | None = None,
                    seed: int | None = None, stream: bool = False, include_usage: bool = False,
                    prediction: str | None = None, fields: dict[str, str] | None = None, **known) -> Generation:
    """A request's settings as the engine takes them, checked (settings.check, via Options); unset
    ones are the server's defaults. A setting out of range is a 400 naming the request's field for
    it (`fields`: the request's names that differ from OpenAI's)."""
    opts = dict(max_tokens=max_tokens, stop=stop, temp=temperature if temperature is not None else defaults.TEMP,
                top_p=top_p or defaults.TOP_P, top_k=top_k or defaults.TOP_K, min_p=min_p or defaults.MIN_P,
                seed=seed, **known)
    if opts["top_p"] == 1.0:  # OpenAI's default: keep all the mass, i.e. no filter
        opts["top_p"] = defaults.TOP_P
    try:
        options = Options(**opts)
        options.check()  # warnings (e.g. a seed when greedy) change nothing, as in OpenAI
    except SettingError as e:
        raise setting_error(e, fields) from None
    return Generation(options=options, stream=stream, include_usage=include_usage, prediction=prediction)


@dataclass(frozen=True)
class Generation:
    """A valid request's settings; the prompt (messages or text) is the request's own."""

    options: Options
    stream: bool
    include_usage: bool
    prediction: str | None


class ChatRequest(_Common):
    """A `/v1/chat/completions` body."""

    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: Optional[int] = None
    tools: Optional[list[Tool]] = None
    tool_choice: Union[Literal["none", "auto"], dict, None] = None
    parallel_tool_calls: Optional[bool] = None  # false: only the first tool call is returned
    response_format: Optional[dict[str, Any]] = None
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
        return super().generation(default_max_tokens, self.max_completion_tokens, **known)

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
