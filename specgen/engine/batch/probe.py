"""Whether a model can decode in a batch: the one probe the batch engine, the server and the
batch API ask, once per model.

A model batches if its cache layers batch by per-row ends (cache.unbatchable), its state
layers skip a row's padding, and its forward pass takes per-row positions and chooses as a
single-sequence pass does. mlx-lm's batched state layers skip padding by the lengths a cache
gives (ArraysCache's `lengths`), but some models' layers (Mamba 1's, for one) read every position
fed: a probe of two rows of different widths, checked against the same tokens fed alone and with
the padding fed too, tells them apart (in any precision: it asks which the batched state is
nearer). Rows may be kept on shelves of their own (kv.py) where every full-attention layer's
attention goes through attend.py's wrapper and the model chooses as alone with two rows on two
shelves, fed one position and two (a layer that reads the keys a cache returns for itself, as
multi-head latent attention does, is handed only the step's: it fails or disagrees there). A
pass may be fed flat (slots.py) where the model has no state layers, every attention layer goes
through the wrapper, and two rows fed one position and two, flat, choose as alone."""

from __future__ import annotations

import weakref
from typing import NamedTuple

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import ArraysCache, make_prompt_cache

from specgen.engine.batch.attend import install
from specgen.engine.batch.cache import RaggedBatch, unbatchable
from specgen.engine.batch.kv import RaggedKVCache
from specgen.engine.decode.rollback import Rollback

PROMPTS = ([3, 4, 5, 6], [8, 9, 10, 11])  # row 0 feeds its last token, row 1 three: row 0 is padded
AGREE = ([3, 4, 5, 6, 7], [8, 9])  # two rows of different lengths (token ids any vocabulary has)
SHELVES = ([3, 4, 5, 6, 7, 8], [9, 10, 11])  # the same, long enough to feed two positions


class Batchable(NamedTuple):
    """What the batch engine needs to know of a model before its first batch."""

    why: str | None  # why it cannot decode in a batch (None: it can)
    layers: int  # layers of its cache
    rollback: str  # how a sequence's cache is taken back (Rollback.how), as a row alone says
    shelves: bool = False  # its attention reads by runs (attend.py): rows may sit on shelves (kv.py)
    flat: bool = False  # a pass may feed each row its own positions (slots.py's Flat)


_PROBED: dict[int, tuple[weakref.ref, Batchable]] = {}  # id(model) -> (the model, its answer)


def probe(model) -> Batchable:
    """Whether and how `model` batches, probed once per model (the forward probe is six passes:
    0.17 s on a 32-layer model on the CPU, once, not per batch)."""
    ref, found = _PROBED.get(id(model), (None, None))
    if ref is None or ref() is not model:
        install(model)  # attention by runs of rows (attend.py), before the passes that ask
        cache = make_prompt_cache(model)
        why = unbatchable(cache) or padding_unsupported(model) or _disagrees(model)
        shelves = why is None and _disagrees(model, SHELVES, widths=(1, 2), shelves=True) is None
        flat = (why is None and not any(type(c) is ArraysCache for c in cache)
                and _disagrees(model, SHELVES, widths=(1, 2), shelves=shelves, flat=True) is None)
        found = Batchable(why, len(cache), Rollback(cache).how, shelves, flat)
        _PROBED[id(model)] = weakref.ref(model), found
    return found


def batch_unsupported(model) -> str | None:
    """Why `model` cannot decode in a batch (then requests run one at a time), or None."""
    return probe(model).why


def _disagrees(model, prompts=AGREE, widths=(1,), shelves: bool = False, flat: bool = False) -> str | None:
    """Why the forward pass fails on per-row positions (a model that reads the cache offset as one
    number) or chooses otherwise than alone, on two short rows fed their last tokens, as many as
    each of `widths` (on two shelves where `shelves`: then also where a full-attention layer's
    attention did not read its cache by runs; `flat`: row i fed `widths[i]` of them, flat, then
    also where an attention layer did not go through the wrapper); None where it agrees."""
    try:
        alone = [mx.argmax(model(mx.array([p], mx.uint32), cache=make_prompt_cache(model))[0, -1]).item()
                 for p in prompts]
        for feed in [list(widths)] if flat else [[w] * len(prompts) for w in widths]:
            caches = [_fed(model, [p[:-n]]) for p, n in zip(prompts, feed)]
            batch = RaggedBatch(len(caches[0]), split=shelves, group=0)
            order = np.argsort(batch.add(caches))  # the prompts by place
            batch.slots.begin([feed[i] for i in order], flat)
            pieces = [prompts[i][-feed[i]:] for i in order]
            if flat:
                x = mx.array([t for p in pieces for t in p], mx.uint32)[:, None]
                logits = model(x, cache=batch.layers)
                last = logits[mx.array(np.cumsum([len(p) for p in pieces]) - 1), -1]
            else:
                last = model(mx.array(pieces, mx.uint32), cache=batch.layers)[:, -1]
            together = [0] * len(prompts)
            for i, token in zip(order, mx.argmax(last, axis=-1).tolist()):
                together[i] = token
            if together != alone:
                return "its batched forward pass chooses otherwise than a single-sequence one"
            full = [c for c in batch.layers if isinstance(c, RaggedKVCache) and (flat or c.window is None)]
            if (shelves or flat) and not all(c.attended for c in full):
                return "its attention does not read a ragged cache by runs"
    except Exception as e:  # noqa: BLE001 - any failure means: not this way
        return f"its forward pass does not take per-row positions ({type(e).__name__}: {e})"
    return None


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
