import json

import pytest
from typer.testing import CliRunner

from conftest import ScriptedModel
from specgen.bench import read_prompt_file, run_set
from specgen.calibrate import (cost_function, describe, drafting_cost, load_or_measure,
                               pipeline_after, relative)
from specgen.drafter import AdaptiveDrafter, linear_cost, make_drafter
from specgen.errors import InputError
from specgen.cli import app

runner = CliRunner()


def test_relative_curve_is_normalised_and_never_decreasing():
    curve = relative({1: 2.0, 2: 2.4, 4: 2.2, 8: 4.0})
    assert curve == pytest.approx({1: 1.0, 2: 1.15, 4: 1.15, 8: 2.0})  # 2 and 4 pooled
    # One spike is averaged with what follows it, not carried to every larger size.
    spiky = relative({1: 1.0, 2: 1.05, 4: 1.6, 8: 1.4, 16: 1.45, 32: 2.0})
    assert spiky[4] == spiky[8] == spiky[16] == pytest.approx((1.6 + 1.4 + 1.45) / 3) and spiky[32] == 2.0
    assert relative({1: 2.0, 2: 1.8})[2] == 1.0  # never cheaper than one position


def test_cost_function_interpolates_and_extrapolates():
    cost = cost_function({1: 1.0, 2: 1.2, 4: 1.6, 8: 2.4})
    assert cost(0) == 1.0 and cost(1) == 1.2 and cost(3) == 1.6
    assert cost(2) == pytest.approx(1.4)  # 3 positions: halfway between 2 and 4
    assert cost(11) == pytest.approx(3.2)  # 12 positions: the 4 -> 8 slope continued


def test_plain_steps_are_queued_ahead_sooner_the_more_it_saves():
    assert [pipeline_after(x) for x in (0.0, 0.04, 0.05, 0.15, 0.3)] == [None, None, 2, 2, 1]
    curve = {1: 1.0, 2: 1.1}
    assert describe(curve, 0.3).endswith("queued ahead after 1 silent one (saves 30%)")
    assert describe(curve, 0.1).endswith("after 2 silent ones (saves 10%)")
    assert "queued" not in describe(curve, 0.01)


def test_a_weak_draft_is_dropped_where_silence_gets_the_next_step_queued():
    base = linear_cost(0.08)
    assert drafting_cost(base, 0.3, 2) is base and drafting_cost(base, 0.0, 1) is base
    cost = drafting_cost(base, 0.3, 1)
    assert cost(0) == pytest.approx(0.7) and cost(3) == base(3)
    history = [5, 6, 7, 5]  # 6 followed 5 once: a weak guess, worth drafting at plain cost
    drafters = [AdaptiveDrafter(cost=c) for c in (base, cost)]
    for d in drafters:
        d.update_batch(history)
    assert drafters[0].predict(8)[:1] == [6] and drafters[1].predict(8) == []


def test_calibration_is_cached_per_model_and_redone_on_request(stories, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECGEN_CACHE_DIR", str(tmp_path))
    sample = stories.tokenizer.encode("Once upon a time")
    curve, overlap, fresh = load_or_measure(stories.model, "m", sample)
    assert fresh and curve[1] == 1.0 and all(curve[k] >= 1.0 for k in curve) and 0 <= overlap < 1
    again, again_overlap, fresh = load_or_measure(stories.model, "m", sample)
    assert not fresh and again == curve and again_overlap == overlap
    assert load_or_measure(stories.model, "m", sample, recalibrate=True)[2]
    # Another BLAS changes the curve's shape: its curve is measured, not borrowed.
    monkeypatch.setenv("LD_PRELOAD", "/elsewhere/libopenblas.so.0")
    assert load_or_measure(stories.model, "m", sample)[2]
    assert not load_or_measure(stories.model, "m", sample)[2]
    (tmp_path / "calibration.json").write_text("{broken")
    assert load_or_measure(stories.model, "m", sample)[2]  # a damaged cache is measured over


def test_run_set_reports_identical_outputs_and_consistent_stats():
    model = ScriptedModel({1: 2, 2: 3, 3: 4, 4: 1})
    res = run_set("cycle", model, [[1, 2, 3, 4] * 2, [2, 3, 4, 1] * 2], max_tokens=20, repeats=2,
                  stop=frozenset(), make=lambda: make_drafter(4)[:2]).to_dict()
    assert res["identical"] and res["divergences"] == []
    assert res["tokens_per_step"] == 5.0 and res["acceptance_rate"] == 1.0
    assert res["speedup_min"] <= res["speedup_median"] <= res["speedup_max"]


def test_prompt_files_lines_or_jsonl(tmp_path):
    f = tmp_path / "p.txt"
    f.write_text("first prompt\n\nsecond prompt\n")
    assert read_prompt_file(str(f)) == {"custom": ["first prompt", "second prompt"]}
    f.write_text('{"prompt": "a", "set": "edit"}\n{"prompt": "b"}\n')
    assert read_prompt_file(str(f)) == {"edit": ["a"], "custom": ["b"]}
    f.write_text('{"nope": 1}\n')
    with pytest.raises(InputError, match="p.txt:1"):
        read_prompt_file(str(f))


def test_bench_json_on_the_demo_model(tmp_path):
    prompts = tmp_path / "p.txt"
    prompts.write_text("Once upon a time\nThe little dog was sad because\n")
    r = runner.invoke(app, ["bench", "--prompts", str(prompts), "-n", "24", "--repeats", "2", "--json"],
                      env={"SPECGEN_CACHE_DIR": str(tmp_path), "SPECGEN_MODEL": "demo"})
    assert r.exit_code == 0, r.output
    (row,) = json.loads(r.stdout)
    for key in ["set", "baseline_tps", "specgen_tps", "speedup_median", "speedup_min",
                "speedup_max", "tokens_per_step", "acceptance_rate", "identical"]:
        assert key in row
    assert row["set"] == "custom" and row["identical"] is True
    assert row["baseline_tps"] > 0 and row["specgen_tps"] > 0


def test_bench_bad_input_is_one_line():
    r = runner.invoke(app, ["bench", "--prompts", "/nonexistent.txt"])
    assert r.exit_code == 1 and "no such prompts file" in r.stderr
    r = runner.invoke(app, ["bench", "--repeats", "0"])
    assert r.exit_code == 1 and "--repeats must be at least 1" in r.stderr
    r = runner.invoke(app, ["bench", "--memory", "--draft", "4"])
    assert r.exit_code == 1 and "--memory drafts only with the adaptive drafter" in r.stderr


def test_bench_with_memory_drafts_from_it_and_leaves_it_unchanged(tmp_path):
    env = {"SPECGEN_CACHE_DIR": str(tmp_path), "SPECGEN_MODEL": "demo"}
    prompts = tmp_path / "p.txt"
    prompts.write_text("Once upon a time\n")
    args = ["bench", "--prompts", str(prompts), "-n", "40", "--repeats", "1", "--json"]
    cold = json.loads(runner.invoke(app, args, env=env).stdout)[0]
    assert runner.invoke(app, ["run", "--memory", "-n", "40", "Once upon a time"], env=env).exit_code == 0
    (mem_file,) = (tmp_path / "memory").glob("*.npz")
    before = mem_file.read_bytes()
    warm = json.loads(runner.invoke(app, args + ["--memory"], env=env).stdout)[0]
    assert warm["identical"] and "memory of 1 earlier outputs" in warm["draft_mode"]
    assert warm["tokens_per_step"] > 2 * cold["tokens_per_step"]  # it copies the earlier output
    assert mem_file.read_bytes() == before


def test_a_memory_reader_calibrates_on_its_own():
    from specgen.memory import NGramMemory

    mem = NGramMemory("m")
    mem.calibration.record(("memory", 3, 2, 4), True)
    view = mem.reader()
    view.calibration.record(("memory", 3, 2, 4), False)
    assert mem.calibration.counts["memory"][2] == 1 and view.calibration.counts["memory"][2] == 2
    assert view.tables is mem.tables and view.stream is mem.stream
