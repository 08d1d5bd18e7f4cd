"""Memory of a batch where a long conversation meets short ones (engine/batch/kv.py's shelves):
the keys and values held, over the weights, in two cases on one `Batch` (SmolLM2 float32):

- together: the long prompt (docs/design.md's opening, --doc-tokens) and three short questions,
  the peak active memory while all four decode;
- aside: the long one decoding alone, a short one joining after 4 steps and leaving (its answer
  8 tokens): the peak from its arrival to the end (its joining and leaving included).

Prints one JSON line with both figures (MB) and the texts' first words (compare builds with
PYTHONPATH=<other checkout>).

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libopenblas.so.0 python benchmarks/batch_memory.py
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import mlx.core as mx

sys.path.insert(0, str(Path(__file__).parent))
from mixed_lengths import conversations, document  # noqa: E402
from serve import float32_model  # noqa: E402
from shared_prefix import questions  # noqa: E402

import specgen  # noqa: E402
from specgen.draft.drafter import make_drafter  # noqa: E402
from specgen.engine.batch.batch import Batch  # noqa: E402
from specgen.engine.decode.sampling import make_selector  # noqa: E402
from specgen.events import Step  # noqa: E402


def decode(batch: Batch, out: dict, each_step=None) -> None:
    """Step `batch` to the end, its tokens into `out`; `each_step(steps)` after each decoding step."""
    steps = 0
    while batch.busy:
        for key, event in batch.step():
            if isinstance(event, Step):
                out.setdefault(key, []).extend(event.tokens)
        if batch.rows and each_step:
            steps += 1
            each_step(steps)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--doc-tokens", type=int, default=3000)
    a = ap.parse_args()
    model, tok = specgen.load(float32_model())
    asked = questions(1, 4)[0]
    prompts = [tok.apply_chat_template(c, add_generation_prompt=True)
               for c in conversations(document(tok, 0, a.doc_tokens), asked)]
    weights = mx.get_active_memory()

    def add(b: Batch, key, prompt: list[int], n: int) -> None:
        b.add(key, prompt, drafter=make_drafter(None), max_tokens=n, selector=make_selector(0))

    batch, together, peak = Batch(model, max_rows=4), {}, [0]
    for i, p in enumerate(prompts):
        add(batch, i, p, 48)

    def all_four(_):
        if len(batch.rows) == 4:
            mx.synchronize()
            peak[0] = max(peak[0], mx.get_active_memory() - weights)
    decode(batch, together, all_four)

    batch, aside = Batch(model, max_rows=2), {}
    add(batch, "long", prompts[0], 64)

    def side(steps):
        if steps == 4:
            mx.synchronize()
            mx.reset_peak_memory()
            add(batch, "side", prompts[1], 8)
    decode(batch, aside, side)
    mx.synchronize()
    print(json.dumps({
        "prompt_tokens": [len(p) for p in prompts],
        "together_mb": round(peak[0] / 1e6), "aside_mb": round((mx.get_peak_memory() - weights) / 1e6),
        "texts": [tok.decode(together[i])[:30] for i in range(4)] + [tok.decode(aside[k])[:30] for k in aside]}))


if __name__ == "__main__":
    main()
