"""`batch_generate`: mlx_lm.batch_generate's signature and return type (a BatchResponse), run on
specgen's batch engine (engine/batch.py): the prompts are decoded together, each speculating with
its own drafter, and each text is exactly what `specgen.generate` gives for that prompt alone.

Models whose caches cannot batch by per-row ends (state-space, sliding-window, quantized caches)
run their prompts one at a time, with a SpecgenWarning saying why.
"""

from __future__ import annotations

import logging
from dataclasses import asdict
from typing import Sequence

from mlx_lm.generate import BatchResponse
from mlx_lm.generate_utils import BatchCounters, BatchCountersSnapshot
from mlx_lm.models.cache import make_prompt_cache

from specgen import defaults
from specgen.api.generate import _notice, _prompt_ids, engine_for, stream_generate
from specgen.engine import batch_cost
from specgen.engine.batch import MAX_ROWS, Batch
from specgen.engine.batch_cache import unbatchable
from specgen.engine.engine import Engine
from specgen.engine.options import Options
from specgen.engine.sampling import CUSTOM_OFF, MlxLmSampling, make_selector
from specgen.engine.stops import StopText
from specgen.errors import SettingError

_log = logging.getLogger("specgen")
# mlx_lm.batch_generate's arguments that specgen does not offer (it would ignore them).
_NOT_OFFERED = ("prompt_caches", "return_prompt_caches", "return_logprobs", "max_kv_size")


def batch_generate(model, tokenizer, prompts: Sequence[str | Sequence[int]],
                   max_tokens: int | Sequence[int] = 128, verbose: bool = False, *,
                   return_token_ids: bool = False, sampler=None, logits_processors=None,
                   completion_batch_size: int = MAX_ROWS, prefill_step_size: int | None = None,
                   stop: str | Sequence[str] = (), seed: int | Sequence[int] | None = None,
                   **options) -> BatchResponse:
    """Generate from every prompt (strings or token ids), up to `completion_batch_size` at once,
    and return mlx-lm's BatchResponse (texts in prompt order, BatchStats; `token_ids` with
    `return_token_ids`). `max_tokens` and `seed` may be one value or one per prompt; a single
    seed gives every prompt the text that seed gives it alone. Other keywords as in
    specgen.generate (temp, top_p, top_k, min_p, draft, memory, ngram_order, window)."""
    for name in _NOT_OFFERED:
        if options.pop(name, None) not in (None, False):
            raise SettingError(name, "is not offered by specgen.batch_generate")
    options.pop("prefill_batch_size", None)  # prompts are prefilled one chunk at a time
    unknown = set(options) - set(Options.__dataclass_fields__)
    if unknown:
        raise SettingError(min(unknown), "is not a parameter of specgen.batch_generate")
    n = len(prompts)
    limits = _per_prompt("max_tokens", max_tokens, n)
    seeds = _per_prompt("seed", seed, n)
    stops = (stop,) if isinstance(stop, str) else tuple(stop)
    engine = engine_for(model, tokenizer)
    custom = sampler is not None or bool(logits_processors)
    opts = [Options(max_tokens=m, seed=s, stop=stops, **options) for m, s in zip(limits, seeds)]
    for name, message in opts[0].check() if opts else ():
        _notice(f"{name} {message}")
    for o in opts[1:]:
        o.check()
    if custom and (opts[0].temp or seed is not None):
        raise SettingError("sampler", "and temp/top_p/top_k/min_p/seed are two ways to sample: pass one")
    ids = [_prompt_ids(engine.loaded.tokenizer, p) for p in prompts]
    if not all(ids):
        raise SettingError("prompts", "holds an empty prompt")
    why = unbatchable(make_prompt_cache(model))
    start = BatchCountersSnapshot()
    if why:
        _notice(f"this model's prompts run one at a time: {why}")
        counters = BatchCounters()
        outputs = [_alone(model, tokenizer, p, o, sampler, logits_processors, counters)
                   for p, o in zip(ids, opts)]
    else:
        batch = Batch(model, max_rows=completion_batch_size, pricing=_pricing(engine, opts, custom,
                                                                              completion_batch_size),
                      **({"prefill_chunk": prefill_step_size} if prefill_step_size else {}))
        outputs = _batched(engine, batch, ids, opts, sampler, logits_processors, verbose)
        counters = batch.counters
    stats = BatchCountersSnapshot.between(start, BatchCountersSnapshot(**asdict(counters)))
    texts = [tokenizer.decode(out) if text is None else text for out, text in outputs]
    if verbose:
        print(f"[batch_generate] Prompt: {stats.prompt_tokens} tokens, {stats.prompt_tps:.3f} tokens-per-sec")
        print(f"[batch_generate] Generation: {stats.generation_tokens} tokens, "
              f"{stats.generation_tps:.3f} tokens-per-sec")
        print(f"[batch_generate] Peak memory: {stats.peak_memory:.3f} GB")
    return BatchResponse(texts, stats, None, [out for out, _ in outputs] if return_token_ids else None)


def _per_prompt(name: str, value, n: int) -> list:
    if value is None or isinstance(value, int):
        return [value] * n
    values = list(value)
    if len(values) != n:
        raise SettingError(name, f"must be one value or one per prompt ({n})", len(values))
    return values


def _batched(engine: Engine, batch: Batch, ids, opts, sampler, processors, verbose):
    """Every prompt through one batch: (token ids, text or None to decode) in prompt order."""
    texts = [_Text(engine.loaded.tokenizer, o.stop) if o.stop else None for o in opts]
    tokens: list[list[int]] = [[] for _ in ids]
    for i, (prompt, o) in enumerate(zip(ids, opts)):
        batch.add(i, prompt, **_row(engine, o, sampler, processors))
    finished = 0
    for events in batch.run():
        for i, event in events:
            new = getattr(event, "tokens", ())
            tokens[i] += new
            if texts[i] is not None and texts[i].add(new):
                batch.cancel(i)
            if getattr(event, "stop_reason", None) or (texts[i] is not None and texts[i].stopped):
                finished += 1
                if verbose:
                    print(f"[batch_generate] Finished processing {finished}/{len(ids)} ...", end="\r")
    if verbose:
        print(f"[batch_generate] Finished processing {finished}/{len(ids)}")
    for x in texts:
        if x is not None:
            x.close()
    return [(t, None if x is None else x.text) for t, x in zip(tokens, texts)]


def _pricing(engine: Engine, opts: list[Options], custom: bool, max_rows: int):
    """The batch's draft pricing by rows (batch_cost.py), where any prompt drafts adaptively."""
    if custom or all(o.draft is not None for o in opts) or engine.costs().off:
        return None
    loaded = engine.loaded
    grid, warning = batch_cost.load_or_measure(loaded.model, loaded.calibration_key, loaded.tokenizer,
                                               max_rows)
    if warning:
        engine.notice(warning)
    return batch_cost.Pricing(grid)


def _row(engine: Engine, opts: Options, sampler, processors) -> dict:
    """Batch.add's arguments for one prompt, as Engine.stream sets up a single generation."""
    custom = sampler is not None or bool(processors)
    selector = MlxLmSampling(sampler, processors) if custom else make_selector(
        opts.temp, top_p=opts.top_p, top_k=opts.top_k, min_p=opts.min_p, seed=opts.seed)
    found = engine.costs() if opts.draft is None and not custom else None
    off = CUSTOM_OFF if custom else (found.off if found else None)
    loaded = engine.loaded
    return {"drafter": engine.new_drafter(opts, measured=found is not None),
            "draft": defaults.MAX_DRAFT if opts.draft is None else opts.draft,
            "max_tokens": opts.max_tokens, "stop_tokens": loaded.stop_ids,
            "context_length": loaded.context_length, "selector": selector, "off": off}


class _Text:
    """A row's text through its stop strings, detokenized as it comes."""

    def __init__(self, tokenizer, stops):
        self.detok, self.stops, self.text = tokenizer.detokenizer, StopText(stops), ""

    @property
    def stopped(self) -> bool:
        return self.stops.stopped

    def add(self, tokens) -> bool:
        """Take a step's tokens; whether a stop string appeared (the text ends before it)."""
        for t in tokens:
            self.detok.add_token(t)
            shown, stopped = self.stops.add(self.detok.last_segment)
            self.text += shown
            if stopped:
                return True
        return False

    def close(self) -> None:
        """The end of the row's tokens: what the detokenizer and the stop strings held back."""
        if not self.stopped:
            self.detok.finalize()
            shown, _ = self.stops.add(self.detok.last_segment)
            self.text += shown + self.stops.flush()


def _alone(model, tokenizer, prompt, opts: Options, sampler, processors, counters: BatchCounters):
    """One prompt through specgen.generate's path: (token ids, text); its work is counted."""
    settings = {k: v for k, v in asdict(opts).items() if k not in ("max_tokens", "stop")}
    text, last = "", None
    for last in stream_generate(model, tokenizer, prompt, opts.max_tokens, sampler=sampler,
                                logits_processors=processors, stop=opts.stop, **settings):
        text += last.text
    s = last.stats
    counters.prompt_tokens += s.prompt_tokens
    counters.prompt_time += s.prefill_s
    counters.generation_tokens += len(s.output_ids)
    counters.generation_steps += s.counts.steps
    counters.decode_time += s.decode_s
    return list(s.output_ids), text
