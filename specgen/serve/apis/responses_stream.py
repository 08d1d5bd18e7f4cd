"""OpenAI's Responses shapes for one answer: its stream's events in the documented order, its body.

`ResponseBuilder` is generation/turn.py's Builder for `/v1/responses`. A stream goes `response.created`,
`response.in_progress`, then each output item in turn: `response.output_item.added`, for a message
`response.content_part.added`, `response.output_text.delta`..., `response.output_text.done`,
`response.content_part.done`; for reasoning `response.reasoning_text.delta`... / `.done`; for a
function call `response.function_call_arguments.delta` / `.done`; for a custom tool call
`response.custom_tool_call_input.delta` / `.done`; then `response.output_item.done` with the whole
item. It ends in `response.completed` (usage with cached tokens), `response.incomplete` when the
output hit its limit, or `response.failed` with the error. Every event has its sequence_number;
there is no `[DONE]`. The plain body is the response those events end with.
"""

from __future__ import annotations

import json
import time
import uuid

from specgen.serve.apis.chat_stream import specgen_stats
from specgen.serve.apis.responses import CUSTOM_INPUT, ResponsesRequest
from specgen.serve.generation.turn import Event, Piece, generated
from specgen.serve.generation.worker import Started
from specgen.serve.prompting import Parts
from specgen.serve.schema import ApiError

# where each kind of item's streamed text goes: (field of the item, its delta event's name)
TEXTS = {"message": ("text", "response.output_text"), "reasoning": ("text", "response.reasoning_text"),
         "function_call": ("arguments", "response.function_call_arguments"),
         "custom_tool_call": ("input", "response.custom_tool_call_input")}


def _id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:24]}"


class ResponseBuilder:
    """One response, built from the pieces of its generation."""

    def __init__(self, body: ResponsesRequest, custom: set[str], temperature: float):
        self.body, self.custom, self.temperature = body, custom, temperature
        self.id, self.created = _id("resp"), int(time.time())
        self.output: list[dict] = []
        self.open: dict | None = None  # the item being streamed
        self.buffer = ""  # its text so far
        self.sequence = 0
        self.prompt_tokens = self.cached = 0
        self.status, self.error, self.done = "in_progress", None, None

    @property
    def label(self) -> str:
        return f"response {self.id[-8:]}"

    def opening(self) -> list[Event]:
        return [self._event("response.created", response=self._response()),
                self._event("response.in_progress", response=self._response())]

    def feed(self, piece: Piece) -> list[Event]:
        if isinstance(piece, Started):
            self.prompt_tokens, self.cached = piece.prompt_tokens, piece.cached_tokens
            return []
        if isinstance(piece, Parts):
            events = self._text("reasoning", piece.reasoning) + self._text("message", piece.content)
            for call in piece.tool_calls:
                events += self._call(call)
            return events
        self.done = piece
        self.cached = piece.stats.cached_tokens  # with what it took from a request beside it, once prefilled
        self.status = "incomplete" if piece.finish == "length" else "completed"
        return self._close() + [self._event(f"response.{self.status}", response=self._response())]

    def failed(self, error: ApiError) -> list[Event]:
        self.status, self.error = "failed", {"code": error.code or error.kind, "message": error.message}
        return [self._event("response.failed", response=self._response())]

    def whole(self) -> dict:
        return self._response()

    def _response(self) -> dict:
        b = self.body
        body = {"id": self.id, "object": "response", "created_at": self.created, "status": self.status,
                "background": False, "error": self.error,
                "incomplete_details": {"reason": "max_output_tokens"} if self.status == "incomplete" else None,
                "instructions": b.instructions, "max_output_tokens": b.max_output_tokens, "model": b.model,
                "output": list(self.output), "parallel_tool_calls": b.parallel_tool_calls is not False,
                "previous_response_id": None, "reasoning": {"effort": None, "summary": None}, "store": False,
                "temperature": self.temperature, "text": {"format": self._format()},
                "tool_choice": b.tool_choice or "auto",
                "tools": [t.model_dump(exclude_none=True) for t in b.tools or ()], "top_p": b.top_p,
                "truncation": "disabled", "usage": None, "metadata": b.metadata or {}}
        if self.done is not None:
            stats = self.done.stats
            out = generated(stats)
            body["usage"] = {"input_tokens": self.prompt_tokens, "input_tokens_details": {"cached_tokens": self.cached},
                             "output_tokens": out, "output_tokens_details": {"reasoning_tokens": 0},
                             "total_tokens": self.prompt_tokens + out}
            body["specgen"] = specgen_stats(stats)
        return body

    def _format(self) -> dict:
        """The request's text.format, echoed as OpenAI does."""
        fmt = self.body.text.format if self.body.text else None
        return fmt.model_dump(by_alias=True, exclude_none=True) if fmt is not None else {"type": "text"}

    def _event(self, kind: str, **fields) -> Event:
        self.sequence += 1
        return kind, {"type": kind, "sequence_number": self.sequence - 1, **fields}

    def _where(self) -> dict:
        return {"item_id": self.open["id"], "output_index": len(self.output) - 1}

    def _add(self, item: dict) -> list[Event]:
        events = self._close()
        self.output.append(item)
        self.open = item
        events.append(self._event("response.output_item.added", output_index=len(self.output) - 1, item=dict(item)))
        if item["type"] == "message":
            events.append(self._event("response.content_part.added", **self._where(), content_index=0,
                                      part={"type": "output_text", "text": "", "annotations": []}))
        return events

    def _text(self, kind: str, text: str) -> list[Event]:
        if not text:
            return []
        if self.open is None or self.open["type"] != kind:
            item = {"type": "message", "id": _id("msg"), "status": "in_progress", "role": "assistant", "content": []} \
                if kind == "message" else {"type": "reasoning", "id": _id("rs"), "summary": [], "content": []}
            events = self._add(item)
        else:
            events = []
        self.buffer += text
        return events + [self._delta(text)]

    def _call(self, call: dict) -> list[Event]:
        name, arguments = call["function"]["name"], call["function"]["arguments"]
        if name in self.custom:
            item = {"type": "custom_tool_call", "id": _id("ctc"), "status": "in_progress", "call_id": call["id"],
                    "name": name, "input": ""}
            value = _custom_input(arguments)
        else:
            item = {"type": "function_call", "id": _id("fc"), "status": "in_progress", "call_id": call["id"],
                    "name": name, "arguments": ""}
            value = arguments
        events = self._add(item)
        self.buffer = value
        return events + [self._delta(value), *self._close()]

    def _delta(self, text: str) -> Event:
        extra = {"content_index": 0, "logprobs": []} if self.open["type"] == "message" else \
            {"content_index": 0} if self.open["type"] == "reasoning" else {}
        return self._event(f"{TEXTS[self.open['type']][1]}.delta", **self._where(), **extra, delta=text)

    def _close(self) -> list[Event]:
        """Finish the open item: its text's done events, then output_item.done with the whole item."""
        item = self.open
        if item is None:
            return []
        self.open, text, self.buffer = None, self.buffer, ""
        field, name = TEXTS[item["type"]]
        where = {"item_id": item["id"], "output_index": len(self.output) - 1}
        events = []
        if item["type"] == "message":
            part = {"type": "output_text", "text": text, "annotations": []}
            item.update(status="completed", content=[part])
            events += [self._event(f"{name}.done", **where, content_index=0, text=text, logprobs=[]),
                       self._event("response.content_part.done", **where, content_index=0, part=part)]
        elif item["type"] == "reasoning":
            item["content"] = [{"type": "reasoning_text", "text": text}]
            events.append(self._event(f"{name}.done", **where, content_index=0, text=text))
        else:
            item.update({field: text, "status": "completed"})
            extra = {"name": item["name"]} if item["type"] == "function_call" else {}
            events.append(self._event(f"{name}.done", **where, **extra, **{field: text}))
        return events + [self._event("response.output_item.done", output_index=len(self.output) - 1, item=dict(item))]


def _custom_input(arguments: str) -> str:
    """A custom tool's raw input: the `input` string of its call, or what the model wrote."""
    try:
        value = json.loads(arguments)
    except json.JSONDecodeError:
        return arguments
    return value[CUSTOM_INPUT] if isinstance(value, dict) and isinstance(value.get(CUSTOM_INPUT), str) else arguments
