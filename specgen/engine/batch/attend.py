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
row on one shelf and attends over all of it, masked, as before. A pass fed flat (slots.py's
`Flat`) attends in the padded layout: the wrapper spreads its queries there and gathers the
outputs back (kv.py spreads the keys and values it stores)."""

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
    their shelf (kv.py), with `width` queries a row (a flat pass: the most its rows feed)."""

    start: int
    stop: int
    first: int
    shelf: int = 0
    width: int = 1


def runs(firsts: np.ndarray, keys: int, group: int = GROUP, widths=None) -> list[Run]:
    """The runs of rows that attend over the fewest query-slots, each run beyond the first counted
    as `group` more: rows whose oldest slot is `firsts[i]` (the pass's first one where a row holds
    none) in a pass over `keys` slots, each with `widths[i]` queries (one each by default; a run
    pads its rows' queries to its widest, where the pass is fed flat)."""
    n, first = len(firsts), [int(x) for x in firsts]
    queries = [1] * n if widths is None else [int(x) for x in widths]
    oldest, wide = min([*first, keys - 1]), max([*queries, 1])
    # A single run from the oldest slot any row holds, unless cutting could save more than a call
    # (checked in Python: a step asks this each time, and a few rows' numpy calls cost more).
    if n * wide * (keys - oldest) - sum(q * (keys - f) for q, f in zip(queries, first)) <= group:
        return [Run(0, n, oldest, 0, wide)]
    f, w = np.asarray(first, dtype=np.int64), np.asarray(queries, dtype=np.int64)
    best, cut = np.zeros(n + 1), np.zeros(n + 1, dtype=np.int64)
    for j in range(1, n + 1):
        reach = np.minimum.accumulate(f[:j][::-1])[::-1]  # reach[i]: the oldest slot of rows i..j-1
        most = np.maximum.accumulate(w[:j][::-1])[::-1]  # most[i]: the widest of rows i..j-1
        cost = best[:j] + (j - np.arange(j)) * most * (keys - reach) + group
        cut[j] = int(np.argmin(cost))
        best[j] = cost[cut[j]]
    out, j = [], n
    while j:
        i = int(cut[j])
        out.append(Run(i, j, int(f[i:j].min()), 0, int(w[i:j].max())))
        j = i
    return out[::-1]


def padded(x: mx.array, part) -> mx.array:
    """A flat pass's (tokens, heads, 1, dims) as `part`'s (rows, heads, width, dims) (a `Flat`,
    slots.py, or one of its runs' parts)."""
    rows = part.spread.size // part.width
    return x[:, :, 0][part.spread].reshape(rows, part.width, x.shape[1], x.shape[3]).transpose(0, 2, 1, 3)


def unpadded(x: mx.array, part) -> mx.array:
    """`part`'s (rows, heads, width, dims) as a flat pass's (tokens, heads, dims)."""
    return x.transpose(0, 2, 1, 3).reshape(-1, x.shape[1], x.shape[3])[part.take]


def _by_runs(queries, keys, values, cache, scale, mask, sinks=None):
    """mlx-lm's attention, by `cache.runs` where a ragged layer has them (each run over the
    slots of its shelf that its rows hold), in the padded layout where the pass is fed flat."""
    if not hasattr(cache, "attended"):  # not a ragged layer
        return base.scaled_dot_product_attention(queries, keys, values, cache=cache, scale=scale,
                                                 mask=mask, sinks=sinks)
    cache.attended = True
    plan, flat = cache.runs, cache.slots.flat
    if flat is None and (not plan or (len(plan) == 1 and plan[0].first == 0 and len(cache.buffers) == 1)):
        return base.scaled_dot_product_attention(queries, keys, values, cache=cache, scale=scale,
                                                 mask=mask, sinks=sinks)
    if not isinstance(mask, mx.array) or (plan and (mask.shape[-1] != cache.fetched
                                                    or mask.shape[0] not in (1, len(cache.slots.lengths)))):
        raise ValueError("a ragged layer's attention needs its batch's mask")
    if flat is None:
        out = [_run(queries[r.start : r.stop], keys, values, cache, scale, mask, sinks, r) for r in plan]
        return out[0] if len(out) == 1 else mx.concatenate(out, axis=0)
    if not plan:  # a window: every row's queries padded to the widest
        out = base.scaled_dot_product_attention(padded(queries, flat.whole), keys, values, cache=cache,
                                                scale=scale, mask=mask, sinks=sinks)
        return unpadded(out, flat.whole)[:, :, None]
    # Each run's queries padded to its own widest (slots.py cuts runs by widths too).
    out = [unpadded(_run(padded(queries, part), keys, values, cache, scale, mask, sinks, r), part)
           for r, part in zip(plan, flat.parts) if part.take.size]
    return (out[0] if len(out) == 1 else mx.concatenate(out, axis=0))[:, :, None]


def _run(queries, keys, values, cache, scale, mask, sinks, r: Run):
    """Run `r`'s attention: its `queries` over the keys and values of its shelf from its first
    slot (those the layer handed in where one shelf holds every row)."""
    m = mask if mask.shape[0] == 1 else mask[r.start : r.stop]
    if len(cache.buffers) == 1:  # the keys and values handed in, as the layer made them
        at = r.first - cache.bases[0]
        k, v = keys[r.start : r.stop, :, at:], values[r.start : r.stop, :, at:]
    else:
        k, v = cache.view(r)
    return base.scaled_dot_product_attention(queries, k, v, cache=None, scale=scale,
                                             mask=m[..., : queries.shape[2], r.first :], sinks=sinks)


def install(model) -> None:
    """Make the attention of `model`'s layers attend by runs (once per mlx-lm model module): its
    modules' `scaled_dot_product_attention` becomes one that does so for ragged layers only."""
    layers = [layer for layer in getattr(model, "layers", []) if isinstance(layer, nn.Module)]
    for m in (m for layer in layers for m in layer.modules()):
        module = sys.modules.get(type(m).__module__)
        if getattr(module, "scaled_dot_product_attention", None) is base.scaled_dot_product_attention:
            module.scaled_dot_product_attention = _by_runs
