"""The governor: drafting stops where drafts do not earn their price and resumes where shadow
drafts show they would."""

from specgen.draft.governor import Governor


def flat(price: float):
    return lambda k: price if k else 1.0


def test_drafts_that_never_hold_stop_drafting_within_a_few_steps():
    g = Governor(flat(1.5))
    steps = 0
    while g.allowed():
        g.judged(4, 0)  # one token for a step that costs 1.5 plain ones
        steps += 1
    assert steps <= 4 and g.switches == 1


def test_drafts_that_hold_keep_drafting_and_a_cheap_miss_is_forgiven():
    g = Governor(flat(1.5))
    for _ in range(20):
        g.judged(4, 4)
    g.judged(4, 0)
    assert g.allowed() and g.switches == 0


def test_shadow_drafts_judged_against_the_output_bring_drafting_back():
    g = Governor(flat(1.5))
    while g.allowed():
        g.judged(4, 0)
    out = []
    for i in range(6):  # the output now repeats what the drafter guesses: five tokens a draft
        g.imagine([1, 2, 3, 4])
        g.observe([1, 2, 3, 4, 9])
        out.append(g.allowed())
    assert out[-1] and g.switches == 2


def test_a_shadow_draft_is_decided_at_its_first_miss_and_a_new_one_waits():
    g = Governor(flat(1.0))
    g.judged(1, 0)
    g.imagine([5, 6, 7])
    g.imagine([8])  # one shadow at a time
    before = g.score
    g.observe([5])
    assert g.score == before and g.shadow == [5, 6, 7]
    g.observe([9])  # 5 held, 9 missed 6: two tokens for the price of one step
    assert g.shadow == [] and g.score > before
