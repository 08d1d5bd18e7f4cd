import math
from collections import Counter

import mlx.core as mx
import pytest
from conftest import TableModel, run, tiny_model
from mlx_lm import sample_utils
from mlx_lm.sample_utils import make_sampler

from specgen.engine.decode.sampling import GREEDY, Sampler, make_selector
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


# Untempered probabilities of 8 tokens, in a shuffled token order (filters keep by value, not index).
FILTERED = {3: 0.30, 6: 0.22, 0: 0.16, 5: 0.12, 1: 0.09, 7: 0.06, 2: 0.03, 4: 0.02}
# Each filter alone keeps a set of its own (so a skipped one shows), and so does each filter applied
# after the temperature, not before; each pair and the three keep one set in mlx-lm's order (top_p,
# min_p, top_k) and a smaller one with top_p later. (min_p and top_k commute: both keep a top set.)
FILTERS = [dict(top_p=0.75), dict(min_p=0.25), dict(top_k=3), dict(top_p=0.55, top_k=3),
           dict(top_p=0.75, min_p=0.25), dict(top_p=0.75, min_p=0.25, top_k=5)]
CHI2_999 = {1: 10.83, 2: 13.82, 3: 16.27, 4: 18.47, 5: 20.52}  # the 0.999 quantile, by degrees of freedom


def mlx_lm_law(logprobs: mx.array, temp: float, filters: dict, monkeypatch) -> dict[int, float]:
    """The law make_sampler draws a token from (token -> probability, its support only): read from
    the logits it hands its categorical draw, so its own filters, order and temperature made it."""
    handed = []
    monkeypatch.setattr(sample_utils, "categorical_sampling",
                        lambda x, t: handed.append(x * (1.0 / t)) or mx.argmax(x, axis=-1))
    make_sampler(temp, **filters)(logprobs[None])
    return {i: p for i, p in enumerate(mx.softmax(handed[0][0], axis=-1).tolist()) if p > 0}


@pytest.mark.parametrize("filters", FILTERS, ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()))
def test_filters_keep_mlx_lms_support_and_sample_its_law(filters, monkeypatch):
    logprobs = mx.array([math.log(FILTERED[i]) for i in range(len(FILTERED))])
    law = mlx_lm_law(logprobs, 1.5, filters, monkeypatch)
    n = 3000  # one verify pass of n rows: positions 0..n-1, each its own keyed noise
    picks = Sampler(1.5, seed=7, **filters).verify(mx.broadcast_to(logprobs, (n, len(FILTERED))), [], 0,
                                                   [0] * (n - 1)).tokens
    counts = Counter(picks)
    # Every token mlx-lm may draw is drawn (each has p > 0.1: missing one has odds under 1e-100), no other.
    assert set(counts) == set(law), (sorted(counts), sorted(law))
    chi2 = sum((counts[i] - n * p) ** 2 / (n * p) for i, p in law.items())  # seeds fixed: no flakes
    assert chi2 < CHI2_999[len(law) - 1], (counts, {i: round(n * p) for i, p in law.items()})


@pytest.mark.parametrize("kw", [dict(temp=-1), dict(temp=1, top_p=1.5), dict(temp=1, top_k=-2),
                                dict(temp=1, min_p=2)])
def test_bad_sampling_settings_are_input_errors(kw):
    with pytest.raises(InputError):
        make_selector(**kw)
