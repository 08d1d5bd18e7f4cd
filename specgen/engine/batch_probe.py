"""Whether a model's state layers can share a batch step with rows that feed fewer positions:
mlx-lm's batched state layers skip a row's padding by the lengths its cache gives (ArraysCache's
`lengths`), but some models' layers (Mamba 1's, for one) read every position fed. A probe of two
rows of different widths, checked against the same tokens fed alone, tells them apart."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import ArraysCache, make_prompt_cache

from specgen.engine.batch_cache import RaggedBatch

PROMPTS = ([3, 4, 5, 6], [8, 9, 10, 11])  # row 0 feeds its last token, row 1 three: row 0 is padded
TOLERANCE = 1e-3  # batched and single-sequence passes may differ in the last bits, padding by far more


def padding_unsupported(model) -> str | None:
    """Why this model's state layers cannot run rows of different widths in one pass, or None
    (also where it has no state layers)."""
    if not any(type(c) is ArraysCache for c in make_prompt_cache(model)):
        return None
    try:
        alone = make_prompt_cache(model)
        model(mx.array([PROMPTS[0][:-1]], mx.uint32), cache=alone)
        model(mx.array([PROMPTS[0][-1:]], mx.uint32), cache=alone)
        caches = [make_prompt_cache(model) for _ in PROMPTS]
        model(mx.array([PROMPTS[0][:-1]], mx.uint32), cache=caches[0])
        model(mx.array([PROMPTS[1][:1]], mx.uint32), cache=caches[1])
        batch = RaggedBatch(len(caches[0]))
        batch.add(caches, [3, 1])
        batch.begin([1, 3])
        model(mx.array([[PROMPTS[0][-1], 0, 0], PROMPTS[1][1:]], mx.uint32), cache=batch.layers)
        batch.commit(3, [1, 3])
        together = batch.row_cache(0, 4)
    except Exception as e:  # noqa: BLE001 - any failure means: not this way
        return f"its state layers do not take per-row lengths ({type(e).__name__}: {e})"
    for a, b in zip(alone, together):
        if type(a) is ArraysCache and any(
                not np.allclose(np.array(x), np.array(y), rtol=TOLERANCE, atol=TOLERANCE)
                for x, y in zip(a.cache, b.cache) if x is not None):
            return "its state layers read the padding of a row that feeds fewer positions"
    return None
