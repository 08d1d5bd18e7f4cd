"""Speedup on a realistic-size target whose output is a real model's: a random-weight model of
about 50M parameters (hidden 512, 8 layers, vocab 32000, float32) runs real forward passes, and a
wrapper then makes the recorded trace's next token the argmax at every position. So the cost of
every forward pass is real and the text is what a real 7B model wrote. `--arch` picks its shape:
Llama (KV caches), Qwen3-Next (linear-attention layers with state caches, every other layer full
attention: a hybrid), or Gemma-3 (five sliding-window layers to one global, `--window` tokens).

Under `mlx.launch -n 2 --backend ring -- python benchmarks/emulated.py ...` the model is split
tensor-parallel over the ranks (llama shape), the curve is measured with every rank in step and
rank 0's is used by all, and mlx-lm's baseline runs on the same sharded model; rank 0 prints.

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libopenblas.so.0 python benchmarks/emulated.py \\
        [--arch llama|qwen3_next|gemma3] [--window 512] [--traces 5] [--max-tokens N] \\
        [--repeats 3] [--sets ...] [--memory]

Traces are tokenized with the Llama-2 tokenizer from ../shared. Reports, per trace file, mlx-lm
plain greedy and specgen (default adaptive drafter with the measured cost curve, and --draft 0)
decode tok/s (prefill excluded, as in `specgen bench`) in the same process, alternating order,
medians over repeats, whether outputs matched the trace, and the speedup `simulate`'s replay predicts
for the same traces under the measured curve (no overhead). With --memory, specgen also drafts
from a memory of the file's other outputs (never the timed traces'), read-only, as a returning
user's `--memory` would.
"""

import argparse
import json
import os
import sys
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten
from mlx_lm.models import gemma3_text, llama, qwen3_next
from mlx_lm.models.cache import make_prompt_cache

from specgen.cli.bench import mlx_lm_tokens, specgen_tokens
from specgen.cli.timing import alternate, spread
from specgen.draft.drafter import make_drafter
from specgen.draft.memory import NGramMemory
from specgen.draft.simulate import Tally, replay
from specgen.draft.traces import load_tokenizer
from specgen.engine.cost.calibrate import measure
from specgen.engine.cost.curve import Curve, cost_function, drafting_cost, relative
from specgen.engine.cost.mode import describe_curve
from specgen.engine.cost.store import blas
from specgen.engine.decode.rollback import Rollback
from specgen.engine.load.distributed import share, world

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
FILES = ["code_edit_qwen25coder_7b", "code_fix_python", "chat_llama2_7b", "chat_mistral_7b",
         "chat_qwen15_7b"]


class Forced:
    """Wraps a model: real logits, then the trace's next token made the argmax at each position."""

    def __init__(self, model, sequence):
        self.model, self.layers = model, model.layers
        self.seq = mx.array(sequence + [2])  # past the end: EOS
        self.n = len(sequence)
        if hasattr(model, "make_cache"):  # hybrids build their own cache types
            self.make_cache = model.make_cache
        # The position comes from a cache that counts tokens (state caches do not).
        self.counter = next(i for i, c in enumerate(make_prompt_cache(model)) if hasattr(c, "offset"))

    def __call__(self, x, cache):
        start = cache[self.counter].offset
        logits = self.model(x, cache=cache)
        pos = mx.minimum(mx.arange(start + 1, start + 1 + x.shape[1]), self.n)
        forced = self.seq[pos]
        boost = (mx.arange(logits.shape[-1])[None, None, :] == forced[None, :, None]) * 1e4
        return logits + boost


def build_model(arch="llama", window=512, seed=0):
    shared = dict(hidden_size=512, num_hidden_layers=8, intermediate_size=1408, num_attention_heads=8,
                  rms_norm_eps=1e-5, vocab_size=32000, tie_word_embeddings=False)
    if arch == "llama":
        module, args = llama, dict(model_type="llama", num_key_value_heads=8, **shared)
    elif arch == "qwen3_next":  # dense MLPs (no experts): the shape, not the MoE, is what matters here
        module, args = qwen3_next, dict(
            model_type="qwen3_next", num_key_value_heads=2, linear_num_value_heads=8, linear_num_key_heads=4,
            linear_key_head_dim=64, linear_value_head_dim=64, linear_conv_kernel_dim=4, num_experts=0,
            num_experts_per_tok=0, decoder_sparse_step=1, shared_expert_intermediate_size=0,
            mlp_only_layers=list(range(8)), moe_intermediate_size=0, rope_theta=10000.0,
            partial_rotary_factor=0.25, max_position_embeddings=8192, head_dim=64,
            full_attention_interval=2, **shared)
    else:
        # window 0: the same model with every layer global (KV caches): the target without a window
        module, args = gemma3_text, dict(model_type="gemma3_text", num_key_value_heads=4, head_dim=64,
                                         sliding_window=window or 512, sliding_window_pattern=6 if window else 1,
                                         **shared)
    mx.random.seed(seed)
    model = module.Model(module.ModelArgs.from_dict(args))
    mx.eval(model.parameters())
    return model


def pick_traces(rows, enc, count, max_prompt, max_tokens):
    """(prompt, output) of `count` traces spread over a file, and which rows they are."""
    picked, used = [], set()
    for i in range(0, len(rows), max(1, len(rows) // (4 * count))):
        prompt = [1] + enc(rows[i]["prompt"])
        output = enc(rows[i]["output"])
        if len(prompt) <= max_prompt and len(output) >= 32:
            picked.append((prompt, output[:max_tokens]))
            used.add(i)
        if len(picked) == count:
            break
    return picked, used


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--arch", choices=["llama", "qwen3_next", "gemma3"], default="llama")
    ap.add_argument("--window", type=int, default=512,
                    help="gemma3's sliding window; 0: none (every layer global, KV caches)")
    ap.add_argument("--traces", type=int, default=5, help="traces per file")
    ap.add_argument("--max-tokens", type=int, default=None,
                    help="cut each output to its first N tokens (default: whole outputs)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--max-prompt", type=int, default=1024, help="skip traces with longer prompts")
    ap.add_argument("--sets", nargs="*", default=FILES, choices=FILES, help="trace files to run")
    ap.add_argument("--memory", action="store_true",
                    help="draft with a memory of the file's other outputs (never the timed ones)")
    args = ap.parse_args()
    enc = load_tokenizer(str(SHARED / "tokenizers/llama2/tokenizer.model"))
    model = build_model(args.arch, args.window)
    params = sum(v.size for _, v in tree_flatten(model.parameters()))
    group = world()
    if group is not None:
        model.shard(group.group)
        mx.eval(model.parameters())
        if group.rank != 0:
            sys.stdout = open(os.devnull, "w")
    seconds = measure(model, list(range(100, 356)), fixed=group is not None)
    flat = share(group, [v for kv in sorted(seconds.items()) for v in kv] if group is None or group.rank == 0 else None)
    seconds = {int(k): v for k, v in zip(flat[::2], flat[1::2])}  # rank 0's, on every rank
    curve = Curve(relative(seconds))
    cost = cost_function(curve.relative)
    how = Rollback(make_prompt_cache(model)).how
    drafting = drafting_cost(cost, 0.0, None, refeed=how != "trim")  # as calibrate.model_costs
    shape = args.arch + (f", window {args.window or 'none'}" if args.arch == "gemma3" else "")
    ranks = f", {group.size} ranks (tensor-parallel, ring)" if group else ""
    print(f"# {params / 1e6:.1f}M-parameter {shape} (float32){ranks}, rollback: {how}, BLAS: {blas()}")
    print(f"# one position {seconds[1] * 1e3:.1f} ms; {describe_curve(curve)}; cost(4 drafts) = {cost(4):.2f}")
    print(f"{'set':28} {'mlx-lm':>8} {'specgen':>8} {'speedup':>8} {'min':>6} {'max':>6} "
          f"{'draft0':>7} {'tok/step':>8} {'predicted':>9} {'identical':>9}")
    for name in args.sets:
        rows = [json.loads(line) for line in (SHARED / f"traces/{name}.jsonl").read_text().splitlines()]
        picked, used = pick_traces(rows, enc, args.traces, args.max_prompt, args.max_tokens)
        mem = None
        if args.memory:  # what a returning user has: this model's earlier answers to other prompts
            mem = NGramMemory("emulated")
            for i, row in enumerate(rows):
                if i not in used:
                    mem.add(enc(row["output"]))

        def adaptive():  # a drafter as run makes it, each with its own view of the memory
            return make_drafter(None, cost=drafting, memory=mem and mem.reader())

        # What these traces predict with the same drafter and curve and no overhead (`simulate`'s
        # replay): the gap to the measured speedup is what the loop and unqueued steps cost.
        predicted = Tally()
        for prompt, output in picked:
            predicted.add(replay(prompt, output, adaptive(), draft=64, cost=cost))
        forced = {id(p): Forced(model, p + o) for p, o in picked}
        contenders = {
            "mlx-lm": lambda po: mlx_lm_tokens(forced[id(po[0])], po[0], len(po[1]), frozenset()),
            "specgen": lambda po: specgen_tokens(forced[id(po[0])], po[0], len(po[1]), frozenset(),
                                                 adaptive, 64),
            "draft0": lambda po: specgen_tokens(forced[id(po[0])], po[0], len(po[1]), frozenset(),
                                                lambda: make_drafter(0), 0),
        }
        steps, identical = [], True

        def seen(r, i, runs):
            nonlocal identical
            identical &= runs["mlx-lm"].tokens == runs["specgen"].tokens == picked[i][1]
            if r == 0:
                steps.extend(runs["specgen"].steps)

        rounds = alternate(contenders, picked, args.repeats, seen)
        med, low, high = spread(rounds.ratios("specgen", "mlx-lm"))
        print(f"{name:28} {spread(rounds.tps('mlx-lm'))[0]:8.1f} {spread(rounds.tps('specgen'))[0]:8.1f} "
              f"{med:7.2f}x {low:6.2f} {high:6.2f} {spread(rounds.ratios('draft0', 'mlx-lm'))[0]:7.3f} "
              f"{sum(len(s.tokens) for s in steps) / len(steps):8.2f} {predicted.predicted_speedup:8.2f}x "
              f"{str(identical):>9}", flush=True)


if __name__ == "__main__":
    main()
