"""Speculation at a temperature: speed against mlx-lm's sampled decoding, acceptance, and the same
text with speculation on and off for the same seed.

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libopenblas.so.0 python benchmarks/sampled.py \\
        [--model ../shared/models/smollm2-135m-instruct-4bit] [--dtype float32] [--set chat] \\
        [--prompts 24] [--max-tokens 96] [--temp 0.7] [--seed 1] [--repeats 2]

Three contenders per prompt, alternating order, in one process: mlx-lm's generate_step with its
own sampler at the same temperature (a different random stream, so other text: compared by
throughput only), specgen with speculation off (--draft 0) and specgen as `run --temp T --seed S`
does it (adaptive drafter, the model's cached or measured cost curve). Reports the median over
rounds of specgen's tok/s over mlx-lm's, tokens per step, acceptance, and whether speculation on
and off gave the same tokens for every prompt in every round.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from mlx_lm.sample_utils import make_sampler

from specgen.cli.bench import mlx_lm_tokens, read_prompt_file, specgen_tokens
from specgen.cli.timing import alternate, spread
from specgen.draft.drafter import make_drafter
from specgen.engine.cost.calibrate import model_costs
from specgen.engine.cost.store import blas
from specgen.engine.decode.sampling import make_selector
from specgen.engine.load import registry
from specgen.engine.prompts import encode_prompt
from specgen.stats import Counts

ROOT = Path(__file__).resolve().parent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="../shared/models/smollm2-135m-instruct-4bit")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--set", default="chat")
    ap.add_argument("--prompts", type=int, default=24)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--temp", type=float, default=0.7)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=2)
    a = ap.parse_args()
    loaded = registry.load(registry.resolve(a.model, registry.load_registry()), dtype=a.dtype)
    found = model_costs(loaded.model, loaded.calibration_key, loaded.tokenizer)
    convs = read_prompt_file(str(ROOT / "prompts" / f"{a.set}.jsonl"))[a.set][: a.prompts]
    prompts = [encode_prompt(loaded.tokenizer, c, chat=True) for c in convs]
    selector = make_selector(a.temp, seed=a.seed)
    run = dict(max_tokens=a.max_tokens, stop=loaded.stop_ids, context_length=loaded.context_length,
               selector=selector)
    contenders = {
        "mlx-lm": lambda p: mlx_lm_tokens(loaded.model, p, a.max_tokens, loaded.stop_ids,
                                          loaded.context_length, make_sampler(a.temp)),
        "off": lambda p: specgen_tokens(loaded.model, p, make=lambda: make_drafter(0), draft=0, **run),
        "specgen": lambda p: specgen_tokens(loaded.model, p, make=lambda: make_drafter(None, cost=found.drafting),
                                            draft=64, queue_after=found.queue_after, off=found.off, **run),
    }
    counts, same = Counts(), True

    def seen(r, i, runs):
        nonlocal same
        same &= runs["off"].tokens == runs["specgen"].tokens
        if r == a.repeats - 1:
            for s in runs["specgen"].steps:
                counts.add_step(len(s.tokens), s.drafted, s.accepted)

    for name in contenders:  # warm-up
        contenders[name](prompts[0])
    rounds = alternate(contenders, prompts, a.repeats, seen)
    med, low, high = spread(rounds.ratios("specgen", "mlx-lm"))
    print(f"{loaded.spec.name} {a.dtype or 'as stored'}, BLAS {blas()}, {a.set}: {len(prompts)} prompts, "
          f"{a.max_tokens} tokens, temp {a.temp}, seed {a.seed}, {a.repeats} rounds")
    print(f"speedup over mlx-lm sampling {med:.2f}x ({low:.2f}-{high:.2f}); speculation off "
          f"{spread(rounds.ratios('off', 'mlx-lm'))[0]:.2f}x; {counts.tokens_per_step:.2f} tok/step, "
          f"acceptance {counts.acceptance_rate:.2f}; same text on and off: {same}")


if __name__ == "__main__":
    main()
