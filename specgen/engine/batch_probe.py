"""Whether a model's state layers can share a batch step with rows that feed fewer positions:
mlx-lm's batched state layers skip a row's padding by the lengths its cache gives (ArraysCache's
`lengths`), but some models' layers (Mamba 1's, for one) read every position fed. A probe of two
rows of different widths, checked against the same tokens fed alone and with the padding fed
too, tells them apart (in any precision: it asks which the batched state is nearer)."""

from __future__ import annotations

import mlx.core as mx
from mlx_lm.models.cache import ArraysCache, make_prompt_cache

from specgen.engine.batch_cache import RaggedBatch

PROMPTS = ([3, 4, 5, 6], [8, 9, 10, 11])  # row 0 feeds its last token, row 1 three: row 0 is padded


def padding_unsupported(model) -> str | None:
    """Why this model's state layers cannot run rows of different widths in one pass, or None
    (also where it has no state layers). The padded row's states are compared with the same
    tokens fed alone and with the padding fed too: nearer the second, the layers read padding
    (by distance, not a fixed tolerance: batched and single-sequence passes differ in the last
    bits, more in low precision)."""
    if not any(type(c) is ArraysCache for c in make_prompt_cache(model)):
        return None
    head, last = PROMPTS[0][:-1], PROMPTS[0][-1]
    try:
        alone, padded = _fed(model, [head, [last]]), _fed(model, [head, [last, 0, 0]])
        caches = [_fed(model, [head]), _fed(model, [PROMPTS[1][:1]])]
        batch = RaggedBatch(len(caches[0]))
        batch.add(caches, [3, 1])
        batch.begin([1, 3])
        model(mx.array([[last, 0, 0], PROMPTS[1][1:]], mx.uint32), cache=batch.layers)
        batch.commit(3, [1, 3])
        together = batch.row_cache(0, 4)
    except Exception as e:  # noqa: BLE001 - any failure means: not this way
        return f"its state layers do not take per-row lengths ({type(e).__name__}: {e})"
    if _distance(together, padded) <= _distance(together, alone):
        return "its state layers read the padding of a row that feeds fewer positions"
    return None


def _fed(model, pieces: list[list[int]]) -> list:
    """A fresh cache after feeding each piece of tokens as one pass."""
    cache = make_prompt_cache(model)
    for piece in pieces:
        model(mx.array([piece], mx.uint32), cache=cache)
    return cache


def _distance(a: list, b: list) -> float:
    """How far apart two caches' states are (the largest difference, summed over state arrays)."""
    return sum(float(mx.abs(x.astype(mx.float32) - y.astype(mx.float32)).max())
               for ca, cb in zip(a, b) if type(ca) is ArraysCache
               for x, y in zip(ca.cache, cb.cache) if x is not None and y is not None)
