"""Replaying real model outputs through the drafter: how many target forward passes would greedy
speculation need, without running the model?

Each step drafts from the history exactly as `decode.generate` does, accepts the longest draft
prefix that equals the recorded output, emits one more recorded token (the model's own at the
first mismatch), and feeds the emitted tokens back to the drafter.
"""

from __future__ import annotations

import gc
import json
import time
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Callable, Iterable

from . import defaults
from .decode import draft_room
from .drafter import linear_cost
from .errors import InputError
from .stats import ratio


@dataclass
class Tally:
    """Replay counts for a trace, a category or a file. `cost` is in single-token forward passes;
    `plain_cost` is what plain decoding as mlx-lm runs it (every step queued ahead) would cost."""

    traces: int = 0
    output_tokens: int = 0
    steps: int = 0
    drafted: int = 0
    accepted: int = 0
    cost: float = 0.0
    plain_cost: float = 0.0
    drafter_s: float = 0.0

    def add(self, other: "Tally") -> None:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    def to_dict(self) -> dict:
        n = self.output_tokens
        return {
            "traces": self.traces,
            "output_tokens": n,
            "steps": self.steps,
            "tokens_per_step": round(ratio(n, self.steps), 4),
            "drafted_per_step": round(ratio(self.drafted, self.steps), 4),
            "acceptance_rate": round(ratio(self.accepted, self.drafted), 4),
            "predicted_speedup": round(ratio(self.plain_cost, self.cost), 4),
            "us_per_token": round(ratio(self.drafter_s * 1e6, n), 3),
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
                "replay_tokens_per_s": round(ratio(self.total.output_tokens, self.replay_s)),
                "categories": {c: t.to_dict() for c, t in sorted(self.categories.items())}}


def replay(prompt: list[int], output: list[int], drafter, *, draft: int, beta: float = defaults.BETA,
           max_tokens: int | None = None, context_length: int | None = None,
           pipeline_after: int | None = None, overlap: float = 0.0,
           cost: Callable[[int], float] | None = None) -> Tally:
    """Count the steps greedy speculation with `drafter` needs to emit `output` after `prompt`.

    `max_tokens` (default: the output's length) and `context_length` limit drafts as in `run`;
    tokens past the end of `output` never match, like the tokens after a stop token.
    `pipeline_after` as in `decode.generate`: a step queued ahead drafts nothing, and costs
    1 - `overlap` (the share of a plain step that queuing it ahead saves; see calibrate).
    A step that drafts k tokens costs `cost(k)`, by default 1 + `beta` * k.
    """
    cost = cost or linear_cost(beta)
    t = Tally(traces=1, output_tokens=len(output), plain_cost=len(output) * (1 - overlap))
    clock = time.perf_counter
    t0 = clock()
    drafter.update_batch(prompt)
    spent = clock() - t0
    end = len(prompt) + (len(output) if max_tokens is None else max_tokens)
    i = 0
    silent = 0  # steps in a row for which the drafter had nothing
    ahead = False  # this step was queued ahead (see decode.generate): it drafts nothing
    while i < len(output):
        room = draft_room(draft, len(prompt) + i, end, context_length)
        t0 = clock()
        drafts = drafter.predict(room)
        spent += clock() - t0
        silent = 0 if drafts else silent + 1
        if ahead:
            drafts = []
        n = 0
        while n < len(drafts) and i + n < len(output) and drafts[n] == output[i + n]:
            n += 1
        emitted = output[i : i + n + 1]
        t0 = clock()
        drafter.update_batch(emitted)
        spent += clock() - t0
        t.steps += 1
        t.drafted += len(drafts)
        t.accepted += n
        t.cost += 1 - overlap if ahead else cost(len(drafts))
        ahead = not drafts and pipeline_after is not None and silent >= pipeline_after
        i += len(emitted)
    t.drafter_s = spent
    return t


# --- traces and tokenizers -------------------------------------------------------------------

@dataclass
class Trace:
    id: str
    category: str
    prompt: list[int]
    output: list[int]


def load_tokenizer(spec: str) -> Callable[[str], list[int]]:
    """An encoder (text -> ids, no special tokens) from a sentencepiece .model, a tokenizer.json, or
    a model folder or alias holding one of them."""
    path = Path(spec).expanduser()
    if not path.exists():
        from . import registry

        try:
            model = registry.resolve(spec, registry.load_registry())
        except Exception as e:
            raise InputError(f"no tokenizer at {spec}: not a file, folder or known alias") from e
        source = registry.local_source(model.source)
        path = Path(source)
        if not path.exists():
            raise InputError(f"simulate needs a local tokenizer; '{spec}' is not downloaded ({source})")
    if path.is_dir():
        for name in ("tokenizer.model", "tokenizer.json"):
            if (path / name).is_file():
                path = path / name
                break
        else:
            raise InputError(f"{spec} holds no tokenizer.model or tokenizer.json")
    try:
        if path.suffix == ".model":
            import sentencepiece

            sp = sentencepiece.SentencePieceProcessor(model_file=str(path))
            return lambda text: sp.encode(text)
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(path))
        return lambda text: tok.encode(text, add_special_tokens=False).ids
    except Exception as e:
        raise InputError(f"cannot load tokenizer {path}: {e}") from e


def read_traces(path: str, encode: Callable[[str], list[int]] | None) -> list[Trace]:
    """Trace lines: {"prompt", "output"} text (optional "id", "category"), or {"prompt_ids", "output_ids"}."""
    p = Path(path)
    if not p.is_file():
        raise InputError(f"no such trace file: {path}")
    traces = []
    for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise InputError(f"{path}:{n}: not JSON ({e.msg})") from e
        if "output_ids" in row:
            prompt, output = row.get("prompt_ids", []), row["output_ids"]
        elif "output" in row:
            if encode is None:
                raise InputError(f"{path}:{n}: text traces need --tokenizer")
            prompt, output = encode(row.get("prompt", "")), encode(row["output"])
        else:
            raise InputError(f"{path}:{n}: needs \"output\" (text) or \"output_ids\"")
        traces.append(Trace(str(row.get("id", n)), str(row.get("category", "all")), list(prompt), list(output)))
    return traces


def simulate_file(path: str, traces: Iterable[Trace], make_drafter: Callable[[], object], *,
                  draft: int, beta: float = defaults.BETA, memory=None,
                  pipeline_after: int | None = None, overlap: float = 0.0) -> FileReport:
    """Replay every trace of a file with a fresh drafter each (see make_drafter) and tally them.

    With a `memory`, each trace's output is added to it after its replay, in file order.
    """
    report = FileReport(file=path)
    start = time.perf_counter()
    # What lives through the replays (modules, traces, the memory's tables) is frozen out of the
    # collector's full passes, which would otherwise walk it again and again, timed as the drafter's.
    gc.freeze()
    try:
        for tr in traces:
            t = replay(tr.prompt, tr.output, make_drafter(), draft=draft, beta=beta,
                       pipeline_after=pipeline_after, overlap=overlap)
            if memory is not None:
                memory.add(tr.output)
                gc.freeze()
            report.total.add(t)
            report.categories.setdefault(tr.category, Tally()).add(t)
            if t.output_tokens:
                report.per_trace_us.append(t.drafter_s / t.output_tokens * 1e6)
    finally:
        gc.unfreeze()
    report.replay_s = time.perf_counter() - start
    return report
