"""What a server keeps between requests, so that the next turn of a conversation (or the next step
of an agent loop) pays only for its new tokens: model caches and drafters, keyed by the tokens
they hold.

`PromptCache` is mlx-lm's LRUPromptCache (bounded by bytes): a trimmable cache is cut back to the
longest prefix a request shares with it, a state cache is reused only at the exact prefix it was
saved at. `DrafterCache` keeps the last few adaptive drafters by the tokens they were fed; a
request whose prompt continues one takes it and feeds it only the rest (feeding a 70K-token
conversation anew costs ~0.2 s). Both live on the worker thread.
"""

from __future__ import annotations

from typing import Sequence

from mlx_lm.models.cache import (
    LRUPromptCache,
    can_trim_prompt_cache,
    make_prompt_cache,
    trim_prompt_cache,
)

from specgen.draft.drafter import AdaptiveDrafter

DRAFTERS = 4  # drafters kept (each holds its conversation's tokens and tables)
ENTRIES = 64  # model caches kept at most, however small (mlx-lm's LRU also counts entries)


class PromptCache:
    """Model caches for one model, by the tokens each holds."""

    def __init__(self, model, max_bytes: int):
        self.model = model
        self.lru = LRUPromptCache(max_size=ENTRIES, max_bytes=max_bytes)

    def fetch(self, ids: Sequence[int]) -> tuple[list, int]:
        """(a cache to generate from, how many of `ids` it already holds: fewer than all, since
        the last prompt token is always fed). A fresh cache when nothing is shared."""
        if self.lru.max_bytes > 0:
            cache, rest = self.lru.fetch_nearest_cache("model", list(ids))
            if cache is not None:
                held = len(ids) - len(rest)
                if held < len(ids):
                    return cache, held
                if can_trim_prompt_cache(cache):  # the whole prompt: feed its last token again
                    trim_prompt_cache(cache, 1)
                    return cache, held - 1
        return make_prompt_cache(self.model), 0

    def store(self, tokens: Sequence[int], cache: list) -> None:
        """Keep `cache`, which holds exactly `tokens`."""
        if self.lru.max_bytes > 0 and tokens:
            self.lru.insert_cache("model", list(tokens), cache)

    @property
    def nbytes(self) -> int:
        return self.lru.nbytes


class DrafterCache:
    """The last few adaptive drafters, each with the settings it was made for."""

    def __init__(self, size: int = DRAFTERS):
        self.size = size
        self._kept: list[tuple[tuple, AdaptiveDrafter]] = []  # oldest first

    def take(self, ids: Sequence[int], settings: tuple) -> tuple[AdaptiveDrafter | None, int]:
        """(a drafter for `settings` fed a prefix of `ids`, the longest such, and how many tokens
        of `ids` it was fed), removed from the cache; (None, 0) when none continues `ids`."""
        best = None
        for i, (kept_settings, drafter) in enumerate(self._kept):
            fed = drafter.tokens
            if (kept_settings == settings and len(fed) <= len(ids)
                    and (best is None or len(fed) > len(self._kept[best][1].tokens))
                    and fed == list(ids[:len(fed)])):
                best = i
        if best is None:
            return None, 0
        _, drafter = self._kept.pop(best)
        return drafter, len(drafter.tokens)

    def __len__(self) -> int:
        return len(self._kept)

    def put(self, drafter: AdaptiveDrafter, settings: tuple) -> None:
        self._kept.append((settings, drafter))
        del self._kept[:-self.size]
