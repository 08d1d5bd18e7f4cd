"""Structured outputs: specgen under a JSON schema against plain constrained decoding and mlx-lm.

Three contenders on every (prompt, schema) of a set (structured_sets.py), through public APIs:
- `specgen`: `specgen.stream_generate(..., response_format=...)`, speculating as users run it;
- `draft0`: the same with `draft=0`: plain constrained decoding, the text every contender must give;
- `mlx-lm`: `mlx_lm.stream_generate` with an llguidance logits processor (`GuidanceProcessor`, the
  way LM Studio's MLX engine constrains: the mask computed and applied at every token).
Greedy; decode tok/s = tokens after the first over the seconds after the first (prefill left out,
the same count for all); alternating order, ratios per round, median (min-max). Also the grammar's
host time per step (mask, checks, forced tokens) of specgen and of the processor.

`--served 1 8`: instead, `specgen serve` against `specgen serve --draft 0` (mlx_lm.server ignores
response_format: it has no constrained peer) on SmolLM2 in float32, that many streamed chat
requests at once with a `response_format`, each new to both servers (numbered), alternating which
server goes first; aggregate tok/s over the round's wall time, texts identical.

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libopenblas.so.0 python benchmarks/structured.py \\
        [--model ../shared/models/smollm2-135m-instruct-4bit] [--dtype float32] [--rounds 2] \\
        [--max-tokens 320] [--sets extraction other] [--json FILE]
"""

import argparse
import json
import statistics
import sys
import threading
import time
from pathlib import Path

import llguidance
import llguidance.hf
import mlx.core as mx
import mlx_lm
import numpy as np

import specgen
from specgen.cli.timing import Timed, alternate, spread
from specgen.engine.cost.store import blas
from specgen.structured import grammar as grammar_module
from specgen.structured.formats import JSON_OPTIONS

sys.path.insert(0, str(Path(__file__).resolve().parent))
from structured_sets import SETS  # noqa: E402

SHARED = Path(__file__).resolve().parents[1].parent / "shared"


class GuidanceProcessor:
    """An mlx-lm logits processor constraining to an llguidance grammar (its text): each call moves
    the matcher past the tokens sampled since the last call, then masks every forbidden token. The
    tests use it too: plain constrained decoding written without specgen's engine."""

    def __init__(self, ll_tokenizer, grammar: str, prompt_tokens: int):
        self.matcher = llguidance.LLMatcher(ll_tokenizer, grammar, log_level=0)
        self.seen, self.host_s = prompt_tokens, 0.0

    def __call__(self, tokens: mx.array, logits: mx.array) -> mx.array:
        start = time.perf_counter()
        new = tokens[self.seen:].tolist()
        self.seen = tokens.size
        if new:
            self.matcher.consume_tokens(new)
        bits = np.unpackbits(np.frombuffer(self.matcher.compute_bitmask(), np.uint8), bitorder="little")
        vocab = logits.shape[-1]
        allowed = np.zeros(vocab, bool)
        allowed[: min(vocab, bits.size)] = bits[:vocab].astype(bool)
        self.host_s += time.perf_counter() - start
        return mx.where(mx.array(allowed), logits, -mx.inf)


class HostClock:
    """The seconds specgen spends in the grammar's calls (its Matcher's methods), summed."""

    def __init__(self):
        self.seconds = 0.0
        for name in ("forced", "valid", "advance", "back", "bitmask"):
            setattr(grammar_module.Matcher, name, self._timed(getattr(grammar_module.Matcher, name)))

    def _timed(self, method):
        def timed(*a, **k):
            start = time.perf_counter()
            try:
                return method(*a, **k)
            finally:
                self.seconds += time.perf_counter() - start
        return timed


def timed(responses) -> Timed:
    tokens, first, last, steps = [], None, None, None
    for r in responses:
        now = time.perf_counter()
        first = first or now
        last = now
        tokens.append(r.token)
        steps = getattr(r, "stats", None)
    return Timed(tokens, max(len(tokens) - 1, 0), (last - first) if first else 0.0,
                 [steps.counts.steps] if steps is not None else [])


def served(levels: list[int], rounds: int, max_tokens: int, names: list[str], log_dir: Path) -> None:
    """Each level: that many structured requests at once to each server, alternating; one line each."""
    import openai
    from serve import float32_model, start

    model = float32_model()
    items = [(p, schema) for name in names for p, schema in SETS[name]()]
    procs = {}
    try:
        for name, extra in (("specgen", []), ("draft0", ["--draft", "0"])):
            procs[name] = start("specgen", model, log_dir / f"structured-{name}.log", extra)
        clients = {name: openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=600)
                   for name, (_, url) in procs.items()}
        for client in clients.values():  # calibration and first kernels, untimed
            _at_once(client, [([{"role": "user", "content": "Warm up. " + items[-1][0]}], items[-1][1])], max_tokens)
        n = 0
        for level in levels:
            tps, same = {k: [] for k in clients}, True
            for r in range(rounds):
                batch = []
                for _ in range(level):
                    p, schema = items[n % len(items)]
                    batch.append(([{"role": "user", "content": f"Request {n}. {p}"}], schema))
                    n += 1
                texts = {}
                for name in (list(clients) if r % 2 == 0 else list(clients)[::-1]):
                    start_s = time.perf_counter()
                    got = _at_once(clients[name], batch, max_tokens)
                    tps[name].append(sum(g["tokens"] for g in got) / (time.perf_counter() - start_s))
                    texts[name] = [g["text"] for g in got]
                same = same and texts["specgen"] == texts["draft0"]
            ratio = spread([a / b for a, b in zip(tps["specgen"], tps["draft0"])])
            print(json.dumps({"served_clients": level, "rounds": rounds, "vs_draft0": ratio, "blas": blas(),
                              "tps": {k: statistics.median(v) for k, v in tps.items()},
                              "texts_identical": same}), flush=True)
    finally:
        for proc, _ in procs.values():
            proc.terminate()
            proc.wait()


def _at_once(client, batch: list[tuple[list[dict], dict]], max_tokens: int) -> list[dict]:
    """Every (messages, schema) request sent at the same moment, each from its own thread."""
    out: list[dict | None] = [None] * len(batch)
    gate = threading.Barrier(len(batch))

    def one(i: int) -> None:
        messages, schema = batch[i]
        gate.wait()
        reply = client.chat.completions.create(
            model="default_model", messages=messages, max_tokens=max_tokens, temperature=0.0,
            response_format={"type": "json_schema", "json_schema": {"name": "out", "schema": schema}})
        out[i] = {"text": reply.choices[0].message.content, "tokens": reply.usage.completion_tokens}

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(batch))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=str(SHARED / "models" / "smollm2-135m-instruct-4bit"))
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=320)
    ap.add_argument("--sets", nargs="+", default=list(SETS), choices=list(SETS))
    ap.add_argument("--limit", type=int, default=0, help="at most this many prompts a set (0: all)")
    ap.add_argument("--json", help="append one JSON line per set to this file")
    ap.add_argument("--served", type=int, nargs="*", help="client counts: time served requests instead")
    args = ap.parse_args()
    if args.served:
        return served(args.served, args.rounds, args.max_tokens, args.sets, Path("/tmp"))

    model, tokenizer = specgen.load(args.model, dtype=args.dtype)
    ll_tokenizer = llguidance.hf.from_tokenizer(tokenizer._tokenizer)
    clock = HostClock()
    print(f"# {args.model} ({args.dtype}), {mx.default_device()}, mlx {mx.__version__}, BLAS: {blas()}")
    print("set          specgen/draft0     specgen/mlx-lm     tok/step  host ms/step (specgen, mlx-lm)  same")
    for name in args.sets:
        items = SETS[name]()[: args.limit or None]
        prompts = [(tokenizer.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True),
                    schema) for p, schema in items]
        host = {"specgen": [], "mlx-lm": []}
        steps = []
        same = []

        def ours(draft):
            def run(item):
                ids, schema = item
                fmt = {"type": "json_schema", "json_schema": {"name": "out", "schema": schema}}
                before = clock.seconds
                t = timed(specgen.stream_generate(model, tokenizer, ids, args.max_tokens, response_format=fmt,
                                                  **({"draft": 0} if draft == 0 else {})))
                if draft is None:
                    host["specgen"].append((clock.seconds - before) / max(t.steps[0], 1))
                    steps.append(len(t.tokens) / max(t.steps[0], 1))
                return t
            return run

        def peer(item):
            ids, schema = item
            grammar = llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=JSON_OPTIONS)
            proc = GuidanceProcessor(ll_tokenizer, grammar, len(ids))
            t = timed(mlx_lm.stream_generate(model, tokenizer, ids, max_tokens=args.max_tokens,
                                             logits_processors=[proc]))
            host["mlx-lm"].append(proc.host_s / max(len(t.tokens), 1))
            return t

        for item in prompts[:1]:  # compile kernels and the schema once, untimed
            ours(None)(item), ours(0)(item), peer(item)
        host = {"specgen": [], "mlx-lm": []}
        steps.clear()

        def seen(r, i, runs):
            texts = {k: tokenizer.decode([t for t in v.tokens if t not in tokenizer.eos_token_ids])
                     for k, v in runs.items()}
            same.append(len(set(texts.values())) == 1)

        rounds = alternate({"specgen": ours(None), "draft0": ours(0), "mlx-lm": peer}, prompts, args.rounds, seen)
        vs_plain, vs_peer = spread(rounds.ratios("specgen", "draft0")), spread(rounds.ratios("specgen", "mlx-lm"))
        row = {"set": name, "model": args.model, "dtype": args.dtype, "blas": blas(), "rounds": args.rounds,
               "prompts": len(prompts), "vs_draft0": vs_plain, "vs_mlx_lm": vs_peer,
               "tps": {k: statistics.median(rounds.tps(k)) for k in rounds.names},
               "tokens_per_step": statistics.median(steps),
               "host_ms_per_step": {k: 1000 * statistics.median(v) for k, v in host.items()},
               "texts_identical": all(same)}
        print(f"{name:12} {vs_plain[0]:.2f}x ({vs_plain[1]:.2f}-{vs_plain[2]:.2f})  "
              f"{vs_peer[0]:.2f}x ({vs_peer[1]:.2f}-{vs_peer[2]:.2f})  {row['tokens_per_step']:.2f}      "
              f"{row['host_ms_per_step']['specgen']:.2f}, {row['host_ms_per_step']['mlx-lm']:.2f}"
              f"                     {all(same)}", flush=True)
        if args.json:
            with open(args.json, "a") as f:
                f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
