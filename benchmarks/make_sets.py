"""Build the real-workload prompt sets in benchmarks/prompts/ from the shared replay traces.

    python benchmarks/make_sets.py [../shared/traces]

Writes chat.jsonl, code_edit.jsonl and code_fix.jsonl (24 prompts each, `{"set", "id", "prompt"}`);
grounded.jsonl is written by hand and left alone. The choices, so a rebuild gives the same files:
- chat: the user instructions of AlpacaEval (from chat_llama2_7b.jsonl), skipping the first 24,
  which smollm2_chat_topk.jsonl answers (the model's own earlier answers, for `--memory`).
- code_edit: the CanItEdit "descriptive" requests, whole, the 24 shortest (prefill on the 4-bit
  model costs ~60 ms a token here, so long prompts would make the steep-cost run take hours).
- code_fix: the DebugBench user request (instruction and buggy code), the first two under 900
  characters from each single-bug category, in the order of the file.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

N = 24
OUT = Path(__file__).parent / "prompts"
USER = re.compile(r"USER: (.*) ASSISTANT:$", re.S)


def rows(traces: Path, name: str) -> list[dict]:
    return [json.loads(line) for line in (traces / name).read_text().splitlines() if line.strip()]


def user_part(prompt: str) -> str:
    m = USER.search(prompt)
    if not m:
        raise SystemExit(f"no USER/ASSISTANT turn in {prompt[:60]!r}")
    return m.group(1).strip()


def chat(traces: Path) -> list[dict]:
    picked = rows(traces, "chat_llama2_7b.jsonl")[N:2 * N]
    return [{"set": "chat", "id": "alpaca-" + r["id"].rsplit("-", 1)[-1], "prompt": user_part(r["prompt"])} for r in picked]


def code_edit(traces: Path) -> list[dict]:
    descriptive = [r for r in rows(traces, "code_edit_qwen25coder_7b.jsonl") if r["id"].endswith("descriptive")]
    shortest = sorted(descriptive, key=lambda r: (len(r["prompt"]), r["id"]))[:N]
    return [{"set": "code_edit", "id": r["id"].split("instruct-", 1)[-1], "prompt": r["prompt"]} for r in shortest]


def code_fix(traces: Path) -> list[dict]:
    taken: dict[str, int] = {}
    out = []
    for r in rows(traces, "code_fix_python.jsonl"):
        kind = r["id"].split("_", 1)[1].split("#")[0]
        if kind in ("double", "triple", "quadruple") or taken.get(kind, 0) >= 2 or len(r["prompt"]) > 900:
            continue
        taken[kind] = taken.get(kind, 0) + 1
        out.append({"set": "code_fix", "id": r["id"].split("_", 1)[1], "prompt": user_part(r["prompt"])})
    return out[:N]


def main() -> None:
    traces = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).parents[2] / "shared" / "traces")
    OUT.mkdir(exist_ok=True)
    for make in (chat, code_edit, code_fix):
        picked = make(traces)
        assert len(picked) == N, (make.__name__, len(picked))
        (OUT / f"{make.__name__}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in picked))
        print(f"{make.__name__}.jsonl: {len(picked)} prompts")


if __name__ == "__main__":
    main()
