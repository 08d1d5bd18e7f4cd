"""What the adaptive drafter proposes at each position of a draft, and how likely each proposal
is to be accepted: the copy it follows (its own text, memory's, an earlier turn or the caller's
prediction; read through substitutions, lowered after hazards), else the n-gram tables or the
target's recycled choice, whichever is likelier. drafter.py chooses how many of them to keep."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Protocol

from specgen.draft.acceptance import Acceptance, Evidence, EvidenceTable, odds_scaled
from specgen.draft.copies import Copies, CopySource
from specgen.draft.guess import Guess
from specgen.draft.ngram import context_keys
from specgen.draft.params import DrafterParams
from specgen.draft.prediction import PREDICTED, PREDICTED_REALIGN, Prediction

HAZARD_KINDS = ("copy", "realign")  # the request's own copies (memory's are other requests')


@dataclass
class Draft:
    """A draft being built, then remembered (`AdaptiveDrafter.last`) until the loop's verdict."""

    tokens: list[int]
    evidence: list[Evidence]
    copy: CopySource | None  # the copy it follows (None once the n-gram tables took over)
    chances: list[float] = field(default_factory=list)  # each token's, given the ones before it

    def after(self, n: int) -> "Draft":
        """Its tokens after the first `n`, as a draft of their own (judged apart from any copy)."""
        return Draft(self.tokens[n:], self.evidence[n:], None, self.chances[n:])


class DrafterState(Protocol):
    """What `candidates` reads of the drafter (drafter.py's AdaptiveDrafter), named here so that
    this module does not import the one that imports it."""

    params: DrafterParams
    evidence_table: EvidenceTable
    max_order: int
    tokens: list[int]
    copies: Copies
    acceptance: Acceptance
    memory: Any  # an NGramMemory or its reader, or None
    prediction: Prediction | None
    respell: dict[int, int]
    recycled: dict[int, int]
    ngram_guess: Callable[[list[int]], Guess | None]


def candidates(self: DrafterState, keys: list[int] | None, made: Draft, guess: Guess | None
               ) -> Iterator[float]:
    """Each next candidate's acceptance chance, after appending it (and its evidence) to `made`
    (`self`: the drafter, whose copies, tables, memory and acceptance it reads);
    a copy gives way to the n-gram tables where they disagree and are likelier. `guess`: the
    n-gram guess for the first position, when already known."""
    p, table = self.params, self.evidence_table
    order = self.max_order - 1
    ctx = self.tokens[-order:]
    tokens, evidence = made.tokens, made.evidence
    src = made.copy
    if src is not None:
        seq, pos, end, own = src.tokens, src.pos, src.end, src.own
        predicted = src.how == PREDICTED or src.how == PREDICTED_REALIGN
        realign = src.how == "realign" or src.how == PREDICTED_REALIGN
        turn = src.how == "turn"  # its first token is a guess that this turn begins as that one
        respell = self.respell if own and len(self.tokens) == self.copies.start else None
        realigned = table.predicted_realign if predicted else table.realign
        last_realign = len(realigned) - 1
        match = p.match_cap + 1 if src.how == "trusted" else src.match
        cont = self.copies.is_followed(pos) if own else predicted and self.prediction.is_followed(pos)
        by_bucket = table.copy[2 if predicted else 0 if own else 1]
        bucket_of, top = table.bucket_of, len(table.bucket_of) - 1
        q_of = (self.acceptance if own or predicted else self.memory.acceptance).q
        subst = self.copies.substitutions.forward if own else None
        hazards = self.copies.hazards
    i = 0
    while True:
        if made.copy is not None:
            at = pos + i
            if at < end:
                tok = seq[at]
            elif own:  # the copy reached the end: it repeats what it just drafted
                tok = tokens[at - end]
            else:
                return
            alt, agree = None, True
            if turn and i == 0:  # the tables, knowing the output's first token, may know better
                share = self.copies.turns.share
                ev = table.turn[2 if share >= 0.8 else 1 if share >= 0.5 else 0]
                alt = self.ngram_guess(keys or context_keys(ctx, order))
                agree = alt is None or alt.token == tok
            elif respell and i == 0 and tok in respell:  # the output's first token
                tok, ev = respell[tok], by_bucket[bucket_of[match if match < top else top]][1][cont]
            elif subst and at < end and tok in subst:
                tok, ev = subst[tok], table.subst
            elif realign:
                ev = realigned[i if i < last_realign else last_realign]
            else:
                m = match + i
                if m < p.agree_below:
                    alt = self.ngram_guess(keys or context_keys(ctx, order))
                    agree = alt is None or alt.token == tok
                ev = by_bucket[bucket_of[m if m < top else top]][agree][cont]  # table.copy_at, inlined
            q = q_of(ev) if not (turn and i == 0) else (
                self.memory.acceptance if self.memory is not None else self.acceptance).q(ev)
            if ev.kind in HAZARD_KINDS and ctx[-1] in hazards.after:
                factor = hazards.odds(ctx[-1])
                if factor < 1.0:
                    q = odds_scaled(q, factor)
            if alt is not None and not agree and alt.q > q:
                made.copy = None  # the tables know better: stop copying
                tok, ev, q = alt.token, alt.evidence, alt.q
        else:
            alt = guess or self.ngram_guess(keys or context_keys(ctx, order))
            guess = None
            mine = self.recycled.get(ctx[-1])
            if mine is not None:
                q = self.acceptance.q(table.recycled)
                if alt is None or q > alt.q:
                    alt = Guess(mine, table.recycled, q)
            if alt is None:
                return
            tok, ev, q = alt.token, alt.evidence, alt.q
        tokens.append(tok)
        evidence.append(ev)
        made.chances.append(q)
        yield q
        i += 1
        ctx.append(tok)
        keys = None  # hashed again only if the n-gram tables are asked
