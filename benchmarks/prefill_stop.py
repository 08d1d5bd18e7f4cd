"""How long a dropped prompt can hold the worker (issue 54): the longest gap between two of the
questions a prefill asks its `cancelled` (before each piece, then after each layer of a piece of
256 tokens or more), over a 4095-token prompt: two 2048-token chunks, the second on a full cache.

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libopenblas.so.0 python benchmarks/prefill_stop.py
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve import float32_model  # noqa: E402  (benchmarks/serve.py: SmolLM2 dequantized to float32)

from specgen.engine.decode.loop import generate  # noqa: E402
from specgen.engine.engine import Engine  # noqa: E402


def main() -> None:
    engine = Engine.load(float32_model())
    ids = engine.encode("Once upon a time there was a little dog who liked to run. " * 400)[:4096]
    asked = []

    def cancelled() -> bool:
        asked.append(time.perf_counter())
        return False

    start = time.perf_counter()
    for _ in generate(engine.loaded.model, ids, max_tokens=1, draft=0, cancelled=cancelled):
        break  # Prefilled: the prompt is in
    gaps = [b - a for a, b in zip(asked, asked[1:])]
    print(json.dumps({"prompt_tokens": len(ids), "prefill_s": round(time.perf_counter() - start, 2),
                      "questions": len(asked), "longest_gap_s": round(max(gaps), 2),
                      "median_gap_s": round(statistics.median(gaps), 2)}))


if __name__ == "__main__":
    main()
