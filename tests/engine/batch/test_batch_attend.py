"""Attention by runs of rows (engine/batch/attend.py) and rows on shelves (kv.py): a short row
batched with a long one attends over its own slots, not the long one's span, holds memory for its
own span only, and every row still emits what it emits alone; a model whose attention does not go
through the wrapper keeps every row on one shelf."""

import numpy as np
import pytest
from conftest import plain_tokens, run, tiny_model
from mlx_lm.models import base, llama

from specgen.draft.drafter import make_drafter
from specgen.engine.batch.attend import GROUP, Run, runs
from specgen.engine.batch.batch import Batch
from specgen.engine.batch.cache import RaggedBatch
from specgen.engine.batch.kv import RaggedKVCache
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
    got = decoded(batch, rows, selectors)
    assert [got[i] for i in range(len(rows))] == alone
    # No step reads the long span for every row (a window layer reads its own short buffer); the
    # short rows attend together over their own slots, the long row alone over its span.
    assert all(s < 2600 for n, s in widths if n == 3)
    assert any(n == 2 and s < 100 for n, s in widths)
    assert any(n == 1 and s > 2600 for n, s in widths[-20:])
    # The short rows sit on a shelf of their own: a full-attention layer holds about the long
    # row's span once (3 x 2,600 row-slots and more on one shelf).
    assert 2600 < max(batch.held) < 1.5 * 2600


def decoded(batch: Batch, rows: list, selectors: list) -> dict:
    """Each row's tokens, the rows added at once and stepped to the end; `batch.held`: the most
    row-slots a full-attention layer's buffers held after any step."""
    for i, (p, pick) in enumerate(zip(rows, selectors)):
        batch.add(i, p, drafter=make_drafter(None), max_tokens=12, selector=pick())
    got, batch.held = {i: [] for i in range(len(rows))}, [0]
    while batch.busy:
        for key, event in batch.step():
            if isinstance(event, Step):
                got[key] += event.tokens
        full = [c for c in batch.cache.layers if isinstance(c, RaggedKVCache) and c.window is None]
        batch.held.append(max((sum(k.shape[0] * k.shape[2] for k, _ in c.buffers) for c in full), default=0))
    return got


def own_attention(monkeypatch):
    """Llama whose layers do not call mlx-lm's attention by its module's name (not wrapped)."""
    monkeypatch.setattr(llama, "scaled_dot_product_attention",
                        lambda *a, **k: base.scaled_dot_product_attention(*a, **k))
    return tiny_model("llama")


# Layers not wrapped are handed the whole buffer; multi-head latent attention (deepseek_v3)
# scores the keys its cache returns before attention is called, so handed only a step's keys on
# a shelf of their own it would fail. Both keep every row on one shelf from slot 0, as before.
@pytest.mark.parametrize("make", [own_attention, lambda _: tiny_model("deepseek_v3")],
                         ids=["own attention", "latent attention"])
def test_a_model_whose_attention_reads_its_cache_itself_keeps_every_row_on_one_shelf_and_stays_exact(
        make, monkeypatch):
    model = make(monkeypatch)
    long = [int(t) for t in np.random.default_rng(1).integers(3, 500, 2600)]
    rows, pick = [[7, 8, 9, 10, 11], long, [20, 21, 22]], lambda: make_selector(0)
    alone = [run(model, p, drafter=make_drafter(None), max_tokens=12, selector=pick())[0] for p in rows]
    batch = Batch(model, max_rows=3, prefill_chunk=4096)
    assert decoded(batch, rows, [pick] * 3) == dict(enumerate(alone))
    assert max(batch.held) >= 3 * 2600  # the short rows hold the long one's span


def test_a_short_row_leaving_a_long_one_drops_its_shelf_and_copies_nothing(monkeypatch):
    # An agent's side request ends beside its session: the batch is compacted (half its rows are
    # free), by dropping the short row's shelf, not by copying the session's entries.
    model = tiny_model("llama")
    long = [int(t) for t in np.random.default_rng(2).integers(3, 500, 2600)]
    rows, limits = [long, [7, 8, 9, 10, 11]], [12, 3]
    alone = [run(model, p, drafter=make_drafter(None), max_tokens=n, selector=make_selector(0))[0]
             for p, n in zip(rows, limits)]
    gathered, compacted = [], []
    real_gather, real_compact = RaggedKVCache.gather, RaggedBatch.compact
    monkeypatch.setattr(RaggedKVCache, "gather", lambda self, *a: gathered.append(1) or real_gather(self, *a))
    monkeypatch.setattr(RaggedBatch, "compact", lambda self, **kw: compacted.append(1) or real_compact(self, **kw))
    batch = Batch(model, max_rows=2, prefill_chunk=4096)
    for i, (p, n) in enumerate(zip(rows, limits)):
        batch.add(i, p, drafter=make_drafter(None), max_tokens=n, selector=make_selector(0))
    got = {0: [], 1: []}
    while batch.busy:
        for key, event in batch.step():
            if isinstance(event, Step):
                got[key] += event.tokens
    assert [got[0], got[1]] == alone
    assert compacted and not gathered
