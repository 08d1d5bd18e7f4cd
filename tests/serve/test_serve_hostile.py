"""`specgen serve` against hostile requests (issue 44), on a real server through real HTTP clients:
a `type` or `text.format` of the wrong kind is a 400 naming it, never a 500 and a reset connection;
the limits on one request's work; what Anthropic's and OpenAI's APIs refuse is refused here too;
any model name is served on every route; a 401 a browser can read; a key no request could match
refused at start; a chunked body over the limit a 413 and a head over the limit a 431; a lone
surrogate named as such; and Messages saying when the context, not max_tokens, ended the answer.
"""

import json
import time

import httpx
import pytest
from servers import error_message, running

MSG = [{"role": "user", "content": "Once upon a time"}]
CHAT = {"model": "demo", "messages": MSG, "max_tokens": 2}
COMPLETION = {"model": "demo", "prompt": "Once upon a time", "max_tokens": 2}
MESSAGES = {"model": "claude", "max_tokens": 2, "messages": MSG}
COUNT = {"model": "claude", "messages": MSG}
RESPONSES = {"model": "gpt-5", "input": "Once upon a time", "max_output_tokens": 2}
VALID = {"/v1/chat/completions": CHAT, "/v1/completions": COMPLETION, "/v1/messages": MESSAGES,
         "/v1/messages/count_tokens": COUNT, "/v1/responses": RESPONSES}


@pytest.fixture(scope="module")
def served(demo_engine):
    with running(demo_engine) as (url, _), httpx.Client(base_url=url, timeout=30) as http:
        yield http


def post(http: httpx.Client, path: str, body: dict) -> httpx.Response:
    # json.dumps escapes lone surrogates, which httpx's own encoder cannot send
    return http.post(path, content=json.dumps(body), headers={"content-type": "application/json"})


def refused(http: httpx.Client, path: str, body: dict, param: str) -> str:
    """`body` is a 400 naming `param` in the shape of `path`'s API, and the same connection then
    serves a valid request; the error's message."""
    r = post(http, path, body)
    assert r.status_code == 400, r.text
    message = error_message(path, r, param)
    after = post(http, path, VALID[path])
    assert after.status_code == 200, after.text
    return message


def said(path: str, content) -> dict:
    """A valid request to `path` whose one user message says `content`."""
    key = "input" if path == "/v1/responses" else "messages"
    return {**VALID[path], key: [{"role": "user", "content": content}]}


KINDS = [  # a `type` that is a list or an object, and a text.format that is no object (finding 1)
    ("/v1/messages", said("/v1/messages", [{"type": [], "text": "hi"}]), "messages[0].content[0].type"),
    ("/v1/messages", {**MESSAGES, "system": [{"type": {}, "text": "hi"}]}, "system[0].type"),
    ("/v1/messages/count_tokens", said("/v1/messages/count_tokens", [{"type": ["text"], "text": "hi"}]),
     "messages[0].content[0].type"),
    ("/v1/responses", {**RESPONSES, "input": [{"type": [], "role": "user", "content": "hi"}]},
     "input[0].type"),
    ("/v1/responses", {**RESPONSES, "tools": [{"type": {"a": 1}, "name": "f"}]}, "tools[0].type"),
    ("/v1/chat/completions", said("/v1/chat/completions", [{"type": [], "text": "hi"}]),
     "messages[0].content[0].type"),
    ("/v1/responses", {**RESPONSES, "text": {"format": "json"}}, "text.format"),
    ("/v1/responses", {**RESPONSES, "text": {"format": 5}}, "text.format"),
    ("/v1/responses", {**RESPONSES, "text": {"format": True}}, "text.format"),
]


@pytest.mark.parametrize("path,body,param", KINDS, ids=[f"{i}-{c[2]}" for i, c in enumerate(KINDS)])
def test_a_type_of_the_wrong_kind_is_a_400_naming_it_and_the_connection_lives(served, path, body, param):
    refused(served, path, body, param)


def _tool(path: str, schema: dict) -> dict:
    if path == "/v1/chat/completions":
        return {"type": "function", "function": {"name": "f", "parameters": schema}}
    if path == "/v1/messages":
        return {"name": "f", "input_schema": schema}
    return {"type": "function", "name": "f", "parameters": schema}


def _over_the_limits() -> list[tuple[str, dict, str, int]]:
    from specgen.serve.schema import LIMITS

    L, many = LIMITS, [{"role": "user", "content": "hi"}] * (LIMITS.messages + 1)
    big = {"type": "object", "description": "x" * L.schema_chars}
    cases = [("/v1/chat/completions", {**CHAT, "stop": ["x"] * (L.stop_sequences + 1)}, "stop",
              L.stop_sequences),
             ("/v1/chat/completions", {**CHAT, "stop": "x" * (L.stop_chars + 1)}, "stop", L.stop_chars),
             ("/v1/completions", {**COMPLETION, "stop": ["x" * (L.stop_chars + 1)]}, "stop[0]", L.stop_chars),
             ("/v1/messages", {**MESSAGES, "stop_sequences": ["x"] * (L.stop_sequences + 1)},
              "stop_sequences", L.stop_sequences),
             ("/v1/messages", {**MESSAGES, "stop_sequences": ["x" * (L.stop_chars + 1)]}, "stop_sequences[0]",
              L.stop_chars),
             ("/v1/chat/completions", {**CHAT, "messages": many}, "messages", L.messages),
             ("/v1/messages", {**MESSAGES, "messages": many}, "messages", L.messages),
             ("/v1/messages/count_tokens", {**COUNT, "messages": many}, "messages", L.messages),
             ("/v1/responses", {**RESPONSES, "input": many}, "input", L.messages)]
    for path, field in (("/v1/chat/completions", "function.parameters"), ("/v1/messages", "input_schema"),
                        ("/v1/responses", "parameters")):
        cases += [(path, {**VALID[path], "tools": [_tool(path, {})] * (L.tools + 1)}, "tools", L.tools),
                  (path, {**VALID[path], "tools": [_tool(path, big)]}, f"tools[0].{field}", L.schema_chars)]
    return cases


def test_what_one_request_may_make_the_server_do_is_bounded(served):
    for path, body, param, limit in _over_the_limits():
        message = refused(served, path, body, param)
        assert f"limit of {limit}" in message, message


RESULT = [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "18 C"}]
REFUSED = [  # what Anthropic's and OpenAI's APIs refuse (finding 5), and an empty model name (6)
    ("/v1/messages", {**MESSAGES, "temperature": 5}, "temperature"),
    ("/v1/messages", {**MESSAGES, "metadata": "x"}, "metadata"),
    ("/v1/messages", {**MESSAGES, "metadata": {"user_id": 5}}, "metadata.user_id"),
    ("/v1/messages", said("/v1/messages", RESULT), "messages[0].content[0].tool_use_id"),
    ("/v1/messages", said("/v1/messages", ""), "messages[0].content"),
    ("/v1/messages", said("/v1/messages", []), "messages[0].content"),
    ("/v1/messages", {**MESSAGES, "messages": [*MSG, {"role": "assistant", "content": []}, *MSG]},
     "messages[1].content"),
    ("/v1/messages", {**MESSAGES, "system": [{"type": "image", "source": {"type": "base64", "data": ""}}]},
     "system[0]"),
    ("/v1/messages", {**MESSAGES, "model": ""}, "model"),
    ("/v1/messages/count_tokens", {**COUNT, "model": ""}, "model"),
    ("/v1/responses", {**RESPONSES, "temperature": 2.5}, "temperature"),
    ("/v1/responses", {**RESPONSES, "metadata": "x"}, "metadata"),
    ("/v1/responses", {**RESPONSES, "input": [{"type": "function_call_output", "call_id": "c9",
                                                "output": "x"}]}, "input[0].call_id"),
    ("/v1/responses", {**RESPONSES, "model": ""}, "model"),
    ("/v1/chat/completions", {**CHAT, "temperature": 2.5}, "temperature"),
    ("/v1/chat/completions", {**CHAT, "model": ""}, "model"),
    ("/v1/completions", {**COMPLETION, "model": ""}, "model"),
]


@pytest.mark.parametrize("path,body,param", REFUSED, ids=[f"{i}-{c[2]}" for i, c in enumerate(REFUSED)])
def test_what_the_apis_refuse_is_a_400_naming_the_field(served, path, body, param):
    refused(served, path, body, param)


def test_what_the_apis_take_is_still_taken(served):
    use = {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "f", "input": {}}]}
    result = {"role": "user", "content": RESULT}
    call = [{"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "18 C"}]
    prefill = {"role": "assistant", "content": ""}  # a final assistant message may be empty
    for path, body in (("/v1/messages", {**MESSAGES, "messages": [*MSG, use, result]}),
                       ("/v1/messages", {**MESSAGES, "messages": [*MSG, prefill]}),
                       ("/v1/messages", {**MESSAGES, "temperature": 1, "metadata": {"user_id": "u"}}),
                       ("/v1/responses", {**RESPONSES, "input": call, "temperature": 2,
                                          "metadata": {"k": "v"}})):
        r = post(served, path, body)
        assert r.status_code == 200, r.text


def test_every_route_serves_any_model_name_with_the_loaded_model(served):
    for path, body in VALID.items():
        r = post(served, path, {**body, "model": "gpt-4o"})
        assert r.status_code == 200, (path, r.text)
        assert r.json().get("model", "gpt-4o") == "gpt-4o"


def test_a_401_carries_the_cors_header_a_browser_needs_to_read_it(demo_engine):
    origin = "http://editor.local"
    with running(demo_engine, api_key="sesame", allowed_origins=(origin,)) as (url, _):
        for path in ("/v1/chat/completions", "/v1/messages"):
            r = httpx.post(url + path, json=VALID[path], headers={"Origin": origin})
            assert r.status_code == 401 and r.headers.get("access-control-allow-origin") == origin, r.headers
            error_message(path, r)


@pytest.mark.parametrize("key", ["clé", "", " sesame"])
def test_a_key_no_request_could_send_is_refused_before_the_model_loads(monkeypatch, key):
    from typer.testing import CliRunner

    from specgen.cli.commands import app
    from specgen.engine.engine import Engine

    def loads(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(Engine, "load", loads)
    r = CliRunner().invoke(app, ["serve", "-m", "demo", "--api-key", key])
    assert r.exit_code == 1 and "--api-key" in r.stderr and "loaded" not in r.stderr, r.output


def test_a_chunked_body_over_the_limit_is_a_413_in_each_apis_shape(demo_engine):
    def chunks():
        for _ in range(20):
            yield b" " * 1000

    with running(demo_engine, max_body_bytes=8_000) as (url, _):
        for path in ("/v1/chat/completions", "/v1/messages"):
            r = httpx.post(url + path, content=chunks(), headers={"content-type": "application/json"})
            assert r.status_code == 413 and "8000 bytes" in error_message(path, r), r.text
        assert httpx.get(f"{url}/health").status_code == 200


def test_a_head_over_the_limit_is_a_431_and_the_server_serves_on(served):
    for path in ("/v1/chat/completions", "/v1/messages"):
        r = httpx.post(f"{served.base_url}{path}", json=VALID[path], headers={"x-big": "a" * 1_000_000},
                       timeout=30)
        assert r.status_code == 431, r.text
        error_message(path, r)
    assert post(served, "/v1/chat/completions", CHAT).status_code == 200


@pytest.mark.parametrize("path,body,param", [
    ("/v1/chat/completions", said("/v1/chat/completions", "a\ud800b"), "messages[0].content"),
    ("/v1/chat/completions", {**CHAT, "tools": [_tool("/v1/chat/completions", {"\udfff": 1})]},
     "tools[0].function.parameters"),
    ("/v1/messages", said("/v1/messages", [{"type": "text", "text": "\udc00"}]),
     "messages[0].content[0].text"),
    ("/v1/responses", {**RESPONSES, "instructions": "\ud83d"}, "instructions"),
    ("/v1/completions", {**COMPLETION, "prompt": "\ud800"}, "prompt")])
def test_a_lone_surrogate_is_a_400_naming_where_it_is(served, path, body, param):
    assert "surrogate" in refused(served, path, body, param)


def test_messages_say_when_the_context_ended_the_answer_not_max_tokens(served):
    long = {**MESSAGES, "max_tokens": 20000,
            "messages": [{"role": "user", "content": "Once upon a time " * 100}]}
    whole = post(served, "/v1/messages", long).json()
    streamed = post(served, "/v1/messages", {**long, "stream": True}).text
    delta = json.loads(streamed.split("event: message_delta\ndata: ")[1].split("\n")[0])
    assert whole["stop_reason"] == "model_context_window_exceeded" == delta["delta"]["stop_reason"], whole
    assert post(served, "/v1/messages", {**long, "max_tokens": 3}).json()["stop_reason"] == "max_tokens"
    chat = post(served, "/v1/chat/completions", {**CHAT, "max_tokens": 20000, "messages": long["messages"]})
    assert chat.json()["choices"][0]["finish_reason"] == "length"  # OpenAI has no other name for it


def test_a_body_whose_text_cannot_fit_is_refused_before_tokenizing_in_bounded_time_and_memory(demo_engine):
    # A 30 MB count_tokens body took 107 s and the server from 0.56 to 5.6 GB; chat routes
    # tokenized the same way before the context check.
    import resource

    text = "Once upon a time there was a dog. " * 600_000  # 20 MB: the demo's context holds ~3,600 characters
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with running(demo_engine) as (url, _):
        for path, body, field in [
            ("/v1/messages/count_tokens", {"model": "m", "messages": [{"role": "user", "content": text}]}, "messages"),
            ("/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": text}]}, "messages"),
            ("/v1/completions", {"model": "m", "prompt": text}, "prompt")]:
            start = time.monotonic()
            r = httpx.post(f"{url}{path}", json=body, timeout=60)
            assert time.monotonic() - start < 20
            assert "characters, more than the model's context" in error_message(path, r, field)
    grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert grown_mb < 400, grown_mb  # the body (20 MB), parsed a few times over, not its tokens
