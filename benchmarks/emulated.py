"""Speedup on a realistic-size target whose output is a real model's: a Llama-shaped random-weight
model of about 50M parameters (hidden 512, 8 layers, vocab 32000, float32) runs real forward
passes, and a wrapper then makes the recorded trace's next token the argmax at every position.
So the cost of every forward pass is real and the text is what a real 7B model wrote.

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libopenblas.so.0 python benchmarks/emulated.py \\
        [--traces 5] [--max-tokens N] [--repeats 3] [--sets ...] [--memory]

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
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten
from mlx_lm.models import llama

from specgen.bench import mlx_lm_tokens, specgen_tokens
from specgen.calibrate import blas, measure
from specgen.cost import Curve, cost_function, relative
from specgen.drafter import make_drafter
from specgen.memory import NGramMemory
from specgen.report import describe_curve
from specgen.simulate import Tally, replay
from specgen.timing import alternate, spread
from specgen.traces import load_tokenizer

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
FILES = ["code_edit_qwen25coder_7b", "code_fix_python", "chat_llama2_7b", "chat_mistral_7b",
         "chat_qwen15_7b"]


class Forced:
    """Wraps a model: real logits, then the trace's next token made the argmax at each position."""

    def __init__(self, model, sequence):
        self.model, self.layers = model, model.layers
        self.seq = mx.array(sequence + [2])  # past the end: EOS
        self.n = len(sequence)

    def __call__(self, x, cache):
        start = cache[0].offset
        logits = self.model(x, cache=cache)
        pos = mx.minimum(mx.arange(start + 1, start + 1 + x.shape[1]), self.n)
        forced = self.seq[pos]
        boost = (mx.arange(logits.shape[-1])[None, None, :] == forced[None, :, None]) * 1e4
        return logits + boost


def build_model(seed=0):
    args = llama.ModelArgs(model_type="llama", hidden_size=512, num_hidden_layers=8,
                           intermediate_size=1408, num_attention_heads=8, num_key_value_heads=8,
                           rms_norm_eps=1e-5, vocab_size=32000, tie_word_embeddings=False)
    mx.random.seed(seed)
    model = llama.Model(args)
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
    model = build_model()
    params = sum(v.size for _, v in tree_flatten(model.parameters()))
    seconds = measure(model, list(range(100, 356)))
    curve = Curve(relative(seconds))
    cost = cost_function(curve.relative)
    print(f"# {params / 1e6:.1f}M-parameter llama (float32), BLAS: {blas()}")
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
            return make_drafter(None, cost=cost, memory=mem and mem.reader())

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
