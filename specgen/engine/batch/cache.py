"""A ragged batch cache: many sequences in one buffer, each with its own end, nothing moved per
step.

Every row writes a step's T positions at the same buffer slots (one slice write per layer, as
mlx-lm's caches do); `Slots` (slots.py), shared by all layers, says which slots each row
holds. A row's rejected drafts and its padding (rows feed fewer positions than the step's widest)
stay in the buffer but are masked out forever, and each row's RoPE offset is its own logical
length, so a rejected slot leaves no gap in positions: the next token sits right after the last
kept one. The attention mask of a step is (rows, 1, T, slots): slot held by that row AND causal
by buffer index. Sequences join with a prefilled single-sequence cache (right-aligned, left slots
invalid), into a row another one freed by leaving (`drop`) or a new one. Holes and free rows are
squeezed out (`compact`) once they make the buffer much larger than what its rows hold.

With `split` (probe.py: the model's attention reads by runs), rows sit on shelves (`_place`,
`compact`), so a short request beside a long session costs its own span of memory, not the
session's, and neither its joining nor its leaving copies the session.

Layers of three kinds batch: KV caches; sliding windows (RotatingKVCache), held like KV layers
(kv.py) and masked to each row's window, so a rejected draft is a hole there too, wrap or
not, and cut to the slots some window still reaches (`commit`); and state layers (ArraysCache,
state.py), which cannot drop tokens: a row whose draft was partly rejected is restored to
its state before the pass and keeps none of the pass's entries in any layer, so all layers hold
the same tokens (`take_back`). `unbatchable` names any other kind.
"""

from __future__ import annotations

from typing import Sequence

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import ArraysCache, KVCache, RotatingKVCache

from specgen.engine.batch.attend import GROUP, Run, runs
from specgen.engine.batch.kv import GROW, RaggedKVCache, newest
from specgen.engine.batch.slots import Shelf, Slots
from specgen.engine.batch.state import RowStates

HOLES = 0.5  # compact when the buffer is this much longer than the longest row (and GROW more)


def _batches(c) -> bool:
    # A window that keeps its first tokens (mlx-lm's max_kv_size) is not a sliding window.
    return type(c) in (KVCache, ArraysCache) or (type(c) is RotatingKVCache and not c.keep)


def unbatchable(cache: Sequence) -> str | None:
    """Why a model's fresh cache (make_prompt_cache) cannot join a ragged batch, or None."""
    kinds = sorted({type(c).__name__ for c in cache if not _batches(c)})
    return f"its cache layers ({', '.join(kinds)}) do not batch by per-row ends" if kinds else None


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

    def __init__(self, layers: int, split: bool = False, group: int = GROUP):
        self.slots = Slots()
        self.count = layers  # layers of the model's cache
        self.split = split  # rows on shelves of their own (else one shelf from slot 0)
        self.group = group  # row-slots a shelf of its own must save (the probe's: any)
        self.layers: list = []  # made by the first `add`, from the kinds of its caches
        self.free: list[int] = []  # rows no sequence holds, lowest first
        self._open: list[int] = []  # widths of the last two passes committed (not judged yet)

    @property
    def rows(self) -> int:
        """Rows of the buffer, free ones included (every pass feeds them all)."""
        return len(self.slots.lengths)

    @property
    def states(self) -> list[RowStates]:
        """The state layers: where there are any, rows are taken back whole (`take_back`)."""
        return [c for c in self.layers if isinstance(c, RowStates)]

    @property
    def prefixes(self) -> bool:
        """Whether `row_cache` gives any prefix of a row (KV layers only: a window forgets its
        oldest entries, a state cannot go back)."""
        return bool(self.layers) and all(isinstance(c, RaggedKVCache) and c.window is None for c in self.layers)

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
        rows = self.rows
        places = self._place([end - n for n in counts], end)
        added = max(0, max(places) + 1 - rows)  # new rows, after the free ones taken
        for k, mine in enumerate(self.layers):
            theirs = [cache[k] for cache in caches]
            if isinstance(mine, RowStates):
                mine.join(theirs, places, rows + added)
            else:
                mine.join([newest(c) for c in theirs], places, rows, end)
        held = np.concatenate([self.slots.held, np.zeros((added, end), dtype=bool)], axis=0)
        self.slots.lengths += [0] * added
        for row, n in zip(places, counts):
            held[row] = False
            held[row, end - n:] = True
            self.slots.lengths[row] = n
        self.slots.held = held
        return places

    def _place(self, firsts: Sequence[int], end: int) -> list[int]:
        """The places of rows joining whose oldest entries will be at slots `firsts`: a free row
        on the shelf that starts latest at or before a row's first slot, else a new row. New rows
        go longest first, cut as `runs` cuts rows, each run on the last shelf or, where that would
        hold more than GROUP slots its rows do not need, on a shelf of its own. Unsplit, one shelf
        reaches back as far as any row."""
        shelves, rows = list(self.slots.shelves), self.rows
        on = {p: next(s for s in shelves if s.start <= p < s.stop) for p in self.free}
        places, new = [0] * len(firsts), []
        for i, first in enumerate(firsts):
            fits = [p for p in self.free if on[p].base <= first or not self.split]
            if not fits:
                new.append(i)
                continue
            places[i] = max(fits, key=lambda p: (on[p].base, -p))
            self.free.remove(places[i])
            if on[places[i]].base > first:  # unsplit: the one shelf reaches back further
                shelves[0] = shelves[0]._replace(base=first)
        new.sort(key=lambda i: firsts[i])
        for rank, i in enumerate(new):
            places[i] = rows + rank
        if new:
            ordered = np.asarray([firsts[i] for i in new], dtype=np.int64)
            for r in runs(ordered, end, self.group) if self.split else [Run(0, len(new), 0)]:
                # From the run's oldest row's first slot (runs' `first` may be earlier for empty rows).
                first, last, count = int(ordered[r.start]), shelves[-1] if shelves else None, r.stop - r.start
                if last is not None and (not self.split or (last.base <= first
                                                            and count * (first - last.base) <= self.group)):
                    shelves[-1] = Shelf(last.start, last.stop + count, min(last.base, first))
                else:
                    shelves.append(Shelf(rows + r.start, rows + r.stop, first))
        self.slots.shelves = shelves
        return places

    def _shift(self, by: int) -> None:
        for c in self._kv:
            c.shift(by)
        self.slots.shelves = [s._replace(base=s.base + by) for s in self.slots.shelves]
        self.slots.held = np.pad(self.slots.held, [(0, 0), (by, 0)])

    def begin(self, fed: Sequence[int], flat: bool = False) -> None:
        """Before a pass feeding `fed[i]` real positions of row i (the rest padding, or `flat`)."""
        for c in self.states:
            c.mark()
        self.slots.begin(fed, flat)

    def commit(self, width: int, fed: Sequence[int]) -> None:
        """After a pass is built: row i holds the `fed[i]` positions it fed, as if every draft
        holds (what a row does not keep is taken back once judged: `take_back`)."""
        self.slots.commit(width, fed)
        self._open = [*self._open[-1:], width]
        for window in {c.window for c in self._kv if c.window is not None}:
            # Slots of the passes not judged yet may be taken back: the window keeps them too.
            needed = self._needed(window + 1 + sum(self._open))
            for c in self._kv:
                if c.window == window:
                    c.forget(needed)

    def take_back(self, row: int, entries: int, passes: int) -> None:
        """Take back the newest `entries` entries of `row`, which the last `passes` committed
        passes added (drafts it did not keep, a pass queued behind one whose token for the row was
        not the one fed, or that the row left): its state layers go back to before those passes,
        so where it has any, all of those passes' entries are taken back."""
        for c in self.states:
            c.restore([row], passes)
        if entries:
            self.slots.release(row, entries)

    def _needed(self, last: int) -> int:
        """The first slot holding one of some row's `last` newest entries."""
        firsts = [where[-last] if len(where) >= last else where[0]
                  for where in map(np.flatnonzero, self.slots.held) if len(where)]
        return int(min(firsts, default=self.slots.end))

    def drop(self, rows: Sequence[int]) -> None:
        """Free these rows (nothing is moved); with none held any more, the buffer is emptied."""
        for i in rows:
            self.slots.release(i)
        self.free = sorted({*self.free, *rows})
        if len(self.free) == self.rows:
            self.slots.held = np.zeros((0, 0), dtype=bool)
            self.slots.lengths, self.free, self.slots.shelves = [], [], []
            for c in self._kv:
                c.clear()
            for c in self.states:
                c.clear()

    def untidy(self, joining: bool) -> bool:
        """Whether the buffer is worth copying smaller (`compact`): free rows are half of it or
        more (and no sequence is about to take them), or empty slots make it much longer than
        its longest row."""
        longest = max(self.slots.lengths, default=0)
        free = not joining and 2 * len(self.free) >= self.rows > 0
        return free or self.slots.end > longest * (1 + HOLES) + GROW

    def compact(self, joining: bool = False) -> list[int]:
        """Drop the free rows and move every row's entries to the end of a buffer as long as the
        longest row (a copy); split, the rows longest first, on shelves cut as `runs` cuts rows.
        Shelves no row holds any more are dropped first, with nothing copied, and where that
        leaves the batch tidy, nothing is. Returns the rows kept, by their old numbers, in their
        new order."""
        first = self._drop_shelves()
        if first is not None and not self.untidy(joining):
            return first
        kept = self._gather()
        return kept if first is None else [first[i] for i in kept]

    def _drop_shelves(self) -> list[int] | None:
        """Drop the shelves whose rows are all free (their buffers go, no other row moves): the
        rows kept, by their old numbers, or None where there is none to drop."""
        free = set(self.free)
        gone = [i for i, s in enumerate(self.slots.shelves) if free.issuperset(range(s.start, s.stop))]
        if not gone or len(gone) == len(self.slots.shelves):
            return None
        kept = [p for i, s in enumerate(self.slots.shelves) if i not in gone for p in range(s.start, s.stop)]
        for c in self._kv:
            c.drop_shelves(gone, kept)
        for c in self.states:
            c.keep(kept)
        shelves, at = [], 0
        for i, s in enumerate(self.slots.shelves):
            if i not in gone:
                shelves.append(Shelf(at, at + s.stop - s.start, s.base))
                at += s.stop - s.start
        where = {p: j for j, p in enumerate(kept)}
        self.slots.shelves = shelves
        self.slots.held = self.slots.held[kept]
        self.slots.lengths = [self.slots.lengths[p] for p in kept]
        self.free = sorted(where[p] for p in free if p in where)
        return kept

    def _gather(self) -> list[int]:
        free = set(self.free)
        kept = [i for i in range(self.rows) if i not in free]
        if self.split:
            kept.sort(key=lambda i: -self.slots.lengths[i])
        held = self.slots.held[kept]
        lengths = [self.slots.lengths[i] for i in kept]
        longest = max(lengths)
        order = np.zeros((len(kept), longest), dtype=np.int32)
        for j, n in enumerate(lengths):
            order[j, longest - n:] = np.flatnonzero(held[j])
        old = self.slots.shelves
        firsts = longest - np.asarray(lengths)
        cuts = runs(firsts, longest, self.group) if self.split else [Run(0, len(kept), 0)]
        self.slots.shelves = [Shelf(r.start, r.stop, int(firsts[r.start : r.stop].min())) for r in cuts]
        for c in self._kv:
            c.gather(kept, old, order, lengths)
        if kept != list(range(self.rows)):
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
