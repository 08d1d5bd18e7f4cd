"""`batch_generate` against mlx-lm's: the same call returns mlx-lm's BatchResponse, each text the
one `specgen.generate` gives that prompt alone (greedy: mlx_lm.batch_generate's too; seeded: the
same seed alone); models whose caches cannot batch run one prompt at a time, with a warning."""

import warnings

import mlx_lm
import pytest
from conftest import SHARED, tiny_model
from mlx_lm.generate import BatchResponse

import specgen
from specgen import SpecgenWarning, batch_generate
from specgen.engine import batch_cost, calibrate
from specgen.errors import SettingError

SMOLLM2 = SHARED / "models" / "smollm2-135m-instruct-4bit"
PROMPTS = ["Once upon a time, there was a little girl named Lily. She loved to play outside. Lily",
           "Tim and Sam went to the park", "Bob", "The cat sat on the mat. The cat sat on the"]


@pytest.fixture(scope="module")
def demo():
    """The demo model, its step costs (alone and batched) measured quickly: these tests are not
    about the curves."""
    with pytest.MonkeyPatch.context() as m:
        m.setattr(calibrate, "BUDGET_S", 0.5)
        m.setattr(batch_cost, "BUDGET_S", 0.5)
        model, tokenizer = specgen.load("demo")
        batch_generate(model, tokenizer, ["Once"], max_tokens=2)
    return model, tokenizer


def test_greedy_texts_equal_mlx_lm_batch_generate_and_each_prompt_alone(demo):
    model, tokenizer = demo
    ids = [tokenizer.encode(p) for p in PROMPTS]
    ours = batch_generate(model, tokenizer, ids, max_tokens=[60, 50, 40, 70], completion_batch_size=3,
                          return_token_ids=True)
    theirs = mlx_lm.batch_generate(model, tokenizer, ids, max_tokens=[60, 50, 40, 70], return_token_ids=True)
    assert isinstance(ours, BatchResponse) and ours.texts == theirs.texts
    assert ours.token_ids == theirs.token_ids
    assert ours.texts == [specgen.generate(model, tokenizer, p, max_tokens=n)
                          for p, n in zip(ids, [60, 50, 40, 70])]
    s = ours.stats
    assert s.prompt_tokens == sum(len(p) - 1 for p in ids)  # the last prompt token starts decoding
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


def test_a_model_that_cannot_batch_runs_one_prompt_at_a_time(demo):
    _, tokenizer = demo  # the tiny models share the demo's vocabulary size
    model = tiny_model("mamba")
    prompts = [[10, 11, 12, 10, 11, 12], [40, 41]]
    with pytest.warns(SpecgenWarning, match="one at a time.*MambaCache|one at a time.*ArraysCache"):
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


def test_a_model_that_reads_one_position_runs_one_prompt_at_a_time(demo):
    model, tokenizer = OnePosition(demo[0]), demo[1]
    with pytest.warns(SpecgenWarning, match="one at a time: its forward pass does not take per-row positions"):
        ours = batch_generate(model, tokenizer, PROMPTS[:2], max_tokens=10, draft=2)
    assert ours.texts == [specgen.generate(model, tokenizer, p, max_tokens=10, draft=2) for p in PROMPTS[:2]]


@pytest.mark.skipif(not SMOLLM2.is_dir(), reason="the shared models sit beside the repository")
def test_the_shared_chat_model_batched_equals_it_alone():
    # Its 4-bit passes cost ~k times one position on this CPU: short raw prompts, short answers.
    model, tokenizer = specgen.load(str(SMOLLM2))
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
