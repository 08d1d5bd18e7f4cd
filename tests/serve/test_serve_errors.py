"""`specgen serve` under bad input and failure: every bad request gets its OpenAI-shaped 4xx naming
the field, the key is enforced, the queue is bounded, a dead worker is never hidden behind a
healthy front, and the command stops cleanly on SIGTERM, saving what its memory learnt."""

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import NamedTuple

import httpx
import openai
import pytest
from servers import client, running

from specgen.engine.batch.streams import Streams
from specgen.engine.engine import Request
from specgen.engine.options import Options

MSG = [{"role": "user", "content": "Once upon a time"}]


@pytest.fixture(scope="module")
def engine(demo_engine):
    return demo_engine


@pytest.fixture(scope="module")
def served(engine):
    with running(engine, max_body_bytes=64_000) as (url, worker):
        yield url


BAD = [  # (body, status, param, words in the message)
    ({"model": "demo", "messages": MSG, "temperature": -1}, 400, "temperature", "0 (greedy) or more"),
    ({"model": "demo", "messages": MSG, "max_tokens": 0}, 400, "max_tokens", "at least 1"),
    ({"model": "demo", "messages": MSG, "max_completion_tokens": "many"}, 400, "max_completion_tokens", "integer"),
    ({"model": "demo", "messages": MSG, "max_completion_tokens": 0}, 400, "max_completion_tokens", "at least 1"),
    ({"model": "demo", "messages": MSG, "top_p": 1.5}, 400, "top_p", "between 0 and 1"),
    ({"model": "demo", "messages": MSG, "seed": -3}, 400, "seed", "between 0"),
    ({"model": "demo", "messages": MSG, "stop": [""]}, 400, "stop", "non-empty"),
    ({"model": "demo", "messages": MSG, "n": 2}, 400, "n", "not supported"),
    ({"model": "demo", "messages": MSG, "logprobs": True}, 400, "logprobs", "not supported"),
    ({"model": "demo", "messages": MSG, "response_format": {"type": "xml"}}, 400, "response_format.type", "json_schema"),
    ({"model": "demo", "messages": MSG, "tool_choice": {"type": "function", "function": {"name": "f"}}}, 400, "tool_choice", "function"),
    ({"model": "demo", "messages": MSG, "frobnicate": 1}, 400, "frobnicate", "not a field"),
    ({"model": "demo", "messages": MSG, "stream_options": {"include_usage": True}}, 400, "stream_options", "stream is true"),
    ({"model": "demo", "messages": MSG, "prediction": {"type": "image", "content": "x"}}, 400, "prediction.type", "'content'"),
    ({"model": "demo", "messages": "hi"}, 400, "messages", "list"),
    ({"model": "demo", "messages": []}, 400, "messages", "at least 1"),
    ({"model": "demo", "messages": [{"role": "robot", "content": "x"}]}, 400, "messages[0].role", "'user'"),
    ({"model": "demo", "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}, 400,
     "messages[0].content[0].type", "'text'"),
    ({"messages": MSG}, 400, "model", "required"),
    ({"model": "demo", "messages": MSG, "tools": [{"type": "function", "function": {"name": "f"}}]}, 400, "tools",
     "no tool-calling"),
    ({"model": "demo", "messages": [{"role": "user", "content": "Once upon a time " * 200}]}, 400, "messages",
     "tokens too many"),
    ({"model": "", "messages": MSG}, 400, "model", "at least 1 character"),
]


@pytest.mark.parametrize("body,status,param,words", BAD, ids=[f"{b[2]}-{i}" for i, b in enumerate(BAD)])
def test_each_bad_chat_request_gets_its_status_naming_the_field(served, body, status, param, words):
    r = httpx.post(f"{served}/v1/chat/completions", json=body, timeout=30)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["param"] == param and words in error["message"] and error["type"]


@pytest.mark.parametrize("body,param", [({"model": "demo", "prompt": ["a", "b"]}, "prompt"),
                                        ({"model": "demo", "prompt": [1, 100000]}, "prompt"),
                                        ({"model": "demo", "prompt": ""}, "prompt"),
                                        ({"model": "demo", "prompt": "x", "echo": True}, "echo"),
                                        ({"model": "demo", "prompt": "x", "best_of": 3}, "best_of")])
def test_each_bad_completion_request_is_a_400(served, body, param):
    r = httpx.post(f"{served}/v1/completions", json=body, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def test_malformed_json_and_a_body_over_the_limit(served):
    r = httpx.post(f"{served}/v1/chat/completions", content=b'{"model": "demo", "messages": [', timeout=30,
                   headers={"content-type": "application/json"})
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"]
    r = httpx.post(f"{served}/v1/chat/completions", json={"model": "demo", "messages": MSG, "user": "x" * 70_000})
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"


def test_the_official_client_sees_a_bad_request_error(served):
    with pytest.raises(openai.BadRequestError) as e:
        client(served).chat.completions.create(model="demo", messages=MSG, temperature=-1)
    assert e.value.body["param"] == "temperature"
    # any other name is served by the loaded model, as on the agent APIs
    answer = client(served).chat.completions.create(model="gpt-4o", messages=MSG, max_tokens=2)
    assert answer.model == "gpt-4o"


def test_the_api_key_is_required_when_set_and_browsers_may_ask_first(engine):
    with running(engine, api_key="sesame", allowed_origins=("http://editor.local",)) as (url, _):
        preflight = httpx.options(f"{url}/v1/chat/completions", headers={
            "Origin": "http://editor.local", "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization,content-type"})
        assert preflight.status_code == 200
        assert preflight.headers["access-control-allow-origin"] == "http://editor.local"
        with pytest.raises(openai.AuthenticationError):
            client(url).models.list()
        with pytest.raises(openai.AuthenticationError):
            client(url, api_key="wrong").models.list()
        assert [m.id for m in client(url, api_key="sesame").models.list()] == ["demo"]
        assert httpx.get(f"{url}/health").status_code == 200  # health needs no key


class Held(NamedTuple):
    release: threading.Event  # set: held generations go on
    entered: threading.Event  # set once the worker waits inside a held pass (nothing it holds moves)


def _held(engine, monkeypatch) -> Held:
    """Make generations wait until `release` is set, one at a time (engine.stream) or batched
    (Streams.step)."""
    held_up = Held(threading.Event(), threading.Event())
    real, real_step = engine.stream, Streams.step

    def held(request, stats=None):
        held_up.entered.set()
        held_up.release.wait(30)
        yield from real(request, stats)

    def held_step(self):
        held_up.entered.set()
        held_up.release.wait(30)
        return real_step(self)

    monkeypatch.setattr(engine, "stream", held)
    monkeypatch.setattr(Streams, "step", held_step)
    return held_up


def _wait(condition):
    deadline = time.monotonic() + 30
    while not condition():
        assert time.monotonic() < deadline
        time.sleep(0.01)


def _taken(worker) -> int:
    """Requests the worker has taken: waiting, plus running (one, or a batch's rows)."""
    running = len(worker.active) if hasattr(worker, "active") else worker.running is not None
    return worker.queued + running


@pytest.mark.parametrize("max_batch", [1, 2])
def test_a_full_queue_answers_429_with_retry_after(engine, monkeypatch, max_batch):
    release, entered = _held(engine, monkeypatch)
    body = {"model": "demo", "messages": MSG, "max_tokens": 4}
    results = []
    with running(engine, max_queue=1, max_batch=max_batch) as (url, worker):
        threads = []
        while not worker.queued:  # fill the rows, then the queue's one place
            threads.append(threading.Thread(target=lambda: results.append(
                httpx.post(f"{url}/v1/chat/completions", json=body, timeout=30).status_code)))
            threads[-1].start()
            _wait(lambda: _taken(worker) == len(threads))
            # Until the worker waits in a pass, a request counted as queued may still be taken
            # into a row, freeing the queue's place for the request that should be refused.
            _wait(entered.is_set)
        r = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=30)
        assert r.status_code == 429 and r.headers["retry-after"] == "1"
        assert r.json()["error"]["type"] == "rate_limit_error"
        release.set()
        for t in threads:
            t.join(30)
    assert len(threads) >= 2 and results == [200] * len(threads)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
@pytest.mark.parametrize("max_batch", [1, 2])
def test_a_dead_worker_is_reported_and_fails_waiting_requests_at_once(engine, monkeypatch, max_batch):
    release, _ = _held(engine, monkeypatch)
    held, held_step = engine.stream, Streams.step

    def dies(request, stats=None):
        for response in held(request, stats):
            raise SystemExit("simulated crash")  # escapes the per-request handler, as nothing should
            yield response

    def step_dies(self):
        held_step(self)
        raise SystemExit("simulated crash")

    monkeypatch.setattr(engine, "stream", dies)
    monkeypatch.setattr(Streams, "step", step_dies)
    results = {}

    def post(name, url):
        results[name] = httpx.post(f"{url}/v1/chat/completions", json={"model": "demo", "messages": MSG}, timeout=30)

    with running(engine, max_queue=4, max_batch=max_batch) as (url, worker):
        assert httpx.get(f"{url}/health").json()["status"] == "ok"
        names = [f"request {i}" for i in range(max_batch + 2)]  # more than run at once: some wait
        threads = [threading.Thread(target=post, args=(n, url)) for n in names]
        for i, t in enumerate(threads):
            t.start()
            _wait(lambda: _taken(worker) == i + 1)
        assert worker.queued >= 1
        release.set()
        for t in threads:
            t.join(10)
        assert [results[n].status_code for n in names] == [503] * len(names)
        health = httpx.get(f"{url}/health")
        assert health.status_code == 503 and "simulated crash" in health.json()["error"]
        after = httpx.post(f"{url}/v1/chat/completions", json={"model": "demo", "messages": MSG}, timeout=5)
        assert after.status_code == 503 and after.json()["error"]["code"] == "worker_dead"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_command_serves_and_stops_cleanly_on_sigterm_saving_its_memory(tmp_path):
    port = _free_port()
    env = {**os.environ, "SPECGEN_CACHE_DIR": str(tmp_path)}
    from specgen.engine.load.registry import bundled_path

    folder = bundled_path("stories260K")  # served by its path: listed by the folder's name
    proc = subprocess.Popen([sys.executable, "-m", "specgen", "serve", "-m", str(folder), "--port", str(port),
                             "--memory", "--draft", "4"], env=env, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, "the server did not start"
            time.sleep(0.1)
        assert [m.id for m in client(f"http://127.0.0.1:{port}").models.list()] == ["stories260K"]
        r = client(f"http://127.0.0.1:{port}").chat.completions.create(model="demo", messages=MSG, max_tokens=64)
        assert r.usage.completion_tokens == 64
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) in (0, -signal.SIGTERM)  # uvicorn re-raises the signal once shut down
    finally:
        proc.kill()
    log = proc.stderr.read()
    assert "1 prompt tokens" not in log and "tokens/step" in log  # one line per request
    assert "Application shutdown complete" in log
    assert len(list(Path(tmp_path).rglob("*.npz"))) == 1, log  # the memory, saved on the way out


def test_the_command_names_its_bad_flags_and_the_missing_extra(monkeypatch):
    from typer.testing import CliRunner

    from specgen.cli.commands import app

    for flags, named in ((["--port", "70000"], "--port"), (["--max-tokens", "0"], "--max-tokens"),
                         (["--max-queue", "-1"], "--max-queue"), (["--dtype", "int3"], "--dtype")):
        r = CliRunner().invoke(app, ["serve", "-m", "demo", *flags])
        assert r.exit_code == 2 and named in r.stderr, r.output  # a usage error
    monkeypatch.setitem(sys.modules, "uvicorn", None)  # as if the extra were not installed
    r = CliRunner().invoke(app, ["serve", "-m", "demo"])
    assert r.exit_code == 1 and "pip install 'specgen[serve]'" in r.stderr and len(r.stderr.splitlines()) == 1


@pytest.mark.parametrize("path,extra", [("/v1/chat/completions", {"messages": MSG, "max_tokens": 8}),
                                        ("/v1/messages", {"messages": MSG, "max_tokens": 8}),
                                        ("/v1/responses", {"input": "Once upon a time", "max_output_tokens": 8})])
def test_a_temperature_of_nan_is_named_as_not_a_number_and_top_p_0_is_greedy(served, path, extra):
    # NaN was "should be <= 2"; top_p 0 (a nucleus of no mass) sampled the whole distribution.
    r = httpx.post(f"{served}{path}", content=json.dumps({"model": "demo", "temperature": float("nan"), **extra}),
                   headers={"content-type": "application/json"}, timeout=30)
    assert r.status_code == 400 and "finite number" in r.text and "temperature" in r.text, r.text

    def text(**sampling):
        body = httpx.post(f"{served}{path}", json={"model": "demo", **extra, **sampling}, timeout=60).json()
        if "choices" in body:
            return body["choices"][0]["message"]["content"]
        return (body.get("content") or body["output"][0]["content"])[0]["text"]

    greedy = text(temperature=0)
    assert [text(temperature=1.0, top_p=0, seed=s) for s in (1, 2)] == [greedy, greedy]
    assert any(text(temperature=1.0, seed=s) != greedy for s in range(1, 9))  # (which top_p 0 stops)


def test_a_dropped_long_prompt_stops_within_a_prefill_chunk(paced_engine, demo_engine, monkeypatch):
    # Its prefill went on to the end after its client left (cancel was checked only once it was
    # done), and a small request behind it waited for all of it.
    from specgen.engine.decode import loop as decode

    monkeypatch.setattr(decode, "PREFILL_CHUNK", 32)  # 0.32 s of the paced model's prefill
    long_prompt = "Once upon a time there was a little dog. " * 40  # ~400 tokens: 4 s of prefill
    with running(paced_engine, max_batch=1) as (url, worker):
        with pytest.raises(httpx.TimeoutException):  # the client leaves 1 s into the prefill
            httpx.post(f"{url}/v1/completions", json={"model": "m", "prompt": long_prompt, "max_tokens": 1},
                       timeout=1.0)
        start = time.monotonic()
        small = httpx.post(f"{url}/v1/completions", json={"model": "m", "prompt": "Once", "max_tokens": 2},
                           timeout=30)
        waited = time.monotonic() - start
        assert small.status_code == 200 and waited < 2.0, waited  # (the rest of the prefill: 3 s)
        assert worker.cancelled == 1
        # what the cancelled prefill left is not kept as the prompt's cache: the prompt again is exact
        again = httpx.post(f"{url}/v1/completions", json={"model": "m", "prompt": long_prompt, "max_tokens": 4},
                           timeout=30).json()["choices"][0]["text"]
    expected = "".join(r.text for r in demo_engine.stream(Request(demo_engine.loaded.tokenizer.encode(long_prompt),
                                                                   Options(max_tokens=4))))
    assert again == expected
