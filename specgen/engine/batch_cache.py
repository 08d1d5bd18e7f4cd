"""A ragged batch cache: many sequences in one buffer, each with its own end, nothing moved per
step.

Every row writes a step's T positions at the same buffer slots (one slice write per layer, as
mlx-lm's caches do); `Slots` (batch_slots.py), shared by all layers, says which slots each row
holds. A row's rejected drafts and its padding (rows feed fewer positions than the step's widest)
stay in the buffer but are masked out forever, and each row's RoPE offset is its own logical
length, so a rejected slot leaves no gap in positions: the next token sits right after the last
kept one. The attention mask of a step is (rows, 1, T, slots): slot held by that row AND causal
by buffer index. Sequences join with a prefilled single-sequence cache (right-aligned, left slots
invalid), into a row another one freed by leaving (`drop`) or a new one. Holes and free rows are
squeezed out (`compact`) once they make the buffer much larger than what its rows hold.

Layers of three kinds batch: KV caches; sliding windows (RotatingKVCache), held like KV layers
and masked to each row's window, so a rejected draft is a hole there too, wrap or not; and state
layers (ArraysCache, batch_state.py), which cannot drop tokens: a row whose draft was partly
rejected is restored to its state before the pass and keeps none of the pass's entries in any
layer, so all layers hold the same tokens (`commit`). `unbatchable` names any other kind.
"""

from __future__ import annotations

from typing import Sequence

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import ArraysCache, KVCache, RotatingKVCache

from specgen.engine.batch_slots import Slots
from specgen.engine.batch_state import RowStates

GROW = 256  # slots added at a time, as mlx-lm's KVCache grows
HOLES = 0.5  # compact when the buffer is this much longer than the longest row (and GROW more)


def _batches(c) -> bool:
    # A window that keeps its first tokens (mlx-lm's max_kv_size) is not a sliding window.
    return type(c) in (KVCache, ArraysCache) or (type(c) is RotatingKVCache and not c.keep)


def unbatchable(cache: Sequence) -> str | None:
    """Why a model's fresh cache (make_prompt_cache) cannot join a ragged batch, or None."""
    kinds = sorted({type(c).__name__ for c in cache if not _batches(c)})
    return f"its cache layers ({', '.join(kinds)}) do not batch by per-row ends" if kinds else None


class RaggedKVCache:
    """One attention layer's keys and values for every row; positions and masks from `slots`.
    A sliding-window layer (`window`) holds every entry too, and its mask hides the old ones."""

    def __init__(self, slots: Slots, window: int | None = None):
        self.slots, self.window = slots, window
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
        window = window_size or self.window
        return self.slots.mask if window is None else self.slots.window_mask(window)

    def is_trimmable(self) -> bool:
        return False  # rows end where `slots` says; trimming all rows at once would be wrong

    @property
    def state(self):
        return self.keys, self.values

    def join(self, entries: Sequence, places: Sequence[int], rows: int, end: int) -> None:
        """Write each joining row's (keys, values) (or None), newest at slot `end`, into its place:
        a free row in place; places from `rows` on are appended together (one copy)."""
        for j, name in enumerate(("keys", "values")):
            buf, theirs = getattr(self, name), [None if e is None else e[j] for e in entries]
            like = buf if buf is not None else next((e for e in theirs if e is not None), None)
            if like is None:
                continue  # no row holds anything yet: the first update makes the buffer
            if buf is None:  # earlier rows held nothing yet
                buf = mx.zeros((rows, like.shape[1], end, like.shape[3]), like.dtype)
            size = buf.shape[2]
            new = [_aligned(e, end, size, buf) for p, e in zip(places, theirs) if p >= rows]
            if new:
                buf = mx.concatenate([buf, *new], axis=0)
            for p, e in zip(places, theirs):
                if p < rows and e is not None:
                    buf[p : p + 1, :, end - e.shape[2] : end, :] = e.astype(buf.dtype)
            setattr(self, name, buf)

    def row(self, row: int, where: np.ndarray) -> KVCache | RotatingKVCache:
        """A single-sequence cache of the entries in slots `where` of `row` (a window: the last
        of them it sees, in time order, as mlx-lm's RotatingKVCache holds them after a trim)."""
        kv = KVCache() if self.window is None else RotatingKVCache(self.window)
        if self.window is not None:
            where = where[-self.window:]
        if len(where):
            idx = mx.array(where.astype(np.int32))
            kv.keys = mx.contiguous(self.keys[row : row + 1][..., idx, :])
            kv.values = mx.contiguous(self.values[row : row + 1][..., idx, :])
            if self.window is not None:
                kv._idx = len(where)
        return kv


def _newest(c) -> tuple[mx.array, mx.array] | None:
    """A single-sequence KV or sliding-window cache's entries in time order (a window: the last
    ones only), the newest at its offset."""
    if c.keys is None:
        return None
    if type(c) is RotatingKVCache:
        return c._temporal_order(c.keys), c._temporal_order(c.values)
    return c.keys[..., : c.offset, :], c.values[..., : c.offset, :]


def _aligned(entries, end: int, size: int, like):
    """A row of `size` slots holding `entries` right-aligned at slot `end`."""
    if entries is None:
        return mx.zeros((1, *like.shape[1:]), like.dtype)
    n = entries.shape[2]
    return mx.pad(entries, [(0, 0), (0, 0), (end - n, size - end), (0, 0)]).astype(like.dtype)


def _extend(buf, like, grow: int):
    shape = (like.shape[0], like.shape[1], grow, like.shape[3])
    more = mx.zeros(shape, like.dtype)
    return more if buf is None else mx.concatenate([buf, more], axis=2)


def _layer(c, slots: Slots):
    """The batched layer for one layer of a single-sequence cache."""
    if type(c) is ArraysCache:
        return RowStates(slots, len(c.cache))
    return RaggedKVCache(slots, c.max_size if type(c) is RotatingKVCache else None)


class RaggedBatch:
    """The ragged cache of a whole model: one batched layer per layer over shared Slots, of the
    kinds of the first caches to join (all of one model).

    A sequence that leaves frees its row (nothing is moved); a free row holds nothing and is fed
    padding until a joining sequence takes it, or until `compact` drops it. Copying every row's
    entries whenever one row left cost ~0.1-0.9 s a time at 16 rows of a few hundred slots on the
    CPU, on every one of a round's leaves; a padded row costs a few ms a step."""

    def __init__(self, layers: int):
        self.slots = Slots()
        self.count = layers  # layers of the model's cache
        self.layers: list = []  # made by the first `add`, from the kinds of its caches
        self.free: list[int] = []  # rows no sequence holds, lowest first
        self._fed: list[int] = []  # positions each row feeds in the current pass

    @property
    def rows(self) -> int:
        """Rows of the buffer, free ones included (every pass feeds them all)."""
        return len(self.slots.lengths)

    @property
    def states(self) -> list[RowStates]:
        """The state layers: where there are any, rows are taken back whole (`commit`)."""
        return [c for c in self.layers if isinstance(c, RowStates)]

    @property
    def _kv(self) -> list[RaggedKVCache]:
        return [c for c in self.layers if isinstance(c, RaggedKVCache)]

    def add(self, caches: Sequence[Sequence], counts: Sequence[int] | None = None) -> list[int]:
        """Hold what each single-sequence cache holds (`counts[i]` tokens: by default, what its
        attention layers hold), in a free row (written in place) or, past those, in rows appended
        together (one copy): their rows."""
        if len(caches[0]) != self.count:
            raise ValueError(f"a cache of {len(caches[0])} layers joins a batch of {self.count}")
        if not self.layers:
            self.layers = [_layer(c, self.slots) for c in caches[0]]
        if counts is None:
            counts = [next((c.offset for c in cache if hasattr(c, "offset")), 0) for cache in caches]
        end = max(self.slots.end, *counts)
        if end > self.slots.end:  # the buffer grows on the left: old rows gain invalid slots
            self._shift(end - self.slots.end)
        reused, self.free = self.free[: len(caches)], self.free[len(caches):]
        rows = self.rows
        places = reused + list(range(rows, rows + len(caches) - len(reused)))
        for k, mine in enumerate(self.layers):
            theirs = [cache[k] for cache in caches]
            if isinstance(mine, RowStates):
                mine.join(theirs, places, rows + len(caches) - len(reused))
            else:
                mine.join([_newest(c) for c in theirs], places, rows, end)
        more = np.zeros((len(places) - len(reused), end), dtype=bool)
        self.slots.held = np.concatenate([self.slots.held, more], axis=0)
        self.slots.lengths += [0] * len(more)
        for row, n in zip(places, counts):
            self.slots.held[row] = False
            self.slots.held[row, end - n:] = True
            self.slots.lengths[row] = n
        return places

    def _shift(self, by: int) -> None:
        for c in self._kv:
            if c.keys is not None:
                pad = [(0, 0), (0, 0), (by, 0), (0, 0)]
                c.keys, c.values = mx.pad(c.keys, pad), mx.pad(c.values, pad)
        self.slots.held = np.pad(self.slots.held, [(0, 0), (by, 0)])

    def begin(self, fed: Sequence[int]) -> None:
        """Before a pass feeding `fed[i]` real positions of row i (the rest is padding)."""
        for c in self.states:
            c.mark()
        self._fed = list(fed)
        self.slots.begin(fed)

    def commit(self, width: int, kept: Sequence[int]) -> None:
        """After the pass: row i keeps its first `kept[i]` fed positions. With state layers, a
        row that keeps fewer than it fed keeps none, and its states go back to before the pass."""
        back = [i for i, (k, f) in enumerate(zip(kept, self._fed)) if k < f] if self.states else []
        if back:
            for c in self.states:
                c.restore(back)
            kept = [0 if i in back else k for i, k in enumerate(kept)]
        self.slots.commit(width, kept)

    def drop(self, rows: Sequence[int]) -> None:
        """Free these rows (nothing is moved); with none held any more, the buffer is emptied."""
        for i in rows:
            self.slots.held[i] = False
            self.slots.lengths[i] = 0
        self.free = sorted({*self.free, *rows})
        if len(self.free) == self.rows:
            self.slots.held = np.zeros((0, 0), dtype=bool)
            self.slots.lengths, self.free = [], []
            for c in self._kv:
                c.keys = c.values = None
            for c in self.states:
                c.clear()

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
        for c in self._kv:
            if c.keys is None:
                continue
            end = self.slots.end
            keys, values = (c.keys, c.values) if rows is None else (c.keys[rows], c.values[rows])
            c.keys = mx.take_along_axis(keys[..., :end, :], gather, axis=2)
            c.values = mx.take_along_axis(values[..., :end, :], gather, axis=2)
        if self.free:
            for c in self.states:
                c.keep(kept)
        self.slots.held = np.arange(longest)[None, :] >= (longest - np.asarray(lengths))[:, None]
        self.slots.lengths, self.free = lengths, []
        return kept

    def row_cache(self, row: int, count: int) -> list:
        """A single-sequence cache holding the first `count` entries of row `row` (a copy, made
        now: a lazy one would keep the whole buffer alive, and force the next step's writes to
        copy it, ~0.6 s a leave at 16 rows on the CPU). With state layers, `count` is what the
        row holds (its state is as of then)."""
        if self.states and count != self.slots.lengths[row]:
            raise ValueError(f"row {row} holds {self.slots.lengths[row]} tokens' states, not {count}")
        where = np.flatnonzero(self.slots.held[row])[:count]
        out = [c.row(row) if isinstance(c, RowStates) else c.row(row, where) for c in self.layers]
        for c in out:
            if not isinstance(c, ArraysCache):
                c.offset = count
        mx.eval([c.cache if isinstance(c, ArraysCache) else [c.keys, c.values] for c in out if not c.empty()])
        return out
