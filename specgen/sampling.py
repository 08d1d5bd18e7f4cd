"""How the target's logits become tokens: greedy, or seeded sampling. Every selector offers two calls:

- `pick(logits_row, history, position)`: a lazy token for one position (the pipelined plain path);
- `verify(logits, history, position, drafts)`: the model's tokens at each verified position
  (`logits` has len(drafts) + 1 rows, the first at `position`), as a list.
"""

from __future__ import annotations

import secrets
from typing import Protocol, Sequence

import mlx.core as mx
from mlx_lm.sample_utils import apply_min_p, apply_top_k, apply_top_p

from . import defaults
from .ngram import fnv1a_64
from .settings import check


class Selector(Protocol):
    def pick(self, logits: mx.array, history: Sequence[int], position: int) -> mx.array: ...

    def verify(
        self, logits: mx.array, history: Sequence[int], position: int, drafts: Sequence[int]
    ) -> list[int]: ...


class Greedy:
    """Argmax at every position: what mlx-lm's greedy sampler does."""

    def pick(self, logits, history, position):
        return mx.argmax(logits, axis=-1)

    def verify(self, logits, history, position, drafts):
        return mx.argmax(logits, axis=-1).tolist()


GREEDY = Greedy()


class Sampler:
    """Temperature sampling with mlx-lm's top-p / min-p / top-k filters, keyed by (seed, position).

    The noise for a position depends only on the seed and that absolute position (Gumbel-max, an
    exponential race), so a token is the same whether plain decoding or a verify step reached it:
    speculation keeps the sampling distribution exactly, and one seed gives one output.
    """

    def __init__(self, temp: float, *, top_p: float = defaults.TOP_P, top_k: int = defaults.TOP_K,
                 min_p: float = defaults.MIN_P, seed: int = 0):
        check(temp=temp, top_p=top_p, top_k=top_k, min_p=min_p, seed=seed)
        self.temp, self.top_p, self.top_k, self.min_p, self.seed = temp, top_p, top_k, min_p, seed

    def _choose(self, logits: mx.array, first_position: int) -> mx.array:
        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        # The same filters, in the same order, as mlx_lm.sample_utils.make_sampler.
        if 0 < self.top_p < 1:
            logprobs = apply_top_p(logprobs, self.top_p)
        if self.min_p > 0:
            logprobs = apply_min_p(logprobs, self.min_p)
        if 0 < self.top_k < logprobs.shape[-1]:
            logprobs = apply_top_k(logprobs, self.top_k)
        rows = logprobs.shape[0] if logprobs.ndim == 2 else 1
        noise = mx.stack([
            mx.random.gumbel(shape=logprobs.shape[-1:], key=mx.random.key(fnv1a_64((self.seed, first_position + i))))
            for i in range(rows)
        ]).reshape(logprobs.shape)
        return mx.argmax(logprobs * (1.0 / self.temp) + noise, axis=-1)

    def pick(self, logits, history, position):
        return self._choose(logits, position)

    def verify(self, logits, history, position, drafts):
        return self._choose(logits, position).tolist()


def make_selector(temp: float = defaults.TEMP, *, top_p: float = defaults.TOP_P,
                  top_k: int = defaults.TOP_K, min_p: float = defaults.MIN_P,
                  seed: int | None = None) -> Selector:
    """Greedy at temperature 0, else a Sampler; no seed means a fresh random one (see `.seed`)."""
    check(temp=temp, top_p=top_p, top_k=top_k, min_p=min_p, seed=seed)
    if temp == 0:
        return GREEDY
    seed = secrets.randbits(32) if seed is None else seed
    return Sampler(temp, top_p=top_p, top_k=top_k, min_p=min_p, seed=seed)
