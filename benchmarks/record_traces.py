"""Record a local model's own greedy answers with its top-k at every position, as replay traces.

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libopenblas.so.0 python benchmarks/record_traces.py \\
        [--model ../shared/models/smollm2-135m-instruct-4bit] [--dtype float32] \\
        [--sets chat code_edit code_fix grounded] [--prompts 24] [--max-tokens 128] [--k 8]

For each prompt of benchmarks/prompts/SET.jsonl: mlx-lm's plain greedy decoding (chat template
applied, stopped at a stop token), written to benchmarks/traces/MODEL_SET_topk.jsonl as
{"id", "category", "prompt_ids", "output_ids", "topk"}, where topk[i] is the model's k likeliest
next tokens after position i of prompt + output, best first (the format of
../shared/traces/smollm2_chat_topk.jsonl). `specgen simulate` replays them, recycling the top-1
as the decode loop would. Output positions take their top-k from the very logits greedy decoding
chose from, so topk[i][0] is always the next output token; prompt positions and the last one
come from one batched pass.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import mlx.core as mx
from mlx_lm.generate import generate_step

from specgen.cli.bench import read_prompt_file
from specgen.engine.load import registry
from specgen.engine.prompts import encode_prompt

ROOT = Path(__file__).resolve().parent


def top(logits: mx.array, k: int) -> list[list[int]]:
    """The k largest entries of each row, best first (a partition, then a sort of k)."""
    idx = mx.argpartition(-logits, k - 1, axis=-1)[..., :k]
    order = mx.argsort(-mx.take_along_axis(logits, idx, axis=-1), axis=-1)
    return mx.take_along_axis(idx, order, axis=-1).tolist()


def record(loaded, prompt: list[int], max_tokens: int, k: int) -> tuple[list[int], list[list[int]]]:
    out, rows = [], []
    for tok, logprobs in generate_step(mx.array(prompt), loaded.model, max_tokens=max_tokens):
        rows.append(top(logprobs, k))
        if tok in loaded.stop_ids:
            rows.pop()  # the stop token is not output: neither is the row it was chosen from
            break
        out.append(tok)
    batched = top(loaded.model(mx.array([prompt + out]))[0], k)
    return out, batched[: len(prompt) - 1] + rows + batched[-1:]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="../shared/models/smollm2-135m-instruct-4bit")
    ap.add_argument("--name", default="smollm2", help="file name prefix")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--sets", nargs="+", default=["chat", "code_edit", "code_fix", "grounded"])
    ap.add_argument("--prompts", type=int, default=24)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--k", type=int, default=8)
    a = ap.parse_args()
    loaded = registry.load(registry.resolve(a.model, registry.load_registry()), dtype=a.dtype)
    for name in a.sets:
        rows = read_prompt_file(str(ROOT / "prompts" / f"{name}.jsonl"))[name][: a.prompts]
        ids = [json.loads(line)["id"] for line in open(ROOT / "prompts" / f"{name}.jsonl")]
        path = ROOT / "traces" / f"{a.name}_{name}_topk.jsonl"
        with open(path, "w") as f:
            for rid, conv in zip(ids, rows):
                prompt = encode_prompt(loaded.tokenizer, conv, chat=True)
                out, topk = record(loaded, prompt, a.max_tokens, a.k)
                assert len(topk) == len(prompt) + len(out) and all(t[0] == o for t, o in zip(topk[len(prompt) - 1:], out))
                f.write(json.dumps({"id": rid, "category": name, "prompt_ids": prompt,
                                    "output_ids": out, "topk": topk}) + "\n")
        print(f"{path}: {len(rows)} traces")


if __name__ == "__main__":
    main()
