"""The Python API against mlx-lm's own: the same calls, the same text, token for token.

`specgen.load/generate/stream_generate` must be drop-in replacements for mlx-lm's: a loop
written for mlx_lm.stream_generate runs unchanged and joins to the same text; `from_draft` marks
the tokens that came from accepted drafts; a prompt cache carries a conversation across calls.
"""

import json
import warnings
from pathlib import Path

import mlx.core as mx
import mlx_lm
import pytest
from conftest import SMOLLM2, needs_smollm2
from mlx_lm.generate import GenerationResponse
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.sample_utils import make_logits_processors, make_sampler

import specgen
from specgen.engine.load import registry
from specgen.errors import SettingError

PROMPTS = Path(__file__).resolve().parents[2] / "benchmarks" / "prompts"
ONCE = "Once upon a time, there was a little girl named Lily. She loved to play outside"


@pytest.fixture(scope="module")
def demo():
    return specgen.load("demo")


@pytest.fixture(scope="module")
def demo_mlx_lm():
    return mlx_lm.load(registry.local_source("bundled:stories260K"))


@pytest.fixture(scope="module")
def smollm2():
    """SmolLM2 as specgen.load loads it (its own load: what is checked is the engine that load
    makes and registers for the pair)."""
    return specgen.load(str(SMOLLM2))


@pytest.fixture(scope="module")
def smollm2_mlx_lm(smollm2_engine):
    """The shared SmolLM2's pair: what mlx_lm.load returns (registry.load is mlx_lm.load), and
    unknown to specgen's API, which makes an engine for it on first use as for any mlx-lm pair."""
    return smollm2_engine.loaded.model, smollm2_engine.loaded.tokenizer


SHORTEST = (("chat", 11), ("code_fix", 7), ("chat", 16), ("chat", 0), ("chat", 1))  # 34-81 tokens


def chat_prompts(tokenizer) -> list[str]:
    """The shortest prompts of the four sets (a 4-bit prefill costs ~k times one position on this
    CPU), templated as mlx-lm's tokenizer does."""
    rows = [json.loads(open(PROMPTS / f"{name}.jsonl").readlines()[i]) for name, i in SHORTEST]
    return [tokenizer.apply_chat_template(r.get("messages") or [{"role": "user", "content": r["prompt"]}],
                                          add_generation_prompt=True, tokenize=False) for r in rows]


def mlx_lm_loop(stream_generate, model, tokenizer, prompt, **kw):
    """A loop as written for mlx-lm: joins the text; also returns every response."""
    text, responses = "", []
    for response in stream_generate(model, tokenizer, prompt, **kw):
        text += response.text
        responses.append(response)
    return text, responses


@needs_smollm2
@pytest.mark.usefixtures("quick_calibration")  # the pair's engine measures its own curve: not what is checked
def test_generate_is_mlx_lm_generate_on_real_prompts(smollm2, smollm2_mlx_lm):
    model, tokenizer = smollm2_mlx_lm
    # Two short chat prompts (a 4-bit position costs ~100 ms here): one through the model as
    # specgen loads it, one as mlx-lm loads it (an engine is made for that pair on first use).
    prompts = chat_prompts(tokenizer)
    for loaded, prompt in ((smollm2, prompts[2]), (smollm2_mlx_lm, prompts[3])):
        expected = mlx_lm.generate(model, tokenizer, prompt, max_tokens=12)
        assert specgen.generate(*loaded, prompt, max_tokens=12) == expected


@needs_smollm2
def test_a_stream_generate_loop_for_mlx_lm_runs_unchanged_and_marks_drafted_tokens(smollm2, smollm2_mlx_lm):
    model, tokenizer = smollm2_mlx_lm
    prompt = chat_prompts(tokenizer)[1]  # a bug fix: the answer copies the prompt's code
    expected, theirs = mlx_lm_loop(mlx_lm.stream_generate, model, tokenizer, prompt, max_tokens=32)
    text, ours = mlx_lm_loop(specgen.stream_generate, *smollm2, prompt, max_tokens=32, draft=8)
    assert text == expected and all(isinstance(r, GenerationResponse) for r in ours)
    assert [(r.token, r.finish_reason, r.generation_tokens) for r in ours] == [
        (r.token, r.finish_reason, r.generation_tokens) for r in theirs]
    stats = ours[-1].stats
    assert stats.speculation.on and stats.counts.accepted > 0
    assert sum(r.from_draft for r in ours) == stats.counts.accepted


def test_responses_are_mlx_lm_s_one_per_token_ending_with_the_reason(demo, demo_mlx_lm):
    mine = list(specgen.stream_generate(*demo, ONCE, max_tokens=30))
    theirs = list(mlx_lm.stream_generate(*demo_mlx_lm, ONCE, max_tokens=30))
    assert [(r.token, r.text, r.finish_reason) for r in mine] == [(r.token, r.text, r.finish_reason) for r in theirs]
    assert mine[-1].stats.counts.tokens == 30 and mine[-1].stats.finish_reason == "length"


def test_mlx_lm_samplers_and_logits_processors_give_mlx_lm_s_text(demo, demo_mlx_lm):
    kw = dict(max_tokens=40, sampler=make_sampler(temp=0.9, top_p=0.95),
              logits_processors=make_logits_processors(repetition_penalty=1.3))
    mx.random.seed(7)
    expected = mlx_lm.generate(*demo_mlx_lm, ONCE, **kw)
    mx.random.seed(7)
    assert specgen.generate(*demo, ONCE, **kw) == expected


def test_seeded_sampling_is_the_same_text_with_speculation_on_and_off(demo):
    on = specgen.generate(*demo, ONCE, max_tokens=60, temp=0.8, seed=3, draft=4)
    assert on == specgen.generate(*demo, ONCE, max_tokens=60, temp=0.8, seed=3, draft=0)
    assert on != specgen.generate(*demo, ONCE, max_tokens=60, temp=0.8, seed=4, draft=4)


def test_a_prompt_cache_carries_the_conversation_across_calls(demo):
    model, tokenizer = demo
    cache = make_prompt_cache(model)
    first = list(specgen.stream_generate(model, tokenizer, ONCE, max_tokens=20, prompt_cache=cache))
    more = tokenizer.encode(" Then one day", add_special_tokens=False)
    second = list(specgen.stream_generate(model, tokenizer, more, max_tokens=20, prompt_cache=cache))
    assert second[-1].stats.cached_tokens > 0
    # the same as the whole conversation (every token yielded included) in one uncached call
    whole = tokenizer.encode(ONCE) + [r.token for r in first] + more
    assert "".join(r.text for r in second) == specgen.generate(model, tokenizer, whole, max_tokens=20)


def test_stop_strings_end_the_text_before_them(demo):
    full = specgen.generate(*demo, ONCE, max_tokens=60)
    stop = full[20:24]
    cut = specgen.generate(*demo, ONCE, max_tokens=60, stop=[stop])
    assert cut == full[: full.index(stop)]


def test_a_prediction_is_a_draft_source_that_never_changes_the_text(demo):
    plain = list(specgen.stream_generate(*demo, ONCE, max_tokens=80))
    text = "".join(r.text for r in plain)
    predicted = list(specgen.stream_generate(*demo, ONCE, max_tokens=80, prediction=text, draft=None))
    assert "".join(r.text for r in predicted) == text
    stats = predicted[-1].stats
    assert 0 < stats.prediction_accepted <= stats.prediction_drafted
    wrong = specgen.generate(*demo, ONCE, max_tokens=80, prediction="A completely different story about a dog.")
    assert wrong == text


def test_errors_name_the_parameter(demo):
    with pytest.raises(SettingError) as e:
        specgen.generate(*demo, ONCE, max_tokenz=5)
    assert e.value.param == "max_tokenz"
    with pytest.raises(SettingError) as e:
        specgen.generate(*demo, ONCE, temp=-1)
    assert e.value.param == "temp"
    # A value of the wrong kind is refused as such, not as out of range ("5" read as the number 5).
    with pytest.raises(SettingError, match=r'^max_tokens must be an integer \(got "5"\)$'):
        specgen.generate(*demo, ONCE, max_tokens="5")
    with pytest.raises(SettingError, match=r'^top_p must be a number \(got "0.9"\)$'):
        specgen.generate(*demo, ONCE, temp=1.0, top_p="0.9")
    with pytest.raises(SettingError) as e:
        specgen.generate(*demo, ONCE, sampler=make_sampler(temp=0.5), temp=0.5)
    assert e.value.param == "sampler"
    foreign = make_prompt_cache(demo[0])
    mlx_lm.generate(*demo, ONCE, max_tokens=2, prompt_cache=foreign)  # filled by mlx-lm, not specgen
    with pytest.raises(SettingError) as e:
        specgen.generate(*demo, "more", prompt_cache=foreign)
    assert e.value.param == "prompt_cache"


def test_settings_that_change_nothing_are_warned_about(demo):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        specgen.generate(*demo, ONCE, max_tokens=4, top_k=5)  # greedy: top_k does nothing
    assert any("top_k" in str(w.message) for w in caught)
