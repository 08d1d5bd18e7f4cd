"""Replaying real model outputs through the drafter: how many target forward passes would greedy
speculation need, without running the model?

Each step drafts from the history exactly as `decode.generate` does (same drafter, same
`Schedule`), accepts the longest draft prefix that equals the recorded output, emits one more
recorded token (the model's own at the first mismatch), and feeds the emitted tokens back.
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable

from specgen import defaults
from specgen.draft.length import CostFn, linear_cost
from specgen.draft.schedule import Schedule
from specgen.draft.traces import Trace
from specgen.events import Drafter, Step, Verdict
from specgen.stats import Counts, ratio


@dataclass
class Tally:
    """Replay counts for a trace, a category or a file. `cost` is in single-token forward passes;
    `plain_cost` is what plain decoding as mlx-lm runs it (every step queued ahead) would cost."""

    traces: int = 0
    counts: Counts = field(default_factory=Counts)
    cost: float = 0.0
    plain_cost: float = 0.0
    drafter_s: float = 0.0

    def add(self, other: "Tally") -> None:
        self.traces += other.traces
        self.counts.add(other.counts)
        self.cost += other.cost
        self.plain_cost += other.plain_cost
        self.drafter_s += other.drafter_s

    @property
    def predicted_speedup(self) -> float:
        return ratio(self.plain_cost, self.cost)

    def to_dict(self) -> dict:
        c = self.counts
        return {
            "traces": self.traces,
            "output_tokens": c.tokens,
            "steps": c.steps,
            "tokens_per_step": round(c.tokens_per_step, 4),
            "drafted_per_step": round(c.drafted_per_step, 4),
            "acceptance_rate": round(c.acceptance_rate, 4),
            "predicted_speedup": round(self.predicted_speedup, 4),
            "us_per_token": round(ratio(self.drafter_s * 1e6, c.tokens), 3),
        }


@dataclass
class FileReport:
    file: str
    total: Tally = field(default_factory=Tally)
    categories: dict[str, Tally] = field(default_factory=dict)
    per_trace_us: list[float] = field(default_factory=list)
    replay_s: float = 0.0  # wall time of the replays (tokenizing excluded)

    def to_dict(self) -> dict:
        us = sorted(self.per_trace_us)
        return {"file": self.file, **self.total.to_dict(),
                "us_per_token_median": round(us[len(us) // 2], 3) if us else 0.0,
                "replay_tokens_per_s": round(ratio(self.total.counts.tokens, self.replay_s)),
                "categories": {c: t.to_dict() for c, t in sorted(self.categories.items())}}


def replay(prompt: list[int], output: list[int], drafter: Drafter, *, draft: int,
           beta: float = defaults.BETA, max_tokens: int | None = None,
           context_length: int | None = None, queue_after: int | None = None,
           overlap: float = 0.0, cost: CostFn | None = None, predicted: list[int] | None = None,
           steps: list[Step] | None = None) -> Tally:
    """Count the steps greedy speculation with `drafter` needs to emit `output` after `prompt`.

    `draft` is the most tokens a step drafts; `max_tokens` (default: the output's length) and
    `context_length` limit drafts as in `run`; tokens past the end of `output` never match, like
    the tokens after a stop token. `queue_after` as in `decode.generate` (with no prices): a
    pass queued behind a plain step drafts the drafter's continuation, and costs `overlap` less
    (the share of a plain step that queuing ahead saves; where it is not 0, it also weighs
    whether to queue behind a plain pass, as `decode.generate`'s prices do: schedule.py). A step
    that drafts k tokens costs `cost(k)`, by default 1 + `beta` * k. `predicted` (the model's
    top-1 after each token of prompt + output, from a trace's "topk") is recycled to the
    drafter as the decode loop does, along the output's path only (rejected drafts' rows were not
    recorded) and not for the prompt (whose logits the loop never computes). `steps`, if given,
    gets each step as the decode loop reports it (events.Step), to set beside the loop's own.
    """
    cost = cost or linear_cost(beta)
    path = [*prompt, *output] if predicted is not None else None  # what recycled rows follow
    t = Tally(traces=1, plain_cost=len(output) * (1 - overlap))
    clock = time.perf_counter
    t0 = clock()
    drafter.feed(prompt)
    spent = clock() - t0
    schedule = Schedule(cap=draft, end=len(prompt) + (len(output) if max_tokens is None else max_tokens),
                        context_length=context_length, queue_after=queue_after,
                        gap=overlap / (1.0 - overlap) if overlap else None)
    i = 0
    queued = None  # the drafts of a pass queued behind the last one, if it was kept
    while i < len(output):
        pos = len(prompt) + i
        t0 = clock()
        if queued is None:
            drafts = schedule.draft(drafter, pos)
        else:
            drafts = queued
        # As decode.generate with no prices: nothing is queued behind a draft.
        behind = schedule.behind(drafter, pos, drafts, queued is not None).drafts if not drafts else None
        spent += clock() - t0
        n = 0
        while n < len(drafts) and i + n < len(output) and drafts[n] == output[i + n]:
            n += 1
        emitted = output[i : i + n + 1]
        verdict = Verdict.of(len(drafts), n, len(emitted)) if drafts else None
        t0 = clock()
        if path is not None:
            drafter.recycle(path[pos - 1 : pos - 1 + len(emitted)], predicted[pos - 1 : pos - 1 + len(emitted)])
        drafter.feed(emitted, verdict)
        spent += clock() - t0
        t.counts.add_step(len(emitted), len(drafts), n)
        if steps is not None:
            steps.append(Step(tuple(emitted), len(drafts), n, queued=queued is not None))
        t.cost += cost(len(drafts)) - (overlap if queued is not None else 0.0)
        queued = behind if n == len(drafts) else None
        i += len(emitted)
    t.drafter_s = spent
    return t


def simulate_file(path: str, traces: Iterable[Trace], make_drafter: Callable[[], Drafter], *,
                  draft: int, beta: float = defaults.BETA, memory=None,
                  queue_after: int | None = None, overlap: float = 0.0,
                  cost: CostFn | None = None, progress: Callable[[], None] = lambda: None) -> FileReport:
    """Replay every trace of a file with a fresh drafter each (see make_drafter) and tally them.

    With a `memory`, each trace's output is added to it after its replay, in file order.
    `progress()` is called after each trace.
    """
    report = FileReport(file=path)
    start = time.perf_counter()
    # What lives through the replays (modules, traces, the memory's tables) is frozen out of the
    # collector's full passes, which would otherwise walk it again and again, timed as the drafter's.
    gc.freeze()
    try:
        for tr in traces:
            t = replay(tr.prompt, tr.output, make_drafter(), draft=draft, beta=beta,
                       queue_after=queue_after, overlap=overlap, cost=cost, predicted=tr.predicted)
            if memory is not None:
                memory.add(tr.output)
                gc.freeze()
            report.total.add(t)
            report.categories.setdefault(tr.category, Tally()).add(t)
            if t.counts.tokens:
                report.per_trace_us.append(t.drafter_s / t.counts.tokens * 1e6)
            progress()
    finally:
        gc.unfreeze()
    report.replay_s = time.perf_counter() - start
    return report
