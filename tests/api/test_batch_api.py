"""`batch_generate` against mlx-lm's: the same call returns mlx-lm's BatchResponse, each text the
one `specgen.generate` gives that prompt alone (greedy: mlx_lm.batch_generate's too; seeded: the
same seed alone); models whose caches cannot batch run one prompt at a time, with a warning."""

import warnings

import mlx_lm
import pytest
from conftest import needs_smollm2, tiny_model
from mlx_lm.generate import BatchResponse
from mlx_lm.sample_utils import make_sampler
from mlx_lm.tokenizer_utils import TokenizerWrapper

import specgen
from specgen import SpecgenWarning, batch_generate
from specgen.engine.batch.streams import Streams
from specgen.engine.cost import calibrate, grid
from specgen.errors import SettingError

PROMPTS = ["Once upon a time, there was a little girl named Lily. She loved to play outside. Lily",
           "Tim and Sam went to the park", "Bob", "The cat sat on the mat. The cat sat on the"]


@pytest.fixture(scope="module")
def demo():
    """The demo model, its step costs (alone and batched) measured quickly: these tests are not
    about the curves."""
    with pytest.MonkeyPatch.context() as m:
        m.setattr(calibrate, "BUDGET_S", 0.5)
        m.setattr(grid, "BUDGET_S", 0.5)
        model, tokenizer = specgen.load("demo")
        batch_generate(model, tokenizer, ["Once"], max_tokens=2)
    return model, tokenizer


def test_greedy_texts_equal_mlx_lm_batch_generate_and_each_prompt_alone(demo, monkeypatch):
    model, tokenizer = demo
    ids = [tokenizer.encode(p) for p in PROMPTS]
    rows, step = [], Streams.step
    monkeypatch.setattr(Streams, "step", lambda self: rows.append(len(self.batch.rows)) or step(self))
    with warnings.catch_warnings():
        warnings.simplefilter("error", SpecgenWarning)  # running them one at a time would warn
        ours = batch_generate(model, tokenizer, ids, max_tokens=[60, 50, 40, 70], completion_batch_size=3,
                              return_token_ids=True)
    assert max(rows) == 3  # decoded together, as many as completion_batch_size lets
    theirs = mlx_lm.batch_generate(model, tokenizer, ids, max_tokens=[60, 50, 40, 70], return_token_ids=True)
    assert isinstance(ours, BatchResponse) and ours.texts == theirs.texts
    assert ours.token_ids == theirs.token_ids
    assert ours.texts == [specgen.generate(model, tokenizer, p, max_tokens=n)
                          for p, n in zip(ids, [60, 50, 40, 70])]
    s = ours.stats
    # The last prompt token starts decoding; every prompt opens with BOS, which the first computes
    # and the others take (engine/batch/share.py).
    assert s.prompt_tokens == sum(len(p) - 1 for p in ids) - (len(ids) - 1)
    assert s.generation_tokens == sum(map(len, ours.token_ids)) and 0 < s.generation_steps < s.generation_tokens


def test_seeded_sampling_and_stop_strings_as_alone(demo):
    model, tokenizer = demo
    ours = batch_generate(model, tokenizer, PROMPTS, max_tokens=50, temp=0.8, seed=[3, 4, 5, 6], stop=["."])
    alone = [specgen.generate(model, tokenizer, p, max_tokens=50, temp=0.8, seed=s, stop=".")
             for p, s in zip(PROMPTS, [3, 4, 5, 6])]
    assert ours.texts == alone and all("." not in t for t in ours.texts)


def test_what_it_does_not_offer_is_an_error_naming_it(demo):
    model, tokenizer = demo
    with pytest.raises(SettingError, match="return_logprobs"):
        batch_generate(model, tokenizer, PROMPTS, return_logprobs=True)
    with pytest.raises(SettingError, match="speed"):
        batch_generate(model, tokenizer, PROMPTS, speed=2)
    with pytest.raises(SettingError, match="completion_batch_size must be at least 1"):
        batch_generate(model, tokenizer, PROMPTS, completion_batch_size=0)
    with pytest.raises(SettingError, match="seed"):
        batch_generate(model, tokenizer, PROMPTS, temp=0.5, seed=[1, 2])
    # A string is one value of the wrong kind, not one per character (it was "one per prompt").
    with pytest.raises(SettingError, match=r'^max_tokens must be an integer \(got "5"\)$'):
        batch_generate(model, tokenizer, PROMPTS, max_tokens="5")
    with pytest.raises(SettingError, match=r'^seed must be an integer \(got "3"\)$'):
        batch_generate(model, tokenizer, PROMPTS, temp=0.5, seed="3")
    greedy = make_sampler(0.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SpecgenWarning)  # "top_p has no effect at temperature 0"
        for kind in ({"top_p": 0.9}, {"top_k": 5}, {"min_p": 0.1}, {"temp": 0.5}, {"seed": 3}):
            with pytest.raises(SettingError, match="sampler and temp/top_p"):  # as specgen.generate refuses
                batch_generate(model, tokenizer, PROMPTS, sampler=greedy, **kind)
            with pytest.raises(SettingError, match="sampler and temp/top_p"):
                specgen.generate(model, tokenizer, PROMPTS[0], sampler=greedy, **kind)


def test_what_changes_nothing_is_a_warning(demo):
    model, tokenizer = demo
    with pytest.warns(SpecgenWarning, match="prefill_batch_size changes nothing"):
        ours = batch_generate(model, tokenizer, PROMPTS[:2], max_tokens=5, prefill_batch_size=4)
    assert ours.texts == [specgen.generate(model, tokenizer, p, max_tokens=5) for p in PROMPTS[:2]]


def test_a_model_that_cannot_batch_runs_one_prompt_at_a_time(demo):
    _, tokenizer = demo  # the tiny models share the demo's vocabulary size
    model = tiny_model("mamba")
    prompts = [[10, 11, 12, 10, 11, 12], [40, 41]]
    with pytest.warns(SpecgenWarning, match="one at a time.*read the padding"):
        ours = batch_generate(model, tokenizer, prompts, max_tokens=12, draft=4, return_token_ids=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SpecgenWarning)
        alone = [specgen.generate(model, tokenizer, p, max_tokens=12, draft=4) for p in prompts]
    assert ours.texts == alone and [len(t) for t in ours.token_ids] == [12, 12]
    assert ours.stats.generation_tokens == 24


class OnePosition:
    """A real model behind code that reads the cache's offset as one number (as some model code
    does): it cannot take a batch's per-row positions."""

    def __init__(self, model):
        self.model, self.layers = model, model.layers

    def __call__(self, x, cache):
        int(cache[0].offset)
        return self.model(x, cache=cache)

    def parameters(self):
        return self.model.parameters()


def test_a_model_that_reads_one_position_runs_one_prompt_at_a_time(demo, capsys):
    # The demo's stop tokens (its engine's, from models.toml), so the second prompt ends on one.
    model, tokenizer = OnePosition(demo[0]), TokenizerWrapper(demo[1]._tokenizer, eos_token_ids=[1, 2])
    prompts, limits = [PROMPTS[1], PROMPTS[3]], [10, 200]
    with pytest.warns(SpecgenWarning, match="one at a time: its forward pass does not take per-row positions"):
        ours = batch_generate(model, tokenizer, prompts, max_tokens=limits, draft=2, verbose=True)
    assert "[batch_generate] Finished processing 2/2\n" in capsys.readouterr().out  # verbose as batched
    assert ours.texts == [specgen.generate(model, tokenizer, p, max_tokens=n, draft=2)
                          for p, n in zip(prompts, limits)]
    batched = batch_generate(demo[0], demo[1], prompts, max_tokens=limits, draft=2, return_token_ids=True)
    assert batched.texts == ours.texts and len(batched.token_ids[1]) < limits[1]
    # The work is counted as the batch counts it: the stop token generated, the last prompt token
    # decoded (in a batch, the second prompt takes the BOS the first computed).
    assert ((ours.stats.prompt_tokens, ours.stats.generation_tokens)
            == (batched.stats.prompt_tokens + 1, batched.stats.generation_tokens))


@needs_smollm2
def test_the_shared_chat_model_batched_equals_it_alone(smollm2_engine):
    # Its 4-bit passes cost ~k times one position on this CPU: short raw prompts, short answers.
    model, tokenizer = smollm2_engine.loaded.model, smollm2_engine.loaded.tokenizer  # mlx_lm.load's pair
    prompts = ["1, 2, 3, 4, 5,", "The capital of France is"]
    ours = batch_generate(model, tokenizer, prompts, max_tokens=8, draft=2, return_token_ids=True)
    assert ours.token_ids == [alone(model, tokenizer, p, max_tokens=8, draft=2) for p in prompts]
    seeded = batch_generate(model, tokenizer, prompts, max_tokens=5, draft=2, temp=0.7, seed=[11, 12],
                            return_token_ids=True)
    assert seeded.token_ids == [alone(model, tokenizer, p, max_tokens=5, draft=2, temp=0.7, seed=s)
                                for p, s in zip(prompts, [11, 12])]


def alone(model, tokenizer, prompt, **kwargs) -> list[int]:
    """The tokens specgen.stream_generate emits for `prompt` (a stop token excluded)."""
    *_, last = specgen.stream_generate(model, tokenizer, prompt, **kwargs)
    return last.stats.output_ids


def test_a_grammar_that_gives_up_empties_its_own_text_with_a_warning_naming_it(demo):
    model, tokenizer = demo
    endless = {"type": "grammar", "grammar": 'start: "a" start'}
    with pytest.warns(SpecgenWarning, match="prompt 1: response_format could not be followed"):
        ours = batch_generate(model, tokenizer, PROMPTS[:3], max_tokens=20, response_format=[None, endless, None])
    assert ours.texts[1] == "" and [ours.texts[0], ours.texts[2]] == \
        [specgen.generate(model, tokenizer, p, max_tokens=20) for p in (PROMPTS[0], PROMPTS[2])]
