"""What a kept conversation buys `specgen chat` (issue 56), in one process, alternating, medians:

1. Time to the first token of turn 5: a Conversation that has answered turns 1-4 (its cache and
   drafter kept) against a fresh run of the same five-turn history (`Engine.stream` on a new
   cache: what `specgen run` with the history, or a stateless client, pays).
2. Drafting on a "paste code, ask for an edit, ask for another" conversation: the Conversation's
   kept drafter (it has read every earlier answer as generated) against the same turns run one at
   a time, each a fresh request with the whole history and a new drafter (no memory). The greedy
   texts are the same both ways (checked); acceptance and tokens a step are the drafters'.

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libopenblas.so.0 python benchmarks/chat.py --rounds 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve import float32_model  # noqa: E402  (benchmarks/serve.py: SmolLM2 dequantized to float32)

from specgen.api.conversation import Conversation  # noqa: E402
from specgen.engine.engine import Engine, Request  # noqa: E402
from specgen.engine.options import Options  # noqa: E402
from specgen.stats import RunStats  # noqa: E402

CHAT = ["What breed dog is smallest?", "How big does it get?", "What should it eat?",
        "How often should it be walked?", "Summarise what you told me in three sentences."]
CODE = ("Here is my code:\n```python\ndef fahrenheit_to_celsius(temperature):\n    return ((temperature - 32) * 5) / 9\n\n\n"
        "def average(values):\n    total = 0\n    for v in values:\n        total += v\n    return total / len(values)\n```\n"
        "Add type hints to both functions. Reply with the whole code.")
EDITS = [CODE, "Now add a docstring to each function. Reply with the whole code.",
         "Now make average return 0.0 for an empty list. Reply with the whole code."]


def first_token_s(stream) -> float:
    """Seconds to the stream's first response (the stream is then closed)."""
    start = time.perf_counter()
    try:
        next(stream)
        return time.perf_counter() - start
    finally:
        stream.close()


def ttft_round(engine: Engine, n: int, fresh_first: bool) -> tuple[float, float]:
    """(turn 5 kept, turn 5 fresh): seconds to the first token, in the order given."""
    talk = Conversation(engine, Options(max_tokens=n))
    for q in CHAT[:-1]:
        for _ in talk.say(q):
            pass
    history = talk.prompt(CHAT[-1])

    def fresh():
        return first_token_s(engine.stream(Request(engine.encode(history), Options(max_tokens=n))))

    if fresh_first:
        f = fresh()
        return first_token_s(talk.say(CHAT[-1])), f
    k = first_token_s(talk.say(CHAT[-1]))
    return k, fresh()


def drafting_round(engine: Engine, n: int) -> dict:
    talk, kept, alone = Conversation(engine, Options(max_tokens=n)), RunStats(), RunStats()
    for q in EDITS:
        history = talk.prompt(q)
        stats = RunStats()
        text = "".join(r.text for r in talk.say(q, stats))
        kept.counts.add(stats.counts)
        one = RunStats()
        again = "".join(r.text for r in engine.stream(Request(engine.encode(history), Options(max_tokens=n)), one))
        alone.counts.add(one.counts)
        assert again == text, "a fresh run answered otherwise"
    return {name: {"accepted": s.counts.accepted, "drafted": s.counts.drafted,
                   "acceptance": round(s.counts.acceptance_rate, 3), "tokens_per_step": round(s.counts.tokens_per_step, 3)}
            for name, s in (("kept", kept), ("one_at_a_time", alone))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=96, help="each answer's most tokens")
    args = parser.parse_args()
    engine = Engine.load(float32_model())
    engine.costs()
    ttft = [ttft_round(engine, args.tokens, fresh_first=r % 2 == 0) for r in range(args.rounds)]
    kept, fresh = [k for k, _ in ttft], [f for _, f in ttft]
    print(json.dumps({"turn5_ttft_kept_s": [round(x, 3) for x in kept], "turn5_ttft_fresh_s": [round(x, 3) for x in fresh],
                      "median_ratio_fresh_over_kept": round(statistics.median(f / k for k, f in ttft), 2)}))
    print(json.dumps({"drafting": drafting_round(engine, 160)}))


if __name__ == "__main__":
    main()
