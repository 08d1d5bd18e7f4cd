"""Give a model's memory the model's own earlier answers, from a pre-tokenized trace file.

    python benchmarks/seed_memory.py MODEL TRACES.jsonl

As if `specgen run --memory -m MODEL` had answered each trace's prompt with its `output_ids`
(for the real-model benchmark: ../shared/traces/smollm2_chat_topk.jsonl, SmolLM2's greedy answers
to the 24 AlpacaEval instructions that benchmarks/prompts/chat.jsonl leaves out). The memory file
is the one `run --memory` and `bench --memory` use (see `specgen cache`); one that already holds
outputs is left alone (`specgen cache clear -m MODEL --memory` first to rebuild it).
"""

from __future__ import annotations

import json
import sys

from specgen import defaults
from specgen.draft import memory_file
from specgen.engine.load import registry


def main(model: str, traces: str) -> None:
    spec = registry.resolve(model, registry.load_registry())
    key = registry.model_key(spec)
    path = memory_file.memory_path(key, defaults.MAX_ORDER)
    mem, warning = memory_file.load(path, key, registry.local_source(spec.source))
    if warning:
        sys.exit(warning)
    if mem.outputs():
        sys.exit(f"{path} already holds {mem.outputs()} outputs; left alone")
    for line in open(traces):
        if line.strip():
            mem.add(json.loads(line)["output_ids"])
    warning = memory_file.save(mem, path)
    if warning:
        sys.exit(warning)
    print(f"{path}: {mem.outputs()} outputs")


if __name__ == "__main__":
    main(*sys.argv[1:3])
