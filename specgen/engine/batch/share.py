"""Prefix sharing: a prompt's prefill is paid once where rows share its first tokens (an agent's
system prompt and tools, a chat template's default system prompt, one prompt sampled n times).

A waiting row about to prefill takes the entries another row already computed for the same first
tokens, as many as the prompts agree on and the other has computed, then prefills only the rest.
Those entries come from a pass of another shape than the row's own prefill, as the entries of a
prompt cache hit and of every batched step do: equal here, where a prefill's entries do not
depend on the positions beside them, and elsewhere within the last bits the near-tie rule guards
(decode/sampling.py).

Entries come from a waiting row's own cache (copied, then cut back where its layers allow), from
the own cache a row had when it joined, kept (`parked`) only while a waiting row gains from it
most (a full batch may make that row wait until the other has left), or from an active row of the
batch cache where it holds only KV layers (a window forgets its oldest entries, a state cannot go
back). Where a row's cache cannot be cut back (a window that has wrapped, a state), only all it
holds can be taken, so a copy of it at the end of each chunk is parked too, while a waiting row
gains most from it: the prefix two prompts share ends mid-chunk, before the row that computed it
goes on past.
"""

from __future__ import annotations

import copy
from typing import Sequence

import numpy as np
from mlx_lm.models.cache import KVCache, can_trim_prompt_cache

from specgen.engine.batch.cache import RaggedBatch
from specgen.engine.batch.row import Row


def shared_end(row: Row, donor: Row) -> int:
    """How far into its prompt `row`'s cache may hold `donor`'s entries: as far as their prompts
    agree and `donor` has computed, where `donor`'s cache can be cut back to that (else only its
    own end); row.prefilled if none is further."""
    if donor.prefilled <= row.prefilled:
        return row.prefilled
    held = min(donor.prefilled, len(row.seq.prompt) - 1)  # the last token is not prefilled
    differ = np.flatnonzero(row.ids[:held] != donor.ids[:held])
    upto = int(differ[0]) if len(differ) else held
    if upto <= row.prefilled or (donor.cache is not None and upto != donor.prefilled
                                 and not can_trim_prompt_cache(donor.cache)):
        return row.prefilled  # (a window or state of its own cache cannot be cut back)
    return upto


class Sharing:
    """Where a batch's waiting rows take entries from."""

    def __init__(self):
        self.parked: list[Row] = []  # copies of joined rows, each with the cache it joined with
        self.tokens = 0  # prompt tokens rows took, not prefilled

    def catch_up(self, row: Row, waiting: Sequence[Row], active: Sequence[Row], batch: RaggedBatch) -> None:
        """Give `row` (waiting, with a cache of its own) the furthest entries another row computed
        for it."""
        # (An active row joining this step still has its own cache; the batch's, only KV layers.)
        donors = [*waiting, *self.parked, *(r for r in active if r.cache is not None or batch.prefixes)]
        best, upto = None, row.prefilled
        for donor in donors:
            if donor is not row and (end := shared_end(row, donor)) > upto:
                best, upto = donor, end
        if best is not None:
            self.tokens += upto - row.prefilled
            row.shared += upto - row.prefilled
            row.cache, row.prefilled = _entries(best, upto, batch), upto

    def joined(self, rows: Sequence[Row], waiting: Sequence[Row]) -> None:
        """`rows` are joining the batch (their own caches still set): keep each some waiting row
        gains most from (it may leave the batch before that row has a place); drop what none does."""
        self.parked += [copy.copy(r) for r in rows]
        self._keep(waiting)

    def advanced(self, row: Row, waiting: Sequence[Row]) -> None:
        """`row` (waiting) prefilled another chunk. Where its cache cannot be cut back (a window
        that has wrapped, a state), keep a copy as it is now if a waiting row gains most from it:
        once `row` goes on, what it holds now is gone."""
        if can_trim_prompt_cache(row.cache):
            return
        now = copy.copy(row)
        self.parked.append(now)
        self._keep(waiting)
        if any(d is now for d in self.parked):
            now.cache = copy.deepcopy(row.cache)

    def _keep(self, waiting: Sequence[Row]) -> None:
        """Drop every parked row but those some waiting row gains most from (the first of equals)."""
        kept = set()
        for w in waiting:
            gains = [shared_end(w, d) for d in self.parked]
            if gains and max(gains) > w.prefilled:
                kept.add(gains.index(max(gains)))
        self.parked = [d for i, d in enumerate(self.parked) if i in kept]


def _entries(donor: Row, upto: int, batch: RaggedBatch) -> list:
    """A single-sequence cache of `donor`'s first `upto` prompt entries (`shared_end` says where
    its layers can give them)."""
    if donor.cache is None:
        return batch.row_cache(donor.place, upto)
    return [_first(c, upto, donor.prefilled - upto) for c in donor.cache]  # its own (waiting, parked)


def _first(layer, upto: int, past: int):
    """A copy of one layer of a cache holding `upto + past` entries, holding the first `upto`: an
    attention layer's sliced (a few shared tokens of a long prompt copy only those), any other
    copied whole and cut back."""
    if type(layer) is KVCache and layer.keys is not None:
        cut = KVCache()
        cut.keys, cut.values, cut.offset = layer.keys[..., :upto, :], layer.values[..., :upto, :], upto
        return cut
    cut = copy.deepcopy(layer)
    if past:
        cut.trim(past)
    return cut
