"""The draft-length rule: the Leviathan choice over a cost curve, computed lazily."""

import pytest

from specgen.draft.length import CostTable, Refeed, choose_length, linear_cost


def chosen(qs, cost, room=64, min_p=0.0):
    pulled = []

    def chances():
        for q in qs:
            pulled.append(q)
            yield q

    return choose_length(chances(), CostTable(cost, 64), room, min_p), len(pulled)


def test_drafts_the_length_with_the_most_tokens_per_unit_of_cost():
    # q = 0.9 each: 1 + 0.9 + 0.81 + ... over 1 + 0.5k peaks at 2 drafts (2.71 / 2.0 = 1.355,
    # against 1.9 / 1.5 = 1.267 for one and 3.439 / 2.5 = 1.376 for three...).
    rates = {k: (1 + sum(0.9 ** i for i in range(1, k + 1))) / (1 + 0.5 * k) for k in range(8)}
    best = max(rates, key=rates.get)
    assert chosen([0.9] * 8, linear_cost(0.5))[0] == best == 3


def test_cheap_verification_drafts_long_and_unlikely_tokens_none():
    assert chosen([0.999] * 64, linear_cost(0.01))[0] == 64
    assert chosen([0.05] * 8, linear_cost(0.08))[0] == 0


def test_room_and_min_p_bound_the_draft():
    assert chosen([0.99] * 64, linear_cost(0.01), room=5)[0] == 5
    assert chosen([0.5] * 64, linear_cost(0.0), min_p=0.1)[0] == 3  # 0.5^4 < 0.1


def test_chances_are_pulled_only_while_a_longer_draft_could_pay():
    k, pulled = chosen([0.3] * 64, linear_cost(0.5))
    assert k == 0 and pulled < 4


@pytest.mark.parametrize("curve", [{1: 1.0, 2: 1.08, 4: 1.3, 8: 1.8, 16: 2.7, 32: 4.5, 64: 8.0},
                                   {1: 1.0, 2: 1.0, 4: 1.0, 8: 1.5, 16: 1.5, 32: 3.0, 64: 6.0}])
def test_stopping_early_never_changes_the_choice(curve):
    # The bound stops pulling once no longer draft can pay; without it (slopes of 0) every chance
    # is pulled, and the choice must be the same on every sequence of chances.
    import random

    from specgen.engine.cost.curve import cost_function

    cost = cost_function(curve)
    rng = random.Random(7)
    for _ in range(300):
        qs = [rng.choice([0.05, 0.3, 0.6, 0.9, 0.99]) for _ in range(rng.randrange(1, 40))]
        table = CostTable(cost, 64)
        unbounded = CostTable(cost, 64)
        unbounded.slope = [0.0] * 65
        assert (choose_length(iter(qs), table, 64, 0.05)
                == choose_length(iter(qs), unbounded, 64, 0.05))


def test_re_fed_tokens_are_charged_by_the_chance_of_a_rejection():
    step = linear_cost(0.2)

    def expected(qs, k):  # tokens per unit of cost, a rejection at i re-feeding i positions
        p, gain, extra = 1.0, 0.0, 0.0
        for i, q in enumerate(qs[:k], 1):
            extra += p * (1 - q) * (step(i) - step(0))
            p *= q
            gain += p
        return (1 + gain) / (step(k) + extra)

    for qs in ([0.6] * 12, [0.9] * 12, [0.95, 0.9, 0.5, 0.99, 0.99, 0.99]):
        best = max(range(len(qs) + 1), key=lambda k: expected(qs, k))
        assert chosen(qs, Refeed(step, step))[0] == best
    # Sure drafts are never rejected: nothing is re-fed, and they are as long as on a trimmed cache.
    assert chosen([1.0] * 64, Refeed(step, step))[0] == chosen([1.0] * 64, step)[0] == 64
    assert chosen([0.6] * 12, Refeed(step, step))[0] < chosen([0.6] * 12, step)[0]
