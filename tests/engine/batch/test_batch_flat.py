"""Passes fed flat (engine/batch/slots.py's `Flat`): where rows draft different lengths, each
feeds only its own positions and still emits what it emits alone; a row's drafts are priced by
its own share of such a step, as the flat steps were timed, so a row whose drafter trusts a copy
drafts beside rows that draft nothing where that pays; a pass is fed flat where that costs less;
a model whose layers cannot take it (state layers, attention the wrapper does not see) is fed
padded."""

import pytest
from conftest import CYCLE, Steered, tiny_model
from test_batch_attend import own_attention
from test_batch_engine import batched
from test_batch_kinds import solo

from specgen.engine.batch.batch import Batch
from specgen.engine.batch.probe import probe
from specgen.engine.cost.batch import Pricing, feeds_flat
from specgen.engine.cost.grid import Measured, measure
from specgen.engine.decode.sampling import make_selector


class Fed:
    """A model that records the shape of each pass's input."""

    def __init__(self, model):
        self.model, self.layers, self.shapes = model, model.layers, []

    def __call__(self, x, cache):
        self.shapes.append(tuple(x.shape))
        return self.model(x, cache=cache)


@pytest.mark.parametrize("arch", ["llama", "gemma3_text"])
def test_rows_drafting_different_lengths_are_fed_flat_and_emit_what_they_emit_alone(arch):
    model = Steered(tiny_model(arch, **({"sliding_window": 8} if arch == "gemma3_text" else {})), 4.0)
    prompts = [CYCLE * 2, CYCLE[5:] + [300, 301] + CYCLE, [40, 41, 42], CYCLE[:7]]
    rows = [dict(prompt=p, max_tokens=n, stop_tokens=frozenset(), draft=d, adaptive=False,
                 selector=make_selector(0.7, seed=i) if i == 1 else make_selector(0))
            for i, (p, n, d) in enumerate(zip(prompts, (40, 30, 20, 30), (8, 3, 0, 5)))]
    expected = [solo(model, r) for r in rows]
    fed = Fed(model)
    got, _, _ = batched(Batch(fed, max_rows=4, prefill_chunk=64), rows, arrive=[0, 0, 1, 3])
    assert [got[i] for i in range(4)] == expected
    # Flat passes: one position a batch row of the input, more than the cache's four rows.
    assert any(w == 1 and n > 4 for n, w in fed.shapes)


def test_only_models_whose_every_layer_takes_a_flat_pass_are_fed_flat(monkeypatch):
    assert probe(tiny_model("llama")).flat and probe(tiny_model("gemma3_text", sliding_window=8)).flat
    assert not probe(tiny_model("qwen3_next")).flat  # state layers: each row's positions in order
    assert not probe(own_attention(monkeypatch)).flat  # its keys would stay flat, its rows' apart
    assert not probe(tiny_model("deepseek_v3")).flat  # latent attention scores the keys itself


# Four rows: a step of 2 positions a row costs 1.3 plain ones.
GRID = {1: {1: 1.0, 2: 1.05, 4: 1.1, 8: 1.2}, 4: {1: 1.0, 2: 1.3, 4: 1.93, 8: 3.15}}


def beside_plain_rows():
    """A model, one row walking a cycle its drafter knows beside three that decode plainly, and
    what each emits alone."""
    model = Steered(tiny_model("llama"), 6.0)
    prompts = [CYCLE * 3, [40, 41], [300], [7, 8, 9]]
    rows = [dict(prompt=p, max_tokens=40, stop_tokens=frozenset(), draft=d, adaptive=d == 64,
                 selector=make_selector(0)) for p, d in zip(prompts, (64, 0, 0, 0))]
    return model, rows, [solo(model, r) for r in rows]


# Queuing that hides 15% of a step (the passes that carry drafts are mostly queued), and none
# (they are built once the step before is read).
@pytest.mark.parametrize("overlap", [0.15, 0.0])
def test_a_row_that_trusts_its_drafts_drafts_beside_rows_that_draft_nothing(overlap):
    # At 4 rows a step of 2 positions costs 1.3 plain ones. Padded, every row pays for the
    # widest: drafts the cycling row keeps most of the time do not pay for four rows' positions,
    # so it drafts nothing beside three rows that decode plainly. Fed flat, it pays for its own.
    dear = Pricing(Measured(GRID), overlap=overlap)
    model, rows, expected = beside_plain_rows()
    accepted = {}
    for flat in (False, True):
        batch = Batch(model, max_rows=4, pricing=dear)
        batch.flat = flat
        got, _, events = batched(batch, rows, arrive=[0] * 4)
        assert [got[i] for i in range(4)] == expected
        accepted[flat] = sum(s.accepted for s in events[0])
    assert accepted[True] > 20 and accepted[True] > 3 * accepted[False]


def test_a_row_drafts_beside_plain_rows_only_where_the_timed_flat_steps_say_it_pays():
    # One row's more positions timed nearly free (a GPU), and each costing a row's share or more
    # (SmolLM2 float32 at 8 rows on this CPU, where drafting beside plain rows made 8 rows 10-25%
    # slower than plain decoding, priced from the padded grid).
    cheap = Pricing(Measured(GRID, flat={4: {1: 1.02, 3: 1.05, 7: 1.1, 15: 1.2}}))
    dear = Pricing(Measured(GRID, flat={4: {1: 1.3, 3: 1.9, 7: 3.1}}))
    model, rows, expected = beside_plain_rows()
    accepted = {}
    for name, pricing in (("cheap", cheap), ("dear", dear)):
        got, _, events = batched(Batch(model, max_rows=4, pricing=pricing), rows, arrive=[0] * 4)
        assert [got[i] for i in range(4)] == expected
        accepted[name] = sum(s.accepted for s in events[0])
    assert accepted["cheap"] > 20 and accepted["dear"] == 0
    # Where every row trusts its drafts they share what the pass costs more: they draft there.
    rows = [{**r, "prompt": CYCLE[i:] + CYCLE * 2, "draft": 64, "adaptive": True} for i, r in enumerate(rows)]
    got, _, events = batched(Batch(model, max_rows=4, pricing=dear), rows, arrive=[0] * 4)
    assert [got[i] for i in range(4)] == [solo(model, r) for r in rows]
    assert all(sum(s.accepted for s in events[i]) > 10 for i in range(4))


def test_a_pass_is_fed_flat_where_that_costs_less():
    # Untimed, flat where it saves a width: one row's 4 drafts cost what a step 2 wide costs.
    assert feeds_flat(None, [5, 1, 1, 1], 0) and not feeds_flat(None, [2, 1, 1, 1], 0)
    # Timed: one more position flat (1.1) beats a padded step 2 wide (1.3); four more flat
    # (about 2.5) lose to one 5 wide (about 2.2).
    assert feeds_flat(Pricing(Measured(GRID, flat={4: {1: 1.1, 3: 1.2}})), [2, 1, 1, 1], 0)
    assert not feeds_flat(Pricing(Measured(GRID, flat={4: {1: 1.4, 3: 2.2, 7: 3.5}})), [5, 1, 1, 1], 0)


def test_flat_steps_are_timed_only_for_models_whose_passes_may_be_fed_flat():
    assert sorted(measure(tiny_model("llama"), [5, 6, 7], max_rows=2, budget_s=0.0).flat) == [2]
    assert measure(tiny_model("qwen3_next"), [5, 6, 7], max_rows=2, budget_s=0.0).flat == {}
