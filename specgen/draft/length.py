"""How long a draft should be: the Leviathan rule over a measured cost curve.

`cost(k)` is the relative cost of a verify step that drafts k tokens (k + 1 positions), one plain
step being cost(0) = 1 (calibrate measures it; `linear_cost` is simulate's model of it). On caches
restored rather than trimmed after a rejection (engine/decode/rollback.py), a draft rejected at its i-th token
also widens the next pass by i positions (the re-fed ones): a `Refeed` cost says what that adds,
and the rule charges it weighted by the chance of a rejection there.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Callable, Iterator

CostFn = Callable[[int], float]


@lru_cache(maxsize=None)  # one function per beta, so its table below is built once
def linear_cost(beta: float) -> CostFn:
    """cost(k) = 1 + beta * k: verifying k drafted tokens, relative to a one-token step."""
    return lambda k: 1.0 + beta * k


class Refeed:
    """A drafting cost on caches that re-feed accepted tokens after a rejection: called as `cost`;
    `step` is the curve that prices the re-fed positions."""

    def __init__(self, cost: CostFn, step: CostFn):
        self.cost, self.step = cost, step

    def __call__(self, k: int) -> float:
        return self.cost(k)


class CostTable:
    """cost(k) tabulated up to the longest draft, with the least extra cost per extra token from
    k drafts to any longer draft (`slope[k]`): drafting on from k cannot beat a best rate r once
    P_k <= slope[k] * r, since every later rate is at most the mediant of the rate at k and
    P_k / slope[k]. The chooser stops there, which changes no draft."""

    def __init__(self, cost: CostFn, longest: int):
        self.cost = [cost(k) for k in range(longest + 1)]
        step = cost.step if isinstance(cost, Refeed) else None  # prices re-fed positions, if any
        self.refeed = [step(i) - step(0) if step else 0.0 for i in range(longest + 1)]
        self.slope = [min(((self.cost[j] - self.cost[k]) / (j - k) for j in range(k + 1, longest + 1)),
                          default=float("inf")) for k in range(longest + 1)]

    @property
    def longest(self) -> int:
        return len(self.cost) - 1


@lru_cache(maxsize=8)
def cost_table(cost: CostFn, longest: int) -> CostTable:
    """The table of a cost function, shared by every drafter that uses it."""
    return CostTable(cost, longest)


def choose_length(chances: Iterator[float], table: CostTable, room: int, min_p: float) -> int:
    """How many of the drafts whose acceptance chances `chances` yields, in order, to verify.

    The chances are pulled one at a time, only while a longer draft could still pay, so the caller
    may compute each draft lazily; at most `room` are pulled (room <= table.longest).
    """
    # With q_i each draft's chance given the ones before it and P_i = q_1 * ... * q_i, a step
    # drafting k tokens yields 1 + P_1 + ... + P_k tokens on average (Leviathan et al. 2023,
    # sec. 3.5): draft the k that maximises that over the step's cost, cost(k), plus (restored
    # caches) the re-fed positions' cost when the i-th draft is the first rejected, P_(i-1) - P_i.
    # Extra costs only grow with k, so the slope bound still holds.
    cost, slope, refeed = table.cost, table.slope, table.refeed
    best_k, best_rate = 0, 1.0 / cost[0]
    p_all, gain, extra, i = 1.0, 0.0, 0.0, 0
    while i < room and p_all > slope[i] * best_rate:
        q = next(chances, None)
        if q is None:
            break
        if p_all * q < min_p:  # too unlikely to be worth judging further
            break
        i += 1
        extra += p_all * (1.0 - q) * refeed[i]
        p_all *= q
        gain += p_all
        rate = (1.0 + gain) / (cost[i] + extra)
        if rate > best_rate:
            best_k, best_rate = i, rate
    return best_k
