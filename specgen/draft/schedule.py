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
"""

from __future__ import annotations

from typing import NamedTuple

from specgen.draft.events import Ahead, Drafter


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


class Schedule:
    """The room of each step and whether the next one is queued ahead (see the module docstring)."""

    def __init__(self, *, cap: int, end: int, context_length: int | None = None,
                 queue_after: int | None = None):
        self.cap = cap
        self.end = end
        self.context_length = context_length
        self.queue_after = queue_after
        self.silent = 0  # steps in a row for which the drafter had nothing

    def room(self, pos: int) -> int:
        return draft_room(self.cap, pos, self.end, self.context_length)

    def heard(self, drafted: bool) -> None:
        """Whether the drafter had something to say at this step."""
        self.silent = 0 if drafted else self.silent + 1

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
        if ahead is not None:
            return Behind(ahead, list(ahead.tokens[1:room]))
        if queued and drafter is not None:
            self.heard(drafter.would_draft(self.room(pos)))
        return Behind(None, None if drafts or not self.queue_next(pos) else [])
