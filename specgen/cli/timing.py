"""Timing contenders against each other on this noisy machine: every round runs every prompt
through every contender, in an order that alternates between rounds and prompts, so that drift
and bursts of load fall on all of them alike; ratios are taken within a round, then summarised
by their median and spread. Used by `specgen bench` and the scripts in benchmarks/.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Callable, Generic, Sequence, TypeVar

P = TypeVar("P")


@dataclass
class Timed:
    """One contender's run of one prompt: its output, the tokens its throughput counts, the
    seconds that took, and (specgen's) steps."""

    tokens: list[int]
    counted: int
    seconds: float
    steps: list = field(default_factory=list)


@dataclass
class Rounds(Generic[P]):
    """Per round and contender: tokens counted and seconds, summed over the prompts."""

    names: list[str]
    tokens: list[dict[str, int]] = field(default_factory=list)
    seconds: list[dict[str, float]] = field(default_factory=list)

    def tps(self, name: str) -> list[float]:
        """Tokens per second of a contender, per round."""
        return [t[name] / s[name] if s[name] else 0.0 for t, s in zip(self.tokens, self.seconds)]

    def ratios(self, name: str, base: str) -> list[float]:
        """A contender's throughput over another's, per round."""
        return [a / b if b else 0.0 for a, b in zip(self.tps(name), self.tps(base))]


def spread(values: Sequence[float]) -> tuple[float, float, float]:
    """(median, min, max)."""
    return statistics.median(values), min(values), max(values)


def alternate(contenders: dict[str, Callable[[P], Timed]], prompts: Sequence[P], rounds: int,
              seen: Callable[[int, int, dict[str, Timed]], None] = lambda r, i, runs: None) -> Rounds[P]:
    """Time every contender on every prompt, `rounds` times; `seen(round, prompt index, runs)`
    is called with each prompt's runs (to compare outputs, keep steps)."""
    names = list(contenders)
    result = Rounds(names)
    for r in range(rounds):
        tokens = dict.fromkeys(names, 0)
        seconds = dict.fromkeys(names, 0.0)
        for i, prompt in enumerate(prompts):
            order = names if (r + i) % 2 == 0 else names[::-1]
            runs = {name: contenders[name](prompt) for name in order}
            for name, run in runs.items():
                tokens[name] += run.counted
                seconds[name] += run.seconds
            seen(r, i, runs)
        result.tokens.append(tokens)
        result.seconds.append(seconds)
    return result
