"""The decode loop: drafts verified by the target model in one forward pass per step.

`generate` is a generator of events (`Prefilled`, then one `Step` per target forward pass); it
never prints and never times anything: stats and display are computed by the caller.
"""

from __future__ import annotations

from typing import Iterator, Sequence

import mlx.core as mx
from mlx_lm.generate import generation_stream
from mlx_lm.models.cache import make_prompt_cache

from specgen import defaults
from specgen.draft.events import Drafter, Prefilled, Speculation, Step, Verdict
from specgen.draft.predictor import NGramPredictor
from specgen.draft.schedule import Schedule
from specgen.engine.rollback import Rollback
from specgen.engine.sampling import GREEDY, Selector, accept, settle
from specgen.errors import InputError
from specgen.settings import check

PREFILL_CHUNK = 2048  # prompt tokens per prefill forward pass, as in mlx_lm.generate_step


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
) -> Iterator[Prefilled | Step]:
    """Generate from `prompt` (token ids), speculating with `drafter` (up to `draft` tokens a
    step; 0: plain decoding); `off` says why not to speculate at all (e.g. cost.unprofitable).
    `prompt_cache` may already hold the first `cached` tokens of `prompt` (an earlier turn of the
    same conversation): only the rest is prefilled, while positions (sampling keys, the context
    check) and the drafter still see the whole prompt. Likewise `drafter` may already have been
    fed the first `drafter_fed` tokens of `prompt` (a server's earlier turn): it gets the rest.

    The emitted tokens are those plain decoding with the same selector would emit. After every
    yielded step the cache holds every prompt and emitted token except the last emitted one
    (and that one too while a plain step is queued ahead: see schedule.py and `queue_after`);
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

    def forward(tokens) -> mx.array:
        x = tokens if isinstance(tokens, mx.array) else mx.array(tokens, mx.uint32)
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
        if speculation.on:
            drafter.feed(emitted, Verdict.of(drafted, matched, len(emitted)) if drafted else None)
        generated = len(history) - len(prompt)
        if stop is None and generated >= max_tokens:
            stop = "max_tokens"
        elif stop is None and context_length is not None and len(history) >= context_length:
            stop = "context"
        return emitted, stop, stop_token

    def judge(logits: mx.array, drafts: list[int]) -> tuple[list[int], int, bool]:
        """What a verify pass over `drafts` emits, how many drafts equal the target's choices, and
        whether a near-tied row had to be recomputed.

        A draft token is accepted iff it equals the selector's choice at its position (argmax, or
        the sample keyed by seed and position); the first mismatch (or the position after the last
        draft) emits that choice: each step yields exactly what plain decoding would."""
        pos = len(history)
        chosen = selector.verify(logits, history, pos, drafts)
        drafter.recycle([history[-1], *drafts], chosen.tokens)
        tokens, matched, n = accept(drafts, chosen)
        if n is None:
            return tokens, matched, False
        # The row choosing the last token is near-tied: choose it as plain decoding does, from a
        # one-position pass after the drafts before it.
        rollback.rewind_to(pos - 1 + n)
        seq = [*history, *drafts]
        if rollback.cached < pos - 1 + n:  # a restore went back further
            forward(seq[rollback.cached : pos - 1 + n])
        last = selector.pick(forward([seq[pos - 1 + n]])[-1], history, pos + n).item()
        return *settle(drafts, n, last), True

    with mx.stream(generation_stream):
        for start in range(cached, len(prompt) - 1, PREFILL_CHUNK):
            forward(prompt[start : min(start + PREFILL_CHUNK, len(prompt) - 1)])
            mx.eval([c.state for c in cache])
        if speculation.on:
            drafter.feed(prompt[drafter_fed:])
        yield Prefilled(len(prompt), speculation)

        # Plain steps are queued ahead as mlx_lm.generate_step does: always when not speculating,
        # else once the drafter has been silent `queue_after` steps in a row (schedule.py).
        schedule = Schedule(cap=draft if speculation.on else 0, end=len(prompt) + max_tokens,
                            context_length=context_length,
                            queue_after=queue_after if speculation.on else 0)
        pending = None  # the lazy token of a queued plain step, at position len(history)
        try:
            while True:
                pos = len(history)  # absolute position of the token this step emits first
                room = schedule.room(pos)
                if pending is None:
                    drafts = drafter.draft(room) if room > 0 else []
                    if drafts:
                        rollback.mark()
                    # The last token, after any a restore took back out of the cache, then drafts.
                    fed = [*history[rollback.cached:], *drafts]
                    logits = forward(fed)[-1 - len(drafts):]
                    if drafts:
                        tokens, matched, confirmed = judge(logits, drafts)
                        emitted, stop, stop_token = finish(tokens, len(drafts), matched)
                        rollback.rewind_to(len(history) - 1)
                        schedule.heard(True)
                        yield Step(tuple(emitted), len(drafts), min(matched, len(emitted)), stop,
                                   confirmed=confirmed, stop_token=stop_token)
                        if stop:
                            return
                        continue
                    pending = selector.pick(logits[-1], history, pos)
                    schedule.heard(False)
                else:
                    schedule.heard(room > 0 and drafter.would_draft(room))
                queued = None
                if schedule.queue_next(pos):
                    rollback.mark()  # a step queued past the last token is taken back
                    queued = selector.pick(forward(pending.reshape(1))[-1], history, pos + 1)
                    mx.async_eval(queued)
                token = pending.item()
                if speculation.on:
                    drafter.recycle(history[-1:], [token])
                emitted, stop, stop_token = finish([token])
                yield Step(tuple(emitted), stop_reason=stop, stop_token=stop_token)
                if stop:
                    return
                pending = queued
        finally:
            rollback.rewind_to(len(history) - 1)
            if rollback.cached < len(history) - 1:  # accepted tokens a restore took back out
                forward(history[rollback.cached:-1])
