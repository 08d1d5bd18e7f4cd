"""OpenAI's chat and text completion shapes for one answer: its chunks as it streams, its body.

`ChatBuilder` is generation/turn.py's Builder for `/v1/chat/completions` and `/v1/completions`: the chunk
that opens a stream, one chunk per piece of text, reasoning or finished tool calls, the chunk with
the finish reason (and specgen's statistics), the usage chunk when asked for, `[DONE]`; and the
plain body, which holds what those chunks held. `usage` and `specgen_stats` are the counts every
API reports its own way; `timings` is llama.cpp's server's record of them, which its clients read.
"""

from __future__ import annotations

import time
import uuid

from specgen.serve.generation.turn import Done, Event, Piece, generated
from specgen.serve.prompting import Parts
from specgen.serve.schema import ApiError


def usage(stats) -> dict:
    """OpenAI's usage object of a finished generation."""
    prompt, completion = stats.prompt_tokens, generated(stats)
    accepted, rejected = stats.prediction_in_output
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": stats.cached_tokens},
            "completion_tokens_details": {"accepted_prediction_tokens": accepted,
                                          "rejected_prediction_tokens": rejected, "reasoning_tokens": 0}}


def specgen_stats(stats) -> dict:
    """What speculation did for a generation (the `specgen` field of every API's answer)."""
    c = stats.counts
    return {"steps": c.steps, "drafted": c.drafted, "accepted": c.accepted,
            "tokens_per_step": round(c.tokens_per_step, 4), "decode_tps": round(stats.decode_tps, 3),
            "prompt_tps": round(stats.prompt_tps, 3), "speculation": str(stats.speculation)}


def timings(stats) -> dict:
    """llama.cpp's per-response `timings` (its server's names), speculation's counts included."""
    generated_n = generated(stats)
    return {"cache_n": stats.cached_tokens, "prompt_n": stats.prompt_tokens - stats.cached_tokens,
            "prompt_ms": round(stats.prefill_s * 1000, 3), "prompt_per_second": round(stats.prompt_tps, 3),
            "predicted_n": generated_n, "predicted_ms": round(stats.decode_s * 1000, 3),
            "predicted_per_second": round(stats.decode_tps, 3), "draft_n": stats.counts.drafted,
            "draft_n_accepted": stats.counts.accepted}


class ChatBuilder:
    """A chat completion (`chat=True`) or a text completion, whole or as chunks."""

    def __init__(self, model: str, chat: bool, include_usage: bool = False):
        self.chat, self.model, self.include_usage = chat, model, include_usage
        self.kind = "chat.completion" if chat else "text_completion"
        self.id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.content, self.reasoning, self.calls = "", "", []
        self.done: Done | None = None

    @property
    def label(self) -> str:
        return f"{self.kind} {self.id[-8:]}"

    def head(self, chunk: bool) -> dict:
        kind = self.kind + (".chunk" if chunk and self.chat else "")
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}

    def opening(self) -> list[Event]:
        return [(None, self._chunk(first=True))]

    def feed(self, piece: Piece) -> list[Event]:
        if isinstance(piece, Parts):
            self.content += piece.content
            self.reasoning += piece.reasoning
            self.calls.extend(piece.tool_calls)
            return [(None, self._chunk(*piece))]
        if not isinstance(piece, Done):
            return []  # Started: a chat stream has opened already
        self.done = piece
        final = self._chunk(finish=piece.finish)
        final["specgen"], final["timings"] = specgen_stats(piece.stats), timings(piece.stats)
        events = [(None, final)]
        if self.include_usage:
            events.append((None, {**self.head(True), "choices": [], "usage": usage(piece.stats)}))
        return events + [(None, "[DONE]")]

    def failed(self, error: ApiError) -> list[Event]:
        return [(None, error.body())]

    def _chunk(self, content: str = "", reasoning: str = "", tool_calls=(), finish: str | None = None,
               first: bool = False) -> dict:
        if self.chat:
            delta = {"role": "assistant", "content": ""} if first else {}
            delta.update({k: v for k, v in (("content", content), ("reasoning", reasoning)) if v})
            if tool_calls:
                delta["tool_calls"] = list(tool_calls)
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": content, "logprobs": None, "finish_reason": finish}
        return {**self.head(True), "choices": [choice]}

    def whole(self) -> dict:
        stats, finish = self.done.stats, self.done.finish
        if self.chat:
            message = {"role": "assistant", "content": self.content or (None if self.calls else "")}
            if self.reasoning:
                message["reasoning"] = self.reasoning
            if self.calls:
                message["tool_calls"] = [{k: v for k, v in c.items() if k != "index"} for c in self.calls]
            choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": self.content, "logprobs": None, "finish_reason": finish}
        return {**self.head(False), "choices": [choice], "usage": usage(stats), "specgen": specgen_stats(stats),
                "timings": timings(stats)}
