"""The n-gram tables, FNV-1a hashing and the fixed-length predictor (--draft N)."""

import random

import pytest

from specgen import defaults
from specgen.draft.ngram import NGramTables, context_keys, fnv1a_64, keys_along
from specgen.draft.predictor import BATCH_HASH, NGramPredictor


def fed(tokens, **kw):
    p = NGramPredictor(**kw)
    p.feed(tokens)
    return p


def test_fnv1a_matches_the_reference_vectors():
    # From the FNV reference test suite (byte strings); ids < 256 hash like the bytes.
    assert fnv1a_64([]) == 0xCBF29CE484222325
    assert fnv1a_64(b"a") == 0xAF63DC4C8601EC8C
    assert fnv1a_64(b"foobar") == 0x85944171F73967E8


def test_fnv1a_of_wide_ids_is_xor_then_multiply_mod_2_64():
    h = ((0xCBF29CE484222325 ^ 70000) * 1099511628211) % 2**64
    assert fnv1a_64([70000]) == h
    assert fnv1a_64([70000, 5]) == ((h ^ 5) * 1099511628211) % 2**64


def test_context_keys_hash_the_newest_token_first():
    assert context_keys([7, 8, 9], 2) == [fnv1a_64([]), fnv1a_64([9]), fnv1a_64([9, 8])]


def test_defaults_are_the_mission_defaults():
    p = NGramPredictor()
    assert (p.min_order, p.max_order, p.window) == (2, 4, 512)
    assert defaults.DRAFT_LEN == 4


def test_the_best_token_is_the_most_frequent_and_ties_go_to_the_newest():
    t = NGramTables(2, 2)
    key = context_keys([1], 1)
    for token in (5, 6):
        t.add(key, token)
    assert t.find(key)[1].best == 6  # 5 and 6 once each: the newer
    t.add(key, 5)
    entry = t.find(key)[1]
    assert (entry.best, entry.count, entry.total, entry.counts) == (5, 2, 3, {5: 2, 6: 1})
    # Counting n at once (as a memory file is read back) follows the same rule.
    NGramTables.count(t.tables[2], key[1], 6, 2)
    assert (t.find(key)[1].best, t.find(key)[1].count) == (6, 3)


def test_longest_context_wins_over_a_more_frequent_shorter_one():
    # (2,3) -> 9 twice, but the 4-gram context (5,2,3) was followed by 7.
    p = fed([1, 2, 3, 9, 8, 2, 3, 9, 5, 2, 3, 7, 5, 2, 3])
    assert p.draft(1) == [7]


def test_backs_off_to_shorter_contexts():
    assert fed([1, 2, 3, 9, 8, 2, 3, 9, 6, 2, 3]).draft(1) == [9]  # (6,2,3) unseen -> (2,3)
    assert fed([1, 2, 3, 9, 4, 3]).draft(1) == [9]  # (9,4,3), (4,3) unseen -> (3)


def test_most_frequent_continuation_and_ties_to_the_most_recent():
    assert fed([1, 2, 1, 3, 1], max_order=2).draft(1) == [3]  # 1 -> 2 once, 3 once: 3 is newer
    assert fed([1, 2, 1, 3, 1, 2, 1], max_order=2).draft(1) == [2]  # now 2 twice


def test_chains_its_own_predictions():
    assert fed([1, 2, 3, 4, 1, 2, 3, 4, 1]).draft(6) == [2, 3, 4, 1, 2, 3]


def test_stops_at_the_first_position_without_a_match():
    assert fed([1, 2, 3], max_order=2).draft(5) == []
    assert fed([1, 2, 3, 4], window=2).draft(5) == []
    assert NGramPredictor().draft(4) == []
    assert fed([1, 2, 1]).saves(4) == 1.0 and fed([1, 2, 3]).saves(4) == 0.0


def test_window_bounds_the_history_but_not_the_tables():
    seq = [5, 2, 3, 7, 1, 2, 3, 9, 8, 2, 3, 9, 5, 2, 3]
    assert fed(seq).draft(1) == [7]
    # Two tokens of history: a 3-token (4-gram) context never exists, so (2,3) -> 9 decides.
    narrow = fed(seq, window=2)
    assert narrow.history == [2, 3]
    assert narrow.draft(1) == [9]
    # Counts survive eviction: 1 -> 2 is remembered after both tokens left the window.
    assert fed([1, 2, 9, 8, 7, 1], window=2).draft(1) == [2]


def test_hashing_a_batch_at_once_gives_every_position_its_own_context_keys():
    rng = random.Random(0)
    for _ in range(50):
        toks = [rng.randrange(70000) for _ in range(rng.randrange(60))]
        start, longest = rng.randrange(len(toks) + 1), rng.randrange(1, 6)
        expected = [context_keys(toks[:i], longest) for i in range(start, len(toks))]
        assert keys_along(toks, start, longest) == expected


def _entries(p):
    return {k: {key: (e.best, e.count, e.counts, e.total) for key, e in t.items()}
            for k, t in p.ngrams.tables.items()}


@pytest.mark.parametrize("window", [512, 3, 2])
def test_a_batch_fed_at_once_counts_like_one_token_at_a_time(window):
    rng = random.Random(window)
    first, batch = [rng.randrange(20) for _ in range(7)], [rng.randrange(20) for _ in range(3 * BATCH_HASH)]
    at_once, one_by_one = fed(first, window=window), fed(first, window=window)
    at_once.feed(batch)  # hashed together
    for t in batch:
        one_by_one.feed([t])
    assert _entries(at_once) == _entries(one_by_one)
    assert at_once.history == one_by_one.history
