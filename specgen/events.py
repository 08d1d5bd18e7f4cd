"""Records that pass between the decode loop, its drafter and its callers (no mlx here, so that
model-free code such as simulate and stats can use them).

- `Prefilled`, `Step`: what `decode.generate` yields.
- `Verdict`: what the loop tells the drafter about its last draft.
- `Drafter`: what the loop asks of a drafter.
- `Ahead`: what a drafter would draft past a draft not yet verified.
- `Coming`: a sequence's next step, as a batch weighs a pass queued behind the one in flight.
- `PredictionCounts`: how the drafts from a caller's predicted output fared.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate
from operator import mul
from typing import Iterable, NamedTuple, Protocol, Sequence


@dataclass(frozen=True)
class Speculation:
    """Whether a run speculates, why not, and how a rejected draft is undone."""

    on: bool
    reason: str = ""  # why not, when off
    rollback: str = ""  # when on: "trim" (KV caches cut back) or "restore (<cache types>)"

    def __str__(self) -> str:
        """The JSON/summary form: "on: trim", "off: <reason>"."""
        if not self.on:
            return f"off: {self.reason}"
        return f"on: {self.rollback}" if self.rollback else "on"


@dataclass(frozen=True)
class Prefilled:
    """The prompt is in the cache."""

    prompt_tokens: int
    speculation: Speculation
    shared: int = 0  # prompt tokens taken from another sequence's cache in a batch, not prefilled


@dataclass(frozen=True)
class Step:
    """One target forward pass after prefill (two when `confirmed`: a near-tied row of the verify
    pass was recomputed as a one-position pass, see engine/decode/sampling.py).

    `tokens` were emitted (never a stop token or anything after one); the first `accepted` of them
    came from the draft; `drafted` tokens were verified. `stop_reason` is set on the last step:
    "stop" (EOS or a stop token), "max_tokens" or "context" (the model's context is full).
    """

    tokens: tuple[int, ...]
    drafted: int = 0
    accepted: int = 0
    stop_reason: str | None = None
    confirmed: bool = False
    stop_token: int | None = None
    queued: bool = False  # its pass was queued behind the one before, before that one was read


class Failed(NamedTuple):
    """A sequence ended by its own error (its grammar gave up): the other sequences go on."""

    error: Exception


class Verdict(NamedTuple):
    """What became of a draft: its first `accepted` tokens held, and (`rejected`) the next one was
    judged wrong; a draft cut short by a stop token has tokens that were never judged."""

    accepted: int
    rejected: bool

    @classmethod
    def of(cls, drafted: int, matched: int, emitted: int) -> "Verdict":
        """For a step that drafted `drafted` tokens, of which the first `matched` equal the target's
        choices, and emitted `emitted` tokens (fewer than matched + 1 after a stop)."""
        return cls(min(matched, emitted), matched < drafted and matched < emitted)


class Ahead(NamedTuple):
    """A drafter's continuation past a draft not yet verified (`Drafter.continuation`): the tokens
    it would draft next if that draft held (the first one a guess at the verify pass's own next
    token), the chance it gives that draft of holding whole, and each of its tokens' chance of
    holding given the ones before it."""

    tokens: list[int]
    chance: float
    chances: Sequence[float] = ()


class Coming(NamedTuple):
    """A sequence's next pass as a batch weighs it, seen before the pass in flight is read
    (`Sequence.coming`; or the pass built now, nothing in flight: `Sequence.planned`): the
    chance the pass in flight's drafts all hold (1.0 with none); the chance its drafter's guess
    at that pass's own next token holds; the drafts it would make past the guess; and, once that
    token is known, the drafted tokens its first j drafts are expected to keep, for j = 0, 1, ...
    (these may reach past `drafts`: a fixed-length drafter drafts only then)."""

    whole: float
    guess: float
    drafts: list[int]
    expected: list[float]

    @classmethod
    def of(cls, whole: float, guess: float, drafts: list[int], chances: list[float]) -> "Coming":
        """From each drafted token's chance of holding given the ones before it."""
        return cls(whole, guess, drafts, [0.0, *accumulate(accumulate(chances, mul))])

    @property
    def reach(self) -> int:
        """The most drafts it has chances for."""
        return len(self.expected) - 1

    def held(self, k: int, queued: bool) -> float:
        """Tokens its next pass yields, by their chances, with up to `k` drafts: in a pass queued
        behind (its drafts only, past the guess, lost with the pass in flight's), or in one built
        once the pass in flight is read."""
        if queued:
            return self.whole * (1.0 + self.guess * self.expected[min(k, len(self.drafts), self.reach)])
        return 1.0 + self.expected[min(k, self.reach)]


class PredictionCounts(NamedTuple):
    """Drafted tokens that came from the caller's prediction, and how many of them were accepted."""

    drafted: int = 0
    accepted: int = 0


class Drafter(Protocol):
    """What the decode loop (and simulate's replay) asks of a drafter."""

    def feed(self, tokens: Iterable[int], verdict: Verdict | None = None) -> None:
        """Take the prompt, or what a step emitted (with the verdict on the step's draft)."""

    def draft(self, room: int) -> list[int]:
        """Up to `room` tokens to verify next."""

    def saves(self, room: int) -> float:
        """What the draft `draft` would make here saves over a plain step, as a share of one
        (0: it would draft nothing); asked of steps that cannot use a draft, nothing remembered."""

    def chances(self) -> Sequence[float] | None:
        """Each token of its last draft's chance of holding, given the ones before it (None: it
        does not estimate them)."""

    def continuation(self, drafts: Sequence[int], room: int) -> Ahead | None:
        """What it would draft after `drafts` (its last draft, or none) if they held: a guess at
        the next token, then drafts for the pass behind (None: it cannot say)."""

    def recycle(self, inputs: Sequence[int], predicted: Sequence[int]) -> None:
        """The target's own choice after each of `inputs` in a forward pass (rejected drafts too)."""
