"""The n-gram draft predictor: FNV-1a-hashed frequency tables over a sliding token window.

For each order k (MIN_ORDER..MAX_ORDER) a table maps the hash of the k-1 preceding tokens to the
counts of the token that followed them. Drafting tries the longest context first and chains its
own predictions, stopping at the first position where no table knows the context.

Contexts are hashed newest token first, so one FNV-1a pass yields the keys of every order.
"""

from __future__ import annotations

from collections import deque
from typing import Iterable

import numpy as np

from . import defaults
from .errors import InputError

FNV_OFFSET = 14695981039346656037
FNV_PRIME = 1099511628211
_MASK = (1 << 64) - 1
BATCH_HASH = 32  # from this many tokens fed at once, hashing them together beats one at a time


def context_keys(tokens: list[int], longest: int) -> list[int]:
    """keys[j] = FNV-1a of the last j tokens, newest first (keys[0] is the offset basis)."""
    h = FNV_OFFSET
    keys = [h]
    i = len(tokens) - 1
    stop = i - longest
    while i > stop and i >= 0:
        h = ((h ^ tokens[i]) * FNV_PRIME) & _MASK
        keys.append(h)
        i -= 1
    return keys


def keys_along(tokens: list[int], start: int, longest: int) -> list[list[int]]:
    """context_keys(tokens[:i], longest) for every i from `start` on, all positions hashed at once
    (numpy's uint64 arithmetic wraps modulo 2^64 as FNV-1a's does): prompts come thousands at a time."""
    early = range(start, min(longest, len(tokens)))  # positions with a shorter context
    out = [context_keys(tokens[:i], longest) for i in early]
    first = max(start, longest)
    n = len(tokens) - first
    if n > 0:
        a = np.array(tokens, dtype=np.int64).astype(np.uint64)
        h = np.full(n, FNV_OFFSET, dtype=np.uint64)
        prime = np.uint64(FNV_PRIME)
        columns = [h.tolist()]
        for j in range(1, longest + 1):
            h = (h ^ a[first - j : first - j + n]) * prime
            columns.append(h.tolist())
        out.extend(map(list, zip(*columns)))
    return out


def fnv1a_64(tokens: Iterable[int]) -> int:
    """FNV-1a 64-bit over a sequence of token ids: per id, xor it in, then multiply (mod 2^64).

    For ids below 256 this equals byte-wise FNV-1a of those bytes, so the standard test vectors apply.
    """
    h = FNV_OFFSET
    for t in tokens:
        h = ((h ^ t) * FNV_PRIME) & _MASK
    return h


class NGramPredictor:
    """Drafts the next tokens from n-gram statistics of everything it has been fed.

    `window` bounds the history that contexts are read from; the tables keep every count.
    """

    def __init__(
        self,
        max_order: int = defaults.MAX_ORDER,
        window: int = defaults.WINDOW,
        min_order: int = defaults.MIN_ORDER,
    ):
        if not 2 <= min_order <= max_order:
            raise InputError(f"n-gram order must be at least {max(min_order, 2)} (got {max_order})")
        if window < 1:
            raise InputError(f"window must be at least 1 token (got {window})")
        self.max_order = max_order
        self.min_order = min_order
        self.window = window
        # Longest context first; each table: hash(context) -> [best, best count, {token: count}, total].
        self._orders = list(range(max_order, min_order - 1, -1))
        self._tables: dict[int, dict[int, list]] = {k: {} for k in self._orders}
        self._by_order = [(k, self._tables[k]) for k in self._orders]
        self._history: deque[int] = deque(maxlen=window)
        self._hashed = max_order - 1  # context tokens hashed per update (subclasses may hash more)

    @property
    def entries(self) -> dict[int, dict[int, list]]:
        """order -> {context hash: [best, best count, {token: count}, total]} (read and filled by memory)."""
        return self._tables

    @property
    def by_order(self) -> list[tuple[int, dict[int, list]]]:
        """(order, table) pairs, longest context first: the order lookups try them in."""
        return self._by_order

    @property
    def history(self) -> list[int]:
        """The tokens currently inside the window, oldest first."""
        return list(self._history)

    def update(self, token: int, keys: list[int] | None = None) -> list[int]:
        """Count `token` as the continuation of every context ending at the current position.

        `keys`: that context's keys if the caller has them (see `context_keys`); returned either
        way so subclasses need not hash again.
        """
        hist = self._history
        if keys is None:
            keys = context_keys(hist, self.max_order - 1)
        n = len(keys)
        for k, table in self._by_order:
            if n < k:
                continue
            key = keys[k - 1]
            entry = table.get(key)
            if entry is None:
                table[key] = [token, 1, {token: 1}, 1]
                continue
            entry[3] += 1
            counts = entry[2]
            c = counts.get(token, 0) + 1
            counts[token] = c
            # Ties go to the most recently seen token, which is this one.
            if c >= entry[1]:
                entry[0] = token
                entry[1] = c
        hist.append(token)
        return keys

    def forget_history(self) -> None:
        """Start a new sequence: later contexts will not reach back into the tokens fed so far."""
        self._history.clear()

    def update_batch(self, tokens: Iterable[int]) -> None:
        """Feed several tokens in order (e.g. the prompt, to seed the tables)."""
        tokens = list(tokens)
        longest = self._hashed
        if len(tokens) < BATCH_HASH or self.window < longest:
            for t in tokens:
                self.update(t)
            return
        tail = list(self._history)[-longest:]
        for t, keys in zip(tokens, keys_along(tail + tokens, len(tail), longest)):
            self.update(t, keys)

    def lookup(self, context: list[int]) -> int | None:
        """The most frequent continuation of `context`, longest order first; None if unseen."""
        found = self.lookup_keys(context_keys(context, self.max_order - 1))
        return None if found is None else found[1][0]

    def lookup_keys(self, keys: list[int]) -> tuple[int, list] | None:
        """(order, [best, best count, counts, total]) for the longest known context, given the keys
        from `context_keys`, or None."""
        n = len(keys)
        for k, table in self._by_order:
            if n >= k:
                entry = table.get(keys[k - 1])
                if entry is not None:
                    return k, entry
        return None

    def predict(self, n: int) -> list[int]:
        """Up to `n` drafted tokens, each predicted from the history extended by the ones before it."""
        hist = self._history
        ctx = [hist[i] for i in range(max(0, len(hist) - self.max_order + 1), len(hist))]  # a deque
        out: list[int] = []
        for _ in range(n):
            tok = self.lookup(ctx)
            if tok is None:
                break
            out.append(tok)
            ctx.append(tok)
        return out
