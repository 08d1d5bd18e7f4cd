"""Which steps draft, and how far: the step policy shared by the decode loop and simulate's replay.

- A step starting at absolute position `pos` drafts at most `room(pos)` tokens: never past the
  tokens still allowed, nor past the model's context (a step emits up to room + 1 tokens).
- Queuing ahead: mlx-lm queues each plain step before reading the previous token back, so Python
  builds the next graph while the model runs. A verify step cannot be queued that way (what it
  feeds depends on what it accepts), so a plain step is queued only once the drafter has had
  nothing to say `queue_after` steps in a row (0: every step, as mlx-lm; None: never); the queued
  step drafts nothing. `policy.queue_after` says when that pays on a machine.
"""

from __future__ import annotations


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
        return (self.queue_after is not None and self.silent >= self.queue_after
                and pos + 1 < self.end
                and (self.context_length is None or pos + 1 < self.context_length))
