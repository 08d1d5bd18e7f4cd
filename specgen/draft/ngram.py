"""N-gram tables: for each order k, the FNV-1a hash of k-1 tokens of context maps to the counts of
the token that followed it. The request's drafter, the fixed-length predictor and the memory all
count with `NGramTables`, which owns the best-token rule (the most frequent; ties: the newest).

Contexts are hashed newest token first, so one FNV-1a pass yields the keys of every order:
`context_keys(tokens, n)[j]` is the key of the last j tokens.
"""

from __future__ import annotations

from typing import Iterable

import numpy as np

FNV_OFFSET = 14695981039346656037
FNV_PRIME = 1099511628211
_MASK = (1 << 64) - 1


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


class Entry:
    """What followed one context: `counts` per token, their `total`, and the `best` token with
    its `count` (see `NGramTables.count` for the rule)."""

    __slots__ = ("best", "count", "counts", "total")

    def __init__(self, token: int, count: int = 1):
        self.best = token
        self.count = count
        self.counts = {token: count}
        self.total = count


class NGramTables:
    """One table per order from `max_order` down to `min_order` (longest context first)."""

    def __init__(self, max_order: int, min_order: int):
        self.max_order = max_order
        self.orders = list(range(max_order, min_order - 1, -1))
        self.tables: dict[int, dict[int, Entry]] = {k: {} for k in self.orders}
        self.by_order = [(k, self.tables[k]) for k in self.orders]  # lookups try them in this order

    @staticmethod
    def count(table: dict[int, Entry], key: int, token: int, n: int = 1) -> None:
        """Count `token` `n` more times after the context `key` of `table`. The best token is the
        most frequent; ties go to the most recently counted."""
        entry = table.get(key)
        if entry is None:
            table[key] = Entry(token, n)
            return
        entry.total += n
        c = entry.counts.get(token, 0) + n
        entry.counts[token] = c
        if c >= entry.count:
            entry.best = token
            entry.count = c

    def add(self, keys: list[int], token: int) -> None:
        """Count `token` after every context in `keys` (see `context_keys`) that is long enough."""
        n = len(keys)
        for k, table in self.by_order:
            if n >= k:
                # `count`, inlined: this runs for every order of every token fed.
                key = keys[k - 1]
                entry = table.get(key)
                if entry is None:
                    table[key] = Entry(token)
                    continue
                entry.total += 1
                counts = entry.counts
                c = counts.get(token, 0) + 1
                counts[token] = c
                if c >= entry.count:
                    entry.best = token
                    entry.count = c

    def find(self, keys: list[int]) -> tuple[int, Entry] | None:
        """(order, entry) of the longest context in `keys` that the tables know, or None."""
        n = len(keys)
        for k, table in self.by_order:
            if n >= k:
                entry = table.get(keys[k - 1])
                if entry is not None:
                    return k, entry
        return None

    def contexts(self) -> int:
        """How many contexts the tables hold, over all orders."""
        return sum(len(t) for t in self.tables.values())
