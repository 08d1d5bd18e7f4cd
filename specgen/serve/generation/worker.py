"""The one thread that generates: a FIFO queue of jobs in front of the engine.

`Worker` runs requests one at a time, each on this thread (the engine's decode loop and its cache
rewind must run where they started); batch_worker.py's `BatchWorker`, the server's default where
the model's caches batch, keeps this queue and job protocol and decodes several together. A job's
responses go to its `send` callback as they come (after `Started`, with the prompt cache's hit),
then `Finished` (or the exception that ended it). A job whose client went away is cancelled within
one step, queued or running. One request's failure is that request's alone; should the thread
itself ever die, `dead` says why, waiting jobs fail at once and new ones are refused (the routes
answer 503), never a healthy front over a dead worker.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, NamedTuple

from specgen.engine.engine import Engine, Request
from specgen.engine.options import Options
from specgen.errors import SpecgenError
from specgen.serve.generation.cache import DrafterCache, PromptCache
from specgen.serve.schema import ApiError
from specgen.stats import RunStats

_log = logging.getLogger("specgen.serve")


class Turns:
    """A lock taken in the order it was asked for (threading.Lock is not: a thread that releases
    and takes it again at once, a batch worker between steps, would keep it from the others)."""

    def __init__(self):
        self._cond = threading.Condition()
        self._next = self._serving = 0

    def __enter__(self):
        with self._cond:
            ticket, self._next = self._next, self._next + 1
            while ticket != self._serving:
                self._cond.wait()

    def __exit__(self, *exc):
        with self._cond:
            self._serving += 1
            self._cond.notify_all()


# The device, one generation thread at a time: a server's models each have a worker, and they
# take turns in order (a job at a time, a batch step at a time), as a loading model does.
DEVICE = Turns()


class Started(NamedTuple):
    """The worker took the job: its prompt's tokens, and how many of them the prompt cache held."""

    prompt_tokens: int
    cached_tokens: int


class Finished(NamedTuple):
    """The job is over: `cancelled` (its client left, or the server is stopping) or complete."""

    stats: RunStats
    cancelled: bool = False


@dataclass
class Job:
    """One request for the worker: prompt ids, settings, prediction, and where its results go."""

    ids: list[int]
    options: Options
    prediction: str | None
    send: Callable[[object], None]  # on the worker thread: Started, each Response, then Finished or an error
    stats: RunStats = field(default_factory=RunStats)  # replaced when the job starts running
    cancelled: threading.Event = field(default_factory=threading.Event)

    def cancel(self) -> None:
        self.cancelled.set()

    def deliver(self, item) -> None:
        try:
            self.send(item)
        except Exception:  # the receiving side is gone (its event loop closed): stop working for it
            self.cancel()


class DrafterSettings(NamedTuple):
    """What a kept drafter must have been made with to serve a request (the drafter cache's key)."""

    ngram_order: int
    window: int
    memory: bool


class Prepared(NamedTuple):
    """A job ready for the engine: its request, and whether its drafter goes back to the drafter
    cache afterwards (under `settings`); a fixed draft size uses none."""

    request: Request
    settings: DrafterSettings
    keep: bool


def stopping_error() -> ApiError:
    return ApiError(503, "the server is shutting down", code="shutting_down", kind="server_error")


def dead_error(reason: str) -> ApiError:
    return ApiError(503, f"the generation worker has stopped ({reason}); restart the server",
                    code="worker_dead", kind="server_error")


class Worker:
    """A generation thread and its queue of at most `max_queue` waiting jobs."""

    def __init__(self, engine: Engine, *, max_queue: int, prompt_cache_bytes: int):
        self.engine, self.max_queue = engine, max_queue
        self.prompts = PromptCache(engine.loaded.model, prompt_cache_bytes)
        self.drafters = DrafterCache()
        self._jobs: deque[Job] = deque()
        self._cond = threading.Condition()
        self._stopping = False
        self.dead: str | None = None  # why the thread ended, if it ever does outside stop()
        self.running: Job | None = None
        self.served = self.cancelled = self.failed = 0
        self._thread = threading.Thread(target=self._run, name="specgen-worker", daemon=True)

    def start(self) -> None:
        self._thread.start()

    @property
    def queued(self) -> int:
        return len(self._jobs)

    @property
    def in_flight(self) -> int:
        """Jobs taken and not finished."""
        return len(self._holding())

    def submit(self, job: Job) -> None:
        """Queue `job`; ApiError 429 when the queue is full, 503 when the worker cannot take it."""
        with self._cond:
            if self.dead is not None:
                raise dead_error(self.dead)
            if self._stopping:
                raise stopping_error()
            if len(self._jobs) >= self.max_queue:
                raise ApiError(429, f"{len(self._jobs)} requests are already waiting (--max-queue "
                                    f"{self.max_queue}); try again shortly", code="queue_full",
                               kind="rate_limit_error")
            self._jobs.append(job)
            self._cond.notify()

    def stop_soon(self) -> None:
        """Refuse new jobs and cancel the running one and every waiting one (returns at once)."""
        with self._cond:
            self._stopping = True
            for job in (*self._jobs, *([self.running] if self.running else [])):
                job.cancel()
            self._cond.notify()

    def stop(self, timeout: float | None = None) -> None:
        """stop_soon, then wait for the thread to end."""
        self.stop_soon()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _run(self) -> None:
        """The thread: `_loop` until it returns, and should it ever raise, say why (`dead`), tell
        the jobs it held (`_holding`) and fail every waiting one at once."""
        try:
            self._loop()
        except BaseException as e:
            self.dead = f"{type(e).__name__}: {e}"
            _log.critical("the generation worker died: %s", self.dead)
            for job in self._holding():
                job.deliver(dead_error(self.dead))
            raise
        finally:
            with self._cond:
                left, self._jobs = list(self._jobs), deque()
            for job in left:
                job.deliver(dead_error(self.dead) if self.dead else stopping_error())

    def _loop(self) -> None:
        """Serve queued jobs one at a time until stopped with none left."""
        while True:
            with self._cond:
                while not self._jobs and not self._stopping:
                    self._cond.wait()
                if not self._jobs:
                    return
                job = self.running = self._jobs.popleft()
            try:
                with DEVICE:
                    self._serve(job)
            except Exception as e:  # this request's failure, reported to it alone
                self._failed(job, e)
            self.running = None

    def _holding(self) -> list[Job]:
        """The jobs the thread has taken and not finished."""
        return [self.running] if self.running is not None else []

    def _serve(self, job: Job) -> None:
        if self._skipped(job):
            return
        prepared = self._prepare(job)
        job.deliver(Started(len(job.ids), prepared.request.cached))
        stream = self.engine.stream(prepared.request, job.stats)
        try:
            for response in stream:
                job.deliver(response)
                if job.cancelled.is_set():
                    break
        finally:
            stream.close()  # here, on this thread: the decode loop rewinds the cache
        # A job cancelled within its prefill left a cache holding part of its prompt: not kept.
        self._keep(job, prepared, prepared.request.prompt_cache if job.stats.prompt_tokens else None)
        cancelled = job.cancelled.is_set() and job.stats.stop_reason is None
        self.cancelled += cancelled
        self.served += not cancelled
        job.deliver(Finished(job.stats, cancelled))

    def _skipped(self, job: Job) -> bool:
        """Whether `job` was cancelled before it started (then it is told so, and counted)."""
        skipped = job.cancelled.is_set()
        if skipped:
            self.cancelled += 1
            job.deliver(Finished(job.stats, cancelled=True))
        return skipped

    def _prepare(self, job: Job) -> Prepared:
        """The engine request for `job`: the prompt cache's longest prefix of its ids, and a kept
        drafter that has read them (or a new one) unless it drafts with a fixed size."""
        opts = job.options
        job.stats = RunStats()  # its clock starts now: waiting in the queue is not prefill
        cache, cached = self.prompts.fetch(job.ids)
        settings = DrafterSettings(opts.ngram_order, opts.window, opts.memory)
        keep = opts.draft is None
        drafter, fed = self.drafters.take(job.ids, settings) if keep else (None, 0)
        if keep and drafter is None:
            drafter = self.engine.new_drafter(opts)
        request = Request(job.ids, opts, prompt_cache=cache, cached=cached, prediction=job.prediction,
                          drafter=drafter, drafter_fed=fed, cancelled=job.cancelled.is_set)
        return Prepared(request, settings, keep)

    def _keep(self, job: Job, prepared: Prepared, cache: list | None) -> None:
        """Keep a finished job's cache (prompt and output but the last token, as Engine.stream
        leaves it) and its drafter for later requests."""
        if cache is not None:
            self.prompts.store((job.ids + job.stats.output_ids)[:-1], cache)
        if prepared.keep:
            self.drafters.put(prepared.request.drafter, prepared.settings)

    def _failed(self, job: Job, e: Exception) -> None:
        """`job` failed with `e`: it is told, and the failure is counted (and logged if unexpected)."""
        self.failed += 1
        if not isinstance(e, (ApiError, SpecgenError)):
            _log.error("a request failed", exc_info=e)
        job.deliver(e)
