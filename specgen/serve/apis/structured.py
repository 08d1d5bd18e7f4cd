"""Structured outputs as each API asks for them, read into the engine's Format and checked against
the model before a request is queued (so the worker never meets a schema that does not compile).

Chat completions' `response_format` (`{"type": "json_schema", "json_schema": {"name", "schema",
"strict"}}`, `json_object`, `text`), the Responses API's flat `text.format` (`{"type":
"json_schema", "name", "schema", "strict"}`, `json_object`, `text`) and Anthropic's
`output_config.format` (`{"type": "json_schema", "schema"}`). A wrong shape is pydantic's 400
naming the field; a schema that does not compile is a 400 naming the field that holds it
(`response_format.json_schema.schema`, `text.format.schema`, `output_config.format.schema`) with
llguidance's reason. `strict` false is honoured as true: the output always obeys the schema.
With tools too, the schema holds the text answer: a model calling tools in tools.py's
format answers in it or calls a tool; one with its own format cannot write a call in that turn
(the grammar allows none of its markup).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Literal, Optional

from pydantic import Field

from specgen.errors import ModelError, SettingError
from specgen.serve.apis.tools import answer_format
from specgen.serve.schema import Generation, Lenient, Schema, Strict, bad, setting_error, tagged
from specgen.structured.formats import Format, parse

TYPES = Literal["text", "json_object", "json_schema"]


class ResponseFormat(Strict):
    type: TYPES  # every type but these three is refused, by name


class _JsonSchemaSpec(Strict):
    """chat's `response_format.json_schema`."""

    name: str
    description: Optional[str] = None
    schema_: Schema = Field(alias="schema")  # `schema` would shadow pydantic's own attribute
    strict: Optional[bool] = None


class _JsonSchema(Strict):
    type: Literal["json_schema"]
    json_schema: _JsonSchemaSpec


ChatFormat = tagged(text=ResponseFormat, json_object=ResponseFormat, json_schema=_JsonSchema, other=ResponseFormat)


class TextFormat(Lenient):
    type: TYPES


class _FlatJsonSchema(Lenient):
    """Responses' `text.format` and Anthropic's `output_config.format` of type json_schema."""

    type: Literal["json_schema"]
    name: Optional[str] = None
    description: Optional[str] = None
    schema_: Schema = Field(alias="schema")
    strict: Optional[bool] = None


FlatFormat = tagged(text=TextFormat, json_object=TextFormat, json_schema=_FlatJsonSchema, other=TextFormat)


class OutputFormat(Lenient):
    type: Literal["json_schema"]  # Anthropic's only output format


AnthropicFormat = tagged(json_schema=_FlatJsonSchema, other=OutputFormat)


class OutputConfig(Lenient):
    """Anthropic's `output_config`: its `format`; `effort` (Claude Code sends it) changes nothing."""

    format: Optional[AnthropicFormat] = None


def read(value, where: str) -> tuple[Format | None, str]:
    """(the Format a validated `value` of ChatFormat, FlatFormat or AnthropicFormat asks for, None
    for text; the request field a compile error names: the schema's, else `where`)."""
    if value is None:
        return None, where
    raw = value.model_dump(by_alias=True, exclude_none=True)
    try:
        fmt = parse(raw, where)
    except SettingError as e:
        raise setting_error(e) from None
    if fmt is None or fmt.kind != "json_schema":
        return fmt, where
    return fmt, f"{where}.json_schema.schema" if "json_schema" in raw else f"{where}.schema"


def constrained(engine, generation: Generation, generic: list[dict] | None = None) -> Generation:
    """`generation` with its format compiled for `engine`'s tokenizer (cached per format,
    thread-safe), before the request is queued: a 400 naming the field when it does not compile.
    `generic`: tools the model calls in tools.py's format, which then holds the answer."""
    field, fmt = generation.format_field or "tools", generation.options.response_format
    try:
        if fmt is not None:
            engine.grammars.compile(fmt)
        if generic:
            field = "tools"
            fmt = answer_format(generic, fmt, engine.grammars.compile)
    except SettingError as e:
        raise bad(field, e.requirement) from None
    except ModelError as e:  # a tokenizer llguidance cannot read: this model cannot constrain
        raise bad(field, f"cannot be used with this model: {e}") from None
    return replace(generation, options=replace(generation.options, response_format=fmt))
