"""Starting a real specgen server in tests: uvicorn on a free loopback port, in a thread, always stopped."""

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
