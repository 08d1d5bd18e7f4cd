"""Acceptance estimates: priors per kind of evidence, rescaled per request by how drafts fare."""

from dataclasses import replace

import pytest

from specgen.draft.acceptance import Acceptance, evidence_for
from specgen.draft.params import PARAMS

E = evidence_for(PARAMS)
NGRAM = E.ngram[0][2][2][3]  # the request's own 4-gram, share >= 0.8, count 4+
COPY = E.copy_at(5)  # a backward match of 4-7 tokens
LONG = E.copy_at(PARAMS.match_cap + 1)


def test_a_few_misses_move_copies_far_more_than_ngrams():
    # A request's own evidence quickly overrides the copy priors, but barely the n-gram ones.
    acc = Acceptance(PARAMS)
    for _ in range(10):
        acc.record(NGRAM, False)
        acc.record(COPY, False)
    assert acc.q(NGRAM) > 0.8 * NGRAM.prior
    assert acc.q(COPY) < 0.5 * COPY.prior


def test_hits_raise_an_estimate_and_misses_lower_it():
    up, down = Acceptance(PARAMS), Acceptance(PARAMS)
    for _ in range(20):
        up.record(COPY, True)
        down.record(COPY, False)
    assert down.q(COPY) < COPY.prior < up.q(COPY)


def test_long_copies_are_rescaled_apart_from_short_ones_and_realignments():
    acc = Acceptance(PARAMS)
    for _ in range(10):
        acc.record(LONG, False)
    assert acc.q(LONG) < 0.6
    assert (acc.q(COPY), acc.q(E.realign[0])) == pytest.approx((COPY.prior, E.realign[0].prior))
    for _ in range(10):
        acc.record(E.realign[0], False)  # realigning is a kind of (short) copy
    assert acc.q(COPY) < 0.6 * COPY.prior


def test_memory_evidence_starts_at_lower_odds_than_the_requests_own():
    assert E.copy_at(5, own=False).prior < COPY.prior
    assert E.ngram[2][2][2][3].prior < NGRAM.prior


def test_a_copy_the_last_step_followed_is_likelier_and_agreement_helps():
    assert E.copy_at(5, cont=True).prior > COPY.prior
    assert E.copy_at(4, agree=True).prior > E.copy_at(4, agree=False).prior


def test_shrinkage_sets_how_fast_estimates_move():
    slow, fast = Acceptance(replace(PARAMS, shrink=20.0)), Acceptance(PARAMS)
    for _ in range(5):
        slow.record(COPY, False)
        fast.record(COPY, False)
    assert fast.q(COPY) < slow.q(COPY) < COPY.prior
