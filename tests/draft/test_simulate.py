"""simulate: replaying recorded outputs through the drafter, exactly as the decode loop would."""

import json
from pathlib import Path

import pytest
from conftest import SHARED, run
from typer.testing import CliRunner

from specgen.cli.commands import app
from specgen.draft.drafter import AdaptiveDrafter, make_drafter
from specgen.draft.length import linear_cost
from specgen.draft.memory import NGramMemory
from specgen.draft.predictor import NGramPredictor
from specgen.draft.simulate import replay
from specgen.draft.traces import load_tokenizer, read_traces

runner = CliRunner()
CYCLE_PROMPT = [1, 2, 3, 4] * 2
STEPS = Path(__file__).resolve().parents[1] / "data" / "simulate_steps.json"


def test_replay_counts_steps_exactly_with_the_fixed_drafter():
    t = replay(CYCLE_PROMPT, [1, 2, 3, 4] * 5, NGramPredictor(), draft=4, beta=0.1)
    assert (t.counts.steps, t.counts.drafted, t.counts.accepted) == (4, 16, 16)
    assert t.cost == pytest.approx(4 * 1.4)
    # The model deviates (4 -> 5): the same steps as the scripted-model decode test.
    t = replay(CYCLE_PROMPT, [5, 1, 2, 3, 4, 5, 1], NGramPredictor(), draft=4, beta=0.1)
    assert (t.counts.steps, t.counts.drafted, t.counts.accepted) == (3, 8, 4)
    # A measured cost curve (as benchmarks predict with) replaces 1 + beta * k.
    curve = {0: 1.0, 4: 1.5}
    t = replay(CYCLE_PROMPT, [1, 2, 3, 4] * 5, NGramPredictor(), draft=4, beta=0.1, cost=curve.get)
    assert (t.counts.steps, t.cost) == (4, 4 * 1.5)


def test_queued_steps_and_plain_decoding_cost_less_by_the_overlap():
    # 5 is new: its step drafts [1 2 3 4] and misses; nothing follows 5 yet, so the step that
    # emits 1 drafts nothing and the next (emitting 2) is queued ahead; then [3 4 5] is accepted.
    t = replay(CYCLE_PROMPT, [5, 1, 2, 3, 4, 5, 1], NGramPredictor(), draft=4, beta=0.1,
               queue_after=1, overlap=0.25)
    assert (t.counts.steps, t.counts.drafted, t.counts.accepted) == (4, 7, 3)
    assert t.cost == pytest.approx(1.4 + 1 + 0.75 + 1.3)
    assert t.plain_cost == pytest.approx(7 * 0.75)  # mlx-lm queues every step
    assert t.to_dict()["predicted_speedup"] == round(5.25 / 4.45, 4)


def test_plain_passes_stop_being_queued_where_the_drafts_they_delay_cost_more_than_queuing_saves():
    # Each segment of the output is a new token, then a trigger the prompt has followed with the
    # segment's content: once the trigger is read, the content is drafted. A plain pass queued
    # behind the trigger's is built before the trigger is known, so its draft waits a step.
    segments = [[1000 + 20 * k + i for i in range(12)] for k in range(10)]
    prompt = [t for k, seg in enumerate(segments) for t in [5000 + k, *seg]]
    output = [t for k, seg in enumerate(segments) for t in [9000 + k, 5000 + k, *seg]]
    steps = {overlap: replay(prompt, output, AdaptiveDrafter(), draft=16, queue_after=1,
                             overlap=overlap).counts.steps for overlap in (0.5, 0.05)}
    never = replay(prompt, output, AdaptiveDrafter(), draft=16, queue_after=None).counts.steps
    assert never <= steps[0.05] < steps[0.5] - 2  # where queuing hides little, it mostly stops
    # Where nothing would be drafted, queuing costs nothing: every plain pass after the first is queued.
    novel = list(range(20000, 20060))
    t = replay(prompt, novel, AdaptiveDrafter(), draft=16, queue_after=1, overlap=0.05)
    assert t.counts.drafted == 0 and t.cost == pytest.approx(1 + 59 * 0.95)


def test_tokens_past_the_end_of_the_output_never_match():
    # Drafts [2, 3, 4, 1] but the output ends after 2, 3: two accepted, no bonus token.
    t = replay(CYCLE_PROMPT + [1], [2, 3], NGramPredictor(), draft=4, beta=0.1, max_tokens=10)
    assert (t.counts.steps, t.counts.accepted, t.counts.tokens) == (1, 2, 2)


class PathOnly(AdaptiveDrafter):
    """The adaptive drafter without recycled predictions: a run recycles the target's choices after
    rejected draft tokens too, which a replay of its output alone cannot know."""

    def recycle(self, inputs, predicted):
        pass


@pytest.mark.parametrize("draft,ahead", [(None, None), (4, None), (None, 2), (None, 1)])
def test_simulate_reproduces_the_step_count_of_a_real_run(stories, draft, ahead):
    prompt = stories.tokenizer.encode("Once upon a time, there was a little dog. The little dog")
    cap = 64 if draft is None else draft
    drafter = PathOnly() if draft is None else make_drafter(draft)
    tokens, steps, _ = run(stories.model, prompt, drafter=drafter, draft=cap,
                           max_tokens=200, stop_tokens=stories.stop_ids,
                           context_length=stories.context_length, queue_after=ahead)
    if steps[-1].stop_reason == "stop":
        tokens = tokens + [1]  # the stop token the run emitted but did not show (BOS ends a story)
    replayed = []
    t = replay(prompt, tokens, make_drafter(draft), draft=cap, beta=0.08, max_tokens=200,
               context_length=stories.context_length, queue_after=ahead, steps=replayed)
    assert t.counts.steps == len(steps)
    assert t.counts.accepted == sum(s.accepted for s in steps) or steps[-1].stop_reason == "stop"
    assert t.counts.drafted == sum(s.drafted for s in steps)
    # Step by step, as the loop reports its own (the run's last step shows no stop token).
    assert [(s.tokens, s.drafted, s.accepted, s.queued) for s in replayed[:-1]] == [
        (s.tokens, s.drafted, s.accepted, s.queued) for s in steps[:-1]]
    queued = sum(s.queued for s in steps)
    assert sum(s.queued for s in replayed) == queued and (queued > 0) == (ahead is not None)


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
    assert r.exit_code == 2 and "--pipeline-after must be at least 1" in r.stderr
    r = runner.invoke(app, ["simulate", f, "--overlap", "1"])
    assert r.exit_code == 2 and "--overlap must be at least 0 and below 1" in r.stderr


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
    ("", "holds no traces"),
    ('{"prompt_ids": [1], "output_ids": []}\n', "the output is empty"),
    ('{"output_ids": "abc"}\n', "must be lists of token ids"),
    ("[1, 2]\n", "expected a JSON object"),
    ('{"prompt_ids": [1], "output_ids": [2], "topk": [[3]]}\n', "for every position of prompt + output"),
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


@pytest.mark.skipif(not (SHARED / "traces").is_dir(), reason="the shared traces sit beside the repository")
@pytest.mark.parametrize("mode", ["fixed4", "auto", "memory"])
def test_recorded_step_counts_of_the_shared_traces_are_unchanged(mode):
    # The step counts of every shared trace file, recorded before the drafter was split into
    # modules (issue 18), pin its behaviour: the first 60 traces of each file here, all of them
    # with benchmarks/check_steps.py.
    recorded = json.loads(STEPS.read_text())
    encode = load_tokenizer(str(SHARED / "tokenizers/llama2/tokenizer.model"))
    for name, modes in recorded.items():
        mem = NGramMemory("simulate") if mode == "memory" else None
        for i, tr in enumerate(read_traces(str(SHARED / "traces" / name), encode)[:60]):
            drafter = make_drafter(4 if mode == "fixed4" else None, cost=linear_cost(0.08), memory=mem)
            t = replay(tr.prompt, tr.output, drafter, draft=4 if mode == "fixed4" else 64, beta=0.08)
            assert [t.counts.steps, t.counts.drafted, t.counts.accepted] == modes[mode][i], (name, i)
            if mem is not None:
                mem.add(tr.output)
