"""Anthropic's Messages API as Claude Code speaks it: `POST /v1/messages` and its count_tokens.

The schema is as strict as Anthropic's about what it defines (`"stream": "yes"` is a 400) and, as
Anthropic's own API does for newer clients, takes fields and content blocks it does not know and
ignores them. A request becomes the chat-template messages and tools that chat completions makes
of the same conversation (so both give the same prompt and text); `output_config.format` (a JSON
schema) constrains the output (structured.py); with the tool choice's
`disable_parallel_tool_use` only the first tool call the model writes is returned. What a text
model cannot honour (image and document blocks, forcing a tool) is a 400 naming it. Claude Code's billing
header, a system block that changes with every request, never reaches the prompt, so the next
turn's prompt starts as this one's did and the prompt cache hits. A prompt that leaves no room to
generate is Anthropic's 400 "input length and `max_tokens` exceed context limit: I + M > L"
(which Claude Code parses); otherwise `max_tokens` is clamped to the room left. What Anthropic's
API refuses is refused here too: temperature outside 0-1, metadata that is no object, a message
with no content (but a final assistant one), a tool_result answering no earlier tool_use. Errors
are Anthropic's `{"type": "error", "error": {...}}` (`error_body`).
"""

from __future__ import annotations

import json
from typing import Any, Literal, Optional, Union

from pydantic import Field

from specgen.serve.apis.structured import OutputConfig, read
from specgen.serve.schema import (
    JOIN,
    ApiError,
    Body,
    Generation,
    Lenient,
    Messages,
    ModelName,
    Schema,
    Stops,
    Tools,
    bad,
    make_generation,
    tagged,
)

BILLING_HEADER = "x-anthropic-billing-header:"  # Claude Code's per-request system block
REFUSED = ("image", "document")  # blocks a text model cannot read


class TextBlock(Lenient):
    type: Literal["text"]
    text: str


class ToolUseBlock(Lenient):
    type: Literal["tool_use"]
    id: str
    name: str
    input: dict[str, Any]


class OtherBlock(Lenient):
    """thinking, redacted_thinking, images, documents and block types not known yet."""

    type: str


class ToolResultBlock(Lenient):
    type: Literal["tool_result"]
    tool_use_id: str
    content: Union[str, list[Block]] = ""
    is_error: Optional[bool] = None


Block = tagged(text=TextBlock, tool_use=ToolUseBlock, tool_result=ToolResultBlock, other=OtherBlock)
ToolResultBlock.model_rebuild()


class Message(Lenient):
    role: Literal["user", "assistant", "system"]  # newer Claude Code sends system messages too
    content: Union[str, list[Block]]


class Tool(Lenient):
    name: str
    type: Optional[str] = None  # "custom", or a server tool's version ("web_search_20250305", ...)
    description: Optional[str] = None
    input_schema: Optional[Schema] = None  # server tools have none: nothing to render
    defer_loading: Optional[bool] = None  # loaded by a tool search the client runs, not shown


class ToolChoice(Lenient):
    type: Literal["auto", "any", "tool", "none"]
    name: Optional[str] = None
    disable_parallel_tool_use: Optional[bool] = None  # true: only the first tool call is returned


class Metadata(Lenient):
    user_id: Optional[str] = None


class CountRequest(Lenient, Body):
    """A `/v1/messages/count_tokens` body (and all of a messages body but max_tokens and sampling)."""

    model: ModelName
    messages: Messages[Message] = Field(min_length=1)
    system: Union[str, list[Block], None] = None
    tools: Optional[Tools[Tool]] = None
    tool_choice: Optional[ToolChoice] = None
    metadata: Optional[Metadata] = None  # the caller's own records: changes nothing

    def conversation(self) -> tuple[list[dict], list[dict] | None]:
        """(chat-template messages, tools or None): system blocks and system messages as one
        leading system message, tool_use blocks as tool calls, tool_result blocks as tool messages."""
        system = _blocks(self.system)
        _refuse(system, "system")
        system = _said(system)
        messages: list[dict] = []
        called: set[str] = set()  # the ids of the tool_use blocks so far
        for i, m in enumerate(self.messages):
            where = f"messages[{i}].content"
            # Anthropic's rule is for user and assistant turns: Claude Code sends per-turn system
            # messages with no content
            last = i == len(self.messages) - 1
            if not m.content and m.role != "system" and not (m.role == "assistant" and last):
                raise bad(where, "is empty: every user or assistant message but a final assistant one must "
                                 "say something")
            blocks = _blocks(m.content)
            _refuse(blocks, where)
            if m.role == "system":
                system += _said(blocks)
            elif m.role == "assistant":
                messages.append(_assistant(blocks))
                called |= {b.id for b in blocks if isinstance(b, ToolUseBlock)}
            else:
                messages.extend(_user(blocks, where, called))
        if system:
            messages.insert(0, {"role": "system", "content": JOIN.join(system)})
        return messages, self._tools()

    def _tools(self) -> list[dict] | None:
        choice = self.tool_choice.type if self.tool_choice else "auto"
        if choice in ("any", "tool"):
            raise bad("tool_choice", f"{choice!r} is not supported: the model chooses (\"auto\") or no tools "
                                     "are offered (\"none\")")
        tools = [{"type": "function", "function": {k: v for k, v in (("name", t.name), ("description", t.description),
                                                                     ("parameters", t.input_schema)) if v is not None}}
                 for t in self.tools or () if t.input_schema is not None and not t.defer_loading]
        return tools if tools and choice != "none" else None


class MessagesRequest(CountRequest):
    """A `/v1/messages` body."""

    max_tokens: int
    stop_sequences: Optional[Stops] = None
    # unset: the server's default (greedy), not Anthropic's 1.0; Anthropic's range (below 0 is
    # settings.check's to name)
    temperature: Optional[float] = Field(None, le=1, allow_inf_nan=False)
    top_p: Optional[float] = None
    top_k: Optional[int] = None
    stream: Optional[bool] = None
    output_config: Optional[OutputConfig] = None  # its format constrains the output (structured.py)

    @property
    def one_tool_call(self) -> bool:
        """Whether at most one tool call may be returned (disable_parallel_tool_use)."""
        return bool(self.tool_choice and self.tool_choice.disable_parallel_tool_use)

    def generation(self, prompt_tokens: int, context: int | None, **known) -> Generation:
        """What this request asks of the engine, max_tokens clamped to the room the prompt leaves."""
        if context is not None and prompt_tokens >= context:
            raise ApiError(400, f"input length and `max_tokens` exceed context limit: {prompt_tokens} + "
                                f"{self.max_tokens} > {context}, decrease input length or `max_tokens` and try again",
                           "messages", "context_length_exceeded")
        room = self.max_tokens
        if context is not None and room >= 1:  # an invalid max_tokens stays, for Options to name it
            room = min(room, context - prompt_tokens)
        return make_generation(max_tokens=room, stop=tuple(self.stop_sequences or ()),
                               temperature=self.temperature, top_p=self.top_p, top_k=self.top_k, stream=bool(self.stream),
                               fields={"stop": "stop_sequences"}, response_format=read(
                                   self.output_config and self.output_config.format, "output_config.format"),
                               **known)


def _blocks(content) -> list:
    return [TextBlock(type="text", text=content)] if isinstance(content, str) else list(content or ())


def _said(blocks: list) -> list[str]:
    """The text of system blocks, but Claude Code's billing header."""
    return [b.text for b in blocks if isinstance(b, TextBlock) and not b.text.startswith(BILLING_HEADER)]


def _refuse(blocks: list, where: str) -> None:
    for j, b in enumerate(blocks):
        if b.type in REFUSED:
            raise bad(f"{where}[{j}]", f"{b.type} blocks are not supported: specgen serves text-only models")
        if isinstance(b, ToolResultBlock):
            _refuse(_blocks(b.content), f"{where}[{j}].content")


def _assistant(blocks: list) -> dict:
    # thinking blocks stay out, as chat templates drop earlier turns' reasoning
    text = JOIN.join(b.text for b in blocks if isinstance(b, TextBlock))
    message: dict[str, Any] = {"role": "assistant", "content": text}
    calls = [{"id": b.id, "type": "function", "function": {"name": b.name, "arguments": b.input}}
             for b in blocks if isinstance(b, ToolUseBlock)]
    if calls:
        message["tool_calls"] = calls
    return message


def _user(blocks: list, where: str, called: set[str]) -> list[dict]:
    out, text, results = [], [], 0
    for j, b in enumerate(blocks):
        if isinstance(b, TextBlock):
            text.append(b.text)
        elif isinstance(b, ToolResultBlock):
            if b.tool_use_id not in called:
                raise bad(f"{where}[{j}].tool_use_id", f"{b.tool_use_id!r} answers no earlier tool_use "
                                                       "block: a tool_result follows the tool_use it answers")
            if text:  # text before a result is said before it
                out.append({"role": "user", "content": JOIN.join(text)})
                text = []
            said = JOIN.join(x.text for x in _blocks(b.content) if isinstance(x, TextBlock))
            out.append({"role": "tool", "tool_call_id": b.tool_use_id,
                        "content": f"Error: {said}" if b.is_error else said})
            results += 1
    if text or not results:
        out.append({"role": "user", "content": JOIN.join(text)})
    return out


# ApiError kinds as Anthropic names them
_KINDS = {"server_error": "api_error", "invalid_request_error": "invalid_request_error"}


def error_body(e: ApiError) -> dict:
    """Anthropic's error shape for `e`."""
    kind = {413: "request_too_large", 503: "overloaded_error"}.get(e.status) or _KINDS.get(e.kind, e.kind)
    return {"type": "error", "error": {"type": kind, "message": e.message}}


def json_arguments(call: dict) -> dict:
    """A parsed tool call's arguments as the object a tool_use block holds."""
    arguments = call["function"]["arguments"]
    try:
        value = json.loads(arguments) if isinstance(arguments, str) else arguments
    except json.JSONDecodeError:
        value = None
    return value if isinstance(value, dict) else {"input": arguments}
