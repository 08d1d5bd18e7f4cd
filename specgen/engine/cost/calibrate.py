"""Measuring the verify-cost curve: how long a forward pass over k positions takes relative to
one position, and what queuing a plain step ahead saves (the overlap), once per model and
machine, cached in the cache directory (store.py; curve.py turns them into the drafter's cost
function). First it decides whether synchronous passes run eagerly (decode/eager.py: a few layers
evaluated at a time while the graph is built; it pays where building the graph is a real share of
a step), then times the curve and the overlap as the decode loop runs its passes, all over one
primed cache. Bounded by BUDGET_S: sizes are timed in increasing order while they fit in it, and
no wider once two in a row cost nearly as much as that many single positions
(`curve.cannot_pay`); the rounds are as many as fit in what is left.
"""
from __future__ import annotations

import statistics
import time
from functools import partial
from typing import NamedTuple

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache

from specgen.draft.length import CostFn
from specgen.engine.cost.curve import (
    Curve,
    StepPrices,
    cannot_pay,
    cost_function,
    drafting_cost,
    queue_after,
    relative,
    step_prices,
    unprofitable,
)
from specgen.engine.cost.store import (
    calibration_file,
    entry_key,
    flat,
    host_has_a_core,
    read_store,
    save_entry,
    unflat,
    valid_curve,
)
from specgen.engine.decode.eager import CHOICES, eager
from specgen.engine.decode.rollback import Rollback
from specgen.engine.decode.sampling import GREEDY
from specgen.engine.load.distributed import World, share
from specgen.store import CACHE_ENV

SIZES = (1, 2, 4, 8, 16, 32, 64)  # positions per forward pass that may be timed
CONTEXT = 32  # tokens in the cache while timing, at least (a short prompt; priming a slow model costs)
LONG_CONTEXT = 384  # ...and as many as this where priming them takes at most PRIME_S
PRIME_S = 1.0  # (attention over a long context makes small models' wide passes dearer)
BUDGET_S = 4.0  # about how long measuring the curve may take (warm-up included)
ROUNDS = (3, 100)  # fewest and most rounds of all sizes
OVERLAP_STEPS = 8  # plain steps timed each way per round
OVERLAP_ROUNDS = (5, 25)  # fewest and most rounds; within that, as many as fit in BUDGET_S / 6 (design.md)
OVERLAP_SLOW_S = 0.1  # steps slower than this are not timed for the overlap: it is negligible
OVERLAP_FLOOR = 0.05  # a timed overlap counts as at least this where the host has a core (design.md)
EAGER_GAIN = 0.03  # eager passes are kept where they save at least this share of a pass (design.md)
SAMPLE = "The quick brown fox jumps over the lazy dog, and then it runs back home again. "


Primed = tuple[list, Rollback]


def primed_cache(model, sample: list[int], fixed: bool = False) -> Primed:
    """A cache of `sample` repeated, CONTEXT tokens, or LONG_CONTEXT where the rest fits in PRIME_S
    (CONTEXT if `fixed`: ranks must agree), and what takes it back after each timed pass (`cached`:
    where timed tokens start). One per calibration (4-bit SmolLM2 on a CPU: two were 6.7 s of 11.7)."""
    tokens = (sample * LONG_CONTEXT)[:LONG_CONTEXT]
    cache = make_prompt_cache(model)
    back = Rollback(cache)
    t = time.perf_counter()
    model(mx.array([tokens[:CONTEXT]], mx.uint32), cache=cache)
    mx.eval([c.state for c in cache])
    back.fed(CONTEXT)
    if not fixed and (time.perf_counter() - t) / CONTEXT * (LONG_CONTEXT - CONTEXT) <= PRIME_S:
        model(mx.array([tokens[CONTEXT:LONG_CONTEXT]], mx.uint32), cache=cache)
        mx.eval([c.state for c in cache])
        back.fed(LONG_CONTEXT - CONTEXT)
    back.mark()
    return cache, back


def measure(model, sample: list[int], sizes=SIZES, fixed: bool = False, every: int = 0,
            primed: Primed | None = None) -> dict[int, float]:
    """Seconds of a forward pass with its read-back as a verify step reads it, per size. Sizes are
    timed in increasing order, each only if its warm-up and ROUNDS[0] rounds are expected to fit
    in the budget (the first two always are) and while a wider one could still pay
    (`curve.cannot_pay`); cost.cost_function extrapolates past the widest. One position's time is
    the 25th percentile of the rounds (interference only ever adds time); every other size is
    that times the median, over rounds, of its time over one position's in the same round, so a
    burst of load that slows a whole round cancels out. `sample`: token ids the model knows (any
    text's), repeated to fill the context. `fixed`: time the sizes up to 16, ROUNDS[0] rounds, with
    no decision taken on a time (ranks of an mlx.launch group run the same passes in lockstep).
    `every`: passes run eagerly so (decode/eager.py). `primed`: `primed_cache`'s (made if None)."""
    sizes = tuple(k for k in sizes if k <= 16) if fixed else sizes
    tokens = (sample * (LONG_CONTEXT + max(sizes)))[: LONG_CONTEXT + max(sizes)]
    cache, back = primed or primed_cache(model, sample, fixed)
    at = back.cached
    start = time.perf_counter()

    def step(k):
        x = mx.array([tokens[at : at + k]], mx.uint32)
        t = time.perf_counter()
        with eager(cache, every):
            logits = model(x, cache=cache)
        GREEDY.verify(logits[0], (), at, ())  # the loop's own read-back
        dt = time.perf_counter() - t
        back.fed(k)
        back.rewind_to(at)
        return dt

    step(sizes[0])  # the first calls compile kernels and allocate
    one, timed, last = step(sizes[0]), [sizes[0]], {}
    last[sizes[0]] = one
    for k in sizes[1:]:
        prev = timed[-1]
        guess = last[prev] * k / prev  # a pass at most as costly per position as the last one
        rounds_s = ROUNDS[0] * (sum(last.values()) + guess)
        if not fixed and len(timed) >= 2 and time.perf_counter() - start + 2 * guess + rounds_s > BUDGET_S:
            break
        step(k)
        last[k] = step(k)
        timed.append(k)
        if not fixed and cannot_pay(last):
            break
    per_round = sum(last.values())
    left = BUDGET_S - (time.perf_counter() - start)
    rounds = ROUNDS[0] if fixed else max(ROUNDS[0], min(ROUNDS[1], int(left / max(per_round, 1e-6))))
    times = {k: [] for k in timed}
    for r in range(rounds):
        for k in (timed if r % 2 == 0 else reversed(timed)):
            times[k].append(step(k))
    first = statistics.quantiles(times[timed[0]], n=4)[0]
    return {k: first * statistics.median(t / t1 for t, t1 in zip(v, times[timed[0]]))
            for k, v in times.items()}


def _ab(first, second) -> float:
    """The median over rounds of `first()`'s time over `second()`'s in the same round, the two
    alternating which goes first (as `measure`, so that a burst of load cancels out); as many
    rounds as OVERLAP_ROUNDS and BUDGET_S / 6 allow."""
    per_round = first() + second()  # warm-up, and how long a round takes
    rounds = max(OVERLAP_ROUNDS[0], min(OVERLAP_ROUNDS[1], int(BUDGET_S / 6 / max(per_round, 1e-6))))
    ratios = []
    for r in range(rounds):
        if r % 2:
            a, b = first(), second()
        else:
            b, a = second(), first()
        ratios.append(a / b)
    return statistics.median(ratios)


def measure_eager(model, sample: list[int], primed: Primed | None = None) -> int:
    """Every how many layers synchronous passes are evaluated (decode/eager.py): of eager.CHOICES, the
    fastest at a one- and an eight-position pass with their read-backs where EAGER_GAIN faster than
    not, else 0 (also where a pass is so slow, over OVERLAP_SLOW_S, that its graph is negligible).
    `primed` as in `measure`."""
    cache, back = primed or primed_cache(model, sample)
    at, tokens = back.cached, (sample * 8)[:8]

    def passes(every: int) -> float:
        t = time.perf_counter()
        for k in (1, 8):
            with eager(cache, every):
                logits = model(mx.array([tokens[:k]], mx.uint32), cache=cache)
            GREEDY.verify(logits[0], (), at, ())
            back.fed(k)
            back.rewind_to(at)
        return time.perf_counter() - t

    passes(0)  # the first passes of these widths compile their kernels (seconds on MLX's CUDA build)
    if passes(0) > 2 * OVERLAP_SLOW_S:
        return 0
    ratio, best = min((_ab(partial(passes, every), partial(passes, 0)), every) for every in CHOICES)
    return best if ratio <= 1.0 - EAGER_GAIN else 0


def measure_overlap(model, sample: list[int], one_s: float, every: int = 0,
                    primed: Primed | None = None) -> float:
    """The share of a plain step's time saved by queuing the next one before reading it back (as
    mlx_lm.generate_step does) over running each once the last was read (eagerly where `every`):
    the median of the two ways' same-round ratio (`_ab`), at least OVERLAP_FLOOR where the host has
    a core of its own (else at least 0); 0 when a step (`one_s`) is so slow that building the next
    graph is a negligible share of it (not timed). `primed` as in `measure`."""
    if one_s > OVERLAP_SLOW_S:
        return 0.0
    cache, back = primed or primed_cache(model, sample)
    at = back.cached

    def steps(queue_ahead: bool) -> float:
        y = mx.array([sample[0]], mx.uint32)
        t = time.perf_counter()
        for _ in range(OVERLAP_STEPS + 1):
            if not queue_ahead:  # as the loop's synchronous steps: read, then build the next pass
                y = mx.array([y.item()], mx.uint32)
            with eager(cache, 0 if queue_ahead else every):
                nxt = mx.argmax(model(y[None], cache=cache)[0, -1]).reshape(1)
            mx.async_eval(nxt)
            y.item()
            y = nxt
        y.item()
        dt = time.perf_counter() - t
        back.fed(OVERLAP_STEPS + 1)
        back.rewind_to(at)
        return dt

    # Read low where the host has a core, it prices drafts too cheaply and loses chat (design.md).
    saved = 1.0 - _ab(lambda: steps(True), lambda: steps(False))
    return max(OVERLAP_FLOOR if host_has_a_core() else 0.0, saved)


class Calibrated(NamedTuple):
    curve: Curve
    fresh: bool  # measured now (else read from the cache)
    warning: str | None  # the cache could not be read or written


def load_or_measure(model, model_key: str, sample: list[int], *, recalibrate: bool = False,
                    before_measuring=lambda: None, world: World | None = None) -> Calibrated:
    """This model's cost curve on this machine from the cache, or measured (then cached).
    A damaged entry is measured over; a cache that cannot be read or written is a warning.
    `before_measuring` is called before a measurement starts (to say why nothing happens yet).
    In an mlx.launch group (`world`), rank 0's cache decides, every rank measures the same passes
    (no queuing-ahead overlap nor eager passes: each would time them differently), and all use
    rank 0's curve."""
    path = calibration_file()
    key = entry_key(model_key) + (f"|{world.size} ranks" if world else "")
    warning = None
    try:
        cached = None if recalibrate else valid_curve(read_store(path).get(key))
    except (OSError, ValueError) as e:
        cached, warning = None, f"cannot read {path} ({e}); measuring again"
    if world is not None:
        cached = unflat(share(world, flat(cached) if world.rank == 0 else None))
    if cached is not None:
        return Calibrated(cached, False, warning)
    before_measuring()
    primed = primed_cache(model, sample, fixed=world is not None)  # once: each measure leaves it so
    every = 0 if world is not None else measure_eager(model, sample, primed)  # ranks time alike
    seconds = measure(model, sample, fixed=world is not None, every=every, primed=primed)
    if world is None:
        overlap = measure_overlap(model, sample, seconds[min(seconds)], every, primed)
        curve = Curve(relative(seconds), overlap, every)
    else:
        curve = unflat(share(world, flat(Curve(relative(seconds))) if world.rank == 0 else None))
        if world.rank != 0:
            return Calibrated(curve, True, None)  # rank 0 keeps the cache
    entry = {"relative": {str(k): v for k, v in curve.relative.items()}, "overlap": curve.overlap,
             "eager": curve.eager, "seconds": {str(k): v for k, v in seconds.items()}, "measured": time.time()}
    try:
        save_entry(path, key, entry)
    except OSError as e:
        warning = (f"cannot save the calibration to {path} ({e.strerror or e}); "
                   f"set {CACHE_ENV} to a writable folder")
    return Calibrated(curve, True, warning)


def warm_up(model, sample: list[int], sizes=SIZES) -> None:
    """One pass of each width over a fresh cache, read back: on a GPU the first pass of a width
    compiles its kernels (seen on an H100 with MLX's CUDA build), which would otherwise stall the
    first request that drafts that many tokens. A measured curve has run them already."""
    cache = make_prompt_cache(model)
    tokens = (sample * (1 + max(sizes) // max(len(sample), 1)))[: max(sizes)]
    back = Rollback(cache)
    back.mark()  # state caches are restored to empty after each pass
    for k in sizes:
        GREEDY.verify(model(mx.array([tokens[:k]], mx.uint32), cache=cache)[0], (), 0, ())
        back.fed(k)
        back.rewind_to(0)


class Costs(NamedTuple):
    """A model's verify cost as run and bench use it."""

    drafting: CostFn  # what the drafter weighs drafts with (cost.drafting_cost)
    step: CostFn  # what a step costs (the measured curve), for predictions
    curve: Curve
    queue_after: int | None  # the loop's queuing policy (cost.queue_after)
    prices: StepPrices  # steps in the plain steps they compete with (cost.step_prices)
    off: str | None  # why speculation cannot pay on this curve (cost.unprofitable), if it cannot
    fresh: bool  # measured now
    warning: str | None  # the cache could not be read or written


def model_costs(model, key: str, tokenizer, *, recalibrate: bool = False,
                before_measuring=lambda: None, world: World | None = None) -> Costs:
    """The cached or measured curve of a model (see `load_or_measure`), and what follows from it."""
    sample = list(tokenizer.encode(SAMPLE)) or [0]
    curve, fresh, warning = load_or_measure(model, key, sample, recalibrate=recalibrate,
                                            before_measuring=before_measuring, world=world)
    if not fresh and mx.default_device().type != mx.cpu:  # CPU kernels need no compiling
        warm_up(model, sample)
    step = cost_function(curve.relative)
    ahead = queue_after(curve)
    refeed = Rollback(make_prompt_cache(model)).how != "trim"
    return Costs(drafting_cost(step, curve.overlap, ahead, refeed), step, curve, ahead,
                 step_prices(step, curve, ahead), unprofitable(curve), fresh, warning)
