"""`specgen run` under `mlx.launch -n 2 --backend ring` (two local processes, CPU): the model is
sharded (tensor-parallel for the demo's Llama, pipeline for a tiny Qwen3-Next, a hybrid with state
caches that are restored after rejections), every rank speculates
alike, and rank 0 alone prints exactly what a single process prints."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import mlx.core as mx
import pytest
from conftest import TINY, tiny_model
from mlx.utils import tree_flatten

from specgen.engine.load import registry

LAUNCH = Path(sys.executable).parent / "mlx.launch"
pytestmark = pytest.mark.skipif(not LAUNCH.exists(), reason="mlx.launch comes with mlx")
REPEAT = "Tom had a cat. The cat was big. Tom had a cat. The cat was big. Tom had a cat."


@pytest.fixture(scope="module")
def calibrations(tmp_path_factory) -> Path:
    """One cache folder for the module's runs: each model and world size is calibrated once
    (~6 s for the demo in one process), not in every test."""
    return tmp_path_factory.mktemp("calibrations")


@pytest.fixture
def specgen(calibrations, tmp_path):
    """Runs `python -m specgen ARGS` under `mlx.launch -n RANKS` (one process for ranks=1),
    its home the test's folder."""
    def run(*args, ranks=2, cwd=None):
        cmd = [sys.executable, "-m", "specgen", *args]
        if ranks > 1:
            cmd = [str(LAUNCH), "-n", str(ranks), "--backend", "ring", "--", *cmd]
        env = {"SPECGEN_CACHE_DIR": str(calibrations), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
        return subprocess.run(cmd, capture_output=True, text=True, timeout=240, stdin=subprocess.DEVNULL,
                              env=env, cwd=cwd, check=False)
    return run


@pytest.fixture(scope="module")
def tiny_qwen3_next(tmp_path_factory):
    """A tiny Qwen3-Next folder (pipeline sharding only) with the weight index that it reads."""
    folder = tmp_path_factory.mktemp("qwen3_next")
    weights = dict(tree_flatten(tiny_model("qwen3_next").parameters()))
    mx.save_safetensors(str(folder / "model.safetensors"), weights)
    (folder / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {k: "model.safetensors" for k in weights}}))
    (folder / "config.json").write_text(json.dumps(TINY["qwen3_next"]))
    for f in ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"]:
        shutil.copy(registry.bundled_path("stories260K") / f, folder / f)
    return folder


@pytest.mark.parametrize("model,sharding", [("demo", "tensor over 2 ranks"),
                                            ("qwen3_next", "pipeline over 2 ranks")])
def test_two_ranks_print_once_what_one_process_prints(specgen, model, sharding, tiny_qwen3_next, tmp_path):
    m = str(tiny_qwen3_next) if model == "qwen3_next" else model
    args = ["run", "-m", m, "-n", "48", "--json", "--draft", "4", REPEAT]
    two = specgen(*args)
    # One process, plain decoding (what mlx-lm's greedy decoding gives: see test_decode.py).
    plain = specgen("run", "-m", m, "-n", "48", "--json", "--draft", "0", REPEAT, ranks=1)
    assert two.returncode == 0, two.stderr
    lines = two.stdout.strip().splitlines()
    assert len(lines) == 1  # rank 1 prints nothing
    d, single = json.loads(lines[0]), json.loads(plain.stdout)
    assert d["text"] == single["text"]
    assert (d["ranks"], d["sharding"], single["ranks"], single["sharding"]) == (2, sharding, 1, "none")
    if model == "demo":
        assert d["accepted"] > 0


def test_seeded_sampling_is_the_same_on_two_ranks(specgen):
    args = ["run", "-n", "40", "--json", "--temp", "0.8", "--seed", "7", REPEAT]
    two, one = specgen(*args), specgen(*args, ranks=1)
    assert json.loads(two.stdout)["text"] == json.loads(one.stdout)["text"]


def test_a_model_that_cannot_be_sharded_is_one_line(specgen, tmp_path):
    folder = tmp_path / "mamba"
    folder.mkdir()
    mx.save_safetensors(str(folder / "model.safetensors"), dict(tree_flatten(tiny_model("mamba").parameters())))
    (folder / "config.json").write_text(json.dumps(TINY["mamba"]))
    for f in ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"]:
        shutil.copy(registry.bundled_path("stories260K") / f, folder / f)
    r = specgen("run", "-m", str(folder), "-n", "8", "Hi")
    # mlx.launch itself exits 0 whatever its ranks do; it says how each ended.
    assert "exited with code 1" in r.stderr, r.stderr
    assert "cannot be split over 2 processes" in r.stderr and r.stderr.count("specgen:") == 1


def test_standard_input_is_refused_under_launch_instead_of_waiting(specgen):
    r = specgen("run", "-n", "8", "-")
    assert "cannot come from standard input under mlx.launch" in r.stderr and r.stderr.count("specgen:") == 1
    r = specgen("run", "-n", "8")
    assert "the prompt is empty" in r.stderr and "exited with code 1" in r.stderr


def test_bench_runs_on_two_ranks_against_mlx_lm_on_the_same_sharded_model(specgen, tmp_path):
    prompts = tmp_path / "p.txt"
    prompts.write_text(REPEAT + "\n")
    r = specgen("bench", "--prompts", str(prompts), "-n", "24", "--repeats", "1", "--json")
    (row,) = json.loads(r.stdout)
    assert (row["ranks"], row["sharding"], row["identical"]) == (2, "tensor over 2 ranks", True)
