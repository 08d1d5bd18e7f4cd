"""Several models on one server: each answers by name with its own text, loads when first asked
for (its wait in `load_duration`), unloads after its keep-alive or when --max-models needs room
(the least recently used idle one, never one in flight), and a model that cannot load is that
request's error alone."""

import gc
import signal
import threading
import time
import weakref

import httpx
import ollama
import pytest
from conftest import save_tiny
from servers import client, running, serving

from specgen.engine.engine import Engine, Request
from specgen.engine.options import Options

ONCE = "Once upon a time"


@pytest.fixture(scope="module")
def other(tmp_path_factory) -> str:
    """A random-weight llama with the demo's tokenizer: its own text for any prompt."""
    return str(save_tiny("llama", tmp_path_factory.mktemp("models") / "other", seed=3))


def alone(spec: str, prompt: str, n: int) -> str:
    engine = Engine.load(spec)
    return "".join(r.text for r in engine.stream(Request(engine.loaded.tokenizer.encode(prompt),
                                                         Options(max_tokens=n, draft=0))))


class Loads:
    """A loader that counts its loads and keeps a weak reference to what it loaded."""

    def __init__(self):
        self.specs, self.loaded = [], []

    def __call__(self, spec: str) -> Engine:
        self.specs.append(spec)
        engine = Engine.load(spec)
        self.loaded.append(weakref.ref(engine.loaded.model))
        return engine


def ps(url: str) -> list[str]:
    return [m.model for m in ollama.Client(host=url).ps().models]


def test_each_model_answers_by_name_loaded_when_first_asked_for(demo_engine, other):
    loads = Loads()
    with running(demo_engine, load=loads, model="demo", others=(("other", other),)) as (url, _):
        c = ollama.Client(host=url)
        assert [m.model for m in c.list().models] == ["demo:latest", "other:latest"]
        assert [m.id for m in client(url).models.list().data] == ["demo", "other"]
        assert ps(url) == ["demo:latest"] and loads.specs == []
        # two requests at once for a model not loaded yet: one load, both wait for it
        got = {}
        threads = [threading.Thread(target=lambda i=i: got.__setitem__(i, c.generate(
            model="other", prompt=ONCE, raw=True, options={"num_predict": 12}))) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert loads.specs == [other] and got[0].response == got[1].response == alone(other, ONCE, 12)
        assert max(g.load_duration for g in got.values()) > 0
        again = c.generate(model="other:latest", prompt=ONCE, raw=True, options={"num_predict": 12})
        assert again.load_duration == 0 and again.response == got[0].response
        assert got[0].response != c.generate(model="demo", prompt=ONCE, raw=True, options={"num_predict": 12}).response
        assert sorted(ps(url)) == ["demo:latest", "other:latest"]
        # OpenAI's routes: a served model by name, any other name the default
        named = client(url).completions.create(model="other", prompt=ONCE, max_tokens=12).choices[0].text
        default = client(url).completions.create(model="gpt-4o", prompt=ONCE, max_tokens=12).choices[0].text
        assert named == got[0].response and default == alone("demo", ONCE, 12)
        health = httpx.get(f"{url}/health").json()
        assert health["status"] == "ok" and sorted(health["models"]) == ["demo", "other"]


def test_max_models_unloads_the_least_recently_used_and_the_memory_goes(demo_engine, other):
    loads = Loads()
    with running(demo_engine, load=loads, model="demo", others=(("other", other),), max_models=1) as (url, _):
        c = ollama.Client(host=url)
        assert c.generate(model="other", prompt=ONCE, raw=True, options={"num_predict": 4}).eval_count == 4
        assert ps(url) == ["other:latest"]  # demo unloaded to make room
        reloaded = c.generate(model="demo", prompt=ONCE, raw=True, options={"num_predict": 4})
        assert ps(url) == ["demo:latest"] and reloaded.load_duration > 0 and loads.specs == [other, "demo"]
        gc.collect()
        assert loads.loaded[0]() is None  # nothing holds the unloaded model's weights


def gone(url: str, name: str, within: float = 10.0) -> bool:
    """Whether `name` leaves /api/ps within `within` seconds."""
    deadline = time.monotonic() + within
    while f"{name}:latest" in ps(url):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def test_a_requests_keep_alive_overrides_the_servers(demo_engine, other):
    with running(demo_engine, load=Loads(), model="demo", others=(("other", other),), keep_alive_s=None) as (url, _):
        c = ollama.Client(host=url)
        c.generate(model="other", prompt=ONCE, raw=True, options={"num_predict": 4}, keep_alive=0)
        assert gone(url, "other") and ps(url) == ["demo:latest"]  # 0: right after; the server's never
    with running(demo_engine, load=Loads(), model="demo", others=(("other", other),), keep_alive_s=0.5) as (url, _):
        c = ollama.Client(host=url)
        c.generate(model="other", prompt=ONCE, raw=True, options={"num_predict": 4}, keep_alive="-1")
        (kept,) = [m for m in c.ps().models if m.model == "other:latest"]
        assert kept.expires_at.year > 2100
        time.sleep(1.5)
        assert "other:latest" in ps(url)  # -1: never, where the server's would have unloaded it
        c.generate(model="other", prompt=ONCE, raw=True, options={"num_predict": 4})  # the server's again
        assert gone(url, "other")
        c.generate(model="other", prompt="")  # no prompt: loads it, as Ollama does...
        assert "other:latest" in ps(url)
        unloaded = c.generate(model="other", prompt="", keep_alive=0)  # ...and with keep_alive 0 unloads it
        assert unloaded.done_reason == "unload" and "other:latest" not in ps(url)


def test_a_model_that_cannot_load_is_that_requests_error(demo_engine, tmp_path):
    with running(demo_engine, load=Loads(), model="demo", others=(("broken", str(tmp_path / "nothing")),)) as (url, _):
        r = httpx.post(f"{url}/api/generate", json={"model": "broken", "prompt": ONCE}, timeout=30)
        assert r.status_code == 500 and "model 'broken' could not be loaded" in r.json()["error"], r.text
        r = httpx.post(f"{url}/v1/completions", json={"model": "broken", "prompt": ONCE, "max_tokens": 2})
        assert r.status_code == 500 and r.json()["error"]["type"] == "server_error"
        ok = ollama.Client(host=url).generate(model="demo", prompt=ONCE, raw=True, options={"num_predict": 4})
        assert ok.eval_count == 4 and httpx.get(f"{url}/health").status_code == 200


def test_specgen_ps_shows_what_a_running_server_holds(demo_engine, other):
    from typer.testing import CliRunner

    from specgen.cli.commands import app

    with running(demo_engine, load=Loads(), model="demo", others=(("other", other),), api_key="sk-ps") as (url, _):
        ollama.Client(host=url, headers={"Authorization": "Bearer sk-ps"}).generate(
            model="other", prompt=ONCE, options={"num_predict": 2}, keep_alive="-1")
        shown = CliRunner().invoke(app, ["ps", "--url", url, "--api-key", "sk-ps"])
        assert shown.exit_code == 0, shown.output
        header, *rows = shown.stdout.splitlines()
        assert header.split() == ["NAME", "SIZE", "CONTEXT", "UNTIL"]
        assert sorted(r.split()[0] for r in rows) == ["demo:latest", "other:latest"]
        assert any(r.startswith("other:latest") and r.endswith("forever") for r in rows)
        refused = CliRunner().invoke(app, ["ps", "--url", url])
        assert refused.exit_code == 1 and "answered 401" in refused.stderr
    gone = CliRunner().invoke(app, ["ps", "--url", url])
    assert gone.exit_code == 1 and "no server at" in gone.stderr


def test_a_shutdown_during_a_load_answers_its_waiting_request_and_waits_for_the_load(
        demo_engine, other, monkeypatch):
    # A load cannot be interrupted: a server that exited with one running in a thread (MLX
    # calibrating) could abort; its waiting request was cancelled at the grace period's end, a 500.
    import specgen.serve
    from specgen.serve import models

    monkeypatch.setattr(specgen.serve, "GRACE_S", 1.0)
    monkeypatch.setattr(models, "STOP_S", 0.5)  # past it, the server's exit waits for the load
    began, ended = threading.Event(), []

    def slow(spec: str) -> Engine:
        began.set()
        time.sleep(2.5)  # longer than the grace period
        engine = Engine.load(spec)
        ended.append(time.monotonic())
        return engine

    got = {}
    with serving(demo_engine, load=slow, model="demo", others=(("other", other),)) as (url, server):
        asked = threading.Thread(target=lambda: got.update(r=httpx.post(
            f"{url}/v1/completions", json={"model": "other", "prompt": ONCE, "max_tokens": 4}, timeout=30)))
        asked.start()
        assert began.wait(30)
        stop = time.monotonic()
        server.handle_exit(signal.SIGTERM, None)
        asked.join(30)
        answered = time.monotonic()
    stopped = time.monotonic()
    r = got["r"]
    assert r.status_code == 503 and r.json()["error"]["code"] == "shutting_down"
    assert answered - stop < 1.0  # at once, not when the load or the grace period ends
    assert ended and ended[0] < stopped  # the server ended after the load did
