"""specgen against mlx-lm where the host's work per step weighs as much as the model's (a GPU).

Both run through their public APIs (`specgen.stream_generate`, `mlx_lm.stream_generate`) on a
Llama-3-8B-shaped model (32 layers) with random weights whose argmax is forced to a recorded
trace's next token (as emulated.py does), so every pass costs what the shape costs and the text is
a real 7B model's. specgen calibrates and prices drafts as it does for users.

Shapes: `proxy` (hidden 128, float32: an 8B model's host work per pass at a tiny compute, the
accelerator regime on this CPU with `OPENBLAS_NUM_THREADS=1`, so the host and MLX each have a
core) and `8b` (hidden 4096, `--dtype bfloat16` or `4bit`, for a GPU).

    OPENBLAS_NUM_THREADS=1 LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libopenblas.so.0 \\
        python benchmarks/accelerator.py [--shape proxy|8b] [--dtype float32|bfloat16|4bit] \\
        [--traces 3] [--max-tokens 128] [--repeats 3] [--sets ...] [--batch 4] [--costs DIR]

Prints the per-pass costs (a synchronous pass of 1 and 8 positions with its read-back, mlx-lm's
pipelined plain step, a queued pass of k positions), then per set: decode tok/s of both (tokens
after the first over the time after the first, the same count for both), the speedup (median,
min-max over rounds, alternating), tokens per step, the speedup a zero-overhead replay of the
drafter predicts when each pass costs what it costs queued (back to back, never waiting: the limit
on any device), measured / predicted, and whether every text equals the trace.
"""

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import mlx_lm
from mlx_lm.models import llama
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.tokenizer_utils import load as load_tokenizer

import specgen
from specgen.cli.timing import Timed, alternate, spread
from specgen.draft.drafter import make_drafter
from specgen.draft.simulate import Tally, replay
from specgen.engine.cost.curve import cost_function, relative
from specgen.engine.cost.store import batch_calibration_file, blas, entry_key, read_store
from specgen.engine.decode.eager import CHOICES, eager
from specgen.engine.decode.rollback import Rollback
from specgen.store import CACHE_ENV

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
SETS = ["code_edit_qwen25coder_7b", "code_fix_python", "chat_llama2_7b", "chat_mistral_7b"]
SHAPES = {  # Llama-3-8B's 32 layers and head layout; the proxy keeps its depth, not its width
    "proxy": dict(hidden_size=128, intermediate_size=448, num_attention_heads=4, num_key_value_heads=1),
    "8b": dict(hidden_size=4096, intermediate_size=14336, num_attention_heads=32, num_key_value_heads=8),
}


class Forced(nn.Module):
    """A model whose argmax at each position is the current trace's next token (real logits plus a
    boost), so passes cost what the model costs and the text is the trace's."""

    def __init__(self, model):
        super().__init__()
        self.model, self.args, self.layers = model, model.args, model.layers
        self.target = _Target()

    def __call__(self, x, cache=None, **kw):
        start = cache[0].offset  # a number alone; each row's own in a batch (mlx-lm's and specgen's)
        start = mx.array([start]) if isinstance(start, int) else start
        logits = self.model(x, cache=cache)
        pos = mx.clip(start.reshape(-1, 1) + mx.arange(1, 1 + x.shape[1])[None], 0, self.target.n)
        forced = self.target.seq[pos]
        return logits + (mx.arange(logits.shape[-1])[None, None, :] == forced[..., None]) * 1e4


class _Target:  # a plain object, so nn.Module does not take the sequence for a parameter
    seq, n = mx.array([0]), 0

    def set(self, tokens, end):
        self.seq, self.n = mx.array(tokens + [end]), len(tokens)


def build(shape: str, dtype: str, vocab: int):
    mx.random.seed(0)
    args = llama.ModelArgs.from_dict(dict(model_type="llama", num_hidden_layers=32, rms_norm_eps=1e-5,
                                          vocab_size=vocab, tie_word_embeddings=False, rope_theta=500000.0,
                                          max_position_embeddings=8192, **SHAPES[shape]))
    model = llama.Model(args)
    if dtype == "4bit":
        nn.quantize(model, group_size=64, bits=4)
    else:
        model.set_dtype(getattr(mx, dtype))
    mx.eval(model.parameters())
    return Forced(model)


def adopt(folder: str, key: str) -> None:
    """Price as the machine whose calibrations `folder` holds (gpu.sh's $OUT): its curve and
    batched-step grid, stored under this model's key on this machine in a fresh cache folder, are
    read instead of measured. specgen then decides as it did there (how far to draft, whether a
    batch drafts) while each pass costs what it costs here."""
    cache = Path(tempfile.mkdtemp(prefix="specgen-costs-"))
    for name in ("calibration.json", "batch_calibration.json"):
        entry = next(iter(json.loads((Path(folder) / name).read_text()).values()))
        (cache / name).write_text(json.dumps({entry_key(key): entry}))
    os.environ[CACHE_ENV] = str(cache)


def pass_costs(model, tokens: list[int], context: int, every: int, rounds: int = 10) -> dict[str, object]:
    """Seconds of a synchronous pass (1 and 8 positions, argmax read back; also run eagerly every
    `every` layers, as specgen runs one where its calibration chose that: engine/decode/eager.py), of mlx-lm's
    pipelined plain step, and of queued passes of k positions (8 back to back, read once) per k,
    over `context` cached tokens (attention over them weighs on a narrow model's wide passes)."""
    tokens = (tokens * (1 + (context + 600) // len(tokens)))[: context + 600]
    cache = make_prompt_cache(model)
    back = Rollback(cache)
    model(mx.array([tokens[:context]]), cache=cache)
    mx.eval([c.state for c in cache])
    back.fed(context)
    at = back.cached

    def sync(k, every=0):
        t = time.perf_counter()
        with eager(cache, every):
            logits = model(mx.array([tokens[at:at + k]]), cache=cache)
        mx.argmax(logits[0], axis=-1).tolist()
        dt = time.perf_counter() - t
        back.fed(k)
        back.rewind_to(at)
        return dt

    def queued(k, n=8):
        t = time.perf_counter()
        outs = []
        for i in range(n):
            outs.append(mx.argmax(model(mx.array([tokens[at + i * k:at + (i + 1) * k]]), cache=cache)[0], -1))
            mx.async_eval(outs[-1])
        mx.eval(outs)
        dt = (time.perf_counter() - t) / n
        back.fed(n * k)
        back.rewind_to(at)
        return dt

    def pipelined(n=16):
        y = mx.array([tokens[at]])
        t = time.perf_counter()
        y = mx.argmax(model(y[None], cache=cache)[0, -1]).reshape(1)
        mx.async_eval(y)
        for _ in range(n):
            nxt = mx.argmax(model(y[None], cache=cache)[0, -1]).reshape(1)
            mx.async_eval(nxt)
            y.item()
            y = nxt
        y.item()
        dt = (time.perf_counter() - t) / (n + 1)
        back.fed(n + 1)
        back.rewind_to(at)
        return dt

    sizes = (1, 2, 4, 8, 16, 32, 64)
    for k in sizes:  # compile every width first
        sync(k), queued(k)
    pipelined()
    # Round-robin over the measures, medians per measure: a slow spell of this VM then lands on
    # every width alike instead of on one (timed width by width, queued 8 read 1.35-1.98x queued 1).
    measures = {"sync1": (sync, 1), "sync8": (sync, 8), "eager1": (sync, 1, every), "eager8": (sync, 8, every),
                "pipelined": (pipelined,),
                **{k: (queued, k) for k in sizes}}
    times = {name: [] for name in measures}
    for _ in range(rounds):
        for name, (f, *a) in measures.items():
            times[name].append(f(*a))
    med = {name: statistics.median(t) for name, t in times.items()}
    return {**{m: med[m] for m in ("sync1", "sync8", "eager1", "eager8", "pipelined")},
            "queued": {k: med[k] for k in sizes}}


def pick_traces(rows, enc, count, max_prompt, max_tokens):
    """(prompt, output) of `count` traces spread over a file, each output cut to `max_tokens`."""
    picked = []
    for i in range(0, len(rows), max(1, len(rows) // (4 * count))):
        prompt, output = enc(rows[i]["prompt"]), enc(rows[i]["output"])
        if len(prompt) <= max_prompt and len(output) >= max_tokens:
            picked.append((prompt, output[:max_tokens]))
        if len(picked) == count:
            break
    return picked


def timed(responses) -> Timed:
    """Tokens after the first over the time after the first, the same count for both APIs."""
    tokens, start = [], None
    for r in responses:
        if start is None:
            start = time.perf_counter()
        tokens.append(r.token)
    return Timed(tokens, max(len(tokens) - 1, 0), time.perf_counter() - start)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", choices=list(SHAPES), default="proxy")
    ap.add_argument("--dtype", choices=["float32", "bfloat16", "float16", "4bit"], default="float32")
    ap.add_argument("--traces", type=int, default=3, help="traces per set")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--max-prompt", type=int, default=1024)
    ap.add_argument("--sets", nargs="*", default=SETS)
    ap.add_argument("--tokenizer", default=str(SHARED / "tokenizers/smollm2"))
    ap.add_argument("--json", help="append one JSON line per set to this file")
    ap.add_argument("--batch", type=int, default=0,
                    help="also time this many requests at once (batch_generate against mlx-lm's)")
    ap.add_argument("--costs", help="price as another machine: a folder with its calibration.json and "
                    "batch_calibration.json (gpu.sh keeps them in $OUT); the passes still cost this one's")
    args = ap.parse_args()
    tokenizer = load_tokenizer(Path(args.tokenizer))
    enc = lambda text: tokenizer.encode(text, add_special_tokens=False)
    end = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else 2  # past a trace: EOS
    model = build(args.shape, args.dtype, len(tokenizer.vocab) if hasattr(tokenizer, "vocab") else 49152)
    sample = enc(" ".join(json.loads(line)["output"] for line in
                          (SHARED / "traces/chat_llama2_7b.jsonl").read_text().splitlines()[:8]))
    print(f"# {args.shape} ({args.dtype}), {mx.default_device()}, mlx {mx.__version__}, BLAS: {blas()}")
    engine = specgen.engine_for(model, tokenizer)
    if args.costs:
        adopt(args.costs, engine.loaded.calibration_key)
    found = engine.costs()
    print(f"# specgen's calibration: {found.curve}, off: {found.off}")
    for name in args.sets:
        rows = [json.loads(line) for line in (SHARED / f"traces/{name}.jsonl").read_text().splitlines()]
        picked = pick_traces(rows, enc, args.traces, args.max_prompt, args.max_tokens)
        context = sum(len(p) + len(o) // 2 for p, o in picked) // len(picked)
        model.target.set(sample, end)
        every = found.curve.eager or CHOICES[0]
        costs = pass_costs(model, sample, context, every)
        queued = relative(costs["queued"])
        cost = cost_function(queued)
        print(f"## {name}: over {context} tokens, pass ms: sync 1 = {costs['sync1'] * 1e3:.2f}, "
              f"sync 8 = {costs['sync8'] * 1e3:.2f} (eagerly every {every}: {costs['eager1'] * 1e3:.2f}, "
              f"{costs['eager8'] * 1e3:.2f}), pipelined plain = {costs['pipelined'] * 1e3:.2f}; "
              "queued k / queued 1: " + ", ".join(f"{k}: {v:.2f}" for k, v in queued.items()))
        predicted = Tally()
        for prompt, output in picked:
            predicted.add(replay(prompt, output, make_drafter(None, cost=cost), draft=64, cost=cost))
        steps, identical = [], True

        def base(po):
            model.target.set(po[0] + po[1], end)
            return timed(mlx_lm.stream_generate(model, tokenizer, po[0], max_tokens=len(po[1])))

        contenders = {"mlx-lm": base, "specgen": lambda po: _time_spec(model, tokenizer, po, end, steps)}
        for po in picked:  # warm up both on every trace: the first pass of a width compiles kernels
            contenders["mlx-lm"](po), contenders["specgen"](po)
        steps.clear()

        def seen(r, i, runs):
            nonlocal identical
            identical &= runs["mlx-lm"].tokens == runs["specgen"].tokens == picked[i][1]

        rounds = alternate(contenders, picked, args.repeats, seen)
        med, low, high = spread(rounds.ratios("specgen", "mlx-lm"))
        tps = sum(c.tokens for c in steps) / max(1, sum(c.steps for c in steps))
        pred = predicted.predicted_speedup
        row = {"set": name, "shape": args.shape, "dtype": args.dtype, "device": str(mx.default_device()),
               "mlx_lm_tps": spread(rounds.tps("mlx-lm"))[0], "specgen_tps": spread(rounds.tps("specgen"))[0],
               "speedup": med, "min": low, "max": high, "tokens_per_step": tps, "predicted": pred,
               "kept": med / pred, "identical": identical, "context": context, "queued": queued,
               "pass_ms": {m: costs[m] * 1e3 for m in ("sync1", "sync8", "eager1", "eager8", "pipelined")}}
        print(f"{'set':26} {'mlx-lm':>7} {'specgen':>7} {'speedup':>8} {'min':>5} {'max':>5} "
              f"{'tok/step':>8} {'predicted':>9} {'kept':>5} {'identical':>9}")
        print(f"{name:26} {row['mlx_lm_tps']:7.1f} {row['specgen_tps']:7.1f} {med:7.2f}x "
              f"{low:5.2f} {high:5.2f} "
              f"{tps:8.2f} {pred:8.2f}x {med / pred:5.2f} {str(identical):>9}", flush=True)
        if args.batch:
            row["batch"] = batched(model, tokenizer, picked, end, args.batch, args.repeats)
            print(f"{name:26} batch of {args.batch}: {row['batch']['speedup']:.2f}x mlx_lm.batch_generate "
                  f"({row['batch']['min']:.2f}-{row['batch']['max']:.2f}), decode alone "
                  f"{row['batch']['decode_speedup']:.2f}x ({row['batch']['decode_min']:.2f}-"
                  f"{row['batch']['decode_max']:.2f}), {row['batch']['tokens_per_step']:.2f} "
                  f"tokens a batched step, identical {row['batch']['identical']}; prefill "
                  f"{row['batch']['prefill_share']:.0%} of mlx-lm's call, so at most "
                  f"{row['batch']['ceiling']:.2f}x ({row['batch']['ceiling_min']:.2f}-"
                  f"{row['batch']['ceiling_max']:.2f})", flush=True)
        if args.json:
            with open(args.json, "a") as f:
                f.write(json.dumps(row) + "\n")
    if args.batch:  # what the batch priced its drafts by (how wide it timed, and how dear)
        entry = read_store(batch_calibration_file()).get(entry_key(engine.loaded.calibration_key), {})
        for rows, widths in entry.get("grid", {}).items():
            print(f"# batched step, {rows} rows, ms by positions a row: "
                  + ", ".join(f"{w}: {t * 1e3:.1f}" for w, t in widths.items()))


def batched(model, tokenizer, picked, end, rows: int, repeats: int) -> dict:
    """`rows` requests at once through specgen.batch_generate and mlx_lm.batch_generate, per trace:
    row i continues the trace from 4 * i tokens further on (the model is forced by each row's own
    position), so rows end apart and every text is the trace's. Whole calls timed, alternating."""
    def work(po):
        prompt, output = po
        model.target.set(prompt + output, end)
        return [prompt + output[: 4 * i] for i in range(rows)], len(output) - 4 * (rows - 1)

    steps, decode = [], {"mlx-lm": [], "specgen": []}  # decode: each call's generation seconds
    whole = {"mlx-lm": [], "specgen": []}  # whole calls' seconds, beside their decode seconds in `decode`

    def mlx_lm_run(po):
        prompts, n = work(po)
        t = time.perf_counter()
        out = mlx_lm.batch_generate(model, tokenizer, prompts, max_tokens=n, return_token_ids=True)
        decode["mlx-lm"].append(out.stats.generation_time)
        whole["mlx-lm"].append(time.perf_counter() - t)
        return Timed([t for ids in out.token_ids for t in ids], n * rows, whole["mlx-lm"][-1])

    def specgen_run(po):
        prompts, n = work(po)
        t = time.perf_counter()
        # `rows` at most, so the batched grid it needs is up to `rows` rows: one adopted with --costs
        # (up to 8 rows) is then read, not measured again for the default 32.
        out = specgen.batch_generate(model, tokenizer, prompts, max_tokens=n, return_token_ids=True,
                                     completion_batch_size=rows)
        run = Timed([t for ids in out.token_ids for t in ids], n * rows, time.perf_counter() - t)
        steps.append((out.stats.generation_tokens, out.stats.generation_steps))
        decode["specgen"].append(out.stats.generation_time)
        whole["specgen"].append(run.seconds)
        return run

    contenders = {"mlx-lm": mlx_lm_run, "specgen": specgen_run}
    for po in picked:
        mlx_lm_run(po), specgen_run(po)
    steps.clear(), whole["mlx-lm"].clear(), whole["specgen"].clear()
    decode["mlx-lm"].clear(), decode["specgen"].clear()
    identical = True

    def seen(r, i, runs):
        nonlocal identical
        identical &= runs["mlx-lm"].tokens == runs["specgen"].tokens

    rounds = alternate(contenders, picked, repeats, seen)
    med, low, high = spread(rounds.ratios("specgen", "mlx-lm"))
    tps = sum(t for t, _ in steps) / max(1, sum(n for _, n in steps))  # mlx-lm's: one a row
    # Decode alone (prefill left out), each call's own ratio: what speculation moves; the whole
    # call also holds the four prefills, which both pay alike.
    decoded = spread([a / b for a, b in zip(decode["mlx-lm"], decode["specgen"])])
    # The whole call's ceiling: its speedup were specgen's decoding free and the rest (its
    # prefills: less than mlx-lm's where rows share a prompt's opening, share.py) what it costs.
    ceiling = spread([w / (ws - ds) for w, ws, ds in zip(whole["mlx-lm"], whole["specgen"], decode["specgen"])])
    return {"rows": rows, "speedup": med, "min": low, "max": high, "tokens_per_step": tps,
            "identical": identical, "decode_speedup": decoded[0], "decode_min": decoded[1], "decode_max": decoded[2],
            "prefill_share": statistics.median(1 - d / w for w, d in zip(whole["mlx-lm"], decode["mlx-lm"])),
            "ceiling": ceiling[0], "ceiling_min": ceiling[1], "ceiling_max": ceiling[2]}


def _time_spec(model, tokenizer, po, end, steps) -> Timed:
    """specgen through its public API, timed as mlx-lm is; its step counts kept."""
    model.target.set(po[0] + po[1], end)
    last = []

    def responses():
        for r in specgen.stream_generate(model, tokenizer, po[0], max_tokens=len(po[1])):
            last[:] = [r]
            yield r

    run = timed(responses())
    steps.append(last[0].stats.counts)
    return run


if __name__ == "__main__":
    main()
