"""Continuous batching with per-sequence speculation: many sequences, one forward pass a step.

`Batch` holds the active rows (each a Sequence, decode/sequence.py: its own drafter, draft length,
selector and seed, stop rules and grammar; and its place in a ragged cache, cache.py) and
the waiting ones. Each `step` prefills up
to one chunk's worth of prompt tokens (a piece of a long prompt, or several whole short ones, each
on a cache of its own; a prompt joins the batch when done, so a long one does not freeze the
running rows; prefill.py), then runs ONE forward pass over every active row's last token plus its draft
(rows padded to the widest, or, where the model allows it (probe.py) and rows feed different
widths, fed flat: each row its own positions, so one row's long draft costs the others
nothing), and judges each row by its sequence's rules, as decode.generate does:
a row emits the longest accepted prefix of its draft plus the model's next token, and keeps just
those entries.
Rows join and leave between steps. The next pass is queued behind the one in flight before it
is read (passes.py's `Pass`, `_behind`), as mlx-lm's BatchGenerator queues its plain steps and as the single
loop queues behind drafts: as if every draft in flight holds, each row fed its lazy token and
its drafter's drafts past a guess at it, where that pays; a row whose drafts or tie make its
input wrong sits the queued pass out, the others keep theirs.

Events are decode.generate's (`Prefilled`, then one `Step` per pass), tagged with the row's key,
so a row's events read as a single-sequence run's; a row whose grammar gives up ends with `Failed`
(where decode.generate raises) and leaves alone. The emitted tokens are what plain decoding
with the row's selector emits: where a batched row is near-tied (decode/sampling.py), that position is
recomputed by a one-position pass over the row's own entries, as decode/loop.py does.
"""

from __future__ import annotations

import time
from itertools import accumulate
from typing import Hashable, Iterator
from typing import Sequence as Ids

import mlx.core as mx
from mlx_lm.generate import generation_stream
from mlx_lm.generate_utils import BatchCounters
from mlx_lm.models.cache import make_prompt_cache

from specgen import defaults
from specgen.engine.batch.cache import RaggedBatch
from specgen.engine.batch.passes import PAD, Pass, verdicts
from specgen.engine.batch.prefill import prefill
from specgen.engine.batch.probe import probe
from specgen.engine.batch.row import Row
from specgen.engine.batch.share import Sharing
from specgen.engine.cost.batch import Pricing, behind_drafts, feeds_flat, step_drafts
from specgen.engine.decode.eager import eager
from specgen.engine.decode.loop import PREFILL_CHUNK
from specgen.engine.decode.sampling import read_all
from specgen.engine.decode.sequence import Sequence, as_sequence
from specgen.errors import InputError
from specgen.events import Failed, Prefilled, Step
from specgen.settings import check

Event = tuple[Hashable, "Prefilled | Step | Failed"]


class Batch:
    """The active and waiting sequences of one model (not thread-safe: one thread steps it)."""

    def __init__(self, model, *, max_rows: int = defaults.MAX_BATCH, prefill_chunk: int = PREFILL_CHUNK,
                 pricing: Pricing | None = None):
        probed = probe(model)  # once per model, not per batch (it makes attention read by runs)
        if probed.why:
            raise InputError(f"this model cannot run in a batch: {probed.why}")
        check(batch=max_rows, prefill_chunk=prefill_chunk)
        self.model, self.max_rows, self.prefill_chunk = model, max_rows, prefill_chunk
        self.pricing = pricing  # what steps cost by rows (None: drafters keep their own cost)
        self.rows: list[Row] = []  # the active ones, each at its `place` in the ragged cache
        self.kept: dict[Hashable, list] = {}  # finished rows' own caches (add's keep_cache)
        self.waiting: list[Row] = []
        self.cache = RaggedBatch(probed.layers, split=probed.shelves)
        self.rollback = probed.rollback  # as a row alone says it rolls back
        self.flat = probed.flat  # passes may be fed flat
        self.queued: Pass | None = None  # a pass queued behind the last one, not read yet
        self.wasted = 0  # queued passes never read: every row had left (as mlx-lm's last step)
        self.sharing = Sharing()  # rows take the prompt entries others computed
        self.counters = BatchCounters()  # mlx-lm's: prompt and decode tokens, steps and seconds

    @property
    def busy(self) -> bool:
        return bool(self.rows or self.waiting)

    def add(self, key: Hashable, prompt: Ids[int] | Sequence, *, prompt_cache: list | None = None,
            cached: int = 0, keep_cache: bool = False, **settings) -> None:
        """Queue a sequence; it joins once prefilled. `prompt` is a Sequence, or token ids with a
        Sequence's settings as keywords, as decode.generate takes them (a `prompt_cache` is one of
        the model's own, holding the first `cached` prompt tokens). With `keep_cache`, once it
        finishes (or is cancelled after joining) `kept[key]` is a cache of its own holding its
        prompt and output but the last token (as decode.generate leaves its cache, closed early
        or not)."""
        seq = as_sequence(prompt, settings)
        seq.check_cached(cached)
        if prompt_cache is None and cached:
            raise ValueError("cached must be 0 without a prompt_cache")
        if any(r.key == key for r in self.rows + self.waiting):
            raise ValueError(f"key {key!r} is already in the batch")
        seq.start(self.rollback)
        cache = prompt_cache if prompt_cache is not None else make_prompt_cache(self.model)
        self.waiting.append(Row(key, seq, cache, prefilled=cached, keep_cache=keep_cache))

    def cancel(self, key: Hashable) -> bool:
        """Drop a sequence, waiting or active; whether it was there. The others go on unchanged.
        An active one added with `keep_cache` leaves its cache in `kept`, as if it had finished."""
        for i, r in enumerate(self.rows):
            if r.key == key:
                self._leave({i})
                return True
        n = len(self.waiting)
        self.waiting = [r for r in self.waiting if r.key != key]
        return len(self.waiting) < n

    def run(self) -> Iterator[list[Event]]:
        """Step until every sequence has finished: each item is one step's events."""
        while self.busy:
            yield self.step()

    def step(self) -> list[Event]:
        """Prefill up to a chunk of waiting prompts (while rows are free), then one decode pass."""
        events: list[Event] = []
        with mx.stream(generation_stream):
            if self.waiting and len(self.rows) < self.max_rows and self.queued is None:
                events += self._prefill()  # (joining while a pass is queued waits one step)
            if self.rows:
                events += self._decode()
        return events

    def _prefill(self) -> list[Event]:
        """Prefill up to a chunk of waiting prompts (prefill.py); the rows done join the batch."""
        joined = prefill(self.model, self.waiting, self.rows, self.max_rows - len(self.rows), self.prefill_chunk,
                         sharing=self.sharing, cache=self.cache, counters=self.counters)
        self.rows += joined
        # All at once: rows appended to the cache cost one copy.
        places = self.cache.add([r.cache for r in joined], [r.prefilled for r in joined]) if joined else []
        self.sharing.joined(joined, self.waiting)
        for row, place in zip(joined, places):
            row.cache, row.place = None, place
        return [(r.key, r.seq.prefilled(r.shared)) for r in joined]

    def _decode(self) -> list[Event]:
        start = time.perf_counter()
        cur = self.queued or self._launch()
        self.queued = behind = self._behind(cur)  # before `cur` is read: the device keeps busy
        active = {id(r) for r in self.rows}  # a row cancelled since `cur` was queued is not judged
        ours = [i for i, r in enumerate(cur.rows) if id(r) in active and i not in cur.dropped]
        chosen = read_all(cur.verdict, [len(d) + 1 for d in cur.drafts])  # the step's one read
        judged = {i: cur.rows[i].seq.judge(chosen[i], cur.logits_of(i)[cur.again[i]:], cur.drafts[i])
                  for i in ours}
        for i, (tokens, _, tied) in judged.items():
            # A near-tied row keeps the entries up to the tied position's input, fed again alone
            # below (a row with states keeps none: they cannot drop it, and are restored).
            kept = cur.again[i] + len(tokens) + (tied is not None and not self.cache.states)
            if self.cache.states and kept < cur.fed(i):
                kept = 0
            self._take_back(cur.rows[i], cur.fed(i) - kept, behind, kept < cur.fed(i) or tied is not None)
        events, done, index = [], set(), {id(r): j for j, r in enumerate(self.rows)}
        for i, (tokens, matched, tied) in judged.items():
            r, d = cur.rows[i], cur.drafts[i]
            if tied is not None:
                tokens, matched = self._confirm(r, [*r.seq.history, *d][r.seq.pos - 1 + tied], d, tied)
            step = r.seq.finish(tokens, len(d), matched, tied is not None, cur.queued)
            events.append((r.key, step if r.seq.failed is None else Failed(r.seq.failed)))
            if step.stop_reason or r.seq.failed is not None:  # a failed row leaves alone
                done.add(index[id(r)])
        self.counters.decode_time += time.perf_counter() - start
        self.counters.generation_steps += 1
        self.counters.generation_tokens += sum(len(s.tokens) + (s.stop_token is not None) for _, s in events
                                               if isinstance(s, Step))
        if done:
            self._leave(done)
        # Rows are not moved while a pass is queued on their places (nor its states' marks).
        if self.rows and self.queued is None and self.cache.untidy(joining=bool(self.waiting)):
            where = {old: new for new, old in enumerate(self.cache.compact(joining=bool(self.waiting)))}
            for r in self.rows:
                r.place = where[r.place]
        return events

    def _launch(self) -> Pass:
        """This step's pass, read before the next is built: every row's last token (after any
        accepted ones a restored state took back) and its draft."""
        slots = self.cache.slots.reach()  # the slots a row attends over, as the pricing reads them
        drafts = step_drafts(self.rows, self.pricing, self.cache.rows, slots, self.flat)
        fed = [[PAD]] * self.cache.rows  # a free row of the cache is fed padding
        for r, d in zip(self.rows, drafts):
            fed[r.place] = [*r.seq.history[self.cache.slots.lengths[r.place]:], *d]
        width = max(map(len, fed))
        x = mx.array([f + [PAD] * (width - len(f)) for f in fed], mx.uint32)
        with eager(self.cache.layers, self.pricing.eager if self.pricing else 0):  # nothing runs ahead
            logits, starts = self._forward(x, [len(f) for f in fed], slots)
        again = [len(fed[r.place]) - len(d) - 1 for r, d in zip(self.rows, drafts)]  # fed again
        verdict = verdicts(logits, starts, self.rows, [(a, len(d) + 1) for d, a in zip(drafts, again)])
        mx.async_eval(verdict)
        return self._committed(Pass(list(self.rows), drafts, again, width, logits, starts, verdict))

    def _forward(self, x: mx.array, fed: list[int], slots: int) -> tuple[mx.array, list[int]]:
        """The pass of padded input `x` (each place feeding its first `fed` positions; a free one
        padding), fed flat where the model allows it and that costs less over `slots` (cost/batch.py's
        `feeds_flat`: its gathers cost ~7% of a step of 8 rows of SmolLM2 on the CPU). Its logits
        by position, and where each place's begin."""
        width = x.shape[1]
        flat = self.flat and width > 1 and feeds_flat(self.pricing, fed, slots)
        if flat:
            fed = [0 if p in self.cache.free else n for p, n in enumerate(fed)]
        self.cache.begin(fed, flat)
        if flat:
            x = x.reshape(-1)[self.cache.slots.flat.whole.take][:, None]
        logits = self.model(x, cache=self.cache.layers)
        starts = list(accumulate(fed, initial=0)) if flat else [p * width for p in range(len(fed))]
        return logits.reshape(-1, logits.shape[-1]), starts

    def _committed(self, launched: Pass) -> Pass:
        """`launched`, its rows' entries committed as if every draft holds (free rows keep none):
        a pass may then be queued behind it."""
        fed = [0] * self.cache.rows
        for i, r in enumerate(launched.rows):
            fed[r.place] = launched.fed(i)
        self.cache.commit(launched.width, fed)
        return launched

    def _behind(self, cur: Pass) -> Pass | None:
        """A pass queued behind `cur` before it is read (as mlx-lm queues its steps), as if every
        draft of `cur` holds: each row's input is its lazy token from `cur`, then the drafts its
        drafter would make past its guess at that token (cost/batch.py's `behind_drafts` weighs
        them, and whether queuing pays at all). None where it could not be used whole: rows are
        waiting to join or left `cur`, or sat it out, or a row's next token needs the host (a
        grammar)."""
        if (cur.dropped or len(cur.rows) != len(self.rows)
                or (self.waiting and len(self.rows) < self.max_rows)
                or not all(r.seq.queues for r in self.rows)):
            return None
        count = self.cache.rows
        slots = self.cache.slots.reach()
        more = behind_drafts(cur.rows, cur.drafts, self.pricing, count, slots, self.flat)
        if more is None:
            return None
        width = 1 + max(map(len, more))
        column, drafts = [0] * count, [[PAD] * (width - 1)] * count  # a free row is fed any token
        at = 0
        for r, d, m in zip(cur.rows, cur.drafts, more):
            at += len(d) + 1
            column[r.place], drafts[r.place] = at - 1, m + [PAD] * (width - 1 - len(m))
        x = cur.verdict[0][mx.array(column, mx.int32)][:, None]
        if width > 1:
            x = mx.concatenate([x, mx.array(drafts, mx.uint32)], axis=1)
        fed = [1] * count
        for r, m in zip(cur.rows, more):
            fed[r.place] = 1 + len(m)
        logits, starts = self._forward(x, fed, slots)
        spans, ahead = [(0, len(m) + 1) for m in more], [len(d) + 1 for d in cur.drafts]
        verdict = verdicts(logits, starts, cur.rows, spans, ahead)
        mx.async_eval(verdict)
        again = [0] * len(cur.rows)
        return self._committed(Pass(list(cur.rows), more, again, width, logits, starts, verdict, queued=True))

    def _take_back(self, row: Row, entries: int, behind: Pass | None, unqueue: bool) -> None:
        """Take back the newest `entries` entries `row` fed the pass just judged (drafts it did
        not keep), and where `unqueue` (the pass behind was fed a token that may not be the row's)
        its entries of the pass `behind` too: it sits that pass out. A row with states goes back
        to before the pass judged (its accepted tokens are fed again with its next pass)."""
        i = behind.column(row) if behind is not None and unqueue else None
        if i is not None:
            behind.dropped.add(i)
            entries += behind.fed(i)
        if entries:
            self.cache.take_back(row.place, entries, passes=1 + (behind is not None))

    def _confirm(self, row: Row, token: int, drafts: list[int], n: int) -> tuple[list[int], int]:
        """Choose the near-tied position `n` of `row` as plain decoding does: a one-position pass
        of its input `token` over the row's own entries before it, alone."""
        alone = self._alone(row, row.seq.pos - 1 + n, [*row.seq.history, *drafts])
        return row.seq.choose(self.model(mx.array([[token]], mx.uint32), cache=alone)[0, -1], drafts, n)

    def _alone(self, row: Row, upto: int, tokens: list[int]) -> list:
        """A cache of `row`'s own holding `tokens[:upto]`: its entries copied out of the batch,
        and where its states were restored to fewer, the rest fed again alone."""
        held = self.cache.slots.lengths[row.place]
        count = held if self.cache.states else min(upto, held)
        alone = self.cache.row_cache(row.place, count)
        if count < upto:
            self.model(mx.array([tokens[count:upto]], mx.uint32), cache=alone)
            mx.eval([c.state for c in alone])
        return alone

    def _leave(self, rows: set[int]) -> None:
        """Drop these rows (indices into `rows`), a keep_cache row's entries (all it holds: its
        history but the last token, as decode.generate leaves its cache) first copied out to
        `kept`. Their cache rows are freed, not copied away (see cache.RaggedBatch)."""
        for i in rows:
            at = self.queued.column(self.rows[i]) if self.queued else None
            if at is not None:  # the pass queued for it is not its output
                self.cache.take_back(self.rows[i].place, self.queued.fed(at), passes=1)
                self.queued.dropped.add(at)
            if self.rows[i].keep_cache:
                r = self.rows[i]
                self.kept[r.key] = self._alone(r, r.seq.pos - 1, r.seq.history)
        self.cache.drop([self.rows[i].place for i in rows])
        self.rows = [r for i, r in enumerate(self.rows) if i not in rows]
        if not self.rows and self.queued is not None:
            self.queued, self.wasted = None, self.wasted + 1
