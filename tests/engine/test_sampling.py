import math

import pytest
from conftest import TableModel, run, tiny_model

from specgen.engine.sampling import GREEDY, Sampler, make_selector
from specgen.errors import InputError

SETTINGS = [dict(temp=0.7), dict(temp=1.0), dict(temp=1.0, top_p=0.9), dict(temp=0.9, top_k=20),
            dict(temp=0.8, min_p=0.05)]


@pytest.mark.parametrize("kw", SETTINGS, ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()))
def test_same_seed_same_text_with_and_without_speculation(stories, kw):
    ids = stories.tokenizer.encode("Once upon a time")
    for model in (stories.model, tiny_model("llama")):
        sel = make_selector(seed=11, **kw)
        plain, _, _ = run(model, ids, draft=0, max_tokens=120, selector=sel)
        spec, steps, _ = run(model, ids, draft=4, max_tokens=120, selector=sel)
        assert spec == plain
        assert sum(s.drafted for s in steps) > 0


def test_a_seed_repeats_and_different_seeds_differ(stories):
    ids = stories.tokenizer.encode("Once upon a time")
    outs = [run(stories.model, ids, max_tokens=60, selector=make_selector(1.0, seed=s))[0]
            for s in (5, 5, 6)]
    assert outs[0] == outs[1] != outs[2]


def test_temperature_zero_is_greedy_and_no_seed_picks_one():
    assert make_selector(0.0) is GREEDY
    assert isinstance(make_selector(0.5).seed, int)


# Next-token logits over 4 tokens, by current token.
SOFT = [[0.0, 1.2, -0.5, 0.3], [1.0, -1.0, 0.5, 0.0], [0.2, 0.2, 0.2, 1.5], [-0.3, 0.8, 0.0, 0.4]]


def test_token_after_a_speculative_step_has_the_plain_sampling_distribution():
    # Prompt 0 1 0 1 0: the predictor drafts [1, 0], so the second generated token comes from the
    # verify step (accepted draft or correction) or a later step; its marginal must still be
    # sum_i p(i | 0) p(j | i). Chi-square, 3 degrees of freedom, significance 0.001, seeds fixed.
    probs = [[math.exp(x) / sum(math.exp(y) for y in row) for x in row] for row in SOFT]
    expected = [sum(probs[0][i] * probs[i][j] for i in range(4)) for j in range(4)]
    n = 2000
    counts, drafted = [0] * 4, 0
    for seed in range(n):
        tokens, steps, _ = run(TableModel(SOFT), [0, 1, 0, 1, 0], draft=2, max_tokens=2,
                               selector=Sampler(1.0, seed=seed))
        counts[tokens[1]] += 1
        drafted += steps[0].drafted
    assert drafted == n  # every first step verified a draft (capped to 1 by max_tokens=2)
    chi2 = sum((c - n * e) ** 2 / (n * e) for c, e in zip(counts, expected))
    assert chi2 < 16.27, (counts, [round(n * e) for e in expected])


def test_keyed_noise_means_a_wrong_distribution_would_be_caught():
    # The same statistic on the first token's counts against the second token's law must fail,
    # or the chi-square test above could not tell distributions apart.
    probs = [[math.exp(x) / sum(math.exp(y) for y in row) for x in row] for row in SOFT]
    wrong = [sum(probs[0][i] * probs[i][j] for i in range(4)) for j in range(4)]
    n, counts = 2000, [0] * 4
    for seed in range(n):
        tokens, _, _ = run(TableModel(SOFT), [0, 1, 0, 1, 0], draft=2, max_tokens=1,
                           selector=Sampler(1.0, seed=seed))
        counts[tokens[0]] += 1
    assert sum((c - n * e) ** 2 / (n * e) for c, e in zip(counts, wrong)) > 16.27


@pytest.mark.parametrize("kw", [dict(temp=-1), dict(temp=1, top_p=1.5), dict(temp=1, top_k=-2),
                                dict(temp=1, min_p=2)])
def test_bad_sampling_settings_are_input_errors(kw):
    with pytest.raises(InputError):
        make_selector(**kw)
