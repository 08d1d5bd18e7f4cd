"""Speculation on every cache type: KV caches and sliding windows (past their wrap, too) are
trimmed; state caches (state-space, linear attention, short convolutions) are restored and the
accepted tokens fed again. Greedy and seeded output equal plain decoding's, and the cache ends as
plain decoding of the same tokens leaves it."""

import mlx.core as mx
import numpy as np
import pytest
from conftest import CYCLE, Steered, arrays, held, plain_tokens, run, tiny_model
from mlx_lm.generate import generate_step
from mlx_lm.models.cache import RotatingKVCache, make_prompt_cache

from specgen.draft.drafter import make_drafter
from specgen.engine.cost.curve import StepPrices
from specgen.engine.decode.rollback import Rollback
from specgen.engine.decode.sampling import make_selector

PROMPT = CYCLE * 2 + [10, 11, 12]


CASES = {  # arch -> (model overrides, boost, how it rolls back)
    "qwen3_next": ({}, 2.5, "restore (ArraysCache)"),
    "mamba": ({}, 2.5, "restore (ArraysCache)"),
    "mamba2": ({}, 2.5, "restore (ArraysCache)"),
    "lfm2": ({}, 2.5, "restore (ArraysCache)"),
    "gemma3_text": ({"sliding_window": 32}, 5.0, "trim"),
    "llama": ({}, 2.5, "trim"),
}





def assert_as_plain_decoding_leaves_it(model, cache, tokens):
    """The cache holds what plain decoding of PROMPT and then `tokens` leaves (all but the last)."""
    plain = make_prompt_cache(model)
    for t in PROMPT + tokens[:-1]:
        model(mx.array([[t]]), cache=plain)
    for a, b in zip(arrays(cache), arrays(plain), strict=True):
        assert a.shape == b.shape and np.allclose(a, b, atol=1e-4)


@pytest.mark.parametrize("arch", CASES)
def test_greedy_output_and_final_cache_equal_plain_decoding(arch):
    overrides, boost, how = CASES[arch]
    model = Steered(tiny_model(arch, **overrides), boost)
    cache = make_prompt_cache(model)
    tokens, steps, pre = run(model, PROMPT, drafter=make_drafter(None), draft=8, max_tokens=200,
                             prompt_cache=cache)
    fed = model.fed
    assert str(pre.speculation) == f"on: {how}"
    assert tokens == plain_tokens(model, PROMPT, 200)
    accepted, rejected = sum(s.accepted for s in steps), sum(s.drafted - s.accepted for s in steps)
    assert accepted > 100 and rejected > 0, (accepted, rejected)
    assert sum(s.accepted for s in steps[len(steps) // 2:]) > 0  # long after a window wraps, too
    # One pass a step, of the last token and the drafts (plus a one-token confirming pass where a
    # row was near-tied, and a plain step queued past the end): trimmed caches re-feed nothing,
    # restored ones re-feed accepted tokens after rejections.
    passes = len(PROMPT) - 1 + sum(1 + s.drafted + s.confirmed for s in steps)
    rejecting = sum(s.drafted > s.accepted for s in steps)
    assert fed - passes in ((0, 1) if how == "trim" else range(rejecting - 1, 10**6))
    assert_as_plain_decoding_leaves_it(model, cache, tokens)


@pytest.mark.parametrize("arch", ["qwen3_next", "gemma3_text"])
def test_seeded_sampling_is_the_same_with_speculation_on_and_off(arch):
    overrides, boost, _ = CASES[arch]
    model = Steered(tiny_model(arch, **overrides), boost * 2)
    out = {}
    for draft in (0, 8):
        tokens, steps, _ = run(model, PROMPT, drafter=make_drafter(None), draft=draft, max_tokens=120,
                               selector=make_selector(0.5, seed=5))
        out[draft] = tokens
        if draft:
            assert sum(s.accepted for s in steps) > 20
    assert out[0] == out[8]


@pytest.mark.parametrize("keep", [0, 4])
def test_a_rotating_cache_the_caller_passes(keep):
    # Models' windows keep nothing; mlx-lm's `max_kv_size` caches keep the first 4 tokens too,
    # which its multi-token passes mask out of some rows: speculation is off there, never wrong.
    model = Steered(tiny_model("llama"), 2.5)
    ours, plain, reference = ([RotatingKVCache(24, keep=keep) for _ in model.layers] for _ in range(3))
    tokens, steps, pre = run(model, PROMPT, drafter=make_drafter(None), draft=8, max_tokens=120,
                             prompt_cache=ours)
    assert tokens == [t for t, _ in generate_step(mx.array(PROMPT), model, max_tokens=120,
                                                  prompt_cache=reference)]
    if keep:
        assert not pre.speculation.on and "max_kv_size" in str(pre.speculation)
    else:
        assert str(pre.speculation) == "on: trim"
        assert sum(s.accepted for s in steps) > 50 and sum(s.drafted > s.accepted for s in steps) > 0
    for t in PROMPT + tokens[:-1]:
        model(mx.array([[t]]), cache=plain)
    for a, b in zip(arrays(ours), arrays(plain), strict=True):
        assert np.allclose(a, b, atol=1e-4)


ALWAYS_QUEUE = StepPrices(lambda k: 1.0, 1.0)  # every pass is queued behind the one in flight


@pytest.mark.parametrize("arch", CASES)
def test_passes_queued_behind_drafts_give_plain_output_and_cache(arch):
    # Every pass is queued before the one before it is read, as if that one's drafts all held;
    # where they do not, the pass behind is dropped. Output and final cache are plain decoding's.
    overrides, boost, how = CASES[arch]
    model = Steered(tiny_model(arch, **overrides), boost)
    cache = make_prompt_cache(model)
    tokens, steps, _ = run(model, PROMPT, drafter=make_drafter(None), draft=8, max_tokens=200,
                           prompt_cache=cache, queue_after=1, prices=ALWAYS_QUEUE)
    assert tokens == plain_tokens(model, PROMPT, 200)
    kept = sum(s.queued and s.drafted > 0 for s in steps)
    dropped = sum(s.drafted > s.accepted or s.confirmed for s in steps)  # each had one behind it
    assert kept > 5 and dropped > 0, (kept, dropped)
    passes = len(PROMPT) - 1 + sum(1 + s.drafted + s.confirmed for s in steps)
    assert model.fed > passes  # the dropped passes' positions
    assert_as_plain_decoding_leaves_it(model, cache, tokens)





@pytest.mark.parametrize("arch", CASES)
def test_dropping_the_pass_behind_leaves_the_cache_exactly_as_before_it(arch):
    overrides, _, _ = CASES[arch]
    model = tiny_model(arch, **overrides)
    cache = make_prompt_cache(model)
    back = Rollback(cache)
    model(mx.array([PROMPT]), cache=cache)
    back.fed(len(PROMPT))
    back.mark()
    model(mx.array([[10, 11, 12]]), cache=cache)  # a verify pass in flight
    back.fed(3)
    mx.eval([c.state for c in cache])
    before = held(cache)
    back.mark()
    model(mx.array([[13, 14]]), cache=cache)  # the pass queued behind it
    back.fed(2)
    back.rewind_to(len(PROMPT) + 3)  # every draft in flight held, but the pass behind is dropped
    assert back.cached == len(PROMPT) + 3
    for a, b in zip(held(cache), before, strict=True):
        assert np.array_equal(a, b)
    back.rewind_to(len(PROMPT) + 1)  # and the pass in flight rejected all but its first token
    assert back.cached in (len(PROMPT) + 1, len(PROMPT))  # trimmed, or restored to its mark


@pytest.mark.parametrize("arch", ["qwen3_next", "gemma3_text"])
def test_seeded_sampling_is_the_same_with_passes_queued_behind(arch):
    overrides, boost, _ = CASES[arch]
    model = Steered(tiny_model(arch, **overrides), boost * 2)
    out = [run(model, PROMPT, drafter=make_drafter(None), draft=draft, max_tokens=120, queue_after=ahead,
               prices=ALWAYS_QUEUE, selector=make_selector(0.5, seed=5))[0]
           for draft, ahead in ((0, None), (8, 1))]
    assert out[0] == out[1]


@pytest.mark.parametrize("arch", CASES)
def test_warming_up_runs_each_pass_width_once_on_every_cache_type(arch):
    from specgen.engine.cost.calibrate import warm_up

    overrides, boost, _ = CASES[arch]
    model = Steered(tiny_model(arch, **overrides), boost)
    warm_up(model, PROMPT, sizes=(1, 2, 4, 8))
    assert model.fed == 15
