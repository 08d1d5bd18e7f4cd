"""A ragged batch KV cache: many sequences in one buffer, each with its own end, nothing moved
per step.

Every row writes a step's T positions at the same buffer slots (one slice write per layer, as
mlx-lm's caches do); `Slots`, shared by all layers, says which slots each row holds. A row's
rejected drafts and its padding (rows feed fewer positions than the step's widest) stay in the
buffer but are masked out forever, and each row's RoPE offset is its own logical length, so a
rejected slot leaves no gap in positions: the next token sits right after the last kept one.
The attention mask of a step is (rows, 1, T, slots): slot held by that row AND causal by buffer
index. Holes are squeezed out (`compact`) once they make the buffer much longer than the longest
row; rows join with a prefilled single-sequence cache (right-aligned, left slots invalid) and
leave by `keep`.

Only plain KVCache layers batch this way (`unbatchable` says why a model's cache does not).
"""

from __future__ import annotations

from typing import Sequence

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import KVCache

GROW = 256  # slots added at a time, as mlx-lm's KVCache grows
HOLES = 0.5  # compact when the buffer is this much longer than the longest row (and GROW more)


def unbatchable(cache: Sequence) -> str | None:
    """Why a model's fresh cache (make_prompt_cache) cannot join a ragged batch, or None."""
    kinds = sorted({type(c).__name__ for c in cache if type(c) is not KVCache})
    return f"its cache layers ({', '.join(kinds)}) do not batch by per-row ends" if kinds else None


class Slots:
    """Which buffer slots each row holds, each row's length, and the current step's mask."""

    def __init__(self):
        self.held = np.zeros((0, 0), dtype=bool)  # (rows, end): slot holds an entry of that row
        self.lengths: list[int] = []  # entries each row holds (its next RoPE position)
        self.offset = mx.zeros((0,), mx.int32)
        self.mask: mx.array | None = None

    @property
    def end(self) -> int:
        return self.held.shape[1]

    def begin(self, widths: Sequence[int]) -> None:
        """Before a pass feeding `widths[i]` real positions of row i (the rest is padding)."""
        width = max(widths)
        new = np.arange(width)[None, :] < np.asarray(widths)[:, None]  # (rows, T)
        causal = np.arange(width)[:, None] >= np.arange(width)[None, :]  # (T, T)
        old = np.broadcast_to(self.held[:, None, :], (len(widths), width, self.end))
        mask = np.concatenate([old, new[:, None, :] & causal[None]], axis=2)
        self.mask = mx.array(mask[:, None])
        self.offset = mx.array(self.lengths, mx.int32)

    def commit(self, width: int, kept: Sequence[int]) -> None:
        """After a pass of `width` positions: row i keeps its first `kept[i]` fed positions."""
        new = np.arange(width)[None, :] < np.asarray(kept)[:, None]
        self.held = np.concatenate([self.held, new], axis=1)
        self.lengths = [n + k for n, k in zip(self.lengths, kept)]
        self.mask = None


class RaggedKVCache:
    """One attention layer's keys and values for every row; positions and masks from `slots`."""

    def __init__(self, slots: Slots):
        self.slots = slots
        self.keys = self.values = None

    @property
    def offset(self) -> mx.array:
        return self.slots.offset

    def update_and_fetch(self, keys, values):
        start, width = self.slots.end, keys.shape[2]
        if self.keys is None or start + width > self.keys.shape[2]:
            grow = -(-(start + width - (0 if self.keys is None else self.keys.shape[2])) // GROW) * GROW
            self.keys = _extend(self.keys, keys, grow)
            self.values = _extend(self.values, values, grow)
        self.keys[..., start : start + width, :] = keys
        self.values[..., start : start + width, :] = values
        return self.keys[..., : start + width, :], self.values[..., : start + width, :]

    def make_mask(self, n: int, return_array: bool = False, window_size=None):
        return self.slots.mask

    def is_trimmable(self) -> bool:
        return False  # rows end where `slots` says; trimming all rows at once would be wrong

    @property
    def state(self):
        return self.keys, self.values


def _extend(buf, like, grow: int):
    shape = (like.shape[0], like.shape[1], grow, like.shape[3])
    more = mx.zeros(shape, like.dtype)
    return more if buf is None else mx.concatenate([buf, more], axis=2)


class RaggedBatch:
    """The ragged cache of a whole model: one RaggedKVCache per layer over shared Slots."""

    def __init__(self, layers: int):
        self.slots = Slots()
        self.layers = [RaggedKVCache(self.slots) for _ in range(layers)]

    @property
    def rows(self) -> int:
        return len(self.slots.lengths)

    def add(self, cache: Sequence[KVCache]) -> None:
        """Append a row holding what a single-sequence cache holds (its entries right-aligned)."""
        n = cache[0].offset
        end = max(self.slots.end, n)
        if end > self.slots.end:  # the buffer grows on the left: old rows gain invalid slots
            self._shift(end - self.slots.end)
        for mine, theirs in zip(self.layers, cache):
            for name in ("keys", "values"):
                buf, entries = getattr(mine, name), getattr(theirs, name)
                if entries is None and buf is None:
                    continue  # no row holds anything yet: the first update makes the buffer
                like = entries if entries is not None else buf
                if buf is None:  # earlier rows held nothing yet
                    buf = mx.zeros((self.rows, like.shape[1], end, like.shape[3]), like.dtype)
                if entries is None:
                    row = mx.zeros((1, *buf.shape[1:]), buf.dtype)
                else:
                    row = mx.pad(entries[..., :n, :], [(0, 0), (0, 0), (end - n, buf.shape[2] - end), (0, 0)])
                setattr(mine, name, mx.concatenate([buf, row.astype(buf.dtype)], axis=0))
        held = np.zeros((1, end), dtype=bool)
        held[0, end - n:] = True
        self.slots.held = np.concatenate([self.slots.held, held], axis=0)
        self.slots.lengths.append(n)

    def _shift(self, by: int) -> None:
        for c in self.layers:
            if c.keys is not None:
                pad = [(0, 0), (0, 0), (by, 0), (0, 0)]
                c.keys, c.values = mx.pad(c.keys, pad), mx.pad(c.values, pad)
        self.slots.held = np.pad(self.slots.held, [(0, 0), (by, 0)])

    def keep(self, rows: Sequence[int]) -> None:
        """Keep only these rows (in this order); slots no row holds any more are dropped."""
        idx = mx.array(list(rows), mx.int32)
        held = self.slots.held[list(rows)]
        self.slots.lengths = [self.slots.lengths[i] for i in rows]
        used = held.any(axis=0)
        first = int(np.argmax(used)) if used.any() else held.shape[1]
        self.slots.held = held[:, first:]
        for c in self.layers:
            if c.keys is not None:
                c.keys, c.values = c.keys[idx][..., first:, :], c.values[idx][..., first:, :]
        if not rows:
            for c in self.layers:
                c.keys = c.values = None

    def holey(self) -> bool:
        """Whether holes make the buffer much longer than the longest row (see `compact`)."""
        longest = max(self.slots.lengths, default=0)
        return self.slots.end > longest * (1 + HOLES) + GROW

    def compact(self) -> None:
        """Move every row's entries to the end of a buffer as long as the longest row (a copy)."""
        held, longest = self.slots.held, max(self.slots.lengths)
        order = np.zeros((len(held), longest), dtype=np.int32)
        for i, n in enumerate(self.slots.lengths):
            order[i, longest - n:] = np.flatnonzero(held[i])
        gather = mx.array(order)[:, None, :, None]
        for c in self.layers:
            end = self.slots.end
            c.keys = mx.take_along_axis(c.keys[..., :end, :], gather, axis=2)
            c.values = mx.take_along_axis(c.values[..., :end, :], gather, axis=2)
        self.slots.held = np.arange(longest)[None, :] >= (longest - np.asarray(self.slots.lengths))[:, None]

    def row_cache(self, row: int, count: int) -> list[KVCache]:
        """A single-sequence cache holding the first `count` entries of row `row` (a copy)."""
        where = np.flatnonzero(self.slots.held[row])[:count]
        idx = mx.array(where.astype(np.int32))
        out = []
        for c in self.layers:
            kv = KVCache()
            if len(where):
                kv.keys = mx.contiguous(c.keys[row : row + 1][..., idx, :])
                kv.values = mx.contiguous(c.values[row : row + 1][..., idx, :])
                kv.offset = len(where)
            out.append(kv)
        return out
