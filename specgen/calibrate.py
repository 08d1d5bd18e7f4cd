"""The verify-cost curve: how long a forward pass over k positions takes relative to one position,
measured once per model and machine and cached, so the drafter can weigh longer drafts against
what they really cost here (Leviathan et al. 2023, sec. 3.5, with a measured cost function).
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import tempfile
import time
from bisect import bisect_left
from pathlib import Path
from typing import Callable

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache, trim_prompt_cache

from .memory import cache_dir
from .report import queued_ahead

SIZES = (1, 2, 4, 8, 16, 32, 64)  # positions per forward pass that are timed
CONTEXT = 128  # tokens in the cache while timing (a short prompt's worth)
BUDGET_S = 1.5  # about how long a calibration may take
MAX_ROUNDS = 100  # rounds of all sizes at most (tiny models fit many in the budget)
# Queuing plain steps ahead: after how many silent drafter steps, by what it saves (the overlap).
# A queued step drafts nothing. `simulate --pipeline-after N --overlap X` on the shared traces
# (README): after 2 silent steps costs chat 1.5% of its predicted speedup with no overlap and
# breaks even near 4%; after 1 gains chat a further 1% at a 10% overlap (code edits lose 1-2%)
# and 3% at 20% (code loses under 1%), so it is used from 15%.
PIPELINE_AFTER = ((0.15, 1), (0.04, 2))  # (overlap above which, silent steps), first match wins
OVERLAP_STEPS = 8  # plain steps timed each way per round
OVERLAP_ROUNDS = (3, 25)  # fewest and most rounds; within that, as many as fit in BUDGET_S / 3


def blas() -> str:
    """The BLAS that MLX's CPU matmuls run on: a preloaded library (as the README's Linux benchmarks
    use), else the one the mlx wheel brings."""
    return os.environ.get("LD_PRELOAD", "").strip() or "bundled BLAS"


def machine_id() -> str:
    """What the curve depends on besides the model: this machine, its MLX device and version, and
    (on the CPU) the BLAS, which changes the curve's shape."""
    return (f"{platform.node()}|{platform.machine()}|{mx.default_device()}|mlx {mx.__version__}"
            f"|{blas()}")


def _primed_cache(model, tokens: list[int]):
    """A cache holding the first CONTEXT of `tokens` (a short prompt's worth), evaluated."""
    cache = make_prompt_cache(model)
    model(mx.array([tokens[:CONTEXT]], mx.uint32), cache=cache)
    mx.eval([c.state for c in cache])
    return cache


SAMPLE = "The quick brown fox jumps over the lazy dog, and then it runs back home again. "


def measure(model, sample: list[int], sizes=SIZES, budget_s: float = BUDGET_S) -> dict[int, float]:
    """Seconds of a forward pass (with argmax read-back, as a verify step does) per size.

    One position's time is the 25th percentile of the rounds (interference only ever adds time);
    every other size is that times the median, over rounds, of its time over one position's in
    the same round, so a burst of load that slows a whole round cancels out. `sample`: token ids
    the model knows (any text's), repeated to fill the context."""
    tokens = (sample * (CONTEXT + max(sizes)))[: CONTEXT + max(sizes)]
    cache = _primed_cache(model, tokens)

    def step(k):
        x = mx.array([tokens[CONTEXT : CONTEXT + k]], mx.uint32)
        t = time.perf_counter()
        mx.argmax(model(x, cache=cache)[0], axis=-1).tolist()
        dt = time.perf_counter() - t
        trim_prompt_cache(cache, k)
        return dt

    for k in sizes:  # warm-up: first calls compile kernels and allocate
        step(k)
    per_round = sum(step(k) for k in sizes)
    rounds = max(5, min(MAX_ROUNDS, int(budget_s / max(per_round, 1e-6))))
    times = {k: [] for k in sizes}
    for r in range(rounds):
        for k in (sizes if r % 2 == 0 else reversed(sizes)):
            times[k].append(step(k))
    one = statistics.quantiles(times[sizes[0]], n=4)[0]
    return {k: one * statistics.median(t / t1 for t, t1 in zip(v, times[sizes[0]]))
            for k, v in times.items()}


def relative(seconds: dict[int, float]) -> dict[int, float]:
    """Costs relative to one position, made non-decreasing by isotonic regression (adjacent
    violators are averaged, so one noisy spike does not raise every larger size) and >= 1."""
    sizes = sorted(seconds)
    blocks = []  # [sum, count] of pooled ratios
    for k in sizes:
        blocks.append([seconds[k] / seconds[sizes[0]], 1])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
            total, count = blocks.pop()
            blocks[-1][0] += total
            blocks[-1][1] += count
    values = [max(1.0, total / count) for total, count in blocks for _ in range(count)]
    return dict(zip(sizes, values))


def cost_function(curve: dict[int, float]) -> Callable[[int], float]:
    """cost(k) for k drafted tokens (k + 1 positions), interpolated linearly in the curve and
    extrapolated from its last two points."""
    sizes = sorted(curve)
    vals = [curve[s] for s in sizes]

    def cost(k: int) -> float:
        n = k + 1
        i = bisect_left(sizes, n)
        if i < len(sizes) and sizes[i] == n:
            return vals[i]
        if i == 0:
            return vals[0]
        if i == len(sizes):
            i -= 1
        s0, s1, v0, v1 = sizes[i - 1], sizes[i], vals[i - 1], vals[i]
        return v0 + (v1 - v0) * (n - s0) / (s1 - s0)

    return cost


def measure_overlap(model, sample: list[int]) -> float:
    """The share of a plain step's time saved by queuing the next one before reading it back
    (what mlx_lm.generate_step does): the median over rounds of the two ways' same-round ratio, as
    in `measure`, so a burst of load that slows a whole round cancels out; 0 when it saves nothing."""
    cache = _primed_cache(model, sample * CONTEXT)

    def steps(queue_ahead: bool) -> float:
        y = mx.array([sample[0]], mx.uint32)
        t = time.perf_counter()
        y = mx.argmax(model(y[None], cache=cache)[0, -1]).reshape(1)
        mx.async_eval(y)
        for _ in range(OVERLAP_STEPS):
            nxt = mx.argmax(model(y[None], cache=cache)[0, -1]).reshape(1)
            if queue_ahead:
                mx.async_eval(nxt)
            y.item()
            y = nxt
        y.item()
        dt = time.perf_counter() - t
        trim_prompt_cache(cache, OVERLAP_STEPS + 1)
        return dt

    per_round = steps(True) + steps(False)  # warm-up, and how long a round takes
    rounds = max(OVERLAP_ROUNDS[0], min(OVERLAP_ROUNDS[1], int(BUDGET_S / 3 / max(per_round, 1e-6))))
    ratios = []
    for r in range(rounds):  # alternating which way goes first
        if r % 2:
            ahead, synced = steps(True), steps(False)
        else:
            synced, ahead = steps(False), steps(True)
        ratios.append(ahead / synced)
    return max(0.0, 1.0 - statistics.median(ratios))


def pipeline_after(overlap: float) -> int | None:
    """`decode.generate`'s pipeline_after for a measured overlap: queue ahead only where it pays,
    and sooner where it saves more (see PIPELINE_AFTER)."""
    return next((n for above, n in PIPELINE_AFTER if overlap > above), None)


def drafting_cost(cost: Callable[[int], float], overlap: float,
                  ahead: int | None) -> Callable[[int], float]:
    """The cost the drafter weighs drafts with. Where a silent step gets the next one queued ahead
    (`ahead`, decode's pipeline_after, is 1), drafting nothing also saves `overlap` of the next
    step, so it costs that much less: in `simulate`, chat gains 0.4-2.6% at a 15-20% overlap and
    7-8% at 30%, code edits lose under 1%."""
    if ahead != 1 or not overlap:
        return cost
    return lambda k: cost(k) - overlap if k == 0 else cost(k)


def calibration_file() -> Path:
    return cache_dir() / "calibration.json"


def load_or_measure(model, model_key: str, sample: list[int], *, recalibrate: bool = False
                    ) -> tuple[dict[int, float], float, bool]:
    """The cached curve and overlap (see measure_overlap) for this model on this machine, or a
    fresh measurement (then cached).

    Returns (curve, overlap, measured_now). A damaged cache file is simply measured over.
    """
    path = calibration_file()
    key = f"{model_key}|{machine_id()}"
    try:
        store = json.loads(path.read_text())
        if not isinstance(store, dict):
            store = {}
    except (OSError, ValueError):
        store = {}
    entry = store.get(key)
    if not recalibrate and isinstance(entry, dict):
        try:
            return ({int(k): float(v) for k, v in entry["relative"].items()}, float(entry["overlap"]),
                    False)
        except (KeyError, ValueError, TypeError, AttributeError):
            pass
    seconds = measure(model, sample)
    curve = relative(seconds)
    overlap = measure_overlap(model, sample)
    store[key] = {"relative": {str(k): v for k, v in curve.items()}, "overlap": overlap,
                  "seconds": {str(k): v for k, v in seconds.items()}, "measured": time.time()}
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(store, f, indent=1)
    os.replace(tmp, path)  # atomic: a concurrent reader sees the old file or the new one
    return curve, overlap, True


def describe(curve: dict[int, float], overlap: float | None = None) -> str:
    """e.g. "cost x1.00/1.21/1.45/2.03 at 1/2/4/8 positions", and how plain steps run."""
    ks = [k for k in sorted(curve) if k <= 16]
    text = "cost x" + "/".join(f"{curve[k]:.2f}" for k in ks) + " at " + "/".join(map(str, ks)) + " positions"
    ahead = None if overlap is None else pipeline_after(overlap)
    if ahead is not None:
        text += f"; {queued_ahead(ahead)} (saves {overlap:.0%})"
    return text


def model_cost(loaded, *, recalibrate: bool = False):
    """(cost function for the drafter (see drafting_cost), curve, overlap, measured_now) for a
    registry.LoadedModel, from the cache or measured; (None, None, 0.0, False) when its cache
    cannot be rolled back (then nothing is speculated)."""
    from .decode import rollback_limit

    if rollback_limit(make_prompt_cache(loaded.model))[1]:
        return None, None, 0.0, False
    sample = list(loaded.tokenizer.encode(SAMPLE)) or [0]
    curve, overlap, fresh = load_or_measure(loaded.model, loaded.key, sample, recalibrate=recalibrate)
    return drafting_cost(cost_function(curve), overlap, pipeline_after(overlap)), curve, overlap, fresh
