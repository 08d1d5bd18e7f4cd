"""The adaptive drafter (the default): n-gram tables plus long copies, drafting only as far as
it pays.

For each position it could draft, it takes a candidate token with its evidence from, in order of
preference: a copy (copies.py: the history's end occurred before, in the prompt, the output or
memory's earlier outputs; or it resumes a copy that broke), else the n-gram tables (the request's
own, or memory's; when the two disagree, the counts of both decide) or the target's own recycled
prediction (what it last chose after the same token, in any forward pass, rejected drafts
included: Token Recycling, Luo et al. 2024), whichever is likelier. Each candidate's chance q
of being accepted comes from its evidence (acceptance.py); the draft length is the Leviathan
choice over the measured cost curve (length.py). After each step the decode loop says which
draft tokens held (`Verdict`), and the drafter learns from it: per request, how each kind of
evidence fares, which tokens copies break after, which tokens the output substitutes.

A caller's `prediction` (OpenAI's Predicted Outputs: text the output is expected to repeat) is one
more copy source, followed and trusted while the output follows it (prediction.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Iterator, Sequence

from . import defaults
from .acceptance import MEMORY_GROUPS, Acceptance, Evidence, evidence_for, odds_scaled
from .copies import Copies, CopySource
from .errors import SettingError
from .events import PredictionCounts, Verdict
from .guess import Guess, NGramGuesser
from .length import CostFn, choose_length, cost_table, linear_cost
from .ngram import NGramTables, context_keys, keys_along
from .params import PARAMS, DrafterParams
from .prediction import PREDICTED, PREDICTED_REALIGN, Prediction, checked
from .predictor import BATCH_HASH
from .settings import check

_HAZARD_KINDS = ("copy", "realign")  # the request's own copies (memory's are other requests')


@dataclass
class Draft:
    """A draft being built, then remembered (`AdaptiveDrafter.last`) until the loop's verdict."""

    tokens: list[int]
    evidence: list[Evidence]
    copy: CopySource | None  # the copy it follows (None once the n-gram tables took over)


class AdaptiveDrafter:
    """Drafts from long copies, the n-gram tables, (optionally) memory and the caller's
    `prediction` (token ids the output is expected to repeat), as far as it pays."""

    def __init__(self, max_order: int = defaults.MAX_ORDER, window: int = defaults.WINDOW,
                 min_order: int = defaults.MIN_ORDER, *, cost: CostFn = linear_cost(defaults.BETA),
                 memory=None, params: DrafterParams = PARAMS, prediction: Sequence[int] = ()):
        self.params = params
        self.max_order = max_order
        self.window = window
        self.cost = cost
        self.memory = memory
        self.tokens: list[int] = []  # every token fed: the source of copies (not windowed)
        self.ngrams = NGramTables(max_order, min_order)
        self.copies = Copies(self.tokens, params)
        self.acceptance = Acceptance(params)
        self._evidence = evidence_for(params)
        self._hashed = max(max_order - 1, params.copy_key)  # context tokens hashed per token
        self._list_keys = window >= max_order - 1  # keys of the whole list are the window's too
        self._keys: tuple[int, list[int]] | None = None  # (tokens fed, keys) from the last draft
        self._table = None  # the cost table, built at the first draft
        self.last: Draft | None = None  # the last draft, until the loop's verdict on it
        self.recycled: dict[int, int] = {}  # token -> the target's latest choice after it
        self._draw_on(memory)  # sets _ngram (guesses) and _copy_memory (copies)
        self._respell: dict[int, int] = {}  # the prompt's spelling of an output's first token -> the output's
        predicted = checked(prediction)
        self.prediction = Prediction(predicted, params) if predicted else None

    @property
    def prediction_counts(self) -> PredictionCounts:
        """How many drafted tokens came from the prediction, and how many of those were accepted."""
        return self.prediction.counts if self.prediction is not None else PredictionCounts(0, 0)

    def continue_with(self, prediction: Sequence[int] = ()) -> None:
        """Get ready for another request whose prompt continues everything fed so far (a server's
        next turn): its output starts after the next feed, and `prediction` replaces the last one."""
        predicted = checked(prediction)
        self.prediction = Prediction(predicted, self.params) if predicted else None
        self.copies.restart()
        self.last, self._respell = None, {}
        self._draw_on(self.memory)

    def _draw_on(self, memory) -> None:
        """Guess and copy from `memory` as well as the request (None: from the request alone)."""
        self._ngram = NGramGuesser(self.ngrams, self.acceptance, self._evidence, self.params, memory).guess
        self._copy_memory = memory  # memory's stream, for copies

    # --- learning ---------------------------------------------------------------------------

    def feed(self, tokens: Iterable[int], verdict: Verdict | None = None) -> None:
        """Take the prompt or a step's emitted tokens; `verdict` says how the last draft fared."""
        tokens = list(tokens)
        self.copies.advance(tokens)
        if self.prediction is not None:
            self.prediction.advance(tokens)
        last, self.last = self.last, None
        if last is not None and verdict is not None:
            self._learn(last, tokens, verdict)
        toks, longest = self.tokens, self._hashed
        if len(tokens) >= BATCH_HASH and self.window >= longest:
            tail = toks[-longest:]
            for t, keys in zip(tokens, keys_along(tail + tokens, len(tail), longest)):
                self._count(t, keys)
        else:
            for t in tokens:
                self._count(t, None)

    def _count(self, token: int, keys: list[int] | None) -> None:
        """Count `token` in the n-gram tables and the copy index, then append it."""
        toks = self.tokens
        if keys is None:
            known = self._keys
            if known is not None and known[0] == len(toks):
                keys = known[1]
            elif self._list_keys:  # hashed once, for both the tables and the copy index
                keys = context_keys(toks, self._hashed)
            else:  # contexts are read from the window alone
                keys = context_keys(toks[-self.window:], self.max_order - 1)
        self.ngrams.add(keys, token)
        ck = self.params.copy_key
        if len(toks) >= ck:
            self.copies.index.add(keys[ck] if len(keys) > ck else context_keys(toks, ck)[ck], len(toks))
        toks.append(token)

    def _learn(self, last: Draft, tokens: list[int], verdict: Verdict) -> None:
        """Judge the last draft's tokens: rescale their evidence, note copy breaks."""
        prev = self.tokens[-1]
        n = verdict.accepted
        for i in range(n + verdict.rejected):
            ev, hit = last.evidence[i], i < n
            # Memory's acceptance lives with the memory: it carries over between requests.
            (self.memory.acceptance if ev.group in MEMORY_GROUPS and self.memory is not None
             else self.acceptance).record(ev, hit)
            if ev.kind in _HAZARD_KINDS:
                self.copies.hazards.record(prev, not hit)
            prev = last.tokens[i]
        if self.prediction is not None:
            self.prediction.judged(last.evidence, n)
        if last.copy is not None and last.copy.own:
            self.copies.judged(last.copy.pos, tokens, n, len(last.tokens),
                               n < len(last.evidence) and last.evidence[n].kind == "subst")

    def recycle(self, inputs, predicted) -> None:
        """Remember the target's choice after each input token of a forward pass."""
        self.recycled.update(zip(inputs, predicted))

    # --- drafting ---------------------------------------------------------------------------

    def draft(self, room: int) -> list[int]:
        """Up to `room` drafted tokens: the length that maximises expected tokens per unit of cost."""
        made = self._propose(room)
        if made is None:
            return []
        self.last = made
        return made.tokens

    def would_draft(self, room: int) -> bool:
        """Whether `draft(room)` would draft anything; nothing is remembered for a verdict."""
        return self._propose(room) is not None

    def _propose(self, room: int) -> Draft | None:
        toks = self.tokens
        if self.copies.start is None:
            self.copies.start = len(toks)
            if self.prediction is not None:  # it sits between the prompt and the output
                self.prediction.begin(toks)
            if self.memory is not None:
                self._in_session(self.memory.respellings(toks, self.copies.index))
        if room <= 0:
            return None
        table = self._table
        if table is None or room > table.longest:
            table = self._table = cost_table(self.cost, max(room, defaults.MAX_DRAFT))
        keys = context_keys(toks, self._hashed)  # of the context the first draft follows
        if self._list_keys:  # the next feed's keys are these
            self._keys = (len(toks), keys)
        copy = self.copies.find(keys, self._copy_memory)
        if self.prediction is not None:
            copy = self.prediction.find(keys, toks, copy)
        guess = None
        if copy is None:
            guess = self._ngram(keys)
            if guess is None and toks[-1] not in self.recycled:  # nothing to go on: no draft
                return None
        made = Draft([], [], copy)
        k = choose_length(self._candidates(keys, made, guess), table, room, self.params.min_p)
        if k == 0:
            return None
        del made.tokens[k:], made.evidence[k:]
        return made

    def _in_session(self, respell: dict[int, int] | None) -> None:
        """Where the prompt already holds memory's newest output (an agent's next turn), memory's
        n-grams and copies would count that conversation twice: only what the prompt cannot tell
        is taken from it, how this model's outputs spell their first token (`respell`), and how
        often its turns begin as earlier ones did (memory's acceptance of "turn" evidence)."""
        if respell is None:
            return
        self._respell = respell
        self._draw_on(None)

    def _candidates(self, keys: list[int] | None, made: Draft, guess: Guess | None) -> Iterator[float]:
        """Each next candidate's acceptance chance, after appending it (and its evidence) to `made`;
        a copy gives way to the n-gram tables where they disagree and are likelier. `guess`: the
        n-gram guess for the first position, when already known."""
        p, table = self.params, self._evidence
        order = self.max_order - 1
        ctx = self.tokens[-order:]
        tokens, evidence = made.tokens, made.evidence
        src = made.copy
        if src is not None:
            seq, pos, end, own = src.tokens, src.pos, src.end, src.own
            predicted = src.how == PREDICTED or src.how == PREDICTED_REALIGN
            realign = src.how == "realign" or src.how == PREDICTED_REALIGN
            turn = src.how == "turn"  # its first token is a guess that this turn begins as that one
            respell = self._respell if own and len(self.tokens) == self.copies.start else None
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
                    alt = self._ngram(keys or context_keys(ctx, order))
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
                        alt = self._ngram(keys or context_keys(ctx, order))
                        agree = alt is None or alt.token == tok
                    ev = by_bucket[bucket_of[m if m < top else top]][agree][cont]  # table.copy_at, inlined
                q = q_of(ev) if not (turn and i == 0) else (
                    self.memory.acceptance if self.memory is not None else self.acceptance).q(ev)
                if ev.kind in _HAZARD_KINDS and ctx[-1] in hazards.after:
                    factor = hazards.odds(ctx[-1])
                    if factor < 1.0:
                        q = odds_scaled(q, factor)
                if alt is not None and not agree and alt.q > q:
                    made.copy = None  # the tables know better: stop copying
                    tok, ev, q = alt.token, alt.evidence, alt.q
            else:
                alt = guess or self._ngram(keys or context_keys(ctx, order))
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
            yield q
            i += 1
            ctx.append(tok)
            keys = None  # hashed again only if the n-gram tables are asked

def make_drafter(draft: int | None = None, *, max_order: int = defaults.MAX_ORDER,
                 window: int = defaults.WINDOW, cost: CostFn | None = None, memory=None,
                 prediction: Sequence[int] | None = None):
    """The drafter `run`, `simulate` and `bench` use: the adaptive drafter when `draft` is None,
    else the fixed-length n-gram predictor (`--draft N`), which cannot use a `prediction`."""
    check(draft=draft, ngram_order=max_order, window=window)
    prediction = checked(prediction) if prediction is not None else []
    if draft is None:
        return AdaptiveDrafter(max_order, window, cost=cost or linear_cost(defaults.BETA), memory=memory,
                               prediction=prediction)
    if prediction:
        raise SettingError("prediction", "is used only by the adaptive drafter (leave draft unset)")
    from .predictor import NGramPredictor

    return NGramPredictor(max_order, window)
