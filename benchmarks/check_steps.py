"""Every shared trace's simulate step counts (steps, drafted, accepted), with the fixed drafter,
the adaptive one and with memory, against tests/data/simulate_steps.json (recorded before the
drafter was split into modules): the test suite checks the first 60 traces of each file, this
script all of them (about a minute).

    python benchmarks/check_steps.py [N]     # only the first N traces of each file
"""
import json
import sys
import time
from pathlib import Path

from specgen.draft.drafter import make_drafter
from specgen.draft.length import linear_cost
from specgen.draft.memory import NGramMemory
from specgen.draft.simulate import replay
from specgen.draft.traces import load_tokenizer, read_traces

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
base = json.loads((ROOT / "tests/data/simulate_steps.json").read_text())
enc = load_tokenizer(str(SHARED / "tokenizers/llama2/tokenizer.model"))
limit = int(sys.argv[1]) if len(sys.argv) > 1 else None
bad = 0
for name, modes in base.items():
    traces = read_traces(str(SHARED / "traces" / name), enc)[:limit]
    for mode, rows in modes.items():
        mem = NGramMemory("simulate") if mode == "memory" else None
        t0 = time.time()
        for i, tr in enumerate(traces):
            d = make_drafter(4 if mode == "fixed4" else None, cost=linear_cost(0.08), memory=mem)
            t = replay(tr.prompt, tr.output, d, draft=4 if mode == "fixed4" else 64, beta=0.08)
            got = [t.counts.steps, t.counts.drafted, t.counts.accepted]
            if got != rows[i]:
                bad += 1
                if bad < 10: print("DIFF", name, mode, i, got, rows[i])
            if mem is not None:
                mem.add(tr.output)
        print(name, mode, f"{time.time()-t0:.1f}s", flush=True)
print("mismatches:", bad)
sys.exit(1 if bad else 0)
