"""Attention over a ragged batch by runs of rows (cache.py): each run attends over the slots from
the first one its rows hold, not over the whole buffer, so a short conversation batched with a
long one does not read the long one's span (a pass's attention reads every key it is given,
masked or not).

`runs` cuts the rows into runs of neighbouring places (views of a buffer, no copies) wherever
the row-slots a cut skips outweigh one more attention call (`GROUP`); the same rule decides where
rows are kept on a shelf of their own (kv.py). mlx-lm's attention layers call
`scaled_dot_product_attention` from their own module; `install` wraps that name, and the wrapper
does what it did for every cache but a ragged attention layer with runs, which it reads shelf by
shelf. A model whose layers call MLX's attention directly (`attended` stays False) keeps every
row on one shelf and attends over all of it, masked, as before."""

from __future__ import annotations

import sys
from typing import NamedTuple

import mlx.core as mx
import numpy as np
from mlx import nn
from mlx_lm.models import base

GROUP = 2048  # row-slots one more attention call must save (docs/design.md, "Attention by runs")


class Run(NamedTuple):
    """Rows `start` to `stop` (places) attend over the slots from `first` on, of the buffer of
    their shelf (kv.py)."""

    start: int
    stop: int
    first: int
    shelf: int = 0


def runs(firsts: np.ndarray, keys: int, group: int = GROUP) -> list[Run]:
    """The runs of rows that attend over the fewest row-slots, each run beyond the first counted
    as `group` more: rows whose oldest slot is `firsts[i]` (the pass's first one where a row holds
    none) in a pass over `keys` slots."""
    n, f = len(firsts), np.asarray(firsts, dtype=np.int64)
    oldest = int(f.min(initial=keys - 1))
    # A single run from the oldest slot any row holds, unless cutting could save more than a call.
    if n * (keys - oldest) - int((keys - f).sum()) <= group:
        return [Run(0, n, oldest)]
    best, cut = np.zeros(n + 1), np.zeros(n + 1, dtype=np.int64)
    for j in range(1, n + 1):
        reach = np.minimum.accumulate(f[:j][::-1])[::-1]  # reach[i]: the oldest slot of rows i..j-1
        cost = best[:j] + (j - np.arange(j)) * (keys - reach) + group
        cut[j] = int(np.argmin(cost))
        best[j] = cost[cut[j]]
    out, j = [], n
    while j:
        i = int(cut[j])
        out.append(Run(i, j, int(f[i:j].min())))
        j = i
    return out[::-1]


def _by_runs(queries, keys, values, cache, scale, mask, sinks=None):
    """mlx-lm's attention, by `cache.runs` where a ragged layer has them (each run over the
    slots of its shelf that its rows hold)."""
    plan = getattr(cache, "runs", None)
    if plan is not None:
        cache.attended = True
    if not plan or (len(plan) == 1 and plan[0].first == 0 and len(cache.buffers) == 1):
        return base.scaled_dot_product_attention(queries, keys, values, cache=cache, scale=scale,
                                                 mask=mask, sinks=sinks)
    if (not isinstance(mask, mx.array) or mask.shape[-1] != cache.fetched
            or mask.shape[0] not in (1, queries.shape[0])):
        raise ValueError("a ragged layer's attention needs its batch's mask")
    out, one = [], len(cache.buffers) == 1
    for r in plan:
        m = mask[..., r.first:] if mask.shape[0] == 1 else mask[r.start : r.stop, ..., r.first:]
        if one:  # the keys and values handed in, as the layer made them of its one shelf's
            at = r.first - cache.bases[0]
            k, v = keys[r.start : r.stop, :, at:], values[r.start : r.stop, :, at:]
        else:
            k, v = cache.view(r)
        out.append(base.scaled_dot_product_attention(queries[r.start : r.stop], k, v, cache=None,
                                                     scale=scale, mask=m, sinks=sinks))
    return out[0] if len(out) == 1 else mx.concatenate(out, axis=0)


def install(model) -> None:
    """Make the attention of `model`'s layers attend by runs (once per mlx-lm model module): its
    modules' `scaled_dot_product_attention` becomes one that does so for ragged layers only."""
    layers = [layer for layer in getattr(model, "layers", []) if isinstance(layer, nn.Module)]
    for m in (m for layer in layers for m in layer.modules()):
        module = sys.modules.get(type(m).__module__)
        if getattr(module, "scaled_dot_product_attention", None) is base.scaled_dot_product_attention:
            module.scaled_dot_product_attention = _by_runs
