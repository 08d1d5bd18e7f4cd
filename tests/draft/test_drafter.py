"""The adaptive drafter as a whole: what it drafts from, and how the loop's verdicts teach it."""

import random

import pytest

from specgen.draft.drafter import AdaptiveDrafter, make_drafter
from specgen.draft.length import linear_cost
from specgen.draft.memory import NGramMemory
from specgen.draft.predictor import NGramPredictor
from specgen.draft.simulate import replay
from specgen.errors import SettingError
from specgen.events import Verdict


def test_copies_long_spans_and_skips_novel_text():
    rng = random.Random(1)
    code = [rng.randrange(3, 30000) for _ in range(400)]
    copy = replay(code, code, AdaptiveDrafter(), draft=64, beta=0.08)
    fixed = replay(code, code, NGramPredictor(), draft=4, beta=0.08)
    assert copy.counts.steps <= 25 and copy.counts.steps < fixed.counts.steps / 3
    novel = replay(code, [rng.randrange(3, 30000) for _ in range(400)], AdaptiveDrafter(),
                   draft=64, beta=0.08)
    assert novel.counts.drafted <= 20 and novel.counts.tokens / novel.cost > 0.99


def test_the_verdict_teaches_it_and_drafts_cut_off_by_a_stop_are_not_misses():
    d = AdaptiveDrafter()
    d.feed(list(range(10, 60)) + list(range(10, 20)))
    drafts = d.draft(8)
    assert drafts[:3] == [20, 21, 22]
    d.feed(drafts[:2], Verdict.of(len(drafts), len(drafts), 2))  # the run stopped after two
    judged = d.acceptance.counts["copy"]
    assert (judged.accepted, judged.judged) == (2, 2)
    d.draft(8)
    d.feed([7], Verdict.of(8, 0, 1))  # the next draft missed at once
    assert (d.acceptance.counts["copy"].accepted, d.acceptance.counts["copy"].judged) == (2, 3)


def test_a_guess_at_the_token_in_flight_is_judged_and_misses_end_the_drafts_queued_behind_it():
    # Behind a pass in flight the drafter guesses that pass's token, then drafts past it for the
    # pass queued behind, worth the guess's chance times theirs. On chat its guesses miss: each
    # miss must teach it, until nothing is drafted behind (the plain pass stays queued).
    d = AdaptiveDrafter(cost=linear_cost(0.1))
    d.feed(list(range(100, 140)))
    d.recycle([5, 7, 8], [7, 8, 9])  # the target chose 7 after 5, 8 after 7 and 9 after 8
    d.feed([5])
    # A guess that holds: the pass behind verifies [8, 9], and the verdict after is on them.
    assert d.continuation([], 4).tokens == [7, 8, 9]
    d.feed([7])
    assert d.last.tokens == [8, 9] and d.acceptance.counts["recycled"].accepted == 1
    d.feed([8, 3], Verdict.of(2, 1, 2))
    assert (d.acceptance.counts["recycled"].accepted, d.acceptance.counts["recycled"].judged) == (2, 3)
    behind = []
    for miss in range(50, 60):
        d.feed([5])
        behind.append(d.continuation([], 4).tokens)
        d.feed([miss])  # the pass in flight chose otherwise
    assert behind[0] == [7, 8, 9] and behind[-1] == [7]
    assert d.acceptance.counts["recycled"].judged == 13 and d.last is None


def _guess(d, context):
    """The kind of evidence and the token of a one-token n-gram draft after `context`."""
    d.feed(context)
    drafts = d.draft(1)
    return (d.last.evidence[0].kind, drafts[0]) if drafts else None


def test_ngrams_seen_once_are_rescaled_apart_from_the_others():
    # In an edit, n-grams seen once follow the prompt being copied: their hits must not make
    # the request trust its frequent n-grams more (nor the other way round).
    text = [10, 11, 12, 13, 14] + [20, 21, 22] * 4
    once, often = AdaptiveDrafter(cost=linear_cost(0.0)), AdaptiveDrafter(cost=linear_cost(0.0))
    assert _guess(once, text + [10, 11, 12]) == ("ngram1", 13)
    assert _guess(often, text + [99, 21, 22]) == ("ngram", 20)
    before = often.acceptance.q(often.last.evidence[0])
    for _ in range(200):
        once.acceptance.record(once.last.evidence[0], True)
        often.acceptance.record(once.last.evidence[0], True)
    assert once.acceptance.q(once.last.evidence[0]) > 0.5
    assert often.acceptance.q(often.last.evidence[0]) == before


@pytest.mark.parametrize("seen_in_memory, expected", [(2, 13), (10, 99)])
def test_when_the_request_and_memory_disagree_the_counts_of_both_decide(seen_in_memory, expected):
    # The request saw (10, 11, 12) -> 13 once; memory saw it followed by 99 two or ten times.
    # A 3-token context weighs 2^4, the request's own twice that; counts are smoothed by
    # support_smooth = 2: 32*1/3 = 10.7 for 13, against 16*2/4 = 8 or 16*10/12 = 13.3 for 99.
    mem = NGramMemory("m")
    for _ in range(seen_in_memory):
        mem.add([10, 11, 12, 99])
    d = AdaptiveDrafter(memory=mem, cost=linear_cost(0.0))
    kind, token = _guess(d, [10, 11, 12, 13, 5, 10, 11, 12])
    assert token == expected and kind == ("ngram1" if expected == 13 else "memory")


def test_memory_copies_earlier_outputs():
    rng = random.Random(4)
    answer = [rng.randrange(100, 30000) for _ in range(60)]
    mem = NGramMemory("m")
    mem.add(answer)
    with_memory = replay([1, 2, 3], answer, AdaptiveDrafter(memory=mem), draft=64, beta=0.08)
    without = replay([1, 2, 3], answer, AdaptiveDrafter(), draft=64, beta=0.08)
    assert with_memory.counts.steps < without.counts.steps / 3


def test_make_drafter_checks_its_settings_by_name():
    assert isinstance(make_drafter(None), AdaptiveDrafter)
    assert isinstance(make_drafter(4), NGramPredictor)
    for kw, param in [(dict(max_order=1), "ngram_order"), (dict(window=0), "window"),
                      (dict(draft=-1), "draft")]:
        with pytest.raises(SettingError) as e:
            make_drafter(**{"draft": None, **kw})
        assert e.value.param == param


def test_the_targets_recycled_predictions_are_drafted_where_nothing_else_knows():
    # The target chose 9 after 5 in a rejected draft row: nothing the output holds says so.
    d = AdaptiveDrafter()
    d.feed([1, 2, 3, 5])
    assert d.draft(8) == []
    d.recycle([5, 9], [9, 4])
    assert d.draft(8)[:2] == [9, 4]


def test_recycled_predictions_that_keep_failing_stop_being_drafted():
    d = AdaptiveDrafter(cost=linear_cost(0.3))  # a draft token must hold 30% of the time to pay
    d.feed([1, 2, 3])
    drafted = []
    for i in range(10):
        d.recycle([100 + i], [200 + i])  # a fresh prediction after each new token...
        d.feed([100 + i], Verdict(0, True) if d.last else None)  # ...that never holds
        drafted.append(len(d.draft(8)))
    assert drafted[0] == 1 and drafted[-1] == 0


def test_a_drafter_continued_into_the_next_turn_drafts_as_one_fed_the_whole_conversation():
    rng = random.Random(3)
    turn1, reply, turn2 = ([rng.randrange(3, 3000) for _ in range(n)] for n in (300, 40, 30))
    kept = AdaptiveDrafter()
    kept.feed(turn1)
    kept.draft(16)  # a first request's output starts: its place and state are the old request's
    kept.feed(reply)
    kept.continue_with(prediction=turn1[100:140])
    kept.feed(turn2 + turn1[100:104])
    fresh = AdaptiveDrafter(prediction=turn1[100:140])
    fresh.feed(turn1 + reply + turn2 + turn1[100:104])
    assert kept.tokens == fresh.tokens
    drafted = kept.draft(32)
    assert drafted == fresh.draft(32) == turn1[100:100 + len(drafted)] and len(drafted) >= 16  # the prediction
    assert kept.prediction_counts == fresh.prediction_counts
