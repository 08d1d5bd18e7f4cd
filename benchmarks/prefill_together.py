"""What prefilling waiting prompts together would save: R prompts of P tokens each prefilled in R
passes of one row (what the batch engine does: engine/batch/prefill.py) against one pass of R rows
(what mlx-lm's BatchGenerator does, padded to the longest), on the accelerator proxy (an 8B
model's 32 layers at hidden 128: a pass's fixed work weighs as on a GPU) or a model folder.

    OPENBLAS_NUM_THREADS=1 LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libopenblas.so.0 \\
        python benchmarks/prefill_together.py [--model proxy|DIR] [--rounds 5]

Prints, per (P, R), the median seconds of each way over alternating rounds and their ratio;
then 15 prompts of 60-180 tokens (`--equal`: 118) after a 30-token prefix each: in 15 passes,
in one pass fed flat over the batch engine's ragged cache (engine/batch/slots.py's Flat, as a
batched step is fed), and in one raw pass padded to the longest.
"""

import argparse
import statistics
import time

import mlx.core as mx
import numpy as np
from accelerator import build
from mlx_lm.models.cache import make_prompt_cache

import specgen
from specgen.engine.batch.cache import RaggedBatch
from specgen.engine.batch.probe import probe


def separately(model, rows: int, length: int) -> None:
    for r in range(rows):
        _fill(model, mx.arange(length)[None] + r)


def together(model, rows: int, length: int) -> None:
    _fill(model, mx.arange(length)[None] + mx.arange(rows)[:, None])


def _fill(model, tokens: mx.array) -> None:
    """A prefill pass: the cache's entries evaluated, not the logits (no prompt token's is read)."""
    cache = make_prompt_cache(model)
    model(tokens, cache=cache)
    mx.eval([c.state for c in cache])


def ragged(model, rounds: int, equal: bool, rows: int = 15, prefix: int = 30) -> None:
    """Prompts of unequal lengths (or all 118) after a prefix each, as the batch engine holds them."""
    probe(model)  # attention by runs (attend.py), as a batch has it
    lengths = [118] * rows if equal else [int(n) for n in np.random.default_rng(0).integers(60, 180, rows)]

    def primed() -> list:
        caches = [make_prompt_cache(model) for _ in range(rows)]
        for c in caches:
            model(mx.arange(prefix)[None] + 5, cache=c)
        mx.eval([[x.state for x in c] for c in caches])
        return caches

    def apart(caches):
        for r, c in enumerate(caches):
            model(mx.arange(lengths[r])[None] + r, cache=c)
            mx.eval([x.state for x in c])

    def flat(caches):
        batch = RaggedBatch(len(caches[0]), group=0)
        fed, pieces = [0] * rows, [[]] * rows
        for r, place in enumerate(batch.add(caches, [prefix] * rows)):
            fed[place], pieces[place] = lengths[r], list(range(r, r + lengths[r]))
        batch.begin(fed, flat=True)
        x = mx.array([p + [0] * (max(fed) - len(p)) for p in pieces], mx.uint32)
        model(x.reshape(-1)[batch.slots.flat.whole.take][:, None], cache=batch.layers)
        mx.eval([c.buffers for c in batch.layers])

    def padded(caches):
        _fill(model, mx.arange(max(lengths))[None] + mx.arange(rows)[:, None])

    times = {f: [] for f in (apart, flat, padded)}
    for i in range(rounds + 1):
        for f, seen in times.items():
            caches = primed()
            t = time.perf_counter()
            f(caches)
            if i:  # the first round warms up
                seen.append(time.perf_counter() - t)
    print(f"{rows} prompts of {min(lengths)}-{max(lengths)} tokens ({sum(lengths)} in all) after {prefix}: "
          + ", ".join(f"{f.__name__} {statistics.median(v) * 1000:.0f} ms" for f, v in times.items()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="proxy")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--equal", action="store_true", help="the last line's prompts all of 118 tokens")
    a = ap.parse_args()
    model = build("proxy", "float32", 49152).model if a.model == "proxy" else specgen.load(a.model)[0]
    for length in (32, 100, 250):
        for rows in (4, 8):
            times = {f: [] for f in (separately, together)}
            for f in times:  # warm-up
                f(model, rows, length)
            for _ in range(a.rounds):
                for f, seen in times.items():
                    t = time.perf_counter()
                    f(model, rows, length)
                    seen.append(time.perf_counter() - t)
            apart, joint = (statistics.median(times[f]) for f in (separately, together))
            print(f"{rows} prompts of {length} tokens: separately {apart * 1000:.0f} ms, together "
                  f"{joint * 1000:.0f} ms, {apart / joint:.2f}x")
    ragged(model, a.rounds, a.equal)


if __name__ == "__main__":
    main()
