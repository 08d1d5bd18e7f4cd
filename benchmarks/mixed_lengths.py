"""A long conversation and short ones at once (an agent's session beside title and summary
requests): `specgen.batch_generate` against `mlx_lm.batch_generate` on the same loaded model, or
with --served `specgen serve` against `mlx_lm.server`, alternating.

Served, the long request goes first and the short ones the moment its first token comes (so they
join its decoding, as an agent's side requests do); timed from then until the last answer ends:
every token decoded in that window over its seconds, and the long request's own tok/s there.

One prompt is a long document (docs/design.md's opening, cut to --doc-tokens) with a question;
the others are short questions of their own. Every round asks new questions and opens the
document with the round's number, so no drafter or prompt cache has seen them. Each
side's decoding seconds (its BatchStats) are timed apart from prefill: the short rows' steps read
only their own keys in specgen (engine/batch/attend.py), every row's in a padded batch; and each
call's peak memory, weights included (the short rows sit on a shelf of their own in specgen,
engine/batch/kv.py). Prints one JSON line: median speedups (min-max), whole and decoding, peak
memory, and whether every text is identical.

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libopenblas.so.0 python benchmarks/mixed_lengths.py [--served]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from concurrency import SERVERS, ask, same  # noqa: E402
from serve import ROOT, both, float32_model  # noqa: E402
from shared_prefix import emit, questions, summary  # noqa: E402


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
    import mlx.core as mx
    import mlx_lm

    import specgen

    model, tokenizer = specgen.load(model_dir)
    specgen.batch_generate(model, tokenizer, ["Hello", "Once upon a time"], max_tokens=8)  # costs, once
    mlx_lm.batch_generate(model, tokenizer, [tokenizer.encode("Hello")], max_tokens=8)  # kernels
    times, decode, texts, peak = ({k: [] for k in SERVERS} for _ in range(4))
    for r, asked in enumerate(questions(args.rounds, args.prompts)):
        convs = conversations(document(tokenizer, r, args.doc_tokens), asked)
        prompts = [tokenizer.apply_chat_template(c, add_generation_prompt=True) for c in convs]
        for side in (SERVERS if r % 2 == 0 else SERVERS[::-1]):
            run = specgen.batch_generate if side == "specgen" else mlx_lm.batch_generate
            mx.reset_peak_memory()
            t = time.perf_counter()
            out = run(model, tokenizer, prompts, max_tokens=args.max_tokens)
            times[side].append(time.perf_counter() - t)
            decode[side].append(out.stats.generation_time)
            peak[side].append(mx.get_peak_memory() / 1e9)
            texts[side] += out.texts
            print(f"round {r} {side}: {times[side][-1]:.1f} s, decoding {decode[side][-1]:.1f} s",
                  file=sys.stderr, flush=True)
    ratios = [b / a for a, b in zip(decode["specgen"], decode["mlx_lm"])]
    return {"set": "mixed lengths", "prompt_tokens": [len(p) for p in prompts], **summary(times, texts),
            "decode_speedup_median": round(statistics.median(ratios), 3),
            "decode_speedup_min": round(min(ratios), 3), "decode_speedup_max": round(max(ratios), 3),
            "specgen_decode_s": round(statistics.median(decode["specgen"]), 2),
            "mlx_lm_decode_s": round(statistics.median(decode["mlx_lm"]), 2),
            "peak_gb": {k: round(statistics.median(v), 3) for k, v in peak.items()}}


def joined(client, convs: list[list[dict]], long_tokens: int, max_tokens: int) -> dict:
    """The long conversation, then the short ones once its first token came, each from its own
    thread: the window from that token to the last answer's end, and every text."""
    came, out = threading.Event(), {}

    def long_one() -> None:
        times, text, tokens = [], [], 0
        for chunk in client.chat.completions.create(model="default_model", max_tokens=long_tokens,
                                                    temperature=0.0, messages=convs[0], stream=True,
                                                    stream_options={"include_usage": True}):
            if chunk.choices and chunk.choices[0].delta.content:
                times.append(time.perf_counter())
                text.append(chunk.choices[0].delta.content)
                came.set()
            if chunk.usage:
                tokens = chunk.usage.completion_tokens
        came.set()
        out[0] = {"first": times[0] if times else None, "end": time.perf_counter(), "text": "".join(text),
                  "tokens": tokens}

    def short_one(i: int) -> None:
        out[i] = ask(client, convs[i], max_tokens)

    threads = [threading.Thread(target=long_one)]
    threads[0].start()
    came.wait()
    threads += [threading.Thread(target=short_one, args=(i,)) for i in range(1, len(convs))]
    for t in threads[1:]:
        t.start()
    for t in threads:
        t.join()
    first, end = out[0]["first"], max(r["end"] for r in out.values())
    # The long one's tokens after its first, which opens the window.
    return {"window_s": end - first, "long_s": out[0]["end"] - first, "long_tokens": out[0]["tokens"] - 1,
            "tokens": sum(out[i]["tokens"] for i in range(len(convs))) - 1,
            "texts": [out[i]["text"] for i in range(len(convs))]}


def served(model_dir: str, args) -> dict:
    """Each round's conversations through each server (its own port), alternating."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    with both(model_dir, "mixed-lengths") as clients:
        for c in clients.values():  # kernels, and the batched steps' costs
            joined(c, [[{"role": "user", "content": "Hello"}], [{"role": "user", "content": "Hi"}]], 8, 8)
        window, long_rate, texts = ({k: [] for k in SERVERS} for _ in range(3))
        for r, asked in enumerate(questions(args.rounds, args.prompts)):
            convs = conversations(document(tokenizer, r, args.doc_tokens), asked)
            for side in (SERVERS if r % 2 == 0 else SERVERS[::-1]):
                got = joined(clients[side], convs, args.long_tokens, args.max_tokens)
                window[side].append(got["tokens"] / got["window_s"])
                long_rate[side].append(got["long_tokens"] / got["long_s"])
                texts[side] += got["texts"]
                print(f"round {r} {side}: {window[side][-1]:.1f} tok/s together, the long one "
                      f"{long_rate[side][-1]:.1f} tok/s", file=sys.stderr, flush=True)
    ratios = [a / b for a, b in zip(window["specgen"], window["mlx_lm"])]
    return {"set": "mixed lengths, served", "speedup_median": round(statistics.median(ratios), 3),
            "speedup_min": round(min(ratios), 3), "speedup_max": round(max(ratios), 3),
            "tok_s": {k: round(statistics.median(v), 1) for k, v in window.items()},
            "long_tok_s": {k: round(statistics.median(v), 1) for k, v in long_rate.items()},
            "identical": sum(same(a, b) for a, b in zip(texts["specgen"], texts["mlx_lm"])),
            "of": len(texts["specgen"])}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="a model folder (default: the shared SmolLM2 in float32)")
    ap.add_argument("--served", action="store_true", help="through specgen serve and mlx_lm.server")
    ap.add_argument("--prompts", type=int, default=4, help="the long one and the short ones")
    ap.add_argument("--long-tokens", type=int, default=256, help="--served: the long request's answer")
    ap.add_argument("--doc-tokens", type=int, default=3000)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", help="append the JSON line to this file")
    args = ap.parse_args()
    model_dir = args.model or float32_model()
    row = {**(served if args.served else in_process)(model_dir, args), "prompts": args.prompts,
           "doc_tokens": args.doc_tokens, "max_tokens": args.max_tokens}
    emit(row, args.out)


if __name__ == "__main__":
    main()
