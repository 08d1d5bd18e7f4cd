"""Running a synchronous pass while its graph is still being built.

MLX builds a forward pass's graph in Python and runs it once it is evaluated. mlx-lm's plain
decoding hides that building behind the device: it builds step n+1 while step n runs. A pass
that nothing runs ahead of (a draft verified once the step before was read, the first step) cannot
hide it: the device waits for the whole graph (on an 8B model's 32 layers, about a fifth of a
step; docs/design.md). `eager` evaluates such a pass a few layers at a time as they are built:
every `every`-th cache that a layer writes its new keys and values to starts evaluating them
(`mx.async_eval`), so the device runs the first layers while Python builds the rest. The tokens
are the same: only when the work is submitted changes. How many layers apart is the
calibration's choice (`CHOICES`): each evaluation costs a call, and on a GPU a command buffer.

`stoppable` uses the same points for a long prefill that a caller may drop: each layer is
evaluated as it is built and the caller asked whether to go on, so a dropped prompt stops within
one layer's share of a chunk rather than a whole chunk (docs/design.md, "Stopping a prefill").

Layers are reached through their caches, the one object of theirs every mlx-lm model hands on:
for the pass, each chosen cache's `update_and_fetch` is wrapped on that object alone, and put back
after. Layers without one (the state caches of state-space layers) are simply not points.
"""

from __future__ import annotations

from contextlib import contextmanager, nullcontext
from typing import Callable, Iterator, Sequence

import mlx.core as mx

# Layers (counted by their caches) between evaluations that the calibration times (docs/design.md:
# 1, 2, 4, 8 timed; on the proxy 1 and 2 come out ahead by turns).
CHOICES = (1, 2)
# Prefill pieces at least this long are stoppable between layers (where a caller may drop them):
# a shorter one ends soon anyway, and a sync a layer would add to its time to the first token.
STOPPABLE = 256


class Stopped(Exception):
    """A stoppable pass was stopped: the cache holds part of it (some layers' entries only)."""


def _eager(update):
    def update_and_fetch(keys, values, *args, **kwargs):
        mx.async_eval(keys, values)  # everything up to this layer's keys and values
        return update(keys, values, *args, **kwargs)

    return update_and_fetch


def _stoppable(update, stop: Callable[[], bool]):
    def update_and_fetch(keys, values, *args, **kwargs):
        mx.eval(keys, values)  # every layer up to this one, run now
        if stop():
            raise Stopped
        return update(keys, values, *args, **kwargs)

    return update_and_fetch


@contextmanager
def _wrapped(caches: Sequence, wrap) -> Iterator[None]:
    """Each of `caches`' `update_and_fetch` wrapped by `wrap` within it (on that object alone)."""
    points = [(c, vars(c).get("update_and_fetch")) for c in caches
              if hasattr(c, "update_and_fetch") and hasattr(c, "__dict__")]
    for c, _ in points:
        c.update_and_fetch = wrap(c.update_and_fetch)
    try:
        yield
    finally:
        for c, own in points:
            if own is None:
                del c.update_and_fetch  # the class's own again
            else:
                c.update_and_fetch = own


def eager(cache: Sequence, every: int):
    """Within it, passes over `cache` start evaluating every `every`-th layer's keys and values
    as soon as they are built (0: not at all)."""
    return _wrapped(cache[every - 1 :: every] if every else (), _eager)


def stoppable(cache: Sequence, stop: Callable[[], bool] | None, positions: int):
    """Within it, a pass of `positions` over `cache` runs a layer at a time and raises Stopped as
    soon as `stop()` says so (None, or a piece under STOPPABLE: it runs as it would)."""
    if stop is None or positions < STOPPABLE:
        return nullcontext()
    return _wrapped(cache, lambda update: _stoppable(update, stop))
