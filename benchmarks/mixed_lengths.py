"""A long conversation and short ones at once (an agent's session beside title and summary
requests): `specgen.batch_generate` against `mlx_lm.batch_generate` on the same loaded model,
alternating. (Served, the short requests are prefilled first and mostly answered while the long
one's prefill chunks run: the decoding that attention by runs speeds up is timed here.)

One prompt is a long document (docs/design.md's opening, cut to --doc-tokens) with a question;
the others are short questions of their own. Every round asks new questions and opens the
document with the round's number, so no drafter or prompt cache has seen them. Each
side's decoding seconds (its BatchStats) are timed apart from prefill: the short rows' steps read
only their own keys in specgen (engine/batch/attend.py), every row's in a padded batch. Prints
one JSON line: median speedups (min-max), whole and decoding, and whether every text is identical.

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libopenblas.so.0 python benchmarks/mixed_lengths.py
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from concurrency import SERVERS  # noqa: E402
from serve import ROOT, float32_model  # noqa: E402
from shared_prefix import questions, summary  # noqa: E402


def conversations(doc: str, asked: list[str]) -> list[list[dict]]:
    """The document with the first question, then each other question alone."""
    first = [{"role": "user", "content": f"{doc}\n\n{asked[0]}"}]
    return [first, *([{"role": "user", "content": q}] for q in asked[1:])]


def document(tokenizer, r: int, tokens: int) -> str:
    """Round r's document: design.md's first `tokens` tokens, opened with the round's number."""
    text = (ROOT / "docs" / "design.md").read_text()
    return f"Round {r}.\n\n" + tokenizer.decode(tokenizer.encode(text)[:tokens])


def in_process(model_dir: str, args) -> dict:
    """Each round's prompts through both batch_generate calls."""
    import mlx_lm

    import specgen

    model, tokenizer = specgen.load(model_dir)
    specgen.batch_generate(model, tokenizer, ["Hello", "Once upon a time"], max_tokens=8)  # costs, once
    mlx_lm.batch_generate(model, tokenizer, [tokenizer.encode("Hello")], max_tokens=8)  # kernels
    times, decode, texts = ({k: [] for k in SERVERS} for _ in range(3))
    for r, asked in enumerate(questions(args.rounds, args.prompts)):
        convs = conversations(document(tokenizer, r, args.doc_tokens), asked)
        prompts = [tokenizer.apply_chat_template(c, add_generation_prompt=True) for c in convs]
        for side in (SERVERS if r % 2 == 0 else SERVERS[::-1]):
            run = specgen.batch_generate if side == "specgen" else mlx_lm.batch_generate
            t = time.perf_counter()
            out = run(model, tokenizer, prompts, max_tokens=args.max_tokens)
            times[side].append(time.perf_counter() - t)
            decode[side].append(out.stats.generation_time)
            texts[side] += out.texts
            print(f"round {r} {side}: {times[side][-1]:.1f} s, decoding {decode[side][-1]:.1f} s",
                  file=sys.stderr, flush=True)
    ratios = [b / a for a, b in zip(decode["specgen"], decode["mlx_lm"])]
    return {"set": "mixed lengths", "prompt_tokens": [len(p) for p in prompts], **summary(times, texts),
            "decode_speedup_median": round(statistics.median(ratios), 3),
            "decode_speedup_min": round(min(ratios), 3), "decode_speedup_max": round(max(ratios), 3),
            "specgen_decode_s": round(statistics.median(decode["specgen"]), 2),
            "mlx_lm_decode_s": round(statistics.median(decode["mlx_lm"]), 2)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="a model folder (default: the shared SmolLM2 in float32)")
    ap.add_argument("--prompts", type=int, default=4, help="the long one and the short ones")
    ap.add_argument("--doc-tokens", type=int, default=3000)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", help="append the JSON line to this file")
    args = ap.parse_args()
    model_dir = args.model or float32_model()
    row = {**in_process(model_dir, args), "prompts": args.prompts,
           "doc_tokens": args.doc_tokens, "max_tokens": args.max_tokens}
    print(json.dumps(row))
    if args.out:
        with open(args.out, "a") as f:
            f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
