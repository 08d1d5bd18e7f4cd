"""`specgen bench`: specgen against mlx-lm's own greedy decoding, in one process, same prompts.

For each prompt set: a warm-up, then `repeats` rounds (timing.alternate) that time the decoding
of every prompt by both, alternating which goes first; a round's speedup is specgen's decode
tokens per second over mlx-lm's for the whole set. Decode throughput leaves out the prompt's
prefill, which is the same work for both (as mlx-lm's own "generation tok/s" does): for mlx-lm,
the tokens after its first over the time after its first; for specgen, all its tokens over the
time after prefill (its first step included). Beside the measured speedup, the one `simulate`'s
replay predicts for the same outputs under the same cost curve: the gap is the loop's own loss.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import mlx.core as mx
from mlx_lm.generate import generate_step

from specgen.api.prompts_file.items import Prompt, conversation, prompt_rows
from specgen.cli.timing import Timed, alternate, spread
from specgen.draft.simulate import Tally, replay
from specgen.engine.decode.loop import generate
from specgen.engine.decode.sampling import GREEDY, Selector
from specgen.errors import InputError
from specgen.events import Step
from specgen.stats import Counts

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


def builtin_sets(chat: bool) -> dict[str, list[Prompt]]:
    """The built-in prompt sets that fit a base (continuation) or a chat model."""
    return CHAT_SETS if chat else BASE_SETS


def read_prompt_file(path: str) -> dict[str, list[Prompt]]:
    """Prompts from a file, a line each: plain text, or (a line that starts with '{') a JSON object,
    prompts_file.items.conversation's row with an optional "set"; InputError at a bad line."""
    sets: dict[str, list[Prompt]] = {}
    for n, row, reason in prompt_rows(path):
        try:
            if reason:
                raise InputError(reason)
            prompt = conversation(row)
        except InputError as e:
            raise InputError(f"{path}:{n}: {e}") from e
        sets.setdefault(str(row.get("set", "custom")), []).append(prompt)
    if not sets:
        raise InputError(f"{path} holds no prompts")
    return sets


@dataclass
class SetResult:
    set: str
    prompts: int
    baseline_tps: list[float] = field(default_factory=list)  # per round
    specgen_tps: list[float] = field(default_factory=list)
    ratios: list[float] = field(default_factory=list)
    counts: Counts = field(default_factory=Counts)  # specgen's steps in the last round
    predicted: Tally = field(default_factory=Tally)  # the replay of the same outputs
    divergences: list[dict] = field(default_factory=list)  # prompts whose outputs differ

    def to_dict(self) -> dict:
        med, low, high = spread(self.ratios)
        return {
            "set": self.set,
            "prompts": self.prompts,
            "baseline_tps": round(spread(self.baseline_tps)[0], 2),
            "specgen_tps": round(spread(self.specgen_tps)[0], 2),
            "speedup_median": round(med, 4),
            "speedup_min": round(low, 4),
            "speedup_max": round(high, 4),
            "predicted_speedup": round(self.predicted.predicted_speedup, 4),
            "tokens_per_step": round(self.counts.tokens_per_step, 4),
            "acceptance_rate": round(self.counts.acceptance_rate, 4),
            "identical": not self.divergences,
            "divergences": self.divergences,
        }


def mlx_lm_tokens(model, prompt: list[int], max_tokens: int, stop: frozenset,
                  context_length: int | None = None, sampler=None) -> Timed:
    """Plain decoding through mlx-lm (greedy, or with an mlx-lm `sampler`), stopping where specgen
    stops (a stop token, max_tokens, or the model's context, which mlx-lm itself would run past);
    timed after its first token."""
    if context_length is not None:
        max_tokens = min(max_tokens, context_length - len(prompt))
    out, start = [], None
    for tok, _ in generate_step(mx.array(prompt), model, max_tokens=max_tokens, sampler=sampler):
        if start is None:
            start = time.perf_counter()
        if tok in stop:
            break
        out.append(tok)
    return Timed(out, max(len(out) - 1, 0), time.perf_counter() - start)


def specgen_tokens(model, prompt: list[int], max_tokens: int, stop: frozenset, make: Callable,
                   draft: int, context_length: int | None = None, queue_after: int | None = None,
                   off: str | None = None, selector: Selector = GREEDY, prices=None) -> Timed:
    """specgen's loop with a fresh drafter from `make()`, timed after prefill."""
    steps, start = [], None
    for e in generate(model, prompt, drafter=make(), draft=draft, max_tokens=max_tokens,
                      stop_tokens=stop, context_length=context_length, queue_after=queue_after, off=off,
                      selector=selector, prices=prices):
        if isinstance(e, Step):
            steps.append(e)
        else:
            start = time.perf_counter()
    tokens = [t for s in steps for t in s.tokens]
    return Timed(tokens, len(tokens), time.perf_counter() - start, steps)


def run_set(name: str, model, prompts: list[list[int]], *, max_tokens: int, repeats: int, stop,
            make: Callable, draft: int, context_length=None, queue_after=None, off: str | None = None,
            prices=None,
            predict: Callable[[list[int], list[int]], Tally] | None = None,
            progress: Callable[[], None] = lambda: None) -> SetResult:
    """Benchmark one prompt set (token ids) against mlx-lm; see the module docstring.
    `predict(prompt, output)` replays an output (see `replayer`); `progress()` is called after
    each prompt of each round."""
    res = SetResult(name, len(prompts))
    base = lambda p: mlx_lm_tokens(model, p, max_tokens, stop, context_length)
    spec = lambda p: specgen_tokens(model, p, max_tokens, stop, make, draft, context_length, queue_after, off,
                                    prices=prices)
    base(prompts[0][:]), spec(prompts[0])  # warm-up

    def seen(r: int, i: int, runs: dict[str, Timed]) -> None:
        a, b = runs["mlx-lm"].tokens, runs["specgen"].tokens
        if a != b and not any(d["prompt"] == i for d in res.divergences):
            at = next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            res.divergences.append({"prompt": i, "at_token": at})
        if r == repeats - 1:
            for s in runs["specgen"].steps:
                res.counts.add_step(len(s.tokens), s.drafted, s.accepted)
            if predict is not None:
                res.predicted.add(predict(prompts[i], b))
        progress()

    rounds = alternate({"mlx-lm": base, "specgen": spec}, prompts, repeats, seen)
    res.baseline_tps, res.specgen_tps = rounds.tps("mlx-lm"), rounds.tps("specgen")
    res.ratios = rounds.ratios("specgen", "mlx-lm")
    return res


def replayer(make: Callable, draft: int, max_tokens: int, cost, queue_after: int | None,
             overlap: float) -> Callable[[list[int], list[int]], Tally]:
    """predict(prompt, output): the replay of an output with a fresh drafter, each step charged
    `cost` (the measured curve), as `run_set` reports it beside the measured speedup."""
    return lambda prompt, output: replay(prompt, output, make(), draft=draft, max_tokens=max_tokens,
                                         queue_after=queue_after, overlap=overlap, cost=cost)
