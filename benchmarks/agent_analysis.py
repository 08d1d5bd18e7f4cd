"""Where the drafter loses tokens on coding-agent sessions, and what an oracle copier could get.

    python benchmarks/agent_analysis.py [--memory] [--beta B] [--steps] [FILE.jsonl ...]
        (default: ../shared/traces/agent_*.jsonl, Llama-2 tokenizer)

Replays each file as `specgen simulate` does (same `simulate_file`, same drafter; a recorder
around it notes each step's draft and its evidence) and classes every output token by where it
stands in the turn:

- text: free text before the tool call;
- scaffold: the tool call's JSON outside its string values (`{"name": "`, keys, `"}}`), and the
  tool's name;
- the value of an argument, by key: `command`, `description`, `content` (a file written),
  `todos` (TodoWrite's list), other keys as `arg`.

Per class: tokens, steps that ended there (the token a step emitted itself, which no draft
gave), and of those, how many an oracle copier would have had: the longest run of the output
from there on that occurs anywhere in the history (prompt and output so far), and where that
occurrence lies (the newest tool result, an older tool result, an earlier assistant turn, the
system prompt or user text, this turn's own output). The oracle replay then drafts, at every
step, exactly that run: the ceiling of any drafter that only copies (it knows where to copy
from and how far). `--steps` prints every step of every trace.
"""

from __future__ import annotations

import argparse
import glob
import json
import re
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np

from specgen.draft.drafter import make_drafter
from specgen.draft.length import linear_cost
from specgen.draft.memory import NGramMemory
from specgen.draft.simulate import simulate_file
from specgen.draft.traces import Trace

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
ROLE = re.compile(r"<\|(system|user|assistant|tool)\|>\n")


class Recorder:
    """Wraps a drafter; notes each step's draft (tokens, evidence kinds) and how it fared."""

    def __init__(self, inner):
        self.inner, self.steps, self._draft = inner, [], None

    def draft(self, room):
        d = self.inner.draft(room)
        last = getattr(self.inner, "last", None)
        kinds = [e.kind for e in last.evidence] if d and last is not None else []
        self._draft = (list(d), kinds)
        return d

    def saves(self, room):
        self._draft = ([], [])
        return self.inner.saves(room)

    def recycle(self, inputs, predicted):
        self.inner.recycle(inputs, predicted)

    def feed(self, tokens, verdict=None):
        if self._draft is not None:
            self.steps.append((*self._draft, len(tokens), verdict.accepted if verdict else 0))
        self.inner.feed(tokens, verdict)


def pieces(sp, text):
    """Token ids and each token's (begin, end) character span."""
    proto = sp.encode(text, return_type="proto")
    char_at = [i for i, ch in enumerate(text) for _ in ch.encode("utf-8")] + [len(text)]  # byte -> char
    return [p.id for p in proto.pieces], [(char_at[p.begin], char_at[p.end]) for p in proto.pieces]


def char_classes(text: str) -> list[str]:
    """The class of every character of an assistant turn (see the module docstring)."""
    cls = ["text"] * len(text)
    for m in re.finditer(r'^\{"name": .*$', text, re.M):
        try:
            json.loads(m.group())
        except ValueError:
            continue
        at, line = m.start(), m.group()
        stack, key, j = [], None, 0  # the keys that opened the containers we are in
        while j < len(line):
            c = line[j]
            cls[at + j] = "scaffold"
            if c == '"':
                k = j + 1
                while line[k] != '"':
                    k += 2 if line[k] == "\\" else 1
                for q in range(j, k + 1):
                    cls[at + q] = "scaffold"
                if line[k + 1:].lstrip().startswith(":"):
                    key = line[j + 1:k]
                else:
                    inner = stack[stack.index("arguments") + 1:] if "arguments" in stack else []
                    arg = inner[0] if inner else key
                    v = ("scaffold" if "arguments" not in stack else
                         arg if arg in ("command", "description", "content", "todos") else "arg")
                    for q in range(j + 1, k):
                        cls[at + q] = v
                j = k
            elif c in "[{":
                stack.append(key if key is not None else (stack[-1] if stack else None))
                key = None
            elif c in "]}":
                stack.pop()
            elif c == ",":
                key = None
            j += 1
    return cls


def token_classes(spans, cls):
    out = []
    for b, e in spans:
        seg = [c for c in cls[b:e] if c != "scaffold"] or cls[b:e] or ["text"]
        out.append(Counter(seg).most_common(1)[0][0])
    return out


def prompt_regions(sp, prompt_text, prompt_ids_len):
    """Per prompt token: 'tool*' (the newest tool result), 'tool', 'assistant', 'system/user'."""
    ids, spans = pieces(sp, prompt_text)
    assert len(ids) == prompt_ids_len
    marks = [(m.start(), m.group(1)) for m in ROLE.finditer(prompt_text)]
    last_tool = max((s for s, r in marks if r == "tool"), default=-1)
    starts = np.array([s for s, _ in marks])
    roles = [r for _, r in marks]
    out = []
    for b, _ in spans:
        k = int(np.searchsorted(starts, b, side="right")) - 1
        r = roles[k] if k >= 0 else "system"
        if r == "tool":
            r = "tool*" if starts[k] == last_tool else "tool"
        elif r in ("system", "user"):
            r = "system/user"
        out.append(r)
    return out


def longest_run(hist: np.ndarray, out: list[int], i: int, cap: int = 512):
    """(length, start) of the longest run of out[i:] found in hist (latest start on ties)."""
    cand = np.nonzero(hist[: len(hist) - 1] == out[i])[0] if i < len(out) else np.array([], int)
    best, where, k = 0, -1, 0
    while len(cand) and i + k < len(out) and k < cap:
        best, where = k + 1, int(cand[-1])
        k += 1
        if i + k >= len(out):
            break
        cand = cand[cand + k < len(hist)]
        cand = cand[hist[cand + k] == out[i + k]]
    return best, where


def analyse(path, sp, memory, beta, show):
    rows = [json.loads(line) for line in open(path)]
    traces = []
    for n, r in enumerate(rows):
        p, _ = pieces(sp, r["prompt"])
        o, spans = pieces(sp, r["output"])
        traces.append((Trace(str(n), "agent", p, o), spans, r))
    recs = []

    def factory():
        recs.append(Recorder(make_drafter(None, cost=linear_cost(beta), memory=mem)))
        return recs[-1]

    mem = NGramMemory("simulate") if memory else None
    rep = simulate_file(path, [t for t, _, _ in traces], factory, draft=64, beta=beta, memory=mem)
    by = defaultdict(Counter)  # class -> counters
    oracle_steps, oracle_cost, tokens = 0, 0.0, 0
    for (tr, spans, row), rec in zip(traces, recs):
        cls = token_classes(spans, char_classes(row["output"]))
        regions = prompt_regions(sp, row["prompt"], len(tr.prompt))
        hist = np.array(tr.prompt + tr.output, dtype=np.int64)
        i = 0
        for drafted, kinds, emitted, accepted in rec.steps:
            for j in range(i, i + accepted):
                by[cls[j]]["accepted"] += 1
            b = i + accepted  # the token this step emitted itself
            if b < len(tr.output):
                c = cls[b]
                by[c]["steps"] += 1
                run, at = longest_run(hist[: len(tr.prompt) + b], tr.output, b)
                where = "-" if at < 0 else regions[at] if at < len(tr.prompt) else "own"
                if run >= 4:
                    by[c]["oracle>=4"] += 1
                    by[c]["from " + where] += 1
                by[c]["oracle run"] += max(run, 0)
                why = ("no draft" if not drafted else "draft short" if accepted == len(drafted)
                       else "wrong:" + kinds[accepted])
                by[c][why] += 1
                if show:
                    tok = sp.id_to_piece(tr.output[b])
                    print(f"  t{tr.id} @{b} {c:11} {tok!r:14} drafted {len(drafted):2} kept {accepted:2}"
                          f" {why:16} oracle {run:3} {where}")
            i += emitted
        # The oracle copier: every step drafts exactly the longest run found in the history.
        i = 0
        while i < len(tr.output):
            run, _ = longest_run(hist[: len(tr.prompt) + i], tr.output, i)
            run = min(run, len(tr.output) - i - 1) if i + run >= len(tr.output) else run
            oracle_steps += 1
            oracle_cost += 1 + beta * run
            i += run + 1
        tokens += len(tr.output)
    for c in by:
        by[c]["tokens"] = by[c]["accepted"] + by[c]["steps"]
    c = rep.total.counts
    return {"file": Path(path).name, "tokens": c.tokens, "steps": c.steps,
            "speedup": round(rep.total.predicted_speedup, 4),
            "oracle_tok_per_step": round(tokens / oracle_steps, 3),
            "oracle_speedup": round(tokens / oracle_cost, 4), "classes": by}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("files", nargs="*")
    ap.add_argument("--memory", action="store_true")
    ap.add_argument("--beta", type=float, default=0.08)
    ap.add_argument("--steps", action="store_true")
    a = ap.parse_args()
    import sentencepiece

    sp = sentencepiece.SentencePieceProcessor(model_file=str(SHARED / "tokenizers/llama2/tokenizer.model"))
    files = a.files or sorted(glob.glob(str(SHARED / "traces/agent_*.jsonl")))
    cols = ["tokens", "accepted", "steps", "no draft", "draft short", "oracle>=4", "oracle run"]
    for f in files:
        r = analyse(f, sp, a.memory, a.beta, a.steps)
        print(f"{r['file']}: {r['tokens']} tokens, {r['steps']} steps "
              f"({r['tokens'] / r['steps']:.2f} tok/step, {r['speedup']:.3f}x); oracle copier "
              f"{r['oracle_tok_per_step']} tok/step, {r['oracle_speedup']:.3f}x")
        print("  " + "class".ljust(12) + "".join(x.rjust(12) for x in cols) + "   other")
        for c, n in sorted(r["classes"].items(), key=lambda kv: -kv[1]["tokens"]):
            rest = {k: v for k, v in n.items() if k not in cols}
            print("  " + c.ljust(12) + "".join(str(n[x]).rjust(12) for x in cols) + "   " +
                  ", ".join(f"{k} {v}" for k, v in sorted(rest.items())))


if __name__ == "__main__":
    main()
