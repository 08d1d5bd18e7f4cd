"""Slots keeps between steps what a step asks of it (each row's oldest slot, the held slots on the
device): whatever the batch does to its rows, a step's mask, runs and firsts are what they would be
worked out again from `held`."""

import numpy as np

from specgen.engine.batch.attend import runs
from specgen.engine.batch.slots import Slots


def _firsts(held: np.ndarray) -> list[int]:
    return [int(np.flatnonzero(h)[0]) if h.any() else held.shape[1] for h in held]


def _mask(held: np.ndarray, widths: list[int]) -> np.ndarray:
    width = max(widths)
    step = np.zeros((len(widths), 1, width, held.shape[1] + width), dtype=bool)
    for i, w in enumerate(widths):
        step[i, 0, :, : held.shape[1]] = held[i]
        for t in range(width):
            step[i, 0, t, held.shape[1] : held.shape[1] + min(t + 1, w)] = True
    return step


def test_a_steps_mask_runs_and_firsts_match_held_through_steps_take_backs_drops_and_moves():
    rng = np.random.default_rng(0)
    slots = Slots()
    slots.held = np.arange(6)[None, :] >= np.array([[0], [2], [5]])
    slots.lengths = [int(n) for n in slots.held.sum(axis=1)]
    for _ in range(300):
        op = rng.choice(["step", "step", "take back", "drop", "move"])
        rows = len(slots.lengths)
        if op == "step":
            widths = [int(w) for w in rng.integers(1, 4, rows)]
            slots.begin(widths)
            assert np.array_equal(np.array(slots.mask), _mask(slots.held, widths))
            assert slots.runs == runs(_firsts(slots.held), slots.end + max(widths))
            kept = [int(rng.integers(0, w + 1)) for w in widths]
            slots.commit(max(widths), kept)
        elif op == "take back":
            row = int(rng.integers(rows))
            entries = int(rng.integers(0, slots.lengths[row] + 1))
            slots.release(row, entries)
        elif op == "drop":
            row = int(rng.integers(rows))
            slots.release(row)
        else:  # as compaction reorders rows
            order = rng.permutation(rows)
            slots.held = slots.held[order]
            slots.lengths = [slots.lengths[i] for i in order]
        assert slots.firsts() == _firsts(slots.held), op
        assert slots.lengths == [int(n) for n in slots.held.sum(axis=1)]
        keys = slots.end + 1
        cut = runs(_firsts(slots.held), keys)
        assert slots.reach() == -(-sum((r.stop - r.start) * (keys - r.first) for r in cut) // rows)
