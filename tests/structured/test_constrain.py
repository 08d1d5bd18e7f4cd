"""Structured outputs in the engine: every constrained output is plain constrained decoding's (mlx-lm
with an llguidance logits processor, written apart from specgen's engine), speculating or not,
alone or batched; forced tokens are drafted; masks are applied only where a choice is forbidden."""

import importlib.util
import json
import math
import re
from pathlib import Path

import jsonschema
import llguidance.hf
import mlx.core as mx
import pytest
from conftest import SMOLLM2, needs_smollm2
from mlx_lm.generate import generate_step

import specgen
from specgen import batch_generate
from specgen.engine.decode import constrain
from specgen.engine.engine import Request
from specgen.engine.options import Options
from specgen.errors import SettingError
from specgen.stats import RunStats
from specgen.structured.formats import Format, grammar_text, parse

_BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "structured.py"
_spec = importlib.util.spec_from_file_location("structured_bench", _BENCH)
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)

SCHEMA = {"type": "object", "additionalProperties": False, "required": ["hero", "mood", "friends"],
          "properties": {"hero": {"type": "string", "maxLength": 12}, "mood": {"enum": ["happy", "sad", "scared"]},
                         "friends": {"type": "array", "items": {"type": "string", "maxLength": 10}, "maxItems": 3}}}
LARK = 'start: "Once upon a time, there was a " NAME " named " NAME ". " SENT\nNAME: /[a-z]+/\nSENT: /[A-Z][a-z ,]+\\./'
FIXED = "Once upon a time there was a little dog"
FORMATS = {"schema": {"type": "json_schema", "json_schema": {"name": "story", "schema": SCHEMA}},
           "lark": {"type": "grammar", "grammar": LARK}}
ONCE = "Once upon a time"


@pytest.fixture(scope="module")
def demo(demo_engine):
    return demo_engine.loaded.model, demo_engine.loaded.tokenizer


def reference(engine, prompt_ids: list[int], fmt, max_tokens: int) -> list[int]:
    """Plain constrained greedy decoding by mlx-lm's generate_step and an llguidance processor."""
    ll = llguidance.hf.from_tokenizer(engine.loaded.tokenizer._tokenizer, eos_token=sorted(engine.loaded.stop_ids))
    proc = bench.GuidanceProcessor(ll, grammar_text(parse(fmt)), len(prompt_ids))
    out = []
    for token, _ in generate_step(mx.array(prompt_ids), engine.loaded.model, max_tokens=max_tokens,
                                  logits_processors=[proc]):
        if token in engine.loaded.stop_ids:
            break
        out.append(token)
    return out


def tokens(model, tok, prompt, **kw) -> tuple[list[int], object]:
    """specgen.stream_generate's output ids (a stop token left out) and its last response."""
    last = None
    for last in specgen.stream_generate(model, tok, prompt, **kw):
        pass
    return list(last.stats.output_ids), last


def valid(name: str, text: str) -> None:
    if name == "schema":
        jsonschema.validate(json.loads(text), SCHEMA)
    else:
        assert re.fullmatch(r"Once upon a time, there was a [a-z]+ named [a-z]+\. [A-Z][a-z ,]+\.", text)


@pytest.mark.parametrize("name", list(FORMATS))
def test_constrained_greedy_is_plain_constrained_decoding(demo_engine, demo, name):
    model, tok = demo
    ids = tok.encode(ONCE)
    expected = reference(demo_engine, ids, FORMATS[name], 80)
    for draft in (0, 4):  # the adaptive drafter: test_the_adaptive_drafter_constrained_through_the_engine
        got, last = tokens(model, tok, ids, max_tokens=80, response_format=FORMATS[name], draft=draft)
        assert got == expected, f"draft={draft}"
        assert last.finish_reason == "stop"
        valid(name, tok.decode(got))


def test_forced_tokens_are_drafted_and_each_step_verifies_them(demo):
    model, tok = demo
    fixed = {"type": "grammar", "grammar": f'start: "{FIXED}"'}
    plain, one = tokens(model, tok, ONCE, max_tokens=40, response_format=fixed, draft=0)
    got, four = tokens(model, tok, ONCE, max_tokens=40, response_format=fixed, draft=4)
    assert got == plain and tok.decode(got) == FIXED
    assert one.stats.counts.steps == len(plain) + 1  # every token, then the end, a pass each
    # Every token is forced: a step verifies 4 of them and emits a fifth, the end included.
    assert four.stats.counts.steps == math.ceil((len(plain) + 1) / 5)


def test_seeded_sampling_under_a_grammar_is_unchanged_by_speculation(demo):
    model, tok = demo
    for extra in ({}, {"top_k": 20}):  # with a filter every verified row is masked
        runs = [tokens(model, tok, ONCE, max_tokens=60, response_format=FORMATS["schema"], temp=0.9, seed=5,
                       draft=d, **extra)[0] for d in (0, 4)]
        assert runs[0] == runs[1], extra
        valid("schema", tok.decode(runs[0]))


def test_a_mask_is_applied_only_where_the_choice_is_forbidden(demo, monkeypatch):
    model, tok = demo
    applied = []
    real = constrain.masked
    monkeypatch.setattr(constrain, "masked", lambda logits, masks: applied.append(len(masks)) or real(logits, masks))
    got, last = tokens(model, tok, ONCE, max_tokens=80, response_format=FORMATS["lark"], draft=4)
    assert 0 < sum(applied) < len(got) / 2  # the model's own choice stands wherever it may


def test_batched_rows_with_different_formats_each_equal_their_solo_run(demo):
    model, tok = demo
    prompts = [ONCE, "The little dog", ONCE]
    formats = [FORMATS["schema"], FORMATS["lark"], None]
    batched = batch_generate(model, tok, prompts, max_tokens=90, response_format=formats, draft=4,
                             return_token_ids=True)
    for p, f, out in zip(prompts, formats, batched.token_ids):
        assert out == tokens(model, tok, p, max_tokens=90, response_format=f, draft=4)[0]
    valid("schema", batched.texts[0])
    valid("lark", batched.texts[1])


def test_an_answer_cut_by_max_tokens_says_length(demo):
    model, tok = demo
    _, last = tokens(model, tok, ONCE, max_tokens=5, response_format=FORMATS["schema"], draft=4)
    assert last.finish_reason == "length"


@pytest.mark.parametrize("value,field", [
    ({"type": "xml"}, "response_format.type"),
    ({"type": "json_schema", "json_schema": {"name": "x"}}, "response_format.json_schema.schema"),
    ({"type": "json_schema", "schema": "{}"}, "response_format.schema"),
    ({"type": "grammar", "grammar": ""}, "response_format.grammar"),
    ("json", "response_format"),
])
def test_a_format_of_the_wrong_shape_names_its_field(demo, value, field):
    model, tok = demo
    with pytest.raises(SettingError) as e:
        specgen.generate(model, tok, ONCE, max_tokens=4, response_format=value)
    assert e.value.param == field


@pytest.mark.parametrize("value,reason", [
    ({"type": "json_schema", "schema": {"not": {"type": "string"}}}, "Unimplemented keys"),
    ({"type": "json_schema", "schema": {"type": "strin"}}, "strin"),
    ({"type": "grammar", "grammar": "start: foo |"}, "unknown name"),
    # a regex's reason comes on its last line: it was cut to "regex parse error:"
    ({"type": "json_schema", "schema": {"type": "string", "pattern": "[a-"}},
     "regex parse error: unclosed character class$"),
])
def test_a_format_that_does_not_compile_says_why(demo, value, reason):
    model, tok = demo
    with pytest.raises(SettingError, match=reason) as e:
        specgen.generate(model, tok, ONCE, max_tokens=4, response_format=value)
    assert e.value.param == "response_format"


def test_formats_read_every_shape_and_text_is_none():
    class Story:  # what a Pydantic model offers
        @staticmethod
        def model_json_schema():
            return SCHEMA

    chat = parse({"type": "json_schema", "json_schema": {"name": "s", "schema": SCHEMA, "strict": True}})
    assert chat == parse({"type": "json_schema", "name": "s", "schema": SCHEMA}) == Format("json_schema", json.dumps(SCHEMA, separators=(",", ":")), "s")
    assert parse(Story).source == chat.source and parse({"type": "text"}) is None
    assert parse({"type": "json_object"}).kind == "json_object"


def test_a_grammar_with_an_mlx_lm_sampler_is_refused(demo):
    model, tok = demo
    with pytest.raises(SettingError, match="mlx-lm sampler") as e:
        specgen.generate(model, tok, ONCE, max_tokens=4, response_format=FORMATS["lark"],
                         sampler=lambda x: mx.argmax(x, axis=-1))
    assert e.value.param == "response_format"


def test_the_adaptive_drafter_constrained_through_the_engine(demo_engine):
    ids = demo_engine.encode(ONCE, raw=True)
    stats = RunStats()
    for _ in demo_engine.stream(Request(ids, Options(max_tokens=80, response_format=parse(FORMATS["lark"]))), stats):
        pass
    assert stats.output_ids == reference(demo_engine, ids, FORMATS["lark"], 80)


@needs_smollm2
def test_smollm2_json_extraction_is_plain_constrained_decoding(smollm2_engine):
    model, tok = smollm2_engine.loaded.model, smollm2_engine.loaded.tokenizer
    schema = {"type": "object", "additionalProperties": False, "required": ["name", "age"],
              "properties": {"name": {"type": "string"}, "age": {"type": "integer"}}}
    ids = tok.encode("Alice Brown, 34, as JSON:")  # no chat template: a 4-bit prefill is slow on a CPU
    fmt = {"type": "json_schema", "json_schema": {"name": "p", "schema": schema}}
    expected = reference(smollm2_engine, ids, fmt, 24)
    got, last = tokens(model, tok, ids, max_tokens=24, response_format=fmt, draft=4)
    assert got == expected
    jsonschema.validate(json.loads(tok.decode(expected)), schema)
    assert last.stats.counts.steps < len(expected)  # the keys are forced, the values copied


@needs_smollm2
def test_a_reasoning_model_thinks_freely_and_its_answer_obeys(tmp_path):
    """With the model's thinking markers (special tokens mlx-lm knows), a schema holds the answer
    after the thinking block, which may be skipped, or is open already when the prompt opened it."""
    from mlx_lm.tokenizer_utils import load as load_tokenizer
    from transformers import AutoTokenizer

    from specgen.structured.grammar import Grammars

    hf = AutoTokenizer.from_pretrained(str(SMOLLM2))
    hf.add_special_tokens({"additional_special_tokens": ["<think>", "</think>"]})
    hf.save_pretrained(tmp_path)
    tok = load_tokenizer(tmp_path)
    assert tok.has_thinking
    grammars = Grammars(tok, [tok.eos_token_id])
    fmt = parse({"type": "json_schema", "schema": {"type": "object", "properties": {"a": {"type": "integer"}},
                                                   "required": ["a"]}})
    enc = lambda text: tok.encode(text, add_special_tokens=False)
    thought, answer = enc('<think>maybe {"b": 1}?</think>'), enc('{"a":5}')
    fresh = grammars.matcher(fmt, enc("Hi"))
    assert fresh.valid(thought + answer) == len(thought + answer) and fresh.valid(answer) == len(answer)
    assert fresh.valid(enc('{"b":1}')) < len(enc('{"b":1}'))  # the answer is held
    opened = grammars.matcher(fmt, enc("Hi <think>"))
    inside = enc('maybe {"b": 1}?</think>')
    assert opened.valid(inside + answer) == len(inside + answer)
    assert opened.valid(thought) < len(thought)  # already inside: no second opening


# A schema that compiles but requires an object nesting forever: llguidance gives up at the first
# step ("Too many items"), and a grammar with no base case does the same.
ENDLESS = [{"type": "json_schema", "json_schema": {"name": "n", "schema": {
               "$defs": {"n": {"type": "object", "properties": {"c": {"$ref": "#/$defs/n"}}, "required": ["c"]}},
               "$ref": "#/$defs/n"}}},
           {"type": "grammar", "grammar": 'start: "a" start'}]


@pytest.mark.parametrize("fmt", ENDLESS, ids=["schema", "lark"])
def test_a_grammar_that_gives_up_fails_its_own_request_alone_in_one_line(demo_engine, fmt):
    from specgen.engine.batch.streams import Streams
    from specgen.events import Failed
    from specgen.structured.grammar import GrammarFailed

    # (the schema is refused by parse, structured/unanswerable.py: made by hand, it reaches the engine)
    fmt = Format("json_schema", json.dumps(fmt["json_schema"]["schema"])) if "json_schema" in fmt else parse(fmt)
    bad = Request(demo_engine.encode(ONCE), Options(max_tokens=30, response_format=fmt))
    with pytest.raises(GrammarFailed) as alone:
        list(demo_engine.stream(bad))
    message = str(alone.value)
    assert message.startswith("response_format could not be followed: ") and "\n" not in message
    assert "<state>" not in message and "$defs" not in message
    plain = [Request(demo_engine.encode(p), Options(max_tokens=20)) for p in (ONCE, "The little dog")]
    expected = ["".join(r.text for r in demo_engine.stream(p)) for p in plain]
    streams = Streams(demo_engine, max_rows=4)
    for key, request in [(0, plain[0]), ("bad", bad), (1, plain[1])]:
        streams.add(key, request)
    texts, failed = {0: "", 1: ""}, []
    while streams.busy:
        for key, response in streams.step():
            if isinstance(response, Failed):
                failed.append((key, str(response.error)))
            else:
                texts[key] += response.text
    assert failed == [("bad", message)] and [texts[0], texts[1]] == expected


def test_a_draft_that_runs_past_the_grammars_end_is_cut_there(demo_engine):
    # A tool call copied from earlier in the conversation is drafted with the end-of-turn token
    # after it; the grammar had ended (stopped), and checking that token failed the request
    # ("parser stopped in consume_token") where plain constrained decoding gives the call.
    from specgen.engine.decode.sampling import GREEDY, Verified

    fixed = parse({"type": "grammar", "grammar": f'start: "{FIXED}"'})
    constraint = constrain.Constraint(demo_engine.grammars.matcher(fixed), GREEDY)
    said = constraint.matcher.forced()
    constraint.advance(said[:-2])
    eos = sorted(demo_engine.loaded.stop_ids)[0]
    drafts = [*said[-2:], eos]
    rows = mx.zeros((len(drafts) + 1, demo_engine.loaded.model.args.vocab_size))
    got = constraint.verified(Verified([*drafts, 7], len(drafts) + 1), rows, drafts, 40)
    assert got.tokens[:3] == drafts  # the draft's end is the grammar's: the step is cut there
    assert constraint.matcher.forced() == said[-2:]  # the grammar is where it was


def test_only_schemas_no_finite_output_obeys_are_refused_before_compiling():
    from specgen.structured.unanswerable import why_unanswerable

    node = {"type": "object", "properties": {"c": {"$ref": "#/$defs/n"}}, "required": ["c"]}
    refused = [{"$defs": {"n": node}, "$ref": "#/$defs/n"}, {"$ref": "#"},
               {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"},
               {"$defs": {"n": {"type": "array", "minItems": 1, "items": {"$ref": "#/$defs/n"}}}, "$ref": "#/$defs/n"},
               {"type": "integer", "minimum": 1e30}, {"type": "integer", "maximum": -1e20},
               {"type": "integer", "minimum": 5, "maximum": 4}]
    kept = [{"$defs": {"n": {**node, "required": []}}, "$ref": "#/$defs/n"},  # the field may be left out
            {"$defs": {"n": {"anyOf": [{"type": "null"}, node]}}, "$ref": "#/$defs/n"},  # a way out
            {"$defs": {"n": {"type": "object", "properties": {"kids": {"type": "array", "items": {"$ref": "#/$defs/n"}}},
                             "required": ["kids"]}}, "$ref": "#/$defs/n"},  # an empty list ends it
            {"type": "integer", "minimum": -(2**63), "maximum": 2**63 - 1}, SCHEMA, True, {"$ref": "#/nowhere"}]
    assert all(why_unanswerable(s) for s in refused)
    assert [why_unanswerable(s) for s in kept] == [None] * len(kept)
    with pytest.raises(SettingError, match="no output can end") as e:
        parse({"type": "json_schema", "json_schema": {"name": "n", "schema": {"$ref": "#"}}})
    assert e.value.param == "response_format.json_schema.schema"
