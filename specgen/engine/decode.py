"""The decode loop: drafts verified by the target model in one forward pass per step.

`generate` is a generator of events (`Prefilled`, then one `Step` per target forward pass); it
never prints and never times anything: stats and display are computed by the caller.
"""

from __future__ import annotations

from typing import Iterator, NamedTuple, Sequence

import mlx.core as mx
from mlx_lm.generate import generation_stream
from mlx_lm.models.cache import make_prompt_cache

from specgen import defaults
from specgen.draft.events import Drafter, Prefilled, Speculation, Step, Verdict
from specgen.draft.predictor import NGramPredictor
from specgen.draft.schedule import Schedule
from specgen.engine.constrain import Constraint
from specgen.engine.cost import StepPrices
from specgen.engine.eager import eager
from specgen.engine.rollback import Rollback
from specgen.engine.sampling import GREEDY, Selector, accept, read, settle
from specgen.errors import InputError
from specgen.settings import check

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
    own: bool = True  # its drafts include the drafter's (else a grammar's forced tokens alone)


def check_prompt(prompt: Sequence[int], *, max_tokens: int, draft: int, context_length: int | None,
                 cached: int) -> None:
    """Refuse what no generation can run (decode.generate's and the batch's one check): an empty
    prompt, bad settings, a prompt the context cannot hold, `cached` outside the prompt."""
    if not prompt:
        raise InputError("the prompt is empty")
    check(max_tokens=max_tokens, draft=draft)
    if context_length is not None and len(prompt) >= context_length:
        raise InputError(
            f"the prompt is {len(prompt)} tokens but the model's context is {context_length} "
            f"tokens: at most {context_length - 1} prompt tokens fit"
        )
    if not 0 <= cached < len(prompt):
        raise ValueError(f"cached must be in [0, {len(prompt)}): the last prompt token is always fed")


def generate(
    model,
    prompt: Sequence[int],
    *,
    drafter: Drafter | None = None,
    draft: int = defaults.DRAFT_LEN,
    max_tokens: int = defaults.MAX_TOKENS,
    stop_tokens: frozenset[int] | set[int] = frozenset(),
    context_length: int | None = None,
    prompt_cache: list | None = None,
    cached: int = 0,
    drafter_fed: int = 0,
    selector: Selector = GREEDY,
    queue_after: int | None = None,
    off: str | None = None,
    prices: StepPrices | None = None,
    constraint: Constraint | None = None,
) -> Iterator[Prefilled | Step]:
    """Generate from `prompt` (token ids), speculating with `drafter` (up to `draft` tokens a
    step; 0: plain decoding); `off` says why not to speculate at all (e.g. cost.unprofitable).
    `prompt_cache` may already hold the first `cached` tokens of `prompt` (an earlier turn of the
    same conversation): only the rest is prefilled, while positions (sampling keys, the context
    check) and the drafter still see the whole prompt. Likewise `drafter` may already have been
    fed the first `drafter_fed` tokens of `prompt` (a server's earlier turn): it gets the rest.
    `queue_after`: None, every pass is read before the next is built; else passes are queued
    behind the one in flight (plain ones as schedule.py says, behind drafts as `prices` says).
    `prices` (cost.StepPrices): what steps cost in plain steps as this loop runs them, which
    decides where a pass is queued behind another, and how a pass nothing runs ahead of is
    evaluated (eagerly where the prices were timed so). `constraint` (constrain.py): a grammar every
    emitted token obeys, as plain decoding with its mask would choose; its forced tokens are
    drafted. Its mask needs the last token on the host, so passes are then not queued ahead.

    The emitted tokens are those plain decoding with the same selector would emit. After every
    yielded step the cache holds every prompt and emitted token except the last emitted one
    (and that one, with the drafts after it, while a pass is queued ahead: see `behind`);
    on caches that are restored rather than trimmed (rollback.py), the tokens accepted by a
    partly rejected step are fed again with the next pass, and are in the cache once the
    generator finishes.
    """
    check_prompt(prompt, max_tokens=max_tokens, draft=draft, context_length=context_length, cached=cached)
    if not 0 <= drafter_fed <= len(prompt):
        raise ValueError(f"drafter_fed must be in [0, {len(prompt)}]")
    cache = make_prompt_cache(model) if prompt_cache is None else prompt_cache
    rollback = Rollback(cache)
    rollback.fed(cached)
    off = off or rollback.unsupported
    if off or draft == 0:
        speculation = Speculation(False, off or "draft length is 0")
    else:
        speculation = Speculation(True, rollback=rollback.how)
    drafter = drafter if drafter is not None else NGramPredictor()
    history = list(prompt)  # prompt + emitted tokens; its last token is not in the cache yet

    def forward(tokens, every: int = 0) -> mx.array:
        x = tokens if isinstance(tokens, mx.array) else mx.array(tokens, mx.uint32)
        with eager(cache, every):
            logits = model(x[None], cache=cache)
        rollback.fed(len(tokens))
        return logits[0]

    def finish(emitted: list[int], drafted: int = 0, matched: int = 0
               ) -> tuple[list[int], str | None, int | None]:
        """Cut `emitted` before any stop token, record it and tell the drafter how its draft of
        `drafted` tokens fared (`matched` equal the target's choices); return the tokens kept, the
        stop reason and the stop token that ended it, if one did."""
        stop = stop_token = None
        for i, t in enumerate(emitted):
            if t in stop_tokens:
                emitted, stop, stop_token = emitted[:i], "stop", t
                break
        history.extend(emitted)
        if constraint is not None:
            constraint.advance(emitted)
        if speculation.on:
            drafter.feed(emitted, Verdict.of(drafted, matched, len(emitted)) if drafted else None)
        generated = len(history) - len(prompt)
        if stop is None and generated >= max_tokens:
            stop = "max_tokens"
        elif stop is None and context_length is not None and len(history) >= context_length:
            stop = "context"
        return emitted, stop, stop_token

    def judge(cur: _Pass) -> tuple[list[int], int, bool]:
        """What a verify pass emits, how many of its drafts equal the target's choices, and whether
        a near-tied row had to be recomputed.

        A draft token is accepted iff it equals the selector's choice at its position (argmax, or
        the sample keyed by seed and position); the first mismatch (or the position after the last
        draft) emits that choice: each step yields exactly what plain decoding would."""
        pos, drafts = cur.pos, cur.drafts
        chosen = read(cur.out)  # the one read-back of the step
        drafter.recycle([history[-1], *drafts], chosen.tokens)
        if constraint is not None:
            chosen = constraint.verified(chosen, cur.rows, drafts, pos)
        tokens, matched, n = accept(drafts, chosen)
        if n is None:
            return tokens, matched, False
        # The row choosing the last token is near-tied: choose it as plain decoding does, from a
        # one-position pass after the drafts before it (any pass queued behind is dropped here).
        rollback.rewind_to(pos - 1 + n)
        seq = [*history, *drafts]
        if rollback.cached < pos - 1 + n:  # a restore went back further
            forward(seq[rollback.cached : pos - 1 + n])
        logits = forward([seq[pos - 1 + n]])[-1]
        last = (selector.pick(logits, history, pos + n).item() if constraint is None
                else constraint.pick(logits, history, pos + n, after=drafts[:n]))
        return *settle(drafts, n, last), True

    def launch(tokens, drafts: list[int], pos: int, queued: bool, own: bool = True) -> _Pass:
        """Queue a pass over `tokens` (ids, or a lazy array) whose last len(drafts) are drafts."""
        if drafts or queue_after is not None:
            rollback.mark()  # a pass that may be undone: a draft, or one queued behind it
        # A pass nothing runs ahead of starts running while it is built, where that pays (eager.py).
        rows = forward(tokens, 0 if queued or prices is None else prices.eager)[-1 - len(drafts):]
        out = selector.verdict(rows, pos) if drafts else selector.pick(rows[-1], history, pos).reshape(1)
        mx.async_eval(out)
        return _Pass(pos, drafts, out, queued, rows, own)

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
            forward(prompt[start : min(start + PREFILL_CHUNK, len(prompt) - 1)])
            mx.eval([c.state for c in cache])
        if speculation.on:
            drafter.feed(prompt[drafter_fed:])
        yield Prefilled(len(prompt), speculation)

        # A pass is queued behind the one in flight before that one is read (as mlx_lm's
        # generate_step queues plain steps), assuming every draft in flight holds; where one does
        # not, the pass behind is dropped and its cache entries taken back (see `behind`).
        queue_after = None if constraint is not None else queue_after if speculation.on else 0
        schedule = Schedule(cap=draft if speculation.on else 0, end=len(prompt) + max_tokens,
                            context_length=context_length, queue_after=queue_after,
                            gap=prices.gap if prices is not None else None)
        inflight: _Pass | None = None
        try:
            while True:
                if inflight is None:
                    pos = len(history)
                    drafts, own = schedule.draft(drafter, pos), True
                    if constraint is not None and schedule.room(pos) > 0:
                        drafts, own = constraint.drafts(drafts, schedule.room(pos))
                    # The last token, after any a restore took back out of the cache, then drafts.
                    inflight = launch([*history[rollback.cached:], *drafts], drafts, pos, False, own)
                cur, inflight = inflight, None
                nxt = behind(cur)
                if cur.drafts:
                    tokens, matched, confirmed = judge(cur)
                    told = (len(cur.drafts), matched) if cur.own else (0, 0)
                else:
                    tokens, matched, confirmed = [cur.out.item()], 0, False
                    if speculation.on:
                        drafter.recycle(history[-1:], tokens)
                    if constraint is not None:
                        tokens = [constraint.pick(cur.rows[-1], history, cur.pos, chosen=tokens[0])]
                    told = 0, 0
                emitted, stop, stop_token = finish(tokens, *told)
                if nxt is not None and not stop and not confirmed and matched == len(cur.drafts):
                    inflight = nxt  # every draft held: the pass behind is the right next one
                else:
                    rollback.rewind_to(len(history) - 1)
                yield Step(tuple(emitted), len(cur.drafts), min(matched, len(emitted)), stop,
                           confirmed=confirmed, stop_token=stop_token, queued=cur.queued)
                if stop:
                    return
        finally:
            rollback.rewind_to(len(history) - 1)
            if rollback.cached < len(history) - 1:  # accepted tokens a restore took back out
                forward(history[rollback.cached:-1])
