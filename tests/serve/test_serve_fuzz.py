"""`specgen serve` fuzzed: valid requests to every route, mutated, sent to a real server over one
keep-alive connection: every value of every seed request replaced in turn by each of a few of the
wrong kind (null, a list, an object, a `type` that is a list, a lone surrogate, a huge or negative
number), then Hypothesis's mutations (any value replaced by one of the wrong kind, NaN, a list or
an object where a string belongs, or random JSON; a field dropped or one added; several at once).
Whatever the body, the answer is never a 5xx, a 4xx is in its API's error shape and names its
field first, the same connection then answers the next request, and the worker is alive at the end.

Bounded for the suite (the demo model, its context cut to 48 tokens so no answer runs long, a
fixed number of examples, the same ones every run); `SPECGEN_FUZZ=2000` runs that many new random
ones per route.
"""

import copy
import json
import os

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from servers import error_message, running

DEEP = int(os.environ.get("SPECGEN_FUZZ", "0"))  # examples per route of a deeper run, new ones each time
BOUNDED = settings(max_examples=DEEP or 45, derandomize=not DEEP, deadline=None, database=None,
                   suppress_health_check=list(HealthCheck))

MSG = [{"role": "user", "content": "Once upon a time"}]
TOOL = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
CHAT = {"model": "demo", "max_tokens": 2, "temperature": 0.5, "top_p": 0.9, "top_k": 5, "min_p": 0.1,
        "seed": 1, "stop": ["zz"], "stream": True, "stream_options": {"include_usage": True}, "n": 1,
        "user": "u", "prediction": {"type": "content", "content": "there was"}, "metadata": {"k": "v"},
        "messages": [{"role": "system", "content": [{"type": "text", "text": "Be brief."}]}, *MSG,
                     {"role": "assistant", "content": None, "tool_calls": [
                         {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
                     {"role": "tool", "tool_call_id": "c1", "content": "18 C"}]}
USE = {"type": "tool_use", "id": "t1", "name": "f", "input": {"city": "Paris"}}
RESULT = {"type": "tool_result", "tool_use_id": "t1", "is_error": False,
          "content": [{"type": "text", "text": "18 C"}]}
THINKING = {"type": "thinking", "thinking": "t", "signature": "s"}
MESSAGES = {"model": "claude", "max_tokens": 2, "stream": True, "temperature": 0.5, "top_k": 4,
            "stop_sequences": ["zz"], "metadata": {"user_id": "u"},
            "system": [{"type": "text", "text": "Hi."}], "tool_choice": {"type": "auto"},
            "tools": [{"name": "f", "description": "d", "input_schema": TOOL}],
            "messages": [*MSG, {"role": "assistant", "content": [THINKING, USE]},
                         {"role": "user", "content": [RESULT]}]}
RESPONSES = {"model": "gpt-5", "max_output_tokens": 2, "stream": True, "instructions": "Be brief.",
             "temperature": 0.5, "text": {"format": {"type": "text"}}, "parallel_tool_calls": False,
             "metadata": {"k": "v"},
             "tools": [{"type": "function", "name": "f", "parameters": TOOL},
                       {"type": "custom", "name": "g", "format": {"type": "grammar", "definition": "s"}},
                       {"type": "namespace", "name": "n", "tools": [{"type": "function", "name": "h"}]}],
             "input": [{"type": "message", "role": "developer",
                        "content": [{"type": "input_text", "text": "Hi."}]},
                       {"role": "user", "content": "Once upon a time"},
                       {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
                       {"type": "function_call_output", "call_id": "c1", "output": "18 C"},
                       {"type": "reasoning", "id": "rs_1", "summary": []}]}
OLLAMA_CHAT = {"model": "demo", "stream": True, "keep_alive": -1, "format": "",
               "options": {"num_predict": 2, "temperature": 0.5, "top_k": 4, "top_p": 0.9, "min_p": 0.1, "seed": 1,
                           "stop": ["zz"]},
               "messages": [{"role": "system", "content": "Be brief."}, *MSG,
                            {"role": "assistant", "content": "there was"}, {"role": "user", "content": "And?"}]}
SEEDS = {  # valid bodies for each route, the first a plain one, the others with every kind of part taken
    "/v1/chat/completions": [{"model": "demo", "messages": MSG, "max_tokens": 2}, CHAT],
    "/v1/completions": [{"model": "demo", "prompt": "Once upon a time", "max_tokens": 2},
                        {"model": "demo", "prompt": [[1, 2, 3]], "max_tokens": 2, "stop": "zz",
                         "stream": True}],
    "/v1/messages": [{"model": "claude", "max_tokens": 2, "messages": MSG}, MESSAGES],
    "/v1/messages/count_tokens": [{"model": "claude", "messages": MSG, "system": "Be brief."}],
    "/v1/responses": [{"model": "gpt-5", "input": "Once upon a time", "max_output_tokens": 2}, RESPONSES],
    "/api/chat": [{"model": "demo", "messages": MSG, "options": {"num_predict": 2}, "stream": False}, OLLAMA_CHAT],
    "/api/generate": [{"model": "demo", "prompt": "Once upon a time", "options": {"num_predict": 2}},
                      {"model": "demo:latest", "prompt": "Once", "raw": True, "context": [1, 403], "stream": False,
                       "keep_alive": "5m", "options": {"num_predict": 2, "stop": "zz", "num_ctx": 40, "num_thread": 2,
                                                       "repeat_penalty": 1.0}}],
    "/api/show": [{"model": "demo"}],
}
WRONG = [None, True, False, 0, -1, 1.5, 2**31, 2**63, -(2**63), 10**400, 1e308, float("nan"), float("inf"),
         "", "5", "\ud800", "a\udfffb", "x" * 3000, [], {}, [[]], [None], {"type": []}, {"type": {}},
         {"type": "text"}]
JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner,
                                                                                 max_size=3),
                    max_leaves=6)
VALUES = (st.sampled_from(WRONG) | JSON).map(copy.deepcopy)  # fresh: later mutations may change them in place
NAMES = st.sampled_from(["type", "text", "content", "model", "stream", "max_tokens", "tools", "input", "x"])


def _places(value):
    """Every (container, key) in a JSON value."""
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        yield value, key
        yield from _places(item)


@st.composite
def mutated(draw, path: str):
    body = copy.deepcopy(draw(st.sampled_from(SEEDS[path])))
    for _ in range(draw(st.integers(1, 3))):
        places = list(_places(body))
        if not places:
            break
        container, key = draw(st.sampled_from(places))
        how = draw(st.sampled_from(["replace", "replace", "drop", "add"]))
        if how == "replace":
            container[key] = draw(VALUES)
        elif how == "drop":
            del container[key]
        elif isinstance(container, dict):
            container[draw(NAMES | st.text(max_size=6))] = draw(VALUES)
        else:
            container.insert(key, draw(VALUES))
    return draw(st.sampled_from([body] * 9 + [[body], draw(VALUES)]))  # now and then, no object at all


@pytest.fixture(scope="module")
def http(demo_engine):
    with pytest.MonkeyPatch.context() as m:
        m.setattr(demo_engine.loaded, "context_length", 48)  # every answer short, whatever max_tokens says
        with running(demo_engine) as (url, worker), httpx.Client(base_url=url, timeout=60) as client:
            yield client
            health = client.get("/health")
            assert health.status_code == 200 and worker.dead is None, health.text


def _send(http: httpx.Client, path: str, body) -> httpx.Response:
    # json.dumps writes NaN and lone surrogates (escaped), which no strict encoder would
    return http.post(path, content=json.dumps(body), headers={"content-type": "application/json"})


def _wrong(path: str, r: httpx.Response) -> str | None:
    """What is wrong with `r` as an answer to any body (None: nothing)."""
    if r.status_code >= 500:
        return f"{r.status_code}: {r.text[:200]}"
    if r.status_code >= 400:
        try:
            param = None if path.startswith(("/v1/messages", "/api/")) else r.json()["error"]["param"]
            error_message(path, r, param)
        except (AssertionError, ValueError, KeyError, TypeError) as e:
            return f"{r.status_code} not in the API's error shape ({e!r}): {r.text[:200]}"
    return None


SWEEP = [None, [], {}, {"type": []}, "\ud800", 2**63, -1]


@pytest.mark.parametrize("path", list(SEEDS))
def test_every_value_of_the_wrong_kind_is_a_4xx_and_the_connection_lives(http, path):
    wrong = []
    for seed in SEEDS[path]:
        for n in range(len(list(_places(seed)))):
            for value in SWEEP:
                body = copy.deepcopy(seed)
                container, key = list(_places(body))[n]
                container[key] = value
                r = _send(http, path, body)
                r.read()
                problem = _wrong(path, r)
                if problem or http.get("/health").status_code != 200:
                    wrong.append(f"{json.dumps(body)[:300]} -> {problem or 'the connection died'}")
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("path,body", [(p, b) for p, bodies in SEEDS.items() for b in bodies])
def test_every_seed_is_served(http, path, body):
    r = _send(http, path, body)
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("path", list(SEEDS))
def test_a_mutated_request_is_never_a_5xx_and_the_connection_lives(http, path):
    @BOUNDED
    @given(body=mutated(path))
    def check(body):
        r = _send(http, path, body)
        r.read()  # a stream, to its end
        assert _wrong(path, r) is None, (json.dumps(body)[:300], _wrong(path, r))
        after = _send(http, path, SEEDS[path][0])
        assert after.status_code == 200, (body, after.text)

    check()
