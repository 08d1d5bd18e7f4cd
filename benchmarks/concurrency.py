"""Many requests at once: `specgen serve` against `mlx_lm.server`, and `run --prompts --batch`
against `mlx_lm.batch_generate`, on the same model.

Serving: at each level (1, 2, 4, 8, 16 clients by default) every round sends that many streamed
chat requests at once (grounded, code-fix and chat prompts mixed) to one server, then the same
requests to the other (which goes first alternates by round). Each request is new to both servers:
its user message starts with its own number, so neither the prompt caches nor the drafters have
seen it. Per level: aggregate tok/s (completion tokens of the round / the round's wall time),
time to first token, inter-chunk latency p50/p99 (the stalls a streaming client sees), and
whether every text equals the other server's.

Batch: the same prompt file of --batch-prompts prompts through `specgen run --prompts --batch N`
and through mlx_lm.batch_generate, each a whole process (load included), alternating.

Alone (`--only alone`): the bound speculation sets on the serving figures. Each level's very
requests (the same numbers), one at a time in process, plain (draft 0) and speculative: a round's
bound is its slowest plain request over its slowest speculative one, what the two servers would
give if every request ran at once as fast as alone. With more than one client, the same requests
also run at once through `specgen.batch_generate` (the serving engine, without HTTP): "at once"
is the sum of their speculative times alone (prefill included) over the batch's, the same work
two ways, so above 1 where serving them together beats serving them one at a time.

Long prefill: while a long prompt (--long-tokens) is being prefilled, a short request is sent;
its time to first token shows whether prefill is chunked between decode steps.

    apt-get install -y libopenblas0-pthread
    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libopenblas.so.0 python benchmarks/concurrency.py --rounds 3

With no --model, the shared SmolLM2 is dequantized to float32 into /tmp once; `--arch gemma3` or
`--arch qwen3_next` instead writes a model of that kind at SmolLM2's size (sliding windows of 512
on five layers of six; linear attention on three layers of four) with random weights and
SmolLM2's tokenizer, once: enough for throughput. Prints one JSON line per measurement and writes
them all to --out.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import mlx.core as mx
import openai
from mlx_lm.utils import save_config, save_model

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve import ROOT, SETS, SHARED, both, float32_model  # noqa: E402  (benchmarks/serve.py's helpers)

SERVERS = ("specgen", "mlx_lm")
WARMUPS = 6  # requests numbered first + 1 ... first + 6 warm the servers up (three each); timed ones follow
SMOLLM2 = dict(hidden_size=576, num_hidden_layers=30, intermediate_size=1536, num_attention_heads=9,
               rms_norm_eps=1e-5, vocab_size=49152, tie_word_embeddings=True, max_position_embeddings=8192)
RANDOM = {  # --arch: SmolLM2's shape with other layers
    "gemma3": dict(model_type="gemma3_text", num_key_value_heads=3, head_dim=64, query_pre_attn_scalar=64,
                   sliding_window=512, sliding_window_pattern=6),
    "qwen3_next": dict(  # dense MLPs (no experts): the layers' kinds, not the MoE, are what is measured
        model_type="qwen3_next", num_key_value_heads=3, head_dim=64, linear_num_value_heads=8,
        linear_num_key_heads=4, linear_key_head_dim=64, linear_value_head_dim=64, linear_conv_kernel_dim=4,
        num_experts=0, num_experts_per_tok=0, decoder_sparse_step=1, shared_expert_intermediate_size=0,
        mlp_only_layers=list(range(30)), moe_intermediate_size=0, rope_theta=10000.0,
        partial_rotary_factor=0.25, full_attention_interval=4),
}


def random_model(arch: str) -> str:
    """A folder both servers load: `arch`'s layers at SmolLM2's size, random weights (float32),
    SmolLM2's tokenizer and chat template. Written once into /tmp."""
    out = Path(f"/tmp/specgen-bench-{arch}-random")
    if not (out / "config.json").exists():
        config = {**SMOLLM2, **RANDOM[arch]}
        module = importlib.import_module(f"mlx_lm.models.{config['model_type']}")
        mx.random.seed(0)
        model = module.Model(module.ModelArgs.from_dict(config))
        save_model(out, model)
        for name in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(SHARED / "models" / "smollm2-135m-instruct-4bit" / name, out / name)
        save_config(config, out / "config.json")  # last: a folder with it is complete
    return str(out)


def prompt_pool() -> list[list[dict]]:
    """Grounded, code-fix and chat conversations interleaved, so every level mixes the three."""
    rows = [[json.loads(line) for line in (SETS / f"{s}.jsonl").read_text().splitlines()]
            for s in ("grounded", "code_fix", "chat")]
    return [r.get("messages") or [{"role": "user", "content": r["prompt"]}] for group in zip(*rows) for r in group]


def numbered(n: int, pool: list[list[dict]]) -> list[dict]:
    """Request n's conversation: new to every cache (its first words differ from every earlier one's)."""
    first, *rest = pool[n % len(pool)]
    return [{**first, "content": f"Request {n}.\n\n{first['content']}"}, *rest]


def ask(client: openai.OpenAI, messages: list[dict], max_tokens: int) -> dict:
    """One streamed request: its text, token count and when each chunk came."""
    t0 = time.perf_counter()
    times, text, tokens = [], [], 0
    for chunk in client.chat.completions.create(model="default_model", max_tokens=max_tokens, temperature=0.0,
                                                messages=messages, stream=True,
                                                stream_options={"include_usage": True}):
        if chunk.choices and chunk.choices[0].delta.content:
            times.append(time.perf_counter())
            text.append(chunk.choices[0].delta.content)
        if chunk.usage:
            tokens = chunk.usage.completion_tokens
    return {"start": t0, "end": time.perf_counter(), "ttft": times[0] - t0 if times else None,
            "gaps": [b - a for a, b in zip(times, times[1:])], "text": "".join(text), "tokens": tokens}


def at_once(client: openai.OpenAI, prompts: list[list[dict]], max_tokens: int) -> list[dict]:
    """Every prompt sent at the same moment, each from its own thread (a client of its own)."""
    results: list[dict | None] = [None] * len(prompts)
    gate = threading.Barrier(len(prompts))

    def one(i: int) -> None:
        gate.wait()
        results[i] = ask(client, prompts[i], max_tokens)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


def level_row(clients: int, rounds: dict[str, list[list[dict]]]) -> dict:
    """Medians over rounds of aggregate tok/s, the ratio specgen/mlx_lm per round (min-max), TTFT
    and inter-chunk latency percentiles over every request, and whether the texts agree."""
    def tps(rnd):
        return sum(r["tokens"] for r in rnd) / (max(r["end"] for r in rnd) - min(r["start"] for r in rnd))

    agg = {k: [tps(rnd) for rnd in v] for k, v in rounds.items()}
    ratios = [a / b for a, b in zip(agg["specgen"], agg["mlx_lm"])]
    flat = {k: [r for rnd in v for r in rnd] for k, v in rounds.items()}
    row = {"clients": clients, "rounds": len(ratios), "speedup_median": round(statistics.median(ratios), 3),
           "speedup_min": round(min(ratios), 3), "speedup_max": round(max(ratios), 3),
           "round_speedups": [round(r, 3) for r in ratios],
           "identical": all(a["text"] == b["text"] for a, b in zip(flat["specgen"], flat["mlx_lm"]))}
    for k, reqs in flat.items():
        gaps = [g for r in reqs for g in r["gaps"]]
        row[k] = {"tok_s": round(statistics.median(agg[k]), 2),
                  "ttft_p50_s": round(pct([r["ttft"] for r in reqs if r["ttft"] is not None], 0.5), 3),
                  "ttft_max_s": round(max(r["ttft"] or 0 for r in reqs), 3),
                  "itl_p50_ms": round(1e3 * pct(gaps, 0.5), 1), "itl_p99_ms": round(1e3 * pct(gaps, 0.99), 1)}
    return row


def serving(model: str, levels: list[int], rounds: int, max_tokens: int, max_batch: int | None,
            long: bool = True, first: int = 0) -> list[dict]:
    pool, n, rows = prompt_pool(), first, []
    extra = ["--max-batch", str(max_batch)] if max_batch else []
    plan = timed_numbers(first, levels, rounds)
    with both(model, "concurrency", extra) as clients:
        for c in clients.values():  # the first requests pay for kernels and, alone, calibration
            at_once(c, [numbered(n := n + 1, pool)], 8)
            at_once(c, [numbered(n := n + 1, pool) for _ in range(2)], 8)
        for i, clients_at_once in enumerate(levels):
            per = {k: [] for k in SERVERS}
            for r, (_, numbers) in enumerate(plan[i * rounds : (i + 1) * rounds]):
                prompts = [numbered(m, pool) for m in numbers]
                for k in (SERVERS if r % 2 == 0 else SERVERS[::-1]):
                    per[k].append(at_once(clients[k], prompts, max_tokens))
            rows.append(level_row(clients_at_once, per))
            print(json.dumps(rows[-1]), flush=True)
        if long:
            after = plan[-1][1][-1] + 1 if plan else first + WARMUPS + 1
            rows.append(long_prefill(clients, pool, after, max_tokens))
            print(json.dumps(rows[-1]), flush=True)
    return rows


def timed_numbers(first: int, levels: list[int], rounds: int) -> list[tuple[int, list[int]]]:
    """(clients, request numbers) of each round of each level, as `serving` numbers them."""
    n, out = first + WARMUPS + 1, []
    for clients in levels:
        for _ in range(rounds):
            out.append((clients, list(range(n, n + clients))))
            n += clients
    return out


def alone(model: str, levels: list[int], rounds: int, max_tokens: int, first: int) -> list[dict]:
    """Per level, the median over rounds of the lone-request bound (see the module docstring)."""
    import specgen  # in process: only this part needs the model here

    pool = prompt_pool()
    loaded, tokenizer = specgen.load(model)
    specgen.generate(loaded, tokenizer, "Hello", max_tokens=8)  # kernels, and the cost curve once
    if max(levels) > 1:  # and the batched steps' costs, once per machine
        specgen.batch_generate(loaded, tokenizer, ["Hello", "Once upon a time"], max_tokens=8)

    def seconds(ids, **kw) -> tuple[float, float, str]:
        """(from the first token, as decode tok/s; whole, prefill included; the text)"""
        called, start, text = time.perf_counter(), None, []
        for r in specgen.stream_generate(loaded, tokenizer, ids, max_tokens=max_tokens, **kw):
            start = start or time.perf_counter()
            text.append(r.text)
        end = time.perf_counter()
        return end - start, end - called, "".join(text)

    per: dict[int, list[float]] = {}
    together: dict[int, list[float]] = {}
    identical = True
    for clients, numbers in timed_numbers(first, levels, rounds):
        plain, spec, whole, texts = [], [], [], []
        for n in numbers:
            ids = tokenizer.apply_chat_template(numbered(n, pool), add_generation_prompt=True)
            (a, _, text_a), (b, w, text_b) = seconds(ids, draft=0), seconds(ids)
            plain.append(a), spec.append(b), whole.append(w), texts.append((ids, text_b))
            identical &= text_a == text_b
        per.setdefault(clients, []).append(max(plain) / max(spec))
        if clients > 1:
            t = time.perf_counter()
            out = specgen.batch_generate(loaded, tokenizer, [ids for ids, _ in texts], max_tokens=max_tokens)
            together.setdefault(clients, []).append(sum(whole) / (time.perf_counter() - t))
            identical &= all(got.lstrip() == text.lstrip() for got, (_, text) in zip(out.texts, texts))
    rows = []
    for c, v in per.items():
        rows.append({"set": "alone", "clients": c, "bound_median": round(statistics.median(v), 3),
                     "bound_min": round(min(v), 3), "bound_max": round(max(v), 3), "identical": identical})
        if c in together:
            rows[-1].update(at_once_median=round(statistics.median(together[c]), 3),
                            at_once_min=round(min(together[c]), 3), at_once_max=round(max(together[c]), 3))
    return rows


def long_prefill(clients: dict, pool: list[list[dict]], n: int, max_tokens: int, long_chars: int = 16000) -> dict:
    """A short request sent 0.5 s into a long prompt's prefill: its time to first token."""
    text = "\n\n".join(m["content"] for i in range(200) for m in pool[i % len(pool)])[:long_chars]
    row = {"set": "short during long prefill", "long_chars": long_chars}
    for k, c in clients.items():
        n += 2
        done: dict = {}
        long_prompt = [{"role": "user", "content": f"Request {n + 1} ({k}).\n\n{text}"}]
        thread = threading.Thread(target=lambda: done.update(ask(c, long_prompt, 16)))
        thread.start()
        time.sleep(0.5)
        short = ask(c, numbered(n, pool), 16)
        thread.join()
        row[k] = {"short_ttft_s": round(short["ttft"], 3), "long_ttft_s": round(done["ttft"], 3)}
    return row


MLX_LM_BATCH = """
import json, sys
from mlx_lm import load, batch_generate
model, tok = load(sys.argv[1])
rows = [json.loads(l) for l in open(sys.argv[2])]
prompts = [tok.apply_chat_template(r["messages"], add_generation_prompt=True) for r in rows]
out = batch_generate(model, tok, prompts, max_tokens=int(sys.argv[3]))
json.dump(out.texts, open(sys.argv[4], "w"))
"""


def batch_job(model: str, count: int, batch: int, max_tokens: int, rounds: int) -> dict:
    """The same prompt file through `specgen run --prompts --batch` and mlx_lm.batch_generate,
    whole processes timed (load included), alternating; texts compared."""
    pool = prompt_pool()
    work = Path(tempfile.mkdtemp(prefix="specgen-bench-batch-"))
    (work / "prompts.jsonl").write_text("".join(json.dumps({"id": str(i), "messages": pool[i % len(pool)]}) + "\n"
                                                for i in range(count)))
    (work / "mlx_lm_batch.py").write_text(MLX_LM_BATCH)
    times: dict[str, list[float]] = {k: [] for k in SERVERS}
    texts: dict[str, list[str]] = {}
    for r in range(rounds):
        for k in (SERVERS if r % 2 == 0 else SERVERS[::-1]):
            out = work / f"{k}-{r}.jsonl"
            cmd = ([sys.executable, "-m", "specgen", "run", "-q", "-m", model, "--prompts", str(work / "prompts.jsonl"),
                    "-o", str(out), "-n", str(max_tokens), "--batch", str(batch)] if k == "specgen" else
                   [sys.executable, str(work / "mlx_lm_batch.py"), model, str(work / "prompts.jsonl"),
                    str(max_tokens), str(out)])
            t0 = time.perf_counter()
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
            times[k].append(time.perf_counter() - t0)
            if k == "specgen":
                got = {json.loads(line)["id"]: json.loads(line)["text"] for line in out.read_text().splitlines()}
                texts[k] = [got[str(i)] for i in range(count)]
            else:
                texts[k] = json.loads(out.read_text())
    ratios = [b / a for a, b in zip(times["specgen"], times["mlx_lm"])]
    return {"set": f"--prompts --batch {batch}", "prompts": count, "max_tokens": max_tokens,
            "specgen_s": round(statistics.median(times["specgen"]), 2),
            "mlx_lm_s": round(statistics.median(times["mlx_lm"]), 2),
            "speedup_median": round(statistics.median(ratios), 3), "speedup_min": round(min(ratios), 3),
            "speedup_max": round(max(ratios), 3),
            "identical": sum(same(a, b) for a, b in zip(texts["specgen"], texts["mlx_lm"])), "of": count}


def same(ours: str, batch_generate: str) -> bool:
    """Equal texts: mlx_lm.batch_generate decodes a row whole, keeping the space a BPE tokenizer puts
    before the first word, which mlx-lm's streaming detokenizer (generate, the server, specgen) drops."""
    return ours == batch_generate or " " + ours == batch_generate


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="a model folder both load (default: the shared SmolLM2 in float32)")
    ap.add_argument("--arch", choices=sorted(RANDOM),
                    help="instead of --model: a model of these layers at SmolLM2's size, random weights")
    ap.add_argument("--levels", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--max-batch", type=int, help="specgen serve's --max-batch (default: its own)")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--batch-prompts", type=int, default=64)
    ap.add_argument("--batch-rounds", type=int, default=2)
    ap.add_argument("--first", type=int, default=0,
                    help="number requests from here (the same numbers on fresh servers ask the same questions)")
    ap.add_argument("--no-long", action="store_true", help="skip the short-during-long-prefill measurement")
    ap.add_argument("--only", choices=["serve", "batch", "alone"], help="run one part only")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "concurrency.jsonl"))
    args = ap.parse_args()
    model = args.model or (random_model(args.arch) if args.arch else float32_model())
    (Path.home() / ".cache" / "huggingface" / "hub").mkdir(parents=True, exist_ok=True)  # mlx_lm's /v1/models
    rows = []
    if args.only == "alone":
        rows += alone(model, args.levels, args.rounds, args.max_tokens, args.first)
        print("\n".join(json.dumps(r) for r in rows), flush=True)
    elif args.only != "batch":
        rows += serving(model, args.levels, args.rounds, args.max_tokens, args.max_batch, not args.no_long, args.first)
    if args.only in (None, "batch"):
        rows.append(batch_job(model, args.batch_prompts, args.batch, args.max_tokens, args.batch_rounds))
        print(json.dumps(rows[-1]), flush=True)
    blas = "OpenBLAS" if "openblas" in os.environ.get("LD_PRELOAD", "") else "bundled BLAS"
    Path(args.out).write_text("".join(json.dumps({**r, "model": model, "blas": blas}) + "\n" for r in rows))


if __name__ == "__main__":
    main()
