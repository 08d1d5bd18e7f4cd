"""How the target's logits become tokens. Greedy today; every selector offers two calls:

- `pick(logits_row, history, position)`: a lazy token for one position (the pipelined plain path);
- `verify(logits, history, position, drafts)`: the model's tokens at each verified position
  (`logits` has len(drafts) + 1 rows, the first at `position`), as a list.
"""

from __future__ import annotations

from typing import Protocol, Sequence

import mlx.core as mx


class Selector(Protocol):
    def pick(self, logits: mx.array, history: Sequence[int], position: int) -> mx.array: ...

    def verify(
        self, logits: mx.array, history: Sequence[int], position: int, drafts: Sequence[int]
    ) -> list[int]: ...


class Greedy:
    """Argmax at every position: what mlx-lm's greedy sampler does."""

    def pick(self, logits, history, position):
        return mx.argmax(logits, axis=-1)

    def verify(self, logits, history, position, drafts):
        return mx.argmax(logits, axis=-1).tolist()


GREEDY = Greedy()
