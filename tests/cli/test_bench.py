import json

import pytest
from conftest import ScriptedModel
from typer.testing import CliRunner

from specgen.cli.bench import read_prompt_file, run_set
from specgen.cli.commands import app
from specgen.draft.drafter import make_drafter
from specgen.errors import InputError

# These test what the commands do around calibration, not the curve: measure briefly.
pytestmark = pytest.mark.usefixtures("quick_calibration")

runner = CliRunner()


def test_run_set_reports_identical_outputs_and_consistent_stats():
    model = ScriptedModel({1: 2, 2: 3, 3: 4, 4: 1})
    run = run_set("cycle", model, [[1, 2, 3, 4] * 2, [2, 3, 4, 1] * 2], max_tokens=20, repeats=3,
                  stop=frozenset(), make=lambda: make_drafter(4), draft=4)
    res = run.to_dict()
    assert res["identical"] and res["divergences"] == []
    assert res["tokens_per_step"] == 5.0 and res["acceptance_rate"] == 1.0
    # A round's speedup is specgen's throughput over mlx-lm's; the row reports their spread.
    assert len(run.ratios) == 3 and run.ratios == pytest.approx([s / b for s, b in zip(run.specgen_tps,
                                                                                        run.baseline_tps)])
    ratios = sorted(run.ratios)
    assert [res["speedup_min"], res["speedup_median"], res["speedup_max"]] == [round(r, 4) for r in ratios]


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
    # The last prompt does not fit the demo's 512-token context: left out, and said so.
    prompts.write_text("Once upon a time\nThe little dog was sad because\n" + "dog " * 600 + "\n")
    r = runner.invoke(app, ["bench", "--prompts", str(prompts), "-n", "24", "--repeats", "2", "--json"],
                      env={"SPECGEN_CACHE_DIR": str(tmp_path), "SPECGEN_MODEL": "demo"})
    assert r.exit_code == 0, r.output
    assert "custom: 1 prompt(s) longer than the model's context (512 tokens) left out" in r.stderr
    (row,) = json.loads(r.stdout)
    assert row["prompts"] == 2
    for key in ["set", "baseline_tps", "specgen_tps", "speedup_median", "speedup_min",
                "speedup_max", "tokens_per_step", "acceptance_rate", "identical"]:
        assert key in row
    assert row["set"] == "custom" and row["identical"] is True
    assert row["baseline_tps"] > 0 and row["specgen_tps"] > 0


def test_bench_bad_input_is_one_line():
    r = runner.invoke(app, ["bench", "--prompts", "/nonexistent.txt"])
    assert r.exit_code == 1 and "no such prompts file" in r.stderr
    r = runner.invoke(app, ["bench", "--repeats", "0"])
    assert r.exit_code == 2 and "--repeats must be at least 1" in r.stderr
    r = runner.invoke(app, ["bench", "--memory", "--draft", "4"])
    assert r.exit_code == 2 and "--memory drafts only with the adaptive drafter" in r.stderr


def test_bench_with_memory_drafts_from_it_and_leaves_it_unchanged(tmp_path, monkeypatch):
    # (a CPU loaded by the tests beside this one can calibrate verifying as too dear to draft at
    # all, 1.0 tokens a step: this is about the memory, so passes cost what a GPU's do)
    flat = {1: 1.0, 2: 1.02, 4: 1.05, 8: 1.1, 16: 1.2, 32: 1.4, 64: 1.8}
    monkeypatch.setattr("specgen.engine.cost.calibrate.measure",
                        lambda model, sample, sizes=tuple(flat), **kw: {k: flat.get(k, 1.0) * 0.01 for k in sizes})
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


def test_a_memory_reader_learns_on_its_own():
    from specgen.draft.acceptance import evidence_for
    from specgen.draft.memory import NGramMemory

    mem = NGramMemory("m")
    ev = evidence_for(mem.params).ngram[2][1][2][3]  # a memory n-gram
    mem.acceptance.record(ev, True)
    view = mem.reader()
    view.acceptance.record(ev, False)
    assert mem.acceptance.counts["memory"].judged == 1 and view.acceptance.counts["memory"].judged == 2
    assert view.tables is mem.tables and view.stream is mem.stream
