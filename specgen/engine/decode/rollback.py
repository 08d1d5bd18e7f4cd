"""Undoing the cache entries of rejected draft tokens, on every cache type mlx-lm has.

KV caches are trimmed back past them (cheap, and what plain KV models always get). So are sliding-
window caches past their wrap after a multi-token pass, which leaves their entries in time order
behind a whole window (`_cuttable`). Caches that cannot be trimmed (the state caches of linear-
attention and state-space layers; a wrapped window after a one-token pass) are restored instead:
before a pass that may be undone, `mark` keeps each such cache's state by reference (MLX arrays
are values: a reference is a snapshot, and no data is copied unless the cache later updates a
buffer in place), and `rewind_to` puts every layer back at that mark. The tokens accepted since
the mark are then missing from the cache: `cached` says how many entries it holds, and the decode
loop feeds the rest again with its next pass (which it runs anyway), so a restore costs a wider
pass, not an extra one.
"""

from __future__ import annotations

from typing import Sequence

import mlx.core as mx
from mlx_lm.models.cache import RotatingKVCache


class _Saved:
    """A cache object's attributes as they were (nested caches, as in CacheList, included)."""

    def __init__(self, obj):
        self.obj, self.attrs = obj, _snapshot(vars(obj))

    def restore(self):
        self.obj.__dict__.update(_restored(self.attrs))
        return self.obj


def _snapshot(value):
    """A copy of a cache's attributes that later in-place updates of its buffers cannot change
    (all of them, not `state`, whose fields differ between mlx-lm versions)."""
    if isinstance(value, mx.array):
        return mx.array(value)  # a new array object on the same data
    if isinstance(value, (list, tuple)):
        return type(value)(_snapshot(v) for v in value)
    if isinstance(value, dict):
        return {k: _snapshot(v) for k, v in value.items()}
    if hasattr(value, "is_trimmable") and hasattr(value, "__dict__"):
        return _Saved(value)
    return value


def _restored(value):
    if isinstance(value, mx.array):
        return mx.array(value)  # the snapshot stays intact for another rewind to the same mark
    if isinstance(value, _Saved):
        return value.restore()
    if isinstance(value, (list, tuple)):
        return type(value)(_restored(v) for v in value)
    if isinstance(value, dict):
        return {k: _restored(v) for k, v in value.items()}
    return value


def _cuttable(c, n: int) -> bool:
    """Whether a wrapped sliding-window cache can drop its newest `n` entries by slicing: after a
    multi-token pass, mlx-lm's RotatingKVCache holds its entries in time order (its write index at
    the end), the window before the pass (max_size - 1 entries) and then the pass's own. Cutting
    the rejected ones off leaves a whole window, or all the history, which its next update reads
    exactly as it reads its own buffers; after a one-token pass the oldest entry is overwritten."""
    keys = getattr(c, "keys", None)
    return (type(c) is RotatingKVCache and keys is not None and c._idx == keys.shape[2]
            and (keys.shape[2] - n >= c.max_size or keys.shape[2] == c.offset))


def _cut(c, n: int) -> None:
    c.keys, c.values = c.keys[..., : c._idx - n, :], c.values[..., : c._idx - n, :]
    c.offset -= n
    c._idx -= n


MARKS = 2  # marks kept: a pass in flight and the one queued behind it (loop.py)


class Rollback:
    """Tracks how many entries the cache holds, and takes it back to fewer on request."""

    def __init__(self, cache: Sequence):
        self.cache = cache
        self.cached = 0  # entries in the cache, tracked here so rewinds need no cache internals
        # Caches that are, or may become (a sliding window that wraps), impossible to trim.
        self.restorable = [c for c in cache if not c.is_trimmable() or getattr(c, "max_size", None)]
        self._kv = [c for c in cache if not any(c is r for r in self.restorable)]  # always trimmable
        # A rejected draft always follows a multi-token pass, so windows of this type are cut.
        kinds = sorted({type(c).__name__ for c in self.restorable if type(c) is not RotatingKVCache})
        self.how = f"restore ({', '.join(kinds)})" if kinds else "trim"
        # mlx-lm's max_kv_size caches keep their first tokens, which its multi-token passes mask
        # out of some rows (one-token steps never do): no verify pass could match plain decoding.
        self.unsupported = ("a rotating cache that keeps its first tokens (max_kv_size) attends "
                            "differently in multi-token passes"
                            if any(getattr(c, "keep", 0) for c in self.restorable) else None)
        self._marks: list[tuple[int, list]] = []  # (entries then, saved states), oldest first

    def mark(self) -> None:
        """Remember the state of the caches that may not trim, before a pass that may be undone
        (the last MARKS: a pass in flight, and one queued behind it, may each be undone)."""
        if self.restorable:
            self._marks = [*self._marks[1 - MARKS:], (self.cached, [_Saved(c) for c in self.restorable])]

    def fed(self, n: int) -> None:
        """The model just processed `n` more positions."""
        self.cached += n

    def rewind_to(self, n: int) -> None:
        """Hold at most the first `n` entries: exactly `n` where every cache can be trimmed, else
        the entries at the latest mark that held at most `n` (`cached` tells)."""
        if self.cached <= n:
            return
        drop = self.cached - n
        if all(c.is_trimmable() or _cuttable(c, drop) for c in self.restorable):
            for c in self.cache:
                if c.is_trimmable():
                    c.trim(drop)
                else:
                    _cut(c, drop)
            self.cached = n
            return
        at, states = next((m for m in reversed(self._marks) if m[0] <= n), (None, None))
        if at is None:
            raise RuntimeError("rollback past the marks")  # a decode-loop bug, not user input
        for c in self._kv:
            c.trim(self.cached - at)
        for saved in states:
            saved.restore()
        self.cached = at
