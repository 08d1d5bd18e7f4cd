"""The generation thread when requests are decoded together: worker.py's queue and job protocol,
with up to `max_batch` jobs running at once on the batch engine (engine/batch/streams.py), each
speculating on its own and each answered exactly as it would be alone.

Between steps the thread admits queued jobs while rows are free (one more waits to prefill, in
bounded chunks between decode steps, so a long prompt does not freeze the running streams),
drops jobs whose client went away (their row only), and hands each response to its job. A
finished job leaves its cache in the prompt cache and its drafter in the drafter cache, as
worker.py does. A request's own failure (in its admission, cancel or finish, or its grammar giving
up mid-step) fails that job alone; an unexpected failure inside a step fails the jobs running then
(each told): never the thread.
"""

from __future__ import annotations

from specgen.engine.batch.streams import Streams
from specgen.engine.engine import Engine
from specgen.events import Failed
from specgen.serve.generation.worker import DEVICE, Finished, Job, Prepared, Started, Worker


class BatchWorker(Worker):
    """A Worker that runs up to `max_batch` jobs at once (`running` is one of them, if any)."""

    def __init__(self, engine: Engine, *, max_queue: int, prompt_cache_bytes: int, max_batch: int):
        super().__init__(engine, max_queue=max_queue, prompt_cache_bytes=prompt_cache_bytes)
        self.max_batch = max_batch
        self.streams = Streams(engine, max_rows=max_batch)
        self.active: dict[int, tuple[Job, Prepared]] = {}  # id(job) -> the job and its request
        self._admitting: list[Job] = []  # taken from the queue, not active yet

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._jobs and not self.active and not self._stopping:
                    self._cond.wait()
                if self._stopping and not self.active and not self._jobs:
                    return
            with DEVICE:
                with self._cond:
                    # Rows and one more to prefill: the rest stay queued (and count against
                    # --max-queue) until a row is free, taken in arrival order. (Taken with the
                    # device: a job is queued or active at every moment, never in between.)
                    admitted = self._admitting = []
                    while self._jobs and len(self.streams) + len(admitted) <= self.max_batch:
                        admitted.append(self._jobs.popleft())
                for job in admitted:
                    self._admit(job)
                self._admitting = []
                self._drop_cancelled()
                if self.streams.busy:
                    self._step()
            self.running = next(iter(self.active.values()))[0] if self.active else None

    def _holding(self) -> list[Job]:
        return [job for job, _ in list(self.active.values())]

    @property
    def in_flight(self) -> int:
        return len(self.active) + len(self._admitting)

    def stop_soon(self) -> None:
        """Refuse new jobs and cancel the running ones and every waiting one (returns at once)."""
        super().stop_soon()
        for job, _ in list(self.active.values()):
            job.cancel()

    def _admit(self, job: Job) -> None:
        if self._skipped(job):
            return
        try:
            prepared = self._prepare(job)
            self.streams.add(id(job), prepared.request, job.stats, keep_cache=True)
        except Exception as e:  # this request's failure, reported to it alone
            self._failed(job, e)
            return
        job.deliver(Started(len(job.ids), prepared.request.cached))
        self.active[id(job)] = (job, prepared)

    def _drop_cancelled(self) -> None:
        for key, (job, prepared) in list(self.active.items()):
            if job.cancelled.is_set():
                del self.active[key]  # first: should cancel fail, the row's responses are ignored
                try:  # what it generated stays in the caches, as worker.py keeps a cancelled job's
                    self._keep(job, prepared, self.streams.cancel(key))
                except Exception as e:  # this request's failure, reported to it alone
                    self._failed(job, e)
                    continue
                self.cancelled += 1
                job.deliver(Finished(job.stats, cancelled=True))

    def _step(self) -> None:
        try:
            responses = self.streams.step()
        except Exception as e:  # the running jobs' failure: they are told, the next ones start afresh
            for job, _ in self.active.values():
                self._failed(job, e)
            self.active.clear()
            self.streams = Streams(self.engine, max_rows=self.max_batch)
            return
        for key, response in responses:
            if key not in self.active:  # a row whose cancel failed: its job was already told
                self.streams.kept(key)  # (and the cache it leaves is not kept)
                continue
            job, prepared = self.active[key]
            if isinstance(response, Failed):  # this request's own failure (its grammar gave up)
                del self.active[key]
                self.streams.kept(key)
                self._failed(job, response.error)
                continue
            job.deliver(response)
            if response.finish_reason is not None:
                del self.active[key]
                try:
                    self._keep(job, prepared, self.streams.kept(key))
                except Exception as e:  # this request's failure, reported to it alone
                    self._failed(job, e)
                    continue
                self.served += 1
                job.deliver(Finished(job.stats, False))
