import json
import os
import subprocess
import sys

import pytest
from conftest import save_tiny
from typer.testing import CliRunner

from specgen.cli.commands import app
from specgen.engine.load import registry

pytestmark = pytest.mark.usefixtures("quick_calibration")

runner = CliRunner()
ONCE = "Once upon a time"


def invoke(args, input=None, env=None, tmp_path=None):
    env = {"HF_HUB_OFFLINE": "1", "SPECGEN_MODEL": "demo", **(env or {})}
    if tmp_path is not None:
        env.setdefault("XDG_CONFIG_HOME", str(tmp_path / "config"))
    return runner.invoke(app, args, input=input, env=env)


def golden_text(golden, prompt):
    return next(c for c in golden if c["prompt"] == prompt)["greedy_text"]


@pytest.mark.parametrize("extra", [["--draft", "0"], ["--draft", "4"], ["--temp", "0"]])
def test_prompt_argument_streams_the_golden_text(golden, extra):
    r = invoke(["run", "-n", "64", *extra, ONCE])
    assert r.exit_code == 0, r.output
    assert ONCE + r.stdout == golden_text(golden, ONCE) + "\n"
    assert "64 tok" in r.stderr and "stop: max_tokens" in r.stderr


def test_prompt_from_file_and_from_stdin_match_the_argument(tmp_path):
    expected = invoke(["run", "-n", "20", ONCE]).stdout
    f = tmp_path / "p.txt"
    f.write_text(ONCE + "\n")
    assert invoke(["run", "-n", "20", "-f", str(f)]).stdout == expected
    assert invoke(["run", "-n", "20"], input=ONCE + "\n").stdout == expected
    assert invoke(["run", "-n", "20", "-"], input=ONCE).stdout == expected
    assert invoke(["run", "-n", "20", "-f", "-"], input=ONCE).stdout == expected


def test_piped_stdin_and_argument_combine():
    r = invoke(["run", "-n", "5", "--json", "and then"], input=ONCE)
    alone = invoke(["run", "-n", "5", "--json", ONCE])
    assert json.loads(r.stdout)["prompt_tokens"] > json.loads(alone.stdout)["prompt_tokens"]


def test_json_has_every_documented_field_and_the_stats_add_up():
    r = invoke(["run", "-n", "120", "--json", "Tom and Lily were playing. Tom and Lily were"])
    assert r.exit_code == 0
    d = json.loads(r.stdout)
    for key in ["text", "model", "prompt_tokens", "generated_tokens", "prefill_s", "decode_s",
                "decode_tps", "steps", "drafted", "accepted", "acceptance_rate", "tokens_per_step",
                "accept_histogram", "speculation", "stop_reason"]:
        assert key in d, key
    h = d["accept_histogram"]
    assert sum(h) == d["steps"]
    assert sum(k * n for k, n in enumerate(h)) == d["accepted"]
    assert d["accepted"] <= d["drafted"]
    if d["stop_reason"] == "max_tokens":
        assert d["generated_tokens"] == d["steps"] + d["accepted"] == 120
    assert d["tokens_per_step"] == round(d["generated_tokens"] / d["steps"], 4)
    assert d["model"] == "demo" and d["speculation"] == "on: trim"


def test_seeded_sampling_is_repeatable_and_unchanged_by_speculation():
    args = ["run", "-n", "80", "--json", "--temp", "0.8", "--top-p", "0.95", "--seed", "3", ONCE]
    runs = [json.loads(invoke(args + extra).stdout) for extra in ([], ["--draft", "4"], ["--draft", "0"])]
    assert runs[0]["text"] == runs[1]["text"] == runs[2]["text"]
    assert runs[0]["seed"] == 3 and runs[0]["temp"] == 0.8
    assert runs[1]["drafted"] > 0 and runs[2]["drafted"] == 0


def test_demo_stops_at_the_end_of_the_story():
    d = json.loads(invoke(["run", "-n", "400", "--json", ONCE]).stdout)
    assert d["stop_reason"] == "stop" and d["generated_tokens"] < 400
    assert "<s>" not in d["text"]


@pytest.mark.parametrize("args,input,code,message", [
    (["run", ""], None, 1, "prompt is empty"),
    (["run"], "  \n", 1, "prompt is empty"),
    # a flag's value out of range is a usage error (2), as click's type errors are (`-n nan`)
    (["run", "-n", "0", "x"], None, 2, "--max-tokens must be at least 1"),
    (["run", "-n", "-3", "x"], None, 2, "--max-tokens must be at least 1"),
    (["run", "--draft", "-1", "x"], None, 2, "--draft must be 0 or more"),
    (["run", "--ngram-order", "1", "x"], None, 2, "--ngram-order must be between 2 and 16 (got 1)"),
    (["run", "--temp", "-0.5", "x"], None, 2, "--temp must be 0 (greedy) or more"),
    (["run", "--temp", "1", "--top-p", "1.5", "x"], None, 2, "--top-p must be between 0 and 1"),
    (["run", "-f", "/nonexistent/prompt.txt"], None, 1, "no such file: /nonexistent/prompt.txt"),
    (["run", "-m", "nosuchalias", "x"], None, 1, "unknown model alias 'nosuchalias' (known: demo"),
    (["run", "-m", "./no/such/folder", "x"], None, 1, "no such model folder: ./no/such/folder"),
    (["run", "-m", "mlx-community/not-here-4bit", "x"], None, 1, "cannot download 'mlx-community/not-here-4bit'"),
    (["run", "-n", "5", "word " * 600], None, 1, "the model's context is 512 tokens: at most 511"),
])
def test_bad_input_exits_1_and_a_bad_flag_2_in_one_line(args, input, code, message):
    r = invoke(args, input=input)
    assert r.exit_code == code
    assert message in r.stderr
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr


def test_bad_files_are_one_line_errors(tmp_path):
    empty, latin, folder = tmp_path / "empty.txt", tmp_path / "latin.txt", tmp_path / "dir"
    empty.write_text("\n")
    latin.write_bytes("caf\xe9".encode("latin-1"))
    folder.mkdir()
    for path, message in [(empty, "is empty"), (latin, "is not UTF-8"), (folder, "cannot read")]:
        r = invoke(["run", "-f", str(path)])
        assert r.exit_code == 1 and message in r.stderr and r.stderr.count("\n") == 1


def test_folder_that_is_not_a_model(tmp_path):
    r = invoke(["run", "-m", str(tmp_path), "x"])
    assert r.exit_code == 1 and "is not a model folder" in r.stderr


def test_usage_errors_exit_2():
    assert invoke(["run", "--no-such-option"]).exit_code == 2
    assert invoke(["run", "-n", "many", "x"]).exit_code == 2


def test_user_models_toml_adds_aliases_and_a_malformed_one_is_an_error(tmp_path):
    cfg = tmp_path / "config" / "specgen"
    cfg.mkdir(parents=True)
    (cfg / "models.toml").write_text(
        f'[tales]\nmodel = "{registry.bundled_path("stories260K")}"\nstop_tokens = ["<s>"]\n'
        'chat_template = false\n')
    r = invoke(["run", "-m", "tales", "-n", "8", "--json", ONCE], tmp_path=tmp_path)
    assert r.exit_code == 0 and json.loads(r.stdout)["model"] == "tales"
    assert "tales" in invoke(["models"], tmp_path=tmp_path).stdout
    (cfg / "models.toml").write_text("[broken\nmodel = 1")
    r = invoke(["run", "x"], tmp_path=tmp_path)
    assert r.exit_code == 1 and "is not valid TOML" in r.stderr and r.stderr.count("\n") == 1
    (cfg / "models.toml").write_text('[x]\nmodel = 3\n')
    r = invoke(["models"], tmp_path=tmp_path)
    assert r.exit_code == 1 and "alias 'x' needs model" in r.stderr


def test_models_lists_the_packaged_aliases(tmp_path):
    rows = json.loads(invoke(["models", "--json"], tmp_path=tmp_path).stdout)
    names = {r["alias"] for r in rows}
    assert "demo" in names and any("coder" in n for n in names)


def test_ctrl_c_prints_partial_text_and_stats_and_exits_130(monkeypatch):
    import specgen.engine.decode.loop as decode

    real = decode.generate

    def interrupted(*a, **kw):
        for i, ev in enumerate(real(*a, **kw)):
            if i == 6:
                raise KeyboardInterrupt
            yield ev

    monkeypatch.setattr(decode, "generate", interrupted)
    r = invoke(["run", "-n", "100", ONCE])
    assert r.exit_code == 130
    assert r.stdout.startswith(", there was") and "stop: interrupted" in r.stderr


@pytest.mark.parametrize("arch", ["mamba", "qwen3_next"])
def test_a_model_with_state_caches_speculates_by_restoring_them(tmp_path, arch):
    save_tiny(arch, tmp_path / arch)
    # A fixed draft length: the auto drafter's curve of a tiny model on a busy CI machine may be
    # steep enough to turn speculation off, and this test is about the rollback, not the curve.
    spec = invoke(["run", "-m", str(tmp_path / arch), "-n", "30", "--json", "--draft", "4", ONCE])
    assert spec.exit_code == 0, spec.output
    plain = invoke(["run", "-m", str(tmp_path / arch), "-n", "30", "--json", "--draft", "0", ONCE])
    assert json.loads(spec.stdout)["text"] == json.loads(plain.stdout)["text"]
    assert json.loads(spec.stdout)["speculation"] == "on: restore (ArraysCache)"


def test_piping_into_head_exits_quietly():
    proc = subprocess.Popen([sys.executable, "-m", "specgen", "run", "-n", "300", ONCE],
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, "SPECGEN_MODEL": "demo"}, bufsize=0)
    proc.stdout.read(5)
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) in (0, 141)
    assert "Traceback" not in err and "Exception" not in err
