"""`specgen run --prompts`: many prompts through one model load, a JSON line each, and a batch
killed at any point finishing when run again, every id exactly once; `--predict` on one run."""

import json
import os
import random
import signal
import subprocess
import sys
import time

import pytest
from typer.testing import CliRunner

from specgen.cli.commands import app

pytestmark = pytest.mark.usefixtures("quick_calibration")
runner = CliRunner()
STARTS = ["Once upon a time", "The little dog", "Tom and Sue went to the park", "One day, a bird",
          "Lily had a red ball", "The sun was hot", "Ben liked to draw", "A cat sat on the mat",
          "The old tree", "Mia wanted a cake", "It was raining", "The boy found a box"]


def invoke(args, input=None):
    return runner.invoke(app, args, input=input, env={"HF_HUB_OFFLINE": "1", "SPECGEN_MODEL": "demo"})


def lines(path):
    return [json.loads(x) for x in path.read_text().splitlines()]


@pytest.fixture
def prompts(tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps({"id": f"p{i}", "prompt": p}) + "\n" for i, p in enumerate(STARTS)))
    return path


def test_each_result_is_the_single_run_of_its_prompt(prompts):
    r = invoke(["run", "-n", "40", "--prompts", str(prompts)])
    assert r.exit_code == 0, r.output
    results = [json.loads(x) for x in r.stdout.splitlines()]
    assert [x["id"] for x in results] == [f"p{i}" for i in range(len(STARTS))]
    for x, start in list(zip(results, STARTS))[:3]:
        single = json.loads(invoke(["run", "-n", "40", "--json", start]).stdout)
        assert x["text"] == single["text"] and x["generated_tokens"] == single["generated_tokens"]


def test_plain_lines_from_stdin_and_a_bad_line_does_not_stop_the_others(tmp_path):
    r = invoke(["run", "-n", "8", "--prompts", "-"], input="Once upon a time\nThe little dog\n")
    assert r.exit_code == 0, r.output
    assert [json.loads(x)["id"] for x in r.stdout.splitlines()] == ["1", "2"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "Once upon a time"}\n{"prompt": 3}\nnot json\n{"prompt": "The dog"}\n')
    r = invoke(["run", "-n", "8", "--prompts", str(bad)])
    assert r.exit_code == 1
    out = [json.loads(x) for x in r.stdout.splitlines()]
    assert [("error" in x, x.get("line")) for x in out] == [(False, None), (True, 2), (True, 3), (False, None)]


def test_flags_that_do_not_fit_a_batch_are_refused(prompts):
    for extra in (["Once"], ["--predict", str(prompts)], ["--color"]):
        r = invoke(["run", "--prompts", str(prompts), *extra])
        assert r.exit_code == 1 and "--prompts" in r.stderr
    r = invoke(["run", "-o", "out.jsonl", "Once"])
    assert r.exit_code == 1 and "--output needs --prompts" in r.stderr


def test_a_batch_killed_at_a_random_point_finishes_when_run_again(prompts, tmp_path):
    whole = tmp_path / "whole.jsonl"
    assert invoke(["run", "-n", "40", "--prompts", str(prompts), "-o", str(whole)]).exit_code == 0
    out = tmp_path / "out.jsonl"
    cmd = [sys.executable, "-m", "specgen", "run", "-q", "-n", "40", "--prompts", str(prompts), "-o", str(out)]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    target = random.Random().randint(1, len(STARTS) - 2)  # results written before the kill
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        if out.exists() and out.read_text().count("\n") >= target:
            break
        time.sleep(0.01)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    with open(out, "a") as f:  # as if killed in the middle of writing a line
        f.write('{"id": "p99", "text": "half')
    assert subprocess.run(cmd, env=env, capture_output=True).returncode == 0
    got, expected = lines(out), lines(whole)
    assert sorted(x["id"] for x in got) == sorted(x["id"] for x in expected)  # each id exactly once
    assert {x["id"]: x["text"] for x in got} == {x["id"]: x["text"] for x in expected}


def test_predict_drafts_from_the_file_and_leaves_the_text_as_it_was(tmp_path):
    plain = json.loads(invoke(["run", "-n", "96", "--json", "Once upon a time"]).stdout)
    predicted = tmp_path / "predicted.txt"
    predicted.write_text(plain["text"])
    got = json.loads(invoke(["run", "-n", "96", "--json", "--predict", str(predicted), "Once upon a time"]).stdout)
    assert got["text"] == plain["text"]
    assert got["prediction_accepted"] > 0 and got["tokens_per_step"] >= 4
    r = invoke(["run", "--predict", str(tmp_path / "missing.txt"), "Once"])
    assert r.exit_code == 1 and "missing.txt" in r.stderr
