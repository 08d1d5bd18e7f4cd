"""From a measured verify-cost curve to what the drafter and the loop use (model-free):

- `relative`: seconds per forward pass by positions -> costs relative to one position;
- `cost_function`: cost(k) for k drafted tokens (k + 1 positions), interpolated;
- `queue_after`: after how many silent drafter steps plain steps are queued ahead, given what
  queuing ahead saves on this machine (the overlap);
- `drafting_cost`: the cost the drafter weighs drafts with under that policy and rollback;
- `step_prices`: what a drafting step costs in the plain steps it competes with, and what queuing a
  pass behind another hides (the decode loop's scale);
- `cannot_pay`: whether timing wider passes can stop (no wider draft could pay);
- `unprofitable`: whether drafting cannot pay at all on this curve (then speculation is off).

calibrate.py measures the curve and the overlap; this module decides what they mean.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass

from specgen.draft.length import CostFn, Refeed

# Queuing plain steps ahead: after how many silent drafter steps, by what it saves (the overlap).
# (overlap above which, silent steps), first match wins; see docs/design.md for the replays. The
# adaptive drafter's schedule weighs each plain pass itself (schedule.py): queuing is on wherever
# it saves anything.
QUEUE_AFTER = ((0.15, 1), (0.0, 2))
# ...but after one wherever it pays at all and a drafted token costs this share of a step or more:
# there an empty draft, weighed as saving the overlap, beats a weak guess (docs/design.md).
QUEUE_SOON_SLOPE = 0.25
# Where verifying a drafted token costs this share of a plain step or more at every draft length,
# drafts lose on real outputs (docs/design.md): speculation is turned off and decoding is mlx-lm's.
STEEP = 0.5
# Two widths in a row costing this share of as many single positions: no wider one can pay, and
# calibration times none (docs/design.md).
CANNOT_PAY = 0.9


@dataclass(frozen=True)
class Curve:
    """A model's measured verify cost: `relative[n]` is a forward pass over n positions relative
    to one position; `overlap` is the share of a plain step that queuing it ahead saves; `eager`:
    every how many layers a synchronous pass starts running while it is built (decode/eager.py; 0: once
    it is built), as the passes were timed."""

    relative: dict[int, float]
    overlap: float = 0.0
    eager: int = 0


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


def cost_function(curve: dict[int, float]) -> CostFn:
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
        if i == 0:  # a one-point curve
            return vals[0]
        s0, s1, v0, v1 = sizes[i - 1], sizes[i], vals[i - 1], vals[i]
        return v0 + (v1 - v0) * (n - s0) / (s1 - s0)

    return cost


def token_cost(curve: Curve) -> float:
    """What verifying one drafted token adds to a plain step, as a share of it."""
    return cost_function(curve.relative)(1) - 1.0


def queue_after(curve: Curve) -> int | None:
    """The loop's queue_after for a measured curve: queue ahead only where it pays, and sooner
    where it saves more (QUEUE_AFTER) or where drafts are dear (QUEUE_SOON_SLOPE)."""
    after = next((n for above, n in QUEUE_AFTER if curve.overlap > above), None)
    return 1 if after and token_cost(curve) >= QUEUE_SOON_SLOPE else after


def drafting_cost(cost: CostFn, overlap: float, ahead: int | None, refeed: bool = False) -> CostFn:
    """The cost the drafter weighs drafts with. Where the loop queues plain passes ahead (`ahead`,
    its queue_after, is not None), drafting nothing saves `overlap` of a step, so it costs that
    much less, and a draft costs that much more: the step after it is built once its verdict is
    read (mostly: a pass is queued behind a draft only where it is likely to hold whole). Where a
    rejected draft is undone by restoring the cache (`refeed`, decode/rollback.py), the tokens accepted
    before the rejection are fed again with the next pass: length.Refeed charges that by its
    chance."""
    saved = overlap if ahead is not None else 0.0
    weighed = cost if not saved else (lambda k: cost(k) + (saved if k else -saved))
    return Refeed(weighed, cost) if refeed else weighed


@dataclass(frozen=True)
class StepPrices:
    """What the decode loop weighs its steps with, in units of the plain step it competes with
    (queued ahead where the loop queues plain steps): `price(k)`, a synchronous step drafting k
    tokens; `gap`, the host's time that queuing a pass behind another hides (its read-back,
    judging, drafting and building the next graph); `eager`, how its synchronous passes run, which
    the prices assume (Curve.eager)."""

    price: CostFn
    gap: float
    eager: int = 0

    def queue_behind(self, chance: float, drafts: int) -> bool:
        """Whether to queue a pass of `drafts` drafts behind one whose drafts all hold with
        `chance` (else the queued pass is dropped, its device time lost): the gap it hides,
        weighed by the chance, beats the pass's own device time, weighed by the rest."""
        return chance * self.gap > (1.0 - chance) * (self.price(drafts) - self.gap)


def step_prices(cost: CostFn, curve: Curve, ahead: int | None) -> StepPrices:
    """The loop's StepPrices from the measured curve (`cost`, its cost function), where the loop
    queues passes ahead (`ahead`, its queue_after, not None) and where it does not (then no gap
    is hidden, and plain steps are synchronous)."""
    plain = 1.0 - curve.overlap if ahead is not None else 1.0
    return StepPrices(lambda k: cost(k) / plain, (1.0 - plain) / plain, curve.eager)


def cannot_pay(seconds: dict[int, float]) -> bool:
    """Whether no pass wider than those timed (`seconds` by positions, the narrowest one) can pay:
    the two widest each cost CANNOT_PAY of as many single positions. One alone may be a kernel
    switch: on an H200 an 8B model's 4-bit passes cost 1.6 plain ones at 2 positions, 2.5 at 4-16."""
    sizes = sorted(seconds)
    one = seconds[sizes[0]]
    return len(sizes) >= 3 and all(seconds[k] >= CANNOT_PAY * k / sizes[0] * one for k in sizes[-2:])


def unprofitable(curve: Curve) -> str | None:
    """Why speculation cannot pay on this curve (a drafted token costs STEEP of a step or more at
    every width timed), or None where it can. The cheapest width counts, not the narrowest: on a
    GPU's 4-bit kernels one drafted token may cost half a step while fifteen cost 0.1 each."""
    extra = min(((cost - 1.0) / (n - 1) for n, cost in curve.relative.items() if n > 1), default=0.0)
    if extra < STEEP:
        return None
    return (f"verifying a drafted token costs {extra:.0%} of a plain step or more on this machine, "
            "too much to pay")
