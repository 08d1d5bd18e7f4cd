"""Many requests through one batch (batch.py), each set up and answered as `Engine.stream` sets
up and answers it alone (Engine.plan, responder.Responder): the surface that the server's worker
and `run --prompts --batch` drive, one thread stepping it.

Drafts are priced (cost/batch.py) by the measured cost of a batched step (cost/grid.py, measured
once per model and machine: by a server before it answers, else before the first request that
drafts adaptively). A model that cannot batch (probe.batch_unsupported) is the caller's to run one
request at a time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Hashable

from specgen import defaults
from specgen.engine.batch.batch import Batch
from specgen.engine.cost import batch as batch_cost
from specgen.engine.cost import grid
from specgen.engine.cost.store import batch_calibration_file
from specgen.engine.decode.loop import PREFILL_CHUNK
from specgen.engine.engine import Engine, Request
from specgen.engine.responder import Responder, Response
from specgen.events import Failed
from specgen.stats import RunStats

# (model's calibration key, rows, calibration file) -> its pricing: another cache directory
# (SPECGEN_CACHE_DIR changed in this process) is read, or measured into, on its own.
_PRICED: dict[tuple, batch_cost.Pricing] = {}


@dataclass
class _Open:
    request: Request
    stats: RunStats
    responder: Responder


class Streams:
    """Requests decoded together: `add` them, `step` until not `busy`, `cancel` any."""

    def __init__(self, engine: Engine, *, max_rows: int = defaults.MAX_BATCH, prefill_chunk: int = PREFILL_CHUNK):
        self.engine = engine
        self.batch = Batch(engine.loaded.model, max_rows=max_rows, prefill_chunk=prefill_chunk)
        self._open: dict[Hashable, _Open] = {}

    @property
    def busy(self) -> bool:
        return self.batch.busy

    def __len__(self) -> int:
        """Requests added and not yet finished or cancelled."""
        return len(self._open)

    def add(self, key: Hashable, request: Request, stats: RunStats | None = None,
            keep_cache: bool = False) -> RunStats:
        """Queue `request` (its `prompt_cache`, if any, one of the model's); its responses come
        from `step`, tagged with `key`. With `keep_cache`, `kept(key)` is its cache once it
        finishes. Returns its RunStats (filled in as it goes)."""
        stats = stats or RunStats()
        plan = self.engine.plan(request, stats)
        if request.options.draft is None and not plan.sequence.off and not self.engine.costs().off:
            self.price()  # (a grammar speculates where the model's curve says not to: by its own costs)
        self.batch.add(key, plan.sequence, prompt_cache=request.prompt_cache, cached=request.cached,
                       keep_cache=keep_cache)
        self._open[key] = _Open(request, stats, Responder(self.engine.loaded.tokenizer, request.options.stop,
                                                          stats, plan.sequence.drafter))
        return stats

    def cancel(self, key: Hashable) -> list | None:
        """Stop generating for `key` (no more responses); the other requests go on unchanged.
        Returns its cache if it was added with keep_cache and had started decoding (holding its
        prompt and output but the last token, as `Engine.stream` closed early leaves it), else
        None."""
        self.batch.cancel(key)
        self._open.pop(key, None)
        return self.batch.kept.pop(key, None)

    def kept(self, key: Hashable) -> list | None:
        """The cache of a finished request added with keep_cache (once: it is handed over)."""
        return self.batch.kept.pop(key, None)

    def step(self) -> list[tuple[Hashable, Response | Failed]]:
        """One step of the batch: every response it produced, tagged with its request's key (a
        request's last response has a finish_reason; a request that failed on its own, its
        grammar giving up, ends with `Failed` instead)."""
        out = []
        for key, event in self.batch.step():
            job = self._open.get(key)
            if job is None:
                continue
            if isinstance(event, Failed):  # its own error: the others go on (a kept cache stays in `kept`)
                out.append((key, event))
                del self._open[key]
                continue
            responses = job.responder.take(event)
            out += [(key, r) for r in responses]
            if job.responder.stopped:  # a stop string: the text is over (a kept cache stays in `kept`)
                self.batch.cancel(key)
            if job.responder.stopped or getattr(event, "stop_reason", None):
                del self._open[key]
                self.engine.learn(job.request.options, job.stats)
        return out

    def price(self) -> None:
        """Read or measure the batched step costs now (a server does before it answers), not on
        the first request that drafts adaptively or under a grammar."""
        if self.batch.pricing is None:
            self.batch.pricing = self._pricing()

    def _pricing(self) -> batch_cost.Pricing:
        """The model's batched step costs: read or measured once a process (measured again where
        its single-sequence curve was just measured again: --recalibrate, a new machine)."""
        loaded = self.engine.loaded
        key = (loaded.calibration_key, self.batch.max_rows, batch_calibration_file())
        if key not in _PRICED:
            costs = self.engine.costs()
            measured, warning = grid.load_or_measure(
                loaded.model, loaded.calibration_key, loaded.tokenizer, self.batch.max_rows,
                recalibrate=costs.fresh, every=costs.curve.eager,
                before_measuring=lambda: self.engine.progress(
                    f"measuring how fast {self.engine.name} runs batched steps on this machine (once "
                    f"per model and machine, up to {self.batch.max_rows} rows: some seconds, a minute or "
                    "more on a busy CPU) ..."))
            if warning:
                self.engine.notice(warning)
            _PRICED[key] = batch_cost.Pricing(measured, costs.curve.overlap, costs.curve.eager)
        return _PRICED[key]
