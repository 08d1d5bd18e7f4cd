"""Attention by runs of rows (engine/batch/attend.py): a short row batched with a long one attends
over its own slots, not the long one's span, and every row still emits what it emits alone."""

import numpy as np
import pytest
from conftest import plain_tokens, run, tiny_model
from mlx_lm.models import base

from specgen.draft.drafter import make_drafter
from specgen.engine.batch.attend import GROUP, Run, runs
from specgen.engine.batch.batch import Batch
from specgen.engine.batch.slots import Slots
from specgen.engine.decode.sampling import make_selector
from specgen.events import Step


@pytest.mark.parametrize("firsts, keys, expected", [
    ([0, 0, 0], 300, [Run(0, 3, 0)]),  # nothing to skip
    ([40, 100, 100], 300, [Run(0, 3, 40)]),  # slots no row holds any more are skipped, in one call
    ([0, 5000, 5000, 5000], 6001, [Run(0, 1, 0), Run(1, 4, 5000)]),
    ([5000, 0, 5000, 6000], 6001, [Run(0, 1, 5000), Run(1, 2, 0), Run(2, 4, 5000)]),
    # A cut is made where it saves more row-slots than a call's worth, not where it saves as many.
    ([0, GROUP // 2, GROUP // 2], 5000, [Run(0, 3, 0)]),
    ([0, GROUP // 2 + 1, GROUP // 2 + 1], 5000, [Run(0, 1, 0), Run(1, 3, GROUP // 2 + 1)]),
])
def test_rows_are_cut_into_runs_only_where_a_cut_saves_more_than_a_call(firsts, keys, expected):
    assert runs(np.array(firsts), keys) == expected


# Full attention beside sliding windows (gemma3), linear attention (qwen3_next), convolutions
# (lfm2); greedy rows and a seeded sampled one.
@pytest.mark.parametrize("arch", ["llama", "gemma3_text", "qwen3_next", "lfm2"])
def test_a_short_row_attends_over_its_own_slots_beside_a_long_one_and_emits_what_it_emits_alone(
        arch, monkeypatch):
    model = tiny_model(arch)
    long = [int(t) for t in np.random.default_rng(0).integers(3, 500, 2600)]
    shorts = [[7, 8, 9, 10, 11], [20, 21, 22]]
    rows = [long, *shorts]
    selectors = [lambda: make_selector(0), lambda: make_selector(0), lambda: make_selector(0.8, seed=3)]
    batch = Batch(model, max_rows=3, prefill_chunk=4096)  # makes the model's layers attend by runs
    alone = [run(model, p, drafter=make_drafter(None), max_tokens=12, selector=pick())[0]
             for p, pick in zip(rows, selectors)]
    assert alone[1] == plain_tokens(model, shorts[0], 12)  # a single sequence attends as before
    widths = []  # the keys each attention call reads, as (rows, slots)
    plain = base.scaled_dot_product_attention

    def counted(queries, keys, values, cache, scale, mask, sinks=None):
        widths.append((keys.shape[0], keys.shape[2]))
        return plain(queries, keys, values, cache=cache, scale=scale, mask=mask, sinks=sinks)

    monkeypatch.setattr(base, "scaled_dot_product_attention", counted)
    for i, (p, pick) in enumerate(zip(rows, selectors)):
        batch.add(i, p, drafter=make_drafter(None), max_tokens=12, selector=pick())
    got = {i: [] for i in range(len(rows))}
    while batch.busy:
        for key, event in batch.step():
            if isinstance(event, Step):
                got[key] += event.tokens
    assert [got[i] for i in range(len(rows))] == alone
    # No step reads the long span for every row (a window layer reads its own short buffer); the
    # short rows attend together over their own slots, the long row alone over its span.
    assert all(s < 2600 for n, s in widths if n == 3)
    assert any(n == 2 and s < 100 for n, s in widths)
    assert any(n == 1 and s > 2600 for n, s in widths[-20:])


def test_a_step_is_priced_by_the_slots_its_runs_read():
    slots = Slots()
    slots.held = np.zeros((3, 6000), dtype=bool)
    slots.held[0] = True  # a long row, and two that hold the last 1,000 slots
    slots.held[1:, 5000:] = True
    slots.lengths = [6000, 1000, 1000]
    assert slots.reach() == -(-(6001 + 2 * 1001) // 3)  # not the buffer's 6,001 a row
    slots.held[1:, GROUP // 2:] = True  # a cut would save a call's worth, no more: one run
    assert slots.reach() == 6001
