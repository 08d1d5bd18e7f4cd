"""Speed on the bundled stories260K model: mlx-lm plain greedy vs specgen, plain (--draft 0) and
speculating with the defaults (adaptive drafter, measured verify-cost curve).

    python benchmarks/stories.py [--tokens 256] [--repeats 5]

Each configuration runs the same prompts in one process, alternating order (specgen.cli.timing),
after a warm-up; reported tok/s are medians over repeats of (generated tokens / wall seconds,
prefill included: end to end, as a user waits). Stop tokens are ignored so every run generates
exactly --tokens.
"""

import argparse
import time

import mlx.core as mx
from mlx_lm.generate import generate_step

from specgen.cli.timing import Timed, alternate, spread
from specgen.draft.drafter import make_drafter
from specgen.engine.cost.calibrate import model_costs
from specgen.engine.cost.mode import describe_curve
from specgen.engine.cost.store import blas
from specgen.engine.decode.loop import generate
from specgen.engine.load import registry
from specgen.events import Step

PROMPTS = [
    "Once upon a time",
    "Tom and Lily were playing in the garden when",
    "The little dog was sad because",
    "Once upon a time, there was a little girl named Lily. She loved to play with her ball.",
]


def mlx_lm_run(model, ids, n):
    t = time.perf_counter()
    out = [tok for tok, _ in generate_step(mx.array(ids), model, max_tokens=n)]
    return Timed(out, len(out), time.perf_counter() - t)


def specgen_run(model, ids, n, draft, costs):
    t = time.perf_counter()
    steps = [e for e in generate(model, ids, drafter=make_drafter(draft, cost=costs.drafting),
                                 draft=64 if draft is None else draft, max_tokens=n,
                                 queue_after=costs.queue_after)
             if isinstance(e, Step)]
    out = [tok for s in steps for tok in s.tokens]
    return Timed(out, len(out), time.perf_counter() - t, steps)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    loaded = registry.load(registry.resolve("demo", registry.load_registry()))
    model, tok = loaded.model, loaded.tokenizer
    print(f"# stories260K, {args.tokens} tokens, {args.repeats} repeats, BLAS: {blas()}")
    costs = model_costs(model, loaded.calibration_key, tok)  # as `specgen run` decides it on this machine
    print(f"# {describe_curve(costs.curve)}")
    print(f"{'prompt':48} {'mlx-lm':>8} {'draft 0':>8} {'ratio':>6} {'spec':>8} {'speedup':>7} {'accept':>6} {'tok/step':>8}")
    contenders = {"mlx": lambda ids: mlx_lm_run(model, ids, args.tokens),
                  "d0": lambda ids: specgen_run(model, ids, args.tokens, 0, costs),
                  "spec": lambda ids: specgen_run(model, ids, args.tokens, None, costs)}
    for prompt in PROMPTS:
        ids = tok.encode(prompt)
        for run in contenders.values():
            run(ids)  # warm-up
        steps = []
        rounds = alternate(contenders, [ids], args.repeats,
                           lambda r, i, runs: steps.__setitem__(slice(None), runs["spec"].steps))
        med = {k: spread(rounds.tps(k))[0] for k in contenders}
        drafted = sum(s.drafted for s in steps)
        accepted = sum(s.accepted for s in steps)
        print(f"{prompt[:48]:48} {med['mlx']:8.1f} {med['d0']:8.1f} {med['d0'] / med['mlx']:6.3f} "
              f"{med['spec']:8.1f} {med['spec'] / med['mlx']:7.3f} {accepted / max(drafted, 1):6.1%} "
              f"{args.tokens / len(steps):8.2f}")


if __name__ == "__main__":
    main()
