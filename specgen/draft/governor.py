"""Whether drafting pays in this generation, judged by what its drafts really earn, and what its
steps really cost the device (model-free).

The drafter prices each draft by its estimated chances; where those run high (chat, whose n-grams
look likelier than they are), every draft costs a synchronous verify pass that plain decoding,
queued ahead, does not pay. The governor keeps the promise "never slower": it scores every draft
by what it saved, `accepted + 1 - price(drafted)` plain steps (`price`: a step drafting k tokens
in units of the plain step it competes with), as a moving average. Below zero drafting stops and
decoding is plain (queued ahead); the drafter still drafts, for nothing, and those "shadow" drafts
are judged against the tokens that come, at no cost to the model, so drafting resumes as soon as
it would pay again. It also keeps what the decode loop needs to decide whether to queue a pass
behind a draft before reading it: how sure whole drafts are (`sure`: the drafter's chances scaled
by how they fared) and how long the device waits for the host between passes (`gap`). Its weights
are DrafterParams.govern_* (evidence in docs/design.md).
"""

from __future__ import annotations

from typing import Sequence

from specgen.draft.length import CostFn
from specgen.draft.params import PARAMS, DrafterParams


class Governor:
    """Scores drafts (real or shadow) by the plain steps they save; drafting is `allowed` while
    the moving average of that score stays above zero (with a margin to come back)."""

    def __init__(self, price: CostFn, params: DrafterParams = PARAMS):
        self.price, self.params = price, params
        self.score = params.govern_prior
        self.on = True
        self.shadow: list[int] = []  # a draft not verified, judged against what comes
        self._held = 0  # its leading tokens that the output repeated so far
        self.switches = 0  # times drafting stopped or resumed (stats, tests)
        # How the drafter's chances that whole drafts hold fared: their sum, and the drafts that
        # held whole (one pseudo-draft each, so that the scale starts at 1).
        self._chances, self._whole = 1.0, 1.0
        self.waited_s: float | None = None  # the device's wait between passes (moving average)

    def allowed(self) -> bool:
        return self.on

    def judged(self, drafted: int, accepted: int, chance: float | None = None) -> None:
        """A draft of `drafted` tokens, `accepted` of which held (a real step's verdict), to which
        the drafter gave `chance` of holding whole, if it was asked."""
        rate = self.params.govern_rate
        if chance is not None:
            self._chances += chance
            self._whole += accepted == drafted
        self.score += rate * (accepted + 1 - self.price(drafted) - self.score)
        on = self.score > (0.0 if self.on else self.params.govern_margin)
        self.switches += on != self.on
        self.on = on

    def sure(self, chance: float) -> float:
        """The chance that a whole draft holds: the drafter's, scaled by how its chances fared in
        this generation (long copies are surer than it says; chat's guesses less)."""
        return min(1.0, chance * self._whole / self._chances)

    def waited(self, seconds: float) -> None:
        """The device waited `seconds` between reading a pass and getting the next: the host's
        work (judging, the caller's handling of the tokens, drafting, building the graph)."""
        old = self.waited_s
        self.waited_s = seconds if old is None else old + self.params.govern_rate * (seconds - old)

    def gap(self, prices) -> float:
        """What queuing a pass behind another hides, in plain steps: the wait measured here, or
        calibration's (`prices`, a cost.StepPrices) until one is."""
        if self.waited_s is None or not prices.plain_s:
            return prices.gap
        return self.waited_s / prices.plain_s

    def imagine(self, drafts: Sequence[int]) -> None:
        """A draft made while drafting is off: judged against the tokens that come next."""
        if not self.shadow and drafts:
            self.shadow, self._held = list(drafts), 0

    def observe(self, tokens: Sequence[int]) -> None:
        """Tokens emitted: they judge the shadow draft, if any, as a verify step would have."""
        for t in tokens:
            if not self.shadow:
                return
            if self._held < len(self.shadow) and t == self.shadow[self._held]:
                self._held += 1
            else:  # the token a verify step would have added itself: the draft is decided
                self.judged(len(self.shadow), self._held)
                self.shadow = []
