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
    bad.write_text('{"prompt": "Once upon a time"}\n{"prompt": 3}\n{not json}\n{"prompt": "The dog"}\n')
    r = invoke(["run", "-n", "8", "--prompts", str(bad)])
    assert r.exit_code == 1
    out = [json.loads(x) for x in r.stdout.splitlines()]
    assert [("error" in x, x.get("line")) for x in out] == [(False, None), (True, 2), (True, 3), (False, None)]


def test_flags_that_do_not_fit_a_batch_are_refused_each_saying_why(prompts):
    for extra, why in ((["Once"], "the prompt argument ('Once') is not used with --prompts: each line"),
                       (["-f", str(prompts)], "--file cannot be used with --prompts: each line"),
                       (["--predict", str(prompts)], "--predict cannot be used with --prompts: a JSONL line"),
                       (["--color"], "--color cannot be used with --prompts: results are JSON lines")):
        r = invoke(["run", "--prompts", str(prompts), *extra])
        assert r.exit_code == 2 and r.stderr.startswith("specgen: error: ") and why in r.stderr, r.stderr
        assert r.stderr.count("\n") == 1 and ("prediction" in r.stderr) == (extra[0] == "--predict")
    r = invoke(["run", "-o", "out.jsonl", "Once"])
    assert r.exit_code == 2 and "--output needs --prompts" in r.stderr


BAD = ['{"id": "broken", "prompt": "torn', '{"id": "m", "nope": 1}', '{"id": "p0", "prompt": "a duplicate id"}',
       '{"prompt": ""}']


def test_a_rerun_adds_nothing_for_bad_lines_and_leaves_each_id_once(prompts, tmp_path):
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text(prompts.read_text() + "\n".join(BAD) + "\n")
    out = tmp_path / "out.jsonl"
    args = ["run", "-n", "6", "--batch", "8", "--prompts", str(mixed), "-o", str(out)]
    assert invoke(args).exit_code == 1
    first = out.read_bytes()
    r = invoke(args)  # the bad lines are bad still: their errors are there, nothing is added
    assert r.exit_code == 1 and out.read_bytes() == first
    assert f"{len(STARTS) + 4} skipped (4 bad lines, their errors already in" in r.stderr
    got = lines(out)
    assert len(got) == len(STARTS) + len(BAD)  # a line an input line
    assert sum("error" in x for x in got) == 4 and sum(x["id"] is None for x in got) == 2  # torn, dup
    ids = [x["id"] for x in got if x["id"] is not None]
    assert len(ids) == len(set(ids))
    # An earlier run's error for p3, and an older version's repeated errors: taken out, p3 run.
    errors = [x for x in got if "error" in x]
    out.write_bytes(b"".join(json.dumps(x).encode() + b"\n" for x in got if x["id"] != "p3")
                    + json.dumps({"id": "p3", "line": 4, "error": "out of memory"}).encode() + b"\n"
                    + b"".join(json.dumps(x).encode() + b"\n" for x in errors))
    assert invoke(args).exit_code == 1

    def outcomes(records):
        return sorted(json.dumps([x.get(k) for k in ("id", "line", "error", "text")]) for x in records)
    assert outcomes(lines(out)) == outcomes(got)


def test_a_file_that_mixes_jsonl_and_plain_lines_runs_every_line(tmp_path):
    mixed = tmp_path / "mixed.txt"
    mixed.write_text('The little dog\n{"id": "x", "prompt": "Once upon a time"}\nA cat sat on the mat\n')
    r = invoke(["run", "-n", "4", "--prompts", str(mixed)])
    assert r.exit_code == 0, r.output
    assert [(x["id"], "text" in x) for x in map(json.loads, r.stdout.splitlines())] == [
        ("1", True), ("x", True), ("3", True)]


def test_the_prompts_file_as_output_is_refused_under_any_name(prompts, tmp_path):
    before = prompts.read_bytes()
    (tmp_path / "soft.jsonl").symlink_to(prompts)
    os.link(prompts, tmp_path / "hard.jsonl")
    for out in (prompts, tmp_path / "soft.jsonl", tmp_path / "hard.jsonl"):
        r = invoke(["run", "--prompts", str(prompts), "-o", str(out)])
        assert r.exit_code == 2 and r.stderr.count("\n") == 1, r.output  # flags that cannot go together
        assert r.stderr.startswith(f"specgen: error: -o/--output is the prompts file ({out})")
    with prompts.open() as stdin:  # `--prompts - < FILE -o FILE`
        r = subprocess.run([sys.executable, "-m", "specgen", "run", "--prompts", "-", "-o", str(prompts)],
                           stdin=stdin, capture_output=True, text=True)
    assert r.returncode == 2 and "-o/--output is the prompts file" in r.stderr
    assert prompts.read_bytes() == before


def test_a_batch_killed_at_a_random_point_finishes_when_run_again(prompts, tmp_path):
    whole = tmp_path / "whole.jsonl"
    assert invoke(["run", "-n", "40", "--prompts", str(prompts), "-o", str(whole)]).exit_code == 0
    out = tmp_path / "out.jsonl"
    # Two rows at a time, so that results come out over the run rather than all at its end.
    cmd = [sys.executable, "-m", "specgen", "run", "-q", "-n", "40", "--batch", "2",
           "--prompts", str(prompts), "-o", str(out)]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    # results written before the kill (results come out in input order, so a few may be written at
    # once: the kill must land with some still to come)
    target = random.Random().randint(1, len(STARTS) - 4)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        if out.exists() and out.read_text().count("\n") >= target:
            break
        time.sleep(0.01)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    at_kill = out.read_bytes().count(b"\n")
    assert proc.returncode == -signal.SIGKILL and 1 <= at_kill < len(STARTS)  # the kill landed mid-run
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
