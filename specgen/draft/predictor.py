"""The fixed-length n-gram predictor (`--draft N`): the mission's plain drafter.

It counts every token it is fed in the n-gram tables, reading contexts from a sliding window of
the last `window` tokens (the tables are never pruned), and drafts by chaining its own
predictions: the longest known context's best token, appended, and again, stopping at the first
position no table knows or after `n` tokens.
"""

from __future__ import annotations

from collections import deque
from typing import Iterable

from specgen import defaults
from specgen.draft.ngram import NGramTables, context_keys, keys_along

BATCH_HASH = 32  # from this many tokens fed at once, hashing them together beats one at a time


class NGramPredictor:
    """Drafts up to `n` tokens from n-gram statistics of everything it has been fed."""

    def __init__(self, max_order: int = defaults.MAX_ORDER, window: int = defaults.WINDOW,
                 min_order: int = defaults.MIN_ORDER):
        self.max_order = max_order
        self.min_order = min_order
        self.window = window
        self.ngrams = NGramTables(max_order, min_order)
        self._history: deque[int] = deque(maxlen=window)

    @property
    def history(self) -> list[int]:
        """The tokens currently inside the window, oldest first."""
        return list(self._history)

    def update(self, token: int) -> None:
        """Count `token` as the continuation of every context ending at the current position."""
        self.ngrams.add(context_keys(self._history, self.max_order - 1), token)
        self._history.append(token)

    def feed(self, tokens: Iterable[int], verdict=None) -> None:
        """Feed tokens in order: the prompt, or what a step emitted (`verdict` is not needed)."""
        tokens = list(tokens)
        longest = self.max_order - 1
        if len(tokens) < BATCH_HASH or self.window < longest:
            for t in tokens:
                self.update(t)
            return
        tail = list(self._history)[-longest:]
        for t, keys in zip(tokens, keys_along(tail + tokens, len(tail), longest)):
            self.ngrams.add(keys, t)
            self._history.append(t)

    def forget_history(self) -> None:
        """Start a new sequence: later contexts will not reach back into the tokens fed so far."""
        self._history.clear()

    def lookup(self, context: list[int]) -> int | None:
        """The best continuation of `context`, longest order first; None if no table knows it."""
        found = self.ngrams.find(context_keys(context, self.max_order - 1))
        return None if found is None else found[1].best

    def draft(self, n: int) -> list[int]:
        """Up to `n` drafted tokens, each predicted from the history extended by the ones before it."""
        hist = self._history
        ctx = [hist[i] for i in range(max(0, len(hist) - self.max_order + 1), len(hist))]
        out: list[int] = []
        for _ in range(n):
            tok = self.lookup(ctx)
            if tok is None:
                break
            out.append(tok)
            ctx.append(tok)
        return out

    def recycle(self, inputs, predicted) -> None:
        """The fixed-length predictor drafts from its n-gram tables alone."""

    def saves(self, n: int) -> float:
        """Whether `draft(n)` would draft anything: 1.0 if so (its drafts' worth is not
        estimated: as if each saved a whole step), else 0.0."""
        return 1.0 if self.draft(min(n, 1)) else 0.0

    def chances(self) -> None:
        """Its drafts' chances are not estimated."""
        return None

    def continuation(self, drafts, room: int) -> None:
        """A fixed draft length (--draft N) is the user's choice: no pass is queued past one."""
        return None
