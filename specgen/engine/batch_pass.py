"""A batched forward pass on the device, not read yet (batch.py): the record the batch engine
keeps of it, and its rows' verdicts built lazily so that a step reads them back in one transfer.
A pass where every row feeds one token is `plain`: committed when launched, so another can be
queued behind it before it is read (as mlx-lm's BatchGenerator queues its steps)."""

from __future__ import annotations

from dataclasses import dataclass, field

import mlx.core as mx

from specgen.engine.batch_row import Row
from specgen.engine.sampling import GREEDY


@dataclass
class Pass:
    """A batched forward pass on the device, not read yet: its rows (in the order of its verdict's
    columns), their drafts and tokens fed again, its logits and lazy verdict. A `plain` pass
    (every row one token) is committed when launched; `queued`: launched behind another;
    `dropped`: rows whose entry was taken back (they sit it out)."""

    rows: list[Row]
    drafts: list[list[int]]
    again: list[int]
    width: int
    logits: mx.array
    verdict: mx.array
    queued: bool = False
    dropped: set[int] = field(default_factory=set)

    @property
    def plain(self) -> bool:
        return self.width == 1

    def column(self, row: Row) -> int | None:
        """`row`'s column in this pass, unless it has none or sits it out (`dropped`)."""
        i = next((i for i, r in enumerate(self.rows) if r is row), None)
        return None if i in self.dropped else i


def verdicts(logits: mx.array, rows: list[Row], spans: list[tuple[int, int]], ahead: int = 0) -> mx.array:
    """Every row's lazy verdict (row.seq.verdict) on its `spans` (first position, count) of a pass's
    logits, concatenated in `rows`' order. Greedy rows' in one set of reductions over the whole
    pass and one gather: a set per row cost ~15% of a plain step of 4 rows on the CPU proxy
    (MLX's CPU stream runs each small op as a task of its own)."""
    if all(r.seq.selector is GREEDY for r in rows):
        width = logits.shape[1]
        every = GREEDY.verdict(logits.reshape(-1, logits.shape[-1]), 0)
        at = [r.place * width + a + j for r, (a, n) in zip(rows, spans) for j in range(n)]
        return every[:, mx.array(at, mx.int32)]
    return mx.concatenate([r.seq.verdict(logits[r.place, a : a + n], ahead)
                           for r, (a, n) in zip(rows, spans)], axis=1)
