"""`specgen run --json-schema FILE / --grammar FILE`, and "response_format" lines in --prompts files."""

import json

import jsonschema
import pytest
from typer.testing import CliRunner

import specgen
from specgen.cli.commands import app

pytestmark = pytest.mark.usefixtures("quick_calibration")
runner = CliRunner()
SCHEMA = {"type": "object", "additionalProperties": False, "required": ["hero", "mood"],
          "properties": {"hero": {"type": "string", "maxLength": 12}, "mood": {"enum": ["happy", "sad"]}}}
GRAMMAR = 'start: "Once upon a time, there was a " NAME "."\nNAME: /[a-z]+/\n'


def invoke(args, input=None):
    result = runner.invoke(app, ["run", "-m", "demo", "-q", *args], input=input, env={"HF_HUB_OFFLINE": "1"})
    return result, getattr(result, "stderr", "")


def test_json_schema_and_grammar_files_constrain_the_output_as_the_library_does(tmp_path):
    (tmp_path / "s.json").write_text(json.dumps(SCHEMA))
    (tmp_path / "g.lark").write_text(GRAMMAR)
    model, tok = specgen.load("demo")
    for flag, name, fmt in (("--json-schema", "s.json", {"type": "json_schema", "schema": SCHEMA}),
                            ("--grammar", "g.lark", {"type": "grammar", "grammar": GRAMMAR})):
        result, _ = invoke([flag, str(tmp_path / name), "--draft", "4", "-n", "60", "Once upon a time"])
        assert result.exit_code == 0, result.output
        assert result.stdout.rstrip("\n") == specgen.generate(model, tok, "Once upon a time", max_tokens=60,
                                                              response_format=fmt, draft=0)
    jsonschema.validate(json.loads(invoke(["--json-schema", str(tmp_path / "s.json"), "x"])[0].stdout), SCHEMA)


@pytest.mark.parametrize("content,flag,message", [
    ('{"type": "strin"}', "--json-schema", "--json-schema does not compile: Invalid type: strin"),
    ("[1, 2]", "--json-schema", "must hold a JSON Schema"),
    ("{not json", "--json-schema", "is not JSON"),
    ("start: foo |", "--grammar", "--grammar does not compile"),
])
def test_a_bad_format_file_is_one_line_naming_the_flag(tmp_path, content, flag, message):
    (tmp_path / "f").write_text(content)
    result, err = invoke([flag, str(tmp_path / "f"), "Once upon a time"])
    assert result.exit_code == 1 and message in err and len(err.strip().splitlines()) == 1, err


def test_both_format_flags_are_refused(tmp_path):
    (tmp_path / "s.json").write_text(json.dumps(SCHEMA))
    (tmp_path / "g.lark").write_text(GRAMMAR)
    result, err = invoke(["--json-schema", str(tmp_path / "s.json"), "--grammar", str(tmp_path / "g.lark"), "x"])
    assert result.exit_code == 1 and "give one" in err


def test_prompts_lines_carry_their_own_format_and_a_bad_one_fails_alone(tmp_path):
    (tmp_path / "s.json").write_text(json.dumps(SCHEMA))
    lines = [{"id": "own", "prompt": "Once upon a time",
              "response_format": {"type": "grammar", "grammar": GRAMMAR}},
             {"id": "bad", "prompt": "Once upon a time",
              "response_format": {"type": "json_schema", "json_schema": {"schema": {"not": {}}}}},
             {"id": "shape", "prompt": "Once", "response_format": {"type": "xml"}},
             {"id": "run", "prompt": "Once upon a time"}]
    (tmp_path / "p.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    result, _ = invoke(["--prompts", str(tmp_path / "p.jsonl"), "--json-schema", str(tmp_path / "s.json"),
                        "-n", "60"])
    assert result.exit_code != 0  # some lines failed
    out = {r["id"]: r for r in map(json.loads, result.stdout.splitlines())}
    assert out["own"]["text"].startswith("Once upon a time, there was a ")
    assert "Unimplemented keys" in out["bad"]["error"]
    assert '"response_format".type' in out["shape"]["error"]
    jsonschema.validate(json.loads(out["run"]["text"]), SCHEMA)  # the run's --json-schema


@pytest.mark.parametrize("batch", ["1", "4"])
def test_a_grammar_that_never_ends_is_an_error_line_and_every_other_line_is_written(tmp_path, batch):
    # The line aborted the whole file with a 25-line parser dump, and -o stayed empty.
    lines = [{"id": f"p{i}", "prompt": p} for i, p in enumerate(["Once upon a time", "The little dog", "Tom"])]
    lines.insert(1, {"id": "endless", "prompt": "Once", "response_format": {"type": "grammar",
                                                                            "grammar": 'start: "a" start'}})
    (tmp_path / "p.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    out = tmp_path / "out.jsonl"
    result, _ = invoke(["--prompts", str(tmp_path / "p.jsonl"), "-o", str(out), "-n", "12", "--batch", batch])
    assert result.exit_code == 1, result.output
    rows = {r["id"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert set(rows) == {"p0", "endless", "p1", "p2"} and all("text" in rows[f"p{i}"] for i in range(3))
    error = rows["endless"]["error"]
    assert error.startswith("response_format could not be followed: ") and "\n" not in error
