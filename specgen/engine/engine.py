"""A loaded model and what generating with it needs, built once: the one way through.

`Engine` owns one model (weights, tokenizer, stop tokens, context length), its measured verify
cost (measured at most once per engine, before the first request that drafts) and its memory of
earlier outputs. `Engine.plan` makes a request's Sequence (decode/sequence.py), the one set of rules
every loop runs it by; `Engine.stream(Request)` runs decode.generate on it and turns
its steps into one `Response` per token (responder.py): mlx-lm's GenerationResponse, with
specgen's running `stats`; the batch engine (batch/streams.py) uses the same plan and responses. The CLI,
batch runs, the Python API (api/generate.py) and the server all call it, so they cannot disagree on
defaults, stop tokens or drafting.

An engine is not thread-safe: a generation runs, and must be closed, on one thread (the decode
loop's stream context and its cache rewind happen there); the server keeps one worker thread.
"""

from __future__ import annotations

import functools
import logging
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator, NamedTuple
from typing import Sequence as Ids

from specgen import defaults
from specgen.draft.drafter import AdaptiveDrafter, make_drafter
from specgen.engine.cost.curve import StepPrices
from specgen.engine.cost.mode import DraftMode
from specgen.engine.decode import loop as decode
from specgen.engine.decode.constrain import Constraint
from specgen.engine.decode.sampling import MlxLmSampling, Selector, make_selector
from specgen.engine.decode.sequence import Sequence
from specgen.engine.load import registry
from specgen.engine.options import Options
from specgen.engine.prompts import check_fits, encode_prompt, text_chars
from specgen.engine.responder import Responder, Response
from specgen.errors import SettingError
from specgen.stats import RunStats
from specgen.structured.grammar import Grammars

_log = logging.getLogger("specgen")
MEMORY_SAVE_S = 30.0  # a memory that learns is saved at most this often (and by save_memory)


class Plan(NamedTuple):
    """How one request generates (Engine.plan): its sequence, which every loop runs by the same
    rules, and how the single-sequence loop queues and prices its passes."""

    sequence: Sequence  # its settings (drafter, selector, cap, limits, stops, grammar) and output
    queue_after: int | None  # the single-sequence loop's queuing policy (cost.queue_after)
    prices: StepPrices | None  # how the loop weighs steps and queues passes (None: unmeasured)


@dataclass
class Request:
    """One generation: prompt token ids and settings. `prompt_cache` may already hold the first
    `cached` of `ids`; `prediction` is text (or ids) the output is expected to repeat, a draft
    source only; `selector` overrides the options' sampling (an mlx-lm sampler: no drafts);
    `stop_ids` overrides the model's stop tokens."""

    ids: Ids[int]
    options: Options = field(default_factory=Options)
    prompt_cache: list | None = None
    cached: int = 0
    prediction: str | Ids[int] | None = None
    selector: Selector | None = None
    stop_ids: frozenset[int] | None = None
    off: str | None = None  # why not to speculate, decided by the caller
    drafter: AdaptiveDrafter | None = None  # one already fed the first `drafter_fed` of `ids`
    drafter_fed: int = 0
    cancelled: Callable[[], bool] | None = None  # asked during the prefill, between layers (Sequence)


class Engine:
    """One model, loaded once, and everything its generations share."""

    def __init__(self, loaded: registry.LoadedModel, *, world=None,
                 notice: Callable[[str], None] = _log.warning,
                 progress: Callable[[str], None] = _log.info):
        self.loaded, self.world = loaded, world
        self.notice, self.progress = notice, progress
        self._costs = None
        self._grammars: Grammars | None = None
        self._memories: dict[int, tuple] = {}  # ngram order -> (memory, its file)
        self._saved_at = time.monotonic()
        for w in loaded.warnings:
            notice(w)

    @classmethod
    def load(cls, model: str = defaults.MODEL, *, dtype: str | None = None, world=None,
             **callbacks) -> "Engine":
        """Load a model by alias (models.toml, the user's own included), Hugging Face repo id or
        folder (registry.load)."""
        spec = registry.resolve(model, registry.load_registry(registry.user_models_file()))
        callbacks.get("progress", _log.info)(f"loading {spec.name} ...")
        return cls(registry.load(spec, dtype=dtype, world=world), world=world, **callbacks)

    @property
    def name(self) -> str:
        return self.loaded.spec.name

    def encode(self, prompt: str | list[dict], *, raw: bool = False, system: str | None = None) -> list[int]:
        """Token ids of a prompt or conversation, through the chat template unless `raw` or the
        model's alias turns it off; one whose text cannot fit the context is refused unread."""
        self.check_fits(text_chars(prompt))
        return encode_prompt(self.loaded.tokenizer, prompt, chat=self.loaded.spec.chat_template and not raw,
                             system=system)

    def check_fits(self, chars: int, what: str = "the prompt") -> None:
        """InputError where `chars` characters of text cannot fit the context (prompts.check_fits)."""
        check_fits(chars, self.loaded.context_length, self.token_chars, what)

    @functools.cached_property
    def token_chars(self) -> int:
        """The most characters one token of this tokenizer stands for (its longest vocabulary
        entry: at least as long as the text it decodes to)."""
        return max(map(len, self.loaded.tokenizer.get_vocab()), default=1)

    @property
    def grammars(self) -> Grammars:
        """The response formats compiled for this model's tokenizer (each once)."""
        if self._grammars is None:
            self._grammars = Grammars(self.loaded.tokenizer, self.loaded.stop_ids)
        return self._grammars

    def constraint(self, opts: Options, selector: Selector, prompt: Ids[int] = ()) -> Constraint | None:
        """The grammar `opts.response_format` asks for, fresh for one generation from `prompt`
        (None: none)."""
        if opts.response_format is None:
            return None
        if isinstance(selector, MlxLmSampling):
            raise SettingError("response_format", "cannot be combined with an mlx-lm sampler or "
                                                  "logits_processors: pass temp/top_p/top_k/min_p/seed")
        return Constraint(self.grammars.matcher(opts.response_format, prompt), selector)

    def costs(self, recalibrate: bool = False):
        """The model's verify cost on this machine (calibrate.model_costs), measured at most once."""
        if self._costs is None or recalibrate:
            from specgen.engine.cost.calibrate import model_costs

            found = model_costs(self.loaded.model, self.loaded.calibration_key, self.loaded.tokenizer,
                                recalibrate=recalibrate, world=self.world,
                                before_measuring=lambda: self.progress(
                                    f"measuring how fast {self.name} verifies drafts on this machine "
                                    "(once per model; a few seconds) ..."))
            if found.warning:
                self.notice(found.warning)
            if found.off:
                self.notice(f"speculation off: {found.off}; decoding plainly")
            self._costs = found
        return self._costs

    def memory(self, ngram_order: int = defaults.MAX_ORDER):
        """This model's memory of earlier outputs (read once; an unusable file is a notice)."""
        if ngram_order not in self._memories:
            from specgen.draft import memory_file

            path = memory_file.memory_path(self.loaded.key, ngram_order)
            mem, warning = memory_file.load(path, self.loaded.key,
                                            registry.local_source(self.loaded.spec.source),
                                            max_order=ngram_order)
            if warning:
                self.notice(warning)
            self._memories[ngram_order] = (mem, path)
        return self._memories[ngram_order][0]

    def save_memory(self) -> None:
        """Write what the memories learnt since they were read (locked, atomic, merged)."""
        from specgen.draft import memory_file

        for mem, path in self._memories.values():
            if mem.unsaved():
                warning = memory_file.save(mem, path)
                if warning:
                    self.notice(warning)
        self._saved_at = time.monotonic()

    def new_drafter(self, opts: Options, prediction: Ids[int] | None = None, *, measured: bool = True):
        """The drafter a generation with `opts` starts from: the adaptive one (drafting from the
        memory with `opts.memory`, choosing lengths by the measured cost unless not `measured`)
        unless `opts.draft` fixes the length."""
        found = self.costs() if measured and opts.draft is None else None
        return make_drafter(opts.draft, max_order=opts.ngram_order, window=opts.window,
                            memory=self.memory(opts.ngram_order) if opts.memory and opts.draft is None else None,
                            cost=found.drafting if found else None,
                            **({"prediction": prediction} if prediction else {}))

    def plan(self, request: Request, stats: RunStats) -> Plan:
        """How `request` generates (its selector, drafter, draft cap, why not to speculate), the
        settings recorded in `stats`: what `stream` and the batch engine set up alike."""
        stats.model, stats.sharding = self.name, self.loaded.sharding
        stats.ranks = self.world.size if self.world else 1
        opts = request.options
        opts.check()  # the caller reported the warnings
        selector = request.selector or make_selector(opts.temp, top_p=opts.top_p, top_k=opts.top_k,
                                                     min_p=opts.min_p, seed=opts.seed)
        constraint = self.constraint(opts, selector, request.ids)
        found = self.costs() if opts.draft is None and not request.off and request.selector is None else None
        prediction = request.prediction
        if isinstance(prediction, str):
            prediction = (self.loaded.tokenizer.encode(prediction, add_special_tokens=False)
                          if prediction else None)
        stats.prediction_ids = list(prediction or ())
        drafter = request.drafter
        if drafter is not None and opts.draft is None:
            drafter.continue_with(prediction or ())
        else:
            drafter = self.new_drafter(opts, prediction, measured=found is not None)
        mode = DraftMode("auto" if opts.draft is None else "fixed",
                         defaults.MAX_DRAFT if opts.draft is None else opts.draft,
                         found.curve if found else None)
        stats.draft_mode, stats.temp = str(mode), opts.temp
        stats.seed, stats.cached_tokens = getattr(selector, "seed", None), request.cached
        # A grammar's forced tokens and a caller's prediction are near-certain drafts: they pay
        # where the drafter's own cannot on average, which it still weighs draft by draft.
        off = request.off or (found.off if found and constraint is None and not prediction else None)
        stop_ids = self.loaded.stop_ids if request.stop_ids is None else request.stop_ids
        sequence = Sequence(list(request.ids), drafter=drafter, draft=mode.cap, max_tokens=opts.max_tokens,
                            stop_tokens=stop_ids,
                            context_length=self.loaded.context_length, selector=selector, off=off,
                            constraint=constraint,
                            drafter_fed=request.drafter_fed if drafter is request.drafter else 0,
                            cancelled=request.cancelled)
        return Plan(sequence, found.queue_after if found else None, found.prices if found else None)

    def stream(self, request: Request, stats: RunStats | None = None) -> Iterator[Response]:
        """Generate: one Response per emitted token, the last with a finish_reason. Closing the
        iterator early stops generation (the cache is then left holding prompt and output but
        the last token: `stats.output_ids`). `stats` (a fresh RunStats, whose clock starts when
        it is made) is filled in as it goes, for a caller that needs it even if nothing comes."""
        stats = stats or RunStats()
        plan = self.plan(request, stats)
        events = decode.generate(self.loaded.model, plan.sequence, prompt_cache=request.prompt_cache,
                                 cached=request.cached, queue_after=plan.queue_after, prices=plan.prices)
        responder = Responder(self.loaded.tokenizer, request.options.stop, stats, plan.sequence.drafter)
        try:
            for event in events:
                yield from responder.take(event)
                if responder.stopped:
                    break  # a stop string
        finally:
            events.close()  # the loop's own finally leaves the cache consistent, here on this thread
        self.learn(request.options, stats)

    def learn(self, opts: Options, stats: RunStats) -> None:
        """Add a finished generation's output to the memory, with `opts.memory` (saved at most
        every MEMORY_SAVE_S)."""
        if opts.memory and stats.stop_reason and stats.output_ids:
            self.memory(opts.ngram_order).add(stats.output_ids)
            if time.monotonic() - self._saved_at >= MEMORY_SAVE_S:
                self.save_memory()
