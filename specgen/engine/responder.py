"""From a generation's events to what a caller reads: one `Response` per token (mlx-lm's
GenerationResponse, with specgen's running stats), detokenized, through the stop strings.

`Responder` takes the events of one sequence as they come (decode.generate's, or one row's of a
batch: the same records), so the single-sequence and the batched paths hand out the same
responses.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
from mlx_lm.generate import GenerationResponse

from specgen.engine.stops import StopText
from specgen.events import Prefilled, Step
from specgen.stats import RunStats


@dataclass
class Response(GenerationResponse):
    """One generated token, as mlx-lm's stream_generate yields it (`logprobs` is None: the verify
    pass does not keep them), plus specgen's running statistics of the generation (`stats`;
    complete on the response with a finish_reason)."""

    stats: RunStats | None = None


class Responder:
    """One sequence's events in, its responses out; `stopped` once a stop string ended the text
    (the caller then stops generating)."""

    def __init__(self, tokenizer, stops, stats: RunStats, drafter=None):
        self.detok, self.text, self.stats, self.drafter = tokenizer.detokenizer, StopText(stops), stats, drafter
        self.given = 0  # responses handed out
        self.stopped = False

    def take(self, event: Prefilled | Step) -> list[Response]:
        """The responses of one event (none for Prefilled), recorded in the stats."""
        stats = self.stats
        stats.observe(event)
        if isinstance(event, Prefilled):
            return []
        counted = getattr(self.drafter, "prediction_counts", None)
        if counted is not None:
            stats.prediction_drafted, stats.prediction_accepted = counted
        # As in mlx-lm: a stop token gets a response of its own, after every token before it;
        # otherwise the last token carries the finish reason.
        out = []
        by_token = event.stop_token is not None
        last = len(event.tokens) - 1 if event.stop_reason and not by_token else -1
        for i, token in enumerate(event.tokens):
            self.detok.add_token(token)
            if i == last:
                self.detok.finalize()
            segment, stopped = self.text.add(self.detok.last_segment)
            if stopped:
                stats.stop_reason, stats.stop_string = "stop", self.text.matched
            finish = stats.finish_reason if stopped or i == last else None
            out.append(self._made(token, segment + (self.text.flush() if finish else ""), i < event.accepted,
                                  finish))
            if stopped:
                self.stopped = True
                return out
        if by_token:
            stats.stop_token = event.stop_token
            self.detok.finalize()
            segment, _ = self.text.add(self.detok.last_segment)
            out.append(self._made(event.stop_token, segment + self.text.flush(), False, "stop"))
        return out

    def _made(self, token, segment, drafted, finish=None) -> Response:
        s = self.stats
        self.given += 1
        return Response(segment, token, None, drafted, s.prompt_tokens, s.prompt_tps, self.given,
                        s.decode_tps, mx.get_peak_memory() / 1e9, finish, s)
