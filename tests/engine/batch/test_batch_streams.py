"""Requests through the batch engine answer as `Engine.stream` answers each alone: the same
responses (text, tokens, finish reasons, stats), stop strings ending only their own row, the
cache a finished row hands over holding what the single-sequence cache holds; `run --prompts
--batch N` writes the results of one-at-a-time runs, in input order; the caches rows hand over
hold their own entries only (memory stays what the prompt cache counts)."""

import gc
import json

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models.cache import make_prompt_cache
from typer.testing import CliRunner

from specgen.cli.commands import app
from specgen.engine.batch.streams import Streams
from specgen.engine.engine import Engine, Request
from specgen.engine.options import Options
from specgen.stats import RunStats
from specgen.structured.formats import parse

STARTS = ["Once upon a time", "The little dog", "Tom and Sue went to the park", "One day, a bird",
          "Lily had a red ball", "The sun was hot"]


def settings():
    return [Options(max_tokens=40), Options(max_tokens=30, temp=0.7, seed=3), Options(max_tokens=50, draft=3),
            Options(max_tokens=40, stop=(".",)), Options(max_tokens=25, draft=0), Options(max_tokens=60)]


def seen(responses):
    """What a caller reads (which tokens came from drafts may differ: batched drafts are priced
    by rows)."""
    return [(r.text, r.token, r.finish_reason, r.generation_tokens) for r in responses]


def test_each_request_gets_the_responses_it_gets_alone(demo_engine):
    requests = [Request(demo_engine.encode(p), o) for p, o in zip(STARTS, settings())]
    alone, alone_stats = [], []
    for r in requests:
        stats = RunStats()
        alone.append(seen(demo_engine.stream(r, stats)))
        alone_stats.append(stats)
    streams = Streams(demo_engine, max_rows=3, prefill_chunk=4)
    runs = [streams.add(i, r) for i, r in enumerate(requests)]
    got = {i: [] for i in range(len(requests))}
    while streams.busy:
        for i, response in streams.step():
            got[i].append(response)
    assert [seen(got[i]) for i in range(len(requests))] == alone
    assert "." not in "".join(r.text for r in got[3]) and got[3][-1].finish_reason == "stop"
    for s, a in zip(runs, alone_stats):
        assert (s.output_ids, s.stop_reason, s.seed, s.draft_mode) == (a.output_ids, a.stop_reason, a.seed,
                                                                       a.draft_mode)
    assert len(streams) == 0


LARK = 'start: "Once upon a time, there was a " NAME " named " NAME ". " SENT\nNAME: /[a-z]+/\nSENT: /[A-Z][a-z ,]+\\./'


def mixed(engine) -> list[Request]:
    """Sixteen requests, each setting mixed in: greedy and seeded sampling (with filters), fixed,
    adaptive and no drafts, stop strings, a grammar (alone and sampled), a prediction."""
    grammar = parse({"type": "grammar", "grammar": LARK})
    story = "Once upon a time, there was a little girl named Lily. She liked to play in the park."
    kinds = [dict(), dict(temp=0.8, seed=1), dict(draft=3), dict(stop=(".", "park")), dict(draft=0),
             dict(temp=0.7, top_k=20, seed=2), dict(response_format=grammar), dict(temp=0.6, seed=4, stop=("!",)),
             dict(response_format=grammar, temp=0.5, seed=5), dict(draft=6, stop=("the",)), dict(min_p=0.1, temp=1.0, seed=6),
             dict(), dict(draft=1), dict(temp=0.9, top_p=0.9, seed=7), dict(stop=("and",)), dict()]
    return [Request(engine.encode(STARTS[i % len(STARTS)] + " and" * (i // len(STARTS))),
                    Options(max_tokens=20 + 3 * i, **kw), prediction=story if i in (0, 11, 15) else None)
            for i, kw in enumerate(kinds)]


@pytest.mark.parametrize("rows", [1, 2, 4, 16])
def test_mixed_requests_through_a_batch_of_any_size_are_the_single_streams_token_for_token(demo_engine, rows):
    requests = mixed(demo_engine)
    alone = []
    for r in requests:
        stats = RunStats()
        responses = list(demo_engine.stream(r, stats))
        alone.append((stats.output_ids, "".join(x.text for x in responses), responses[-1].finish_reason))
    streams = Streams(demo_engine, max_rows=rows)
    runs = [streams.add(i, r) for i, r in enumerate(requests)]
    got = {i: [] for i in range(len(requests))}
    while streams.busy:
        for i, response in streams.step():
            got[i].append(response)
    together = [(s.output_ids, "".join(x.text for x in got[i]), got[i][-1].finish_reason)
                for i, s in enumerate(runs)]
    assert together == alone
    assert {f for _, _, f in alone} == {"stop", "length"}
    # A lone row speculates as it does alone (in wider batches that depends on what steps cost here).
    assert rows > 1 or sum(s.counts.accepted for s in runs) > 0


def test_a_grammar_on_a_model_where_speculation_is_off_is_not_priced_by_rows(demo_engine):
    # Pricing rows means measuring batched steps (a minute on a busy CPU): a model whose curve
    # turned speculation off never drafts but for a grammar's forced tokens, priced as alone.
    engine = Engine(demo_engine.loaded)
    engine._costs = demo_engine.costs()._replace(off="verifying costs too much here")
    request = Request(engine.encode("Once"), Options(max_tokens=30, response_format=parse({"type": "grammar",
                                                                                          "grammar": LARK})))
    alone = "".join(r.text for r in engine.stream(request, RunStats()))
    streams = Streams(engine, max_rows=2)
    streams.add(0, request)
    streams.add(1, Request(engine.encode("The little dog"), Options(max_tokens=10)))
    got = {0: "", 1: ""}
    while streams.busy:
        for i, response in streams.step():
            got[i] += response.text
    assert streams.batch.pricing is None and got[0] == alone and alone.startswith("Once upon a time, there was a")


def test_a_finished_row_hands_over_the_cache_a_single_run_leaves(demo_engine):
    ids = demo_engine.encode("Once upon a time")
    solo_cache = make_prompt_cache(demo_engine.loaded.model)
    stats = RunStats()
    list(demo_engine.stream(Request(ids, Options(max_tokens=30), prompt_cache=solo_cache), stats))
    streams = Streams(demo_engine, max_rows=2)
    streams.add("other", Request(demo_engine.encode("The little dog"), Options(max_tokens=50, draft=4)))
    streams.add("kept", Request(ids, Options(max_tokens=30)), keep_cache=True)
    while streams.busy:
        streams.step()
    kept = streams.kept("kept")
    assert kept[0].offset == solo_cache[0].offset == len(ids) + len(stats.output_ids) - 1
    for ours, theirs in zip(kept, solo_cache):
        n = theirs.offset
        assert np.allclose(np.array(ours.keys[..., :n, :]), np.array(theirs.keys[..., :n, :]), atol=1e-5)
    assert streams.kept("kept") is None  # handed over once


def same_cache(ours, ids, output_ids, engine) -> None:
    """`ours` holds what a single run's cache holds after emitting `output_ids` (greedy, so the run
    of that many tokens emits them): the prompt and output but the last token."""
    solo = make_prompt_cache(engine.loaded.model)
    stats = RunStats()
    list(engine.stream(Request(ids, Options(max_tokens=len(output_ids)), prompt_cache=solo), stats))
    assert stats.output_ids == output_ids
    assert ours[0].offset == solo[0].offset == len(ids) + len(output_ids) - 1
    for mine, theirs in zip(ours, solo):
        n = theirs.offset
        assert np.allclose(np.array(mine.keys[..., :n, :]), np.array(theirs.keys[..., :n, :]), atol=1e-5)


def test_a_row_ended_by_a_stop_string_hands_over_its_cache(demo_engine):
    ids = demo_engine.encode(STARTS[4])
    streams = Streams(demo_engine, max_rows=2)
    streams.add("other", Request(demo_engine.encode("The little dog"), Options(max_tokens=50)))
    stats = streams.add("kept", Request(ids, Options(max_tokens=40, stop=(".",))), keep_cache=True)
    while streams.busy:
        streams.step()
    assert stats.stop_reason == "stop" and stats.stop_token is None  # the stop string ended it
    same_cache(streams.kept("kept"), ids, stats.output_ids, demo_engine)


def test_a_cancelled_row_hands_back_its_cache(demo_engine):
    ids = demo_engine.encode(STARTS[0])
    streams = Streams(demo_engine, max_rows=2)
    streams.add("other", Request(demo_engine.encode("The little dog"), Options(max_tokens=50)))
    stats = streams.add("kept", Request(ids, Options(max_tokens=40)), keep_cache=True)
    assert streams.cancel("nothing") is None
    while len(stats.output_ids) < 8:
        streams.step()
    kept = streams.cancel("kept")
    assert stats.stop_reason is None and streams.kept("kept") is None  # handed back, once
    same_cache(kept, ids, stats.output_ids, demo_engine)
    waiting = Streams(demo_engine, max_rows=1)
    waiting.add("w", Request(ids, Options(max_tokens=5)), keep_cache=True)
    assert waiting.cancel("w") is None  # never prefilled: nothing a run would leave


def test_cancelling_one_request_leaves_the_others(demo_engine):
    requests = [Request(demo_engine.encode(p), Options(max_tokens=30)) for p in STARTS[:3]]
    alone = [seen(demo_engine.stream(r)) for r in requests]
    streams = Streams(demo_engine, max_rows=3)
    for i, r in enumerate(requests):
        streams.add(i, r)
    got, step = {i: [] for i in range(3)}, 0
    while streams.busy:
        if step == 4:
            streams.cancel(1)
        for i, response in streams.step():
            got[i].append(response)
        step += 1
    assert seen(got[0]) == alone[0] and seen(got[2]) == alone[2]
    assert 0 < len(got[1]) < len(alone[1])


@pytest.mark.usefixtures("quick_calibration")
def test_run_prompts_batched_writes_what_one_at_a_time_writes_in_input_order(tmp_path, monkeypatch):
    source = tmp_path / "in.jsonl"
    lines = [json.dumps({"id": f"p{i}", "prompt": p, "max_tokens": 20 + 7 * i}) for i, p in enumerate(STARTS)]
    source.write_text("\n".join(lines[:2] + ["{not json"] + lines[2:]) + "\n")
    rows, step = [], Streams.step
    monkeypatch.setattr(Streams, "step", lambda self: rows.append(len(self.batch.rows)) or step(self))
    out = {}
    for batch in ("1", "4"):
        rows.clear()
        r = CliRunner().invoke(app, ["run", "--prompts", str(source), "--batch", batch],
                               env={"HF_HUB_OFFLINE": "1", "SPECGEN_MODEL": "demo"})
        assert r.exit_code == 1, r.output  # the bad line is a failed result; the others run
        assert "one at a time" not in r.stderr
        out[batch] = [json.loads(x) for x in r.stdout.splitlines()]
        assert max(rows, default=0) == (4 if batch == "4" else 0)  # --batch 4 decodes four together
    ids = [x.get("id") for x in out["4"]]
    assert ids == ["p0", "p1", None, "p2", "p3", "p4", "p5"] and "error" in out["4"][2]
    assert [x.get("text") for x in out["4"]] == [x.get("text") for x in out["1"]]
    assert [x.get("generated_tokens") for x in out["4"]] == [x.get("generated_tokens") for x in out["1"]]



def test_the_caches_finished_rows_hand_over_hold_only_their_own_entries(demo_engine):
    # A lazy copy kept the whole batch buffer alive behind a cache the prompt cache counts as one
    # row's (and made the next step's writes copy it): 18x these caches' bytes here.
    gc.collect()
    mx.clear_cache()
    before = mx.get_active_memory()
    streams = Streams(demo_engine, max_rows=6)
    for i, start in enumerate(STARTS):
        streams.add(i, Request(demo_engine.encode(start), Options(max_tokens=20 + 10 * i)), keep_cache=True)
    kept = {}
    while streams.busy:
        for key, response in streams.step():
            if response.finish_reason:
                kept[key] = streams.kept(key)
    del streams
    gc.collect()
    mx.clear_cache()
    held = sum(layer.nbytes for cache in kept.values() for layer in cache)
    assert len(kept) == len(STARTS) and 0 < mx.get_active_memory() - before < 2 * held
