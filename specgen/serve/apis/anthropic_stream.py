"""Anthropic's message shapes for one answer: its stream's events in the documented order, its body.

`MessageBuilder` is generation/turn.py's Builder for `/v1/messages`. A stream goes `message_start` (once the
worker takes the job, with the input usage: tokens prefilled and tokens read from the prompt
cache), then content blocks one at a time, indices 0, 1, ... (`content_block_start`, deltas,
`content_block_stop`): reasoning as a thinking block (`thinking_delta`), text (`text_delta`), each
tool call as a tool_use block that starts with `input: {}` and gets its arguments as one
`input_json_delta`; then `message_delta` (stop reason, final usage) and `message_stop`. An error
is an `error` event. The plain body is the message those events build. An answer that ran into
the end of the context (its max_tokens clamped to the room left) stops for
`model_context_window_exceeded`, as Anthropic's do, not for `max_tokens`.
"""

from __future__ import annotations

import json
import uuid

from specgen.serve.apis.anthropic import error_body, json_arguments
from specgen.serve.apis.chat_stream import specgen_stats
from specgen.serve.generation.turn import Done, Event, Piece, generated
from specgen.serve.generation.worker import Started
from specgen.serve.prompting import Parts
from specgen.serve.schema import ApiError

# finish reasons as Anthropic says them ("stop" is end_turn, or stop_sequence when one matched)
STOP_REASONS = {"length": "max_tokens", "tool_calls": "tool_use", "stop": "end_turn"}


class MessageBuilder:
    """One assistant message, built from the pieces of its generation."""

    def __init__(self, model: str, context_bound: bool = False):
        self.model = model
        self.context_bound = context_bound  # the room in the context, not max_tokens, limits the answer
        self.id = f"msg_{uuid.uuid4().hex[:24]}"
        self.blocks: list[dict] = []
        self.open: str | None = None  # the type of the block being streamed
        self.prompt_tokens = self.cached = 0
        self.done: Done | None = None

    @property
    def label(self) -> str:
        return f"message {self.id[-8:]}"

    def opening(self) -> list[Event]:
        return []  # message_start waits for the input usage

    def feed(self, piece: Piece) -> list[Event]:
        if isinstance(piece, Started):
            self.prompt_tokens, self.cached = piece.prompt_tokens, piece.cached_tokens
            start = {**self._message(), "content": [], "stop_reason": None, "stop_sequence": None}
            return [("message_start", {"type": "message_start", "message": start})]
        if isinstance(piece, Parts):
            return (self._text("thinking", piece.reasoning) + self._text("text", piece.content)
                    + [e for call in piece.tool_calls for e in self._tool_use(call)])
        self.done = piece
        self.cached = piece.stats.cached_tokens  # with what it took from a request beside it, once prefilled
        delta = {"stop_reason": self._stop_reason(), "stop_sequence": piece.stop_sequence}
        # specgen's counts ride on message_delta as on the whole body's message (clients ignore them)
        final = {"type": "message_delta", "delta": delta, "usage": self._usage(), "specgen": specgen_stats(piece.stats)}
        return self._close() + [("message_delta", final), ("message_stop", {"type": "message_stop"})]

    def failed(self, error: ApiError) -> list[Event]:
        return [("error", error_body(error))]

    def whole(self) -> dict:
        return {**self._message(), "content": self.blocks, "stop_reason": self._stop_reason(),
                "stop_sequence": self.done.stop_sequence, "specgen": specgen_stats(self.done.stats)}

    def _message(self) -> dict:
        return {"id": self.id, "type": "message", "role": "assistant", "model": self.model, "usage": self._usage()}

    def _usage(self) -> dict:
        # Anthropic's input_tokens are those not read from the cache: the three add up to the prompt
        return {"input_tokens": self.prompt_tokens - self.cached, "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": self.cached,
                "output_tokens": generated(self.done.stats) if self.done else 0}

    def _stop_reason(self) -> str:
        if self.done.stop_sequence:
            return "stop_sequence"
        if self.done.finish == "length" and self.context_bound:
            return "model_context_window_exceeded"
        return STOP_REASONS[self.done.finish]

    def _start(self, block: dict, shown: dict | None = None) -> list[Event]:
        events = self._close()
        self.blocks.append(block)
        self.open = block["type"]
        return events + [("content_block_start", {"type": "content_block_start", "index": len(self.blocks) - 1,
                                                  "content_block": shown or dict(block)})]

    def _delta(self, delta: dict) -> Event:
        return ("content_block_delta", {"type": "content_block_delta", "index": len(self.blocks) - 1, "delta": delta})

    def _close(self) -> list[Event]:
        if self.open is None:
            return []
        self.open = None
        return [("content_block_stop", {"type": "content_block_stop", "index": len(self.blocks) - 1})]

    def _text(self, kind: str, text: str) -> list[Event]:
        if not text:
            return []
        if self.open != kind:
            events = self._start({"type": kind, kind: ""} | ({"signature": ""} if kind == "thinking" else {}))
        else:
            events = []
        self.blocks[-1][kind] += text
        return events + [self._delta({"type": f"{kind}_delta", kind: text})]

    def _tool_use(self, call: dict) -> list[Event]:
        block = {"type": "tool_use", "id": "toolu_" + call["id"].removeprefix("call_"),
                 "name": call["function"]["name"], "input": json_arguments(call)}
        arguments = json.dumps(block["input"], ensure_ascii=False)
        return [*self._start(block, {**block, "input": {}}),
                self._delta({"type": "input_json_delta", "partial_json": arguments}), *self._close()]
