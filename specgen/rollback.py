"""Undoing the cache entries of rejected draft tokens.

KV caches are trimmed back past them. A sliding-window (rotating) cache can be trimmed only until
it wraps (`limit`); a state cache (linear attention, state-space layers) cannot be trimmed at all
(`stuck` says why).
"""

from __future__ import annotations

from typing import Sequence

from mlx_lm.models.cache import trim_prompt_cache


class Rollback:
    """Tracks how many entries the cache holds and trims it back on request."""

    def __init__(self, cache: Sequence):
        self.cache = cache
        self.cached = 0  # entries in the cache, tracked here so rewinds need no cache internals
        stuck = sorted({type(c).__name__ for c in cache if not c.is_trimmable()})
        self.stuck = f"the model's cache cannot be rolled back ({', '.join(stuck)})" if stuck else None
        sizes = [c.max_size for c in cache if getattr(c, "max_size", None)]
        self.limit = min(sizes) if sizes else None  # entries past which trimming is impossible

    def fed(self, n: int) -> None:
        """The model just processed `n` more positions."""
        self.cached += n

    def rewind_to(self, n: int) -> None:
        """Drop every entry past the first `n` (a no-op for caches that cannot be trimmed)."""
        if self.cached > n and not self.stuck:
            trim_prompt_cache(self.cache, self.cached - n)
            self.cached = n
