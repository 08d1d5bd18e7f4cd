"""Where the decode loop's drafts and passes part from the replay's, step by step, on a long copy
(issue 57: a code set keeps ~0.9-1.0 of the speedup the replay predicts; this shows where the rest
goes).

One trace of a set on accelerator.py's proxy (its model forced to the trace), the trace whose
replay makes the most tokens a step of the --traces picked, three ways:
- loop: the single stream as `specgen.stream_generate` runs it (Engine.plan, then decode.generate's
  own Step events), timed against mlx-lm's stream_generate, alternating (median of --repeats);
- replay: `simulate.replay` as accelerator.py predicts (a loop that never waits: each pass costs
  its queued time, nothing is queued ahead, the drafter priced by that timed curve);
- priced: the replay with the loop's own prices (its calibrated drafting cost, queue_after and
  overlap), so that a difference of pricing shows apart from one of timing.
Then every step where the three part ways: where each starts a step, what it drafted and kept,
and whether its pass was queued behind the last (q).

    OPENBLAS_NUM_THREADS=1 LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libopenblas.so.0 \\
        python benchmarks/replay_steps.py --set code_fix_python
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import mlx_lm
from mlx_lm.tokenizer_utils import load as load_tokenizer

sys.path.insert(0, str(Path(__file__).parent))
import accelerator as A  # noqa: E402  (the proxy, its timed pass costs and the traces it picks)

import specgen  # noqa: E402
from specgen.draft.drafter import make_drafter  # noqa: E402
from specgen.draft.simulate import replay  # noqa: E402
from specgen.engine.cost.curve import cost_function, relative  # noqa: E402
from specgen.engine.decode import loop as decode  # noqa: E402
from specgen.engine.decode.eager import CHOICES  # noqa: E402
from specgen.engine.engine import Request  # noqa: E402
from specgen.engine.options import Options  # noqa: E402
from specgen.events import Step  # noqa: E402
from specgen.stats import RunStats  # noqa: E402


def loop_steps(engine, prompt: list[int], n: int) -> tuple[list[Step], float]:
    """The single stream's steps for `prompt` (n tokens) and its seconds from the first step."""
    plan = engine.plan(Request(prompt, Options(max_tokens=n)), RunStats())
    steps, start = [], None
    for event in decode.generate(engine.loaded.model, plan.sequence, queue_after=plan.queue_after,
                                 prices=plan.prices):
        if isinstance(event, Step):
            start = start or time.perf_counter()
            steps.append(event)
    return steps, time.perf_counter() - start


def starts(steps: list[Step]) -> dict[int, Step]:
    """Each step by the output position its first token fills."""
    at, out = 0, {}
    for s in steps:
        out[at] = s
        at += len(s.tokens)
    return out


def cell(step: Step | None) -> str:
    return "." if step is None else f"{step.drafted:>3}/{step.accepted:<3}{'q' if step.queued else ' '}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--set", default="code_fix_python")
    ap.add_argument("--traces", type=int, default=3, help="picked as accelerator.py picks; the longest copy is shown")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--max-prompt", type=int, default=1024)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    tokenizer = load_tokenizer(A.SHARED / "tokenizers/smollm2")

    def enc(text: str) -> list[int]:
        return tokenizer.encode(text, add_special_tokens=False)

    end = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else 2
    model = A.build("proxy", "float32", len(tokenizer.vocab))
    sample = enc(" ".join(json.loads(line)["output"] for line in
                          (A.SHARED / "traces/chat_llama2_7b.jsonl").read_text().splitlines()[:8]))
    engine = specgen.engine_for(model, tokenizer)
    found = engine.costs()
    rows = [json.loads(line) for line in (A.SHARED / f"traces/{args.set}.jsonl").read_text().splitlines()]
    picked = A.pick_traces(rows, enc, args.traces, args.max_prompt, args.max_tokens)
    context = sum(len(p) + len(o) // 2 for p, o in picked) // len(picked)
    model.target.set(sample, end)
    timed = A.pass_costs(model, sample, context, found.curve.eager or CHOICES[0])
    cost = cost_function(relative(timed["queued"]))

    def replayed(po, priced: bool) -> tuple[list[Step], float]:
        steps: list[Step] = []
        drafter = make_drafter(None, cost=found.drafting if priced else cost)
        extra = {"queue_after": found.queue_after, "overlap": found.curve.overlap} if priced else {}
        tally = replay(po[0], po[1], drafter, draft=64, cost=cost, steps=steps, **extra)
        return steps, tally.predicted_speedup

    prompt, output = max(picked, key=lambda po: len(po[1]) / len(replayed(po, False)[0]))
    model.target.set(prompt + output, end)
    runs: dict[str, list[float]] = {"mlx-lm": [], "loop": []}
    for r in range(args.repeats + 1):  # the first of each is a warm-up
        for name in (("mlx-lm", "loop") if r % 2 else ("loop", "mlx-lm")):
            if name == "loop":
                steps, seconds = loop_steps(engine, prompt, len(output))
            else:
                first = None
                for _ in mlx_lm.stream_generate(model, tokenizer, prompt, max_tokens=len(output)):
                    first = first or time.perf_counter()
                seconds = time.perf_counter() - first
            if r:
                runs[name].append(seconds)
    assert [t for s in steps for t in s.tokens] == output[: sum(len(s.tokens) for s in steps)]
    ways = {"loop": steps}
    ways["replay"], predicted = replayed((prompt, output), False)
    ways["priced"], priced = replayed((prompt, output), True)
    speedup = statistics.median(m / s for m, s in zip(runs["mlx-lm"], runs["loop"]))
    print(f"# {args.set}: the longest copy of {len(picked)} traces, {len(prompt)} prompt tokens, "
          f"{len(output)} output; pass ms queued 1 = {timed['queued'][1] * 1e3:.1f}, pipelined plain = "
          f"{timed['pipelined'] * 1e3:.1f}; loop {speedup:.2f}x mlx-lm (median of {args.repeats}), "
          f"replay predicts {predicted:.2f}x (kept {speedup / predicted:.2f}), priced as the loop {priced:.2f}x")
    for name, s in ways.items():
        drafted, accepted = sum(x.drafted for x in s), sum(x.accepted for x in s)
        print(f"# {name:>6}: {len(s)} steps, {sum(len(x.tokens) for x in s) / len(s):.2f} tokens a step, "
              f"drafted {drafted}, kept {accepted}, {sum(x.queued for x in s)} passes queued")
    at = {name: starts(s) for name, s in ways.items()}
    print(f"{'pos':>4}  " + "  ".join(f"{name:>9}" for name in ways) + "   (drafted/kept, q: queued)")
    for pos in sorted(set().union(*at.values())):
        here = [at[name].get(pos) for name in ways]
        same = all(h is not None for h in here) and len({(h.drafted, h.accepted) for h in here}) == 1
        if not same:
            print(f"{pos:>4}  " + "  ".join(f"{cell(h):>9}" for h in here))


if __name__ == "__main__":
    main()
