"""A grammar applied to one sequence's decoding, losslessly: what the single-sequence loop and a
batch row both ask of it.

Plain constrained decoding chooses, at each position, what the selector chooses from the logits
with every token the grammar forbids masked out. Here:
- drafts are cut where the grammar would refuse them, and the tokens it forces next (llguidance's
  fast-forward tokens) open the draft: they are verified like any draft, never emitted unchecked;
- a verified row's logits need no mask where the selector's unmasked choice is allowed: masking
  only lowers forbidden tokens, so greedy's argmax, and a temperature-only sample (its noise keyed
  by position, its log-probabilities shifted alike for every allowed token), stay the same. Only a
  forbidden choice is chosen again from the masked row (as llama.cpp checks the choice first).
  "Allowed" is the mask's word, computed on the host: where bytes are forced it allows only their
  canonical tokens, where the parser would take any tokenization.
  With top-p / top-k / min-p the filters would see another distribution: every row is masked.
The matcher moves only with emitted tokens; drafts move it for a moment and are taken back.
"""

from __future__ import annotations

from typing import Sequence

import mlx.core as mx
import numpy as np

from specgen.engine.decode.sampling import Greedy, Sampler, Selector, Verified, read
from specgen.structured.grammar import Matcher, allowed

# Data, not a lazy mx.arange: a lazy array belongs to the importing thread's stream, and a
# server decodes on its worker thread.
_BITS = mx.array(np.arange(32, dtype=np.uint32))


def masked(logits: mx.array, bitmasks: Sequence[np.ndarray]) -> mx.array:
    """`logits` (rows, vocab) with every token a row's bitmask forbids at -inf."""
    words = mx.array(np.stack(bitmasks).view(np.uint32))
    bits = ((words[:, :, None] >> _BITS) & 1).reshape(words.shape[0], -1).astype(mx.bool_)
    vocab = logits.shape[-1]
    if bits.shape[1] < vocab:  # tokens the tokenizer does not know (padding rows of the embedding)
        bits = mx.concatenate([bits, mx.zeros((bits.shape[0], vocab - bits.shape[1]), mx.bool_)], axis=1)
    return mx.where(bits[:, :vocab], logits, mx.array(-mx.inf, logits.dtype))


def checks_first(selector: Selector) -> bool:
    """Whether `selector`'s choice from a masked row is its unmasked choice wherever that is allowed."""
    return isinstance(selector, Greedy) or (
        isinstance(selector, Sampler) and not (0 < selector.top_p < 1 or selector.min_p > 0 or selector.top_k > 0))


class Constraint:
    """One sequence's grammar (a Matcher at its emitted tokens) and how its choices obey it."""

    def __init__(self, matcher: Matcher, selector: Selector):
        self.matcher, self.selector = matcher, selector
        self.first = checks_first(selector)

    def drafts(self, own: list[int], room: int) -> tuple[list[int], bool]:
        """This step's draft from the drafter's `own` (up to `room` tokens): the forced tokens,
        followed by `own` where it begins with them, cut where the grammar refuses; and whether
        `own` was kept (else the drafter's draft is not judged)."""
        forced = self.matcher.forced()[:room]
        if forced and own[: len(forced)] != forced:
            return forced, False
        return own[: self.matcher.valid(own)], True

    def verified(self, chosen: Verified, rows: mx.array, drafts: Sequence[int], position: int) -> Verified:
        """The selector's unmasked verdict on a verify pass (`rows`: logits after the last token
        and each draft) as the grammar allows it: each row up to the first one that does not
        confirm its draft is chosen as plain constrained decoding chooses (rows after it do not
        count), and rows near-tied under the mask are no longer trusted."""
        if not self.first:  # every row masked: at the grammar's state after each draft
            chosen = read(self.selector.verdict(masked(rows, self._masks(drafts)), position))
        tokens, trusted, moved = list(chosen.tokens), chosen.trusted, 0
        try:
            for i in range(len(tokens)):
                if i >= trusted:
                    break
                mask = self.matcher.bitmask()
                if not allowed(mask, tokens[i]):
                    again = read(self.selector.verdict(masked(rows[i : i + 1], [mask]), position + i))
                    tokens[i] = again.tokens[0]
                    if again.trusted == 0:
                        trusted = i
                        break
                if i == len(drafts) or tokens[i] != drafts[i] or not self._walk(drafts[i : i + 1]):
                    break  # (past the grammar's end the step is cut at its stop token)
                moved += 1
        finally:
            self.matcher.back(moved)
        return Verified(tokens, trusted)

    def pick(self, logits: mx.array, history: Sequence[int], position: int, after: Sequence[int] = (),
             chosen: int | None = None) -> int:
        """A one-position pass's token (`logits`: one row) as plain constrained decoding picks it,
        the grammar at the emitted tokens and then `after` (drafts the pass followed); `chosen`:
        the selector's unmasked pick from the same row, if it was already read."""
        moved = self._walk(after)
        try:
            mask = self.matcher.bitmask()
            if self.first:
                token = self.selector.pick(logits, history, position).item() if chosen is None else chosen
                if allowed(mask, token):
                    return token
            return self.selector.pick(masked(logits[None], [mask])[0], history, position).item()
        finally:
            self.matcher.back(moved)

    def advance(self, emitted: Sequence[int]) -> None:
        """Move the grammar past a step's emitted tokens (a stop token that ended it is not one)."""
        self.matcher.advance(emitted)

    def _masks(self, drafts: Sequence[int]) -> list[np.ndarray]:
        """The bitmask at each verified row: after none, one, ... all of `drafts`."""
        masks, moved = [], 0
        for i in range(len(drafts) + 1):
            masks.append(self.matcher.bitmask())
            if i < len(drafts) and self._walk(drafts[i : i + 1]) == 0:  # ended: its end alone, from here on
                masks += masks[-1:] * (len(drafts) - i)
                break
            moved += i < len(drafts)
        self.matcher.back(moved)
        return masks

    def _walk(self, tokens: Sequence[int]) -> int:
        """Advance past `tokens` up to the grammar's end (a draft may run on past it, to the stop
        token the step is cut at); how many it advanced past."""
        for n, token in enumerate(tokens):
            if self.matcher.ended():
                return n
            self.matcher.advance([token])
        return len(tokens)
