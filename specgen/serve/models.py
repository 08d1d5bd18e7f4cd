"""The models a server serves, by name: the first loaded before the server answers, the others
when first asked for, each resident one with its own engine and generation thread (the threads
take turns on the device: worker.DEVICE).

A request claims its model for as long as its route runs; a model is idle when nothing claims it
and its worker holds and queues no job. An idle model unloads once it has been idle for its
keep-alive (the server's `--keep-alive`, or the latest request's `keep_alive`; None: never, 0:
right after its answer). Past `--max-models`, loading one first unloads the least recently used
idle one, or waits for one to be idle: never one with a request in flight. Requests for a model
that is loading wait for that load; a load that fails is the error of the requests that waited
for it, and the server goes on. A model the server was handed already loaded (no spec to load it
again) stays resident.
"""

from __future__ import annotations

import asyncio
import ctypes
import gc
import logging
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import AsyncIterator, Callable

from fastapi.concurrency import run_in_threadpool

from specgen.engine.engine import Engine
from specgen.serve.apis.ollama import base_name
from specgen.serve.generation.worker import DEVICE, Worker, stopping_error
from specgen.serve.schema import ApiError

_log = logging.getLogger("specgen.serve")
SWEEP_S = 0.25  # how often idle models are looked at (a keep-alive of 0 unloads within this)
STOP_S = 10.0  # how long an unloading model's worker gets to end, and a stopping server's loads


@dataclass(eq=False)
class Resident:
    """A loaded model: its engine, its generation thread, and what decides when it unloads."""

    name: str
    engine: Engine
    worker: Worker
    load_s: float  # how long its load took (Ollama's load_duration, for the request that waited)
    keep_alive: float | None  # seconds idle before it unloads; None: never
    reloadable: bool = True
    claims: int = 0
    last_used: float = field(default_factory=time.monotonic)
    idle_since: float | None = None

    @property
    def idle(self) -> bool:
        return self.claims == 0 and self.worker.queued == 0 and self.worker.in_flight == 0

    @property
    def expires(self) -> float | None:
        """When it unloads if nothing comes (monotonic seconds), None if never."""
        if self.keep_alive is None or not self.reloadable:
            return None
        return (self.idle_since or time.monotonic()) + self.keep_alive


class Models:
    """The served models: `claim` one by name for a request; `sweep` unloads idle ones."""

    def __init__(self, first: Engine, first_name: str, specs: dict[str, str | None], *,
                 load: Callable[[str], Engine], worker: Callable[[Engine], Worker], max_models: int,
                 keep_alive: float | None, memory: bool = False,
                 on_load: Callable[[Resident], None] = lambda r: None,
                 on_unload: Callable[[Resident], None] = lambda r: None):
        self.default, self.specs = first_name, specs  # name -> how to load it (None: cannot be reloaded)
        self._load, self._worker, self.max_models, self.keep_alive = load, worker, max_models, keep_alive
        self._on_load, self._on_unload, self.memory = on_load, on_unload, memory
        self.resident: dict[str, Resident] = {}
        self._loading: dict[str, asyncio.Future] = {}
        self._stopped = asyncio.Event()  # set on shutdown: requests waiting for a load go
        self._unloading: set[Resident] = set()  # models whose unload is stopping their worker
        self._loop: asyncio.AbstractEventLoop | None = None  # the server's (`start`)
        self._add(Resident(first_name, first, worker(first), 0.0, keep_alive, reloadable=specs[first_name] is not None))

    def names(self) -> list[str]:
        """Every served model, the default first."""
        return list(self.specs)

    def named(self, requested: str, any_name: bool) -> str:
        """The served model `requested` names (with or without `:latest`); another name is the
        default where `any_name` (OpenAI's and Anthropic's routes), else Ollama's 404."""
        name = base_name(requested)
        if name in self.specs:
            return name
        if any_name:
            return self.default
        raise ApiError(404, f"model '{requested}' not found", kind="not_found_error")

    @asynccontextmanager
    async def claim(self, requested: str, *, any_name: bool = True,
                    keep_alive: float | None | str = "server") -> AsyncIterator[tuple[Resident, float]]:
        """The model a request names, loaded (waiting for it if need be), held resident while the
        request's route runs; with it, the seconds this request waited for its load."""
        name = self.named(requested, any_name)
        start, resident = time.perf_counter(), self.resident.get(name)
        waited = 0.0
        if resident is None:
            resident = await self._loaded(name)
            waited = time.perf_counter() - start
        resident.claims += 1
        resident.last_used, resident.idle_since = time.monotonic(), None
        # each request sets how long its model stays once idle: its own keep_alive, else the server's
        resident.keep_alive = self.keep_alive if keep_alive == "server" else keep_alive
        try:
            yield resident, waited
        finally:
            resident.claims -= 1

    async def _loaded(self, name: str) -> Resident:
        """The model loaded: by a task of its own, which every request for it awaits (shielded: a
        request that goes away does not cancel the load the others wait for); a 503 once the
        server is stopping, at once rather than when the load ends."""
        if self._stopped.is_set():
            raise stopping_error()
        if name not in self._loading:
            self._loading[name] = asyncio.ensure_future(self._load_task(name))
        load, stop = asyncio.shield(self._loading[name]), asyncio.ensure_future(self._stopped.wait())
        await asyncio.wait((load, stop), return_when=asyncio.FIRST_COMPLETED)
        stop.cancel()
        if not load.done():
            load.cancel()  # (this request's wait only: the load goes on, and `stop` waits for it)
            raise stopping_error()
        return load.result()

    async def _load_task(self, name: str) -> Resident:
        try:
            await self._make_room()
            if self._stopped.is_set():
                raise stopping_error()
            start = time.perf_counter()
            # In the loop's own executor, whose threads the server's exit waits for: a process
            # that exits while a thread runs MLX may abort, and a load cannot be interrupted.
            loop = asyncio.get_running_loop()
            engine, worker = await loop.run_in_executor(None, self._make, self.specs[name])
            if self._stopped.is_set():  # its requests were answered: nothing left to serve
                raise stopping_error()
            resident = Resident(name, engine, worker, time.perf_counter() - start, self.keep_alive)
            self._add(resident)
            worker.start()
            _log.info("loaded %s in %.1f s (%d resident)", name, resident.load_s, len(self.resident))
            return resident
        except ApiError:
            raise
        except Exception as e:
            raise ApiError(500, f"model '{name}' could not be loaded: {type(e).__name__}: {e}",
                           kind="server_error") from None
        finally:
            del self._loading[name]

    def _make(self, spec: str) -> tuple[Engine, Worker]:
        """A model loaded, its costs measured and its worker made (not started), taking the
        device's turn as a worker does."""
        with DEVICE:
            engine = self._load(spec)
            return engine, self._worker(engine)

    def _add(self, resident: Resident) -> None:
        self.resident[resident.name] = resident
        self._on_load(resident)

    async def _make_room(self) -> None:
        """Unload the least recently used idle model until one more fits (waiting for one to be
        idle); a 503 where none ever can be (every resident one was handed over loaded)."""
        while len(self.resident) + len(self._loading) > self.max_models and not self._stopped.is_set():
            if not any(r.reloadable for r in self.resident.values()):
                raise ApiError(503, f"{len(self.resident)} models are resident (--max-models {self.max_models}) "
                                    "and none can be unloaded", kind="server_error")
            idle = [r for r in self.resident.values() if r.idle and r.reloadable]
            if idle:
                await self.unload(min(idle, key=lambda r: r.last_used))
            else:
                await asyncio.sleep(SWEEP_S)

    async def unload(self, resident: Resident) -> None:
        """Stop its worker and let its engine go (memory back to what it was before its load);
        nothing where it is no longer the resident one of its name."""
        if self.resident.get(resident.name) is not resident:
            return
        del self.resident[resident.name]
        self._on_unload(resident)
        self._unloading.add(resident)  # (until it ends: a shutdown cancels the sweep, not the thread)
        await run_in_threadpool(resident.worker.stop, STOP_S)
        self._unloading.discard(resident)
        if self.memory:
            resident.engine.save_memory()
        resident.engine = resident.worker = None
        _give_back_memory()
        _log.info("unloaded %s (%d resident)", resident.name, len(self.resident))

    async def sweep(self) -> None:
        """Unload, forever, each model idle for its keep-alive (a server's background task)."""
        while True:
            await asyncio.sleep(SWEEP_S)
            try:
                await self._sweep_once(time.monotonic())
            except Exception:  # a pass that failed is logged; the next one runs
                _log.exception("unloading idle models failed")

    async def _sweep_once(self, now: float) -> None:
        for resident in list(self.resident.values()):
            if self.resident.get(resident.name) is not resident:  # unloaded meanwhile (to make room)
                continue
            if not resident.idle:
                resident.idle_since = None
                continue
            resident.idle_since = resident.idle_since or now
            if resident.reloadable and resident.keep_alive is not None and now - resident.idle_since >= resident.keep_alive:
                await self.unload(resident)

    async def unload_named(self, requested: str) -> bool:
        """Unload a resident model now (Ollama's keep_alive 0 with no prompt) unless a request
        holds it; whether it went."""
        resident = self.resident.get(self.named(requested, any_name=False))
        if resident is None or not resident.idle or not resident.reloadable:
            return False
        await self.unload(resident)
        return True

    def start(self) -> None:
        """Start serving (from the server's event loop): the default model's worker starts."""
        self._loop = asyncio.get_running_loop()
        self.resident[self.default].worker.start()

    def stop_soon(self) -> None:
        """On shutdown (from any thread): cancel every model's jobs, and answer the requests
        waiting for a load."""
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._stopped.set)
        for resident in list(self.resident.values()):
            resident.worker.stop_soon()

    async def stop(self) -> None:
        """Stop every worker (on shutdown) and save each model's memory, once the loads in
        progress have ended (waiting STOP_S for them here; past that, the server's exit waits for
        them, as for any thread of its loop's executor)."""
        self._stopped.set()
        loads = list(self._loading.values())
        if loads:
            done, pending = await asyncio.wait(loads, timeout=STOP_S)
            for load in done:  # (each was its waiting requests' error, already answered)
                load.cancelled() or load.exception()
            if pending:
                _log.warning("waiting for a model's load to end before exiting")
        await run_in_threadpool(self._stop_workers, STOP_S)

    def _stop_workers(self, timeout: float) -> None:
        # Every resident model, and any whose unload the shutdown cancelled midway.
        for resident in [*self._unloading, *self.resident.values()]:
            resident.worker.stop(timeout)
            if self.memory:
                resident.engine.save_memory()


def _give_back_memory() -> None:
    """Free what an unloaded model held, back to the system: MLX's buffer cache, and on glibc the
    heap pages malloc keeps (a float32 SmolLM2's 540 MB otherwise stay in the process: docs/serving.md)."""
    import mlx.core as mx

    gc.collect()
    mx.clear_cache()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc (macOS: Metal buffers go with clear_cache)
        pass


def fewer_arenas() -> None:
    """On glibc, at most two malloc arenas from here on (as MALLOC_ARENA_MAX=2): each thread that
    loads or runs a model otherwise gets its own, where what an unloaded model freed stays in the
    process (docs/serving.md, "Several models"). Called before the first model loads."""
    try:
        ctypes.CDLL("libc.so.6").mallopt(-8, 2)  # M_ARENA_MAX
    except (OSError, AttributeError):  # not glibc: nothing to do
        pass

