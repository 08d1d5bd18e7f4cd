"""`specgen serve --max-batch N`: concurrent requests decoded together, each speculating, through
the official openai client on a real server. Sixteen clients at once each get the text the same
request gets from a server that runs one request at a time (streamed or not, greedy or seeded);
a client that leaves mid-stream cancels its own row only; the next turn of a conversation comes
from the cache a batched row left; a job whose finish or cancel fails fails alone, the worker
serving the next request."""

import threading
import time

import httpx
import openai
import pytest
from servers import CANCELLED, anthropic_client, client, health, leave_mid_stream, running, settled

from specgen.serve.generation.batch_worker import BatchWorker

PROMPTS = ["Once upon a time", "Lily and Ben went to the park", "The little dog was sad", "Tom had a red ball",
           "One day, a bird", "Sue liked to bake", "The sun was hot", "Max saw a big tree"]


def requests():
    """Sixteen requests unlike each other: lengths, seeds, streaming."""
    out = []
    for i in range(16):
        kw = {"max_tokens": 24 + 5 * i}
        if i % 3 == 1:
            kw.update(temperature=0.8, seed=i)
        out.append((PROMPTS[i % len(PROMPTS)] + (" and" if i >= 8 else ""), kw, i % 2 == 0))
    return out


def answer(c, prompt, kw, stream):
    messages = [{"role": "user", "content": prompt}]
    if not stream:
        return c.chat.completions.create(model="demo", messages=messages, **kw).choices[0].message.content
    chunks = c.chat.completions.create(model="demo", messages=messages, stream=True, **kw)
    return "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)


def all_at_once(url, todo):
    results = [None] * len(todo)

    def one(i):
        results[i] = answer(client(url, timeout=60), *todo[i])

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(todo))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return results


def test_sixteen_clients_at_once_each_get_the_text_they_get_alone(demo_engine):
    todo = requests()
    with running(demo_engine, max_batch=1) as (url, _):
        alone = [answer(client(url), *r) for r in todo]
    with running(demo_engine, max_batch=4, max_queue=16) as (url, worker):
        assert isinstance(worker, BatchWorker)
        together = all_at_once(url, todo)
        # The last answer reaches its client within the worker's last step; `running` is cleared
        # right after that step.
        deadline = time.monotonic() + 10
        while worker.running is not None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert worker.served == 16 and worker.failed == 0 and worker.running is None
    assert together == alone and len(set(alone)) > 8


def test_a_client_that_leaves_cancels_its_row_only(demo_engine, paced_engine):
    # The paced demo (the same weights, so the same texts) answers the leaver too slowly to end
    # before it leaves: it counts as cancelled only if the server noticed.
    todo = requests()[:3]
    with running(demo_engine, max_batch=1) as (url, _):
        alone = [answer(client(url), *r) for r in todo]
    with running(paced_engine, max_batch=4) as (url, worker):
        assert isinstance(worker, BatchWorker)
        before = health(url)
        results = [None] * 3
        threads = [threading.Thread(target=lambda i=i: results.__setitem__(i, answer(client(url), *todo[i])))
                   for i in range(3)]
        body = {"model": "demo", "messages": [{"role": "user", "content": PROMPTS[0]}], "max_tokens": 400,
                "stream": True}
        with httpx.Client(timeout=30) as h, h.stream("POST", f"{url}/v1/chat/completions", json=body) as r:
            lines = r.iter_lines()
            next(lines)
            for t in threads:
                t.start()
            for _ in range(4):
                next(lines)
        for t in threads:
            t.join(60)
        assert results == alone
        assert settled(url, before, jobs=4) == {"served": 3, "cancelled": 1, "failed": 0}


@pytest.mark.parametrize("max_batch", [1, 3])
def test_the_next_turn_from_a_batched_rows_cache_is_the_turn_from_nothing(demo_engine, max_batch):
    first = [{"role": "user", "content": PROMPTS[1]}]
    with running(demo_engine, max_batch=max_batch, prompt_cache_bytes=0) as (url, _):
        reply = client(url).chat.completions.create(model="demo", messages=first, max_tokens=20)
        turn = first + [{"role": "assistant", "content": reply.choices[0].message.content},
                        {"role": "user", "content": "And then?"}]
        fresh = client(url).chat.completions.create(model="demo", messages=turn, max_tokens=20)
    with running(demo_engine, max_batch=max_batch) as (url, worker):
        assert isinstance(worker, BatchWorker) == (max_batch > 1)
        again = client(url).chat.completions.create(model="demo", messages=first, max_tokens=20)
        cached = client(url).chat.completions.create(model="demo", messages=turn, max_tokens=20)
    assert again.choices[0].message.content == reply.choices[0].message.content
    assert cached.choices[0].message.content == fresh.choices[0].message.content
    assert cached.usage.prompt_tokens_details.cached_tokens > 0


def test_a_client_that_leaves_leaves_its_rows_cache_for_the_next_request(paced_engine):
    body = {"model": "demo", "messages": [{"role": "user", "content": PROMPTS[4]}], "max_tokens": 400}
    with running(paced_engine, max_batch=4) as (url, worker):  # its 218-token answer lasts over 2 s
        assert isinstance(worker, BatchWorker)
        assert leave_mid_stream(url, "/v1/chat/completions", body, lines=6) == CANCELLED
        again = client(url, timeout=30).chat.completions.create(**{**body, "max_tokens": 2})
    assert again.usage.prompt_tokens_details.cached_tokens == again.usage.prompt_tokens - 1


def later(url: str, api: str, messages: list[dict]) -> tuple[str, int, int]:
    """A 12-token greedy answer (the server's default) through `api`'s official client: (text,
    prompt tokens, cached)."""
    if api == "chat":
        r = client(url, timeout=30).chat.completions.create(model="demo", messages=messages, max_tokens=12,
                                                            temperature=0)
        return r.choices[0].message.content, r.usage.prompt_tokens, r.usage.prompt_tokens_details.cached_tokens
    if api == "messages":
        r = anthropic_client(url, timeout=30).messages.create(model="demo", messages=messages, max_tokens=12)
        cached = r.usage.cache_read_input_tokens
        return r.content[0].text, r.usage.input_tokens + cached, cached
    r = client(url, timeout=30).responses.create(model="demo", input=messages, max_output_tokens=12, temperature=0)
    return r.output_text, r.usage.input_tokens, r.usage.input_tokens_details.cached_tokens


@pytest.mark.parametrize("api", ["chat", "messages", "responses"])
def test_a_request_like_one_decoding_takes_its_prompt_and_answers_as_alone(demo_engine, paced_engine, api):
    # No prompt cache: only the running row can hold the prompt (engine/batch/share.py).
    messages = [{"role": "user", "content": PROMPTS[4]}]
    with running(demo_engine, max_batch=1, prompt_cache_bytes=0) as (url, _):
        alone = later(url, api, messages)
    with running(paced_engine, max_batch=4, prompt_cache_bytes=0) as (url, worker):
        assert isinstance(worker, BatchWorker)
        body = {"model": "demo", "messages": messages, "max_tokens": 400, "stream": True}
        with httpx.Client(timeout=30) as h, h.stream("POST", f"{url}/v1/chat/completions", json=body) as r:
            lines = r.iter_lines()
            for _ in range(4):  # it decodes
                next(lines)
            together = later(url, api, messages)
    text, prompt_tokens, cached = together
    assert text == alone[0] and alone[2] == 0 and cached == prompt_tokens - 1 == alone[1] - 1


def once_failing(method, error: Exception):
    """`method`, but raising `error` the first time it is called."""
    calls = []

    def failing(*args, **kw):
        calls.append(args)
        if len(calls) == 1:
            raise error
        return method(*args, **kw)

    return failing


def test_a_job_whose_cache_cannot_be_kept_fails_alone(demo_engine):
    ask = {"model": "demo", "messages": [{"role": "user", "content": PROMPTS[2]}], "max_tokens": 12}
    with running(demo_engine, max_batch=4) as (url, worker):
        assert isinstance(worker, BatchWorker)
        before = client(url, timeout=30).chat.completions.create(**ask)
        worker.prompts.store = once_failing(worker.prompts.store, MemoryError("no room for the cache"))
        with pytest.raises(openai.InternalServerError, match="no room for the cache"):
            client(url, timeout=30).chat.completions.create(**ask)
        after = client(url, timeout=30).chat.completions.create(**ask)
        assert worker.dead is None and worker.failed == 1 and worker.served == 2
    assert after.choices[0].message.content == before.choices[0].message.content


def test_a_job_whose_cancel_fails_fails_alone(demo_engine):
    ask = {"model": "demo", "messages": [{"role": "user", "content": PROMPTS[3]}], "max_tokens": 12}
    body = {**ask, "max_tokens": 400, "stream": True}
    with running(demo_engine, max_batch=4) as (url, worker):
        before = client(url, timeout=30).chat.completions.create(**ask)
        worker.streams.cancel = once_failing(worker.streams.cancel, RuntimeError("the row would not go"))
        with httpx.Client(timeout=30) as h, h.stream("POST", f"{url}/v1/chat/completions", json=body) as r:
            lines = r.iter_lines()
            for _ in range(4):
                next(lines)
        deadline = time.monotonic() + 10
        while worker.failed == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        after = client(url, timeout=30).chat.completions.create(**ask)
        assert worker.dead is None and worker.failed == 1 and worker.served == 2 and not worker.active
    assert after.choices[0].message.content == before.choices[0].message.content


def test_a_burst_is_admitted_a_row_at_a_time_in_arrival_order(demo_engine, monkeypatch):
    # The worker took every queued job whenever the batch had room (its loop's condition never
    # changed as it took them): --max-queue bounded nothing, jobs were told they started while
    # they waited, and were prefilled out of order.
    from specgen.engine.batch.streams import Streams
    from specgen.engine.options import Options
    from specgen.serve.generation.worker import Finished, Job, Started

    release, entered, real_step = threading.Event(), threading.Event(), Streams.step

    def held_step(self):
        entered.set()
        release.wait(30)
        return real_step(self)

    monkeypatch.setattr(Streams, "step", held_step)
    worker = BatchWorker(demo_engine, max_queue=8, prompt_cache_bytes=0, max_batch=2)
    got: dict[int, list] = {i: [] for i in range(6)}
    for i in range(6):
        ids = demo_engine.encode(PROMPTS[i])
        worker.submit(Job(ids, Options(max_tokens=4), None, got[i].append))
    worker.start()
    try:
        assert entered.wait(30)
        started = [i for i in range(6) if any(isinstance(x, Started) for x in got[i])]
        assert started == [0, 1, 2] and worker.queued == 3  # two rows and one prefilling
        release.set()
        deadline = time.monotonic() + 60
        while not all(got[i] and isinstance(got[i][-1], Finished) for i in range(6)):
            assert time.monotonic() < deadline
            time.sleep(0.01)
    finally:
        release.set()
        worker.stop(30)
    assert worker.served == 6 and worker.failed == 0


def test_batched_costs_are_measured_before_the_server_answers(demo_engine, tmp_path, monkeypatch):
    # On a fresh cache folder the first batched or constrained request measured them, blocking
    # every request behind it (57 s once, minutes under load) while /health said idle.
    from specgen.engine.cost import grid

    monkeypatch.setenv("SPECGEN_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(grid, "BUDGET_S", 0.2)
    measured, real = [], grid.measure
    monkeypatch.setattr(grid, "measure", lambda *a, **k: measured.append(a[2]) or real(*a, **k))
    with running(demo_engine, max_batch=3) as (url, worker):
        assert measured == [3] and health(url)["status"] == "ok"
        fmt = {"type": "json_schema", "json_schema": {"name": "n", "schema": {"type": "integer"}}}
        for extra in ({}, {"response_format": fmt}):
            c = client(url, timeout=60).chat.completions.create(
                model="demo", messages=[{"role": "user", "content": PROMPTS[0]}], max_tokens=8, **extra)
            assert c.choices[0].finish_reason in ("stop", "length")
        assert measured == [3]
