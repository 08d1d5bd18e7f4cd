"""The batch engine (continuous batching with per-sequence speculation): rows arriving at
different steps, with their own drafts, lengths, seeds and stops, each emit exactly what the same
request alone emits, with one forward pass over every active row a step; cancelled rows leave the
others exact; caches that cannot batch are refused by name."""

import mlx.core as mx
import pytest
from conftest import TINY, run, tiny_model
from mlx_lm.models.cache import make_prompt_cache

from specgen.draft.drafter import make_drafter
from specgen.engine.batch import cache as batch_cache
from specgen.engine.batch.batch import Batch
from specgen.engine.batch.cache import unbatchable
from specgen.engine.cost import grid
from specgen.engine.cost.batch import Pricing
from specgen.engine.cost.grid import Measured, load_or_measure, measure
from specgen.engine.cost.store import batch_calibration_file, entry_key, read_store, save_entry
from specgen.engine.decode.sampling import make_selector
from specgen.errors import InputError
from specgen.events import Prefilled, Step

STORY = "Once upon a time, there was a little girl named Lily. She loved to play outside. One day, Lily"


class Counted:
    """A model that counts its forward passes (each a call, however many rows and positions)."""

    def __init__(self, model):
        self.model, self.layers, self.passes = model, model.layers, 0

    def __call__(self, x, cache):
        self.passes += 1
        return self.model(x, cache=cache)


def rows_of(tokenizer, stops):
    """Requests unlike each other: drafts adaptive, fixed or none; greedy or seeded; lengths."""
    prompts = [STORY, "Tim and Sam", STORY + " went to the park. " + STORY, "Bob"]
    return [
        dict(prompt=tokenizer.encode(p), max_tokens=n, stop_tokens=stops, draft=d,
             selector=make_selector(0.8, seed=i) if i % 2 else make_selector(0), adaptive=d == 64)
        for i, (p, n, d) in enumerate(zip(prompts, (90, 60, 70, 40), (64, 4, 64, 0)))
    ]


def solo(model, row) -> list[int]:
    tokens, _, _ = run(model, row["prompt"], drafter=make_drafter(None if row["adaptive"] else row["draft"]),
                       draft=row["draft"], max_tokens=row["max_tokens"], stop_tokens=row["stop_tokens"],
                       selector=row["selector"])
    return tokens


def batched(batch: Batch, rows: list[dict], arrive: list[int], cancel: dict[int, int] | None = None):
    """Run `rows` through `batch`, row i added before step arrive[i] (and cancelled before step
    cancel[i]); (tokens by row, steps that decoded, Step events by row)."""
    out = {i: [] for i in range(len(rows))}
    events = {i: [] for i in range(len(rows))}
    step = decoded = 0
    while step <= max(arrive) or batch.busy:
        for i, at in enumerate(arrive):
            if at == step:
                r = rows[i]
                batch.add(i, r["prompt"], drafter=make_drafter(None if r["adaptive"] else r["draft"]),
                          draft=r["draft"], max_tokens=r["max_tokens"], stop_tokens=r["stop_tokens"],
                          selector=r["selector"])
        for i, at in (cancel or {}).items():
            if at == step:
                assert batch.cancel(i)
        stepped = batch.step()
        for key, event in stepped:
            if isinstance(event, Step):
                out[key] += event.tokens
                events[key].append(event)
        decoded += any(isinstance(e, Step) for _, e in stepped)
        step += 1
    return out, decoded, events


# Steps of more rows cost more per position: drafts are priced by rows and cut to the step's width.
STEEPER = Pricing(Measured({1: {1: 1.0, 2: 1.05, 4: 1.1, 8: 1.2}, 2: {1: 1.0, 2: 1.3, 4: 1.8, 8: 3.0},
                            4: {1: 1.0, 2: 1.4, 4: 2.2, 8: 4.0}}))


@pytest.mark.parametrize("pricing", [None, STEEPER], ids=["own-costs", "priced-by-rows"])
def test_staggered_rows_each_emit_what_they_emit_alone(stories, pricing):
    rows = rows_of(stories.tokenizer, stories.stop_ids)
    expected = [solo(stories.model, r) for r in rows]
    model = Counted(stories.model)
    batch = Batch(model, max_rows=3, prefill_chunk=8, pricing=pricing)
    model.passes = 0  # (the first batch of a model probes it: engine/batch/probe.py)
    got, decoded, events = batched(batch, rows, arrive=[0, 0, 3, 5])
    assert [got[i] for i in range(len(rows))] == expected
    # The story repeats: drafts held (fewer where steps of 2 and 3 rows are dear: 7, against 26).
    assert sum(s.accepted for s in events[0] + events[2]) > (10 if pricing is None else 5)
    assert sum(s.drafted > s.accepted for e in events.values() for s in e) > 0  # and some did not
    # One pass a step over every active row, plus prefill chunks and near-tie confirmations, and
    # a plain pass queued behind the last step where the batch emptied. Prompts take the entries
    # others computed for their first tokens (share.py): the second, the shortest, prefills first;
    # the first and the fourth take its first token (every prompt opens with BOS); the third
    # opens with the first prompt and takes all of its entries.
    first, third = rows[0]["prompt"], rows[2]["prompt"]
    shared = min(len(first) - 1, next((i for i, (a, b) in enumerate(zip(first, third)) if a != b), len(first)))
    taken = [1, 0, shared, 1]
    assert shared > 8 and batch.sharing.tokens == sum(taken)
    chunks = sum(-(-(len(r["prompt"]) - 1 - t) // 8) for r, t in zip(rows, taken))
    confirmed = sum(s.confirmed for e in events.values() for s in e)
    assert model.passes == decoded + chunks + confirmed + batch.wasted


def test_a_cancelled_row_leaves_the_others_exact(stories):
    rows = rows_of(stories.tokenizer, stories.stop_ids)
    expected = [solo(stories.model, r) for r in rows]
    got, _, _ = batched(Batch(stories.model, max_rows=4), rows, arrive=[0, 0, 0, 0], cancel={2: 6, 3: 0})
    assert got[0] == expected[0] and got[1] == expected[1]
    assert 0 < len(got[2]) < len(expected[2]) and got[3] == []


def test_a_short_prompt_is_not_stuck_behind_a_long_prefill(stories):
    batch = Batch(stories.model, max_rows=4, prefill_chunk=16)
    long = stories.tokenizer.encode(" ".join([STORY] * 6))
    batch.add("long", long, max_tokens=4)
    batch.step()  # the long prompt's first chunk
    batch.add("short", stories.tokenizer.encode("Bob"), max_tokens=4)
    first = [k for k, e in batch.step() if isinstance(e, Step)]
    assert first == ["short"]  # its first token, one chunk after it came, while "long" still prefills


def test_short_prompts_join_together_within_one_chunk(stories):
    batch = Batch(stories.model, max_rows=3, prefill_chunk=16)
    for i, p in enumerate(["Tim and Sam", "Bob", "Lily had a red ball", "The sun"]):
        batch.add(i, stories.tokenizer.encode(p), max_tokens=3)
    first = batch.step()
    joined = [k for k, e in first if isinstance(e, Prefilled)]
    assert len(joined) == 3 and sorted(k for k, e in first if isinstance(e, Step)) == sorted(joined)


def test_a_long_prompt_is_not_starved_by_a_stream_of_short_ones(stories):
    batch = Batch(stories.model, max_rows=8, prefill_chunk=8)
    long = stories.tokenizer.encode(" ".join([STORY] * 6))
    batch.add("long", long, max_tokens=1)
    joined = None
    for step in range(100):
        batch.add(step, stories.tokenizer.encode("Bob"), max_tokens=1)
        if any(k == "long" and isinstance(e, Prefilled) for k, e in batch.step()):
            joined = step
            break
    # It waits about as many steps as it has chunks, then takes a chunk every step.
    assert joined is not None and joined < 3 * len(long) // 8


def test_holes_are_compacted_and_rows_stay_exact(stories, monkeypatch):
    monkeypatch.setattr(batch_cache, "GROW", 8)  # compact soon; fixed 8-token drafts leave holes
    rows = rows_of(stories.tokenizer, stories.stop_ids)
    for r in rows:
        r.update(draft=8, adaptive=False)
    expected = [solo(stories.model, r) for r in rows]
    compactions = []
    real = batch_cache.RaggedBatch.compact
    monkeypatch.setattr(batch_cache.RaggedBatch, "compact", lambda self, **kw: compactions.append(1) or real(self, **kw))
    got, _, _ = batched(Batch(stories.model, max_rows=4), rows, arrive=[0, 1, 2, 3])
    assert [got[i] for i in range(len(rows))] == expected and compactions


def test_a_leaving_row_is_freed_in_place_and_taken_by_the_next_to_join(stories, monkeypatch):
    # Copying every row's entries whenever one left cost up to a second a leave at 16 rows.
    rows = rows_of(stories.tokenizer, stories.stop_ids)
    expected = [solo(stories.model, r) for r in rows]
    copies, sizes = [], []
    real_compact, real_step = batch_cache.RaggedBatch.compact, Batch.step
    monkeypatch.setattr(batch_cache.RaggedBatch, "compact", lambda self, **kw: copies.append(self.rows) or real_compact(self, **kw))

    def step(self):
        events = real_step(self)
        sizes.append(self.cache.rows)
        return events

    monkeypatch.setattr(Batch, "step", step)
    got, _, _ = batched(Batch(stories.model, max_rows=3), rows, arrive=[0, 0, 0, 0])
    assert [got[i] for i in range(len(rows))] == expected
    # The fourth joined the row the first to finish left; the buffer was copied smaller only
    # once half its rows were free, and never had more rows than sequences at once.
    assert max(sizes) == 3 and copies == [3] and sizes[-2] == 1


class Tied:
    """A model whose every position is an exact tie between two tokens (greedy takes the lower):
    every batched row is near-tied, so each is chosen again by a one-position pass alone."""

    def __init__(self, vocab: int = 16):
        self.layers = [None]
        self.vocab = vocab

    def __call__(self, x, cache):
        b, n = x.shape
        cache[0].update_and_fetch(mx.zeros((b, 1, n, 1)), mx.zeros((b, 1, n, 1)))
        nxt = (x.astype(mx.int32) + 1) % self.vocab
        hot = mx.arange(self.vocab)[None, None, :] == nxt[..., None]
        return mx.where(hot, 1.0, 0.0) + mx.where(mx.arange(self.vocab) == (nxt[..., None] + 3) % self.vocab, 1.0, 0.0)


def test_near_tied_rows_are_confirmed_alone_and_exact():
    model = Tied()
    prompts = [[1, 2, 3, 4, 5, 6, 7, 8, 1, 2, 3], [5, 6], [9, 10, 11]]
    expected = [run(model, p, drafter=make_drafter(4), draft=4, max_tokens=12)[0] for p in prompts]
    batch = Batch(model, max_rows=3)
    for i, p in enumerate(prompts):
        batch.add(i, p, drafter=make_drafter(4), draft=4, max_tokens=12)
    got, confirmed = {i: [] for i in range(3)}, 0
    for events in batch.run():
        for k, e in events:
            if isinstance(e, Step):
                got[k] += e.tokens
                confirmed += e.confirmed
    assert [got[i] for i in range(3)] == expected and confirmed > 0


REFUSED = {"mamba": "its state layers read the padding"}  # Mamba 1 ignores per-row lengths


@pytest.mark.parametrize("arch", sorted(TINY))
def test_each_cache_type_batches_exactly_or_is_refused_by_name(arch):
    model = tiny_model(arch)
    prompts = [[10, 11, 12, 13, 10, 11, 12, 13, 10, 11], [40, 41], [7] * 20]
    assert unbatchable(make_prompt_cache(model)) is None
    if arch in REFUSED:
        with pytest.raises(InputError, match=f"cannot run in a batch: {REFUSED[arch]}"):
            Batch(model)
        return
    expected = [run(model, p, drafter=make_drafter(4), draft=4, max_tokens=30)[0] for p in prompts]
    batch = Batch(model, max_rows=2, prefill_chunk=4)
    for i, p in enumerate(prompts):
        batch.add(i, p, drafter=make_drafter(4), draft=4, max_tokens=30)
    got = {i: [] for i in range(3)}
    for events in batch.run():
        for k, e in events:
            got[k] += getattr(e, "tokens", ())
    assert [got[i] for i in range(3)] == expected


def test_events_read_as_a_single_sequence_run(stories):
    batch = Batch(stories.model)
    batch.add("a", stories.tokenizer.encode(STORY), max_tokens=5, draft=0)
    seen = [e for events in batch.run() for _, e in events]
    assert isinstance(seen[0], Prefilled) and not seen[0].speculation.on
    assert [len(e.tokens) for e in seen[1:]] == [1] * 5 and seen[-1].stop_reason == "max_tokens"
    with pytest.raises(InputError, match="prompt is empty"):
        batch.add("b", [])


def test_pricing_drafts_where_a_wider_step_pays_and_not_where_it_does_not(stories):
    price = Pricing(Measured({1: {1: 1.0, 2: 1.1, 4: 1.3, 8: 1.8}, 8: {1: 2.0, 2: 4.0, 4: 8.0}}))
    assert price.drafting(1)(3) == pytest.approx(1.3) and price.drafting(1)(1) == pytest.approx(1.1)
    # Dearer sizes (the largest timed and past it): no drafts, plain steps.
    assert price.drafting(8) is None and price.drafting(64) is None
    assert price.step(8)(1) == pytest.approx(2.0)
    # Between two timed sizes, the line through them: 2 rows are a seventh of the way to 8.
    assert price.step(2)(1) == pytest.approx((1.1 + 2.9 / 7) / (1 + 1 / 7))
    assert price.drafting(7) is None
    measured = measure(stories.model, stories.tokenizer.encode(STORY), max_rows=4, budget_s=0.5)
    assert sorted(measured.grid) == [1, 2, 4]
    assert all(row[1] > 0 and len(row) >= 2 for row in measured.grid.values())
    # Attention over the longer buffer costs something: a fit that found nothing (both clamped to 0) is wrong.
    assert measured.slot_s + measured.position_slot_s > 0


def test_rows_priced_dear_still_draft_where_their_drafters_trust_a_copy(stories):
    # The proxy's grid at 4 rows (a step of 2 positions 1.3 plain ones) with queued plain steps
    # 15% cheaper: at an acceptance of one in two, which a row has until it drafts, no width pays,
    # so rows that would copy their prompt whole never drafted. Each row's draft is worth what
    # its drafter says (it trusts a copy), and what it emits is what it emits alone.
    dear = Pricing(Measured({1: {1: 1.0, 2: 1.05, 4: 1.1, 8: 1.2}, 4: {1: 1.0, 2: 1.3, 4: 1.93, 8: 3.15}}),
                   overlap=0.15)
    text = ("Once upon a time, there was a little girl named Lily. She loved to play outside in the "
            "sun. One day, she saw a big red ball in the park.")
    story = stories.tokenizer.encode(" ".join([text] * 3))
    rows = [dict(prompt=story + story[: 3 * i], max_tokens=60, stop_tokens=frozenset(), draft=64,
                 selector=make_selector(0), adaptive=True) for i in range(4)]
    got, _, events = batched(Batch(stories.model, max_rows=4, pricing=dear), rows, arrive=[0] * 4)
    assert sum(s.accepted for e in events.values() for s in e) > 40
    assert [got[i] for i in range(4)] == [solo(stories.model, r) for r in rows]


def test_drafts_that_pay_over_a_short_cache_do_not_over_a_long_one():
    # Every row attends over the whole buffer: each slot adds to a wide step more than to a plain one.
    curve = {1: 1.0, 2: 1.1, 4: 1.3, 8: 1.8}
    price = Pricing(Measured({1: curve, 2: curve}, slot_s=0.0, position_slot_s=2e-4))
    assert 1.1 < price.drafting(2, 32)(1) < 1.2
    assert price.step(2, 4096)(1) > 1.5 and price.drafting(2, 4096) is None
    assert Pricing(Measured({1: curve, 2: curve})).drafting(2, 4096)(1) == pytest.approx(1.1)


def test_a_grid_covers_every_row_count_of_the_batch_and_is_read_back(stories, monkeypatch, tmp_path):
    monkeypatch.setenv("SPECGEN_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(grid, "BUDGET_S", 0.0)  # the fewest rounds, as on a slow machine
    measured = []
    first, _ = load_or_measure(stories.model, "m", stories.tokenizer, 8,
                               before_measuring=lambda: measured.append(1))
    # Even with no budget to spare: a size left out would be priced as a smaller one. Its
    # passes may be fed flat: so are steps timed, at every size of more than one row.
    assert sorted(first.grid) == [1, 2, 4, 8] and sorted(first.flat) == [2, 4, 8] and measured == [1]
    for rows in (2, 5, 8):
        again, _ = load_or_measure(stories.model, "m", stories.tokenizer, rows,
                                   before_measuring=lambda: measured.append(2))
        assert again == first and measured == [1]
    # Twelve rows are priced between eight and sixteen: the grid gains sixteen.
    more, _ = load_or_measure(stories.model, "m", stories.tokenizer, 12,
                              before_measuring=lambda: measured.append(3))
    assert sorted(more.grid) == [1, 2, 4, 8, 16] and measured == [1, 3]
    # A grid cached before flat steps were timed is timed again, not priced as padded.
    path, key = batch_calibration_file(), entry_key("m")
    save_entry(path, key, {k: v for k, v in read_store(path)[key].items() if k != "flat"})
    again, _ = load_or_measure(stories.model, "m", stories.tokenizer, 12,
                               before_measuring=lambda: measured.append(4))
    assert measured == [1, 3, 4] and sorted(again.flat) == [2, 4, 8, 16]

def test_a_dropped_long_prompt_leaves_the_batch_between_layers_and_the_others_go_on():
    model = tiny_model("llama", num_hidden_layers=6)
    asked = []
    long_prompt = list(range(1, 401))
    batch = Batch(model, max_rows=2)
    batch.add("kept", [5, 6, 7], draft=0, max_tokens=6)
    events = batch.step()  # the short prompt joins and decodes
    batch.add("dropped", long_prompt, draft=0, max_tokens=6, cancelled=lambda: asked.append(1) or len(asked) >= 3)
    while batch.busy:
        events += batch.step()
    assert len(asked) == 3 and not any(key == "dropped" for key, _ in events)
    kept = [t for key, e in events if key == "kept" and isinstance(e, Step) for t in e.tokens]
    assert kept == run(model, [5, 6, 7], draft=0, max_tokens=6)[0]
