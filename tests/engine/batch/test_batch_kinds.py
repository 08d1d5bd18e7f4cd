"""Every cache kind mlx-lm batches batches here too, each row speculating on its own: sliding
windows (wrapping within the test), state-space layers (Mamba 2) and hybrids of state and
attention layers (Qwen3-Next, LFM2). Rows arriving at different steps, of different lengths, one
cancelled, each emit what the same request alone emits (and greedy ones what mlx-lm emits);
their kept caches hold what plain decoding leaves; a model whose state layers read padding is
refused by name."""

import mlx.core as mx
import numpy as np
import pytest
from conftest import CYCLE, Steered, held, plain_tokens, run, tiny_model
from mlx_lm.models.cache import make_prompt_cache
from test_batch_engine import batched

from specgen.draft.drafter import make_drafter
from specgen.engine.batch import kv as batch_kv
from specgen.engine.batch.batch import Batch
from specgen.engine.batch.probe import padding_unsupported
from specgen.engine.cost.batch import Pricing
from specgen.engine.cost.grid import Measured, measure
from specgen.engine.decode.sampling import make_selector
from specgen.errors import InputError

KINDS = {  # arch -> (model overrides, steering as in test_caches): a window of 8 wraps many times
    "gemma3_text": ({"sliding_window": 8}, 5.0),
    "mamba2": ({}, 4.0),
    "qwen3_next": ({}, 2.5),
    "lfm2": ({}, 2.5),
}


def steered(arch: str) -> Steered:
    overrides, boost = KINDS[arch]
    return Steered(tiny_model(arch, **overrides), boost)


def rows_of():
    """Requests unlike each other: prompts of 1 to 40 tokens, drafts adaptive, fixed or none,
    greedy or seeded, lengths 20 to 50."""
    prompts = [CYCLE * 2 + [10, 11], [40, 41, 42], [11], CYCLE[3:] + [300, 301] + CYCLE]
    return [dict(prompt=p, max_tokens=n, stop_tokens=frozenset(), draft=d, adaptive=d == 64,
                 selector=make_selector(0.7, seed=i) if i % 2 else make_selector(0))
            for i, (p, n, d) in enumerate(zip(prompts, (50, 30, 40, 20), (64, 4, 0, 6)))]


def solo(model, row) -> list[int]:
    return run(model, row["prompt"], drafter=make_drafter(None if row["adaptive"] else row["draft"]),
               draft=row["draft"], max_tokens=row["max_tokens"], selector=row["selector"])[0]


@pytest.mark.parametrize("arch", KINDS)
def test_rows_of_every_cache_kind_emit_what_they_emit_alone(arch):
    model = steered(arch)
    rows = rows_of()
    expected = [solo(model, r) for r in rows]
    assert expected[0] == plain_tokens(model, rows[0]["prompt"], rows[0]["max_tokens"])
    assert expected[2] == plain_tokens(model, rows[2]["prompt"], rows[2]["max_tokens"])
    got, _, events = batched(Batch(model, max_rows=3, prefill_chunk=16), rows, arrive=[0, 0, 2, 5],
                             cancel={1: 6})
    assert got[0] == expected[0] and got[2] == expected[2] and got[3] == expected[3]
    assert 0 < len(got[1]) < len(expected[1]) and got[1] == expected[1][: len(got[1])]
    steps = [s for e in events.values() for s in e]
    assert sum(s.accepted for s in steps) > 20 and sum(s.drafted > s.accepted for s in steps) > 0


def assert_kept_as_plain_decoding_leaves(model, batch: Batch, prompts: dict, out: dict) -> None:
    """Each row's kept cache holds what plain decoding of its prompt and output (but the last
    token) leaves."""
    for key, prompt in prompts.items():
        plain = make_prompt_cache(model)
        for t in prompt + out[key][:-1]:
            model(mx.array([[t]]), cache=plain)
        for a, b in zip(held(batch.kept[key]), held(plain), strict=True):
            assert a.shape == b.shape and np.allclose(a, b, atol=1e-4)


@pytest.mark.parametrize("arch", KINDS)
def test_kept_caches_hold_what_plain_decoding_leaves(arch):
    model = steered(arch)
    batch = Batch(model, max_rows=2)
    prompts = {"a": CYCLE * 2 + [10, 11], "b": [40, 41, 42], "c": CYCLE[5:]}
    for key, prompt in prompts.items():
        batch.add(key, prompt, drafter=make_drafter(4), draft=4, max_tokens=24, keep_cache=True)
    out = {k: [] for k in prompts}
    for step, events in enumerate(batch.run()):
        for k, e in events:
            out[k] += getattr(e, "tokens", ())
        if step == 3:
            batch.cancel("b")  # a cancelled row keeps its cache too
    assert_kept_as_plain_decoding_leaves(model, batch, prompts, out)


class SometimesTied(Steered):
    """After an even token, the cycle's next token and another are near-tied (within the guard's
    margin), and which wins is still the model's, so it reads the cache: a batched row is
    confirmed alone there, from its states restored and its accepted tokens fed again."""

    every = 2  # ties follow tokens that are multiples of this

    def __call__(self, x, cache):
        self.fed += x.shape[1]
        logits = self.model(x, cache=cache)
        t = x.astype(mx.int32)
        nxt = (CYCLE[0] + (t - CYCLE[0] + 1) % len(CYCLE))[..., None]
        vocab = mx.arange(logits.shape[-1])[None, None, :]
        tie = ((vocab == nxt) | (vocab == nxt + 100)) & (t % self.every == 0)[..., None]
        return mx.where(tie, 20 + 1e-4 * logits, logits + self.boost * (vocab == nxt))


@pytest.mark.parametrize("arch", KINDS)
def test_near_tied_rows_are_confirmed_alone_and_exact(arch):
    overrides, boost = KINDS[arch]
    model = SometimesTied(tiny_model(arch, **overrides), boost)
    # Ties fall within drafts and after them (the last drafted token held, or no drafts at all).
    rows = [(CYCLE + [10, 11], 4), ([40, 41, 42], 1), (CYCLE[7:], 0), (CYCLE[3:], 2)]
    expected = [run(model, p, drafter=make_drafter(d), draft=d, max_tokens=24)[0] for p, d in rows]
    batch = Batch(model, max_rows=4)
    for i, (p, d) in enumerate(rows):
        batch.add(i, p, drafter=make_drafter(d), draft=d, max_tokens=24)
    got, confirmed = {i: [] for i in range(len(rows))}, 0
    for events in batch.run():
        for k, e in events:
            got[k] += getattr(e, "tokens", ())
            confirmed += getattr(e, "confirmed", False)
    assert [got[i] for i in range(len(rows))] == expected and confirmed > 0


def exact_while_one_leaves_and_one_joins(model, prompts: dict, settings, at: int, pricing=None) -> list:
    """Rows a, b and c through a batch of 3 (each with `settings(key)`, its cache kept), b
    cancelled and d added after step `at`: each emits what it emits alone (b: a start of it), and
    the kept caches hold what plain decoding leaves. Returns every Step."""
    expected = {k: run(model, p, **settings(k))[0] for k, p in prompts.items()}
    batch = Batch(model, max_rows=3, pricing=pricing)
    out, steps = {k: [] for k in prompts}, []
    for k in "abc":
        batch.add(k, prompts[k], keep_cache=True, **settings(k))
    for n, events in enumerate(batch.run()):
        for k, e in events:
            out[k] += getattr(e, "tokens", ())
            steps += [e] if hasattr(e, "queued") else []
        if n == at:
            batch.cancel("b")
            batch.add("d", prompts["d"], keep_cache=True, **settings("d"))
    assert all(out[k] == expected[k] for k in "acd") and out["b"] == expected["b"][: len(out["b"])]
    assert_kept_as_plain_decoding_leaves(model, batch, prompts, out)
    return steps


SEEDS = {"a": None, "b": 3, "c": None, "d": 5}  # greedy rows and seeded sampling ones


def selector(key: str):
    return make_selector(0 if SEEDS[key] is None else 0.7, seed=SEEDS[key])


@pytest.mark.parametrize("arch", KINDS)
def test_plain_passes_queued_behind_unread_ones_stay_exact(arch):
    # Rows that do not draft have a pass queued behind each one before it is read (issue 41): rows
    # near-tied there sit the queued pass out (their states taken back), rows that end or are
    # cancelled while one is queued leave kept caches as plain decoding leaves them, and a row
    # arriving waits for the queued pass.
    overrides, boost = KINDS[arch]
    model = SometimesTied(tiny_model(arch, **overrides), boost)
    prompts = {"a": CYCLE * 2 + [10, 11], "b": [40, 41, 42], "c": CYCLE[5:], "d": [11]}
    steps = exact_while_one_leaves_and_one_joins(
        model, prompts, lambda k: dict(draft=0, max_tokens=24, selector=selector(k)), at=6)
    # (A tie on a row with states unqueues two steps: 13-66 of 79 steps were queued.)
    assert sum(s.queued for s in steps) > len(steps) / 8 and sum(s.confirmed for s in steps) > 0


# Steps cost the same at any width, and queuing hides half of one: passes that carry drafts are
# queued behind drafting ones wherever a row's drafter expects its draft to hold.
FLAT = Pricing(Measured({b: {1: 1.0, 2: 1.01, 4: 1.02, 8: 1.04} for b in (1, 2, 4)}), overlap=0.5)


@pytest.mark.parametrize("arch", KINDS)
def test_drafting_passes_queued_behind_unread_ones_stay_exact(arch):
    # Every pass is queued behind the one in flight as if its drafts all hold: a row whose drafts
    # do not, or that is near-tied, sits the queued pass out (its entries and states taken back)
    # while the others keep theirs; rows that end or are cancelled while a drafting pass is queued
    # leave kept caches as plain decoding leaves them.
    overrides, boost = KINDS[arch]
    model = SometimesTied(tiny_model(arch, **overrides), boost)
    model.every = 11  # rarely: drafts of the cycle mostly hold
    prompts = {"a": CYCLE * 3 + [10, 11], "b": CYCLE[2:] * 2 + [40, 41], "c": CYCLE[5:] * 2,
               "d": [11] + CYCLE}
    steps = exact_while_one_leaves_and_one_joins(
        model, prompts, lambda k: dict(drafter=make_drafter(), draft=8, max_tokens=30, selector=selector(k)),
        at=5, pricing=FLAT)
    assert sum(s.queued and s.drafted > 0 for s in steps) >= 3 and sum(s.confirmed for s in steps) > 0


def test_a_model_whose_state_layers_read_padding_is_refused_by_name():
    with pytest.raises(InputError, match="cannot run in a batch: its state layers read the padding"):
        Batch(tiny_model("mamba"))
    # In low precision too, where batched and single-sequence states differ in more than the last bits.
    for arch, reads in (("mamba", True), ("mamba2", False)):
        model = tiny_model(arch)
        model.set_dtype(mx.bfloat16)
        assert (padding_unsupported(model) is not None) == reads


def test_a_new_batch_of_a_probed_model_probes_nothing_and_makes_no_caches(monkeypatch):
    # Every Batch (every batch_generate call) built three throwaway prompt caches and probed its
    # state layers again.
    import specgen.engine.batch.probe as batch_probe

    model = tiny_model("qwen3_next")
    Batch(model, max_rows=2)
    made = []
    real = batch_probe.make_prompt_cache
    monkeypatch.setattr(batch_probe, "make_prompt_cache", lambda m: made.append(m) or real(m))
    monkeypatch.setattr("specgen.engine.batch.batch.make_prompt_cache", lambda m: made.append(m) or real(m))
    batch = Batch(model, max_rows=2)
    assert made == [] and batch.rollback == Batch(model).rollback and batch.rollback.startswith("restore")


def test_the_server_probe_batches_these_kinds_and_names_what_it_refuses():
    from mlx_lm.models.cache import CacheList, KVCache, QuantizedKVCache

    from specgen.engine.batch.cache import unbatchable
    from specgen.engine.batch.probe import batch_unsupported

    for arch in [*KINDS, "mamba"]:
        why = batch_unsupported(tiny_model(arch))
        assert (why is None) == (arch != "mamba"), (arch, why)
    why = unbatchable([KVCache(), QuantizedKVCache(), CacheList(KVCache())])
    assert why == "its cache layers (CacheList, QuantizedKVCache) do not batch by per-row ends"


@pytest.mark.parametrize("arch", ["gemma3_text", "qwen3_next"])
def test_a_kept_cache_serves_the_next_turn_and_steps_are_priced(arch):
    # A server's next turn: the first turn's kept cache holds all but its last token.
    model = steered(arch)
    first = CYCLE * 2 + [10, 11]
    batch = Batch(model, max_rows=2, pricing=Pricing(measure(model, first, max_rows=2, budget_s=0.1)))
    batch.add("one", first, drafter=make_drafter(None), max_tokens=20, keep_cache=True)
    said = [t for events in batch.run() for _, e in events for t in getattr(e, "tokens", ())]
    second = first + said + [40, 41, 42]
    batch.add("two", second, drafter=make_drafter(None), max_tokens=30, prompt_cache=batch.kept.pop("one"),
              cached=len(first) + len(said) - 1)
    batch.add("new", CYCLE[4:], drafter=make_drafter(None), max_tokens=30)
    out = {"two": [], "new": []}
    for events in batch.run():
        for k, e in events:
            out[k] += getattr(e, "tokens", ())
    assert out["two"] == plain_tokens(model, second, 30) and out["new"] == plain_tokens(model, CYCLE[4:], 30)


def test_a_window_layer_holds_about_a_window_of_slots_and_rows_stay_exact(monkeypatch):
    monkeypatch.setattr(batch_kv, "GROW", 4)  # cut often (and grow by little)
    model = steered("gemma3_text")  # windows of 8
    rows = rows_of()
    expected = [solo(model, r) for r in rows]
    held, ends = [], []
    real = Batch.step

    def step(self):
        events = real(self)
        windows = [c for c in self.cache.layers if getattr(c, "window", None) and c.keys is not None]
        held.extend(c.keys.shape[2] for c in windows)
        ends.append(self.cache.slots.end)
        return events

    monkeypatch.setattr(Batch, "step", step)
    got, _, _ = batched(Batch(model, max_rows=3, prefill_chunk=16), rows, arrive=[0, 0, 2, 5], cancel={1: 6})
    assert got[0] == expected[0] and got[2] == expected[2] and got[3] == expected[3]
    # A row's last 9 entries span more slots where other rows' drafts were wider (or rejected),
    # but never the whole history (past 100 slots here, before compaction: never held whole);
    # a row alone holds its window, one entry and GROW or less.
    assert max(ends) > 100 > max(held) and held[-1] <= 8 + 1 + 2 * 4, (ends, held)
