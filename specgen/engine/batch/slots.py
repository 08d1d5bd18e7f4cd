"""Which buffer slots each row of a ragged batch (cache.py) holds, each row's length, and a
step's masks: a slot held by that row AND causal by buffer index, and for a sliding-window layer
also within the window by the row's own positions; the shelves rows are kept on (kv.py: runs of
places whose entries sit in a buffer of their own, from their shelf's first slot on); and the
step's runs of rows, each attending over the slots its rows hold, within its shelf (attend.py).
A pass may be fed flat (`Flat`): each row only its own positions, one after another, each
position a batch row of the model's input, so a row that drafts more does not make the others
compute padding; the layers' keys and attention stay in the padded (rows, width) layout, and
attend.py moves between the two. Shared by every layer of the batch. What every step asks (each
row's oldest slot, the last runs, `held` on the device) is kept between steps, so a plain step's
host work is a few list operations (design.md, "Batched steps")."""

from __future__ import annotations

from typing import NamedTuple, Sequence

import mlx.core as mx
import numpy as np

from specgen.engine.batch.attend import Run, runs

GROW = 256  # slots added (and, by a window, cut) at a time, as mlx-lm's KVCache grows


class Shelf(NamedTuple):
    """Rows `start` to `stop` (places), whose entries a full-attention layer keeps in one buffer
    of their own, from slot `base` on."""

    start: int
    stop: int
    base: int


class Part(NamedTuple):
    """Where a flat pass's tokens sit in a padded (rows, `width`) layout: `spread`, each padded
    position's token (padding reads token 0: masked, its output unread); `take`, each of its
    tokens' index there (row by row, in order of places)."""

    spread: mx.array
    take: mx.array
    width: int


class Flat(NamedTuple):
    """A pass fed flat: its tokens in the step's padded layout (`whole`, as the keys and values
    are stored), each run's (`parts`, as it attends: padded to its own widest), each token's
    position (`offset`)."""

    whole: Part
    parts: list[Part]
    offset: mx.array


def _part(new: np.ndarray, first: int) -> Part:
    """The Part of rows whose fed positions are `new` (rows, width), their first token `first`."""
    take = np.flatnonzero(new)
    spread = np.zeros(new.size, dtype=np.int32)
    spread[take] = first + np.arange(len(take))
    return Part(mx.array(spread), mx.array(take.astype(np.int32)), new.shape[1])


def _first(counts: Sequence[int], width: int) -> np.ndarray:
    """(rows, `width`) bool: row i's first `counts[i]` positions. Made from lists: a broadcast
    comparison allocates numpy's iterator, and on Linux the first such allocation after the device
    thread freed a pass's graph consolidates glibc's fast bins (~1 ms a step of 4 rows of the
    CPU proxy, where mlx-lm's step allocates nothing that large)."""
    return np.array([[j < n for j in range(width)] for n in counts], dtype=bool).reshape(len(counts), width)


class Slots:
    """Which buffer slots each row holds, each row's length, and the current step's masks."""

    def __init__(self):
        self._firsts: list[int] | None = None  # each row's oldest held slot, kept between steps
        self._plan: tuple[tuple, list[Run]] | None = None  # the last runs, and what they were for
        # `held` on the device, kept by lazy ops (None: copy it there when a layer next asks for
        # the mask): a step then copies nothing of the whole length's to the device (`_first`).
        self._device: mx.array | None = None
        self.held = np.zeros((0, 0), dtype=bool)  # (rows, end): slot holds an entry of that row
        self.lengths: list[int] = []  # entries each row holds (its next RoPE position)
        self.offset = mx.zeros((0,), mx.int32)
        self._mask: mx.array | None = None
        # Real positions each row feeds this step, for state layers to skip the padding after
        # them; None where every row feeds the step's whole width (the unmasked path, as alone).
        self.widths: mx.array | None = None
        self._new = np.zeros((0, 0), dtype=bool)  # the step's fed positions, (rows, T)
        self._windows: dict[tuple[int, int], mx.array] = {}
        self.runs: list[Run] | None = None  # the step's runs of rows for attention (attend.py)
        self.flat: Flat | None = None  # the step's layout where it is fed flat
        self.shelves: list[Shelf] = []  # in order of places, every row on one (cache.py places them)

    @property
    def held(self) -> np.ndarray:
        """(rows, end): whether a slot holds an entry of that row (a view of spare columns)."""
        return self._buf[:, : self._end]

    @held.setter
    def held(self, held: np.ndarray) -> None:
        self._buf, self._end = held, held.shape[1]
        self._firsts = self._plan = self._device = None

    def release(self, row: int, entries: int | None = None) -> None:
        """`row` no longer holds its newest `entries` entries (None: any; its length is then 0)."""
        self.lengths[row] = 0 if entries is None else self.lengths[row] - entries
        where = np.flatnonzero(self.held[row])
        where = where[len(where) - entries :] if entries is not None else where
        self._buf[row, where] = False
        if self._device is not None and len(where):
            self._device[row, mx.array(where.astype(np.int32))] = False
        self._firsts = self._plan = None

    @property
    def end(self) -> int:
        return self._end

    def begin(self, widths: Sequence[int], flat: bool = False) -> None:
        """Before a pass feeding `widths[i]` real positions of row i (the rest is padding, or,
        `flat`, not fed at all)."""
        width = max(widths)
        new = self._new = _first(widths, width)  # (rows, T)
        self._mask = None
        self.offset = mx.array(self.lengths, mx.int32)
        self.widths = None if min(widths) == width else mx.array(widths, mx.int32)
        self._windows = {}
        self.runs = self._runs(self.end + width, widths if flat else None)
        self.flat = None
        if flat:
            before = np.cumsum([0, *widths])
            parts = [_part(new[r.start : r.stop, : r.width], before[r.start]) for r in self.runs]
            positions = (np.asarray(self.lengths)[:, None] + np.arange(width))[new]
            self.flat = Flat(_part(new, 0), parts, mx.array(positions.astype(np.int32)))
            self.offset = self.flat.offset

    @property
    def mask(self) -> mx.array:
        """The step's mask, (rows, 1, T, end + T): a slot held by the row and, among the step's
        positions, fed and causal; made on the device from its copy of `held` when a layer asks."""
        if self._mask is None:
            if self._device is None:
                self._device = mx.array(self.held)
            new, width = mx.array(self._new), self._new.shape[1]
            if width == 1:  # a plain step: no causal block to build (each op is a CPU task)
                self._mask = mx.concatenate([self._device, new], axis=1)[:, None, None]
            else:
                causal = mx.arange(width)[:, None] >= mx.arange(width)[None, :]  # (T, T)
                old = mx.broadcast_to(self._device[:, None, :], (len(new), width, self.end))
                self._mask = mx.concatenate([old, new[:, None, :] & causal[None]], axis=2)[:, None]
        return self._mask

    def _runs(self, keys: int, widths: Sequence[int] | None = None) -> list[Run]:
        """The runs of rows within each shelf, in a pass over `keys` slots (`widths`: queries
        each row feeds a flat pass)."""
        shelves = self.shelves or [Shelf(0, len(self.lengths), 0)]
        key = (keys, None if widths is None else tuple(widths), tuple(shelves))
        if self._plan is None or self._plan[0] != key:  # a step's pricing and its pass ask alike
            firsts = self.firsts()
            fed = (lambda s: None) if widths is None else (lambda s: widths[s.start : s.stop])
            self._plan = key, [r._replace(start=s.start + r.start, stop=s.start + r.stop, shelf=i)
                               for i, s in enumerate(shelves)
                               for r in runs(firsts[s.start : s.stop], keys, widths=fed(s))]
        return self._plan[1]

    def firsts(self) -> list[int]:
        """Each row's oldest held slot (`end` where it holds none), found again only after
        entries were released or rows changed (a step only appends)."""
        if self._firsts is None:
            held = self.held
            self._firsts = (np.where(held.any(axis=1), held.argmax(axis=1), self.end).tolist() if self.end
                            else [0] * len(self.lengths))
        return self._firsts

    def reach(self) -> int:
        """The slots a row's attention reads in a step of one position, on average over the rows,
        as `runs` cuts them: what the step costs as the batched grid timed it (rows of one length)."""
        keys, rows = self.end + 1, len(self.lengths)
        if not rows:
            return 0
        return -(-sum((r.stop - r.start) * (keys - r.first) for r in self._runs(keys)) // rows)

    def window_mask(self, window: int, base: int = 0) -> mx.array:
        """This step's mask for a layer that sees the last `window` positions (the query's own
        included), as mlx-lm's sliding-window masks: by each row's positions, not by slots;
        over the slots from `base` on (a window layer holds no earlier ones)."""
        if (window, base) not in self._windows:
            width = self._new.shape[1]
            lengths = np.asarray(self.lengths)[:, None]
            held = np.cumsum(self.held, axis=1)[:, base:] - 1
            keys = np.concatenate([held, lengths + np.arange(width)], axis=1)
            queries = lengths + np.arange(width)
            near = keys[:, None, :] > queries[:, :, None] - window
            self._windows[window, base] = self.mask[..., base:] & mx.array(near[:, None])
        return self._windows[window, base]

    def commit(self, width: int, kept: Sequence[int]) -> None:
        """After a pass of `width` positions: row i keeps its first `kept[i]` fed positions."""
        end = self.end
        new = _first(kept, width)
        if end + width > self._buf.shape[1]:  # spare columns, GROW at a time, as the buffers grow
            spare = np.zeros((len(new), -(-(end + width) // GROW) * GROW - end), dtype=bool)
            self._buf = np.concatenate([self.held, spare], axis=1)
        self._buf[:, end : end + width] = new
        self._end += width
        if self._device is not None:
            self._device = mx.concatenate([self._device, mx.array(new)], axis=1)
        if self._firsts is not None:  # a row that held nothing holds from the old end on, if any
            self._firsts = [f if f < end else end if k else end + width for f, k in zip(self._firsts, kept)]
        self.lengths = [n + k for n, k in zip(self.lengths, kept)]
        self._mask = self.widths = self.runs = self.flat = None
        self._windows = {}
