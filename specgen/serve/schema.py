"""What every API's request is checked by, before a model is touched (no mlx here).

The three APIs' schemas (apis/chat.py: OpenAI's chat and text completions; apis/anthropic.py: Messages;
apis/responses.py: Responses) are built of these: `ApiError`, the one error type the routes turn into
each API's error shape, and `bad`, a 400 naming a field; `Strict` models, as strict as OpenAI's
(`"stream": "yes"` or a field nobody defines is a 400) and `Lenient` ones, as strict about what
they define but silent about the rest, as the agent APIs are; `tagged` unions chosen by a `type`
field; `Body`, a whole request, which refuses a lone surrogate anywhere in it; `LIMITS`, what one
request may make the server do, held by the types its fields use; `validation_error`, pydantic's
complaint as a 400 naming the field; `make_generation`, what every API's valid request asks of the
engine (`Generation`), its settings checked in one place (settings.check, via Options).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Annotated, Any, TypeVar, Union

from pydantic import AfterValidator, BaseModel, ConfigDict, Discriminator, Field, Tag, model_validator
from pydantic_core import PydanticCustomError

from specgen import defaults
from specgen.engine.options import Options
from specgen.errors import SettingError
from specgen.structured.formats import Format

# The request field for each Options setting that the API names differently.
FIELDS = {"temp": "temperature"}
JOIN = "\n\n"  # between the text blocks of one message, in the agent APIs


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


@dataclass(frozen=True)
class Limits:
    """What one request may make the server do (each within the body's size limit, which bounds
    them all loosely): over one is a 400 naming the field and the limit."""

    stop_sequences: int = 16  # every step of the generation looks for each of them
    stop_chars: int = 1000  # per stop sequence; a stream holds back that much text, less one
    tools: int = 512
    schema_chars: int = 100_000  # one tool's JSON schema, written as JSON
    messages: int = 10_000  # messages (Responses: input items), each rendered by the chat template


LIMITS = Limits()
Many = TypeVar("Many")
Messages = Annotated[list[Many], Field(max_length=LIMITS.messages)]
Tools = Annotated[list[Many], Field(max_length=LIMITS.tools)]
Stop = Annotated[str, Field(max_length=LIMITS.stop_chars)]
Stops = Annotated[list[Stop], Field(max_length=LIMITS.stop_sequences)]
ModelName = Annotated[str, Field(min_length=1)]  # any name: the loaded model answers


def _sized(schema: dict) -> dict:
    try:
        size = len(json.dumps(schema))
    except (RecursionError, ValueError):
        raise PydanticCustomError("schema_too_large", "is nested too deeply to be written as JSON") from None
    if size > LIMITS.schema_chars:
        raise PydanticCustomError("schema_too_large", "is {size} characters of JSON, over specgen's "
                                  "limit of {limit} for one schema",
                                  {"size": size, "limit": LIMITS.schema_chars})
    return schema


Schema = Annotated[dict[str, Any], AfterValidator(_sized)]  # a tool's JSON schema


def tagged(default: str | None = None, **by_type: type[BaseModel]) -> Any:
    """A union of models chosen by the value of their `type` field (absent: `default`): `by_type`
    maps each value to its model, and "other" to the model of every value not named (and of a
    `type` that is no string, for that model to refuse)."""
    names = {t: m.__name__ for t, m in by_type.items()}

    def pick(value) -> str:
        kind = value.get("type", default) if isinstance(value, dict) else getattr(value, "type", default)
        return names.get(kind, names["other"]) if isinstance(kind, str) else names["other"]

    members = tuple(Annotated[m, Tag(m.__name__)] for m in dict.fromkeys(by_type.values()))
    return Annotated[Union[members], Discriminator(pick)]  # tags are class names, left out of error paths


class Strict(BaseModel):
    """Strict about types (an integer is a number, nothing else converts) and about fields: one
    nobody defines is a 400."""

    model_config = ConfigDict(extra="forbid", strict=True)


class Lenient(BaseModel):
    """Strict about the types of the fields it defines, silent about fields it does not."""

    model_config = ConfigDict(extra="ignore", strict=True)


def param(loc) -> str | None:
    """A field's path as errors name it: `messages[0].content`."""
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc).lstrip(".") or None


def _lone_surrogate(value) -> list | None:
    """The path to the first string in a JSON value (or object, by a key) holding a lone UTF-16
    surrogate, which no text encoding can write (walked without recursion: JSON nests deeper than
    Python's stack allows)."""
    todo = [((), value)]
    while todo:
        loc, value = todo.pop()
        if isinstance(value, str) and not value.isascii() and not _encodes(value):
            return list(loc)
        if isinstance(value, dict):
            for key, item in reversed(value.items()):
                if isinstance(key, str) and not key.isascii() and not _encodes(key):
                    return list(loc)  # the object holding the key: a path naming it could not be sent
                todo.append(((*loc, key), item))
        elif isinstance(value, list):
            todo.extend(((*loc, i), item) for i, item in reversed(list(enumerate(value))))
    return None


def _encodes(text: str) -> bool:
    try:
        text.encode()
        return True
    except UnicodeEncodeError:
        return False


class Body(BaseModel):
    """A whole request body (mixed into each route's request model)."""

    @model_validator(mode="before")
    @classmethod
    def _no_lone_surrogates(cls, data):
        # An ApiError passes through pydantic untouched, so the route answers it, naming the field.
        loc = _lone_surrogate(data)
        if loc is not None:
            raise bad(param(loc) or "body", "holds a lone UTF-16 surrogate (a \\ud800-\\udfff escape that is "
                                            "half of a pair), which is no character: send valid Unicode")
        return data


def validation_error(errors: list[dict]) -> ApiError:
    """A 400 naming the field pydantic refused (`messages[0].content[0].type`), or the body."""
    if errors[0].get("type") == "json_invalid":
        first = errors[0]
        return ApiError(400, f"the body is not valid JSON: {first.get('ctx', {}).get('error', first['msg'])}")
    # A value that fits no member of a union fails each member: of the errors under the first one's
    # field, the deepest says most ("input[0].role", not "input: should be a valid string"), and
    # of equally deep ones, a limit that was passed.
    paths = [_path(error) for error in errors]
    best = max((i for i, p in enumerate(paths) if p[:len(paths[0])] == paths[0]),
               key=lambda i: (len(paths[i]), errors[i]["type"] in _LIMITS))
    first, name = errors[best], param(paths[best])
    ctx = first.get("ctx") or {}
    if first["type"] == "too_long":
        what = (f"holds {ctx['actual_length']} items, over specgen's limit of {ctx['max_length']} "
                "for one request")
    elif first["type"] == "string_too_long":
        what = f"is over specgen's limit of {ctx['max_length']} characters"
    elif first["type"] == "extra_forbidden":
        what = "is not a field specgen knows (and so would be ignored)"
    else:
        what = first["msg"][0].lower() + first["msg"][1:]
    return ApiError(400, f"{name or 'body'}: {what}", name)


_LIMITS = {"too_long", "string_too_long", "schema_too_large"}


def _path(error: dict) -> list:
    """The request's own path to an error: union members add their type's name to the location
    ("str", "list[TextPart]", "function-after", "TextBlock", ...); keep lower-case field names and indices."""
    return [p for p in error.get("loc", ()) if p != "body" and (isinstance(p, int) or p.isidentifier()
                                                               and p.islower() and p not in _TYPES)]


_TYPES = {"str", "int", "float", "bool", "list", "dict"}


def make_generation(*, max_tokens: int, stop: tuple[str, ...] = (), temperature: float | None = None,
                    top_p: float | None = None, top_k: int | None = None, min_p: float | None = None,
                    seed: int | None = None, stream: bool = False, include_usage: bool = False,
                    prediction: str | None = None, fields: dict[str, str] | None = None,
                    response_format: tuple[Format | None, str] = (None, ""), **known) -> Generation:
    """A request's settings as the engine takes them, checked (settings.check, via Options); unset
    ones are the server's defaults. A setting out of range is a 400 naming the request's field for
    it (`fields`: the request's names that differ from OpenAI's). `response_format`: the output's
    Format and the field naming it (structured.read)."""
    opts = dict(max_tokens=max_tokens, stop=stop, temp=temperature if temperature is not None else defaults.TEMP,
                top_p=top_p or defaults.TOP_P, top_k=top_k or defaults.TOP_K, min_p=min_p or defaults.MIN_P,
                seed=seed, response_format=response_format[0], **known)
    if opts["top_p"] == 1.0:  # OpenAI's default: keep all the mass, i.e. no filter
        opts["top_p"] = defaults.TOP_P
    if top_p == 0:  # a nucleus of no mass keeps the likeliest token alone: greedy (0 is "off" to mlx-lm)
        opts["temp"], opts["top_p"] = 0.0, defaults.TOP_P
    try:
        options = Options(**opts)
        options.check()  # warnings (e.g. a seed when greedy) change nothing, as in OpenAI
    except SettingError as e:
        raise setting_error(e, fields) from None
    return Generation(options=options, stream=stream, include_usage=include_usage, prediction=prediction,
                      format_field=response_format[1])


@dataclass(frozen=True)
class Generation:
    """A valid request's settings; the prompt (messages or text) is the request's own."""

    options: Options
    stream: bool
    include_usage: bool
    prediction: str | None
    format_field: str = ""  # the request's field holding options.response_format, for its errors
