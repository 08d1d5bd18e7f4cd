"""The adaptive drafter (the default): n-gram tables plus long copies, drafting only as far as
it pays.

For each position it could draft, it takes a candidate token with its evidence (candidates.py)
from, in order of preference: a copy (copies.py: the history's end occurred before, in the
prompt, the output or memory's earlier outputs; or it resumes a copy that broke), else the n-gram tables (the request's
own, or memory's; when the two disagree, the counts of both decide) or the target's own recycled
prediction (what it last chose after the same token, in any forward pass, rejected drafts
included: Token Recycling, Luo et al. 2024), whichever is likelier. Each candidate's chance q
of being accepted comes from its evidence (acceptance.py); the draft length is the Leviathan
choice over the measured cost curve (length.py). After each step the decode loop says which
draft tokens held (`Verdict`), and the drafter learns from it: per request, how each kind of
evidence fares, which tokens copies break after, which tokens the output substitutes.

A caller's `prediction` (OpenAI's Predicted Outputs: text the output is expected to repeat) is one
more copy source, followed and trusted while the output follows it (prediction.py).

One idea, kept whole past 300 lines: what it drafts and how each verdict teaches it are read
together (the sources and the evidence live in their own modules).
"""

from __future__ import annotations

import math
from itertools import accumulate
from operator import mul
from typing import Iterable, Iterator, Sequence

from specgen import defaults
from specgen.draft.acceptance import (
    MEMORY_GROUPS,
    Acceptance,
    evidence_for,
)
from specgen.draft.candidates import HAZARD_KINDS, Draft, candidates
from specgen.draft.copies import Copies
from specgen.draft.guess import NGramGuesser
from specgen.draft.length import CostFn, choose_length, cost_table, linear_cost
from specgen.draft.ngram import NGramTables, context_keys, keys_along
from specgen.draft.params import PARAMS, DrafterParams
from specgen.draft.prediction import Prediction, checked
from specgen.draft.predictor import BATCH_HASH
from specgen.errors import SettingError
from specgen.events import Ahead, PredictionCounts, Verdict
from specgen.settings import check


class AdaptiveDrafter:
    """Drafts from long copies, the n-gram tables, (optionally) memory and the caller's
    `prediction` (token ids the output is expected to repeat), as far as it pays."""

    def __init__(self, max_order: int = defaults.MAX_ORDER, window: int = defaults.WINDOW,
                 min_order: int = defaults.MIN_ORDER, *, cost: CostFn = linear_cost(defaults.BETA),
                 memory=None, params: DrafterParams = PARAMS, prediction: Sequence[int] = ()):
        self.params = params
        self.max_order = max_order
        self.window = window
        self._cost = cost
        self.memory = memory
        self.tokens: list[int] = []  # every token fed: the source of copies (not windowed)
        self.ngrams = NGramTables(max_order, min_order)
        self.copies = Copies(self.tokens, params)
        self.acceptance = Acceptance(params)
        self.evidence_table = evidence_for(params)
        self._hashed = max(max_order - 1, params.copy_key)  # context tokens hashed per token
        self._list_keys = window >= max_order - 1  # keys of the whole list are the window's too
        self._keys: tuple[int, list[int]] | None = None  # (tokens fed, keys) from the last draft
        self._table = None  # the cost table, built at the first draft
        self.last: Draft | None = None  # the draft the next verdict is on
        self._behind: Draft | None = None  # a guess and the drafts queued behind the pass in flight
        self.recycled: dict[int, int] = {}  # token -> the target's latest choice after it
        self._draw_on(memory)  # sets ngram_guess (guesses) and _copy_memory (copies)
        self.respell: dict[int, int] = {}  # the prompt's spelling of an output's first token -> the output's
        predicted = checked(prediction)
        self.prediction = Prediction(predicted, params) if predicted else None

    @property
    def cost(self) -> CostFn:
        """What a draft of k tokens costs, relative to a plain step; settable (a batch's step cost
        changes with its rows), and the cost table is rebuilt from it at the next draft."""
        return self._cost

    @cost.setter
    def cost(self, cost: CostFn) -> None:
        self._cost, self._table = cost, None

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
        self.last, self._behind, self.respell = None, None, {}
        self._draw_on(self.memory)

    def _draw_on(self, memory) -> None:
        """Guess and copy from `memory` as well as the request (None: from the request alone)."""
        self.ngram_guess = NGramGuesser(self.ngrams, self.acceptance, self.evidence_table, self.params, memory).guess
        self._copy_memory = memory  # memory's stream, for copies

    # --- learning ---------------------------------------------------------------------------

    def feed(self, tokens: Iterable[int], verdict: Verdict | None = None) -> None:
        """Take the prompt or a step's emitted tokens; `verdict` says how the last draft fared."""
        tokens = list(tokens)
        self.copies.advance(tokens)
        if self.prediction is not None:
            self.prediction.advance(tokens)
        last, self.last = self.last, None
        behind, self._behind = self._behind, None
        if last is not None and verdict is not None:
            self._learn(last, tokens, verdict)
        elif last is not None and tokens:
            # A draft a batch's step cut to nothing (too dear there): its first token is judged
            # all the same, so a row priced out at the priors learns what alone it would have.
            self._record(last, tokens[0] == last.tokens[0], 1, self.tokens[-1])
        if behind is not None:
            self._judge_guess(behind, tokens, last, verdict)
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
        n = verdict.accepted
        self._record(last, n, n + verdict.rejected, self.tokens[-1])
        if self.prediction is not None:
            self.prediction.judged(last.evidence, n)
        if last.copy is not None and last.copy.own:
            self.copies.judged(last.copy.pos, tokens, n, len(last.tokens),
                               n < len(last.evidence) and last.evidence[n].kind == "subst")

    def _record(self, made: Draft, accepted: int, judged: int, prev: int) -> None:
        """Rescale the evidence of the first `judged` tokens of `made` (the first `accepted` held;
        `prev`: the token before them) and count copy breaks."""
        for i in range(judged):
            ev, hit = made.evidence[i], i < accepted
            # Memory's acceptance lives with the memory: it carries over between requests.
            (self.memory.acceptance if ev.group in MEMORY_GROUPS and self.memory is not None
             else self.acceptance).record(ev, hit)
            if ev.kind in HAZARD_KINDS:
                self.copies.hazards.record(prev, not hit)
            prev = made.tokens[i]

    def _judge_guess(self, behind: Draft, tokens: list[int], last: Draft | None,
                     verdict: Verdict | None) -> None:
        """Judge the guess that began the continuation queued behind the pass in flight (`behind`)
        by that pass's own next token, where the pass's draft (`last`, judged by `verdict`) held
        whole: the pass behind is then kept, and the verdict on its drafts comes next."""
        if last is None:
            held = 0
        elif verdict is not None and verdict.accepted == len(last.tokens):
            held = verdict.accepted
        else:
            return
        if len(tokens) <= held:  # a stop token ended the step first
            return
        hit = tokens[held] == behind.tokens[0]
        self._record(behind, hit, 1, tokens[held - 1] if held else self.tokens[-1])
        if hit and len(behind.tokens) > 1:  # drafts made past a wrong guess are not judged
            self.last = behind.after(1)

    def recycle(self, inputs, predicted) -> None:
        """Remember the target's choice after each input token of a forward pass."""
        self.recycled.update(zip(inputs, predicted))

    # --- drafting ---------------------------------------------------------------------------

    def draft(self, room: int) -> list[int]:
        """Up to `room` drafted tokens: the length that maximises expected tokens per unit of cost."""
        self.last = made = self._propose(room)
        return [] if made is None else made.tokens

    def chances(self) -> list[float] | None:
        """Each token of the last draft's chance of holding, given the ones before it."""
        return None if self.last is None else self.last.chances

    def continuation(self, drafts: Sequence[int], room: int) -> Ahead:
        """What it would draft after `drafts` (the pass in flight's drafts: its last draft, or none)
        if they all held, for a pass queued before the verdict on them is read: a guess at that
        pass's own next token, then up to `room` - 1 drafts for the pass behind, as many as pay
        given the guess's chance; and the chance it gives `drafts` of holding whole (0 where its
        draft from its state now does not begin with them). The next `feed` judges the guess
        (where `drafts` held whole), and the one after the drafts behind it (where the guess held)."""
        if not drafts:
            self.last = None  # a plain pass in flight: no draft of its own to judge
        made = self._propose(room, skip=len(drafts), behind=True) if room > 0 else None
        if made is None or made.tokens[: len(drafts)] != list(drafts):
            self._behind = None
            return Ahead([], 0.0 if drafts else 1.0)
        self._behind = made.after(len(drafts))
        return Ahead(self._behind.tokens, math.prod(made.chances[: len(drafts)]), self._behind.chances)

    def saves(self, room: int) -> float:
        """What the draft `draft(room)` would make saves over a plain step, as a share of one:
        1 - its cost per expected token / a plain step's (0: it would draft nothing). Nothing is
        remembered for a verdict."""
        made = self._propose(room)
        if made is None:
            return 0.0
        expected, cost = 1.0 + sum(accumulate(made.chances, mul)), self._table.cost
        return max(0.0, 1.0 - cost[len(made.tokens)] / (expected * cost[0]))

    def _propose(self, room: int, skip: int = 0, behind: bool = False) -> Draft | None:
        """A draft of up to `room` tokens, as long as pays; after `skip` tokens taken as they come
        (a draft in flight, to be continued as if it held: `continuation`). `behind`: its first
        token after those is a guess at the next pass's own token, not a draft: the pass behind
        verifies the rest, worth the guess's chance times theirs."""
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
            guess = self.ngram_guess(keys)
            if guess is None and toks[-1] not in self.recycled:  # nothing to go on: no draft
                return None
        made = Draft([], [], copy)
        chances = candidates(self, keys, made, guess)
        if any(next(chances, None) is None for _ in range(skip)):
            return None
        if behind:
            guessed = next(chances, None)
            if guessed is None:
                return None
            k = skip + 1 + choose_length(_given(guessed, chances), table, room - 1, self.params.min_p)
        else:
            k = skip + choose_length(chances, table, room, self.params.min_p)
            if k == skip:
                return None
        del made.tokens[k:], made.evidence[k:], made.chances[k:]
        return made

    def _in_session(self, respell: dict[int, int] | None) -> None:
        """Where the prompt already holds memory's newest output (an agent's next turn), memory
        tells how this model's outputs spell their first token (`respell`) and how often its turns
        begin as earlier ones did (memory's acceptance of "turn" evidence). Its n-grams and copies
        step aside only where the prompt holds nearly all memory knows (`aside_share`), which they
        would count twice; memory's other sessions are text the prompt cannot tell."""
        if respell is None:
            return
        self.respell = respell
        if self.memory.prompt_holds(self.tokens, self.copies.index, self.params.aside_share):
            self._draw_on(None)


def _given(q: float, chances: Iterator[float]) -> Iterator[float]:
    """`chances` with the first one multiplied by `q` (the chance of what they all follow)."""
    first = next(chances, None)
    if first is None:
        return
    yield q * first
    yield from chances


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
    from specgen.draft.predictor import NGramPredictor

    return NGramPredictor(max_order, window)
