"""Ollama's shapes for one answer of `/api/chat` or `/api/generate`: its NDJSON lines as it
streams (one object a line, `done: false` while text comes, a tool call in a line of its own
before the last), its final line with the counts and durations, and the plain body, which holds
what those lines held.

Counts are the other APIs': `eval_count` is chat completions' `completion_tokens` (a stop token
included), `prompt_eval_count` the whole prompt (cached tokens too); durations are integer
nanoseconds: `prompt_eval_duration` the prefill, `eval_duration` the decoding, `total_duration`
from the request's arrival, `load_duration` the model's load where this request loaded it.
"""

from __future__ import annotations

import time
from datetime import datetime, timezone

from specgen.serve.apis.chat_stream import specgen_stats
from specgen.serve.apis.ollama import arguments, duration_ns
from specgen.serve.generation.turn import Done, Event, Piece, generated
from specgen.serve.prompting import Parts
from specgen.serve.schema import ApiError


def now_iso() -> str:
    """Ollama's `created_at`: RFC 3339 in UTC."""
    return datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")


class OllamaBuilder:
    """An `/api/chat` (`chat=True`) or `/api/generate` answer, whole or as NDJSON lines."""

    ndjson = True  # the stream is one JSON object a line, not server-sent events

    def __init__(self, model: str, chat: bool, arrived: float, prompt_ids: list[int] | None = None,
                 load_s: float = 0.0):
        self.model, self.chat, self.arrived, self.load_s = model, chat, arrived, load_s
        self.prompt_ids = prompt_ids  # /api/generate: its final line's `context` starts with them
        self.content, self.thinking, self.calls = "", "", []
        self.done: Done | None = None

    @property
    def label(self) -> str:
        return f"ollama {'chat' if self.chat else 'generate'}"

    def opening(self) -> list[Event]:
        return []

    def feed(self, piece: Piece) -> list[Event]:
        if isinstance(piece, Parts):
            self.content += piece.content
            self.thinking += piece.reasoning
            calls = [_call(c) for c in piece.tool_calls]
            self.calls += calls
            return [(None, self._line(piece.content, piece.reasoning, calls))]
        if not isinstance(piece, Done):
            return []  # Started
        self.done = piece
        return [(None, {**self._line("", "", []), **self._final()})]

    def failed(self, error: ApiError) -> list[Event]:
        return [(None, {"error": error.message})]

    def whole(self) -> dict:
        return {**self._line(self.content, self.thinking, self.calls), **self._final()}

    def _line(self, text: str, thinking: str, calls: list[dict]) -> dict:
        line = {"model": self.model, "created_at": now_iso()}
        if self.chat:
            message = {"role": "assistant", "content": text}
            if thinking:
                message["thinking"] = thinking
            if calls:
                message["tool_calls"] = calls
            line["message"] = message
        else:
            line["response"] = text
            if thinking:
                line["thinking"] = thinking
        return {**line, "done": False}

    def _final(self) -> dict:
        stats = self.done.stats
        final = {"done": True, "done_reason": "length" if self.done.finish == "length" else "stop",
                 "total_duration": duration_ns(time.perf_counter() - self.arrived),
                 "load_duration": duration_ns(self.load_s), "prompt_eval_count": stats.prompt_tokens,
                 "prompt_eval_duration": duration_ns(stats.prefill_s), "eval_count": generated(stats),
                 "eval_duration": duration_ns(stats.decode_s), "specgen": specgen_stats(stats)}
        if self.prompt_ids is not None:
            final["context"] = list(self.prompt_ids) + list(stats.output_ids)
        return final


def _call(call: dict) -> dict:
    """An OpenAI-shaped tool call as Ollama returns it: arguments an object."""
    return {"id": call["id"], "function": {"index": call["index"], "name": call["function"]["name"],
                                           "arguments": arguments(call)}}
