"""What the server keeps between requests: model caches by the tokens they hold (trimmable ones cut
back to a shared prefix, state caches only at their exact prefix), and the next turn generated from
one is exactly the turn generated from nothing."""

import pytest
from conftest import plain_tokens, tiny_model

from specgen.engine.engine import Engine, Request
from specgen.engine.load import registry
from specgen.engine.options import Options
from specgen.serve.generation.cache import PromptCache
from specgen.stats import RunStats

PROMPT = [1, 14, 92, 7, 301, 44, 5, 18, 260, 77, 9, 130]


def _turn(engine, ids, cache, cached):
    stats = RunStats()
    list(engine.stream(Request(ids, Options(max_tokens=12, draft=4), prompt_cache=cache, cached=cached), stats))
    return stats.output_ids


@pytest.mark.parametrize("arch,diverged_held", [("llama", 5), ("mamba", 0)])
def test_the_next_turn_from_a_kept_cache_is_the_turn_from_nothing(stories, arch, diverged_held):
    model = tiny_model(arch)
    engine = Engine(registry.wrap(model, stories.tokenizer))
    kept = PromptCache(model, 1 << 30)
    cache, held = kept.fetch(PROMPT)
    assert held == 0
    out = _turn(engine, PROMPT, cache, held)
    kept.store((PROMPT + out)[:-1], cache)  # what the cache holds after a generation
    longer = PROMPT + out + [33, 61]
    cache, held = kept.fetch(longer)
    assert held == len(PROMPT) + len(out) - 1
    assert _turn(engine, longer, cache, held) == plain_tokens(model, longer, 12)
    cache, held = kept.fetch(PROMPT[:5] + [3, 3, 3])  # shares 5 tokens with what is kept
    assert held == diverged_held  # a state cache cannot be cut back to them
    cache, held = kept.fetch(PROMPT)  # the whole prompt is kept: its last token is fed again
    assert held == len(PROMPT) - 1 if arch == "llama" else held == 0
