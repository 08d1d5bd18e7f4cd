"""What a batched step costs by rows and positions per row, and the draft pricing that follows.

A step over B rows of T positions each is timed on a ragged batch (batch/cache.py) for every
row count up to the batch's largest, at the widths a draft could pay at, and at two rows over a
long cache, once per model and machine (cached beside the single-sequence curve; a larger batch
later adds row counts). `Pricing` turns that into what the batch engine asks each step: at B rows
over S cache slots, the cost of k + 1 positions per row relative to a plain batched step
(curve.py's curve rules), and whether any draft can pay there (if not, the step is plain batched
decoding); `step_drafts` and `behind_drafts` apply it to a step's rows.
"""

from __future__ import annotations

import statistics
import time
from typing import Callable, NamedTuple

import mlx.core as mx
from mlx_lm.models.cache import ArraysCache, KVCache, RotatingKVCache, make_prompt_cache

from specgen.draft.length import CostFn
from specgen.engine.batch.cache import RaggedBatch
from specgen.engine.batch.row import Row
from specgen.engine.cost.calibrate import CONTEXT, SAMPLE
from specgen.engine.cost.curve import Curve, cannot_pay, cost_function, drafting_cost, relative, unprofitable
from specgen.engine.cost.store import batch_calibration_file, machine_id, read_store, save_entry
from specgen.engine.decode.eager import eager
from specgen.events import Coming

ROWS = (1, 2, 4, 8, 16, 32)  # row counts that may be timed (up to the batch's largest)
WIDTHS = (1, 2, 4, 8)  # positions per row that may be timed (curve.py extrapolates past them)
BUDGET_S = 4.0  # about how long the rounds past the fewest may take, over all row counts
ROUNDS = (3, 25)  # fewest and most rounds of every width, for each row count
LONG = 1024  # cache slots of the second timing, which prices the slots a step attends over
BUCKET = 128  # slots are priced in steps of this many (drafters rebuild their tables per price)

Grid = dict[int, dict[int, float]]  # rows -> positions per row -> seconds of a step


class Measured(NamedTuple):
    """A grid timed over a cache of CONTEXT slots, and what each further slot adds to a step:
    `slot_s` seconds per row, plus `position_slot_s` per row and position. (Every row attends over
    the whole buffer: on a CPU a wide step over 8 rows costs 2.9x a plain one at 32 slots and
    4.3x at 1024; docs/design.md.)"""

    grid: Grid
    slot_s: float = 0.0
    position_slot_s: float = 0.0

    def seconds(self, rows: int, slots: int) -> dict[int, float]:
        """A step's seconds by width at `rows` rows over `slots` cache slots: between two timed
        row counts, the line through them (at the widths the larger was timed at); past the
        largest, the largest's."""
        sizes = sorted(self.grid)
        hi = next((b for b in sizes if b >= rows), sizes[-1])
        lo = max((b for b in sizes if b <= rows), default=hi)
        at = (min(rows, hi) - lo) / (hi - lo) if hi > lo else 1.0
        more = max(0, slots - CONTEXT) * min(rows, hi)
        return {w: self.grid[lo].get(w, s) + at * (s - self.grid[lo].get(w, s))
                + more * (self.slot_s + w * self.position_slot_s) for w, s in self.grid[hi].items()}


def measure(model, sample: list[int], max_rows: int, budget_s: float | None = None, every: int = 0) -> Measured:
    """Seconds of a step over B rows x T positions (with the argmax read back, as a step does),
    for every B in ROWS up to `max_rows` (a size left out would be priced as a smaller one, and
    its drafts be too long). Widths are timed in increasing order, no wider once two in a row cost
    nearly as much as that many plain steps (curve.cannot_pay), which bounds the dear large
    sizes; each is the median of ROUNDS[0] rounds, or more while the budget lasts. Then two rows
    over LONG slots (the entries copied over, not computed: only the shapes matter) at the
    narrowest and widest width give the cost of a slot. `every`: steps run eagerly
    so (decode/eager.py), as batch.py runs a step nothing runs ahead of."""
    budget_s = BUDGET_S if budget_s is None else budget_s
    tokens = (sample * CONTEXT)[:CONTEXT]
    solo = make_prompt_cache(model)
    model(mx.array([tokens[:-1]], mx.uint32), cache=solo)
    mx.eval([c.state for c in solo])
    counts = _counts(max_rows)
    grid: Grid = {}
    start = time.perf_counter()
    for n, rows in enumerate(counts):
        step = _timer(model, solo, rows, tokens, every)
        step(1)  # warm-up: kernels compiled, buffers allocated
        first = {1: step(1)}
        for w in WIDTHS[1:]:
            step(w)  # its kernels compiled first: a cold width looks dear (seconds on MLX's CUDA build)
            first[w] = step(w)
            if cannot_pay(first):
                break
        share = (budget_s - (time.perf_counter() - start)) / (len(counts) - n)
        rounds = max(ROUNDS[0], min(ROUNDS[1], int(share / sum(first.values()))))
        times = {w: [t] for w, t in first.items()}
        for _ in range(rounds - 1):
            for w, taken in times.items():
                taken.append(step(w))
        grid[rows] = {w: statistics.median(v) for w, v in times.items()}
    return Measured(grid, *_per_slot(model, solo, tokens, grid[2]))


def _per_slot(model, solo: list, tokens: list[int], two: dict[int, float]) -> tuple[float, float]:
    """(seconds per row per slot, and per row, position and slot) that LONG slots add to the
    steps `two` timed over two rows of CONTEXT slots, at its narrowest and widest width."""
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
    wide = max(two)
    extra = {w: max(0.0, statistics.median(step(w) for _ in range(ROUNDS[0])) - two[w])
             / (2 * (LONG - CONTEXT)) for w in (1, wide)}
    per_position = max(0.0, (extra[wide] - extra[1]) / (wide - 1))
    return max(0.0, extra[1] - per_position), per_position


def _counts(max_rows: int) -> list[int]:
    """The row counts a grid for batches of up to `max_rows` rows times: ROWS up to the first at or
    past it (a batch between two is priced between them), two at least."""
    n = next((i for i, r in enumerate(ROWS) if r >= max(max_rows, 2)), len(ROWS) - 1)
    return list(ROWS[: n + 1])


def _timer(model, solo: list, rows: int, tokens: list[int], every: int = 0) -> Callable[[int], float]:
    """A function timing one step of `rows` rows (each holding what `solo` holds) by width, run
    eagerly every `every` layers (decode/eager.py)."""
    batch = RaggedBatch(len(solo))
    batch.add([solo] * rows)

    def step(width: int) -> float:
        # Nothing is committed: every timed pass writes the same slots over again.
        batch.slots.begin([width] * rows)
        x = mx.array([(tokens * width)[:width]] * rows, mx.uint32)
        t = time.perf_counter()
        with eager(batch.layers, every):
            logits = model(x, cache=batch.layers)
        mx.argmax(logits, axis=-1).tolist()
        return time.perf_counter() - t

    return step


class Pricing:
    """What a batched step costs, by rows (Measured.seconds: between timed row counts, a line)
    and the cache slots it attends over (rounded up to BUCKET), relative to a plain one:
    `built(rows, slots)(k)`, a step of k + 1 positions per row built once the one before was read,
    as the grid timed it; `queued`, one queued behind the one in flight (batch.py), which costs
    `overlap` (the single-sequence calibration's share of a plain step that queuing hides) less;
    `step`, what drafters weigh drafts with (as alone, curve.drafting_cost: plain steps queued, a
    draft's verdict read before the next); `drafting`, that, or None where drafting cannot pay
    (cost.unprofitable): the step is then plain batched decoding. The grid's steps ran eagerly
    every `eager` layers (Curve.eager), as batch.py runs a step nothing runs ahead of."""

    def __init__(self, measured: Measured, overlap: float = 0.0, eager: int = 0):
        self.measured, self.overlap, self.eager = measured, overlap, eager
        self.sizes = sorted(measured.grid)
        self._priced: dict[tuple[int, int], tuple[CostFn, CostFn, CostFn | None]] = {}

    def _at(self, rows: int, slots: int) -> tuple[CostFn, CostFn, CostFn | None]:
        key = (min(rows, self.sizes[-1]), -(-max(slots, 1) // BUCKET) * BUCKET)
        if key not in self._priced:
            curve = relative(self.measured.seconds(*key))
            built = cost_function(curve)
            step = drafting_cost(built, self.overlap, ahead=0)
            self._priced[key] = (built, step, None if unprofitable(Curve(curve)) else step)
        return self._priced[key]

    def built(self, rows: int, slots: int = 0) -> CostFn:
        """A pass built once the one before was read, as the grid timed it."""
        return self._at(rows, slots)[0]

    def queued(self, rows: int, slots: int = 0) -> CostFn:
        """A pass queued behind the one in flight: the host's work overlaps it."""
        built = self._at(rows, slots)[0]
        return lambda k: built(k) - self.overlap

    def step(self, rows: int, slots: int = 0) -> CostFn:
        return self._at(rows, slots)[1]

    def drafting(self, rows: int, slots: int = 0) -> CostFn | None:
        return self._at(rows, slots)[2]


def _valid(entry) -> Measured | None:
    try:
        grid = {int(b): {int(t): float(s) for t, s in row.items()} for b, row in entry["grid"].items()}
        per_slot = float(entry["slot_s"]), float(entry["position_slot_s"])
    except (AttributeError, KeyError, ValueError, TypeError):
        return None
    ok = grid and all(1 in row and len(row) >= 2 and all(s > 0 for s in row.values())
                      for row in grid.values())
    return Measured(grid, *per_slot) if ok and min(per_slot) >= 0 else None


def load_or_measure(model, model_key: str, tokenizer, max_rows: int, *, recalibrate: bool = False,
                    before_measuring=lambda: None, every: int = 0) -> tuple[Measured, str | None]:
    """This model's step costs on this machine from the cache, or measured and cached (the row
    counts for `max_rows`: a cached grid of fewer is measured again; steps run eagerly every
    `every` layers, as the single-sequence curve says, measured again with it); and a warning
    where the cache cannot be written."""
    path = batch_calibration_file()
    key = f"{model_key}|{machine_id()}"
    try:
        cached = None if recalibrate else _valid(read_store(path).get(key))
    except (OSError, ValueError):
        cached = None
    if cached is not None and set(_counts(max_rows)) <= set(cached.grid):
        return cached, None
    before_measuring()
    measured = measure(model, list(tokenizer.encode(SAMPLE)) or [0], max_rows, every=every)
    try:
        stored = {str(b): {str(t): s for t, s in row.items()} for b, row in measured.grid.items()}
        save_entry(path, key, {"grid": stored, "slot_s": measured.slot_s,
                               "position_slot_s": measured.position_slot_s})
    except OSError as e:
        return measured, f"cannot save the batch calibration to {path} ({e.strerror or e})"
    return measured, None


def best_width(coming: list[Coming], cost: CostFn, queued: bool = False, every: bool = False) -> int:
    """The drafts per row a pass carries: the k that maximises the tokens its rows yield
    (`Coming.held`, built or `queued`) over the cost of a pass of k + 1 positions a row; among
    the rows' own lengths, or `every` k up to the longest."""
    reach = [len(c.drafts) if queued else c.reach for c in coming]
    widths = range(max(reach, default=0) + 1) if every else sorted({0, *reach})
    return max(widths, key=lambda k: _yield(coming, k, cost, queued))


def _yield(coming: list[Coming], k: int, cost: CostFn, queued: bool) -> float:
    return sum(c.held(k, queued) for c in coming) / cost(k)


def step_drafts(rows: list[Row], pricing: Pricing | None, count: int, slots: int) -> list[list[int]]:
    """Each row's draft for a batch step over `count` cache rows (free ones count: every pass
    feeds them) and `slots` slots. A row alone drafts by its drafter's own cost (the
    single-sequence curve); with more rows, adaptive drafters weigh drafts by what a step costs
    there, and stay silent where no draft pays (fixed-length drafters draft as told). Every row
    pays for the widest draft, so the step's width is the one that yields the most tokens for
    its cost over all rows, each row's draft worth what its drafter says (`Sequence.planned`: by
    its acceptance so far, which only drafts move, a row priced out at the priors never drafted),
    and longer drafts are drafted again to fit it."""
    if pricing is None or count == 1:
        for r in rows:
            _price(r.seq.drafter, r.own_cost)
        return [r.seq.step_draft(on=True) for r in rows]
    cost = pricing.drafting(count, slots)
    drafts = []
    for r, may in zip(rows, _may_draft(rows, pricing, count, slots)):
        if r.own_cost is not None and cost is not None:
            _price(r.seq.drafter, cost)
        drafts.append(r.seq.step_draft(on=may))
    k = best_width([r.seq.planned(d) for r, d in zip(rows, drafts)], pricing.step(count, slots))
    return [d if len(d) <= k else r.seq.step_draft(on=True, most=k) for r, d in zip(rows, drafts)]


def behind_drafts(rows: list[Row], drafts: list[list[int]], pricing: Pricing | None, count: int,
                  slots: int) -> list[list[int]] | None:
    """Each row's drafts in a pass queued behind the one in flight (whose drafts are `drafts`), as
    its sequence's `coming` says, or None where a pass built once that one is read yields more
    for its cost. Queued, a row's tokens count only where the pass in flight's drafts all hold,
    and its drafts only where its guess at that pass's own token holds too; queuing hides the
    pricing's `overlap` of a plain step. Built after, drafts follow the token read. Unpriced (a
    lone sequence's own cost), a plain pass is queued behind a plain one where no row would
    draft. ("Any row would draft" ran a third of chat's steps synchronously for drafts the width
    then cut to nothing.)"""
    may = _may_draft(rows, pricing, count, slots)
    coming = [r.seq.coming(d, on) for r, d, on in zip(rows, drafts, may)]
    if pricing is None:
        plain = all(c.whole == 1.0 and not c.reach for c in coming)
        return [[] for _ in coming] if plain else None
    ahead, after = pricing.queued(count, slots), pricing.built(count, slots)
    k = best_width(coming, ahead, queued=True, every=True)
    if _yield(coming, k, ahead, True) < _yield(coming, best_width(coming, after, every=True), after, False):
        return None
    return [c.drafts[:k] for c in coming]


def _may_draft(rows: list[Row], pricing: Pricing | None, count: int, slots: int) -> list[bool]:
    """Whether each row may draft at this batch size: every row alone or unpriced (by its own
    cost); with more rows, an adaptive drafter where some draft can pay here, and a fixed-length
    one always (it drafts as told)."""
    on = pricing is None or count == 1 or pricing.drafting(count, slots) is not None
    return [on or r.own_cost is None for r in rows]


def _price(drafter, cost: CostFn | None) -> None:
    """Make an adaptive drafter weigh its drafts by `cost`: what a step costs depends on how many
    rows share it. (Its cost table is rebuilt from the new function at its next draft.)"""
    if cost is not None and drafter.cost is not cost:
        drafter.cost = cost
