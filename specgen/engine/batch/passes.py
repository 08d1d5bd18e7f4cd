"""A batched forward pass in flight (`Pass`): its rows, their drafts, its logits by position and
its lazy verdict, read a step later than it was launched; and how a pass's verdict is built over
every row at once (`verdicts`). batch.py launches, queues and judges them."""

from __future__ import annotations

from dataclasses import dataclass, field

import mlx.core as mx

from specgen.engine.batch.row import Row
from specgen.engine.decode.sampling import GREEDY

PAD = 0  # the token fed in a row's padding positions (masked out: any id does)


@dataclass
class Pass:
    """A batched forward pass on the device, not read yet: its rows (in the order of its verdict's
    columns), their drafts and tokens fed again, its logits by position and where each place's
    begin (`starts`), and its lazy verdict. It is committed
    when launched, as if every draft holds (what a row does not keep is taken back once judged);
    `queued`: launched behind another; `dropped`: rows whose entries were taken back (they sit
    it out)."""

    rows: list[Row]
    drafts: list[list[int]]
    again: list[int]
    width: int
    logits: mx.array
    starts: list[int]
    verdict: mx.array
    queued: bool = False
    dropped: set[int] = field(default_factory=set)

    def fed(self, i: int) -> int:
        """Positions its `i`-th row feeds."""
        return self.again[i] + len(self.drafts[i]) + 1

    def logits_of(self, i: int) -> mx.array:
        """The logits of the positions its `i`-th row fed."""
        at = self.starts[self.rows[i].place]
        return self.logits[at : at + self.fed(i)]

    def column(self, row: Row) -> int | None:
        """`row`'s column in this pass, unless it has none or sits it out (`dropped`)."""
        i = next((i for i, r in enumerate(self.rows) if r is row), None)
        return None if i in self.dropped else i


def verdicts(logits: mx.array, starts: list[int], rows: list[Row], spans: list[tuple[int, int]],
             ahead: list[int] | None = None) -> mx.array:
    """Every row's lazy verdict (row.seq.verdict) on its `spans` (first position, count) of a pass's
    logits (by position; `starts`: each place's first), concatenated in `rows`' order (`ahead`:
    each row's tokens in the pass before, not read yet). Greedy rows' in one set of reductions
    over the whole pass and one gather: a set per row cost ~15% of a plain step of 4 rows on the
    CPU proxy (MLX's CPU stream runs each small op as a task of its own)."""
    if all(r.seq.selector is GREEDY for r in rows):
        every = GREEDY.verdict(logits, 0)
        at = [starts[r.place] + a + j for r, (a, n) in zip(rows, spans) for j in range(n)]
        return every[:, mx.array(at, mx.int32)]
    ahead = ahead or [0] * len(rows)
    return mx.concatenate([r.seq.verdict(logits[starts[r.place] + a : starts[r.place] + a + n], k)
                           for r, (a, n), k in zip(rows, spans, ahead)], axis=1)
