"""Ollama's API on `specgen serve`, driven by the clients users run: the official `ollama` Python
package, LangChain's `ChatOllama` and the `ollama` npm package. Every route, streamed and not;
the text of /api/chat and /api/generate equals chat completions' and completions' for the same
conversation and settings; counts and durations as Ollama reports them; tools, `format` and
`options`; bad input a 400 (or Ollama's 404 for another model) in Ollama's shape, naming the field;
/metrics parsed by prometheus-client, its counters the sums of the responses' usage."""

import json
import os
import shutil
import subprocess
from pathlib import Path

import httpx
import jsonschema
import ollama
import pytest
from conftest import QUESTION, TOOLS, needs_smollm2, needs_tokenizers
from prometheus_client.parser import text_string_to_metric_families
from servers import client, running

AGENTS = Path(__file__).resolve().parents[2] / "agents"
ONCE = "Once upon a time"
HERO = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"}},
        "required": ["name", "age"], "additionalProperties": False}


@pytest.fixture(scope="module")
def demo(demo_engine):
    with running(demo_engine) as (url, _):
        yield url


def test_the_server_answers_as_ollama_does_to_a_client_looking_for_models(demo):
    assert httpx.get(demo).text == "Ollama is running" and httpx.head(demo).status_code == 200
    version = httpx.get(f"{demo}/api/version").json()["version"]
    assert [int(x) for x in version.split(".")] >= [0, 6, 4]  # clients gate tools on a dotted version
    c = ollama.Client(host=demo)
    (model,) = c.list().models
    assert model.model == "demo:latest" and model.size > 0 and len(model.digest) == 64
    assert model.details.family == "llama" and model.details.parameter_size == "260K"
    for name in ("demo", "demo:latest"):
        shown = c.show(name)
        assert shown.capabilities == ["completion"]  # no chat template: no tools
        assert shown.modelinfo["llama.context_length"] == 512 and shown.modelinfo["general.parameter_count"] > 0
    (resident,) = c.ps().models
    assert resident.model == "demo:latest" and resident.size_vram == model.size


def test_generate_is_completions_text_with_ollamas_counts_streamed_or_not(demo, demo_engine):
    c = ollama.Client(host=demo)
    options = {"num_predict": 24, "temperature": 0}
    whole = c.generate(model="demo", prompt=ONCE, raw=True, options=options)
    expected = client(demo).completions.create(model="demo", prompt=ONCE, max_tokens=24, temperature=0)
    assert whole.response == expected.choices[0].text and whole.done and whole.done_reason == "length"
    assert whole.eval_count == expected.usage.completion_tokens == 24
    assert whole.prompt_eval_count == expected.usage.prompt_tokens
    assert whole.total_duration >= whole.prompt_eval_duration + whole.eval_duration > 0
    assert whole.load_duration == 0  # the model was resident
    parts = list(c.generate(model="demo:latest", prompt=ONCE, raw=True, options=options, stream=True))
    assert "".join(p.response for p in parts) == whole.response
    assert [p.done for p in parts] == [False] * (len(parts) - 1) + [True] and parts[-1].eval_count == 24
    # `context` carries the conversation on: the next request continues from it
    more = c.generate(model="demo", prompt="", context=whole.context, raw=True, options=options)
    assert more.done_reason == "load"  # an empty prompt: Ollama's "load" answer
    went_on = c.generate(model="demo", prompt=" The", context=whole.context, raw=True, options=options)
    added = len(demo_engine.loaded.tokenizer.encode(" The"))
    assert went_on.prompt_eval_count == len(whole.context) + added and went_on.eval_count == 24


def test_options_are_honoured_or_refused_by_name(demo):
    c = ollama.Client(host=demo)
    stopped = c.generate(model="demo", prompt=ONCE, raw=True, options={"num_predict": 60, "stop": ["."]})
    assert "." not in stopped.response and stopped.done_reason == "stop"
    seeded = [c.generate(model="demo", prompt=ONCE, raw=True,
                         options={"num_predict": 16, "temperature": 0.9, "seed": 7, "top_k": 20}).response
              for _ in range(2)]
    assert seeded[0] == seeded[1]
    # placement options change no text and are accepted; no-op values of the others too
    placed = c.generate(model="demo", prompt=ONCE, raw=True, options={"num_predict": 8, "num_thread": 4, "num_gpu": 99,
                                                                     "repeat_penalty": 1.0, "mirostat": 0})
    assert placed.eval_count == 8
    for options, field in [({"repeat_penalty": 1.1}, "options.repeat_penalty"), ({"mirostat": 2}, "options.mirostat"),
                           ({"temperature": -1}, "options.temperature"), ({"num_predict": 8, "top_p": 2},
                                                                          "options.top_p"),
                           ({"bogus": 1}, "options.bogus"), ({"num_ctx": 3}, "options.num_ctx")]:
        with pytest.raises(ollama.ResponseError) as e:
            c.generate(model="demo", prompt=ONCE, raw=True, options=options)
        assert e.value.status_code == 400 and e.value.error.startswith(field), (options, e.value.error)


@pytest.mark.parametrize("body,status,words", [
    ({"model": "llama3", "prompt": ONCE}, 404, "model 'llama3' not found"),
    ({"model": "demo", "prompt": ONCE, "images": ["aGk="]}, 400, "images"),
    ({"model": "demo", "prompt": ONCE, "template": "{{ .Prompt }}"}, 400, "template"),
    ({"model": "demo", "prompt": ONCE, "suffix": "The end."}, 400, "suffix"),
    ({"model": "demo", "prompt": ONCE, "think": True}, 400, "think"),
    ({"model": "demo", "prompt": ONCE, "keep_alive": "soon"}, 400, "keep_alive"),
    ({"model": "demo", "prompt": ONCE, "format": {"type": "strin"}}, 400, "format"),
    ({"model": "demo", "prompt": ONCE, "stream": "yes"}, 400, "stream"),
    ({"model": "demo", "prompt": ONCE, "unknown": 1}, 400, "unknown"),
    ({"model": "demo", "prompt": ONCE, "context": [10**9]}, 400, "context"),
    ({"prompt": ONCE}, 400, "model"),
])
def test_bad_generate_requests_are_ollamas_errors_naming_the_field(demo, body, status, words):
    r = httpx.post(f"{demo}/api/generate", json=body, timeout=30)
    assert r.status_code == status and set(r.json()) == {"error"} and words in r.json()["error"], r.text


def test_bad_chat_requests_and_bodies_are_4xx_in_ollamas_shape(demo):
    for body, words in [({"model": "demo", "messages": [{"role": "robot", "content": "hi"}]}, "messages[0].role"),
                        ({"model": "demo", "messages": [{"role": "user", "content": "hi", "images": ["aGk="]}]},
                         "messages[0].images"),
                        ({"model": "nope:latest", "messages": []}, "model 'nope:latest' not found")]:
        r = httpx.post(f"{demo}/api/chat", json=body, timeout=30)
        assert 400 <= r.status_code < 500 and words in r.json()["error"], r.text
    broken = httpx.post(f"{demo}/api/chat", content=b'{"model": ', headers={"content-type": "application/json"})
    assert broken.status_code == 400 and "not valid JSON" in broken.json()["error"]
    assert httpx.post(f"{demo}/api/show", json={"model": "other"}).status_code == 404
    loaded = httpx.post(f"{demo}/api/chat", json={"model": "demo", "messages": []}).json()
    assert loaded["done"] and loaded["done_reason"] == "load"


@needs_smollm2
def test_chat_is_chat_completions_text_for_the_same_conversation(smollm2_engine):
    messages = [{"role": "system", "content": "You are brief."}, {"role": "user", "content": "Name three colours."}]
    with running(smollm2_engine, model_name="smollm2") as (url, _):
        c = ollama.Client(host=url)
        expected = client(url).chat.completions.create(model="smollm2", messages=messages, max_tokens=16, temperature=0)
        whole = c.chat(model="smollm2", messages=messages, options={"num_predict": 16, "temperature": 0})
        assert whole.message.content == expected.choices[0].message.content and whole.message.role == "assistant"
        assert (whole.eval_count, whole.prompt_eval_count) == (expected.usage.completion_tokens,
                                                               expected.usage.prompt_tokens)
        streamed = list(c.chat(model="smollm2:latest", messages=messages, options={"num_predict": 16}, stream=True))
        assert "".join(p.message.content for p in streamed) == whole.message.content
        # `format`: a JSON schema holds the answer, as response_format does on chat completions
        ask = [{"role": "user", "content": "Describe a hero as JSON with a name and an age."}]
        shaped = c.chat(model="smollm2", messages=ask, format=HERO, options={"num_predict": 60})
        jsonschema.validate(json.loads(shaped.message.content), HERO)
        same = client(url).chat.completions.create(model="smollm2", messages=ask, max_tokens=60, response_format={
            "type": "json_schema", "json_schema": {"name": "hero", "schema": HERO}})
        assert same.choices[0].message.content == shaped.message.content
        loose = c.chat(model="smollm2", messages=ask, format="json", options={"num_predict": 60})
        assert isinstance(json.loads(loose.message.content), dict)
        # LangChain's ChatOllama, as an application would point it at the server
        from langchain_ollama import ChatOllama

        llm = ChatOllama(model="smollm2", base_url=url, temperature=0, num_predict=16)
        said = llm.invoke([("system", "You are brief."), ("human", "Name three colours.")])
        assert said.content == whole.message.content
        assert said.usage_metadata["output_tokens"] == whole.eval_count


@needs_tokenizers
def test_tool_calls_come_as_ollama_returns_them(tool_engine):
    with running(tool_engine, model_name="tools") as (url, _):
        c = ollama.Client(host=url)
        assert "tools" in c.show("tools").capabilities
        whole = c.chat(model="tools", messages=QUESTION, tools=TOOLS)
        (call,) = whole.message.tool_calls
        assert (call.function.name, call.function.arguments) == ("get_weather", {"city": "Paris"})
        assert whole.message.content == "Let me check." and whole.done_reason == "stop"
        lines = list(c.chat(model="tools", messages=QUESTION, tools=TOOLS, stream=True))
        calls = [i for i, p in enumerate(lines) if p.message.tool_calls]
        assert calls == [len(lines) - 2] and lines[-1].done  # the call in a line before the last
        # the call and its result go back, arguments as objects
        follow = QUESTION + [whole.message.model_dump(exclude_none=True),
                             {"role": "tool", "content": "18 C, sunny", "tool_name": "get_weather"}]
        after = c.chat(model="tools", messages=follow, tools=TOOLS, options={"num_predict": 4})
        assert after.prompt_eval_count > whole.prompt_eval_count
        from langchain_ollama import ChatOllama

        bound = ChatOllama(model="tools", base_url=url).bind_tools(TOOLS)
        said = bound.invoke([("human", QUESTION[0]["content"])])
        assert [(t["name"], t["args"]) for t in said.tool_calls] == [("get_weather", {"city": "Paris"})]


JS = """
const { Ollama } = require('ollama');
const o = new Ollama({ host: process.argv[1] });
(async () => {
  const tags = await o.list();
  const whole = await o.generate({ model: 'demo', prompt: 'Once upon a time', raw: true,
                                   options: { num_predict: 20, temperature: 0 } });
  let streamed = '';
  for await (const part of await o.chat({ model: 'demo:latest', stream: true, options: { num_predict: 12 },
                                         messages: [{ role: 'user', content: 'Once upon a time' }] })) {
    streamed += part.message.content;
  }
  const chat = await o.chat({ model: 'demo', messages: [{ role: 'user', content: 'Once upon a time' }],
                              options: { num_predict: 12 } });
  let error = null;
  try { await o.generate({ model: 'other', prompt: 'x' }); } catch (e) { error = [e.status_code, e.error]; }
  console.log(JSON.stringify({ names: tags.models.map(m => m.name), whole: whole.response,
                               eval_count: whole.eval_count, streamed, chat: chat.message.content, error }));
})();
"""


@pytest.fixture(scope="session")
def ollama_js() -> str:
    """The node_modules folder holding the pinned `ollama` npm package (tests/agents/install_clients.sh)."""
    if shutil.which("npm") is None or shutil.which("node") is None:
        pytest.skip("the ollama npm package installs with npm (Node.js 18 or later)")
    done = subprocess.run(["bash", str(AGENTS / "install_clients.sh")], capture_output=True, text=True, timeout=1800,
                          check=False)
    assert done.returncode == 0, done.stderr
    return dict(line.split(" ", 1) for line in done.stdout.splitlines())["ollama-js"]


def test_the_npm_client_reads_the_same_answers(demo, ollama_js):
    done = subprocess.run(["node", "-e", JS, demo], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "NODE_PATH": ollama_js})
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    c = ollama.Client(host=demo)
    assert got["names"] == ["demo:latest"] and got["error"] == [404, "model 'other' not found"]
    assert got["whole"] == c.generate(model="demo", prompt=ONCE, raw=True, options={"num_predict": 20}).response
    assert got["eval_count"] == 20
    chat = c.chat(model="demo", messages=[{"role": "user", "content": ONCE}], options={"num_predict": 12})
    assert got["streamed"] == got["chat"] == chat.message.content


def metrics(url: str, **headers) -> dict:
    """Every sample of /metrics, parsed by prometheus-client: {(name, labels but model_name): value}."""
    r = httpx.get(f"{url}/metrics", headers=headers)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain"), r.text
    return {(s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k != "model_name"))): s.value
            for family in text_string_to_metric_families(r.text) for s in family.samples}


def test_metrics_are_the_sums_of_the_responses_usage(demo_engine):
    with running(demo_engine, api_key="sk-test") as (url, _):
        assert httpx.get(f"{url}/metrics").status_code == 401  # behind the key, as the APIs are
        key = {"Authorization": "Bearer sk-test"}
        before = metrics(url, **key)
        c = client(url, api_key="sk-test")
        answers = [c.completions.create(model="demo", prompt=p, max_tokens=n)
                   for p, n in ((ONCE, 40), ("The little dog", 30), (ONCE, 20))]
        answers.append(c.chat.completions.create(model="demo", messages=[{"role": "user", "content": ONCE}],
                                                 max_tokens=25, stop=["."]))
        after = metrics(url, **key)

        def grew(name, **labels):
            k = (name, tuple(sorted(labels.items())))
            return after.get(k, 0) - before.get(k, 0)

        assert grew("specgen:prompt_tokens_total") == sum(a.usage.prompt_tokens for a in answers)
        assert grew("specgen:generation_tokens_total") == sum(a.usage.completion_tokens for a in answers)
        assert grew("specgen:request_success_total", finished_reason="length") == 3
        assert grew("specgen:prefix_cache_hits_total") == sum(a.usage.prompt_tokens_details.cached_tokens
                                                              for a in answers) > 0
        drafted, accepted = grew("specgen:spec_decode_num_draft_tokens_total"), \
            grew("specgen:spec_decode_num_accepted_tokens_total")
        assert 0 <= accepted <= drafted and accepted == sum(a.model_extra["specgen"]["accepted"] for a in answers)
        by_position = [grew("specgen:spec_decode_num_accepted_tokens_per_pos_total", position=str(p)) for p in range(64)]
        assert sum(by_position) == accepted and by_position == sorted(by_position, reverse=True)
        assert grew("specgen:time_to_first_token_seconds_count") == 4
        assert after[("specgen:num_requests_running", ())] == after[("specgen:num_requests_waiting", ())] == 0
