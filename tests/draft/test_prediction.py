"""Predicted outputs: the caller's expected text as a copy source, replayed without a model."""

import random

import pytest

from specgen.draft.drafter import AdaptiveDrafter, make_drafter
from specgen.draft.length import linear_cost
from specgen.draft.simulate import replay
from specgen.engine.load.registry import tokenizer_for
from specgen.errors import SettingError

encode = tokenizer_for("demo")  # the bundled stories260K tokenizer
STORY = encode(
    "Once upon a time, there was a little girl named Lily. She loved to play in the park with her "
    "friends. One day, she saw a big red ball under a tree. She ran to the tree and picked up the "
    "ball. Her mom said, \"Lily, you must share the ball with your friends.\" Lily was happy to share.")
OTHER = encode(
    "Tom had a small blue car. He liked to drive the car around the room. One day, the car broke and "
    "Tom was sad. His dad said, \"Do not worry, we can fix it together.\" They worked hard and fixed it.")
CODE = encode("def total(items):\n    s = 0\n    for x in items:\n        s += x\n    return s\n\n\n"
              "def mean(items):\n    return total(items) / len(items)\n\n\nprint(mean([1, 2, 3]))\n")
ASK = [1, *encode("Tell me a story.")]


def _random(seed: int, n: int = 96) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, 30000) for _ in range(n)]


def _replay(prompt, output, prediction=(), beta=0.08):
    """(tally, drafter) of a replay with the adaptive drafter, drafting up to 64 tokens a step."""
    d = AdaptiveDrafter(cost=linear_cost(beta), prediction=prediction)
    return replay(prompt, output, d, draft=64, beta=beta), d


def _per_step(t) -> float:
    return t.counts.tokens / t.counts.steps


OUTPUTS = {"random": (_random(1, 50), _random(2)), "story": (ASK, STORY[:96])}


@pytest.mark.parametrize("beta", [0.08, 0.0], ids=["linear cost", "flat cost"])
@pytest.mark.parametrize("case", OUTPUTS)
def test_a_perfect_prediction_is_copied_in_long_drafts_and_without_it_there_is_little_to_copy(case, beta):
    prompt, output = OUTPUTS[case]
    assert len(output) == 96 and output[:8] not in [prompt[i:i + 8] for i in range(len(prompt))]
    on, d = _replay(prompt, output, output, beta)
    off, _ = _replay(prompt, output, (), beta)
    assert _per_step(on) >= 4 and _per_step(on) > 4 * _per_step(off)
    counts = d.prediction_counts
    assert 0 < counts.accepted <= counts.drafted
    assert counts.accepted == on.counts.accepted == len(output) - on.counts.steps  # all but the bonus tokens
    assert d.tokens == prompt + output  # the prediction is not in the request's history


def test_the_first_output_token_is_drafted_from_the_prediction_even_after_a_short_prompt():
    for prompt in ([7, 8], ASK):
        d = AdaptiveDrafter(prediction=STORY)
        d.feed(prompt)
        assert d.draft(8) == STORY[:8] and d.last.evidence[0].kind == "predicted"


def _tables(d: AdaptiveDrafter) -> dict:
    return {o: {k: e.counts for k, e in t.items()} for o, t in d.ngrams.tables.items()}


def test_the_request_keeps_its_own_history_and_tables():
    # The prediction is a copy source only: positions, contexts and n-gram counts are the request's.
    with_it, without = AdaptiveDrafter(prediction=STORY), AdaptiveDrafter()
    for d in (with_it, without):
        replay(ASK, OTHER, d, draft=64)
    assert with_it.tokens == without.tokens == ASK + OTHER
    assert _tables(with_it) == _tables(without)


WRONG = {  # (prompt, output, a prediction that is wrong for it)
    "random output, unrelated prediction": (_random(1, 50), _random(2), _random(3)),
    "story, another story": (ASK, STORY, OTHER),
    "story, its own tokens shuffled": (ASK, STORY, random.Random(4).sample(STORY, len(STORY))),
    "code copied from the prompt, a story": ([*encode("Fix this:\n"), *CODE, *encode("\nAnswer:\n")], CODE, STORY),
    "code copied from the prompt, its tokens sorted": ([*encode("Fix:\n"), *CODE], CODE, sorted(CODE)),
    "a repeated story, another story": ([1], STORY + STORY, OTHER),
}


@pytest.mark.parametrize("beta", [0.08, 0.0], ids=["linear cost", "flat cost"])
@pytest.mark.parametrize("case", WRONG)
def test_a_wrong_prediction_costs_no_steps(case, beta):
    prompt, output, wrong = WRONG[case]
    on, d = _replay(prompt, output, wrong, beta)
    off, _ = _replay(prompt, output, (), beta)
    assert on.counts.steps <= off.counts.steps * 1.02 + 1, (on.counts.steps, off.counts.steps)
    assert d.prediction_counts.accepted <= d.prediction_counts.drafted


def _edited(pred: list[int], how: str) -> list[int]:
    """`pred` with one edit after its 48th token."""
    return {"replaced": pred[:48] + [5, 6] + pred[50:], "inserted": pred[:48] + [5, 6, 7] + pred[48:],
            "deleted": pred[:48] + pred[53:]}[how]


@pytest.mark.parametrize("how", ["replaced", "inserted", "deleted"])
@pytest.mark.parametrize("case", OUTPUTS)
def test_copying_resumes_after_an_edit_in_the_middle(case, how):
    prompt, pred = OUTPUTS[case]
    output = _edited(pred, how)
    on, d = _replay(prompt, output, pred)
    off, _ = _replay(prompt, output)
    assert _per_step(on) >= 10 and off.counts.steps > 5 * on.counts.steps  # measured: 11.4-13.7, 7-8 steps
    # Over 30 of the tokens after the edit were drafted from the prediction, and accepted.
    assert d.prediction_counts.accepted >= len(output) - 12


def test_the_fixed_length_predictor_refuses_a_prediction():
    with pytest.raises(SettingError) as e:
        make_drafter(draft=4, prediction=[1, 2])
    assert e.value.param == "prediction"
    assert isinstance(make_drafter(None, prediction=[1, 2]), AdaptiveDrafter)
    assert make_drafter(4, prediction=[]) is not None  # nothing set: nothing ignored
    with pytest.raises(SettingError) as e:
        make_drafter(None, prediction=[1, -2])
    assert e.value.param == "prediction"
