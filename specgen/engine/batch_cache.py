"""A ragged batch KV cache: many sequences in one buffer, each with its own end, nothing moved
per step.

Every row writes a step's T positions at the same buffer slots (one slice write per layer, as
mlx-lm's caches do); `Slots`, shared by all layers, says which slots each row holds. A row's
rejected drafts and its padding (rows feed fewer positions than the step's widest) stay in the
buffer but are masked out forever, and each row's RoPE offset is its own logical length, so a
rejected slot leaves no gap in positions: the next token sits right after the last kept one.
The attention mask of a step is (rows, 1, T, slots): slot held by that row AND causal by buffer
index. Sequences join with a prefilled single-sequence cache (right-aligned, left slots invalid),
into a row another one freed by leaving (`drop`) or a new one. Holes and free rows are squeezed
out (`compact`) once they make the buffer much larger than what its rows hold.

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


def _aligned(entries, n: int, end: int, size: int, like):
    """A row of `size` slots holding the first `n` of `entries` right-aligned at slot `end`."""
    if entries is None:
        return mx.zeros((1, *like.shape[1:]), like.dtype)
    return mx.pad(entries[..., :n, :], [(0, 0), (0, 0), (end - n, size - end), (0, 0)]).astype(like.dtype)


def _extend(buf, like, grow: int):
    shape = (like.shape[0], like.shape[1], grow, like.shape[3])
    more = mx.zeros(shape, like.dtype)
    return more if buf is None else mx.concatenate([buf, more], axis=2)


class RaggedBatch:
    """The ragged cache of a whole model: one RaggedKVCache per layer over shared Slots.

    A sequence that leaves frees its row (nothing is moved); a free row holds nothing and is fed
    padding until a joining sequence takes it, or until `compact` drops it. Copying every row's
    entries whenever one row left cost ~0.1-0.9 s a time at 16 rows of a few hundred slots on the
    CPU, on every one of a round's leaves; a padded row costs a few ms a step."""

    def __init__(self, layers: int):
        self.slots = Slots()
        self.layers = [RaggedKVCache(self.slots) for _ in range(layers)]
        self.free: list[int] = []  # rows no sequence holds, lowest first

    @property
    def rows(self) -> int:
        """Rows of the buffer, free ones included (every pass feeds them all)."""
        return len(self.slots.lengths)

    def add(self, caches: Sequence[Sequence[KVCache]]) -> list[int]:
        """Hold what each single-sequence cache holds (its entries right-aligned), in a free row
        (written in place) or, past those, in rows appended together (one copy): their rows."""
        counts = [cache[0].offset for cache in caches]
        end = max(self.slots.end, *counts)
        if end > self.slots.end:  # the buffer grows on the left: old rows gain invalid slots
            self._shift(end - self.slots.end)
        reused, self.free = self.free[: len(caches)], self.free[len(caches):]
        places = reused + list(range(self.rows, self.rows + len(caches) - len(reused)))
        appended = list(range(len(reused), len(caches)))
        for k, mine in enumerate(self.layers):
            for name in ("keys", "values"):
                buf, entries = getattr(mine, name), [getattr(cache[k], name) for cache in caches]
                like = buf if buf is not None else next((e for e in entries if e is not None), None)
                if like is None:
                    continue  # no row holds anything yet: the first update makes the buffer
                if buf is None:  # earlier rows held nothing yet
                    buf = mx.zeros((self.rows, like.shape[1], end, like.shape[3]), like.dtype)
                size = buf.shape[2]
                if appended:
                    buf = mx.concatenate([buf, *(_aligned(entries[i], counts[i], end, size, buf)
                                                 for i in appended)], axis=0)
                for i, row in enumerate(reused):
                    n = counts[i]
                    if n:
                        buf[row : row + 1, :, end - n : end, :] = entries[i][..., :n, :].astype(buf.dtype)
                setattr(mine, name, buf)
        more = np.zeros((len(appended), end), dtype=bool)
        self.slots.held = np.concatenate([self.slots.held, more], axis=0)
        self.slots.lengths += [0] * len(appended)
        for row, n in zip(places, counts):
            self.slots.held[row] = False
            self.slots.held[row, end - n:] = True
            self.slots.lengths[row] = n
        return places

    def _shift(self, by: int) -> None:
        for c in self.layers:
            if c.keys is not None:
                pad = [(0, 0), (0, 0), (by, 0), (0, 0)]
                c.keys, c.values = mx.pad(c.keys, pad), mx.pad(c.values, pad)
        self.slots.held = np.pad(self.slots.held, [(0, 0), (by, 0)])

    def drop(self, rows: Sequence[int]) -> None:
        """Free these rows (nothing is moved); with none held any more, the buffer is emptied."""
        for i in rows:
            self.slots.held[i] = False
            self.slots.lengths[i] = 0
        self.free = sorted({*self.free, *rows})
        if len(self.free) == self.rows:
            self.slots.held = np.zeros((0, 0), dtype=bool)
            self.slots.lengths, self.free = [], []
            for c in self.layers:
                c.keys = c.values = None

    def untidy(self, joining: bool) -> bool:
        """Whether the buffer is worth copying smaller (`compact`): free rows are half of it or
        more (and no sequence is about to take them), or empty slots make it much longer than
        its longest row."""
        longest = max(self.slots.lengths, default=0)
        free = not joining and 2 * len(self.free) >= self.rows > 0
        return free or self.slots.end > longest * (1 + HOLES) + GROW

    def compact(self) -> list[int]:
        """Drop the free rows and move every row's entries to the end of a buffer as long as the
        longest row (a copy). Returns the rows kept, by their old numbers, in their new order."""
        free = set(self.free)
        kept = [i for i in range(self.rows) if i not in free]
        held = self.slots.held[kept]
        lengths = [self.slots.lengths[i] for i in kept]
        longest = max(lengths)
        order = np.zeros((len(kept), longest), dtype=np.int32)
        for j, n in enumerate(lengths):
            order[j, longest - n:] = np.flatnonzero(held[j])
        gather = mx.array(order)[:, None, :, None]
        rows = mx.array(kept, mx.int32) if self.free else None
        for c in self.layers:
            if c.keys is None:
                continue
            end = self.slots.end
            keys, values = (c.keys, c.values) if rows is None else (c.keys[rows], c.values[rows])
            c.keys = mx.take_along_axis(keys[..., :end, :], gather, axis=2)
            c.values = mx.take_along_axis(values[..., :end, :], gather, axis=2)
        self.slots.held = np.arange(longest)[None, :] >= (longest - np.asarray(lengths))[:, None]
        self.slots.lengths, self.free = lengths, []
        return kept

    def row_cache(self, row: int, count: int) -> list[KVCache]:
        """A single-sequence cache holding the first `count` entries of row `row` (a copy, made
        now: a lazy one would keep the whole buffer alive, and force the next step's writes to
        copy it, ~0.6 s a leave at 16 rows on the CPU)."""
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
        mx.eval([kv.state for kv in out if kv.keys is not None])
        return out
