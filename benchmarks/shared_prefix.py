"""Prompts that share a long prefix, at once: `specgen.batch_generate` against
`mlx_lm.batch_generate` on the same loaded model, whole calls timed (prefill included), alternating.

Each prompt is one long document (docs/design.md's opening, cut to --doc-tokens: past one
2048-token prefill chunk) as the system message and a question of its own; every round asks questions no earlier round asked, so no
drafter has seen an answer. specgen prefills the document's whole chunks once and the rest of each
prompt on its own (engine/batch/share.py); mlx-lm prefills every prompt whole. Prints one JSON line:
the median speedup (min-max), each side's prompt tokens computed, and whether every text is
identical.

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libopenblas.so.0 python benchmarks/shared_prefix.py
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from concurrency import same  # noqa: E402  (texts compared as the batch benchmark does)
from serve import ROOT, float32_model  # noqa: E402

TOPICS = ["copies", "acceptance estimates", "calibration", "near-tied rows", "rollback", "sliding windows",
          "serving", "stopping a prefill", "batching", "pricing drafts", "queued passes", "structured outputs",
          "predicted outputs", "agent sessions", "memory", "eager passes"]
ASKS = ["In two sentences, what does the text say about {}?", "List three facts the text gives about {}.",
        "Why does the design choose what it does for {}?", "What would break without {}?"]


def questions(rounds: int, n: int) -> list[list[str]]:
    """`rounds` lists of `n` questions, none asked twice."""
    every = [a.format(t) for a in ASKS for t in TOPICS]
    if rounds * n > len(every):
        raise SystemExit(f"at most {len(every)} distinct questions: lower --rounds or --prompts")
    return [every[r * n:(r + 1) * n] for r in range(rounds)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="a model folder (default: the shared SmolLM2 in float32)")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--doc-tokens", type=int, default=2200)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", help="append the JSON line to this file")
    args = ap.parse_args()

    import mlx_lm

    import specgen

    model, tokenizer = specgen.load(args.model or float32_model())
    doc = tokenizer.decode(tokenizer.encode((ROOT / "docs" / "design.md").read_text())[: args.doc_tokens])
    specgen.batch_generate(model, tokenizer, ["Hello", "Once upon a time"], max_tokens=8)  # costs, once
    mlx_lm.batch_generate(model, tokenizer, [tokenizer.encode("Hello")], max_tokens=8)  # kernels
    ratios, times, computed, identical, total = [], {"specgen": [], "mlx_lm": []}, {}, 0, 0
    for r, asked in enumerate(questions(args.rounds, args.prompts)):
        prompts = [tokenizer.apply_chat_template([{"role": "system", "content": doc}, {"role": "user", "content": q}],
                                                 add_generation_prompt=True) for q in asked]
        texts = {}
        for side in (("specgen", "mlx_lm") if r % 2 == 0 else ("mlx_lm", "specgen")):
            run = specgen.batch_generate if side == "specgen" else mlx_lm.batch_generate
            t = time.perf_counter()
            out = run(model, tokenizer, prompts, max_tokens=args.max_tokens)
            times[side].append(time.perf_counter() - t)
            print(f"round {r} {side}: {times[side][-1]:.1f} s, {out.stats.prompt_tokens} prompt tokens computed",
                  file=sys.stderr, flush=True)
            texts[side], computed[side] = out.texts, out.stats.prompt_tokens
        ratios.append(times["mlx_lm"][-1] / times["specgen"][-1])
        identical += sum(same(a, b) for a, b in zip(texts["specgen"], texts["mlx_lm"]))
        total += len(prompts)
    row = {"set": "shared prefix", "prompts": args.prompts, "prompt_tokens": len(prompts[0]),
           "max_tokens": args.max_tokens, "speedup_median": round(statistics.median(ratios), 3),
           "speedup_min": round(min(ratios), 3), "speedup_max": round(max(ratios), 3),
           "specgen_s": round(statistics.median(times["specgen"]), 2),
           "mlx_lm_s": round(statistics.median(times["mlx_lm"]), 2),
           "prompt_tokens_computed": computed, "identical": identical, "of": total}
    print(json.dumps(row))
    if args.out:
        with open(args.out, "a") as f:
            f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
