"""What a caller may ask the output to be (`Format`), read from every shape the front ends take.

One record for every way of asking: OpenAI chat's `response_format` (`{"type": "json_schema",
"json_schema": {"name", "schema", "strict"}}`, `json_object`, `text`), the Responses API's flat
`text.format` and Anthropic's `output_config.format` (`{"type": "json_schema", "schema": ...}`),
a Pydantic model class, and specgen's own `{"type": "grammar", "grammar": LARK}` and
`{"type": "regex", "regex": ...}` (CLI `--grammar`). `grammar_text` turns a Format into
llguidance's grammar; whether that compiles is grammar.py's to say (it needs the tokenizer).

A reasoning model's thinking is not constrained, its answer is (as vLLM's reasoning parsers do):
given the model's `Thinking` markers, a schema or regex applies after the thinking block (which
the model may skip, or is inside already when the prompt opened it). A Lark grammar is the
caller's whole output, thinking included.
"""

from __future__ import annotations

import json
from typing import Any, NamedTuple

import llguidance

from specgen.errors import SettingError
from specgen.structured.unanswerable import why_unanswerable

KINDS = ("json_schema", "json_object", "grammar", "regex")
# JSON is compact: no whitespace between tokens (as OpenAI's own output). With llguidance's default
# (any whitespace) small models pretty-print and stray into newlines: 1.5-3x the tokens
# (docs/design.md, "Structured outputs").
JSON_OPTIONS = {"whitespace_flexible": False}


class Thinking(NamedTuple):
    """A reasoning model's thinking markers (special tokens) and whether the prompt opened a block."""

    start: str
    end: str
    opened: bool


class Format(NamedTuple):
    """A constraint on the output: `kind` (KINDS), `source` (the schema as canonical JSON, a Lark
    grammar or a regex; "" for json_object) and the schema's `name`, if it has one."""

    kind: str
    source: str
    name: str = ""


def parse(value: Any, param: str = "response_format") -> Format | None:
    """`value` in any shape this module reads, as a Format (None: plain text, no constraint).
    A shape or field this cannot read is a SettingError naming `param` and the field."""
    if value is None or isinstance(value, Format):
        return value
    if isinstance(value, type) and hasattr(value, "model_json_schema"):  # a Pydantic model
        return Format("json_schema", _canonical(value.model_json_schema()), value.__name__)
    if not isinstance(value, dict):
        raise SettingError(param, "must be an object with a type (json_schema, json_object, text, "
                                  "grammar or regex) or a Pydantic model", type(value).__name__)
    kind = value.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return Format("json_object", "")
    if kind == "json_schema":
        inner = value.get("json_schema")
        where, body = (f"{param}.json_schema", inner) if isinstance(inner, dict) else (param, value)
        schema = body.get("schema")
        if not isinstance(schema, (dict, bool)):
            raise SettingError(f"{where}.schema", "must be a JSON schema (an object)")
        name = body.get("name", "")
        if not isinstance(name, str):
            raise SettingError(f"{where}.name", "must be a string")
        why = why_unanswerable(schema)
        if why:
            raise SettingError(f"{where}.schema", why)
        return Format("json_schema", _canonical(schema), name)
    if kind in ("grammar", "regex"):
        text = value.get(kind)
        if not isinstance(text, str) or not text:
            raise SettingError(f"{param}.{kind}", "must be a non-empty string")
        return Format(kind, text)
    raise SettingError(f"{param}.type", "must be one of json_schema, json_object, text, grammar, regex",
                       kind)


def _canonical(schema) -> str:
    """One text per schema (agents resend theirs every turn, and the
    compiled grammar is cached by it); key order is kept: it is the order of the properties."""
    return json.dumps(schema, separators=(",", ":"))


def grammar_text(fmt: Format, thinking: Thinking | None = None) -> str:
    """llguidance's grammar for `fmt` (not yet checked: see grammar.Grammars), after the thinking
    block of a model with `thinking` markers."""
    if thinking is not None and fmt.kind != "grammar":
        # Thinking text can hold anything but the end marker (a special token, which no regex
        # matches), and the answer follows it.
        if fmt.kind == "regex":
            answer = "/" + llguidance.regex_to_lark(fmt.source) + "/"
        else:
            schema = json.loads(fmt.source) if fmt.kind == "json_schema" else {"type": "object"}
            if isinstance(schema, dict):
                schema = {**schema, "x-guidance": {**JSON_OPTIONS, **schema.get("x-guidance", {})}}
            answer = "%json " + json.dumps(schema)
        start = (f"start: THINK {thinking.end} answer" if thinking.opened
                 else f"start: think? answer\nthink: {thinking.start} THINK {thinking.end}")
        return llguidance.LLMatcher.grammar_from_lark(f"{start}\nTHINK: /(?s:.*)/\nanswer: {answer}\n")
    if fmt.kind == "json_object":
        return llguidance.LLMatcher.grammar_from_json_schema({"type": "object"}, defaults=JSON_OPTIONS)
    if fmt.kind == "json_schema":
        return llguidance.LLMatcher.grammar_from_json_schema(fmt.source, defaults=JSON_OPTIONS)
    if fmt.kind == "grammar":
        return llguidance.LLMatcher.grammar_from_lark(fmt.source)
    return llguidance.LLMatcher.grammar_from_regex(fmt.source)
