"""What a batched step costs by rows and positions per row, timed once per model and machine.

A step over B rows of T positions each is timed on a ragged batch (batch/cache.py) for every
row count up to the batch's largest, at the widths a draft could pay at, and at two rows over a
long cache (`measure`); where the model's passes may be fed flat (batch/probe.py), so is a step
of B rows one of which feeds E more positions. `load_or_measure` caches it beside the
single-sequence curve (a larger batch later adds row counts). cost/batch.py prices drafts by it.
"""

from __future__ import annotations

import statistics
import time
from typing import Callable, NamedTuple

import mlx.core as mx
from mlx_lm.models.cache import ArraysCache, KVCache, RotatingKVCache, make_prompt_cache

from specgen.engine.batch.cache import RaggedBatch
from specgen.engine.batch.probe import probe
from specgen.engine.cost.calibrate import CONTEXT, SAMPLE
from specgen.engine.cost.curve import cannot_pay
from specgen.engine.cost.store import batch_calibration_file, entry_key, read_store, save_entry
from specgen.engine.decode.eager import eager

ROWS = (1, 2, 4, 8, 16, 32)  # row counts that may be timed (up to the batch's largest)
WIDTHS = (1, 2, 4, 8, 16, 32, 64)  # positions per row that may be timed (curve.py extrapolates past them)
SURE = 8  # widths past this are timed only where their rounds fit the budget (a GPU's flat grid)
BUDGET_S = 4.0  # about how long the rounds past the fewest may take, over all row counts
ROUNDS = (3, 25)  # fewest and most rounds of every width, for each row count
# Where a width's cost has not settled (the standard error of its median ratio to a plain step
# over SETTLED of it), its rounds go on past the budget, up to NOISY times it (docs/design.md).
SETTLED = 0.02
NOISY = 3.0
LONG = 1024  # cache slots of the second timing, which prices the slots a step attends over

Grid = dict[int, dict[int, float]]  # rows -> positions per row (or added, flat) -> seconds of a step
Timings = dict[tuple[int, int], list[float]]  # (positions a row, more the first row feeds) -> seconds


class Measured(NamedTuple):
    """A grid timed over a cache of CONTEXT slots, and what each further slot adds to a step:
    `slot_s` seconds per row, plus `position_slot_s` per row and position. (Every row attends over
    the whole buffer: on a CPU a wide step over 8 rows costs 2.9x a plain one at 32 slots and
    4.3x at 1024; docs/design.md.) `flat`: rows -> positions one row adds to a step fed flat ->
    seconds (empty where the model's passes are never fed flat, or it was not timed)."""

    grid: Grid
    slot_s: float = 0.0
    position_slot_s: float = 0.0
    flat: Grid = {}

    def seconds(self, rows: int, slots: int) -> dict[int, float]:
        """A step's seconds by width at `rows` rows over `slots` cache slots: between two timed
        row counts, the line through them (at the widths the larger was timed at); past the
        largest, the largest's."""
        rows, by_width = _between(self.grid, rows)
        more = max(0, slots - CONTEXT) * rows
        return {w: s + more * (self.slot_s + w * self.position_slot_s) for w, s in by_width.items()}

    def flat_seconds(self, rows: int, slots: int) -> dict[int, float]:
        """A flat step's seconds at `rows` rows over `slots` cache slots, by the positions one row
        feeds (1: a plain step; 1 + E: E more, each over that row's slots), as `seconds` reads the
        grid; {} where no flat step was timed."""
        if not self.flat:
            return {}
        plain = self.seconds(rows, slots)[1]
        rows, by_extra = _between(self.flat, rows)
        more = max(0, slots - CONTEXT) * self.position_slot_s
        return {1: plain, **{1 + e: s + plain - self.seconds(rows, CONTEXT)[1] + e * more
                             for e, s in by_extra.items()}}


def _between(grid: Grid, rows: int) -> tuple[int, dict[int, float]]:
    """`grid` at `rows` rows: between two timed row counts, the line through them (at the keys the
    larger was timed at); past the largest, the largest's; and the rows that is (at most it)."""
    sizes = sorted(grid)
    hi = next((b for b in sizes if b >= rows), sizes[-1])
    lo = max((b for b in sizes if b <= rows), default=hi)
    at = (min(rows, hi) - lo) / (hi - lo) if hi > lo else 1.0
    return min(rows, hi), {w: grid[lo].get(w, s) + at * (s - grid[lo].get(w, s)) for w, s in grid[hi].items()}


def measure(model, sample: list[int], max_rows: int, budget_s: float | None = None, every: int = 0) -> Measured:
    """Seconds of a step over B rows x T positions (with the argmax read back, as a step does),
    for every B in ROWS up to `max_rows` (a size left out would be priced as a smaller one, and
    its drafts be too long). Widths are timed in increasing order, no wider once two in a row cost
    nearly as much as that many plain steps (curve.cannot_pay), nor past SURE where the rounds
    would overrun the budget; each is the median of ROUNDS[0] rounds, or more up to SURE while
    the budget lasts, and on while their costs have not settled (`_settled`, up to NOISY
    budgets); up to SURE a step's cost is its median ratio to the same rounds' plain step. Where
    the model's passes may be fed flat, so is a step of B rows one of which feeds E more
    positions (1 + E as the widths), by the same rules, as a row's share of the step sees them.
    Then two rows over LONG slots (the entries copied over, not computed: only the shapes
    matter) at widths 1 and up to SURE give the cost of a slot. `every`: steps run eagerly so
    (decode/eager.py), as batch.py runs a step nothing runs ahead of."""
    budget_s = BUDGET_S if budget_s is None else budget_s
    tokens = (sample * CONTEXT)[:CONTEXT]
    solo = make_prompt_cache(model)
    model(mx.array([tokens[:-1]], mx.uint32), cache=solo)
    mx.eval([c.state for c in solo])
    counts, flat = _counts(max_rows), probe(model).flat
    grid: Grid = {}
    flats: Grid = {}
    start, unsettled = time.perf_counter(), 0.0  # (and seconds of rounds past the budget's)

    def share(n: int) -> float:  # the n-th row count's share of what is left of the budget
        return (budget_s - (time.perf_counter() - start - unsettled)) / (len(counts) - n)

    for n, rows in enumerate(counts):
        step = _timer(model, solo, rows, tokens, every)
        ahead = share(n)
        step(1)  # warm-up: kernels compiled, buffers allocated
        first = _widths(step, ahead)
        if flat and rows > 1:
            first |= _widths(step, ahead, flat=rows)
        # Rounds past the fewest for the steps up to SURE, in what the wider ones leave; past
        # that, more while they have not settled, in the row count's even share of NOISY budgets.
        wide_s = (ROUNDS[0] - 1) * sum(t for key, t in first.items() if _wide(key))
        narrow_s = sum(t for key, t in first.items() if not _wide(key))
        rounds, noisy = (max(ROUNDS[0], min(ROUNDS[1], int((budget - wide_s) / narrow_s)))
                         for budget in (share(n), NOISY * budget_s / len(counts)))
        times = {key: [t] for key, t in first.items()}
        narrow, wide = ([key for key in times if _wide(key) == far] for far in (False, True))
        step(1)  # not timed: a pass right after a wide one ran ~15% slow on this CPU
        for done in range(1, max(rounds, noisy)):
            if done >= rounds and _settled(times, narrow):
                break
            began = time.perf_counter()
            for key in narrow:
                times[key].append(step(*key))
            unsettled += (time.perf_counter() - began) if done >= rounds else 0.0
        for _ in range(ROUNDS[0] - 1):  # the wide ones last, apart
            for key in wide:
                times[key].append(step(*key))
        seconds = _estimate(times, narrow)
        grid[rows] = {w: s for (w, e), s in seconds.items() if not e}
        if any(e for _, e in seconds):
            flats[rows] = {e: s for (_, e), s in seconds.items() if e}
    return Measured(grid, *_per_slot(model, solo, tokens, grid[2]), flats)


def _widths(step: Callable[..., float], ahead: float, flat: int = 0) -> dict[tuple[int, int], float]:
    """One timing of each width in WIDTHS, by (positions a row, more the first row feeds), until
    no wider one can pay (curve.cannot_pay) or its rounds would take more than `ahead` seconds.
    `flat` (rows): fed flat, the first row feeding the width, the others one position each; seen
    as the step less the others' share of this call's plain one (another pass's, a sample apart,
    left one row's share of 4 almost nothing where it ran 20% slow: every width looked dear)."""
    key = (lambda w: (w, 0)) if not flat else (lambda w: (1, w - 1))
    first = {1: step(1)}
    beside = first[1] * (flat - 1) / flat if flat else 0.0
    for w in WIDTHS[1:]:
        widest = max(first)
        if w > SURE and (1 + ROUNDS[0]) * first[widest] * w / widest > ahead:
            break  # its rounds would take this row count's share of the budget: extrapolated
        step(*key(w))  # its kernels compiled first: a cold width looks dear (seconds on MLX's CUDA build)
        first[w] = step(*key(w))
        if cannot_pay({w: t - beside for w, t in first.items()}):
            break
    return {key(w): t for w, t in first.items()}


def _ratios(times: Timings, key: tuple[int, int]) -> list[float]:
    """Each round's timing of `key` over the same round's plain step: a slow spell that spans a
    round (this VM's spells last a second or more) moves both."""
    return [t / plain for t, plain in zip(times[key], times[1, 0])]


def _settled(times: Timings, narrow: list[tuple[int, int]]) -> bool:
    """Whether every narrow step's median ratio to a plain one is known within SETTLED of it (its
    standard error from the median absolute deviation, as for normally spread timings)."""
    for key in narrow:
        ratios = _ratios(times, key)
        mid = statistics.median(ratios)
        spread = statistics.median(abs(r - mid) for r in ratios)
        # 1.4826 deviations are a normal sigma; a median's standard error is 1.2533 sigma / sqrt(n).
        if 1.4826 * 1.2533 * spread / len(ratios) ** 0.5 > SETTLED * mid:
            return False
    return True


def _estimate(times: Timings, narrow: list[tuple[int, int]]) -> dict[tuple[int, int], float]:
    """Seconds by step: a plain step's median, each narrow one's median ratio to it (timed in the
    same rounds) times that, the wide ones' own medians (timed apart)."""
    plain = statistics.median(times[1, 0])
    return {key: plain * statistics.median(_ratios(times, key)) if key in narrow else statistics.median(v)
            for key, v in times.items()}


def _wide(key: tuple[int, int]) -> bool:
    """Whether a step (positions a row, more the first row feeds) is timed past SURE."""
    return max(key) > SURE


def _per_slot(model, solo: list, tokens: list[int], two: dict[int, float]) -> tuple[float, float]:
    """(seconds per row per slot, and per row, position and slot) that LONG slots add to the
    steps `two` timed over two rows of CONTEXT slots, at widths 1 and its widest up to SURE."""
    long = []
    for c in solo:
        if type(c) is ArraysCache:  # a state layer costs the same over any context
            long.append(c)
            continue
        window = type(c) is RotatingKVCache  # its entries in time order, then as long as the rest
        held = [c._temporal_order(x) if window else x[..., : c.offset, :] for x in (c.keys, c.values)]
        kv = RotatingKVCache(c.max_size) if window else KVCache()
        reps = -(-LONG // held[0].shape[2])
        kv.keys, kv.values = (mx.concatenate([x] * reps, axis=2)[..., :LONG, :] for x in held)
        kv.offset = LONG
        if window:
            kv._idx = LONG
        long.append(kv)
    step = _timer(model, long, 2, tokens)
    step(1)  # warm-up
    wide = max(w for w in two if w <= SURE)  # the widths a CPU drafts at (fitted there: design.md)
    extra = {w: max(0.0, statistics.median(step(w) for _ in range(ROUNDS[0])) - two[w])
             / (2 * (LONG - CONTEXT)) for w in (1, wide)}
    per_position = max(0.0, (extra[wide] - extra[1]) / (wide - 1))
    return max(0.0, extra[1] - per_position), per_position


def _counts(max_rows: int) -> list[int]:
    """The row counts a grid for batches of up to `max_rows` rows times: ROWS up to the first at or
    past it (a batch between two is priced between them), two at least."""
    n = next((i for i, r in enumerate(ROWS) if r >= max(max_rows, 2)), len(ROWS) - 1)
    return list(ROWS[: n + 1])


def _timer(model, solo: list, rows: int, tokens: list[int], every: int = 0) -> Callable[..., float]:
    """A function timing one step of `rows` rows (each holding what `solo` holds) by width, or fed
    flat with the first row feeding `extra` more positions, run eagerly every `every` layers
    (decode/eager.py)."""
    batch = RaggedBatch(len(solo))
    batch.add([solo] * rows)

    def step(width: int, extra: int = 0) -> float:
        # Nothing is committed: every timed pass writes the same slots over again.
        fed = [width + extra] + [width] * (rows - 1)
        batch.slots.begin(fed, flat=bool(extra))
        x = mx.array([(tokens * fed[0])[: fed[0]]] * rows, mx.uint32)
        if extra:
            x = x.reshape(-1)[batch.slots.flat.whole.take][:, None]
        t = time.perf_counter()
        with eager(batch.layers, every):
            logits = model(x, cache=batch.layers)
        mx.argmax(logits, axis=-1).tolist()
        return time.perf_counter() - t

    return step


def _valid(entry) -> Measured | None:
    try:
        grid, flat = ({int(b): {int(t): float(s) for t, s in row.items()}
                       for b, row in entry.get(k, {}).items()} for k in ("grid", "flat"))
        per_slot = float(entry["slot_s"]), float(entry["position_slot_s"])
    except (AttributeError, KeyError, ValueError, TypeError):
        return None
    ok = grid and all(1 in row and len(row) >= 2 and all(s > 0 for s in row.values())
                      for row in grid.values()) and all(s > 0 for row in flat.values() for s in row.values())
    return Measured(grid, *per_slot, flat) if ok and min(per_slot) >= 0 else None


def load_or_measure(model, model_key: str, tokenizer, max_rows: int, *, recalibrate: bool = False,
                    before_measuring=lambda: None, every: int = 0) -> tuple[Measured, str | None]:
    """This model's step costs on this machine from the cache, or measured and cached (the row
    counts for `max_rows`, flat steps too where the model's may be: a cached grid of fewer is
    measured again; steps run eagerly every `every` layers, as the single-sequence curve says,
    measured again with it); and a warning where the cache cannot be written."""
    path = batch_calibration_file()
    key = entry_key(model_key)
    try:
        cached = None if recalibrate else _valid(read_store(path).get(key))
    except (OSError, ValueError):
        cached = None
    counts = set(_counts(max_rows))
    flat = counts - {1} if probe(model).flat else set()  # a cache from before flat steps were timed lacks it
    if cached is not None and counts <= set(cached.grid) and flat <= set(cached.flat):
        return cached, None
    before_measuring()
    measured = measure(model, list(tokenizer.encode(SAMPLE)) or [0], max_rows, every=every)
    try:
        stored = {k: {str(b): {str(t): s for t, s in row.items()} for b, row in g.items()}
                  for k, g in (("grid", measured.grid), ("flat", measured.flat))}
        save_entry(path, key, {**stored, "slot_s": measured.slot_s,
                               "position_slot_s": measured.position_slot_s})
    except OSError as e:
        return measured, f"cannot save the batch calibration to {path} ({e.strerror or e})"
    return measured, None
