"""The draft pricing of a batched step, from what it costs by rows and positions per row (grid.py).

`Pricing` turns the measured grid into what the batch engine asks each step: at B rows over S
cache slots, the cost of k + 1 positions per row relative to a plain batched step (curve.py's
curve rules), and whether any draft can pay there (if not, the step is plain batched decoding);
`step_drafts` and `behind_drafts` apply it to a step's rows. Where a pass is fed flat (each row
its own positions, batch.py), rows draft by what a step costs where every row drafts (fed flat
or padded, whichever the timed steps say is cheaper), and the pass keeps for each row the
length that yields most for the pass's cost (`_plan`); padded, every row pays for the widest,
so the step chooses one width for all.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

from specgen.draft.length import CostFn
from specgen.engine.batch.row import Row
from specgen.engine.cost.curve import Curve, cost_function, drafting_cost, relative, unprofitable
from specgen.engine.cost.grid import Measured
from specgen.events import Coming

BUCKET = 128  # slots are priced in steps of this many (drafters rebuild their tables per price)


class Prices(NamedTuple):
    """What a batched step at some rows and slots costs, relative to a plain one: `built`, a step
    of k drafts a row, built once the one before was read (fed flat, the cheaper of that step
    padded and flat); `step`, what drafters weigh that with; `drafting`, that, or None where no
    draft can pay; `whole`, the pass (padded: k + 1 positions a row; flat: k more positions in
    all); `own`, one row's k drafts beside rows that draft none, relative to its share of a plain
    step (flat: it pays all the pass costs more)."""

    built: CostFn
    step: CostFn
    drafting: CostFn | None
    whole: CostFn
    own: CostFn


class Pricing:
    """What a batched step costs, by rows (Measured.seconds: between timed row counts, a line)
    and the cache slots it attends over (rounded up to BUCKET), relative to a plain one:
    `built(rows, slots)(k)`, a step of k + 1 positions per row built once the one before was read,
    as the grid timed it; `whole(..., queued=True)`, one queued behind the one in flight (batch.py),
    which costs `overlap` (the single-sequence calibration's share of a plain step that queuing
    hides) less; `step`, what drafters weigh drafts with (as alone, curve.drafting_cost: plain
    steps queued, a draft's verdict read before the next); `drafting`, that, or None where
    drafting cannot pay (cost.unprofitable): the step is then plain batched decoding. The grid's
    steps ran eagerly every `eager` layers (Curve.eager), as batch.py runs a step nothing runs
    ahead of. Fed flat, k more positions cost what the timed flat steps say (Measured.flat_seconds;
    untimed, what the padded step of every row drafting ceil(k / rows) costs), where that is less
    than the padded pass."""

    def __init__(self, measured: Measured, overlap: float = 0.0, eager: int = 0):
        self.measured, self.overlap, self.eager = measured, overlap, eager
        self.sizes = sorted(measured.grid)
        self._priced: dict[tuple[int, int, bool], Prices] = {}

    def _at(self, rows: int, slots: int, flat: bool) -> Prices:
        key = (min(rows, self.sizes[-1]), -(-max(slots, 1) // BUCKET) * BUCKET, flat)
        if key not in self._priced:
            rows, slots = key[:2]
            curve = relative(self.measured.seconds(rows, slots))
            whole = built = own = cost_function(curve)
            if flat:
                timed = relative(self.measured.flat_seconds(rows, slots))
                whole = cost_function(timed) if timed else _ceiling(built, rows)
                built, own = _cheaper(whole, built, rows), _alone(whole, built, rows)
                curve = {n: built(n - 1) for n in curve}
            step = drafting_cost(built, self.overlap, ahead=0)
            self._priced[key] = Prices(built, step, None if unprofitable(Curve(curve)) else step, whole, own)
        return self._priced[key]

    def built(self, rows: int, slots: int = 0, flat: bool = False) -> CostFn:
        """A pass of k drafts a row built once the one before was read, as the grid timed it
        (`flat`: fed flat where that costs less)."""
        return self._at(rows, slots, flat).built

    def own(self, rows: int, slots: int = 0, flat: bool = False) -> CostFn:
        """One row's k drafts beside rows that draft none, relative to its share of a plain step."""
        return self._at(rows, slots, flat).own

    def whole(self, rows: int, slots: int = 0, flat: bool = False, queued: bool = False) -> CostFn:
        """The pass: padded, of k + 1 positions a row; `flat`, of k more positions in all;
        `queued` behind the one in flight, where the host's work overlaps it."""
        whole = self._at(rows, slots, flat).whole
        return (lambda k: whole(k) - self.overlap) if queued else whole

    def step(self, rows: int, slots: int = 0, flat: bool = False) -> CostFn:
        return self._at(rows, slots, flat).step

    def drafting(self, rows: int, slots: int = 0, flat: bool = False) -> CostFn | None:
        return self._at(rows, slots, flat).drafting


def _fed(flat: CostFn, padded: CostFn) -> Callable[[int, int], float]:
    """A pass whose drafts add `added` positions in all, its widest row drafting `widest`: fed
    flat (by the positions added) or padded (by the widest), whichever costs less."""
    return lambda added, widest: min(flat(added), padded(widest))


def _cheaper(flat: CostFn, padded: CostFn, rows: int) -> CostFn:
    """Every row drafting k, in a pass fed flat or padded, whichever costs less."""
    fed = _fed(flat, padded)
    return lambda k: fed(rows * k, k)


def _alone(flat: CostFn, padded: CostFn, rows: int) -> CostFn:
    """One row's k drafts beside rows that draft none, relative to its share of a plain step: it
    pays all the pass (flat or padded, whichever costs less) costs more."""
    fed = _fed(flat, padded)
    return lambda k: 1.0 + rows * (fed(k, k) - 1.0)


def _ceiling(built: CostFn, rows: int) -> CostFn:
    """A flat pass of k more positions where none was timed: the padded one of every row
    drafting ceil(k / rows). Not the line through the grid's widths: a CPU's first position
    past a plain step costs most of a row's share (SmolLM2 at 8 rows: 9 positions 1.13 plain
    steps, 16 positions 1.22-1.38)."""
    return lambda k: built(-(-k // rows))


def feeds_flat(pricing: Pricing | None, fed: list[int], slots: int) -> bool:
    """Whether a pass whose rows feed `fed` positions (over `slots` slots) costs less fed flat
    than padded to the widest, as priced; unpriced, where the padded one is wider than
    1 + ceil(extra positions / rows), what the untimed flat price says."""
    rows, width, extra = len(fed), max(fed), sum(fed) - len(fed)
    if pricing is None:
        return width > 1 - (-extra // rows)
    return pricing.whole(rows, slots, flat=True)(extra) < pricing.whole(rows, slots)(width - 1)


def best_width(coming: list[Coming], cost: CostFn, queued: bool = False, every: bool = False) -> int:
    """The drafts per row a pass carries: the k that maximises the tokens its rows yield
    (`Coming.held`, built or `queued`) over the cost of a pass of k + 1 positions a row; among
    the rows' own lengths, or `every` k up to the longest."""
    reach = [len(c.drafts) if queued else c.reach for c in coming]
    widths = range(max(reach, default=0) + 1) if every else sorted({0, *reach})
    return max(widths, key=lambda k: _yield(coming, k, cost, queued))


def _yield(coming: list[Coming], k: int, cost: CostFn, queued: bool) -> float:
    return sum(c.held(k, queued) for c in coming) / cost(k)


def _plan(coming: list[Coming], pricing: Pricing, count: int, slots: int, queued: bool,
          flat: bool) -> tuple[list[int], float]:
    """Each row's drafts in a pass over `count` rows (`queued` behind the one in flight, or built
    after it), and the tokens the pass yields for its cost. Padded, the one width that yields
    most. `flat`, the best of: that width; each row the length that yields most for its own
    cost, as if it alone drafted; every row all its drafts (rows that draft together share what
    the pass costs more). A flat plan costs the cheaper of the pass fed flat and padded."""
    padded = pricing.whole(count, slots, queued=queued)
    k = best_width(coming, padded, queued, every=True)
    if not flat:
        return [k] * len(coming), _yield(coming, k, padded, queued)
    reach = [len(c.drafts) if queued else c.reach for c in coming]
    own, fed = pricing.own(count, slots, flat=True), _fed(pricing.whole(count, slots, True, queued), padded)
    alone = [max(range(n + 1), key=lambda j: c.held(j, queued) / own(j)) for c, n in zip(coming, reach)]

    def worth(ks: list[int]) -> float:
        return sum(c.held(j, queued) for c, j in zip(coming, ks)) / fed(sum(ks), max(ks, default=0))

    ks = max([[min(k, n) for n in reach], alone, reach], key=worth)
    return ks, worth(ks)


def step_drafts(rows: list[Row], pricing: Pricing | None, count: int, slots: int,
                flat: bool = False) -> list[list[int]]:
    """Each row's draft for a batch step over `count` cache rows (free ones count: every pass
    feeds them) and `slots` slots. A row alone drafts by its drafter's own cost (the
    single-sequence curve); with more rows, adaptive drafters weigh drafts by what a step costs
    there, and stay silent where no draft pays (fixed-length drafters draft as told). Every row
    pays for the widest draft, so the step's width is the one that yields the most tokens for
    its cost over all rows, each row's draft worth what its drafter says (`Sequence.planned`: by
    its acceptance so far, which only drafts move, a row priced out at the priors never drafted),
    and longer drafts are drafted again to fit it. Fed `flat`, rows draft by what the step costs
    where every row drafts, and each keeps the length `_plan` gives it."""
    if pricing is None or count == 1:
        for r in rows:
            _price(r.seq.drafter, r.own_cost)
        return [r.seq.step_draft(on=True) for r in rows]
    cost = pricing.drafting(count, slots, flat)
    drafts = []
    for r, may in zip(rows, _may_draft(rows, pricing, count, slots, flat)):
        if r.own_cost is not None and cost is not None:
            _price(r.seq.drafter, cost)
        drafts.append(r.seq.step_draft(on=may))
    coming = [r.seq.planned(d) for r, d in zip(rows, drafts)]
    if flat:
        ks = _plan(coming, pricing, count, slots, False, True)[0]
    else:
        ks = [best_width(coming, pricing.step(count, slots))] * len(rows)
    return [d if len(d) <= k else r.seq.step_draft(on=True, most=k) for r, d, k in zip(rows, drafts, ks)]


def behind_drafts(rows: list[Row], drafts: list[list[int]], pricing: Pricing | None, count: int,
                  slots: int, flat: bool = False) -> list[list[int]] | None:
    """Each row's drafts in a pass queued behind the one in flight (whose drafts are `drafts`), as
    its sequence's `coming` says, or None where a pass built once that one is read yields more
    for its cost. Queued, a row's tokens count only where the pass in flight's drafts all hold,
    and its drafts only where its guess at that pass's own token holds too; queuing hides the
    pricing's `overlap` of a plain step. Built after, drafts follow the token read. Unpriced (a
    lone sequence's own cost), a plain pass is queued behind a plain one where no row would
    draft. ("Any row would draft" ran a third of chat's steps synchronously for drafts the width
    then cut to nothing.)"""
    may = _may_draft(rows, pricing, count, slots, flat)
    coming = [r.seq.coming(d, on) for r, d, on in zip(rows, drafts, may)]
    if pricing is None:
        plain = all(c.whole == 1.0 and not c.reach for c in coming)
        return [[] for _ in coming] if plain else None
    ks, queued = _plan(coming, pricing, count, slots, True, flat)
    if queued < _plan(coming, pricing, count, slots, False, flat)[1]:
        return None
    return [c.drafts[:k] for c, k in zip(coming, ks)]


def _may_draft(rows: list[Row], pricing: Pricing | None, count: int, slots: int,
               flat: bool = False) -> list[bool]:
    """Whether each row may draft at this batch size: every row alone or unpriced (by its own
    cost); with more rows, an adaptive drafter where some draft can pay here, and a fixed-length
    one always (it drafts as told)."""
    on = pricing is None or count == 1 or pricing.drafting(count, slots, flat) is not None
    return [on or r.own_cost is None for r in rows]


def _price(drafter, cost: CostFn | None) -> None:
    """Make an adaptive drafter weigh its drafts by `cost`: what a step costs depends on how many
    rows share it. (Its cost table is rebuilt from the new function at its next draft.)"""
    if cost is not None and drafter.cost is not cost:
        drafter.cost = cost
