"""One sequence of a batch (batch.py): its settings, what it emitted, and how a step's logits
become its tokens, judged on its own as decode.generate judges a step: the longest prefix of its
draft that equals the selector's choices, then the selector's next token."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Hashable

import mlx.core as mx

from specgen.draft.events import Drafter, Speculation, Step, Verdict
from specgen.draft.schedule import draft_room
from specgen.engine.constrain import Constraint
from specgen.engine.sampling import Judged, MlxLmSampling, Selector, Verified, accept


@dataclass
class Row:
    """One sequence: its settings, what it emitted, and its prefill progress while waiting."""

    key: Hashable
    prompt: list[int]
    drafter: Drafter
    selector: Selector
    cap: int  # most drafted tokens a step (0: plain decoding)
    max_tokens: int
    stop_tokens: frozenset[int]
    context_length: int | None
    speculation: Speculation
    cache: list | None = None  # its own cache until it joins the batch
    place: int = 0  # its row of the batch's cache once it joins
    prefilled: int = 0  # prompt tokens in `cache`
    fed: int = 0  # prompt tokens the drafter was given before it came here
    keep_cache: bool = False  # copy its cache out when it leaves the batch (Batch.kept)
    constraint: Constraint | None = None  # the grammar its output obeys
    waited: int = 0  # steps it has waited to be prefilled
    history: list[int] = field(default_factory=list)  # prompt + emitted; the last is not cached
    drafted: int = 0  # drafted tokens verified so far, and how many were accepted
    accepted: int = 0
    own: bool = True  # this step's draft includes its drafter's (else only forced tokens)

    def __post_init__(self):
        self.history = list(self.prompt)
        self.own_cost = getattr(self.drafter, "cost", None)  # an adaptive drafter's own, alone

    @property
    def pos(self) -> int:
        return len(self.history)

    @property
    def acceptance(self) -> float:
        """The share of this row's drafted tokens accepted so far (one of two before any)."""
        return (self.accepted + 1) / (self.drafted + 2)

    def draft(self, on: bool, most: int | None = None) -> list[int]:
        """This step's draft, of at most `most` tokens (none unless `on`)."""
        room = draft_room(self.cap if most is None else min(self.cap, most), self.pos,
                          len(self.prompt) + self.max_tokens, self.context_length)
        drafts = self.drafter.draft(room) if on and self.speculation.on and room > 0 else []
        self.own = True
        if self.constraint is not None and self.speculation.on and room > 0:
            drafts, self.own = self.constraint.drafts(drafts, room)
        return drafts

    def verdict(self, logits: mx.array, ahead: int = 0) -> mx.array:
        """Lazily, the selector's tokens and near-tie flags (sampling.py) for a pass whose rows
        `logits` follow the last token and each draft; `ahead`: the pass is queued behind one
        whose token is not in `history` yet. mlx-lm's own sampler picks, never tied."""
        if isinstance(self.selector, MlxLmSampling):  # plain and unverified, never queued ahead
            token = self.selector.pick(logits[0], self.history, self.pos).astype(mx.uint32).reshape(1)
            return mx.stack([token, mx.zeros_like(token)])
        return self.selector.verdict(logits, self.pos + ahead)

    def judge(self, chosen: Verified, logits: mx.array, drafts: list[int]) -> Judged:
        """(tokens the row emits, drafts equal to the selector's choices, tied) from its verdict
        read back; `tied` is the index of a near-tied row whose choice the caller must recompute
        (then the tokens stop before it)."""
        if isinstance(self.selector, MlxLmSampling):
            return Judged(chosen.tokens[:1], 0, None)
        if self.speculation.on:
            self.drafter.recycle([self.history[-1], *drafts], chosen.tokens)
        if self.constraint is not None:
            chosen = self.constraint.verified(chosen, logits, drafts, self.pos)
        return accept(drafts, chosen)

    def would_draft(self, on: bool) -> bool:
        """Whether the row would draft at its next step (`on`: drafting pays at this batch size):
        a pass queued ahead of its verdict would lose that draft."""
        room = draft_room(self.cap, self.pos + 1, len(self.prompt) + self.max_tokens, self.context_length)
        return on and self.speculation.on and room > 0 and self.drafter.saves(room) > 0

    @property
    def queues(self) -> bool:
        """Whether a pass may be queued for it before its last one is read: its selector picks
        lazily and nothing must see the last token first (a grammar's mask, mlx-lm's sampler)."""
        return self.constraint is None and not isinstance(self.selector, MlxLmSampling)

    def finish(self, emitted: list[int], drafted: int, matched: int, confirmed: bool, queued: bool = False) -> Step:
        """Cut `emitted` before a stop token, record it, tell the drafter, and say if it ended."""
        stop = stop_token = None
        for i, t in enumerate(emitted):
            if t in self.stop_tokens:
                emitted, stop, stop_token = emitted[:i], "stop", t
                break
        self.history.extend(emitted)
        if self.constraint is not None:
            self.constraint.advance(emitted)
        if not self.own:  # only a grammar's forced tokens: the drafter's draft was not judged
            drafted = matched = 0
        self.drafted += drafted
        self.accepted += min(matched, len(emitted))
        if self.speculation.on:
            self.drafter.feed(emitted, Verdict.of(drafted, matched, len(emitted)) if drafted else None)
        if stop is None and self.pos - len(self.prompt) >= self.max_tokens:
            stop = "max_tokens"
        elif stop is None and self.context_length is not None and self.pos >= self.context_length:
            stop = "context"
        return Step(tuple(emitted), drafted, min(matched, len(emitted)), stop, confirmed=confirmed,
                    stop_token=stop_token, queued=queued)
