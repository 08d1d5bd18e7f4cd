import random

import mlx.core as mx
import pytest
from conftest import ScriptedModel, TableModel, plain_tokens, run, tiny_model
from mlx_lm.models.cache import make_prompt_cache

from specgen.draft.drafter import make_drafter
from specgen.engine.cost.curve import StepPrices
from specgen.engine.decode import sampling
from specgen.engine.decode.loop import generate
from specgen.errors import InputError
from specgen.events import Step

REPETITIVE = [10, 11, 12, 13, 14, 15] * 5
NOVEL = random.Random(0).sample(range(3, 500), 30)


@pytest.mark.parametrize("draft", [0, 4])
def test_golden_greedy_on_stories260k(stories, golden, draft):
    for case in golden:
        tokens, _, _ = run(stories.model, case["prompt_ids"], draft=draft, max_tokens=64,
                           stop_tokens=stories.stop_ids, context_length=stories.context_length)
        assert tokens == case["greedy_new_ids"], case["prompt"]


@pytest.mark.parametrize("arch", ["llama", "qwen2", "phi3", "gemma3_text", "stories"])
@pytest.mark.parametrize("prompt", [REPETITIVE, NOVEL], ids=["repetitive", "novel"])
def test_speculative_output_equals_mlx_lm_plain_greedy(arch, prompt, stories):
    model = stories.model if arch == "stories" else tiny_model(arch)
    tokens, steps, pre = run(model, prompt, max_tokens=200)
    assert pre.speculation.on
    assert tokens == plain_tokens(model, prompt, 200)
    if prompt is REPETITIVE:
        assert sum(s.accepted for s in steps) > 0
    assert len(steps) < 200 or sum(s.drafted for s in steps) > 0


def test_cache_holds_exactly_the_kept_tokens_after_rejections(stories):
    cache = make_prompt_cache(stories.model)
    prompt = stories.tokenizer.encode("Once upon a time, there was a dog. The dog was happy.")
    generated, rejected = 0, 0
    for ev in generate(stories.model, prompt, max_tokens=150, prompt_cache=cache):
        if isinstance(ev, Step):
            generated += len(ev.tokens)
            rejected += ev.drafted - ev.accepted
            assert all(c.offset == len(prompt) + generated - 1 for c in cache)
    assert rejected > 0


CYCLE = {1: 2, 2: 3, 3: 4, 4: 1}


def test_exact_acceptance_when_every_draft_is_right():
    tokens, steps, _ = run(ScriptedModel(CYCLE), [1, 2, 3, 4] * 2, max_tokens=20)
    assert tokens == [1, 2, 3, 4] * 5
    assert [(s.drafted, s.accepted, len(s.tokens)) for s in steps] == [(4, 4, 5)] * 4
    assert steps[-1].stop_reason == "max_tokens"


def test_exact_counts_with_a_rejection_and_an_empty_draft():
    rule = {1: 2, 2: 3, 3: 4, 4: 5, 5: 1}  # the prompt taught 4 -> 1; the model says 4 -> 5
    _, steps, _ = run(ScriptedModel(rule), [1, 2, 3, 4] * 2, max_tokens=7)
    assert steps == [
        Step((5,), drafted=4, accepted=0),  # drafts [1,2,3,4] rejected at once
        Step((1,), drafted=0, accepted=0),  # nothing ever followed 5: plain step
        Step((2, 3, 4, 5, 1), drafted=4, accepted=4, stop_reason="max_tokens"),  # 2,3,4 -> 5 (newest)
    ]


class SkewedKernel(TableModel):
    """CYCLE's model, except that a batched pass (as another kernel might) lets token 9 beat the
    right choice after 3 by 0.0005: a near tie that a one-position pass decides the other way."""

    def __call__(self, tokens, cache):
        logits = super().__call__(tokens, cache)
        if tokens.shape[1] == 1:
            return logits
        skew = mx.where(tokens[..., None] == 3, mx.array([1.0005 * (j == 9) for j in range(16)]), 0.0)
        return mx.maximum(logits, skew)


@pytest.mark.parametrize("margin", [None, 0.0])
def test_a_near_tied_row_is_decided_as_plain_decoding_decides_it(monkeypatch, margin):
    model = SkewedKernel([[float(CYCLE.get(t) == j) for j in range(16)] for t in range(16)])
    if margin is not None:  # the mechanism off: every batched row trusted
        monkeypatch.setitem(sampling.TIE_MARGIN, "float32", margin)
    tokens, steps, _ = run(model, [1, 2, 3, 4] * 2, max_tokens=20)
    if margin is None:
        assert tokens == [1, 2, 3, 4] * 5 == plain_tokens(model, [1, 2, 3, 4] * 2, 20)
        # Each verify pass is cut at the row after 3 and that row recomputed alone: 1 2 3 + 4.
        assert [(s.tokens, s.confirmed) for s in steps[:2]] == [((1, 2, 3, 4), True)] * 2
    else:
        assert 9 in tokens


def test_stop_token_inside_an_accepted_draft_ends_generation_there():
    cache = make_prompt_cache(ScriptedModel(CYCLE))
    prompt = [1, 2, 3, 4, 1, 2, 3, 4, 1]
    _, steps, _ = run(ScriptedModel(CYCLE), prompt, stop_tokens={3}, prompt_cache=cache)
    assert steps == [Step((2,), drafted=4, accepted=1, stop_reason="stop", stop_token=3)]
    assert cache[0].offset == len(prompt)  # prompt and the emitted 2, minus the last token


def test_drafts_never_exceed_the_tokens_still_allowed():
    _, steps, _ = run(ScriptedModel(CYCLE), [1, 2, 3, 4] * 2, max_tokens=3)
    assert steps == [Step((1, 2, 3), drafted=2, accepted=2, stop_reason="max_tokens")]


def test_generation_stops_when_the_context_is_full():
    tokens, steps, _ = run(ScriptedModel(CYCLE), [1, 2, 3, 4] * 2, max_tokens=50, context_length=19)
    assert len(tokens) == 11 and steps[-1].stop_reason == "context"


def test_prompt_longer_than_the_context_is_rejected_with_the_numbers():
    with pytest.raises(InputError, match="prompt is 12 tokens .* context is 12 .* at most 11"):
        next(generate(ScriptedModel(CYCLE), [1, 2, 3, 4] * 3, context_length=12))


@pytest.mark.parametrize("kw", [dict(max_tokens=0), dict(draft=-1), dict(max_tokens=-5)])
def test_bad_settings_are_input_errors(kw):
    with pytest.raises(InputError):
        next(generate(ScriptedModel(CYCLE), [1, 2], **kw))


@pytest.mark.parametrize("ahead", [1, 2])
def test_plain_steps_queued_ahead_change_nothing_but_the_drafting(stories, ahead):
    # Queued steps draft nothing, yet the text is plain decoding's, and the cache is exact after
    # the run (a step queued past the last token is rolled back).
    cache = make_prompt_cache(stories.model)
    prompt = stories.tokenizer.encode("Once upon a time, there was a dog. The dog was happy.")
    tokens, steps, _ = run(stories.model, prompt, max_tokens=150, queue_after=ahead,
                           prompt_cache=cache)
    assert tokens == plain_tokens(stories.model, prompt, 150)
    assert all(c.offset == len(prompt) + len(tokens) - 1 for c in cache)
    assert sum(s.accepted for s in steps) > 0


def test_a_step_queued_ahead_drafts_nothing_exactly_after_silence():
    # The prompt 1 2 3 4 5 teaches 1->2 ... 4->5; the model then emits 6 7 1 2 3 4 5 6 7. The
    # drafter knows nothing after 5, 6 and 7, so the first three steps are plain either way; then
    # it drafts 2 3 4 after 1. With queue_after=1, the step that emits 2 was queued while the
    # drafter was still silent about 7 -> 1, so it drafts nothing; the next one drafts 3 4 5,
    # which leaves one token to go and no room to draft.
    rule = {1: 2, 2: 3, 3: 4, 4: 5, 5: 6, 6: 7, 7: 1}
    shapes = {}
    for ahead in (None, 1):
        tokens, steps, _ = run(ScriptedModel(rule), [1, 2, 3, 4, 5], max_tokens=9, draft=3,
                               queue_after=ahead)
        assert tokens == [6, 7, 1, 2, 3, 4, 5, 6, 7]
        shapes[ahead] = [(s.drafted, len(s.tokens)) for s in steps]
    assert shapes[None] == [(0, 1), (0, 1), (0, 1), (3, 4), (1, 2)]
    assert shapes[1] == [(0, 1), (0, 1), (0, 1), (0, 1), (3, 4), (0, 1)]


def test_speculation_turned_off_for_a_reason_says_it_and_decodes_plainly():
    tokens, steps, pre = run(ScriptedModel(CYCLE), [1, 2, 3, 4] * 2, max_tokens=8, off="too steep")
    assert str(pre.speculation) == "off: too steep" and tokens == [1, 2, 3, 4] * 2
    assert all(s.drafted == 0 for s in steps)


def test_a_drafter_already_fed_part_of_the_prompt_gets_only_the_rest(stories):
    from specgen.draft.drafter import AdaptiveDrafter

    prompt = stories.tokenizer.encode("Once upon a time, there was a little girl named Lily. She loved to play")
    drafter = AdaptiveDrafter()
    drafter.feed(prompt[:9])
    tokens, _, _ = run(stories.model, prompt, drafter=drafter, drafter_fed=9, max_tokens=40, draft=8)
    assert tokens == plain_tokens(stories.model, prompt, 40)
    assert drafter.tokens == prompt + tokens  # every token fed once


def test_passes_queued_behind_full_drafts_are_kept():
    # Every draft is right: each pass is queued before the one before it is read, and kept.
    always = StepPrices(lambda k: 1.0, 1.0)
    tokens, steps, _ = run(ScriptedModel(CYCLE), [1, 2, 3, 4] * 2, drafter=make_drafter(None), max_tokens=40,
                           draft=8, queue_after=1, prices=always)
    assert tokens == [1, 2, 3, 4] * 10
    assert sum(s.queued for s in steps) >= len(steps) - 2 and all(s.drafted == s.accepted for s in steps)


@pytest.mark.parametrize("model_name", ["stories", "smollm2"])
def test_pipelined_speculation_is_plain_decoding_on_real_models(model_name, stories, smollm2_engine):
    loaded = stories if model_name == "stories" else smollm2_engine.loaded
    prompt = loaded.tokenizer.encode("Once upon a time, there was a dog. The dog was happy. The dog")
    cache = make_prompt_cache(loaded.model)
    n = 60 if model_name == "stories" else 24  # a 4-bit SmolLM2 position costs ~0.1 s here
    tokens, steps, _ = run(loaded.model, prompt, max_tokens=n, queue_after=1, prompt_cache=cache,
                           prices=StepPrices(lambda k: 1.0 + 0.1 * k, 0.5), draft=8,
                           drafter=make_drafter(None))
    assert tokens == plain_tokens(loaded.model, prompt, n)
    assert any(s.queued and s.drafted for s in steps)
    assert all(c.offset == len(prompt) + len(tokens) - 1 for c in cache)


class AskedAt:
    """A `cancelled` that says yes on its `n`-th question (counting them)."""

    def __init__(self, n: int):
        self.n, self.asked = n, 0

    def __call__(self) -> bool:
        self.asked += 1
        return self.asked >= self.n


def test_a_dropped_long_prompt_stops_between_layers_not_after_its_chunk():
    # A 2048-token chunk of a 7B model's prefill takes seconds; a client that left waits out at
    # most one layer's share of it. Asked once before the chunk, then once a layer.
    model = tiny_model("llama", num_hidden_layers=6)
    prompt = [random.Random(0).randrange(1, 500) for _ in range(600)]
    asked = AskedAt(4)  # before the chunk, then layers 1 and 2: stopped at the third
    assert list(generate(model, prompt, max_tokens=4, cancelled=asked)) == []
    assert asked.asked == 4
    never = AskedAt(10**9)
    out = [t for e in generate(model, prompt, max_tokens=4, cancelled=never) if isinstance(e, Step) for t in e.tokens]
    assert out == plain_tokens(model, prompt, 4)  # asking changes nothing
    assert never.asked == 1 + 6  # once before its one piece, then once a layer
