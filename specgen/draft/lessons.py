"""What the request's copies have taught it, from where they broke:

- `Substitutions`: single tokens the output puts in place of its source's (a renamed variable),
  confirmed when the output goes on with the source; copies then read and draft through them.
- `Hazards`: tokens after which the request's copies keep breaking (where the output inserts
  lines), after which copying on is judged less likely.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from specgen.draft.params import DrafterParams


class _Confirmed(NamedTuple):
    token: int  # the output's token in place of the source's
    times: int


class _Break(NamedTuple):
    pos: int  # source position where a copy broke
    was: int  # the source's token there
    now: int  # the output's


class Substitutions:
    """Single-token substitutions the output makes in what it copies. One is confirmed when the
    output, right after the token that broke a copy, goes on with what followed the source's
    token; once confirmed `seen` times, copies read and draft through it, until the output keeps
    the source's token instead."""

    def __init__(self, seen: int):
        self.seen = seen
        self.forward: dict[int, int] = {}  # source token -> the output's token in its place
        self.back: dict[int, int] = {}  # and back
        self._confirmed: dict[int, _Confirmed] = {}
        self.pending: _Break | None = None  # a break whose next token is awaited

    def broke(self, pos: int, was: int, now: int, substituted: bool) -> None:
        """A copy broke at source position `pos`, whose token `was` the draft had (or, if
        `substituted`, its substitute): the output has `now` there."""
        if substituted:
            if now == was:
                self._forget(was)
        elif now != was:
            self.pending = _Break(pos, was, now)

    def resumed(self, source: list[int], token: int) -> None:
        """`token` was emitted after a break: it confirms the substitution if the source had it next."""
        brk, self.pending = self.pending, None
        if brk is None or not (brk.pos + 1 < len(source) and source[brk.pos + 1] == token):
            return
        old = self._confirmed.get(brk.was)
        times = old.times + 1 if old is not None and old.token == brk.now else 1
        self._forget(brk.was)
        self._confirmed[brk.was] = _Confirmed(brk.now, times)
        if times >= self.seen:
            self.forward[brk.was] = brk.now
            self.back[brk.now] = brk.was

    def _forget(self, was: int) -> None:
        self._confirmed.pop(was, None)
        now = self.forward.pop(was, None)
        if now is not None and self.back.get(now) == was:
            del self.back[now]


@dataclass(slots=True)
class _HazardCounts:
    judged: int = 0
    breaks: int = 0


class Hazards:
    """Per preceding token, the request's copy tokens judged and how many broke; `odds` lowers a
    copy's odds after a token that breaks more often than this request's copies usually do, and
    never raises them (match lengths already say when copies hold)."""

    def __init__(self, params: DrafterParams):
        self.shrink = params.hazard_shrink
        self.base = params.hazard_base
        self.after: dict[int, _HazardCounts] = {}
        self.judged = 0
        self.breaks = 0

    def record(self, prev: int, broke: bool) -> None:
        """A copy token drafted after `prev` was judged."""
        counts = self.after.get(prev)
        if counts is None:
            counts = self.after[prev] = _HazardCounts()
        counts.judged += 1
        counts.breaks += broke
        self.judged += 1
        self.breaks += broke

    def odds(self, prev: int) -> float:
        """The factor (at most 1) on the odds that a copy token drafted after `prev` is accepted."""
        counts = self.after.get(prev)
        if counts is None:
            return 1.0
        usual = (self.breaks + self.base[0]) / (self.judged + self.base[1])
        rate = (counts.breaks + self.shrink * usual) / (counts.judged + self.shrink)
        return min(1.0, (1.0 - rate) / rate * usual / (1.0 - usual))
