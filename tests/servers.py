"""Starting a real specgen server in tests: uvicorn on a free loopback port, in a thread, always stopped;
the official clients pointed at it; the worker's counts read from /health; an error read in its API's
shape."""

import contextlib
import threading
import time

import anthropic
import httpx
import openai
from conftest import Paced

from specgen.serve import ServeConfig, make_server


@contextlib.contextmanager
def serving(engine, load=None, **settings):
    """Serve `engine` on 127.0.0.1 (a port the OS picks; `load` loads config.others); yields
    (base URL, the uvicorn server), and stops it on the way out."""
    config = ServeConfig(**{"model_name": "demo", **settings})
    server = make_server(engine, config, "127.0.0.1", 0, log_level="warning", load=load)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not server.started:
            assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
            time.sleep(0.02)
        yield f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}", server
    finally:
        server.should_exit = True
        thread.join(30)
        assert not thread.is_alive(), "the server did not stop"


@contextlib.contextmanager
def running(engine, load=None, **settings):
    """Serve `engine` as `serving` does; yields (base URL, the app's worker)."""
    with serving(engine, load, **settings) as (url, server):
        if isinstance(engine.loaded.model, Paced):
            # One request at full speed first: the curves this server's batch size prices drafts
            # by are measured then (if not yet), not under the sleeps.
            with engine.loaded.model.paused():
                r = httpx.post(f"{url}/v1/completions", json={"model": "m", "prompt": "Once", "max_tokens": 2},
                               timeout=120)
                assert r.status_code == 200, r.text
        models = server.config.app.state.models
        yield url, models.resident[models.default].worker


def client(url: str, **kw) -> openai.OpenAI:
    """The official client, as an application would point it at the server."""
    return openai.OpenAI(base_url=f"{url}/v1", api_key=kw.pop("api_key", "unused"), max_retries=0, **kw)


def anthropic_client(url: str, **kw) -> anthropic.Anthropic:
    """Anthropic's official client, pointed at the server as Claude Code is (no /v1 in the URL)."""
    return anthropic.Anthropic(base_url=url, api_key=kw.pop("api_key", "unused"), max_retries=0, **kw)


def health(url: str) -> dict:
    """GET /health: the worker's counts of jobs served, cancelled and failed, whether one is
    running, and how many are queued."""
    r = httpx.get(f"{url}/health", timeout=10)
    assert r.status_code == 200, r.text
    return r.json()


def settled(url: str, before: dict, jobs: int, timeout: float = 30.0) -> dict:
    """How many more jobs than `before` (a /health answer) /health counts as served, cancelled
    and failed, once it counts `jobs` more in all and runs and queues none (or after `timeout`)."""
    deadline = time.monotonic() + timeout
    while True:
        now = health(url)
        done = {k: now[k] - before[k] for k in ("served", "cancelled", "failed")}
        idle = not now["running"] and not now["queued"]
        if (sum(done.values()) >= jobs and idle) or time.monotonic() > deadline:
            return done
        time.sleep(0.02)


CANCELLED = {"served": 0, "cancelled": 1, "failed": 0}  # one job, stopped before its end


def leave_mid_stream(url: str, path: str, body: dict, lines: int) -> dict:
    """Stream `body` to `path` and leave after `lines` lines; then `settled`'s counts for the job.
    A job counts as cancelled only if it stopped before its answer's end: given an answer that
    lasts longer than it takes the server to notice (paced_engine), it is CANCELLED only if the
    server noticed the client leave, and served if it did not."""
    before = health(url)
    with httpx.stream("POST", url + path, json={**body, "stream": True}, timeout=30) as r:
        assert r.status_code == 200, r.read()
        read = r.iter_lines()
        for _ in range(lines):
            next(read)
    return settled(url, before, jobs=1)


def error_message(path: str, r: httpx.Response, param: str | None = None) -> str:
    """The message of `r`, a 4xx in the error shape of the API `path` belongs to (Anthropic's under
    /v1/messages, Ollama's under /api/, OpenAI's elsewhere); with `param`, the error must name it first."""
    assert 400 <= r.status_code < 500, (r.status_code, r.text)
    body = r.json()
    if path.startswith("/api/"):
        assert set(body) == {"error"} and isinstance(body["error"], str) and body["error"], body
        return body["error"]
    if path.startswith("/v1/messages"):
        assert body["type"] == "error" and set(body) == {"type", "error"}, body
        assert set(body["error"]) == {"type", "message"} and isinstance(body["error"]["type"], str), body
    else:
        assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, body
        assert isinstance(body["error"]["type"], str), body
        if param is not None:
            assert body["error"]["param"] == param, body
    message = body["error"]["message"]
    assert isinstance(message, str) and message, body
    if param is not None:
        assert message.startswith(f"{param}: "), body
    return message
