"""Predicted outputs on a real model: no prediction, a perfect one (the output of an earlier run)
and a wrong one (another prompt's output), alternated over rounds, through the Python API.

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libopenblas.so.0 python benchmarks/predict.py \
        --model ../shared/models/smollm2-135m-instruct-4bit --dtype float32 --prompts 6 --rounds 3

Prints one JSON object per prediction kind: decode tok/s (median, min-max of per-round medians),
tokens per step, prediction tokens drafted/accepted, and whether every text equals the text
without a prediction (it must).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from specgen.engine.cost.store import blas
from specgen.engine.engine import Engine, Request
from specgen.engine.options import Options
from specgen.stats import RunStats

SETS = Path(__file__).parent / "prompts"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--dtype")
    ap.add_argument("--set", default="code_edit")
    ap.add_argument("--prompts", type=int, default=6)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    engine = Engine.load(args.model, dtype=args.dtype)
    engine.costs()
    rows = [json.loads(line) for line in (SETS / f"{args.set}.jsonl").read_text().splitlines()[: args.prompts]]
    ids = [engine.encode(r.get("messages") or r["prompt"]) for r in rows]
    opts = Options(max_tokens=args.max_tokens)

    def run(i: int, prediction: str | None) -> tuple[str, RunStats]:
        stats = RunStats()
        text = "".join(r.text for r in engine.stream(Request(ids[i], opts, prediction=prediction), stats))
        return text, stats

    plain = [run(i, None)[0] for i in range(len(ids))]  # also the warm-up
    kinds = {"none": lambda i: None, "perfect": lambda i: plain[i], "wrong": lambda i: plain[i - 1]}
    tps = {k: [] for k in kinds}
    totals = {k: {"tokens": 0, "steps": 0, "drafted": 0, "accepted": 0, "identical": True} for k in kinds}
    for r in range(args.rounds):
        per = {k: [] for k in kinds}
        for i in range(len(ids)):
            for k, make in (kinds.items() if (r + i) % 2 == 0 else reversed(kinds.items())):
                text, stats = run(i, make(i))
                per[k].append(stats.decode_tps)
                t = totals[k]
                t["identical"] &= text == plain[i]
                if r == args.rounds - 1:
                    t["tokens"] += stats.counts.tokens
                    t["steps"] += stats.counts.steps
                    t["drafted"] += stats.prediction_drafted
                    t["accepted"] += stats.prediction_accepted
        for k in kinds:
            tps[k].append(statistics.median(per[k]))
    for k in kinds:
        t = totals[k]
        print(json.dumps({"prediction": k, "model": engine.name, "dtype": args.dtype, "blas": blas(),
                          "prompts": len(ids), "rounds": args.rounds,
                          "decode_tps": round(statistics.median(tps[k]), 2),
                          "tps_min_max": [round(min(tps[k]), 2), round(max(tps[k]), 2)],
                          "speedup_vs_none": round(statistics.median(tps[k]) / statistics.median(tps["none"]), 3),
                          "tokens_per_step": round(t["tokens"] / max(t["steps"], 1), 3),
                          "prediction_drafted": t["drafted"], "prediction_accepted": t["accepted"],
                          "identical": t["identical"]}))


if __name__ == "__main__":
    main()
