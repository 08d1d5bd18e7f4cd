"""Predicted outputs (OpenAI's `prediction`): token ids of text the caller expects much of the
output to repeat (the file being edited), as a copy source for the adaptive drafter.

The prediction sits, for drafting only, between the prompt and the output: its stream is the
prompt's last tokens followed by the prediction, so the output's first token is drafted from its
first. The output is followed along the stream (an anchor that moves with it) and trusted while it
follows; where it departs (an edit), the prediction is found again near the break (realignment)
or by a backward match of the history's end, as copies.py finds the request's own copies. The
stream is never model input and never part of the request's history or n-gram tables.
"""

from __future__ import annotations

import operator
from typing import NamedTuple, Sequence

from specgen.draft.acceptance import Evidence
from specgen.draft.copies import CopyIndex, CopySource, longest_match
from specgen.draft.ngram import keys_along
from specgen.draft.params import DrafterParams
from specgen.errors import SettingError
from specgen.events import PredictionCounts

PREDICTED, PREDICTED_REALIGN = "predicted", "predicted realign"  # CopySource.how of its copies


class _Break(NamedTuple):
    pos: int  # where the stream would be had the output replaced as many tokens as it wrote
    steps_left: int
    broke: int  # the stream position right after the break


def checked(prediction) -> list[int]:
    """The prediction as a list of token ids; SettingError("prediction") if it is not one."""
    try:
        tokens = [operator.index(t) for t in prediction]
    except TypeError:
        raise SettingError("prediction", "must be a list of token ids") from None
    if any(t < 0 for t in tokens):
        raise SettingError("prediction", "must be a list of token ids (0 or more)")
    return tokens


class Prediction:
    """The prediction's stream, its copy index, where the output is in it, and how its drafts fared."""

    def __init__(self, tokens: Sequence[int], params: DrafterParams):
        self.tokens = list(tokens)
        self.params = params
        self.stream: list[int] = []  # the prompt's tail, then the prediction (built at `begin`)
        self.start = 0  # where the prediction begins in the stream
        self.index = CopyIndex(params.copy_candidates)
        self._anchor: int | None = None  # stream position of the output's next token, while aligned
        self._run = 0  # the backward match at the anchor (match_cap + 1: followed since the start)
        self._followed = False  # the anchor moved with the output at least once since it was found
        self._break: _Break | None = None  # after the output left a trusted run
        self.drafted = self.accepted = 0

    @property
    def counts(self) -> PredictionCounts:
        return PredictionCounts(self.drafted, self.accepted)

    def begin(self, history: list[int]) -> None:
        """The output begins after `history` (the prompt): the prediction follows its last tokens."""
        p = self.params
        tail = history[-p.match_cap:]
        self.stream, self.start = tail + self.tokens, len(tail)
        first = max(self.start, p.copy_key)  # positions with a prediction token and a full key
        for pos, keys in enumerate(keys_along(self.stream, first, p.copy_key), first):
            self.index.add(keys[p.copy_key], pos)
        self._anchor, self._run, self._followed = self.start, p.match_cap + 1, False

    def advance(self, tokens: list[int]) -> None:
        """The output grew by `tokens`: follow it along the stream, or note where it left."""
        if not self.stream:
            return  # still the prompt
        n = len(tokens)
        if self._break is not None:
            pos, left, broke = self._break
            self._break = _Break(pos + n, left - 1, broke) if left > 1 else None
        a = self._anchor
        if a is None:
            return
        if a >= len(self.stream):  # the output went past the prediction's end
            self._anchor = None
            return
        if self.stream[a:a + n] == tokens:
            self._anchor, self._run, self._followed = a + n, self._run + n, True
            return
        self._anchor = None
        if self._run >= self.params.agree_below:  # not a chance match: the output may come back
            j = next(i for i, t in enumerate(tokens) if self.stream[a + i:a + i + 1] != [t])
            self._break = _Break(a + n, self.params.realign_steps, a + j + 1)

    def find(self, keys: list[int], history: list[int], rival: CopySource | None) -> CopySource | None:
        """The copy to draft from: the prediction where the output is in it (or found again by a
        backward match of the history's end, or near where it left), unless `rival` (the
        request's or memory's copy) matches the history's end longer."""
        p, stream = self.params, self.stream
        a = self._anchor
        if a is None or a >= len(stream):
            a = None
            if len(history) >= p.copy_key:
                found = self.index.where.get(keys[p.copy_key])
                best = longest_match(stream, found, history, None, p) if found else None
                if best is not None:
                    a, self._run = best
                    self._anchor, self._followed = a, False
        if a is not None:
            if rival is not None and _strength(rival, p) >= self._run:
                return rival
            return CopySource(stream, a, PREDICTED, self._run, False, len(stream))
        if rival is not None or self._break is None:
            return rival
        pos, _, broke = self._break  # where the output may have come back to the prediction
        last = history[-1]
        found = [q for q in range(max(broke + p.realign_span[0], self.start, 1),
                                  min(pos + p.realign_span[1], len(stream))) if stream[q - 1] == last]
        if not found:
            return None
        q = min(found, key=lambda q: abs(q - pos))
        self._anchor, self._run, self._followed = q, 0, False
        return CopySource(stream, q, PREDICTED_REALIGN, 0, False, len(stream))

    def is_followed(self, pos: int) -> bool:
        """Whether a copy at `pos` continues where the output has been following the prediction."""
        return self._followed and pos == self._anchor

    def judged(self, evidence: list[Evidence], accepted: int) -> None:
        """Count a draft's tokens from the prediction (`evidence`: each drafted token's) and those
        among its first `accepted`, which held."""
        for i, ev in enumerate(evidence):
            if ev.kind == PREDICTED:
                self.drafted += 1
                self.accepted += i < accepted


def _strength(copy: CopySource, p: DrafterParams) -> int:
    """A rival copy's backward match (a trusted one counts as the longest, a realignment as none)."""
    if copy.how == "trusted":
        return p.match_cap + 1
    return 0 if copy.how == "realign" else copy.match
