"""`batch_generate`: mlx_lm.batch_generate's signature and return type (a BatchResponse), run on
specgen's batch engine (engine/batch/batch.py): the prompts are decoded together, each speculating with
its own drafter, and each text is exactly what `specgen.generate` gives for that prompt alone.

Models whose caches cannot batch by per-row ends (state-space, sliding-window, quantized caches)
run their prompts one at a time, with a SpecgenWarning saying why; the BatchStats count the same
work either way.
"""

from __future__ import annotations

import logging
from dataclasses import asdict
from typing import Sequence

from mlx_lm.generate import BatchResponse
from mlx_lm.generate_utils import BatchCounters, BatchCountersSnapshot

from specgen import defaults
from specgen.api.generate import _custom_selector, _notice, _prompt_ids, engine_for, stream_generate
from specgen.engine.batch.probe import batch_unsupported
from specgen.engine.batch.streams import Streams
from specgen.engine.decode.loop import PREFILL_CHUNK
from specgen.engine.decode.sampling import CUSTOM_OFF
from specgen.engine.engine import Request
from specgen.engine.options import Options
from specgen.errors import SettingError
from specgen.events import Failed
from specgen.settings import check
from specgen.structured.formats import parse as parse_format
from specgen.structured.grammar import GrammarFailed

_log = logging.getLogger("specgen")
# mlx_lm.batch_generate's arguments that specgen does not offer (it would ignore them).
_NOT_OFFERED = ("prompt_caches", "return_prompt_caches", "return_logprobs", "max_kv_size")


def batch_generate(model, tokenizer, prompts: Sequence[str | Sequence[int]],
                   max_tokens: int | Sequence[int] = defaults.BATCH_MAX_TOKENS, verbose: bool = False, *,
                   return_token_ids: bool = False, sampler=None, logits_processors=None,
                   completion_batch_size: int = defaults.BATCH, prefill_step_size: int = PREFILL_CHUNK,
                   stop: str | Sequence[str] = (), seed: int | Sequence[int] | None = None,
                   **options) -> BatchResponse:
    """Generate from every prompt (strings or token ids), up to `completion_batch_size` at once,
    and return mlx-lm's BatchResponse (texts in prompt order, BatchStats; `token_ids` with
    `return_token_ids`). `max_tokens` and `seed` may be one value or one per prompt; a single
    seed gives every prompt the text that seed gives it alone. `verbose` is mlx-lm's: progress
    and speeds on stdout, as specgen.generate prints its own. Other keywords as in
    specgen.generate (temp, top_p, top_k, min_p, draft, memory, ngram_order, window); `response_format`
    may be one for every prompt or a list of one per prompt (None where a prompt has none)."""
    for name in _NOT_OFFERED:
        if options.pop(name, None) not in (None, False):
            raise SettingError(name, "is not offered by specgen.batch_generate")
    if options.pop("prefill_batch_size", None) is not None:
        _notice("prefill_batch_size changes nothing: waiting prompts are prefilled together up to "
                "prefill_step_size tokens a step")
    unknown = set(options) - set(Options.__dataclass_fields__)
    if unknown:
        raise SettingError(min(unknown), "is not a parameter of specgen.batch_generate")
    for name, setting, value in (("completion_batch_size", "batch", completion_batch_size),
                                 ("prefill_step_size", "prefill_chunk", prefill_step_size)):
        try:
            check(**{setting: value})
        except SettingError as e:  # named as the caller named it
            raise SettingError(name, e.requirement, value) from None
    n = len(prompts)
    limits = _per_prompt("max_tokens", max_tokens, n)
    seeds = _per_prompt("seed", seed, n)
    formats = options.pop("response_format", None)
    formats = list(formats) if isinstance(formats, (list, tuple)) else [formats] * n
    if len(formats) != n:
        raise SettingError("response_format", f"must be one value or one per prompt ({n})", len(formats))
    formats = [parse_format(f) for f in formats]
    stops = (stop,) if isinstance(stop, str) else tuple(stop)
    engine = engine_for(model, tokenizer)
    opts = [Options(max_tokens=m, seed=s, stop=stops, response_format=f, **options)
            for m, s, f in zip(limits, seeds, formats)]
    for name, message in opts[0].check() if opts else ():
        _notice(f"{name} {message}")
    for o in opts[1:]:
        o.check()
    selectors = [_custom_selector(o, sampler, logits_processors) for o in opts]  # one state each
    ids = [_prompt_ids(engine.loaded.tokenizer, p) for p in prompts]
    if not all(ids):
        raise SettingError("prompts", "holds an empty prompt")
    why = batch_unsupported(engine.loaded.model)
    start = BatchCountersSnapshot()
    progress = _Progress(len(ids), verbose)
    if why:
        _notice(f"this model's prompts run one at a time: {why}")
        counters = BatchCounters()
        outputs = []
        for i, (p, o) in enumerate(zip(ids, opts)):
            try:
                outputs.append(_alone(model, tokenizer, p, o, sampler, logits_processors, counters))
            except GrammarFailed as e:  # its own error, as in a batch
                _failed_prompt(i, e)
                outputs.append(([], ""))
            progress.done()
    else:
        streams = Streams(engine, max_rows=completion_batch_size, prefill_chunk=prefill_step_size)
        outputs = _batched(streams, ids, opts, selectors, progress)
        counters = streams.batch.counters
    stats = BatchCountersSnapshot.between(start, BatchCountersSnapshot(**asdict(counters)))
    texts = [tokenizer.decode(out) if text is None else text for out, text in outputs]
    progress.end(stats)
    return BatchResponse(texts, stats, None, [out for out, _ in outputs] if return_token_ids else None)


def _failed_prompt(i: int, error: Exception) -> None:
    """Say that prompt `i` failed on its own (its grammar gave up): its text is empty."""
    _notice(f"prompt {i}: {error}; its text is empty")


def _per_prompt(name: str, value, n: int) -> list:
    # A string is one value, not one per character: "5" is then refused as not an integer.
    if value is None or isinstance(value, (int, float, str, bytes)) or not hasattr(value, "__iter__"):
        return [value] * n
    values = list(value)
    if len(values) != n:
        raise SettingError(name, f"must be one value or one per prompt ({n})", len(values))
    return values


class _Progress:
    """mlx_lm.batch_generate's `verbose` lines (the caller asked for them on stdout)."""

    def __init__(self, total: int, verbose: bool):
        self.total, self.verbose, self.finished = total, verbose, 0
        self._say(f"Finished processing 0/{total} ...", end="\r")

    def done(self) -> None:
        """Count one finished prompt."""
        self.finished += 1
        self._say(f"Finished processing {self.finished}/{self.total} ...", end="\r")

    def end(self, stats) -> None:
        self._say(f"Finished processing {self.finished}/{self.total}")
        self._say(f"Prompt: {stats.prompt_tokens} tokens, {stats.prompt_tps:.3f} tokens-per-sec")
        self._say(f"Generation: {stats.generation_tokens} tokens, {stats.generation_tps:.3f} tokens-per-sec")
        self._say(f"Peak memory: {stats.peak_memory:.3f} GB")

    def _say(self, line: str, end: str = "\n") -> None:
        if self.verbose:
            print(f"[batch_generate] {line}", end=end, flush=True)


def _batched(streams: Streams, ids, opts, selectors, progress: _Progress):
    """Every prompt through one batch: (token ids, its text where stop strings cut it, else None:
    decoded whole, as mlx-lm does) in prompt order."""
    runs = [streams.add(i, Request(p, o, selector=sel, off=CUSTOM_OFF if sel else None))
            for i, (p, o, sel) in enumerate(zip(ids, opts, selectors))]
    texts, failed = [""] * len(ids), set()
    while streams.busy:
        for i, response in streams.step():
            if isinstance(response, Failed):  # its own error: its text stays empty, the others go on
                _failed_prompt(i, response.error)
                streams.kept(i)
                failed.add(i)
                progress.done()
                continue
            texts[i] += response.text
            if response.finish_reason is not None:
                progress.done()
    return [([], "") if i in failed else (list(s.output_ids), t if o.stop else None)
            for i, (s, t, o) in enumerate(zip(runs, texts, opts))]


def _alone(model, tokenizer, prompt, opts: Options, sampler, processors, counters: BatchCounters):
    """One prompt through specgen.generate's path: (token ids, text); its work is counted."""
    settings = {k: v for k, v in asdict(opts).items() if k not in ("max_tokens", "stop")}
    text, last = "", None
    for last in stream_generate(model, tokenizer, prompt, opts.max_tokens, sampler=sampler,
                                logits_processors=processors, stop=opts.stop, **settings):
        text += last.text
    s = last.stats
    # As the batch counts: the last prompt token is fed by the first decode step, a stop token
    # is a generated token.
    counters.prompt_tokens += s.prompt_tokens - 1
    counters.prompt_time += s.prefill_s
    counters.generation_tokens += len(s.output_ids) + (s.stop_token is not None)
    counters.generation_steps += s.counts.steps
    counters.decode_time += s.decode_s
    return list(s.output_ids), text
