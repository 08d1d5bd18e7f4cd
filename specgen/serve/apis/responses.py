"""OpenAI's Responses API as Codex speaks it: `POST /v1/responses`.

As strict as OpenAI's reference about the types of what it defines (`"stream": "yes"` is a 400);
fields and item types it does not know are taken and ignored, as newer clients send more of them.
`instructions` and the `input` items become the chat-template messages chat completions makes of
the same conversation: developer and system messages (and the instructions) as one leading system
message, input_text / output_text parts as text, function_call and custom_tool_call items as the
assistant's tool calls, their outputs as tool messages; reasoning items and hosted tools (web
search, ...) are left out. Function tools go to the template as they are; a custom (free-form)
tool as a function of one string, `input`, whose calls come back as custom_tool_call items with
that raw input; with `parallel_tool_calls` false only the first call the model writes is returned.
`text.format` (a JSON schema or JSON object) constrains the output (structured.py).
What cannot be honoured is a 400 naming it: images and files, a stored
conversation (`previous_response_id`, item references), forcing a tool; and
what OpenAI's API refuses is refused too: temperature above 2, metadata that is no object of
strings, a tool call's output answering no earlier call.
Without `max_output_tokens` (Codex sends none) the output is bounded by the room in the context.
"""

from __future__ import annotations

import json
from typing import Any, Literal, Optional, Union

from pydantic import Field

from specgen.serve.apis.structured import FlatFormat, read
from specgen.serve.schema import (
    JOIN,
    Body,
    Generation,
    Lenient,
    Messages,
    ModelName,
    Schema,
    Tools,
    bad,
    make_generation,
    tagged,
)

REFUSED = ("input_image", "input_file", "input_audio")  # parts a text model cannot read
CUSTOM_INPUT = "input"  # the one argument a custom tool gets as a function


class Part(Lenient):
    type: str
    text: Optional[str] = None  # input_text, output_text
    refusal: Optional[str] = None


class MessageItem(Lenient):
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: Union[str, list[Part]]


class FunctionCallItem(Lenient):
    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str


class CustomToolCallItem(Lenient):
    type: Literal["custom_tool_call"]
    call_id: str
    name: str
    input: str


class OutputItem(Lenient):
    type: Literal["function_call_output", "custom_tool_call_output"]
    call_id: str
    output: Union[str, list[Part]]


class OtherItem(Lenient):
    """reasoning items, hosted tools' calls and item types not known yet: left out."""

    type: str


Item = tagged("message", message=MessageItem, function_call=FunctionCallItem, custom_tool_call=CustomToolCallItem,
              function_call_output=OutputItem, custom_tool_call_output=OutputItem, other=OtherItem)


class FunctionTool(Lenient):
    type: Literal["function"]
    name: str
    description: Optional[str] = None
    parameters: Optional[Schema] = None
    strict: Optional[bool] = None


class CustomTool(Lenient):
    type: Literal["custom"]
    name: str
    description: Optional[str] = None
    format: Optional[dict[str, Any]] = None


class NamespaceTool(Lenient):
    type: Literal["namespace"]
    name: str
    tools: Tools[Tool] = Field(default_factory=list)


class OtherTool(Lenient):
    """Hosted tools (web_search, file_search, ...): the server runs none, so they are left out."""

    type: str


Tool = tagged(function=FunctionTool, custom=CustomTool, namespace=NamespaceTool, other=OtherTool)
NamespaceTool.model_rebuild()


class TextOptions(Lenient):
    format: Optional[FlatFormat] = None  # structured.py's


class ResponsesRequest(Lenient, Body):
    """A `/v1/responses` body."""

    model: ModelName
    input: Union[str, Messages[Item]]
    instructions: Optional[str] = None
    tools: Optional[Tools[Tool]] = None
    tool_choice: Union[Literal["auto", "none", "required"], dict[str, Any], None] = None
    max_output_tokens: Optional[int] = None
    # OpenAI's range; below 0 is settings.check's
    temperature: Optional[float] = Field(None, le=2, allow_inf_nan=False)
    top_p: Optional[float] = None
    stream: Optional[bool] = None
    parallel_tool_calls: Optional[bool] = None  # false: only the first tool call is returned
    store: Optional[bool] = None  # nothing is stored: previous_response_id is refused
    background: Optional[bool] = None
    previous_response_id: Optional[str] = None
    conversation: Union[str, dict[str, Any], None] = None
    text: Optional[TextOptions] = None
    metadata: Optional[dict[str, str]] = None  # the caller's own records: changes nothing

    def conversation_messages(self) -> tuple[list[dict], list[dict] | None, set[str]]:
        """(chat-template messages, tools or None, the names of custom tools)."""
        self._refusals()
        system = [self.instructions] if self.instructions else []
        messages: list[dict] = []
        items = [MessageItem(role="user", content=self.input)] if isinstance(self.input, str) else self.input
        called: set[str] = set()  # the call ids of the tool calls so far
        for i, item in enumerate(items):
            where = f"input[{i}]"
            if isinstance(item, MessageItem):
                text = _text(item.content, f"{where}.content")
                if item.role in ("system", "developer"):
                    system.append(text)
                else:
                    messages.append({"role": item.role, "content": text})
            elif isinstance(item, (FunctionCallItem, CustomToolCallItem)):
                arguments = _arguments(item.arguments, f"{where}.arguments") if isinstance(item, FunctionCallItem) \
                    else {CUSTOM_INPUT: item.input}
                if not messages or messages[-1]["role"] != "assistant":
                    messages.append({"role": "assistant", "content": ""})
                call = {"id": item.call_id, "type": "function", "function": {"name": item.name, "arguments": arguments}}
                messages[-1].setdefault("tool_calls", []).append(call)
                called.add(item.call_id)
            elif isinstance(item, OutputItem):
                if item.call_id not in called:
                    call = item.type.removesuffix("_output")
                    raise bad(f"{where}.call_id", f"{item.call_id!r} answers no earlier {call} item: "
                                                  "an output follows the call it answers")
                messages.append({"role": "tool", "tool_call_id": item.call_id, "content": _text(item.output, f"{where}.output")})
            elif item.type == "item_reference":
                raise bad(where, "item references are not supported: specgen stores no responses; send the items")
        if system:
            messages.insert(0, {"role": "system", "content": JOIN.join(system)})
        tools, custom = _tools(self.tools or ())
        return messages, (tools if tools and self.tool_choice != "none" else None), custom

    def _refusals(self) -> None:
        if self.previous_response_id is not None or self.conversation is not None:
            name = "previous_response_id" if self.previous_response_id is not None else "conversation"
            raise bad(name, "is not supported: specgen stores no responses; send the whole conversation as input")
        if self.background:
            raise bad("background", "is not supported: answers are generated while the request waits")
        if self.tool_choice not in (None, "auto", "none") and self.tool_choice != {"type": "auto"}:
            raise bad("tool_choice", "forcing a tool is not supported: the model chooses (\"auto\") or no tools "
                                     "are offered (\"none\")")

    def generation(self, prompt_tokens: int, context: int | None, default_max_tokens: int, **known) -> Generation:
        """What this request asks of the engine; no max_output_tokens means the room in the context."""
        room = None if context is None else context - prompt_tokens
        limit = self.max_output_tokens
        if limit is None:
            limit = default_max_tokens if room is None else room
        elif room is not None and limit >= 1:  # an invalid one stays, for Options to name it
            limit = min(limit, room)
        return make_generation(max_tokens=limit, temperature=self.temperature, top_p=self.top_p,
                               stream=bool(self.stream), fields={"max_tokens": "max_output_tokens"},
                               response_format=read(self.text and self.text.format, "text.format"), **known)


def _text(content, where: str) -> str:
    if isinstance(content, str):
        return content
    for j, part in enumerate(content):
        if part.type in REFUSED:
            raise bad(f"{where}[{j}]", f"{part.type} parts are not supported: specgen serves text-only models")
    said = (p.text if p.text is not None else p.refusal for p in content)
    return JOIN.join(text for text in said if text is not None)


def _arguments(arguments: str, where: str) -> Any:
    try:
        return json.loads(arguments or "{}")
    except json.JSONDecodeError:
        raise bad(where, "is not JSON") from None


def _tools(tools) -> tuple[list[dict], set[str]]:
    """Chat-template tools (function tools as they are, custom tools as functions of one string)
    and the custom tools' names."""
    out, custom = [], set()
    for t in tools:
        if isinstance(t, NamespaceTool):
            inner, names = _tools(t.tools)
            out += inner
            custom |= names
        elif isinstance(t, FunctionTool):
            fields = (("name", t.name), ("description", t.description), ("parameters", t.parameters))
            out.append({"type": "function", "function": {k: v for k, v in fields if v is not None}})
        elif isinstance(t, CustomTool):
            custom.add(t.name)
            grammar = (t.format or {}).get("definition")
            about = (t.description or "") + (f"\n\nThe input follows this grammar:\n{grammar}" if grammar else "")
            out.append({"type": "function", "function": {
                "name": t.name, "description": about.strip(),
                "parameters": {"type": "object", "properties": {CUSTOM_INPUT: {"type": "string"}},
                               "required": [CUSTOM_INPUT]}}})
    return out, custom
