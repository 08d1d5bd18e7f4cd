"""The drafter's tuning constants, in one frozen record (`DrafterParams`) that is passed to it.

Each value's evidence (which replay or measurement chose it) is in docs/design.md, not here.
Tests that need other values pass a record of their own (`dataclasses.replace(PARAMS, ...)`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

# Priors are tuples indexed by the evidence's coarse features (see acceptance.py):
# copies by backward-match bound (COPY_BOUNDS) -> (if the n-gram tables disagree, if they agree).
_COPY_PRIOR = ((0.15, 0.6), (0.35, 0.72), (0.6, 0.85), (0.8, 0.92), (0.97, 0.97))
# n-grams: order 2, 3, 4 -> share of the context's counts (< 0.5, < 0.8, >= 0.8) -> count 1..4+.
_NGRAM_PRIOR = (
    ((0.05, 0.1, 0.15, 0.2), (0.1, 0.2, 0.3, 0.4), (0.25, 0.5, 0.65, 0.75)),
    ((0.05, 0.15, 0.25, 0.35), (0.15, 0.3, 0.4, 0.5), (0.4, 0.7, 0.8, 0.85)),
    ((0.1, 0.2, 0.3, 0.4), (0.2, 0.4, 0.5, 0.6), (0.5, 0.75, 0.85, 0.9)),
)


@dataclass(frozen=True)
class DrafterParams:
    """How the adaptive drafter finds drafts, estimates their chances and learns per request."""

    # Copies
    copy_key: int = 4  # tokens of context that locate an earlier occurrence to copy from
    copy_candidates: int = 16  # earlier occurrences remembered per context
    match_cap: int = 128  # longest backward match measured
    long_match: int = 32  # backward matches this long or longer are rescaled apart ("long")
    start_slack: int = 1  # output tokens at its start a copy may miss and still cover the output
    agree_below: int = 16  # below this match length, the n-gram tables give a second opinion
    realign_span: tuple[int, int] = (-2, 4)  # where a broken copy may resume (see copies.py)
    realign_steps: int = 6  # steps after a broken copy during which realigning is tried
    subst_seen: int = 2  # confirmations before copies substitute a replaced token
    hazard_shrink: float = 10.0  # judged copies after a token before its own break rate counts
    hazard_base: tuple[float, float] = (1.0, 20.0)  # (breaks, judged) assumed before any copy
    # Acceptance estimates
    min_p: float = 0.05  # stop extending a draft once the chance all of it holds falls below
    shrink: float = 2.0  # pseudo-observations holding a request's rescaling near 1
    ngram_shrink: float = 50.0  # the same for n-gram evidence, whose priors hold up better
    support_smooth: float = 2.0  # pseudo-counts when the request's and memory's n-grams disagree
    cont_odds: float = 2.0  # odds factor for a copy continuing the source the last step followed
    memory_odds: float = 0.5  # odds factor for memory's n-grams and copies
    # In an agent's session (the prompt holds memory's newest output) memory's n-grams and copies
    # step aside where the prompt holds at least this share of its output tokens (0: always, > 1: never).
    aside_share: float = 0.9
    predicted_odds: float = 1.0  # odds factor for copies from the caller's prediction (over copy_prior)
    copy_prior: tuple = _COPY_PRIOR
    realign_prior: tuple[float, ...] = (0.35, 0.6, 0.7, 0.8)  # by drafted position (last repeats)
    subst_prior: float = 0.4
    turn_prior: tuple[float, ...] = (0.2, 0.45, 0.75)  # an earlier turn's start, by turn_share < 0.5, < 0.8, more
    recycled_prior: float = 0.5  # the model's own last prediction after the context's last token
    ngram_prior: tuple = _NGRAM_PRIOR
    copy_bounds: tuple[int, ...] = field(init=False)  # upper bounds of the copy match buckets

    def __post_init__(self):
        # The match buckets end below 4, 8, 16, long_match, and then anything longer.
        object.__setattr__(self, "copy_bounds", (4, 8, 16, self.long_match, self.match_cap + 1))


PARAMS = DrafterParams()
