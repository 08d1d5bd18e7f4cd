"""Passes fed flat (engine/batch/slots.py's `Flat`): where rows draft different lengths, each
feeds only its own positions and still emits what it emits alone; a row's drafts are priced by
its own share of such a step, so a row whose drafter trusts a copy drafts beside rows that draft
nothing; a model whose layers cannot take it (state layers, attention the wrapper does not see)
is fed padded."""

import pytest
from conftest import CYCLE, Steered, tiny_model
from test_batch_attend import own_attention
from test_batch_engine import batched
from test_batch_kinds import solo

from specgen.engine.batch.batch import Batch
from specgen.engine.batch.probe import probe
from specgen.engine.cost.batch import Pricing
from specgen.engine.cost.grid import Measured
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


# Queuing that hides 15% of a step (the passes that carry drafts are mostly queued), and none
# (they are built once the step before is read).
@pytest.mark.parametrize("overlap", [0.15, 0.0])
def test_a_row_that_trusts_its_drafts_drafts_beside_rows_that_draft_nothing(overlap):
    # At 4 rows a step of 2 positions costs 1.3 plain ones. Padded, every row pays for the
    # widest: drafts the cycling row keeps most of the time do not pay for four rows' positions,
    # so it drafts nothing beside three rows that decode plainly. Fed flat, it pays for its own.
    dear = Pricing(Measured({1: {1: 1.0, 2: 1.05, 4: 1.1, 8: 1.2}, 4: {1: 1.0, 2: 1.3, 4: 1.93, 8: 3.15}}),
                   overlap=overlap)
    model = Steered(tiny_model("llama"), 6.0)
    prompts = [CYCLE * 3, [40, 41], [300], [7, 8, 9]]
    rows = [dict(prompt=p, max_tokens=40, stop_tokens=frozenset(), draft=d, adaptive=d == 64,
                 selector=make_selector(0)) for p, d in zip(prompts, (64, 0, 0, 0))]
    expected = [solo(model, r) for r in rows]
    accepted = {}
    for flat in (False, True):
        batch = Batch(model, max_rows=4, pricing=dear)
        batch.flat = flat
        got, _, events = batched(batch, rows, arrive=[0] * 4)
        assert [got[i] for i in range(4)] == expected
        accepted[flat] = sum(s.accepted for s in events[0])
    assert accepted[True] > 20 and accepted[True] > 3 * accepted[False]
