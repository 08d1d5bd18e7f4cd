"""Prompts that share a long prefix, at once: `specgen.batch_generate` against
`mlx_lm.batch_generate` on the same loaded model (or, with --served, concurrent clients of
`specgen serve` against `mlx_lm.server`), whole calls timed (prefill included), alternating.

Each prompt is one long document (docs/design.md's opening, cut to --doc-tokens: past one
2048-token prefill chunk) as the system message and a question of its own, as subagents share a
system prompt and tools; every round asks questions no earlier round asked, so no drafter has
seen an answer, and served rounds open the document with the round's number, so no prompt cache
holds it. specgen prefills the shared document once and the rest of each prompt on its own
(engine/batch/share.py); mlx-lm prefills every prompt whole. Prints one JSON line: the median
speedup (min-max), and whether every text is identical.

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libopenblas.so.0 python benchmarks/shared_prefix.py [--served]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from concurrency import SERVERS, at_once, same  # noqa: E402  (the concurrency benchmark's clients)
from serve import ROOT, both, float32_model  # noqa: E402

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


def conversations(doc: str, asked: list[str]) -> list[list[dict]]:
    return [[{"role": "system", "content": doc}, {"role": "user", "content": q}] for q in asked]


def in_process(model_dir: str, args) -> dict:
    """Each round's prompts through both batch_generate calls."""
    import mlx_lm

    import specgen

    model, tokenizer = specgen.load(model_dir)
    doc = tokenizer.decode(tokenizer.encode((ROOT / "docs" / "design.md").read_text())[: args.doc_tokens])
    specgen.batch_generate(model, tokenizer, ["Hello", "Once upon a time"], max_tokens=8)  # costs, once
    mlx_lm.batch_generate(model, tokenizer, [tokenizer.encode("Hello")], max_tokens=8)  # kernels
    times, texts, computed = {k: [] for k in SERVERS}, {k: [] for k in SERVERS}, {}
    for r, asked in enumerate(questions(args.rounds, args.prompts)):
        prompts = [tokenizer.apply_chat_template(c, add_generation_prompt=True) for c in conversations(doc, asked)]
        for side in (SERVERS if r % 2 == 0 else SERVERS[::-1]):
            run = specgen.batch_generate if side == "specgen" else mlx_lm.batch_generate
            t = time.perf_counter()
            out = run(model, tokenizer, prompts, max_tokens=args.max_tokens)
            times[side].append(time.perf_counter() - t)
            texts[side] += out.texts
            computed[side] = out.stats.prompt_tokens
            print(f"round {r} {side}: {times[side][-1]:.1f} s, {computed[side]} prompt tokens computed",
                  file=sys.stderr, flush=True)
    return {"set": "shared prefix", "prompt_tokens": len(prompts[0]), "prompt_tokens_computed": computed,
            **summary(times, texts)}


def served(model_dir: str, args) -> dict:
    """Each round's prompts sent at once to each server (its own port), alternating."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    doc = tokenizer.decode(tokenizer.encode((ROOT / "docs" / "design.md").read_text())[: args.doc_tokens])
    with both(model_dir, "shared-prefix") as clients:
        for c in clients.values():  # kernels, and the batched steps' costs
            at_once(c, conversations("Warm up.", ["Hello", "Hi"]), 8)
        times, texts = {k: [] for k in SERVERS}, {k: [] for k in SERVERS}
        for r, asked in enumerate(questions(args.rounds, args.prompts)):
            prompts = conversations(f"Round {r}.\n\n{doc}", asked)
            for side in (SERVERS if r % 2 == 0 else SERVERS[::-1]):
                got = at_once(clients[side], prompts, args.max_tokens)
                times[side].append(max(g["end"] for g in got) - min(g["start"] for g in got))
                texts[side] += [g["text"] for g in got]
                print(f"round {r} {side}: {times[side][-1]:.1f} s", file=sys.stderr, flush=True)
    return {"set": "shared prefix, served", **summary(times, texts)}


def summary(times: dict, texts: dict) -> dict:
    ratios = [b / a for a, b in zip(times["specgen"], times["mlx_lm"])]
    return {"speedup_median": round(statistics.median(ratios), 3), "speedup_min": round(min(ratios), 3),
            "speedup_max": round(max(ratios), 3), "specgen_s": round(statistics.median(times["specgen"]), 2),
            "mlx_lm_s": round(statistics.median(times["mlx_lm"]), 2),
            "identical": sum(same(a, b) for a, b in zip(texts["specgen"], texts["mlx_lm"])),
            "of": len(texts["specgen"])}


def emit(row: dict, out: str | None) -> None:
    """Print the result's JSON line, and append it to `out` where given."""
    print(json.dumps(row))
    if out:
        with open(out, "a") as f:
            f.write(json.dumps(row) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="a model folder (default: the shared SmolLM2 in float32)")
    ap.add_argument("--served", action="store_true", help="through specgen serve and mlx_lm.server")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--doc-tokens", type=int, default=2200)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", help="append the JSON line to this file")
    args = ap.parse_args()
    model_dir = args.model or float32_model()
    row = {**(served if args.served else in_process)(model_dir, args), "prompts": args.prompts,
           "max_tokens": args.max_tokens}
    emit(row, args.out)


if __name__ == "__main__":
    main()
