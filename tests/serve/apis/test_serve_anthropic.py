"""`specgen serve`'s Anthropic Messages API (what Claude Code speaks) through the official `anthropic`
client, on a real server, with the requests Claude Code really sends (tests/agents/requests): the
text chat completions gives for the same conversation, streamed in the documented event order or
not; count_tokens; the next turn read from the prompt cache although Claude Code's billing header
changed; its full-size request refused with the overflow 400 it parses; a tool-use round trip; every bad request a 4xx in
Anthropic's error shape, the server answering after it; the key as x-api-key or Bearer; a prompt
too long for the context as the 400 Claude Code parses; a client that leaves cancels its job.
"""

import json
import re
from pathlib import Path

import anthropic
import httpx
import pytest
from conftest import QUESTION, TOOLS, needs_smollm2, needs_tokenizers
from servers import CANCELLED, anthropic_client, client, leave_mid_stream, running

REQUESTS = Path(__file__).resolve().parents[2] / "agents" / "requests"  # what Claude Code really sent
ORDER = re.compile(r"message_start (content_block_start (content_block_delta )+content_block_stop )*"
                   r"message_delta message_stop")


def claude(name: str, turn: int = 0, **changes) -> dict:
    """A captured Claude Code request, its billing header (which changes on every request) made
    this turn's; the small one's environment message shortened (every block and field kept), as
    SmolLM2 on 2 CPU cores prefills ~6 tokens a second."""
    body = json.loads((REQUESTS / f"claude_{name}.json").read_text())
    if name == "small":
        assert body["messages"][1]["role"] == "system"
        body["messages"][1]["content"][0]["text"] = "# Environment\n - Platform: linux"
    body.update(changes)
    header = body["system"][0]
    assert header["text"].startswith("x-anthropic-billing-header:")
    body["system"] = [{**header, "text": header["text"].replace("cc_version=", f"cc_version={turn}.")}, *body["system"][1:]]
    return body


def as_chat(body: dict) -> list[dict]:
    """The same conversation as chat completions messages: the system blocks (but the billing
    header) and system messages as one leading system message."""
    system = [b["text"] for b in body["system"][1:]]
    system += [b["text"] for m in body["messages"] if m["role"] == "system" for b in m["content"]]
    said = [{"role": m["role"], "content": m["content"]} for m in body["messages"] if m["role"] != "system"]
    return [{"role": "system", "content": "\n\n".join(system)}, *said]


def sdk(body: dict) -> dict:
    """A request body as the SDK's arguments: fields it does not name go as extra_body."""
    named = {"model", "messages", "system", "tools", "metadata", "max_tokens", "thinking"}
    return {**{k: v for k, v in body.items() if k in named},
            "extra_body": {k: v for k, v in body.items() if k not in named | {"stream"}}}


def sse(url: str, body: dict, path: str = "/v1/messages?beta=true") -> list[tuple[str, dict]]:
    """A stream's (event name, data) records, as they came."""
    with httpx.stream("POST", url + path, json={**body, "stream": True}, timeout=60) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        records = [block.split("\n") for block in r.read().decode().split("\n\n") if block]
    return [(name.removeprefix("event: "), json.loads(data.removeprefix("data: "))) for name, data in records]


@needs_smollm2
def test_claude_codes_request_gets_chat_completions_text_streamed_or_not_and_its_next_turn_reads_the_cache(smollm2_engine):
    first = claude("small", 1, max_tokens=5)  # Claude Code's own is 128000: clamped to the room left
    with running(smollm2_engine, model_name="smollm2") as (url, _):
        c, chat = anthropic_client(url), client(url)
        records = sse(url, first)
        whole = c.messages.create(**sdk(claude("small", 2, max_tokens=5)))
        with c.messages.stream(**sdk(claude("small", 3, max_tokens=5))) as s:
            streamed = s.get_final_message()
        counted = c.messages.count_tokens(**{k: v for k, v in sdk(first).items() if k not in ("max_tokens", "metadata")})
        expected = chat.chat.completions.create(model="smollm2", max_tokens=5, messages=as_chat(first))
        text = whole.content[0].text
        second = claude("small", 4, max_tokens=5, messages=[
            *first["messages"], {"role": "assistant", "content": [{"type": "text", "text": text}]},
            {"role": "user", "content": "And again?"}])
        turn = c.messages.create(**sdk(second))
        fresh = chat.chat.completions.create(model="smollm2", max_tokens=5, messages=as_chat(second))
    assert text == streamed.content[0].text == expected.choices[0].message.content
    finish = {"length": "max_tokens", "stop": "end_turn"}[expected.choices[0].finish_reason]
    assert [b.type for b in whole.content] == ["text"] and whole.stop_reason == finish == streamed.stop_reason
    assert (whole.type, whole.role, whole.model) == ("message", "assistant", "claude-opus-5-5")
    assert whole.usage.output_tokens == expected.usage.completion_tokens == streamed.usage.output_tokens
    prompt = expected.usage.prompt_tokens  # the billing header reached no prompt
    assert counted.input_tokens == prompt == whole.usage.input_tokens + whole.usage.cache_read_input_tokens
    assert ORDER.fullmatch(" ".join(name for name, _ in records))
    assert all(name == data["type"] for name, data in records)
    assert "".join(d["delta"]["text"] for n, d in records if n == "content_block_delta") == text
    assert records[0][1]["message"]["usage"] == {"input_tokens": prompt, "cache_creation_input_tokens": 0,
                                                 "cache_read_input_tokens": 0, "output_tokens": 0}
    assert records[-2][1]["delta"]["stop_reason"] == finish
    assert records[-2][1]["usage"]["output_tokens"] == whole.usage.output_tokens
    assert records[-2][1]["specgen"]["steps"] >= 1  # specgen's counts, as the whole message has them
    assert whole.usage.cache_read_input_tokens == prompt - 1  # the same prompt again, header aside
    # the first turn's prompt and output were kept, although the billing header changed
    assert turn.usage.cache_read_input_tokens > prompt
    assert turn.content[0].text == fresh.choices[0].message.content


@needs_tokenizers
def test_a_tool_use_round_trip(tool_engine):
    tools = [{"name": t["function"]["name"], "description": t["function"]["description"],
              "input_schema": t["function"]["parameters"]} for t in TOOLS]
    with running(tool_engine, model_name="tools", draft=0) as (url, _):
        c, chat = anthropic_client(url), client(url)
        whole = c.messages.create(model="claude", max_tokens=64, messages=QUESTION, tools=tools)
        with c.messages.stream(model="claude", max_tokens=64, messages=QUESTION, tools=tools) as s:
            streamed = s.get_final_message()
        records = sse(url, {"model": "claude", "max_tokens": 64, "messages": QUESTION, "tools": tools})
        call = whole.content[1]
        follow = QUESTION + [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in whole.content]},
                             {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id,
                                                           "content": [{"type": "text", "text": "18 C, sunny"}]}]}]
        after = c.messages.create(model="claude", max_tokens=2, messages=follow, tools=tools)
        as_chat = QUESTION + [{"role": "assistant", "content": "Let me check.", "tool_calls": [
            {"id": call.id, "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
            {"role": "tool", "tool_call_id": call.id, "content": "18 C, sunny"}]
        expected = chat.chat.completions.create(model="tools", messages=as_chat, tools=TOOLS, max_tokens=2)
    assert whole.stop_reason == "tool_use" == streamed.stop_reason
    assert [b.type for b in whole.content] == ["text", "tool_use"] and whole.content[0].text == "Let me check."
    assert (call.name, call.input, call.id.startswith("toolu_")) == ("get_weather", {"city": "Paris"}, True)
    assert [(b.type, getattr(b, "input", None)) for b in streamed.content] == [("text", None), ("tool_use", {"city": "Paris"})]
    starts = [d["content_block"] for n, d in records if n == "content_block_start"]
    assert starts[1]["type"] == "tool_use" and starts[1]["input"] == {}
    pieces = [d["delta"] for n, d in records if n == "content_block_delta" and d["index"] == 1]
    assert [p["type"] for p in pieces] == ["input_json_delta"] and json.loads(pieces[0]["partial_json"]) == {"city": "Paris"}
    # the call and its result reached the template as chat completions renders them
    assert after.usage.input_tokens + after.usage.cache_read_input_tokens == expected.usage.prompt_tokens


@pytest.fixture(scope="module")
def served(demo_engine):
    with running(demo_engine, max_body_bytes=64_000) as (url, worker):
        yield url, worker


MSG = [{"role": "user", "content": "Once upon a time"}]
BAD = [  # (body, status, error type, words in the message)
    ({"messages": MSG, "max_tokens": 8, "stream": "yes"}, 400, "invalid_request_error", "stream: input should be a valid boolean"),
    ({"messages": MSG, "max_tokens": 8.5}, 400, "invalid_request_error", "max_tokens: input should be a valid integer"),
    ({"messages": MSG, "max_tokens": 8, "temperature": "hot"}, 400, "invalid_request_error", "temperature"),
    ({"messages": MSG, "max_tokens": 8, "top_k": True}, 400, "invalid_request_error", "top_k"),
    ({"messages": MSG}, 400, "invalid_request_error", "max_tokens: field required"),
    ({"messages": MSG, "max_tokens": 0}, 400, "invalid_request_error", "max_tokens"),
    ({"messages": MSG, "max_tokens": 8, "temperature": -1}, 400, "invalid_request_error", "temperature"),
    ({"messages": MSG, "max_tokens": 8, "stop_sequences": [""]}, 400, "invalid_request_error", "stop_sequences"),
    ({"messages": [], "max_tokens": 8}, 400, "invalid_request_error", "messages"),
    ({"messages": [{"role": "robot", "content": "hi"}], "max_tokens": 8}, 400, "invalid_request_error", "messages[0].role"),
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "base64", "data": ""}}]}],
      "max_tokens": 8}, 400, "invalid_request_error", "messages[0].content[0]: image blocks"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t",
                                                 "content": [{"type": "document", "source": {}}]}]}], "max_tokens": 8},
     400, "invalid_request_error", "messages[0].content[0].content[0]: document blocks"),
    ({"messages": MSG, "max_tokens": 8, "tool_choice": {"type": "any"}}, 400, "invalid_request_error", "tool_choice"),
    ({"messages": [{"role": "user", "content": "Once upon a time " * 200}], "max_tokens": 8}, 400,
     "invalid_request_error", "input length and `max_tokens` exceed context limit: "),
]


@pytest.mark.parametrize("body,status,kind,words", BAD, ids=[f"{b[2]}-{i}" for i, b in enumerate(BAD)])
def test_each_bad_request_is_a_4xx_in_anthropics_shape_and_the_server_answers_after_it(served, body, status, kind, words):
    url, _ = served
    r = httpx.post(f"{url}/v1/messages?beta=true", json={"model": "claude-local", **body}, timeout=30)
    assert r.status_code == status, r.text
    assert r.json()["type"] == "error" and r.json()["error"]["type"] == kind and words in r.json()["error"]["message"], r.text
    assert anthropic_client(url).messages.create(model="any", max_tokens=2, messages=MSG).usage.output_tokens == 2


def test_overflow_says_by_how_much_and_max_tokens_is_clamped_to_the_room_left(served):
    url, _ = served
    c = anthropic_client(url)
    with pytest.raises(anthropic.BadRequestError) as e:
        c.messages.create(model="claude", max_tokens=20000, messages=[{"role": "user", "content": "Once upon a time " * 200}])
    used, asked, limit = map(int, re.search(r"context limit: (\d+) \+ (\d+) > (\d+)", e.value.message).groups())
    assert asked == 20000 and limit == 512 and used > limit
    long = c.messages.create(model="claude", max_tokens=20000, messages=[{"role": "user", "content": "Once upon a time " * 100}])
    assert long.stop_reason == "model_context_window_exceeded"  # the context, not max_tokens, ended it
    assert long.usage.input_tokens + long.usage.cache_read_input_tokens + long.usage.output_tokens <= limit


def test_unknown_fields_and_blocks_are_ignored_and_stop_sequences_end_the_text(served):
    url, _ = served
    c = anthropic_client(url)
    text = c.messages.create(model="claude", max_tokens=24, messages=MSG).content[0].text
    word = text.split()[3]
    extra = {"thinking": {"type": "enabled", "budget_tokens": 1024}, "context_management": {"edits": []},
             "metadata": {"user_id": "u"}, "output_config": {"effort": "low"}}
    odd = [{"role": "user", "content": [{"type": "text", "text": "Once upon a time"}, {"type": "future_block", "x": 1}]},
           {"role": "assistant", "content": [{"type": "thinking", "thinking": "hm", "signature": "s"},
                                             {"type": "redacted_thinking", "data": "..."}, {"type": "text", "text": text}]},
           {"role": "user", "content": "Then"}]
    assert c.messages.create(model="claude", max_tokens=4, messages=odd, extra_body=extra).stop_reason == "max_tokens"
    stopped = c.messages.create(model="claude", max_tokens=24, messages=MSG, stop_sequences=["zzz", word])
    assert (stopped.stop_reason, stopped.stop_sequence) == ("stop_sequence", word)
    assert stopped.content[0].text == text[:text.index(word)]


def test_claude_codes_full_size_request_is_the_overflow_400_not_a_5xx(served):
    url, _ = served
    r = httpx.post(f"{url}/v1/messages?beta=true", json=claude("full"), timeout=30)
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error", r.text
    assert re.search(r"context limit: \d+ \+ 128000 > 512", r.json()["error"]["message"])


def test_errors_outside_the_routes_are_anthropics_shape_too(served):
    url, _ = served
    big = httpx.post(f"{url}/v1/messages", json={"model": "m", "max_tokens": 1, "messages": MSG, "x": "y" * 70_000})
    assert big.status_code == 413 and big.json()["error"]["type"] == "request_too_large"
    missing = httpx.post(f"{url}/v1/messages/nothing", json={})
    assert missing.status_code == 404 and missing.json()["error"]["type"] == "not_found_error"
    broken = httpx.post(f"{url}/v1/messages", content=b'{"model": ', headers={"content-type": "application/json"})
    assert broken.status_code == 400 and "not valid JSON" in broken.json()["error"]["message"]


def test_models_as_anthropics_client_reads_them(served):
    url, _ = served
    (model,) = anthropic_client(url).models.list().data
    assert (model.id, model.type, model.display_name) == ("demo", "model", "demo") and model.created_at.year >= 2025


def test_the_key_is_taken_as_x_api_key_or_bearer(demo_engine):
    with running(demo_engine, api_key="sesame") as (url, _):
        ask = {"model": "claude", "max_tokens": 2, "messages": MSG}
        assert anthropic_client(url, api_key="sesame").messages.create(**ask).usage.output_tokens == 2
        bearer = anthropic.Anthropic(base_url=url, api_key=None, auth_token="sesame", max_retries=0)
        assert bearer.messages.count_tokens(model="claude", messages=MSG).input_tokens > 0
        with pytest.raises(anthropic.AuthenticationError) as e:
            anthropic_client(url, api_key="wrong").messages.create(**ask)
    assert e.value.body["error"]["type"] == "authentication_error"


def test_a_client_that_leaves_is_cancelled(paced_engine):  # answers too slowly to end first
    body = {"model": "claude", "max_tokens": 100000, "messages": MSG}
    with running(paced_engine) as (url, _):
        assert leave_mid_stream(url, "/v1/messages", body, lines=8) == CANCELLED


def test_the_stop_sequence_is_the_one_the_stream_stopped_on_without_decoding_the_output_again(served, monkeypatch):
    # The turn decoded the whole output again to find which stop string matched.
    url, worker = served
    c = anthropic_client(url)
    text = c.messages.create(model="claude", max_tokens=24, messages=MSG).content[0].text
    first, later = text.split()[2], text.split()[4]
    decoded = []
    tokenizer = worker.engine.loaded.tokenizer
    monkeypatch.setattr(tokenizer._tokenizer, "decode", lambda ids, *a, **k: decoded.append(ids) or "")
    stopped = c.messages.create(model="claude", max_tokens=24, messages=MSG, stop_sequences=[later, first])
    assert (stopped.stop_reason, stopped.stop_sequence) == ("stop_sequence", first)
    assert stopped.content[0].text == text[:text.index(first)] and decoded == []


@needs_smollm2
def test_a_trailing_assistant_message_is_continued_in_messages_and_responses(smollm2_engine):
    # Anthropic continues the assistant's text (prefill); specgen answered the conversation anew
    # ("1, 2, 3, 4, " after "1, 2,"), in Messages and Responses alike.
    turn = [{"role": "user", "content": "Count to five"}, {"role": "assistant", "content": "1, 2,"}]
    prefix = smollm2_engine.loaded.tokenizer.apply_chat_template(turn, continue_final_message=True)
    with running(smollm2_engine, model_name="smollm2") as (url, _):
        expected = httpx.post(f"{url}/v1/completions", json={"model": "smollm2", "prompt": list(prefix),
                                                             "max_tokens": 12}, timeout=120).json()
        expected = expected["choices"][0]["text"]
        message = anthropic_client(url).messages.create(model="smollm2", max_tokens=12, messages=turn)
        response = client(url, timeout=120).responses.create(model="smollm2", input=turn, max_output_tokens=12)
    assert message.content[0].text == response.output_text == expected
    assert not expected.startswith("1")  # the continuation, not the whole count again


def test_an_empty_system_message_as_claude_code_sends_is_no_error(served):
    # The non-empty rule is Anthropic's for user and assistant turns; Claude Code's per-turn
    # system messages with "content": [] (and an output_config) were a 400 "is empty".
    url, _ = served
    turn = [*MSG, {"role": "system", "content": []}]
    m = anthropic_client(url).messages.create(model="claude", max_tokens=4, messages=turn,
                                              extra_body={"output_config": {"effort": "low"}})
    assert m.stop_reason == "max_tokens"
    r = httpx.post(f"{url}/v1/messages", json={"model": "c", "max_tokens": 4,
                                               "messages": [{"role": "user", "content": []}]}, timeout=30)
    assert r.status_code == 400 and "is empty" in r.text
