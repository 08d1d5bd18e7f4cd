"""How the target's logits become tokens: greedy, or seeded sampling. Every selector offers two calls:

- `pick(logits_row, history, position)`: a lazy token for one position (the pipelined plain path);
- `verify(logits, history, position, drafts)`: the model's tokens at each verified position
  (`logits` has len(drafts) + 1 rows, the first at `position`) and how many leading rows can be
  trusted to choose as a one-position pass would (`Verified`).

Why "trusted": a batched forward pass runs other kernels than a one-position pass, so its logits
may differ in the last bits (here: not at all on the 4-bit model, up to 7e-5 in float32 with
OpenBLAS). A row whose best two scores are closer than `TIE_MARGIN` could then choose another token
than plain decoding would, so the loop recomputes that row the plain way (loop.py).
"""

from __future__ import annotations

import secrets
from typing import NamedTuple, Protocol, Sequence

import mlx.core as mx
from mlx_lm.sample_utils import apply_min_p, apply_top_k, apply_top_p

from specgen import defaults
from specgen.draft.ngram import fnv1a_64
from specgen.settings import check

# Smallest gap between a row's best two scores (logits, or sampling's perturbed log-probabilities
# times the temperature) that a batched row may decide; by the logits' dtype (docs/design.md).
TIE_MARGIN = {"float32": 1e-3, "float16": 0.05, "bfloat16": 0.25}


class Verified(NamedTuple):
    """The selector's token at each verified row, and how many leading rows are not near-tied."""

    tokens: list[int]
    trusted: int


class Judged(NamedTuple):
    """What one verify pass emits for a sequence: the tokens, how many drafts equal the selector's
    choices, and the near-tied position whose choice must be made by a one-position pass (None:
    none; `tokens` then stop before it)."""

    tokens: list[int]
    matched: int
    tied: int | None


def accept(drafts: Sequence[int], chosen: Verified) -> Judged:
    """The longest prefix of `drafts` equal to the selector's choices, then its next choice: what
    plain decoding emits. A near-tied position reached first is left to the caller (`settle`)."""
    n = 0
    while n < len(drafts) and drafts[n] == chosen.tokens[n]:
        n += 1
    if chosen.trusted > n:
        return Judged([*drafts[:n], chosen.tokens[n]], n, None)
    return Judged(list(drafts[: chosen.trusted]), chosen.trusted, chosen.trusted)


def settle(drafts: Sequence[int], tied: int, last: int) -> tuple[list[int], int]:
    """(tokens emitted, drafts matched) once the near-tied position `tied` chose `last` alone."""
    return [*drafts[:tied], last], tied + (tied < len(drafts) and drafts[tied] == last)


def _verdict(scores: mx.array, margin: float) -> mx.array:
    """Lazily, per row: the argmax, and 1 where the row's top two scores are within `margin`:
    where not exactly one score is within it of the best (a NaN row has none: tied; margin 0
    ties nothing but NaN). Counting costs two reductions over the vocabulary; a top-2 partition
    cost 2.4x as much (CPU, 4 rows)."""
    best = mx.max(scores, axis=-1, keepdims=True)
    tied = (scores > best - margin).sum(axis=-1) != 1 if margin > 0 else mx.isnan(best[..., 0])
    return mx.stack([mx.argmax(scores, axis=-1).astype(mx.uint32), tied.astype(mx.uint32)])


def read(verdict: mx.array) -> Verified:
    """A verdict (`Selector.verdict`) read back in one transfer, trusting the rows up to the
    first near-tied one."""
    return read_all(verdict, [verdict.shape[1]])[0]


def read_all(verdicts: mx.array, sizes: Sequence[int]) -> list[Verified]:
    """Several sequences' verdicts, concatenated along the positions (`sizes[i]` each), read back
    in one transfer: a batched step reads once, whatever its rows."""
    tokens, tied = verdicts.tolist()
    out, at = [], 0
    for n in sizes:
        out.append(Verified(tokens[at : at + n], next((i for i, t in enumerate(tied[at : at + n]) if t), n)))
        at += n
    return out


def tie_margin(logits: mx.array) -> float:
    return TIE_MARGIN.get(str(logits.dtype).rsplit(".", 1)[-1], TIE_MARGIN["float32"])


class Selector(Protocol):
    def pick(self, logits: mx.array, history: Sequence[int], position: int) -> mx.array: ...

    def verify(
        self, logits: mx.array, history: Sequence[int], position: int, drafts: Sequence[int]
    ) -> Verified: ...

    def verdict(self, logits: mx.array, position: int) -> mx.array: ...


class Greedy:
    """Argmax at every position: what mlx-lm's greedy sampler does."""

    def pick(self, logits, history, position):
        return mx.argmax(logits, axis=-1)

    def verify(self, logits, history, position, drafts):
        return read(self.verdict(logits, position))

    def verdict(self, logits, position):
        """`verify` lazily (rows: tokens, near-ties), for a pass whose result is read later."""
        return _verdict(logits, tie_margin(logits))


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

    def _scores(self, logits: mx.array, first_position: int) -> mx.array:
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
        return logprobs * (1.0 / self.temp) + noise

    def pick(self, logits, history, position):
        return mx.argmax(self._scores(logits, position), axis=-1)

    def verify(self, logits, history, position, drafts):
        return read(self.verdict(logits, position))

    def verdict(self, logits, position):
        # A logit difference d moves a perturbed score by d / temp.
        return _verdict(self._scores(logits, position), tie_margin(logits) / self.temp)


def make_selector(temp: float = defaults.TEMP, *, top_p: float = defaults.TOP_P,
                  top_k: int = defaults.TOP_K, min_p: float = defaults.MIN_P,
                  seed: int | None = None) -> Selector:
    """Greedy at temperature 0, else a Sampler; no seed means a fresh random one (see `.seed`)."""
    check(temp=temp, top_p=top_p, top_k=top_k, min_p=min_p, seed=seed)
    if temp == 0:
        return GREEDY
    seed = secrets.randbits(32) if seed is None else seed
    return Sampler(temp, top_p=top_p, top_k=top_k, min_p=min_p, seed=seed)


class MlxLmSampling:
    """mlx-lm's own `sampler` and `logits_processors` (as passed to mlx_lm.generate), called once
    per emitted token in order as mlx-lm calls them; their random state and the tokens they read
    cannot be replayed for a draft's rows, so a run with them does not speculate (CUSTOM_OFF)."""

    def __init__(self, sampler=None, logits_processors=None):
        self.sampler, self.processors = sampler, list(logits_processors or [])
        self._tokens = None  # what the processors read: the prompt, then each pick (lazily)

    def pick(self, logits, history, position):
        # A queued step picks before the loop has the last token in `history`: keep the picks,
        # as mlx-lm's generate_step does.
        if self._tokens is None:
            self._tokens = mx.array(history[:position], mx.uint32)
        if self.processors:
            for process in self.processors:
                logits = process(self._tokens, logits[None])[0]
        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        token = (self.sampler or (lambda x: mx.argmax(x, axis=-1)))(logprobs[None]).reshape(-1)
        self._tokens = mx.concatenate([self._tokens, token.astype(mx.uint32)])
        return token[0]

    def verify(self, logits, history, position, drafts):  # pragma: no cover - never speculates
        raise RuntimeError("mlx-lm samplers do not verify drafts")


CUSTOM_OFF = "an mlx-lm sampler or logits processors (pass temp/top_p/top_k/min_p/seed to speculate)"
