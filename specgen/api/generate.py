"""The Python API: `load`, `generate` and `stream_generate` with mlx-lm's signatures and return
types, speculating underneath, so that a script written for mlx-lm runs on specgen unchanged.

`load` returns mlx-lm's (model, tokenizer) pair and keeps the `Engine` built for it (its stop
tokens, measured verify cost and memory); a pair loaded by mlx_lm.load gets an engine on first
use. mlx-lm's keywords (`max_tokens`, `sampler`, `logits_processors`, `prompt_cache`) mean what
they mean there; specgen's own are `temp`/`top_p`/`top_k`/`min_p`/`seed` (sampling that keeps
speculating), `draft`, `memory`, `prediction`, `stop`, `ngram_order`, `window`, and
`response_format` (a JSON schema, JSON object, Lark grammar or regex the output obeys: see
specgen.structured.formats). Anything else is an error naming it: nothing is ignored silently.
"""

from __future__ import annotations

import warnings
import weakref
from dataclasses import fields
from typing import Iterator, Sequence

from specgen import defaults
from specgen.engine.decode.sampling import CUSTOM_OFF, MlxLmSampling
from specgen.engine.engine import Engine, Request, Response
from specgen.engine.load import registry
from specgen.engine.options import Options
from specgen.errors import SettingError, SpecgenError
from specgen.structured.formats import parse as parse_format

_ENGINES: dict[int, Engine] = {}  # id(model) -> its engine, while the model lives
# cache[0] -> (the conversation so far, how much of it the cache holds): as in mlx-lm, a
# conversation is every prompt and every token yielded, its final one and a stop token included.
_CACHED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_OPTION_NAMES = {f.name for f in fields(Options)}


class SpecgenWarning(UserWarning):
    """A setting that is valid but changes nothing, or a cache that could not be used."""


def _notice(message: str) -> None:
    warnings.warn(message, SpecgenWarning, stacklevel=3)


def _register(engine: Engine) -> Engine:
    key = id(engine.loaded.model)
    _ENGINES[key] = engine
    weakref.finalize(engine.loaded.model, _ENGINES.pop, key, None)
    return engine


def load(path_or_hf_repo: str = defaults.MODEL, *, dtype: str | None = None, return_config: bool = False):
    """Load a model as mlx_lm.load does (alias, Hugging Face repo id or folder): (model,
    tokenizer). `dtype` converts (and dequantizes) the weights."""
    engine = _register(Engine.load(path_or_hf_repo, dtype=dtype, notice=_notice, progress=lambda _: None))
    if return_config:
        return engine.loaded.model, engine.loaded.tokenizer, engine.loaded.config
    return engine.loaded.model, engine.loaded.tokenizer


def engine_for(model, tokenizer) -> Engine:
    """The engine of a model loaded by `load`, or a new one for a pair from mlx_lm.load."""
    found = _ENGINES.get(id(model))
    if found is not None and found.loaded.model is model:
        return found
    return _register(Engine(registry.wrap(model, tokenizer), notice=_notice, progress=lambda _: None))


def _prompt_ids(tokenizer, prompt) -> list[int]:
    """Token ids of a prompt as mlx-lm's stream_generate makes them (BOS added unless present)."""
    if isinstance(prompt, str):
        bos = getattr(tokenizer, "bos_token", None)
        return list(tokenizer.encode(prompt, add_special_tokens=bos is None or not prompt.startswith(bos)))
    ids = prompt.tolist() if hasattr(prompt, "tolist") else list(prompt)
    if not all(isinstance(t, int) for t in ids):
        raise SettingError("prompt", "must be a string or a sequence of token ids")
    return ids


def _custom_selector(opts: Options, sampler, logits_processors) -> MlxLmSampling | None:
    """mlx-lm's `sampler` and `logits_processors` as one request's selector (None when neither is
    given); refused beside specgen's own sampling settings, which would then be ignored."""
    if sampler is None and not logits_processors:
        return None
    if opts.temp or opts.top_p or opts.top_k or opts.min_p or opts.seed is not None:
        raise SettingError("sampler", "and temp/top_p/top_k/min_p/seed are two ways to sample: pass one")
    return MlxLmSampling(sampler, logits_processors)


def _cache_start(prompt_cache, ids: list[int]) -> tuple[list[int], int]:
    """(whole prompt, tokens of it already cached) for mlx-lm's prompt_cache semantics: the cache
    holds earlier turns (fed by specgen) and `ids` continue them. What the last call yielded but
    did not feed (its final token) is fed with `ids`, not in an extra pass."""
    if not prompt_cache:
        return ids, 0
    held = prompt_cache[0].offset if hasattr(prompt_cache[0], "offset") else 0
    if held == 0:
        return ids, 0
    known, in_cache = _CACHED.get(prompt_cache[0], (None, None))
    if known is None or in_cache != held:
        raise SettingError("prompt_cache", f"holds {held} tokens that specgen did not put there; pass "
                                           "a cache from make_prompt_cache used only through specgen")
    return known + ids, in_cache


def stream_generate(model, tokenizer, prompt: str | Sequence[int], max_tokens: int = defaults.MAX_TOKENS,
                    *, sampler=None, logits_processors=None, prompt_cache=None,
                    prediction: str | Sequence[int] | None = None, stop: str | Sequence[str] = (),
                    **options) -> Iterator[Response]:
    """Generate from `prompt`, yielding one mlx-lm GenerationResponse per token (with specgen's
    `stats`). Greedy by default, token for token what mlx_lm.stream_generate yields.
    `max_tokens=-1`, as in mlx-lm, means up to the model's context."""
    unknown = set(options) - _OPTION_NAMES
    if unknown:
        raise SettingError(sorted(unknown)[0], "is not a parameter of specgen.stream_generate")
    if max_tokens == -1:
        max_tokens = 2**62
    if "response_format" in options:
        options["response_format"] = parse_format(options["response_format"])
    opts = Options(max_tokens=max_tokens, stop=(stop,) if isinstance(stop, str) else tuple(stop), **options)
    for name, message in opts.check():
        _notice(f"{name} {message}")
    engine = engine_for(model, tokenizer)
    selector = _custom_selector(opts, sampler, logits_processors)
    new = _prompt_ids(engine.loaded.tokenizer, prompt)
    if not new:
        raise SettingError("prompt", "is empty")
    ids, cached = _cache_start(prompt_cache, new)
    request = Request(ids, opts, prompt_cache=prompt_cache, cached=cached, prediction=prediction,
                      selector=selector, off=CUSTOM_OFF if selector else None)
    last = None
    try:
        for last in engine.stream(request):
            yield last
    finally:
        if prompt_cache and last is not None:  # the cache holds all but the last token (Engine.stream)
            stats = last.stats
            said = ids + stats.output_ids + ([stats.stop_token] if stats.stop_token is not None else [])
            _CACHED[prompt_cache[0]] = (said, len(ids) + len(stats.output_ids) - 1)


def generate(model, tokenizer, prompt: str | Sequence[int], verbose: bool = False, **kwargs) -> str:
    """The whole text of `stream_generate(model, tokenizer, prompt, **kwargs)`, as mlx_lm.generate
    returns it (`verbose` is mlx-lm's: the text and speeds on stdout)."""
    text, response = "", None
    for response in stream_generate(model, tokenizer, prompt, **kwargs):
        if verbose:
            print(response.text, end="", flush=True)
        text += response.text
    if verbose and response is not None:
        s = response.stats
        print(f"\n{'=' * 10}\nPrompt: {response.prompt_tokens} tokens, {response.prompt_tps:.3f} tokens-per-sec\n"
              f"Generation: {response.generation_tokens} tokens, {response.generation_tps:.3f} tokens-per-sec "
              f"({s.counts.tokens_per_step:.2f} tokens per step)\nPeak memory: {response.peak_memory:.3f} GB")
    return text


__all__ = ["load", "generate", "stream_generate", "engine_for", "Response", "SpecgenWarning", "SpecgenError"]
