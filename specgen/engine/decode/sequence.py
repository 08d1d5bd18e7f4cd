"""One sequence and its rules, the same in every loop: the single-sequence loop (loop.py) and
the batch engine's rows (batch.py) hold a `Sequence` and ask it the same questions.

A `Sequence` owns a request's settings (prompt, drafter, selector, draft cap, token and context
limits, stop tokens, grammar) and what it has emitted. Its rules are defined here once: whether
it speculates, how much a step may draft and what (the drafter's guess, or a grammar's forced
tokens), how a verify pass's verdict becomes emitted tokens (`judge`: the longest accepted prefix
of the draft, then the selector's own token), how a near-tied position is chosen once a loop has
computed it alone (`choose`), and how a step ends (`finish`: stop tokens, limits, the drafter and
grammar told). The loops own only their passes: building, queuing, reading and rolling back.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable
from typing import Sequence as Ids

import mlx.core as mx

from specgen import defaults
from specgen.draft.predictor import NGramPredictor
from specgen.draft.schedule import draft_room
from specgen.engine.decode.constrain import Constraint
from specgen.engine.decode.sampling import (
    CUSTOM_OFF,
    GREEDY,
    Judged,
    MlxLmSampling,
    Selector,
    Verified,
    accept,
    settle,
)
from specgen.errors import InputError
from specgen.events import Coming, Drafter, Prefilled, Speculation, Step, Verdict
from specgen.settings import check
from specgen.structured.grammar import GrammarFailed


@dataclass(eq=False)
class Sequence:
    """A request's settings and what it has emitted (see the module docstring). `drafter_fed`:
    prompt tokens its drafter was already fed (a server's earlier turn); `off`: why not to
    speculate, decided by the caller; `cancelled`: asked during its prefill (between layers of a
    long piece), so that a dropped prompt stops there."""

    prompt: list[int]
    drafter: Drafter | None = None
    draft: int = defaults.DRAFT_LEN  # most drafted tokens a step (0: plain decoding)
    max_tokens: int = defaults.MAX_TOKENS
    stop_tokens: frozenset[int] = frozenset()
    context_length: int | None = None
    selector: Selector = GREEDY
    off: str | None = None
    constraint: Constraint | None = None
    drafter_fed: int = 0
    cancelled: Callable[[], bool] | None = None
    history: list[int] = field(init=False)  # prompt + emitted; its last token is not cached yet
    speculation: Speculation = field(init=False, default=Speculation(False, "not started"))
    drafted: int = field(init=False, default=0)  # the drafter's tokens verified so far...
    accepted: int = field(init=False, default=0)  # ...and accepted
    own: bool = field(init=False, default=True)  # this step's draft includes the drafter's
    failed: GrammarFailed | None = field(init=False, default=None)  # its grammar gave up: its loop ends it

    def __post_init__(self):
        """Refuse what no generation can run: an empty prompt, bad settings, a prompt the context
        cannot hold."""
        self.prompt = list(self.prompt)
        if not self.prompt:
            raise InputError("the prompt is empty")
        check(max_tokens=self.max_tokens, draft=self.draft)
        if self.context_length is not None and len(self.prompt) >= self.context_length:
            raise InputError(
                f"the prompt is {len(self.prompt)} tokens but the model's context is {self.context_length} "
                f"tokens: at most {self.context_length - 1} prompt tokens fit")
        if not 0 <= self.drafter_fed <= len(self.prompt):
            raise ValueError(f"drafter_fed must be in [0, {len(self.prompt)}]")
        self.stop_tokens = frozenset(self.stop_tokens)
        if self.drafter is None:
            self.drafter = NGramPredictor()
        if isinstance(self.selector, MlxLmSampling):  # picks from the host: nothing to verify with
            self.off = self.off or CUSTOM_OFF
        self.history = list(self.prompt)

    def check_cached(self, cached: int) -> None:
        """Refuse a cache said to hold `cached` prompt tokens that cannot (the last is always fed)."""
        if not 0 <= cached < len(self.prompt):
            raise ValueError(f"cached must be in [0, {len(self.prompt)}): the last prompt token is "
                             "always fed")

    def start(self, rollback: str, unsupported: str | None = None) -> Speculation:
        """Decide whether it speculates, on a cache rolled back `rollback`-wise (rollback.Rollback's
        `how`; `unsupported`: why that cache cannot be), before its first step."""
        off = self.off or unsupported
        if off or self.draft == 0:
            self.speculation = Speculation(False, off or "draft length is 0")
        else:
            self.speculation = Speculation(True, rollback=rollback)
        return self.speculation

    @property
    def cap(self) -> int:
        """Most drafted tokens a step, once started (0 where it does not speculate)."""
        return self.draft if self.speculation.on else 0

    @property
    def pos(self) -> int:
        """The absolute position of the next token it emits."""
        return len(self.history)

    @property
    def end(self) -> int:
        """The absolute position no token reaches (prompt + max tokens)."""
        return len(self.prompt) + self.max_tokens

    @property
    def acceptance(self) -> float:
        """The share of its drafted tokens accepted so far (one of two before any)."""
        return (self.accepted + 1) / (self.drafted + 2)

    @property
    def queues(self) -> bool:
        """Whether a pass may be queued for it before its last one is read: its selector picks
        lazily and nothing must see the last token first (a grammar's mask, mlx-lm's sampler)."""
        return self.constraint is None and not isinstance(self.selector, MlxLmSampling)

    def prefilled(self, shared: int = 0) -> Prefilled:
        """Its prompt is in the cache: the drafter reads what it has not, and the event says so
        (`shared`: tokens a batch took from another row's cache)."""
        if self.speculation.on:
            self.drafter.feed(self.prompt[self.drafter_fed:])
        return Prefilled(len(self.prompt), self.speculation, shared)

    def room(self, most: int | None = None, pos: int | None = None) -> int:
        """The most tokens a step at `pos` (default: the next) may draft, at most `most`."""
        cap = self.cap if most is None else min(self.cap, most)
        return draft_room(cap, self.pos if pos is None else pos, self.end, self.context_length)

    def with_forced(self, drafts: list[int], room: int) -> list[int]:
        """The step's draft from the drafter's `drafts`: under a grammar, its forced tokens first
        (then `own` says whether the drafter's draft is still judged)."""
        self.own = True
        if self.constraint is not None and self.speculation.on and room > 0:
            try:
                drafts, self.own = self.constraint.drafts(drafts, room)
            except GrammarFailed as e:
                self.failed, drafts = e, []
        return drafts

    def step_draft(self, on: bool = True, most: int | None = None) -> list[int]:
        """The draft of a step built once the one before was read (none unless `on`: drafting pays)."""
        room = self.room(most)
        drafts = self.drafter.draft(room) if on and self.speculation.on and room > 0 else []
        return self.with_forced(drafts, room)

    def planned(self, drafts: list[int]) -> Coming:
        """This step's `drafts` as a batch weighs them (nothing in flight, no guess): each token's
        chance of holding is its drafter's own estimate where it made these drafts, else its
        acceptance so far."""
        chances = self.drafter.chances() if self.own and self.constraint is None else None
        if chances is None or len(chances) != len(drafts):
            chances = [self.acceptance] * len(drafts)
        return Coming.of(1.0, 1.0, drafts, chances)

    def coming(self, drafts: list[int], on: bool) -> Coming:
        """What it would do at its next step, asked before the pass in flight (drafting `drafts`)
        is read (`on`: drafting pays): a pass queued behind that one carries its drafter's guess
        at the pass's own token and `Coming.drafts` past it. As alone (loop.py's `behind`), the
        guess is judged once that token comes: a row that never drafts still learns how its
        guesses fare."""
        room = self.room(pos=self.pos + len(drafts) + 1)
        whole = self.acceptance ** len(drafts)  # where its drafter does not say
        if not (on and self.speculation.on and room > 0):
            return Coming.of(whole, 1.0, [], [])
        ahead = self.drafter.continuation(drafts, room + 1)
        if ahead is None:  # a drafter that makes no continuations (a fixed draft length)
            return Coming.of(whole, 1.0, [], [self.acceptance] * room if self.drafter.saves(room) > 0 else [])
        if not ahead.tokens:
            return Coming.of(ahead.chance, 0.0, [], [])
        return Coming.of(ahead.chance, ahead.chances[0], list(ahead.tokens[1:]), list(ahead.chances[1:]))

    def verdict(self, logits: mx.array, ahead: int = 0) -> mx.array:
        """Lazily, the selector's tokens and near-tie flags (sampling.py) for a pass whose rows
        `logits` follow the last token and each draft; `ahead`: the pass is queued behind one
        whose token is not in `history` yet. mlx-lm's own sampler picks, never tied."""
        if isinstance(self.selector, MlxLmSampling):  # plain and unverified, never queued ahead
            token = self.selector.pick(logits[0], self.history, self.pos).astype(mx.uint32).reshape(1)
            return mx.stack([token, mx.zeros_like(token)])
        return self.selector.verdict(logits, self.pos + ahead)

    def judge(self, chosen: Verified, rows: mx.array, drafts: list[int]) -> Judged:
        """What a verify pass emits from its verdict read back (`rows`: the logits after the last
        token and each draft): the longest prefix of `drafts` equal to the selector's choices,
        then its next choice, as plain decoding emits. Where a near-tied position comes first,
        `tied` names it and the tokens stop before it: the caller computes that position alone
        and passes its logits to `choose`."""
        if isinstance(self.selector, MlxLmSampling):
            return Judged(chosen.tokens[:1], 0, None)
        if self.speculation.on:
            self.drafter.recycle([self.history[-1], *drafts], chosen.tokens)
        if self.constraint is not None:
            try:
                chosen = self.constraint.verified(chosen, rows, drafts, self.pos)
            except GrammarFailed as e:
                self.failed = e
                return Judged([], 0, None)
        return accept(drafts, chosen)

    def plain(self, token: int, row: mx.array) -> list[int]:
        """What a plain pass emits, its selector's pick `token` already read from its logits `row`
        (a plain pass alone is plain decoding: nothing is near-tied)."""
        if self.speculation.on:
            self.drafter.recycle(self.history[-1:], [token])
        if self.constraint is not None:
            try:
                token = self.constraint.pick(row, self.history, self.pos, chosen=token)
            except GrammarFailed as e:
                self.failed = e
                return []
        return [token]

    def choose(self, logits: mx.array, drafts: list[int], tied: int) -> tuple[list[int], int]:
        """(tokens emitted, drafts matched) once the near-tied position `tied` was computed alone
        (`logits`: its one row, after the drafts before it), as plain decoding chooses it."""
        at = self.pos + tied
        if self.constraint is None:
            return settle(drafts, tied, self.selector.pick(logits, self.history, at).item())
        try:
            return settle(drafts, tied, self.constraint.pick(logits, self.history, at, after=drafts[:tied]))
        except GrammarFailed as e:
            self.failed = e
            return [], 0

    def finish(self, emitted: list[int], drafted: int = 0, matched: int = 0, confirmed: bool = False,
               queued: bool = False) -> Step:
        """A step emitted `emitted` after a draft of `drafted` tokens (`matched` equal to the
        target's choices): cut it before any stop token, record it, tell the drafter and the
        grammar, and say whether the sequence ended. Once its grammar has failed (`failed`) it
        emits nothing: its loop ends it with that error."""
        stop = stop_token = None
        for i, t in enumerate(emitted):
            if t in self.stop_tokens:
                emitted, stop, stop_token = emitted[:i], "stop", t
                break
        if self.constraint is not None and self.failed is None:
            try:
                self.constraint.advance(emitted)
            except GrammarFailed as e:
                self.failed = e
        if self.failed is not None:
            emitted, stop, stop_token = [], None, None
        self.history.extend(emitted)
        told = (drafted, matched) if self.own else (0, 0)  # only forced tokens: the drafter's was not judged
        self.drafted += told[0]
        self.accepted += min(told[1], len(emitted))
        if self.speculation.on:
            self.drafter.feed(emitted, Verdict.of(told[0], told[1], len(emitted)) if told[0] else None)
        if stop is None and self.pos >= self.end:
            stop = "max_tokens"
        elif stop is None and self.context_length is not None and self.pos >= self.context_length:
            stop = "context"
        return Step(tuple(emitted), drafted, min(matched, len(emitted)), stop, confirmed=confirmed,
                    stop_token=stop_token, queued=queued)


def as_sequence(prompt: Ids[int] | Sequence, settings: dict) -> Sequence:
    """A loop's argument as a Sequence: one already made (and no settings beside it), or a prompt
    and the Sequence's settings as keywords."""
    if isinstance(prompt, Sequence):
        if settings:
            raise TypeError(f"settings given beside a Sequence: {', '.join(sorted(settings))}")
        return prompt
    return Sequence(list(prompt), **settings)
