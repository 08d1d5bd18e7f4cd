"""Tool calling for models whose tool-calling format mlx-lm does not know (SmolLM2 among them), in
the way llama.cpp's generic format does it.

The tools are described in the system message (`described`), earlier calls and their results
written into the conversation as the JSON the model wrote and read; the answer is held by a
grammar (`answer_format`) to either plain text (that does not open with `{`) or one JSON call,
`{"tool_call": {"name": ..., "arguments": {...}}}`, its arguments those of the tool's schema. With a
response_format too, the answer is either that call or the format's JSON (OpenAI's rule: a
schema holds the text answer, not the calls). `parse_call` reads the call back into an API's tool
call. A tool schema the grammar engine cannot compile (or does not implement) leaves that call's
arguments any JSON object, never the request refused: agents send their tools every turn.
"""

from __future__ import annotations

import json
import logging
import re
import threading
from collections import OrderedDict
from typing import Any

from specgen.errors import SettingError
from specgen.structured.formats import JSON_OPTIONS, Format
from specgen.structured.grammar import KEPT

_log = logging.getLogger("specgen.serve")
# (a model's grammars, a strict call format) that failed to compile: agents resend the same tools
# every turn, so each set is tried and logged once
_FAILED: OrderedDict = OrderedDict()
_LOCK = threading.Lock()
KEY = "tool_call"
OPENING = f'{{"{KEY}":'  # how every call opens (compact JSON, after any whitespace)
INSTRUCTIONS = ("To call one of these tools, answer with only a JSON object: "
                '{"tool_call": {"name": "<the tool\'s name>", "arguments": {<its arguments>}}}. '
                "The result comes back in the next message. Otherwise, answer in plain text.")
# Plain text (not opening with "{", after any whitespace), or a call after any whitespace
# (sentencepiece tokenizers open with a space), or nothing.
_TEXT_OR_CALL = "start: (SPACE? call | TEXT)?\nTEXT: /\\s*[^{\\s][\\s\\S]*/\nSPACE: /\\s+/\ncall: %json "


def described(messages: list[dict], tools: list[dict]) -> list[dict]:
    """`messages` with the tools described in the system message, and earlier tool calls and
    results written as text (a template that knows no tools drops them otherwise)."""
    lines = ["You can call these tools:"]
    for t in tools:
        f = t["function"]
        about = f" {f['description']}" if f.get("description") else ""
        lines.append(f"- {f['name']}:{about} Arguments (JSON schema): "
                     f"{json.dumps(f.get('parameters') or {'type': 'object'}, ensure_ascii=False)}")
    lines.append(INSTRUCTIONS)
    out = [_written(m) for m in messages]
    if out and out[0]["role"] == "system":
        out[0] = {**out[0], "content": f"{out[0]['content']}\n\n" + "\n".join(lines)}
    else:
        out.insert(0, {"role": "system", "content": "\n".join(lines)})
    merged: list[dict] = []  # tool results are user messages now: one after another is one
    for m in out:
        if merged and m["role"] == merged[-1]["role"] == "user":
            merged[-1] = {**merged[-1], "content": f"{merged[-1]['content']}\n\n{m['content']}"}
        else:
            merged.append(m)
    return merged


def _written(m: dict) -> dict:
    if m.get("tool_calls"):
        calls = "\n".join(json.dumps({KEY: {"name": c["function"]["name"], "arguments": c["function"]["arguments"]}},
                                     ensure_ascii=False, separators=(",", ":")) for c in m["tool_calls"])
        return {"role": "assistant", "content": f"{m['content']}\n{calls}".strip()}
    if m["role"] == "tool":
        return {"role": "user", "content": json.dumps({"tool_result": m["content"]}, ensure_ascii=False)}
    return m


def answer_format(tools: list[dict], fmt: Format | None, compile_: Any) -> Format:
    """The grammar of the answer: text or a call (`fmt` None), else `fmt`'s JSON or a call.
    `compile_` compiles a Format (SettingError if it cannot): a tool schema that fails leaves
    every call's arguments any JSON object."""
    strict = _format(tools, fmt, strict=True)
    key = (getattr(compile_, "__self__", None), strict)
    if key not in _FAILED:
        try:
            return _compiled(strict, compile_)
        except SettingError as e:
            found = re.search(r"JSON schema: ([^\n]*)", e.requirement)  # the reason, not the grammar
            why = (found.group(1) if found else e.requirement.splitlines()[0])[:300]
            _log.warning("the tools' schemas do not compile (%s): their calls' arguments are any JSON object", why)
            with _LOCK:  # requests are checked on several threads
                _FAILED[key] = None
                if len(_FAILED) > KEPT:
                    _FAILED.popitem(last=False)
    return _compiled(_format(tools, fmt, strict=False), compile_)


def _compiled(f: Format, compile_) -> Format:
    compile_(f)
    return f


def _compact(schema) -> dict:
    """A JSON schema for a %json rule, as compact as formats.JSON_OPTIONS makes a response_format."""
    schema = schema if isinstance(schema, dict) else {} if schema is True else {"not": {}}
    return {**schema, "x-guidance": {**(schema.get("x-guidance") or {}), **JSON_OPTIONS}}


def _format(tools: list[dict], fmt: Format | None, strict: bool) -> Format:
    calls = []
    for t in tools:
        f = t["function"]
        arguments = f.get("parameters") if strict and f.get("parameters") else {"type": "object"}
        calls.append({"type": "object", "properties": {"name": {"const": f["name"]}, "arguments": arguments},
                      "required": ["name", "arguments"], "additionalProperties": False})
    call = _compact({"type": "object", "properties": {KEY: {"anyOf": calls}}, "required": [KEY],
                     "additionalProperties": False})
    rule = json.dumps(call, ensure_ascii=False)
    if fmt is None:
        return Format("grammar", _TEXT_OR_CALL + rule + "\n")
    if fmt.kind not in ("json_schema", "json_object"):  # a grammar of the caller's own: it rules
        return fmt
    answer = {"type": "object"} if fmt.kind == "json_object" else json.loads(fmt.source)
    return Format("grammar", f"start: call | answer\ncall: %json {rule}\n"
                             f"answer: %json {json.dumps(_compact(answer), ensure_ascii=False)}\n", fmt.name)


def parse_call(text: str) -> dict | None:
    """The call `text` is (`{"name", "arguments"}`), or None when it is no call."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return None
    if not (isinstance(value, dict) and set(value) == {KEY} and isinstance(value[KEY], dict)):
        return None
    call = value[KEY]
    if not isinstance(call.get("name"), str) or not isinstance(call.get("arguments"), dict):
        return None
    return {"name": call["name"], "arguments": call["arguments"]}
