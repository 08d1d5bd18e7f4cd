"""Which steps draft, and how far: the step policy shared by the decode loop and simulate's replay.

- A step starting at absolute position `pos` drafts at most `room(pos)` tokens: never past the
  tokens still allowed, nor past the model's context (a step emits up to room + 1 tokens).
- Queuing ahead: mlx-lm queues each plain step before reading the previous token back, so Python
  builds the next graph while the model runs. Here a pass is queued behind the one in flight as
  if that one's drafts all hold (`behind`), carrying the drafter's continuation; a drafter that
  has none (a fixed draft length) gets a plain step queued once it has had nothing to say
  `queue_after` steps in a row (0: every step, as mlx-lm; None: never queue). `cost.queue_after`
  says whether queuing pays on a machine; behind a draft the decode loop also weighs the risk
  (cost.StepPrices), which the replay leaves out.
- A plain pass queued behind a plain one is built before that one's token is known, so a draft
  that token would open waits a step. Given the `gap` queuing hides, the schedule learns per
  request what the drafter would have saved right after each such pass (`Drafter.saves`) and
  queues only while that costs less, on average, than the gap it hides.
"""

from __future__ import annotations

from typing import NamedTuple

from specgen.events import Ahead, Drafter


class Behind(NamedTuple):
    """What may be queued behind a pass: the drafter's continuation past it (None: it has none)
    and the drafts of the pass behind (None: none may be queued)."""

    ahead: Ahead | None
    drafts: list[int] | None


def draft_room(cap: int, pos: int, end: int, context_length: int | None) -> int:
    """The most tokens a step starting at absolute position `pos` may draft: at most `cap`, and
    short of `end` (prompt + max tokens) and of the model's context."""
    room = min(cap, end - pos - 1)
    if context_length is not None:
        room = min(room, context_length - pos - 1)
    return max(room, 0)


# Plain passes after which the drafter is assumed to have saved nothing, before a request's own
# (docs/design.md): a request starts out queuing plain passes, as mlx-lm does.
OPENS_PRIOR = 2


class Schedule:
    """The room of each step and whether the next one is queued ahead (see the module docstring).
    `gap`: what queuing a plain pass behind another hides, in plain steps (None: not weighed,
    plain passes are queued after `queue_after` silent steps whatever the drafter would save)."""

    def __init__(self, *, cap: int, end: int, context_length: int | None = None,
                 queue_after: int | None = None, gap: float | None = None):
        self.cap = cap
        self.end = end
        self.context_length = context_length
        self.queue_after = queue_after
        self.gap = gap
        self.silent = 0  # steps in a row for which the drafter had nothing
        # After plain passes that could have had one queued behind: how many, and what the drafts
        # the drafter would have made at once would have saved in all.
        self.asked = 0
        self.saved = 0.0
        self._asking = False  # the last plain pass was such a one: what the drafter says next tells

    def room(self, pos: int) -> int:
        return draft_room(self.cap, pos, self.end, self.context_length)

    def heard(self, drafted: bool) -> None:
        """Whether the drafter had something to say at this step."""
        self.silent = 0 if drafted else self.silent + 1

    def draft(self, drafter: Drafter, pos: int) -> list[int]:
        """The drafter's draft for a step at `pos` built once the step before was read."""
        room = self.room(pos)
        self._told(drafter, room)
        drafts = drafter.draft(room) if room > 0 else []
        self.heard(bool(drafts))
        return drafts

    def _told(self, drafter: Drafter, room: int) -> None:
        """Count what the drafter would save drafting now, where the pass before was a plain one
        that could have had a plain pass queued behind it (for `worth_queuing`)."""
        if self._asking:
            self._asking = False
            self.asked += 1
            self.saved += drafter.saves(room) if room > 0 else 0.0

    def worth_queuing(self) -> bool:
        """Whether to queue a plain pass behind a plain one: the pass queued hides the gap whatever
        comes, but a draft its token would open waits a step, losing what it would save; queue
        while that, on average after such passes, is less than the gap."""
        if self.gap is None:
            return True
        return self.saved / (self.asked + OPENS_PRIOR) < self.gap

    def fits(self, pos: int) -> bool:
        """Whether a token may still be emitted at absolute position `pos`."""
        return pos < self.end and (self.context_length is None or pos < self.context_length)

    def queue_next(self, pos: int) -> bool:
        """Whether the plain step after the one at `pos` is queued before `pos` is read back."""
        return self.queue_after is not None and self.silent >= self.queue_after and self.fits(pos + 1)

    def behind(self, drafter: Drafter | None, pos: int, drafts: list[int], queued: bool) -> Behind:
        """What may be queued behind a pass at `pos` verifying `drafts` (`queued`: itself queued
        behind another), before anything is read: the drafter's continuation past them (its first
        token a guess at the pass's own), less that guess, as the pass behind's drafts; without
        a continuation (or a `drafter`: not speculating), a plain step where `queue_next` says."""
        at = pos + len(drafts) + 1
        if self.queue_after is None or not self.fits(at):
            return Behind(None, None)
        room = self.room(at) + 1  # the continuation's first token guesses the pass's own
        ahead = drafter.continuation(drafts, room) if drafter is not None and room > 1 else None
        more = list(ahead.tokens[1:room]) if ahead is not None else []
        if drafts:  # behind a draft: its continuation or nothing (the loop prices the risk)
            return Behind(ahead, more if ahead is not None else None)
        if queued and drafter is not None:  # the pass before was read: would the drafter draft now?
            self._told(drafter, self.room(pos))
        if more:
            return Behind(ahead, more)
        if ahead is None:  # no continuations (a fixed draft length): plain passes after silent steps
            if queued and drafter is not None:
                self.heard(drafter.saves(self.room(pos)) > 0)
            return Behind(None, [] if self.queue_next(pos) else None)
        self._asking = True  # what the drafter says after this pass's token tells if queuing paid
        return Behind(ahead, [] if self.worth_queuing() else None)
