"""One sequence's place in a batch (batch.py): its Sequence (decode/sequence.py: settings, output and
the rules every loop judges it by), and where its entries are, in a cache of its own while it
waits to be prefilled, then at a row of the batch's ragged cache."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Hashable

import numpy as np

from specgen.engine.decode.sequence import Sequence


@dataclass(eq=False)
class Row:
    """A sequence in a batch, and its prefill progress while it waits."""

    key: Hashable
    seq: Sequence
    cache: list | None = None  # its own cache until it joins the batch
    place: int = 0  # its row of the batch's cache once it joins
    prefilled: int = 0  # prompt tokens in `cache`
    shared: int = 0  # prompt tokens it took from other rows' caches (share.py)
    keep_cache: bool = False  # copy its cache out when it leaves the batch (Batch.kept)
    waited: int = 0  # steps it has waited to be prefilled
    own_cost: object = field(init=False)  # an adaptive drafter's own cost, alone (cost/batch.py)

    def __post_init__(self):
        self.own_cost = getattr(self.seq.drafter, "cost", None)

    @cached_property
    def ids(self) -> np.ndarray:
        """Its prompt as an array (share.py compares prompts by it)."""
        return np.asarray(self.seq.prompt)
