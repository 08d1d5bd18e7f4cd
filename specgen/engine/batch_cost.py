"""What a batched step costs by rows and positions per row, and the draft pricing that follows.

A step over B rows of T positions each is timed on a ragged batch (batch_cache.py) for a few
row counts and widths, within a budget of seconds, once per model and machine (cached beside the
single-sequence curve; a grid the budget cut short is kept as it is: measuring again would cut it
again). `Pricing` turns the grid into what the batch engine asks each step: at
B rows, the cost of k + 1 positions per row relative to a plain batched step (cost.py's curve
rules), and whether any draft can pay at that size (if not, the step is plain batched decoding).
"""

from __future__ import annotations

import statistics
import time
from bisect import bisect_left
from typing import Callable, NamedTuple

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache

from specgen.draft.length import CostFn
from specgen.engine.batch_cache import RaggedBatch
from specgen.engine.calibrate import CANNOT_PAY, CONTEXT, SAMPLE, machine_id
from specgen.engine.cost import Curve, cost_function, relative, unprofitable
from specgen.engine.curve_store import batch_calibration_file, read_store, save_entry

ROWS = (1, 2, 4, 8, 16)  # row counts that may be timed (up to the batch's largest)
WIDTHS = (1, 2, 4, 8)  # positions per row that may be timed (cost.py extrapolates past them)
BUDGET_S = 4.0  # about how long the grid may take; rows are timed in increasing order within it
ROUNDS = (3, 25)  # fewest and most rounds of every width, for each row count

Grid = dict[int, dict[int, float]]  # rows -> positions per row -> seconds of a step


def measure(model, sample: list[int], max_rows: int, budget_s: float | None = None) -> Grid:
    """Seconds of a step over B rows x T positions (with the argmax read back, as a step does),
    for B in ROWS up to `max_rows` while the budget lasts (one and two rows always). Widths are
    timed in increasing order, no wider once one costs nearly as much as that many plain steps
    (no draft that wide can pay: calibrate.CANNOT_PAY); each is the median of its rounds."""
    budget_s = BUDGET_S if budget_s is None else budget_s
    tokens = (sample * CONTEXT)[:CONTEXT]
    solo = make_prompt_cache(model)
    model(mx.array([tokens[:-1]], mx.uint32), cache=solo)
    mx.eval([c.state for c in solo])
    counts = _counts(max_rows)
    grid: Grid = {}
    start = time.perf_counter()
    for n, rows in enumerate(counts):
        step = _timer(model, solo, rows, tokens)
        step(1)  # warm-up: kernels compiled, buffers allocated
        first = {1: step(1)}
        for w in WIDTHS[1:]:
            first[w] = step(w)
            if first[w] >= CANNOT_PAY * w * first[1]:
                break
        share = (budget_s - (time.perf_counter() - start)) / (len(counts) - n)
        rounds = max(ROUNDS[0], min(ROUNDS[1], int(share / sum(first.values()))))
        times = {w: [t] for w, t in first.items()}
        for _ in range(rounds - 1):
            for w, taken in times.items():
                taken.append(step(w))
        grid[rows] = {w: statistics.median(v) for w, v in times.items()}
        if n >= 1 and time.perf_counter() - start + 2 * ROUNDS[0] * sum(grid[rows].values()) > budget_s:
            break  # the next row count (twice as many) would not fit
    return grid


def _counts(max_rows: int) -> list[int]:
    """The row counts a grid for batches of up to `max_rows` rows times (budget permitting)."""
    return [r for r in ROWS if r <= max(max_rows, 2)]


def _timer(model, solo: list, rows: int, tokens: list[int]) -> Callable[[int], float]:
    """A function timing one step of `rows` rows (each holding what `solo` holds) by width."""
    batch = RaggedBatch(len(solo))
    for _ in range(rows):
        batch.add(solo)

    def step(width: int) -> float:
        # Nothing is committed: every timed pass writes the same slots over again.
        batch.slots.begin([width] * rows)
        x = mx.array([(tokens * width)[:width]] * rows, mx.uint32)
        t = time.perf_counter()
        mx.argmax(model(x, cache=batch.layers), axis=-1).tolist()
        return time.perf_counter() - t

    return step


class Pricing:
    """What a batched step costs, by rows (the grid's row count at or above, the largest past it):
    `step(rows)(k)` is a step of k + 1 positions per row relative to a plain one; `drafting(rows)`
    is the cost drafters weigh drafts with there, or None where drafting cannot pay at that size
    (cost.unprofitable): the step is then plain batched decoding."""

    def __init__(self, grid: Grid):
        self.sizes = sorted(grid)
        self._step = {rows: cost_function(relative(grid[rows])) for rows in self.sizes}
        self._drafting = {rows: None if unprofitable(Curve(relative(grid[rows]))) else self._step[rows]
                          for rows in self.sizes}

    def _size(self, rows: int) -> int:
        return self.sizes[min(bisect_left(self.sizes, rows), len(self.sizes) - 1)]

    def step(self, rows: int) -> CostFn:
        return self._step[self._size(rows)]

    def drafting(self, rows: int) -> CostFn | None:
        return self._drafting[self._size(rows)]


class Stored(NamedTuple):
    """A cached grid, and whether the budget ended it before the row counts asked for."""

    grid: Grid
    cut: bool


def _valid(entry) -> Stored | None:
    try:
        grid = {int(b): {int(t): float(s) for t, s in row.items()} for b, row in entry["grid"].items()}
        cut = entry["cut"]
    except (AttributeError, KeyError, ValueError, TypeError):
        return None
    ok = grid and isinstance(cut, bool) and all(
        1 in row and len(row) >= 2 and all(s > 0 for s in row.values()) for row in grid.values())
    return Stored(grid, cut) if ok else None


def load_or_measure(model, model_key: str, tokenizer, max_rows: int, *, recalibrate: bool = False,
                    before_measuring=lambda: None) -> tuple[Grid, str | None]:
    """This model's grid on this machine from the cache, or measured and cached (enough rows for
    `max_rows`, or as many as the budget allowed); and a warning where the cache cannot be written."""
    path = batch_calibration_file()
    key = f"{model_key}|{machine_id()}"
    try:
        cached = None if recalibrate else _valid(read_store(path).get(key))
    except (OSError, ValueError):
        cached = None
    if cached is not None and (cached.cut or max(cached.grid) >= max(_counts(max_rows))):
        return cached.grid, None
    before_measuring()
    grid = measure(model, list(tokenizer.encode(SAMPLE)) or [0], max_rows)
    cut = max(grid) < max(_counts(max_rows))
    try:
        stored = {str(b): {str(t): s for t, s in row.items()} for b, row in grid.items()}
        save_entry(path, key, {"grid": stored, "cut": cut})
    except OSError as e:
        return grid, f"cannot save the batch calibration to {path} ({e.strerror or e})"
    return grid, None
