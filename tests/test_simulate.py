import json
import multiprocessing
import random

import pytest
from typer.testing import CliRunner

from conftest import SHARED, run
from specgen import drafter as D
from specgen.cli import app
from specgen.drafter import (MATCH_CAP, AdaptiveDrafter, Calibration, Hazards, Substitutions,
                             make_drafter, prior)
from specgen.memory import NGramMemory
from specgen.predictor import NGramPredictor, context_keys
from specgen.simulate import replay

runner = CliRunner()
CYCLE_PROMPT = [1, 2, 3, 4] * 2


def test_replay_counts_steps_exactly_with_the_fixed_drafter():
    t = replay(CYCLE_PROMPT, [1, 2, 3, 4] * 5, NGramPredictor(), draft=4, beta=0.1)
    assert (t.steps, t.drafted, t.accepted) == (4, 16, 16)
    assert t.cost == pytest.approx(4 * 1.4)
    # The model deviates (4 -> 5): the same steps as the scripted-model decode test.
    t = replay(CYCLE_PROMPT, [5, 1, 2, 3, 4, 5, 1], NGramPredictor(), draft=4, beta=0.1)
    assert (t.steps, t.drafted, t.accepted) == (3, 8, 4)
    # A measured cost curve (as benchmarks/emulated.py predicts with) replaces 1 + beta * k.
    curve = {0: 1.0, 4: 1.5}
    t = replay(CYCLE_PROMPT, [1, 2, 3, 4] * 5, NGramPredictor(), draft=4, beta=0.1, cost=curve.get)
    assert (t.steps, t.cost) == (4, 4 * 1.5)


def test_queued_steps_and_plain_decoding_cost_less_by_the_overlap():
    # 5 is new: its step drafts [1 2 3 4] and misses; nothing follows 5 yet, so the step that
    # emits 1 drafts nothing and the next (emitting 2) is queued ahead; then [3 4 5] is accepted.
    t = replay(CYCLE_PROMPT, [5, 1, 2, 3, 4, 5, 1], NGramPredictor(), draft=4, beta=0.1,
               pipeline_after=1, overlap=0.25)
    assert (t.steps, t.drafted, t.accepted) == (4, 7, 3)
    assert t.cost == pytest.approx(1.4 + 1 + 0.75 + 1.3)
    assert t.plain_cost == pytest.approx(7 * 0.75)  # mlx-lm queues every step
    assert t.to_dict()["predicted_speedup"] == round(5.25 / 4.45, 4)


def test_tokens_past_the_end_of_the_output_never_match():
    # Drafts [2, 3, 4, 1] but the output ends after 2, 3: two accepted, no bonus token.
    t = replay(CYCLE_PROMPT + [1], [2, 3], NGramPredictor(), draft=4, beta=0.1, max_tokens=10)
    assert (t.steps, t.accepted, t.output_tokens) == (1, 2, 2)


def test_drafts_cut_off_by_a_stop_are_not_counted_as_misses():
    d = AdaptiveDrafter()
    d.update_batch(list(range(10, 60)) + list(range(10, 20)))
    drafts = d.predict(8)
    assert drafts[:3] == [20, 21, 22]
    d.update_batch(drafts[:2])  # the run stopped after two accepted drafts
    acc, _, judged = d.calibration.counts["copy"]
    assert (acc, judged) == (2, 2)


def test_adaptive_drafter_copies_long_spans_and_skips_novel_text():
    rng = random.Random(1)
    code = [rng.randrange(3, 30000) for _ in range(400)]
    copy = replay(code, code, AdaptiveDrafter(), draft=64, beta=0.08)
    fixed = replay(code, code, NGramPredictor(), draft=4, beta=0.08)
    assert copy.steps <= 25 and copy.steps < fixed.steps / 3
    novel = replay(code, [rng.randrange(3, 30000) for _ in range(400)], AdaptiveDrafter(),
                   draft=64, beta=0.08)
    assert novel.drafted <= 20 and novel.output_tokens / novel.cost > 0.99


def test_a_few_misses_move_copies_far_more_than_ngrams():
    # A request's own evidence quickly overrides the copy priors, but barely the n-gram ones.
    cal = Calibration()
    ngram, copy = ("ngram", 4, 2, 4), ("copy", 32, True, False)
    for _ in range(10):
        cal.record(ngram, False)
        cal.record(copy, False)
    assert cal.q(ngram) > 0.8 * prior(ngram)
    assert cal.q(copy) < 0.5 * prior(copy)


def test_long_copies_are_rescaled_apart_from_short_ones_and_realignments():
    cal = Calibration()
    long, short, realign = ("copy", MATCH_CAP + 1, True, False), ("copy", 8, True, False), ("realign", 0)
    for _ in range(10):
        cal.record(long, False)
    assert cal.q(long) < 0.6
    assert (cal.q(short), cal.q(realign)) == pytest.approx((prior(short), prior(realign)))
    for _ in range(10):
        cal.record(realign, False)  # realigning is a kind of (short) copy
    assert cal.q(short) < 0.6 * prior(short)


def test_ngrams_seen_once_are_rescaled_apart_from_the_others():
    # In an edit, n-grams seen once follow the prompt being copied: their hits must not make
    # the request trust its frequent n-grams more (nor the other way round).
    d = AdaptiveDrafter()
    d.update_batch([10, 11, 12, 13, 14] + [20, 21, 22] * 4)
    once = d._ngram(context_keys([10, 11, 12], 3))
    often = d._ngram(context_keys([20, 21, 22], 3))
    assert (once[0], once[1][0], often[0], often[1][0]) == (13, "ngram1", 20, "ngram")
    for _ in range(200):
        d.calibration.record(once[1], True)
    assert d._ngram(context_keys([10, 11, 12], 3))[2] > once[2] + 0.2
    assert d._ngram(context_keys([20, 21, 22], 3))[2] == often[2]


@pytest.mark.parametrize("seen_in_memory, expected", [(2, 13), (10, 99)])
def test_when_the_request_and_memory_disagree_the_counts_of_both_decide(seen_in_memory, expected):
    # The request saw (10, 11, 12) -> 13 once; memory saw it followed by 99 two or ten times.
    # A 3-token context weighs 2^4, the request's own twice that; counts are smoothed by
    # SUPPORT_SMOOTH = 2: 32*1/3 = 10.7 for 13, against 16*2/4 = 8 or 16*10/12 = 13.3 for 99.
    # Memory's larger count alone used to win both.
    mem = NGramMemory("m")
    for _ in range(seen_in_memory):
        mem.add([10, 11, 12, 99])
    d = AdaptiveDrafter(memory=mem)
    d.update_batch([10, 11, 12, 13, 5])
    picked = d._ngram(context_keys([10, 11, 12], 3))
    assert picked[0] == expected
    assert picked[1][0] == ("ngram1" if expected == 13 else "memory")  # its own source's q


def _renamed(seed=2):
    """Random 'code' in which token 7 occurs every 40 tokens, and the output: all of it, with 7
    renamed to 8."""
    rng = random.Random(seed)
    code = [rng.randrange(9, 30000) for _ in range(400)]
    for i in range(20, 400, 40):
        code[i] = 7
    return code, [8 if t == 7 else t for t in code]


def test_substitutions_are_confirmed_by_the_source_resuming_and_dropped_when_kept():
    s = Substitutions()
    source = [10, 11, 12, 13]
    s.broke(1, 11, 99, substituted=False)
    s.resumed(source, 11)  # the output went on with 11 itself: 99 was inserted, not a substitute
    s.broke(1, 11, 99, substituted=False)
    s.resumed(source, 12)  # the source went on past 11: 99 replaced it, confirmed once
    assert s.forward == {}
    s.broke(1, 11, 99, substituted=False)
    s.resumed(source, 12)
    assert s.forward == {11: 99} and s.back == {99: 11}
    s.broke(3, 11, 11, substituted=True)  # a copy drafted 99 for 11, but the output kept 11
    assert s.forward == {} and s.back == {}


def test_copies_read_through_a_rename(monkeypatch):
    # Each renamed token breaks the copy until the rename has been confirmed twice; after that,
    # copies match through it, stop right before it, and the step's own token is the new name.
    code, renamed = _renamed()
    d = AdaptiveDrafter()
    t = replay(code, renamed, d, draft=64, beta=0.08)
    assert (t.steps, t.drafted, t.accepted) == (20, 417, 380)
    assert d.substitutions.forward == {7: 8}
    monkeypatch.setattr(D, "SUBST_SEEN", 10**9)
    assert replay(code, renamed, AdaptiveDrafter(), draft=64, beta=0.08).steps == 30


def test_copies_draft_the_substitute_once_it_has_been_accepted():
    code, renamed = _renamed()
    d = AdaptiveDrafter()
    d.update_batch(code)
    d.update_batch(renamed[:100])  # the output so far, with the rename confirmed twice:
    d.substitutions.forward, d.substitutions.back = {7: 8}, {8: 7}
    d.calibration.set_counts("subst", [50, 20, 50])  # substitutes drafted so far were accepted
    drafts = d.predict(64)
    assert len(drafts) > 10 and drafts == renamed[100:100 + len(drafts)]  # 8 first, then the copy


def _steps(prompt, out):
    """(kind of evidence of the first draft, or None, drafted, accepted) of each step of a replay."""
    d, steps = AdaptiveDrafter(), []
    predict, update_batch = d.predict, d.update_batch

    def spied_predict(n):
        drafts = predict(n)
        steps.append([d._last[1][0][0] if drafts else None, len(drafts), None])
        return drafts

    def spied_update(tokens):
        if steps and steps[-1][2] is None:
            steps[-1][2] = len(tokens) - 1  # a step emits what it accepted plus one
        update_batch(tokens)

    d.predict, d.update_batch = spied_predict, spied_update
    replay(prompt, out, d, draft=64, beta=0.08)
    return [tuple(step) for step in steps]


def _realignments(source, out):
    """(drafted, accepted) of each step of a replay of `out` that realigns after a broken copy."""
    return [(drafted, accepted) for kind, drafted, accepted in _steps(source, out) if kind == "realign"]


def _random_source(seed=5, n=300):
    rng = random.Random(seed)
    return [rng.randrange(9, 30000) for _ in range(n)]


def test_a_realignment_is_trusted_further_once_its_first_token_holds(monkeypatch):
    source = _random_source()
    out = source[:60] + [31000] + source[60:150] + [31001] + source[150:]  # two inserted tokens
    assert _realignments(source, out) == [(4, 4), (11, 11)]
    monkeypatch.setattr(D, "_REALIGN_PRIOR", (0.35,) * 4)  # one prior for every position
    monkeypatch.setattr(D, "_PRIOR_ODDS", {})
    assert _realignments(source, out) == [(2, 2), (3, 3)]


def test_after_inserted_text_the_copy_resumes_where_it_broke():
    # Three new tokens before source[60]: once source[60] follows them, the copy realigns at
    # once, without waiting for COPY_KEY tokens of context to find it again.
    source = _random_source()
    out = source[:60] + [31000, 31001, 31002] + source[60:]
    assert _realignments(source, out) == [(4, 4)]


def test_a_realignment_starts_nearest_where_the_output_has_put_the_source():
    source = _random_source()
    source[58] = source[61]  # a decoy: the token after the replaced one also occurs just before it
    out = source[:60] + [31000] + source[61:]  # source[60] replaced
    assert _realignments(source, out) == [(4, 4)]


def test_an_output_that_rewrites_the_prompt_copies_it_from_its_first_tokens(monkeypatch):
    code = _random_source()
    out = [31000] + code[1:]  # a rewrite of the prompt's code, its first token spelled apart

    def draft_lengths(prompt):
        return [drafted for _, drafted, _ in _steps(prompt, out)][:4]

    prompt = [1, 2, 3] + code + [4, 5]
    # Its second token occurs once in the prompt: the copy starts there (as the shortest match),
    # and once it has been followed since the output began, it drafts as a long match.
    assert draft_lengths(prompt) == [0, 0, 6, 34]
    # Where that token occurs twice, the copy waits for the third to tell where it starts.
    assert draft_lengths(prompt[:-1] + [code[1], 5]) == [0, 0, 1, 6]
    monkeypatch.setattr(AdaptiveDrafter, "_once_in_prompt", lambda self, tail: None)
    # A copy found by its key once 4 tokens are out: its backward match is only 4 tokens long,
    # but it covers the whole output so far.
    assert draft_lengths(prompt) == [0, 0, 2, 23]
    monkeypatch.setattr(D, "START_SLACK", -10**6)  # judged by its match length alone
    assert draft_lengths(prompt) == [0, 0, 2, 6]


def test_hazards_lower_the_odds_only_after_tokens_that_copies_break_after():
    h = Hazards()
    for _ in range(30):
        h.record(1, False)
        h.record(3, False)
    for _ in range(3):
        h.record(2, True)
    assert h.odds(2) < 0.2
    assert h.odds(1) == h.odds(3) == h.odds(4) == 1.0  # reliable or unseen: never raised


def _inserted(seed=3):
    """Random 'code' whose 20-token lines start with token 5, and the output: all of it, with a
    new token after each 5 (a line the model inserts)."""
    rng = random.Random(seed)
    code = [rng.randrange(9, 30000) for _ in range(400)]
    out = []
    for i in range(400):
        if i % 20 == 0:
            code[i] = 5
        out.append(code[i])
        if i % 20 == 0:
            out.append(rng.randrange(30000, 31000))
    return code, out


def test_copies_stop_before_the_token_they_keep_breaking_after(monkeypatch):
    # Every inserted token costs a step either way; once copies have broken after 5 a few times,
    # they stop at it instead of drafting on through the rest of the source.
    code, out = _inserted()
    t = replay(code, out, AdaptiveDrafter(), draft=64, beta=0.08)
    assert (t.steps, t.drafted, t.accepted) == (63, 735, 357)
    monkeypatch.setattr(Hazards, "odds", lambda self, prev: 1.0)
    off = replay(code, out, AdaptiveDrafter(), draft=64, beta=0.08)
    assert (off.steps, off.drafted, off.accepted) == (63, 866, 357)


@pytest.mark.parametrize("draft,ahead", [(None, None), (4, None), (None, 2), (None, 1)])
def test_simulate_reproduces_the_step_count_of_a_real_run(stories, draft, ahead):
    prompt = stories.tokenizer.encode("Once upon a time, there was a little dog. The little dog")
    drafter, cap, _ = make_drafter(draft)
    tokens, steps, _ = run(stories.model, prompt, predictor=drafter, draft=cap, max_tokens=200,
                           stop_tokens=stories.stop_ids, context_length=stories.context_length,
                           pipeline_after=ahead)
    if steps[-1].stop_reason == "stop":
        tokens = tokens + [1]  # the stop token the run emitted but did not show (BOS ends a story)
    t = replay(prompt, tokens, make_drafter(draft)[0], draft=cap, beta=0.08, max_tokens=200,
               context_length=stories.context_length, pipeline_after=ahead)
    assert t.steps == len(steps)
    assert t.accepted == sum(s.accepted for s in steps) or steps[-1].stop_reason == "stop"
    assert t.drafted == sum(s.drafted for s in steps)


def _trace_file(tmp_path, rows):
    path = tmp_path / "traces.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return str(path)


def test_simulate_json_per_file_and_category(tmp_path):
    f = _trace_file(tmp_path, [
        {"id": "a", "category": "loop", "prompt_ids": CYCLE_PROMPT, "output_ids": [1, 2, 3, 4] * 5},
        {"id": "b", "category": "edit", "prompt_ids": CYCLE_PROMPT, "output_ids": [5, 1, 2, 3, 4, 5, 1]},
    ])
    r = runner.invoke(app, ["simulate", f, "--draft", "4", "--beta", "0.1", "--json"])
    assert r.exit_code == 0, r.output
    (d,) = json.loads(r.stdout)
    for key in ["file", "output_tokens", "steps", "tokens_per_step", "drafted_per_step",
                "acceptance_rate", "predicted_speedup", "us_per_token", "categories"]:
        assert key in d
    assert (d["output_tokens"], d["steps"]) == (27, 7)
    assert d["categories"]["loop"]["steps"] == 4 and d["categories"]["edit"]["steps"] == 3
    assert d["predicted_speedup"] == round(27 / (7 + 0.1 * 24), 4)
    assert runner.invoke(app, ["simulate", f, "--draft", "4", "--json"]).stdout.count('"steps"') == 3
    # Queued ahead after each silent step: in "b" nothing follows 5 yet, so the step that emits 1
    # is plain, the next is queued ahead and emits 2 alone: 2 3 4 5 1 takes two steps, not one.
    r = runner.invoke(app, ["simulate", f, "--draft", "4", "--pipeline-after", "1", "--json"])
    (d,) = json.loads(r.stdout)
    assert d["categories"]["loop"]["steps"] == 4 and d["categories"]["edit"]["steps"] == 4
    r = runner.invoke(app, ["simulate", f, "--pipeline-after", "0"])
    assert r.exit_code == 1 and "--pipeline-after must be at least 1" in r.stderr
    r = runner.invoke(app, ["simulate", f, "--overlap", "1"])
    assert r.exit_code == 1 and "--overlap must be at least 0 and below 1" in r.stderr


@pytest.mark.parametrize("tok", [SHARED / "tokenizers/llama2/tokenizer.model",
                                 SHARED / "tokenizers/smollm2/tokenizer.json", "demo"],
                         ids=["sentencepiece", "tokenizer.json", "model alias"])
def test_simulate_text_traces_with_a_real_tokenizer(tmp_path, tok):
    if tok != "demo" and not tok.exists():
        pytest.skip(f"{tok} is not here: the shared tokenizers sit beside the repository")
    text = "def add(a, b):\n    return a + b\n" * 3
    f = _trace_file(tmp_path, [{"prompt": "Rewrite:\n" + text, "output": text}])
    r = runner.invoke(app, ["simulate", f, "-t", str(tok), "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)[0]["tokens_per_step"] > 3
    r = runner.invoke(app, ["simulate", f, "-t", str(tok)])
    assert "traces.jsonl" in r.stdout and "tok/step" in r.stdout


@pytest.mark.parametrize("content,message", [
    ("{not json\n", "traces.jsonl:1: not JSON"),
    ('{"prompt": "x"}\n', "needs \"output\""),
    ('{"prompt": "x", "output": "y"}\n', "text traces need --tokenizer"),
])
def test_simulate_bad_traces_are_one_line_errors(tmp_path, content, message):
    path = tmp_path / "traces.jsonl"
    path.write_text(content)
    r = runner.invoke(app, ["simulate", str(path)])
    assert r.exit_code == 1 and message in r.stderr and r.stderr.count("\n") == 1


def test_memory_carries_phrases_across_traces(tmp_path):
    answer = [7, 8, 9, 10, 11, 12, 13, 14, 15, 16] * 2
    rows = [{"category": "chat", "prompt_ids": [100 + i], "output_ids": answer} for i in range(5)]
    f = _trace_file(tmp_path, rows)
    off = json.loads(runner.invoke(app, ["simulate", f, "--json"]).stdout)[0]
    on = json.loads(runner.invoke(app, ["simulate", f, "--json", "--memory"]).stdout)[0]
    assert on["steps"] < off["steps"] and on["tokens_per_step"] > 2 * off["tokens_per_step"]
    # Each file is one model's outputs: the second file starts from an empty memory of its own.
    first, second = json.loads(runner.invoke(app, ["simulate", f, f, "--json", "--memory"]).stdout)
    assert first["steps"] == second["steps"] == on["steps"]


def test_memory_file_round_trips_and_is_bounded(tmp_path):
    path = tmp_path / "m.npz"
    mem = NGramMemory("model-a", max_contexts=50)
    rng = random.Random(0)
    for _ in range(20):
        mem.add([rng.randrange(1000) for _ in range(30)])
    mem.add([1, 2, 3, 4, 5] * 4)
    assert mem.save(path) is None
    back, warning = NGramMemory.load(path, "model-a", max_contexts=50)
    assert warning is None and 0 < back.contexts() <= 50
    assert back.tables.lookup([2, 3, 4]) == 5  # the most used contexts survive the bound


def test_memory_bound_keeps_used_then_short_then_new_contexts(tmp_path):
    # Bound 3: over it, the memory keeps the 2 (3/4 of 3) best: most used, shortest, newest.
    mem = NGramMemory("model-a", max_order=3, max_contexts=3)
    mem.add([1, 2, 1, 2])  # 1->2 twice; 2->1, (1,2)->1, (2,1)->2 once: 4 contexts, over
    assert {k: len(t) for k, t in mem.tables.entries.items()} == {3: 0, 2: 2}
    assert mem.tables.lookup([1]) == 2 and mem.tables.lookup([2]) == 1
    mem.add([5, 6])
    mem.add([8, 9])  # 4 contexts: the older of the three seen once go
    assert mem.contexts() == 2 and mem.tables.lookup([8]) == 9
    assert mem.tables.lookup([2]) is None and mem.tables.lookup([5]) is None
    # Ages survive the file: of the contexts saved, the newest outlives the others.
    path = tmp_path / "m.npz"
    mem = NGramMemory("model-a", max_order=2, max_contexts=4)
    for output in ([5, 6], [8, 9], [13, 14]):
        mem.add(output)
    mem.save(path)
    back = NGramMemory.load(path, "model-a", max_order=2, max_contexts=4)[0]
    back.add([40, 41])
    back.add([50, 51])  # 5 contexts: 3 stay
    assert [back.tables.lookup([t]) for t in (5, 8, 13, 40, 50)] == [None, None, 14, 41, 51]


@pytest.mark.parametrize("content", [b"garbage", b"PK\x03\x04broken zip"])
def test_corrupt_memory_file_is_ignored_with_a_warning(tmp_path, content):
    path = tmp_path / "m.npz"
    path.write_bytes(content)
    mem, warning = NGramMemory.load(path, "model-a")
    assert mem.contexts() == 0 and "ignoring memory file" in warning
    mem.add([1, 2, 3, 4])
    assert "ignoring" in mem.save(path)  # replaced with a good file
    assert NGramMemory.load(path, "model-a")[1] is None


def test_memory_of_another_model_is_ignored_with_a_warning(tmp_path):
    path = tmp_path / "m.npz"
    mem = NGramMemory("model-a")
    mem.add([1, 2, 3, 4])
    mem.save(path)
    other, warning = NGramMemory.load(path, "model-b")
    assert other.contexts() == 0 and "belongs to model 'model-a'" in warning


def _save_in_process(path, seed):
    mem = NGramMemory("model-a")
    mem.add([seed, seed + 1, seed + 2, seed + 3])
    mem.save(path)


def test_concurrent_saves_keep_both_outputs(tmp_path):
    path = tmp_path / "m.npz"
    procs = [multiprocessing.get_context("spawn").Process(target=_save_in_process, args=(path, s))
             for s in (10, 20, 30, 40)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    mem, warning = NGramMemory.load(path, "model-a")
    assert warning is None
    for s in (10, 20, 30, 40):
        assert mem.tables.lookup([s, s + 1, s + 2]) == s + 3


def test_run_memory_speeds_up_a_repeated_request(tmp_path):
    env = {"SPECGEN_CACHE_DIR": str(tmp_path), "SPECGEN_MODEL": "demo"}
    args = ["run", "--memory", "-n", "80", "--json", "Once upon a time"]
    first = json.loads(runner.invoke(app, args, env=env).stdout)
    second = json.loads(runner.invoke(app, args, env=env).stdout)
    assert second["text"] == first["text"] and second["steps"] < first["steps"] / 2
    assert list((tmp_path / "memory").glob("*.npz"))
    fixed = runner.invoke(app, ["run", "--memory", "--draft", "4", "-n", "8", "Once upon a time"], env=env)
    assert fixed.exit_code == 0 and "--memory drafts only with the adaptive drafter" in fixed.stderr


@pytest.mark.parametrize("curve", [{1: 1.0, 2: 1.08, 4: 1.3, 8: 1.8, 16: 2.7, 32: 4.5, 64: 8.0},
                                   {1: 1.0, 2: 1.0, 4: 1.0, 8: 1.5, 16: 1.5, 32: 3.0, 64: 6.0}])
def test_early_stop_never_changes_a_draft(monkeypatch, curve):
    # predict stops once no longer draft can pay (min_slopes); with that bound switched off it
    # must choose exactly the same drafts on text with copies, repeats and novel spans.
    from specgen.calibrate import cost_function

    rng = random.Random(7)
    base = [rng.randrange(6) for _ in range(60)]  # few symbols: n-grams of every confidence
    output = base[:30] + [rng.randrange(6) for _ in range(40)] + base[25:] + [3, 4, 5] * 20

    def drafts_made():
        d = AdaptiveDrafter(cost=cost_function(curve))
        d.update_batch(base)
        made = []
        for t in output:
            made.append(d.predict(64))
            d.update_batch([t])
        return made

    stopped = drafts_made()
    monkeypatch.setattr(D, "min_slopes", lambda cost, longest: [0.0] * (longest + 1))
    assert drafts_made() == stopped
    assert sum(map(len, stopped)) > 50
