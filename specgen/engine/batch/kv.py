"""One attention layer of a ragged batch (cache.py): every row's keys and values, in buffers whose
slots `Slots` (slots.py) hands out, positions and masks per row.

A full-attention layer keeps each shelf of rows (`Slots.shelves`: neighbouring places) in a
buffer of its own, from the shelf's first slot on, so a short conversation batched with a long
one does not hold the long one's span of memory again; the batch's attention reads them shelf by
shelf (attend.py). A sliding-window layer (`window`) is one buffer for every row, masked to each
row's window; it keeps only the slots some row's window (and one entry more: a row copied out
alone as mlx-lm's RotatingKVCache holds a full window) can still reach: the older ones are cut
off its front every GROW slots, so it holds about a window of slots, not the whole history, and
attends over no more. A pass fed flat (slots.py) hands in one entry a position; they are stored
as a padded pass's."""

from __future__ import annotations

from typing import Sequence

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import KVCache, RotatingKVCache

from specgen.engine.batch.attend import Run, padded
from specgen.engine.batch.slots import GROW, Shelf, Slots


class RaggedKVCache:
    """One attention layer's keys and values for every row; positions and masks from `slots`."""

    def __init__(self, slots: Slots, window: int | None = None):
        self.slots, self.window = slots, window
        self.buffers: list[list[mx.array]] = []  # [keys, values] of each shelf (a window: one)
        self.bases: list[int] = []  # the slot index 0 of each buffer holds
        self.fetched = 0  # the slots the last update's keys reach (its pass's keys' end)
        self.attended = False  # the batch's attention read it by runs (attend.py; probe.py asks)

    @property
    def keys(self) -> mx.array | None:
        return self.buffers[0][0] if self.buffers else None

    @property
    def base(self) -> int:
        """The slot a window's buffer starts at (it cuts the ones before)."""
        return self.bases[0] if self.bases else 0

    @property
    def offset(self) -> mx.array:
        return self.slots.offset

    def _shelves(self) -> list[Shelf]:
        if self.window is not None:
            return [Shelf(0, len(self.slots.lengths), self.base)]
        return self.slots.shelves

    def _fit(self, shelves: Sequence[Shelf], like: Sequence[mx.array], upto: int) -> None:
        """Make a keys and a values buffer (shaped as `like`'s two) for each shelf, as many rows as
        it has, from its first slot to `upto` (or past: GROW at a time); new slots and rows hold
        zeros (masked)."""
        for i, s in enumerate(shelves):
            rows, need = s.stop - s.start, upto - s.base
            if i == len(self.buffers):
                size = -(-need // GROW) * GROW
                self.buffers.append([mx.zeros((rows, x.shape[1], size, x.shape[3]), x.dtype) for x in like])
                self.bases.append(s.base)
                continue
            held = self.buffers[i][0]
            left, more = self.bases[i] - s.base, rows - held.shape[0]
            grow = need - left - held.shape[2]
            grow = -(-grow // GROW) * GROW if grow > 0 else 0
            if left or more or grow:
                pad = [(0, more), (0, 0), (left, grow), (0, 0)]
                self.buffers[i] = [mx.pad(b, pad) for b in self.buffers[i]]
                self.bases[i] = s.base

    def update_and_fetch(self, keys, values):
        if self.slots.flat is not None:  # stored as a padded pass's (attend.py)
            keys, values = padded(keys, self.slots.flat.whole), padded(values, self.slots.flat.whole)
        end, width, shelves = self.slots.end, keys.shape[2], self._shelves()
        self._fit(shelves, (keys, values), end + width)
        whole = len(shelves) == 1
        for (k, v), s, b in zip(self.buffers, shelves, self.bases):
            k[..., end - b : end - b + width, :] = keys if whole else keys[s.start : s.stop]
            v[..., end - b : end - b + width, :] = values if whole else values[s.start : s.stop]
        self.fetched = end + width
        if len(shelves) > 1:
            return keys, values  # the batch's attention reads the shelves (attend.py)
        at = self.fetched - self.bases[0]
        return self.buffers[0][0][..., :at, :], self.buffers[0][1][..., :at, :]

    def view(self, run: Run) -> tuple[mx.array, mx.array]:
        """The keys and values `run`'s rows attend over: their shelf's, from the run's first slot."""
        s, b = self.slots.shelves[run.shelf], self.bases[run.shelf]
        rows = slice(run.start - s.start, run.stop - s.start)
        return tuple(x[rows, :, run.first - b : self.fetched - b] for x in self.buffers[run.shelf])

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
        return [x for kv in self.buffers for x in kv]

    def join(self, entries: Sequence, places: Sequence[int], rows: int, end: int) -> None:
        """Write each joining row's (keys, values) (or None), newest at slot `end`, into its place
        (`rows`: the rows before; places from there on are new, on the last shelf)."""
        if self.window is not None:  # a window needs its last entries only
            entries = [None if e is None else tuple(x[..., -(self.window + 1):, :] for x in e)
                       for e in entries]
        like = next((e for e in entries if e is not None), None)
        if like is None:
            return  # they hold nothing yet: the first update makes what they need
        shelves = self.slots.shelves
        if self.window is not None:
            first = min(end - e[0].shape[2] for e in entries if e is not None)
            shelves = [Shelf(0, max(rows, max(places) + 1), min(first, self.base) if self.buffers else first)]
        self._fit(shelves, like, end)
        for p, e in zip(places, entries):
            if e is not None:
                i = _shelf(shelves, p)
                at, row = end - self.bases[i], p - shelves[i].start
                for buf, x in zip(self.buffers[i], e):
                    buf[row : row + 1, :, at - x.shape[2] : at, :] = x.astype(buf.dtype)

    def shift(self, by: int) -> None:
        """Every slot moves `by` to the right (the new slots are older than any row holds)."""
        self.bases = [b + by for b in self.bases]

    def forget(self, needed: int) -> None:
        """A window: drop the slots before `needed` (no row's window reaches them), GROW at once."""
        if self.window is not None and self.buffers and needed - self.base >= GROW:
            cut = needed - self.base
            self.buffers[0] = [mx.contiguous(x[..., cut:, :]) for x in self.buffers[0]]
            self.bases[0] = needed

    def gather(self, kept: Sequence[int], old: Sequence[Shelf], order: np.ndarray, lengths: Sequence[int]) -> None:
        """Compaction: new row j (old place `kept[j]`, on the `old` shelves) gets its entries, from
        the slots `order[j]`, at the end of a buffer of order.shape[1] slots, on the new shelves
        (Slots.shelves). A window keeps the last it needs."""
        if not self.buffers:
            return
        if self.window is not None:
            cut = order.shape[1] - max(min(n, self.window + 1) for n in lengths)
            old = [Shelf(0, max(kept) + 1, self.base)]
            new = [Shelf(0, len(kept), cut)]
        else:
            new = self.slots.shelves
        buffers = []
        for s in new:
            parts, j = [], s.start
            while j < s.stop:  # neighbouring rows from one old shelf: one gather
                i = _shelf(old, kept[j])
                stop = next((k for k in range(j, s.stop) if not old[i].start <= kept[k] < old[i].stop), s.stop)
                at = mx.array(np.maximum(order[j:stop, s.base:] - self.bases[i], 0))[:, None, :, None]
                rows = mx.array([kept[k] - old[i].start for k in range(j, stop)], mx.int32)
                parts.append([mx.take_along_axis(x[rows], at, axis=2) for x in self.buffers[i]])
                j = stop
            buffers.append([mx.concatenate([q[n] for q in parts], axis=0) if len(parts) > 1 else parts[0][n]
                            for n in (0, 1)])
        self.buffers, self.bases = buffers, [s.base for s in new]

    def drop_shelves(self, gone: Sequence[int], kept: Sequence[int]) -> None:
        """The shelves `gone` hold no row any more: drop their buffers (a window keeps the rows
        `kept`, a copy of a window's worth)."""
        if self.window is not None:
            if self.buffers:
                self.buffers[0] = [x[mx.array(list(kept), mx.int32)] for x in self.buffers[0]]
            return
        self.buffers = [b for i, b in enumerate(self.buffers) if i not in gone]
        self.bases = [b for i, b in enumerate(self.bases) if i not in gone]

    def clear(self) -> None:
        self.buffers, self.bases = [], []

    def row(self, row: int, where: np.ndarray) -> KVCache | RotatingKVCache:
        """A single-sequence cache of the entries in slots `where` of `row` (a window: the last
        of them it sees, in time order, as mlx-lm's RotatingKVCache holds them after a trim)."""
        kv = KVCache() if self.window is None else RotatingKVCache(self.window)
        if self.window is not None:
            where = where[-self.window:]
        if len(where):
            shelves = self._shelves()
            i = _shelf(shelves, row)
            idx = mx.array((where - self.bases[i]).astype(np.int32))
            at = row - shelves[i].start
            kv.keys, kv.values = (mx.contiguous(x[at : at + 1][..., idx, :]) for x in self.buffers[i])
            if self.window is not None:
                kv._idx = len(where)
        return kv


def _shelf(shelves: Sequence[Shelf], place: int) -> int:
    """The shelf `place` is on."""
    return next(i for i, s in enumerate(shelves) if s.start <= place < s.stop)


def newest(c) -> tuple[mx.array, mx.array] | None:
    """A single-sequence KV or sliding-window cache's entries in time order (a window: the last
    ones only), the newest at its offset."""
    if c.keys is None:
        return None
    if type(c) is RotatingKVCache:
        return c._temporal_order(c.keys), c._temporal_order(c.values)
    return c.keys[..., : c.offset, :], c.values[..., : c.offset, :]
