"""The decode loop: n-gram drafts verified by the target model in one forward pass per step.

`generate` is a generator of events (`Prefilled`, then one `Step` per target forward pass); it
never prints and never times anything: stats and display are computed by the caller.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Sequence

import mlx.core as mx
from mlx_lm.generate import generation_stream
from mlx_lm.models.cache import make_prompt_cache, trim_prompt_cache

from . import defaults
from .errors import InputError
from .predictor import NGramPredictor
from .sampling import GREEDY, Selector

PREFILL_CHUNK = 2048  # prompt tokens per prefill forward pass, as in mlx_lm.generate_step


@dataclass(frozen=True)
class Prefilled:
    """The prompt is in the cache; `speculation` is "on" or "off: <reason>"."""

    prompt_tokens: int
    speculation: str


@dataclass(frozen=True)
class Step:
    """One target forward pass after prefill.

    `tokens` were emitted (never a stop token or anything after one); the first `accepted` of them
    came from the draft; `drafted` tokens were verified. `stop_reason` is set on the last step:
    "stop" (EOS or a stop token), "max_tokens" or "context" (the model's context is full).
    """

    tokens: tuple[int, ...]
    drafted: int = 0
    accepted: int = 0
    stop_reason: str | None = None
    notice: str | None = None


def rollback_limit(cache: Sequence) -> tuple[int | None, str | None]:
    """How long the cache may grow and still be trimmed, and why it cannot be trimmed at all.

    Returns (None, None) for plain KV caches, (max_size, None) for sliding-window caches (they can
    be trimmed only until they wrap), and (0, reason) for caches that cannot be trimmed (SSM state).
    """
    stuck = sorted({type(c).__name__ for c in cache if not c.is_trimmable()})
    if stuck:
        return 0, f"the model's cache cannot be rolled back ({', '.join(stuck)})"
    sizes = [c.max_size for c in cache if getattr(c, "max_size", None)]
    return (min(sizes) if sizes else None), None


def check_settings(*, max_tokens: int, draft: int | None) -> None:
    """Reject settings no generation can use (before paying for a model load)."""
    if max_tokens < 1:
        raise InputError(f"--max-tokens must be at least 1 (got {max_tokens})")
    if draft is not None and draft < 0:
        raise InputError(f"--draft must be 0 or more (got {draft})")


def draft_room(draft: int, pos: int, end: int, context_length: int | None) -> int:
    """The most tokens a step starting at absolute position `pos` may draft.

    A step emits up to room + 1 tokens, so it must stop short of `end` (prompt + max tokens) and of
    the model's context.
    """
    room = min(draft, end - pos - 1)
    if context_length is not None:
        room = min(room, context_length - pos - 1)
    return max(room, 0)


def generate(
    model,
    prompt: Sequence[int],
    *,
    predictor: NGramPredictor | None = None,
    draft: int = defaults.DRAFT_LEN,
    max_tokens: int = defaults.MAX_TOKENS,
    stop_tokens: frozenset[int] | set[int] = frozenset(),
    context_length: int | None = None,
    prompt_cache: list | None = None,
    selector: Selector = GREEDY,
    pipeline_after: int | None = None,
) -> Iterator[Prefilled | Step]:
    """Generate from `prompt` (token ids), speculating with `predictor` when the cache allows it.

    The emitted tokens are those plain decoding with the same selector would emit. After every
    yielded step the cache holds every prompt and emitted token except the last emitted one
    (and that one too while a plain step is queued: see `pipeline_after` below).
    `pipeline_after`: queue plain steps ahead once the drafter has been silent this many steps in
    a row (None: never; see calibrate.pipeline_after).
    """
    if not prompt:
        raise InputError("the prompt is empty")
    check_settings(max_tokens=max_tokens, draft=draft)
    if context_length is not None and len(prompt) >= context_length:
        raise InputError(
            f"the prompt is {len(prompt)} tokens but the model's context is {context_length} "
            f"tokens: at most {context_length - 1} prompt tokens fit"
        )
    cache = make_prompt_cache(model) if prompt_cache is None else prompt_cache
    limit, stuck = rollback_limit(cache)
    speculation = "off: draft length is 0" if draft == 0 else f"off: {stuck}" if stuck else "on"
    predictor = predictor if predictor is not None else NGramPredictor()
    history = list(prompt)  # prompt + emitted tokens; its last token is not in the cache yet
    cached = 0  # entries in the cache, tracked here so rewinds need no cache internals

    def forward(tokens) -> mx.array:
        nonlocal cached
        x = tokens if isinstance(tokens, mx.array) else mx.array(tokens, mx.uint32)
        logits = model(x[None], cache=cache)
        cached += len(tokens)
        return logits[0]

    def rewind_to(n: int) -> None:
        nonlocal cached
        if cached > n and not stuck:
            trim_prompt_cache(cache, cached - n)
            cached = n

    def finish(emitted: list[int]) -> tuple[list[int], str | None]:
        """Cut `emitted` before any stop token and record it; return it with the stop reason."""
        stop = None
        for i, t in enumerate(emitted):
            if t in stop_tokens:
                emitted, stop = emitted[:i], "stop"
                break
        history.extend(emitted)
        if speculation == "on":
            predictor.update_batch(emitted)
        generated = len(history) - len(prompt)
        if stop is None and generated >= max_tokens:
            stop = "max_tokens"
        elif stop is None and context_length is not None and len(history) >= context_length:
            stop = "context"
        return emitted, stop

    with mx.stream(generation_stream):
        for start in range(0, len(prompt) - 1, PREFILL_CHUNK):
            forward(prompt[start : min(start + PREFILL_CHUNK, len(prompt) - 1)])
            mx.eval([c.state for c in cache])
        if speculation == "on":
            predictor.update_batch(prompt)
        yield Prefilled(len(prompt), speculation)

        # A plain step may be queued before the token in flight is read back, as
        # mlx_lm.generate_step does, so that Python overlaps the model: always when not speculating,
        # else once the drafter has had nothing to say `pipeline_after` steps in a row. A queued
        # step drafts nothing, whatever the drafter says about its position once it is read.
        queue_after = 0 if speculation != "on" else pipeline_after
        end = len(prompt) + max_tokens
        pending = None  # the lazy token of a queued plain step, at position len(history)
        silent = 0  # steps in a row for which the drafter had nothing
        warned = False
        try:
            while True:
                pos = len(history)  # absolute position of the token this step emits first
                room, notice = 0, None
                if speculation == "on":
                    room = draft_room(draft, pos, end, context_length)
                    if limit is not None and limit - pos - 1 < room:
                        room = max(limit - pos - 1, 0)
                        if room == 0 and not warned:
                            warned = True
                            notice = (f"speculation off from token {pos}: the sliding-window "
                                      "cache cannot be rolled back once it wraps")
                drafts = predictor.predict(room) if room > 0 else []
                if pending is None:
                    logits = forward([history[-1], *drafts])
                    if drafts:
                        # A draft token is accepted iff it equals the selector's choice at its
                        # position (argmax, or the sample keyed by seed and position); the first
                        # mismatch (or the position after the last draft) emits that choice: each
                        # step yields exactly what plain decoding would.
                        chosen = selector.verify(logits, history, pos, drafts)
                        n = 0
                        while n < len(drafts) and drafts[n] == chosen[n]:
                            n += 1
                        emitted, stop = finish(drafts[:n] + [chosen[n]])
                        rewind_to(len(history) - 1)
                        silent = 0
                        yield Step(tuple(emitted), len(drafts), min(n, len(emitted)), stop, notice)
                        if stop:
                            return
                        continue
                    pending = selector.pick(logits[-1], history, pos)
                silent = 0 if drafts else silent + 1
                queued = None
                if (queue_after is not None and silent >= queue_after and pos + 1 < end
                        and (context_length is None or pos + 1 < context_length)):
                    queued = selector.pick(forward(pending.reshape(1))[-1], history, pos + 1)
                    mx.async_eval(queued)
                emitted, stop = finish([pending.item()])
                yield Step(tuple(emitted), stop_reason=stop, notice=notice)
                if stop:
                    return
                pending = queued
        finally:
            rewind_to(len(history) - 1)
