"""The batched-step grid's timing on a noisy machine: slow spells and jitter (grid.measure)."""

import random

import pytest

from specgen.engine.cost import grid
from specgen.engine.cost.curve import relative

WIDTH = {1: 1.0, 2: 1.1, 4: 1.3, 8: 1.9}  # a step's cost by positions a row, relative to one


def truth(rows: int, width: int, extra: int = 0) -> float:
    """Seconds of a step on the machine below: rows add 10% each, widths as WIDTH (a line past 8),
    a row fed flat 10% a position."""
    return 0.01 * (1 + 0.1 * (rows - 1)) * WIDTH.get(width, 1.9 * width / 8) * (1 + 0.1 * extra)


class Machine:
    """Timings as a machine gives them (grid's timer replaced): `truth` times a slow spell's factor
    over stretches of `spell` passes (0: none) times a uniform jitter of up to `jitter`."""

    def __init__(self, spell: int = 0, jitter: float = 0.0, slow: float = 1.6, first_plain: float = 1.0):
        self.spell, self.jitter, self.slow, self.first_plain = spell, jitter, slow, first_plain
        self.rng, self.passes = random.Random(0), 0

    def timer(self, model, solo, rows, tokens, every=0):
        plains = []

        def step(width: int, extra: int = 0) -> float:
            self.passes += 1
            spell = self.slow if self.spell and (self.passes // self.spell) % 2 else 1.0
            plains.append(width == 1 and not extra)
            once = self.first_plain if sum(plains) == 2 and plains[-1] else 1.0  # (the first was a warm-up)
            return truth(rows, width, extra) * spell * once * (1 + self.jitter * self.rng.random())

        return step


def timed(stories, monkeypatch, machine: Machine, max_rows: int = 2) -> grid.Measured:
    monkeypatch.setattr(grid, "_timer", machine.timer)
    return grid.measure(stories.model, stories.tokenizer.encode("Once upon a time"), max_rows=max_rows,
                        budget_s=0.6)


def test_slow_spells_that_span_rounds_do_not_move_the_grid(stories, monkeypatch):
    # This VM's spells: a step 1.6x slower for a second at a time, a few rounds of every width.
    # (Each width's own median was 1.6x off: its rounds and the plain step's fell apart.)
    measured = timed(stories, monkeypatch, Machine(spell=20, jitter=0.01))
    for rows in (1, 2):
        got = relative(measured.grid[rows])
        assert all(got[w] == pytest.approx(WIDTH[w], rel=0.02) for w in WIDTH)
        if rows > 1:
            plain = measured.grid[rows][1]
            narrow = {e: s for e, s in measured.flat[rows].items() if e < grid.SURE}  # (wider: timed apart)
            assert len(narrow) == 3
            assert all(s / plain == pytest.approx(1 + 0.1 * e, rel=0.02) for e, s in narrow.items())


def test_a_noisy_machine_is_timed_for_more_rounds_and_a_quiet_one_for_the_fewest(stories, monkeypatch):
    quiet, noisy = Machine(), Machine(jitter=0.3)
    timed(stories, monkeypatch, quiet)
    measured = timed(stories, monkeypatch, noisy)
    assert noisy.passes > 1.3 * quiet.passes  # past the budget's rounds while they have not settled
    assert relative(measured.grid[2])[2] == pytest.approx(WIDTH[2], rel=0.05)


def test_one_slow_plain_step_does_not_stop_the_flat_steps_short(stories, monkeypatch):
    # The flat steps' first timings decide how wide they are timed (curve.cannot_pay, each seen as
    # the step less the other rows' share of a plain one). Taken from another pass's plain step
    # 20% slow, that share left one row's almost nothing at 4 rows: every width looked as dear as
    # that many plain steps, and flat steps past +3 were extrapolated from +1 and +3.
    measured = timed(stories, monkeypatch, Machine(first_plain=1.2), max_rows=4)
    assert all(max(measured.flat[rows]) >= grid.SURE - 1 for rows in (2, 4))
