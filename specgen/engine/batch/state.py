"""A state layer (state-space, linear attention, short convolution) of a ragged batch: every
row's state in one of mlx-lm's ArraysCache (rows on axis 0, as its BatchGenerator keeps them).

A state cannot drop its newest tokens, so a row whose draft was partly rejected is taken back
whole: `mark` keeps every row's state before a pass (by reference: MLX arrays are values), and
`restore` puts the given rows back at it (or at the one before, for a pass queued behind); the
batch then feeds that row's accepted tokens again with its next pass, as decode/loop.py does for a restored cache alone. A step's padding (rows feed
fewer positions than the widest) is skipped by the lengths the model reads (`Slots.widths`): the
masks mlx-lm's batched state layers take for a ragged prompt."""

from __future__ import annotations

from typing import Sequence

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import ArraysCache

from specgen.engine.batch.slots import Slots


class RowStates(ArraysCache):
    """One state layer's states for every row of the batch."""

    def __init__(self, slots: Slots, size: int):
        super().__init__(size)
        self.slots = slots
        self.marks: list[list[mx.array | None]] = []  # the states before the last two passes

    @property
    def lengths(self) -> mx.array | None:
        # A new array object each read: a model's `advance` subtracts from it in place.
        return None if self.slots.widths is None else mx.array(self.slots.widths)

    @lengths.setter
    def lengths(self, value) -> None:
        # The step's lengths are the slots' own. mlx-lm's models count them down after a layer
        # (`advance`) for a prompt fed over several calls, which a batch step never is.
        pass

    def join(self, caches: Sequence[ArraysCache], rows: Sequence[int], total: int) -> None:
        """Hold each single-sequence cache's state in its row (`rows`, of `total` rows after the
        join: rows past the current ones are appended). A state none holds yet stays None."""
        for e, buf in enumerate(self.cache):
            theirs = [c.cache[e] for c in caches]
            like = buf if buf is not None else next((a for a in theirs if a is not None), None)
            if like is None:
                continue  # nobody's state exists yet: the model makes it (zeros) on first use
            have = 0 if buf is None else buf.shape[0]
            if total > have:
                zeros = mx.zeros((total - have, *like.shape[1:]), like.dtype)
                buf = zeros if buf is None else mx.concatenate([buf, zeros])
            for row, a in zip(rows, theirs):
                # A state not made yet (a one-token prompt) is zeros, as the model makes it.
                buf[row : row + 1] = 0 if a is None else a.astype(buf.dtype)
            self.cache[e] = buf

    def mark(self) -> None:
        """Keep every row's state before a pass that may be taken back (the last two passes': a
        pass may be queued behind one not read yet)."""
        self.marks = [*self.marks[-1:], [None if a is None else mx.array(a) for a in self.cache]]

    def restore(self, rows: Sequence[int], passes: int = 1) -> None:
        """Put these rows' states back to before the last `passes` passes (a state made since:
        back to zeros)."""
        pick = np.zeros(len(self.slots.lengths), dtype=bool)
        pick[list(rows)] = True
        for e, (now, then) in enumerate(zip(self.cache, self.marks[-passes])):
            if now is None:
                continue
            back = mx.array(pick).reshape(-1, *[1] * (now.ndim - 1))
            self.cache[e] = mx.where(back, then if then is not None else mx.zeros_like(now), now)

    def keep(self, rows: Sequence[int]) -> None:
        """Keep these rows only, in this order (the batch compacted)."""
        idx = mx.array(list(rows), mx.int32)
        self.cache = [None if a is None else a[idx] for a in self.cache]

    def clear(self) -> None:
        self.cache = [None] * len(self.cache)

    def row(self, row: int) -> ArraysCache:
        """A single-sequence cache holding this row's state (copied now, not a view that keeps
        the whole batch's state alive)."""
        out = ArraysCache(len(self.cache))
        out.cache = [None if a is None else mx.contiguous(a[row : row + 1]) for a in self.cache]
        return out
