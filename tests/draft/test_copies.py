"""Copies: substitutions, hazards and realignment, each switched on and off through the params."""

import random
from dataclasses import replace

from specgen.draft.drafter import AdaptiveDrafter
from specgen.draft.length import linear_cost
from specgen.draft.lessons import Hazards, Substitutions
from specgen.draft.params import PARAMS
from specgen.draft.simulate import replay


def _replay(prompt, out, params=PARAMS):
    return replay(prompt, out, AdaptiveDrafter(cost=linear_cost(0.08), params=params), draft=64)


def _random_source(seed=5, n=300):
    rng = random.Random(seed)
    return [rng.randrange(9, 30000) for _ in range(n)]


def test_substitutions_are_confirmed_by_the_source_resuming_and_dropped_when_kept():
    s = Substitutions(seen=2)
    source = [10, 11, 12, 13]
    s.broke(1, 11, 99, substituted=False)
    s.resumed(source, 11)  # the output went on with 11 itself: 99 was inserted, not a substitute
    s.broke(1, 11, 99, substituted=False)
    s.resumed(source, 12)  # the source went on past 11: 99 replaced it, confirmed once
    assert s.forward == {}
    s.broke(1, 11, 99, substituted=False)
    s.resumed(source, 12)
    assert s.forward == {11: 99} and s.back == {99: 11}
    s.broke(3, 11, 11, substituted=True)  # a copy drafted 99 for 11, but the output kept 11
    assert s.forward == {} and s.back == {}


def _renamed(seed=2):
    """Random 'code' in which token 7 occurs every 40 tokens, and the output: all of it, with 7
    renamed to 8."""
    code = _random_source(seed, 400)
    for i in range(20, 400, 40):
        code[i] = 7
    return code, [8 if t == 7 else t for t in code]


def test_copies_read_through_a_rename():
    # Each renamed token breaks the copy until the rename has been confirmed twice; after that,
    # copies match through it and draft the new name in place of the old.
    code, renamed = _renamed()
    d = AdaptiveDrafter(cost=linear_cost(0.08))
    on = replay(code, renamed, d, draft=64)
    off = _replay(code, renamed, replace(PARAMS, subst_seen=10**9))
    assert d.copies.substitutions.forward == {7: 8}
    assert on.counts.steps < off.counts.steps - 5
    assert on.counts.accepted > off.counts.accepted


def test_copies_draft_the_substitute_once_it_has_been_confirmed():
    code, renamed = _renamed()
    d = AdaptiveDrafter(cost=linear_cost(0.08))
    d.feed(code)
    d.feed(renamed[:100])  # the output so far; say the rename has been confirmed twice:
    d.copies.substitutions.forward, d.copies.substitutions.back = {7: 8}, {8: 7}
    drafts = d.draft(64)
    assert len(drafts) > 10 and drafts == renamed[100:100 + len(drafts)]  # 8 first, then the copy
    assert d.last.evidence[0].kind == "subst"


def test_hazards_lower_the_odds_only_after_tokens_that_copies_break_after():
    h = Hazards(PARAMS)
    for _ in range(30):
        h.record(1, False)
        h.record(3, False)
    for _ in range(3):
        h.record(2, True)
    assert h.odds(2) < 0.2
    assert h.odds(1) == h.odds(3) == h.odds(4) == 1.0  # reliable or unseen: never raised


def _inserted(seed=3):
    """Random 'code' whose 20-token lines start with token 5, and the output: all of it, with a
    new token after each 5 (a line the model inserts)."""
    rng = random.Random(seed)
    code = [rng.randrange(9, 30000) for _ in range(400)]
    out = []
    for i in range(400):
        if i % 20 == 0:
            code[i] = 5
        out.append(code[i])
        if i % 20 == 0:
            out.append(rng.randrange(30000, 31000))
    return code, out


def test_copies_stop_before_the_token_they_keep_breaking_after():
    # Every inserted token costs a step either way; once copies have broken after 5 a few times,
    # they stop at it instead of drafting on through the rest of the source (wasted drafts).
    code, out = _inserted()
    on = _replay(code, out)
    off = _replay(code, out, replace(PARAMS, hazard_shrink=1e12))  # a token's own rate never counts
    assert on.counts.steps == off.counts.steps
    assert on.counts.accepted == off.counts.accepted
    assert on.counts.drafted < off.counts.drafted - 50


def _realigned(source, out, params=PARAMS):
    """(drafted, accepted) of each step of a replay whose first draft token realigns a broken copy."""
    d = AdaptiveDrafter(cost=linear_cost(0.08), params=params)
    steps, draft = [], d.draft

    def spied(room):
        drafts = draft(room)
        steps.append(bool(drafts) and d.last.evidence[0].kind == "realign")
        return drafts

    d.draft = spied
    kinds = steps
    counted = []
    feed = d.feed

    def spied_feed(tokens, verdict=None):
        if verdict is not None and kinds and kinds[-1]:
            counted.append((len(d.last.tokens), verdict.accepted))
        feed(tokens, verdict)

    d.feed = spied_feed
    t = replay(source, out, d, draft=64)
    return counted, t


def test_after_inserted_text_the_copy_resumes_where_it_broke():
    # Three new tokens before source[60]: once source[60] follows them, the copy realigns at
    # once, without waiting for copy_key tokens of context to find it again.
    source = _random_source()
    out = source[:60] + [31000, 31001, 31002] + source[60:]
    realigned, on = _realigned(source, out)
    assert realigned and all(accepted == drafted for drafted, accepted in realigned)
    _, off = _realigned(source, out, replace(PARAMS, realign_steps=0))
    assert on.counts.steps < off.counts.steps


def test_a_realignment_starts_nearest_where_the_output_has_put_the_source():
    source = _random_source()
    source[58] = source[61]  # a decoy: the token after the replaced one also occurs just before it
    out = source[:60] + [31000] + source[61:]  # source[60] replaced
    realigned, _ = _realigned(source, out)
    assert realigned and realigned[0][1] == realigned[0][0]  # the right place: every token held


def test_a_realignment_is_trusted_further_once_its_first_token_holds():
    source = _random_source()
    out = source[:60] + [31000] + source[60:150] + [31001] + source[150:]  # two inserted tokens
    ladder, _ = _realigned(source, out)
    flat, _ = _realigned(source, out, replace(PARAMS, realign_prior=(0.35,) * 4))
    assert sum(d for d, _ in ladder) > sum(d for d, _ in flat) > 0
    assert all(a == d for d, a in ladder + flat)


def test_an_output_that_rewrites_the_prompt_copies_it_from_its_first_tokens():
    code = _random_source()
    out = [31000] + code[1:]  # a rewrite of the prompt's code, its first token spelled apart
    prompt = [1, 2, 3] + code + [4, 5]
    on = _replay(prompt, out[:40])
    # With no slack for a first token spelled apart, the start of the output is never found in
    # the prompt, and the copy waits for copy_key tokens of context.
    off = _replay(prompt, out[:40], replace(PARAMS, start_slack=PARAMS.copy_key))
    assert on.counts.steps < off.counts.steps


def _session(turns=6, seed=9):
    """An agent session: each turn is a tool result (random), the turn cue [1, 2, 3, 4] and the
    same tool call; the output is that call once more, its first token spelled apart (900 for 90),
    as a tokenizer spells a text's first token."""
    rng = random.Random(seed)
    call = [90] + [rng.randrange(100, 30000) for _ in range(15)]
    prompt = []
    for _ in range(turns):
        prompt += [rng.randrange(100, 30000) for _ in range(30)] + [1, 2, 3, 4] + call
    prompt += [rng.randrange(100, 30000) for _ in range(30)] + [1, 2, 3, 4]
    return prompt, [900] + call[1:]


def test_a_turn_that_begins_as_the_earlier_ones_did_is_copied_past_its_first_token():
    prompt, out = _session()
    t = _replay(prompt, out)
    # The first step's copy is spelled apart; the next ones copy the rest of the call from the
    # earlier turns, though no key of the output's context (it holds 900) occurred before:
    # nothing drafted after the first step is rejected.
    assert t.counts.histogram[0] == 1 and t.counts.accepted == len(out) - t.counts.steps
    assert t.counts.steps <= 3


def test_memory_tells_how_outputs_spell_their_first_token_where_the_prompt_holds_them():
    from specgen.draft.memory import NGramMemory

    prompt, out = _session()
    mem = NGramMemory("test")
    mem.add(out)  # the last turn's output, as the prompt holds it (but its first token)
    d = AdaptiveDrafter(cost=linear_cost(0.08), memory=mem)
    t = replay(prompt, out, d, draft=64)
    assert d.respell == {90: 900} and d._copy_memory is None  # memory's copies and n-grams stay out
    # Every drafted token held, the first step's first token included.
    assert t.counts.accepted == t.counts.drafted == len(out) - t.counts.steps and t.counts.steps <= 2
    other = NGramMemory("test")
    other.add(_random_source(3, 40))  # another conversation's output: memory drafts as usual
    d = AdaptiveDrafter(cost=linear_cost(0.08), memory=other)
    replay(prompt, out, d, draft=64)
    assert d._copy_memory is other and d.respell == {}
