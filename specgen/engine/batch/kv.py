"""One attention layer of a ragged batch (cache.py): every row's keys and values in one
buffer whose slots `Slots` (slots.py) hands out, positions and masks per row.

A sliding-window layer (`window`) is the same buffer masked to each row's window; it keeps only
the slots some row's window (and one entry more: a row copied out alone as mlx-lm's
RotatingKVCache holds a full window) can still reach: the older ones are cut off its front every
GROW slots (`base` is the slot its buffer starts at), so it holds about a window of slots, not
the whole history, and attends over no more."""

from __future__ import annotations

from typing import Sequence

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import KVCache, RotatingKVCache

from specgen.engine.batch.slots import Slots

GROW = 256  # slots added (and, by a window, cut) at a time, as mlx-lm's KVCache grows


class RaggedKVCache:
    """One attention layer's keys and values for every row; positions and masks from `slots`."""

    def __init__(self, slots: Slots, window: int | None = None):
        self.slots, self.window = slots, window
        self.keys = self.values = None
        self.base = 0  # the slot of buffer index 0 (a window cuts the ones before)

    @property
    def offset(self) -> mx.array:
        return self.slots.offset

    def update_and_fetch(self, keys, values):
        start, width = self.slots.end - self.base, keys.shape[2]
        if self.keys is None or start + width > self.keys.shape[2]:
            grow = -(-(start + width - (0 if self.keys is None else self.keys.shape[2])) // GROW) * GROW
            self.keys = _extend(self.keys, keys, grow)
            self.values = _extend(self.values, values, grow)
        self.keys[..., start : start + width, :] = keys
        self.values[..., start : start + width, :] = values
        return self.keys[..., : start + width, :], self.values[..., : start + width, :]

    @property
    def runs(self):
        """The step's runs of rows (attend.py); a window's buffer is cut to what windows reach."""
        return self.slots.runs if self.window is None else None

    def make_mask(self, n: int, return_array: bool = False, window_size=None):
        window = window_size or self.window
        return self.slots.mask if window is None else self.slots.window_mask(window, self.base)

    def is_trimmable(self) -> bool:
        return False  # rows end where `slots` says; trimming all rows at once would be wrong

    @property
    def state(self):
        return self.keys, self.values

    def join(self, entries: Sequence, places: Sequence[int], rows: int, end: int) -> None:
        """Write each joining row's (keys, values) (or None), newest at slot `end`, into its place:
        a free row in place; places from `rows` on are appended together (one copy)."""
        if self.window is not None:  # a window needs its last entries only
            entries = [None if e is None else tuple(x[..., -(self.window + 1):, :] for x in e)
                       for e in entries]
        first = min((end - e[0].shape[2] for e in entries if e is not None), default=end)
        if self.keys is None:
            self.base = first if self.window is not None else 0
        elif first < self.base:  # a window reaches back further than the buffer: widen it
            pad = [(0, 0), (0, 0), (self.base - first, 0), (0, 0)]
            self.keys, self.values, self.base = mx.pad(self.keys, pad), mx.pad(self.values, pad), first
        for j, name in enumerate(("keys", "values")):
            buf, theirs = getattr(self, name), [None if e is None else e[j] for e in entries]
            like = buf if buf is not None else next((e for e in theirs if e is not None), None)
            if like is None:
                continue  # no row holds anything yet: the first update makes the buffer
            if buf is None:  # earlier rows held nothing yet
                buf = mx.zeros((rows, like.shape[1], end - self.base, like.shape[3]), like.dtype)
            size, at = buf.shape[2], end - self.base
            new = [_aligned(e, at, size, buf) for p, e in zip(places, theirs) if p >= rows]
            if new:
                buf = mx.concatenate([buf, *new], axis=0)
            for p, e in zip(places, theirs):
                if p < rows and e is not None:
                    buf[p : p + 1, :, at - e.shape[2] : at, :] = e.astype(buf.dtype)
            setattr(self, name, buf)

    def shift(self, by: int) -> None:
        """Every slot moves `by` to the right (the buffer grows on the left)."""
        if self.window is not None:
            self.base += by  # the new slots are older than any window reaches
        elif self.keys is not None:
            pad = [(0, 0), (0, 0), (by, 0), (0, 0)]
            self.keys, self.values = mx.pad(self.keys, pad), mx.pad(self.values, pad)

    def forget(self, needed: int) -> None:
        """A window: drop the slots before `needed` (no row's window reaches them), GROW at once."""
        if self.window is not None and self.keys is not None and needed - self.base >= GROW:
            cut = needed - self.base
            self.keys = mx.contiguous(self.keys[..., cut:, :])
            self.values = mx.contiguous(self.values[..., cut:, :])
            self.base = needed

    def gather(self, rows: mx.array | None, order: np.ndarray, end: int, lengths: Sequence[int]) -> None:
        """Compaction: row j's entries move to the end of a buffer of order.shape[1] slots, from the
        slots `order[j]` (of the buffer's rows `rows`; None: all). A window keeps the last it needs."""
        if self.keys is None:
            return
        cut = 0 if self.window is None else order.shape[1] - max(min(n, self.window + 1) for n in lengths)
        gather = mx.array(np.maximum(order[:, cut:] - self.base, 0))[:, None, :, None]
        keys, values = (self.keys, self.values) if rows is None else (self.keys[rows], self.values[rows])
        self.keys = mx.take_along_axis(keys[..., : end - self.base, :], gather, axis=2)
        self.values = mx.take_along_axis(values[..., : end - self.base, :], gather, axis=2)
        self.base = cut

    def clear(self) -> None:
        self.keys = self.values = None
        self.base = 0

    def row(self, row: int, where: np.ndarray) -> KVCache | RotatingKVCache:
        """A single-sequence cache of the entries in slots `where` of `row` (a window: the last
        of them it sees, in time order, as mlx-lm's RotatingKVCache holds them after a trim)."""
        kv = KVCache() if self.window is None else RotatingKVCache(self.window)
        if self.window is not None:
            where = where[-self.window:]
        if len(where):
            idx = mx.array((where - self.base).astype(np.int32))
            kv.keys = mx.contiguous(self.keys[row : row + 1][..., idx, :])
            kv.values = mx.contiguous(self.values[row : row + 1][..., idx, :])
            if self.window is not None:
                kv._idx = len(where)
        return kv


def newest(c) -> tuple[mx.array, mx.array] | None:
    """A single-sequence KV or sliding-window cache's entries in time order (a window: the last
    ones only), the newest at its offset."""
    if c.keys is None:
        return None
    if type(c) is RotatingKVCache:
        return c._temporal_order(c.keys), c._temporal_order(c.values)
    return c.keys[..., : c.offset, :], c.values[..., : c.offset, :]


def _aligned(entries, end: int, size: int, like):
    """A row of `size` slots holding `entries` right-aligned at index `end`."""
    if entries is None:
        return mx.zeros((1, *like.shape[1:]), like.dtype)
    n = entries.shape[2]
    return mx.pad(entries, [(0, 0), (0, 0), (end - n, size - end), (0, 0)]).astype(like.dtype)


def _extend(buf, like, grow: int):
    shape = (like.shape[0], like.shape[1], grow, like.shape[3])
    more = mx.zeros(shape, like.dtype)
    return more if buf is None else mx.concatenate([buf, more], axis=2)
