"""Prefix sharing (engine/batch/share.py): rows whose prompts share their first tokens prefill them
once, and each row's output and kept cache are what it gets in a batch of its own (bit for bit on
this CPU, where a prefill's entries do not depend on how many positions the pass held)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import CYCLE, held, tiny_model
from test_batch_kinds import KINDS, steered

from specgen.draft.drafter import make_drafter
from specgen.engine.batch.batch import Batch
from specgen.engine.decode.sampling import make_selector
from specgen.events import Prefilled, Step

CHUNK = 16
HEAD = [30 + (7 * i) % 50 for i in range(40)]  # two prompts share these 40 tokens: 32 in whole chunks
# Attention layers give any prefix of their entries; a window that has wrapped or a state only
# what it holds at its end, so those share the whole chunks, from a copy made at a chunk's end.
SHARED = {"llama": len(HEAD)}
PROMPTS = {"a": HEAD + [1, 2, 3, 4, 5], "b": HEAD + [6, 7, 8], "c": CYCLE + [3], "d": CYCLE + [3], "e": [40, 41]}


def model_of(arch: str):
    return tiny_model("llama") if arch == "llama" else steered(arch)


def run(model, prompts: dict, arrive: dict, max_rows: int = 4) -> tuple[dict, dict, Batch]:
    """`prompts` through one batch, each added before step arrive[key]: (tokens by key, kept
    caches' arrays by key, the batch)."""
    batch = Batch(model, max_rows=max_rows, prefill_chunk=CHUNK)
    out, step = {k: [] for k in prompts}, 0
    while step <= max(arrive.values()) or batch.busy:
        for key in (k for k, at in arrive.items() if at == step):
            batch.add(key, prompts[key], drafter=make_drafter(4), draft=4, max_tokens=20, keep_cache=True)
        for key, event in batch.step():
            if isinstance(event, Step):
                out[key] += event.tokens
        step += 1
    return out, {k: held(c) for k, c in batch.kept.items()}, batch


def alone(model, prompts: dict) -> tuple[dict, dict]:
    """Each prompt in a batch of its own: nothing to share."""
    out, kept = {}, {}
    for key, prompt in prompts.items():
        o, k, batch = run(model, {key: prompt}, {key: 0})
        assert batch.sharing.tokens == 0
        out.update(o)
        kept.update(k)
    return out, kept


def assert_same(got: tuple[dict, dict], expected: tuple[dict, dict]) -> None:
    assert got[0] == expected[0]
    for key, arrays in expected[1].items():
        assert all(np.array_equal(a, b) for a, b in zip(got[1][key], arrays, strict=True)), key


@pytest.mark.parametrize("arch", ["llama", *KINDS])
def test_rows_sharing_a_prefix_emit_and_keep_bit_for_bit_what_they_do_alone(arch):
    model = model_of(arch)
    expected = alone(model, PROMPTS)
    out, kept, batch = run(model, PROMPTS, dict.fromkeys(PROMPTS, 0))
    assert_same((out, kept), expected)
    # The same prompt twice: the second prefills nothing; a and b share their head.
    whole = len(PROMPTS["c"]) - 1
    assert batch.sharing.tokens == whole + SHARED.get(arch, 2 * CHUNK)
    assert batch.counters.prompt_tokens == sum(len(p) - 1 for p in PROMPTS.values()) - batch.sharing.tokens
    assert not batch.sharing.parked  # nothing is kept once no row waits


@pytest.mark.parametrize("arch", ["llama", "qwen3_next"])
def test_a_row_waiting_for_a_place_takes_the_prefix_of_one_that_has_left(arch):
    model = model_of(arch)
    prompts = {**{k: PROMPTS[k] for k in "abcd"}, "g": HEAD + [9, 10]}
    expected = alone(model, prompts)
    out, kept, batch = run(model, prompts, dict.fromkeys(prompts, 0), max_rows=1)  # one at a time
    assert_same((out, kept), expected)
    whole = len(PROMPTS["c"]) - 1
    # The head a, b and g share, each of two takes from the first's.
    assert batch.sharing.tokens == whole + 2 * SHARED.get(arch, 2 * CHUNK)
    assert not batch.sharing.parked


def test_a_row_arriving_later_takes_the_prefix_from_an_active_row():
    model = model_of("llama")
    prompts = {"a": PROMPTS["a"], "b": PROMPTS["b"]}
    expected = alone(model, prompts)
    out, kept, batch = run(model, prompts, {"a": 0, "b": 6}, max_rows=2)  # b comes as a decodes
    assert_same((out, kept), expected)
    assert batch.sharing.tokens == len(HEAD)


@pytest.mark.parametrize("arch", ["llama", "qwen3_next"])
def test_one_prompt_sampled_n_times_is_prefilled_once_in_its_first_step(arch):
    model = model_of(arch)
    prompt = CYCLE[:6]
    batch = Batch(model, max_rows=4, prefill_chunk=CHUNK)
    for seed in range(3):
        batch.add(seed, prompt, selector=make_selector(0.8, seed=seed), max_tokens=8)
    joined = [e for _, e in batch.step() if isinstance(e, Prefilled)]
    assert [e.shared for e in joined] == [0, 5, 5] and batch.counters.prompt_tokens == 5
