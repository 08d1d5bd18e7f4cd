"""Which waiting prompts a batch step prefills, and how far: up to one chunk's worth of tokens, a
piece of a long prompt or several whole short ones, each on a cache of its own, each first taking
what another row computed for the same first tokens (share.py). batch.py calls it between decode
passes and joins the rows it hands back."""

from __future__ import annotations

import time

import mlx.core as mx
from mlx_lm.generate_utils import BatchCounters

from specgen.engine.batch.cache import RaggedBatch
from specgen.engine.batch.row import Row
from specgen.engine.batch.share import Sharing
from specgen.engine.decode.eager import Stopped, stoppable


def prefill(model, waiting: list[Row], active: list[Row], room: int, chunk: int, *, sharing: Sharing,
            cache: RaggedBatch, counters: BatchCounters) -> list[Row]:
    """Prefill up to `chunk` tokens of `waiting` rows, at most `room` of them joining: the rows whose
    prompt is done (but its last token), in the order they finished, taken out of `waiting`. A long
    prompt is cut where it would be alone, so its cache holds what a single run's would; a row its
    caller drops during its prefill (`Sequence.cancelled`) leaves `waiting`, its cache with it."""
    for r in waiting:
        r.waited += 1
    budget, joined = chunk, []
    while waiting and len(joined) < room:
        # The prompt with the least left goes first, so a short request is not stuck behind a
        # long one, each step waited counting as a chunk done, so a long one is not starved by a
        # stream of short ones.
        row = min(waiting, key=lambda r: len(r.seq.prompt) - r.prefilled - r.waited * chunk)
        sharing.catch_up(row, waiting, [*active, *joined], cache)
        left = len(row.seq.prompt) - 1 - row.prefilled
        if budget < chunk and left > budget:
            break
        if left:
            n = min(left, budget)
            start = time.perf_counter()
            piece = row.seq.prompt[row.prefilled : row.prefilled + n]
            try:
                with stoppable(row.cache, row.seq.cancelled, n):
                    model(mx.array([piece], mx.uint32), cache=row.cache)
                    mx.eval([c.state for c in row.cache])
            except Stopped:
                waiting.remove(row)
                break
            counters.prompt_time += time.perf_counter() - start
            counters.prompt_tokens += n
            row.prefilled += n
            budget -= n
            if row.prefilled < len(row.seq.prompt) - 1:
                sharing.advanced(row, waiting)
        if row.prefilled < len(row.seq.prompt) - 1:
            break
        waiting.remove(row)
        joined.append(row)
    return joined
