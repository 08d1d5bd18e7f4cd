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

    def __init__(self, spell: int = 0, jitter: float = 0.0, slow: float = 1.6):
        self.spell, self.jitter, self.slow = spell, jitter, slow
        self.rng, self.passes = random.Random(0), 0

    def timer(self, model, solo, rows, tokens, every=0):
        def step(width: int, extra: int = 0) -> float:
            self.passes += 1
            spell = self.slow if self.spell and (self.passes // self.spell) % 2 else 1.0
            return truth(rows, width, extra) * spell * (1 + self.jitter * self.rng.random())

        return step


def timed(stories, monkeypatch, machine: Machine) -> grid.Measured:
    monkeypatch.setattr(grid, "_timer", machine.timer)
    return grid.measure(stories.model, stories.tokenizer.encode("Once upon a time"), max_rows=2, budget_s=0.6)


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
