"""Starting a real specgen server in tests: uvicorn on a free loopback port, in a thread, always stopped;
the official clients pointed at it; an error read in its API's shape."""

import contextlib
import threading
import time

import anthropic
import httpx
import openai

from specgen.serve import ServeConfig, make_server


@contextlib.contextmanager
def running(engine, **settings):
    """Serve `engine` on 127.0.0.1 (a port the OS picks); yields (base URL, the app's worker)."""
    config = ServeConfig(**{"model_name": "demo", **settings})
    server = make_server(engine, config, "127.0.0.1", 0, log_level="warning")
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not server.started:
            assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
            time.sleep(0.02)
        port = server.servers[0].sockets[0].getsockname()[1]
        yield f"http://127.0.0.1:{port}", server.config.app.state.worker
    finally:
        server.should_exit = True
        thread.join(30)
        assert not thread.is_alive(), "the server did not stop"


def client(url: str, **kw) -> openai.OpenAI:
    """The official client, as an application would point it at the server."""
    return openai.OpenAI(base_url=f"{url}/v1", api_key=kw.pop("api_key", "unused"), max_retries=0, **kw)


def anthropic_client(url: str, **kw) -> anthropic.Anthropic:
    """Anthropic's official client, pointed at the server as Claude Code is (no /v1 in the URL)."""
    return anthropic.Anthropic(base_url=url, api_key=kw.pop("api_key", "unused"), max_retries=0, **kw)


def leave_mid_stream(url: str, worker, path: str, body: dict, lines: int) -> int:
    """Stream `body` to `path`, leave after `lines` lines; how many more jobs the worker has
    cancelled 5 s later (or as soon as it has cancelled one)."""
    before = worker.cancelled
    with httpx.stream("POST", url + path, json={**body, "stream": True}, timeout=30) as r:
        read = r.iter_lines()
        for _ in range(lines):
            next(read)
    deadline = time.monotonic() + 5
    while worker.cancelled == before and time.monotonic() < deadline:
        time.sleep(0.01)
    return worker.cancelled - before


def error_message(path: str, r: httpx.Response, param: str | None = None) -> str:
    """The message of `r`, a 4xx in the error shape of the API `path` belongs to (Anthropic's under
    /v1/messages, OpenAI's elsewhere); with `param`, the error must name it first."""
    assert 400 <= r.status_code < 500, (r.status_code, r.text)
    body = r.json()
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
