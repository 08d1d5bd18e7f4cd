"""When memory steps aside in an agent's session (`DrafterParams.aside_share`), chosen by leaving
one file out: tuned on three agent sessions, reported on the fourth, each in turn.

    python benchmarks/leave_one_out.py [-t TOKENIZER] [FILE.jsonl ...]
        (default: ../shared/traces/agent_*.jsonl, Llama-2 tokenizer; one to two minutes)

The candidates are values of `aside_share`: memory's n-grams and copies step aside where the
prompt holds memory's newest output and at least that share of its output tokens; 0 is the rule
before (step aside whenever it holds the newest output), 2 never steps aside (the first token's
respelling and the "turn" acceptance are memory's in every case). Each file is one session, and
memory is filled two ways:

- alone: as `specgen simulate --memory`: memory starts empty, so it holds only outputs the
  prompt holds too;
- after: memory first holds the model's other sessions (the other files whose traces name the
  same model in `source`), as `run` and `serve` keep one memory per model across sessions.

For each held-out file, every candidate is replayed on the other files (their "after" memories
hold none of the held-out file) and scored by the mean log predicted speedup over those files
and both ways; the best (ties: the earlier candidate) is then replayed on the held-out file.
Prints one row per held-out file: the chosen value, then predicted speedup (tokens per step) on
that file with it, with the rule before (0), and with no memory, alone and after; then every
candidate's figures on every file.
"""

from __future__ import annotations

import argparse
import glob
import json
import math
from dataclasses import replace
from pathlib import Path

from specgen.draft.drafter import AdaptiveDrafter
from specgen.draft.length import linear_cost
from specgen.draft.memory import NGramMemory
from specgen.draft.params import PARAMS
from specgen.draft.simulate import simulate_file
from specgen.draft.traces import load_tokenizer, read_traces

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
CANDIDATES = (0.0, 0.5, 0.9, 1.0, 2.0)
BETA = 0.08


def model_of(path: str) -> str:
    """The model a trace file's sessions come from (its first line's `source`)."""
    with open(path, encoding="utf-8") as f:
        return json.loads(f.readline()).get("source", path)


class Replays:
    """Replays, each once: (aside_share or None for no memory, file, files first in memory)."""

    def __init__(self, traces: dict[str, list], models: dict[str, str]):
        self.traces, self.models, self.done = traces, models, {}

    def before(self, name: str, left_out: str | None) -> tuple[str, ...]:
        """The model's other sessions, but the held-out file: what memory holds first ("after")."""
        model = self.models[name]
        return tuple(f for f in self.traces if f not in (name, left_out) and self.models[f] == model)

    def figure(self, share: float | None, name: str, first: tuple[str, ...] = ()) -> tuple[float, float]:
        """(predicted speedup, tokens per step) of `name` replayed with memory holding `first`."""
        key = (share, name, first if share is not None else ())
        if key not in self.done:
            params = PARAMS if share is None else replace(PARAMS, aside_share=share)
            mem = None if share is None else NGramMemory("leave-one-out", params=params)
            for f in first if mem is not None else ():
                for tr in self.traces[f]:
                    mem.add(tr.output)
            cost = linear_cost(BETA)
            r = simulate_file(name, self.traces[name],
                              lambda: AdaptiveDrafter(cost=cost, memory=mem, params=params),
                              draft=64, beta=BETA, memory=mem)
            self.done[key] = (r.total.predicted_speedup, r.total.counts.tokens_per_step)
        return self.done[key]

    def both(self, share: float | None, name: str, left_out: str | None) -> list[tuple[float, float]]:
        """The figures alone and after (see the module docstring)."""
        return [self.figure(share, name), self.figure(share, name, self.before(name, left_out))]

    def score(self, share: float, files: list[str], left_out: str) -> float:
        return sum(math.log(s) for f in files for s, _ in self.both(share, f, left_out)) / (2 * len(files))


def show(fig: list[tuple[float, float]]) -> str:
    return ", ".join(f"{s:.3f}x ({t:.2f})" for s, t in fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="*")
    ap.add_argument("-t", "--tokenizer", default=str(SHARED / "tokenizers/llama2/tokenizer.model"))
    args = ap.parse_args()
    paths = args.files or sorted(glob.glob(str(SHARED / "traces/agent_*.jsonl")))
    enc = load_tokenizer(args.tokenizer)
    names = [Path(p).stem for p in paths]
    runs = Replays({n: read_traces(p, enc) for n, p in zip(names, paths)},
                   {n: model_of(p) for n, p in zip(names, paths)})
    print("| held-out file | chosen aside_share | chosen: alone, after | rule before (0): alone, after "
          "| no memory |")
    print("| --- | --- | --- | --- | --- |")
    for out in names:
        rest = [n for n in names if n != out]
        best = max(CANDIDATES, key=lambda c: (runs.score(c, rest, out), -CANDIDATES.index(c)))
        print(f"| {out} | {best:g} | {show(runs.both(best, out, None))} | {show(runs.both(0.0, out, None))} "
              f"| {show([runs.figure(None, out)])} |", flush=True)
    print("\nEvery candidate, alone and after (memory first holds the model's other sessions):\n")
    print("| aside_share | " + " | ".join(names) + " |")
    print("| --- |" + " --- |" * len(names))
    for c in CANDIDATES:
        print(f"| {c:g} | " + " | ".join(show(runs.both(c, n, None)) for n in names) + " |")


if __name__ == "__main__":
    main()
