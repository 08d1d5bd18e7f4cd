"""The decode loop: drafts verified by the target model in one forward pass per step.

`generate` is a generator of events (`Prefilled`, then one `Step` per target forward pass); it
never prints and never times anything: stats and display are computed by the caller. What a step
drafts, emits and ends on is the sequence's (sequence.py), as in the batch engine; this loop owns
its passes: queued behind the one in flight where that pays, eager where nothing runs ahead.
"""

from __future__ import annotations

from typing import Iterator, NamedTuple
from typing import Sequence as Ids

import mlx.core as mx
from mlx_lm.generate import generation_stream
from mlx_lm.models.cache import make_prompt_cache

from specgen.draft.schedule import Schedule
from specgen.engine.cost.curve import StepPrices
from specgen.engine.decode.eager import Stopped, eager, stoppable
from specgen.engine.decode.rollback import Rollback
from specgen.engine.decode.sampling import read
from specgen.engine.decode.sequence import Sequence, as_sequence
from specgen.events import Prefilled, Step

PREFILL_CHUNK = 2048  # prompt tokens per prefill forward pass, as in mlx_lm.generate_step


class _Pass(NamedTuple):
    """A forward pass queued on the device and not yet read: it emits from absolute position
    `pos`, verifying `drafts`; `out` is lazy: the selector's verdict on its rows where it has
    drafts, else the one token it picked."""

    pos: int
    drafts: list[int]
    out: mx.array
    queued: bool  # queued behind another pass (else built once the one before was read)
    rows: mx.array  # its logits after the last token and each draft (a grammar may mask them)


def generate(
    model,
    prompt: Ids[int] | Sequence,
    *,
    prompt_cache: list | None = None,
    cached: int = 0,
    queue_after: int | None = None,
    prices: StepPrices | None = None,
    **settings,
) -> Iterator[Prefilled | Step]:
    """Generate one sequence: `prompt` is a Sequence (sequence.py: its drafter, draft cap,
    selector, limits, stop tokens and grammar), or token ids with a Sequence's settings as
    keywords (`drafter=`, `draft=` up to that many drafted tokens a step, 0: plain decoding, ...).
    `prompt_cache` may already hold the first `cached` tokens of the prompt (an earlier turn of
    the same conversation): only the rest is prefilled, while positions (sampling keys, the context
    check) and the drafter still see the whole prompt.
    `queue_after`: None, every pass is read before the next is built; else passes are queued
    behind the one in flight (plain ones as schedule.py says, behind drafts as `prices` says).
    `prices` (cost.StepPrices): what steps cost in plain steps as this loop runs them, which
    decides where a pass is queued behind another, and how a pass nothing runs ahead of is
    evaluated (eagerly where the prices were timed so). A grammar's mask needs the last token on
    the host, so under one passes are not queued ahead. The sequence's `cancelled` is asked during
    the prefill, between layers of a long piece (eager.stoppable): once it says so, the generator
    ends without a `Prefilled` (the cache then holds part of the prompt, some layers' entries
    only: not to be kept), so a dropped long prompt stops within a layer.

    The emitted tokens are those plain decoding with the same selector would emit. After every
    yielded step the cache holds every prompt and emitted token except the last emitted one
    (and that one, with the drafts after it, while a pass is queued ahead: see `behind`);
    on caches that are restored rather than trimmed (rollback.py), the tokens accepted by a
    partly rejected step are fed again with the next pass, and are in the cache once the
    generator finishes.
    """
    seq = as_sequence(prompt, settings)
    seq.check_cached(cached)
    prompt = seq.prompt
    cache = make_prompt_cache(model) if prompt_cache is None else prompt_cache
    rollback = Rollback(cache)
    rollback.fed(cached)
    speculation = seq.start(rollback.how, rollback.unsupported)
    drafter, selector, constraint, history = seq.drafter, seq.selector, seq.constraint, seq.history

    def forward(tokens, every: int = 0) -> mx.array:
        x = tokens if isinstance(tokens, mx.array) else mx.array(tokens, mx.uint32)
        with eager(cache, every):
            logits = model(x[None], cache=cache)
        rollback.fed(len(tokens))
        return logits[0]

    def judge(cur: _Pass) -> tuple[list[int], int, bool]:
        """What a verify pass emits (seq.judge), how many of its drafts equal the target's
        choices, and whether a near-tied row had to be recomputed: from a one-position pass after
        the drafts before it (any pass queued behind is dropped here)."""
        tokens, matched, n = seq.judge(read(cur.out), cur.rows, cur.drafts)  # the step's one read-back
        if n is None:
            return tokens, matched, False
        pos, drafts = cur.pos, cur.drafts
        rollback.rewind_to(pos - 1 + n)
        inputs = [*history, *drafts]
        if rollback.cached < pos - 1 + n:  # a restore went back further
            forward(inputs[rollback.cached : pos - 1 + n])
        return *seq.choose(forward([inputs[pos - 1 + n]])[-1], drafts, n), True

    def launch(tokens, drafts: list[int], pos: int, queued: bool) -> _Pass:
        """Queue a pass over `tokens` (ids, or a lazy array) whose last len(drafts) are drafts."""
        if drafts or queue_after is not None:
            rollback.mark()  # a pass that may be undone: a draft, or one queued behind it
        # A pass nothing runs ahead of starts running while it is built, where that pays (eager.py).
        rows = forward(tokens, 0 if queued or prices is None else prices.eager)[-1 - len(drafts):]
        out = selector.verdict(rows, pos) if drafts else selector.pick(rows[-1], history, pos).reshape(1)
        mx.async_eval(out)
        return _Pass(pos, drafts, out, queued, rows)

    def behind(cur: _Pass) -> _Pass | None:
        """The pass after `cur`, queued before `cur` is read, as if every draft of `cur` holds: its
        input is `cur`'s own next token (lazy), then what the drafter would draft after that.
        None where queuing it does not pay (`prices`)."""
        if cur.drafts and prices is None:  # unpriced, nothing is queued behind a draft (as replay)
            return None
        ahead, more = schedule.behind(drafter if speculation.on else None, cur.pos, cur.drafts, cur.queued)
        if more is None:
            return None
        if cur.drafts:  # behind a draft: with its continuation, else alone, else not at all
            if not prices.queue_behind(ahead.chance, len(more)):
                more = []
                if not prices.queue_behind(ahead.chance, 0):
                    return None
        bonus = cur.out[0, -1:] if cur.drafts else cur.out
        at = cur.pos + len(cur.drafts) + 1
        return launch(mx.concatenate([bonus, mx.array(more, mx.uint32)]) if more else bonus, more, at, True)

    with mx.stream(generation_stream):
        for start in range(cached, len(prompt) - 1, PREFILL_CHUNK):
            piece = prompt[start : min(start + PREFILL_CHUNK, len(prompt) - 1)]
            if seq.cancelled is not None and seq.cancelled():  # between pieces too: short ones are not stoppable
                return
            try:
                with stoppable(cache, seq.cancelled, len(piece)):
                    forward(piece)
                    mx.eval([c.state for c in cache])
            except Stopped:
                return
        yield seq.prefilled()

        # A pass is queued behind the one in flight before that one is read (as mlx_lm's
        # generate_step queues plain steps), assuming every draft in flight holds; where one does
        # not, the pass behind is dropped and its cache entries taken back (see `behind`).
        queue_after = None if constraint is not None else queue_after if speculation.on else 0
        schedule = Schedule(cap=seq.cap, end=seq.end, context_length=seq.context_length,
                            queue_after=queue_after,
                            gap=prices.gap if prices is not None else None)
        inflight: _Pass | None = None
        try:
            while True:
                if inflight is None:
                    pos = len(history)
                    drafts = seq.with_forced(schedule.draft(drafter, pos), schedule.room(pos))
                    # The last token, after any a restore took back out of the cache, then drafts.
                    inflight = launch([*history[rollback.cached:], *drafts], drafts, pos, False)
                cur, inflight = inflight, None
                nxt = behind(cur)
                if cur.drafts:
                    tokens, matched, confirmed = judge(cur)
                else:
                    tokens, matched, confirmed = seq.plain(cur.out.item(), cur.rows[-1]), 0, False
                step = seq.finish(tokens, len(cur.drafts), matched, confirmed, cur.queued)
                if seq.failed is not None:
                    raise seq.failed
                if nxt is not None and not step.stop_reason and not confirmed and matched == len(cur.drafts):
                    inflight = nxt  # every draft held: the pass behind is the right next one
                else:
                    rollback.rewind_to(len(history) - 1)
                yield step
                if step.stop_reason:
                    return
        finally:
            rollback.rewind_to(len(history) - 1)
            if rollback.cached < len(history) - 1:  # accepted tokens a restore took back out
                forward(history[rollback.cached:-1])
