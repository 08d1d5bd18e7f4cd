"""Speed on the bundled stories260K model: mlx-lm plain greedy vs specgen, plain (--draft 0) and
speculating with the defaults (adaptive drafter, measured verify-cost curve).

    python benchmarks/stories.py [--tokens 256] [--repeats 5]

Each configuration runs the same prompts in one process, alternating order, after a warm-up;
reported tok/s are medians over repeats of (generated tokens / wall seconds, prefill included:
end to end, as a user waits). Stop tokens are ignored so every run generates exactly --tokens.
"""

import argparse
import statistics
import time

import mlx.core as mx
from mlx_lm.generate import generate_step

from specgen import registry
from specgen.calibrate import blas, describe, model_cost, pipeline_after
from specgen.decode import Step, generate
from specgen.drafter import make_drafter

PROMPTS = [
    "Once upon a time",
    "Tom and Lily were playing in the garden when",
    "The little dog was sad because",
    "Once upon a time, there was a little girl named Lily. She loved to play with her ball.",
]


def mlx_lm_run(model, ids, n):
    t = time.perf_counter()
    count = sum(1 for _ in generate_step(mx.array(ids), model, max_tokens=n))
    return count / (time.perf_counter() - t), None


def specgen_run(model, ids, n, draft, cost, ahead):
    drafter, cap, _ = make_drafter(draft, cost=cost)
    t = time.perf_counter()
    steps = [e for e in generate(model, ids, predictor=drafter, draft=cap, max_tokens=n,
                                 pipeline_after=ahead)
             if isinstance(e, Step)]
    tps = sum(len(s.tokens) for s in steps) / (time.perf_counter() - t)
    return tps, steps


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    loaded = registry.load(registry.resolve("demo", registry.load_registry()))
    model, tok = loaded.model, loaded.tokenizer
    print(f"# stories260K, {args.tokens} tokens, {args.repeats} repeats, BLAS: {blas()}")
    cost, curve, overlap, _ = model_cost(loaded)
    ahead = pipeline_after(overlap)  # as `specgen run` decides it on this machine
    print(f"# {describe(curve, overlap)}")
    print(f"{'prompt':48} {'mlx-lm':>8} {'draft 0':>8} {'ratio':>6} {'spec':>8} {'speedup':>7} {'accept':>6} {'tok/step':>8}")
    configs = {"mlx": lambda ids: mlx_lm_run(model, ids, args.tokens),
               "d0": lambda ids: specgen_run(model, ids, args.tokens, 0, cost, ahead),
               "spec": lambda ids: specgen_run(model, ids, args.tokens, None, cost, ahead)}
    for prompt in PROMPTS:
        ids = tok.encode(prompt)
        for f in configs.values():
            f(ids)  # warm-up
        tps = {k: [] for k in configs}
        steps = None
        for r in range(args.repeats):
            order = list(configs) if r % 2 == 0 else list(reversed(configs))
            for k in order:
                t, s = configs[k](ids)
                tps[k].append(t)
                steps = s if k == "spec" else steps
        med = {k: statistics.median(v) for k, v in tps.items()}
        drafted = sum(s.drafted for s in steps)
        accepted = sum(s.accepted for s in steps)
        print(f"{prompt[:48]:48} {med['mlx']:8.1f} {med['d0']:8.1f} {med['d0'] / med['mlx']:6.3f} "
              f"{med['spec']:8.1f} {med['spec'] / med['mlx']:7.3f} {accepted / max(drafted, 1):6.1%} "
              f"{args.tokens / len(steps):8.2f}")


if __name__ == "__main__":
    main()
