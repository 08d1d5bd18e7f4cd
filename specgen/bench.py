"""`specgen bench`: specgen against mlx-lm's own greedy decoding, in one process, same prompts.

For each prompt set: a warm-up, then `repeats` rounds that alternate which of the two goes first.
Each round times the decoding of every prompt for both; the round's speedup is specgen's decode
tokens per second over mlx-lm's for the whole set. Decode throughput leaves out the prompt's
prefill, which is the same work for both (as mlx-lm's own "generation tok/s" does): for mlx-lm,
the tokens after its first over the time after its first; for specgen, all its tokens over the
time after prefill (its first step included).
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

import mlx.core as mx
from mlx_lm.generate import generate_step

from .decode import Step, generate
from .errors import InputError
from .stats import ratio

_STORY = "Lily had a red ball. She liked to throw the ball to her dog, Max. Max ran fast and " \
         "brought the ball back to her. Lily laughed and said, \"Good dog, Max!\""
_CODE = '''def moving_average(values, window):
    if window <= 0:
        raise ValueError("window must be positive")
    averages = []
    total = 0
    for i, value in enumerate(values):
        total += value
        if i >= window:
            total -= values[i - window]
        if i >= window - 1:
            averages.append(total / window)
    return averages'''

# Sets for base models (no chat template), such as the bundled demo: continuation-style prompts.
BASE_SETS = {
    "story": ["Once upon a time", "Tom and Lily were playing in the garden when",
              "The little dog was sad because", "One day, a girl named Sue found a big red box."],
    "copy": [f"{_STORY}\n\n{_STORY[:40]}", f"{_STORY} {_STORY}\n\nLily had"],
    "novel": ["The robot counted seventeen purple stars above the quiet lake",
              "Grandpa's old clock made a strange sound at midnight",
              "A tiny dragon wanted to learn how to bake bread"],
}
# Sets for chat models: requests a user would send.
CHAT_SETS = {
    "story": ["Write a short story about a lighthouse keeper who finds a message in a bottle."],
    "copy": [f"Add type hints and a docstring to this Python function. Reply with the whole "
             f"function only.\n```python\n{_CODE}\n```",
             f"Rename the variable `total` to `running_sum` in this code and return all of it.\n"
             f"```python\n{_CODE}\n```"],
    "novel": ["Write a haiku about autumn rain.", "Explain in three sentences why the sky is blue.",
              "List five creative names for a coffee shop, one per line."],
}


def builtin_sets(chat: bool) -> dict[str, list[str]]:
    """The built-in prompt sets that fit a base (continuation) or a chat model."""
    return CHAT_SETS if chat else BASE_SETS


def read_prompt_file(path: str) -> dict[str, list[str]]:
    """Prompts from a file: one per line, or JSONL objects {"prompt": ..., "set": optional}."""
    p = Path(path)
    if not p.is_file():
        raise InputError(f"no such prompts file: {path}")
    sets: dict[str, list[str]] = {}
    for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        if line.lstrip().startswith("{"):
            try:
                row = json.loads(line)
                prompt, name = row["prompt"], str(row.get("set", "custom"))
            except (json.JSONDecodeError, KeyError, TypeError) as e:
                raise InputError(f"{path}:{n}: expected {{\"prompt\": ...}} ({e})") from e
        else:
            prompt, name = line, "custom"
        sets.setdefault(name, []).append(prompt)
    if not sets:
        raise InputError(f"{path} holds no prompts")
    return sets


@dataclass
class SetResult:
    set: str
    prompts: int
    baseline_tps: list[float] = field(default_factory=list)  # per round
    specgen_tps: list[float] = field(default_factory=list)
    tokens: int = 0
    steps: int = 0
    drafted: int = 0
    accepted: int = 0
    divergences: list[dict] = field(default_factory=list)  # prompts whose outputs differ

    def to_dict(self) -> dict:
        ratios = [s / b for s, b in zip(self.specgen_tps, self.baseline_tps)]
        return {
            "set": self.set,
            "prompts": self.prompts,
            "baseline_tps": round(statistics.median(self.baseline_tps), 2),
            "specgen_tps": round(statistics.median(self.specgen_tps), 2),
            "speedup_median": round(statistics.median(ratios), 4),
            "speedup_min": round(min(ratios), 4),
            "speedup_max": round(max(ratios), 4),
            "tokens_per_step": round(ratio(self.tokens, self.steps), 4),
            "acceptance_rate": round(ratio(self.accepted, self.drafted), 4),
            "identical": not self.divergences,
            "divergences": self.divergences,
        }


def mlx_lm_tokens(model, prompt: list[int], max_tokens: int, stop: frozenset
                  ) -> tuple[list[int], int, float]:
    """Plain greedy decoding through mlx-lm, stopping where specgen stops.

    Returns (tokens, tokens timed, seconds timed): everything after the first token.
    """
    out, start = [], None
    for tok, _ in generate_step(mx.array(prompt), model, max_tokens=max_tokens):
        if start is None:
            start = time.perf_counter()
        if tok in stop:
            break
        out.append(tok)
    return out, max(len(out) - 1, 0), time.perf_counter() - start


def specgen_tokens(model, prompt, max_tokens, stop, make, context_length, pipeline_after=None
                   ) -> tuple[list[int], list[Step], float]:
    """specgen's loop with a fresh drafter from `make()` -> (drafter, most drafts per step).

    Returns (tokens, steps, seconds after prefill).
    """
    drafter, cap = make()
    steps, start = [], None
    for e in generate(model, prompt, predictor=drafter, draft=cap, max_tokens=max_tokens,
                      stop_tokens=stop, context_length=context_length, pipeline_after=pipeline_after):
        if isinstance(e, Step):
            steps.append(e)
        else:
            start = time.perf_counter()
    return [t for s in steps for t in s.tokens], steps, time.perf_counter() - start


def run_set(name: str, model, prompts: list[list[int]], *, max_tokens: int, repeats: int, stop,
            make, context_length=None, pipeline_after=None) -> SetResult:
    """Benchmark one prompt set (token ids) against mlx-lm; see the module docstring."""
    res = SetResult(name, len(prompts))
    mlx_lm_tokens(model, prompts[0], min(max_tokens, 16), stop)  # warm-up
    specgen_tokens(model, prompts[0], min(max_tokens, 16), stop, make, context_length, pipeline_after)
    for r in range(repeats):
        totals = {"base": [0, 0.0], "spec": [0, 0.0]}
        for i, prompt in enumerate(prompts):
            order = ("base", "spec") if (r + i) % 2 == 0 else ("spec", "base")
            outputs = {}
            for who in order:
                if who == "base":
                    outputs[who], n, secs = mlx_lm_tokens(model, prompt, max_tokens, stop)
                else:
                    outputs[who], steps, secs = specgen_tokens(model, prompt, max_tokens, stop, make,
                                                               context_length, pipeline_after)
                    n = len(outputs[who])
                totals[who][0] += n
                totals[who][1] += secs
            if r == repeats - 1:
                res.tokens += len(outputs["spec"])
                res.steps += len(steps)
                res.drafted += sum(s.drafted for s in steps)
                res.accepted += sum(s.accepted for s in steps)
            if outputs["base"] != outputs["spec"] and not any(d["prompt"] == i for d in res.divergences):
                a, b = outputs["base"], outputs["spec"]
                at = next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
                res.divergences.append({"prompt": i, "at_token": at})
        res.baseline_tps.append(totals["base"][0] / totals["base"][1])
        res.specgen_tps.append(totals["spec"][0] / totals["spec"][1])
    return res
