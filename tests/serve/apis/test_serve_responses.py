"""`specgen serve`'s OpenAI Responses API (what Codex speaks) through the official `openai` client's
`responses`, on a real server, with the requests Codex really sends (tests/agents/requests): the
text chat completions gives for the same conversation, streamed in the documented event order
(ending in response.completed with usage) or not; the next turn, sent whole as Codex does, reads
the prompt cache; its full-size request refused with a 400 (context_length_exceeded); a function-call round trip; every bad request a
4xx in OpenAI's error shape, the server answering after it; `"stream": "yes"` refused by all three
APIs; /v1/models as both the OpenAI client and Codex read it; a client that leaves cancels its job.
"""

import json
from pathlib import Path

import httpx
import pytest
from conftest import QUESTION, TOOLS, needs_smollm2, needs_tokenizers, reciting_engine
from servers import CANCELLED, client, leave_mid_stream, running

REQUESTS = Path(__file__).resolve().parents[2] / "agents" / "requests"  # what Codex really sent


def codex(name: str, **changes) -> dict:
    """A captured Codex request; the small one's permissions and environment messages shortened
    (every item and field kept), as SmolLM2 on 2 CPU cores prefills ~6 tokens a second."""
    body = json.loads((REQUESTS / f"codex_{name}.json").read_text())
    if name == "small":
        for item, short in zip(body["input"][1:3], ("<permissions instructions>read-only</permissions instructions>",
                                                    "<environment_context><shell>bash</shell></environment_context>")):
            item["content"][0]["text"] = short
    return {**body, **changes}


def as_chat(body: dict) -> list[dict]:
    """The same conversation as chat completions messages: developer messages as one leading
    system message, input_text / output_text parts joined."""
    def text(item):
        return "\n\n".join(p["text"] for p in item["content"])

    items = [i for i in body["input"] if i.get("type", "message") == "message"]
    system = [text(i) for i in items if i["role"] in ("developer", "system")]
    said = [{"role": i["role"], "content": text(i)} for i in items if i["role"] in ("user", "assistant")]
    return [{"role": "system", "content": "\n\n".join(system)}, *said]


def sdk(body: dict) -> dict:
    """A request body as the SDK's arguments: fields it does not name go as extra_body."""
    named = {"model", "input", "tools", "tool_choice", "parallel_tool_calls", "reasoning", "store", "include",
             "prompt_cache_key", "max_output_tokens"}
    return {**{k: v for k, v in body.items() if k in named},
            "extra_body": {k: v for k, v in body.items() if k not in named | {"stream"}}}


def events(url: str, body: dict) -> list[dict]:
    """A stream's events, their names checked against their types."""
    with httpx.stream("POST", f"{url}/v1/responses", json={**body, "stream": True}, timeout=60) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        records = [block.split("\n") for block in r.read().decode().split("\n\n") if block]
    out = [json.loads(data.removeprefix("data: ")) for _, data in records]
    assert [name.removeprefix("event: ") for name, _ in records] == [e["type"] for e in out]
    return out


@needs_smollm2
def test_codexs_request_gets_chat_completions_text_streamed_or_not_and_its_next_turn_reads_the_cache(smollm2_engine):
    first = codex("small", max_output_tokens=5)  # Codex sends none: the output is bounded by the context
    with running(smollm2_engine, model_name="smollm2") as (url, _):
        c = client(url)
        streamed = events(url, first)
        whole = c.responses.create(**sdk(first))
        expected = c.chat.completions.create(model="smollm2", max_tokens=5, messages=as_chat(first))
        history = [*first["input"], {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": None},
                   streamed[-1]["response"]["output"][0],
                   {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "And again?"}]}]
        turn = c.responses.create(**sdk({**first, "input": history}))
        fresh = c.chat.completions.create(model="smollm2", max_tokens=5, messages=as_chat({"input": history}))
    text = expected.choices[0].message.content
    assert whole.output_text == text and whole.status == ("incomplete" if expected.choices[0].finish_reason == "length" else "completed")
    assert whole.usage.input_tokens == expected.usage.prompt_tokens and whole.usage.output_tokens == expected.usage.completion_tokens
    kinds = [e["type"] for e in streamed]
    final = "response.incomplete" if whole.status == "incomplete" else "response.completed"
    assert kinds == ["response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
                     *["response.output_text.delta"] * (len(kinds) - 8), "response.output_text.done",
                     "response.content_part.done", "response.output_item.done", final]
    assert [e["sequence_number"] for e in streamed] == list(range(len(streamed)))
    assert "".join(e["delta"] for e in streamed if e["type"] == "response.output_text.delta") == text
    done = streamed[-1]["response"]
    assert done["output"][0]["content"][0]["text"] == text and done["usage"]["output_tokens"] == whole.usage.output_tokens
    assert whole.usage.input_tokens_details.cached_tokens == whole.usage.input_tokens - 1  # the same prompt again
    assert turn.usage.input_tokens_details.cached_tokens > whole.usage.input_tokens  # the first turn's output too
    assert turn.output_text == fresh.choices[0].message.content


@needs_tokenizers
def test_a_function_call_round_trip(tool_engine):
    tools = [{"type": "function", **t["function"]} for t in TOOLS] + [{"type": "web_search"}]
    with running(tool_engine, model_name="tools", draft=0) as (url, _):
        c = client(url)
        whole = c.responses.create(model="codex", input=QUESTION, tools=tools)
        streamed = events(url, {"model": "codex", "input": QUESTION, "tools": tools})
        with c.responses.stream(model="codex", input=QUESTION, tools=tools) as s:
            final = s.get_final_response()
        call = whole.output[1]
        follow = QUESTION + [o.model_dump(exclude_none=True) for o in whole.output] + [
            {"type": "function_call_output", "call_id": call.call_id, "output": "18 C, sunny"}]
        after = c.responses.create(model="codex", input=follow, tools=tools, max_output_tokens=2)
        as_chat = QUESTION + [{"role": "assistant", "content": "Let me check.", "tool_calls": [
            {"id": call.call_id, "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
            {"role": "tool", "tool_call_id": call.call_id, "content": "18 C, sunny"}]
        expected = c.chat.completions.create(model="tools", messages=as_chat, tools=TOOLS, max_tokens=2)
    assert [o.type for o in whole.output] == ["message", "function_call"] and whole.output_text == "Let me check."
    assert (call.name, json.loads(call.arguments), call.status) == ("get_weather", {"city": "Paris"}, "completed")
    def said(r):
        return r.output_text, [(o.type, o.status, getattr(o, "name", None), getattr(o, "arguments", None)) for o in r.output]

    assert said(final) == said(whole)
    kinds = [e["type"] for e in streamed]
    assert kinds[kinds.index("response.output_item.done") + 1:] == [
        "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.done", "response.output_item.done", "response.completed"]
    added = streamed[kinds.index("response.function_call_arguments.delta") - 1]["item"]
    assert (added["type"], added["arguments"], added["status"]) == ("function_call", "", "in_progress")
    assert after.usage.input_tokens == expected.usage.prompt_tokens  # the call and its output reached the template


PATCH = {"type": "custom", "name": "apply_patch", "description": "Edit files",
         "format": {"type": "grammar", "syntax": "lark", "definition": "start: /.+/"}}
# what the chat template gets for it: a function of one string, its grammar in the description
PATCH_AS_FUNCTION = {"type": "function", "function": {
    "name": "apply_patch", "description": "Edit files\n\nThe input follows this grammar:\nstart: /.+/",
    "parameters": {"type": "object", "properties": {"input": {"type": "string"}}, "required": ["input"]}}}
PATCHED = "*** Begin Patch\n*** End Patch"


@needs_tokenizers
def test_a_custom_tool_call_round_trip(tmp_path):
    said = f'<tool_call>\n{{"name": "apply_patch", "arguments": {json.dumps({"input": PATCHED})}}}\n</tool_call>'
    engine = reciting_engine(tmp_path, QUESTION, [PATCH_AS_FUNCTION], said)
    with running(engine, model_name="tools", draft=0) as (url, _):
        c = client(url)
        whole = c.responses.create(model="codex", input=QUESTION, tools=[PATCH])
        streamed = events(url, {"model": "codex", "input": QUESTION, "tools": [PATCH]})
        call = whole.output[0]
        follow = [*QUESTION, call.model_dump(exclude_none=True),
                  {"type": "custom_tool_call_output", "call_id": call.call_id, "output": "Done."}]
        after = c.responses.create(model="codex", input=follow, tools=[PATCH], max_output_tokens=2)
        as_chat = [*QUESTION, {"role": "assistant", "content": "", "tool_calls": [
            {"id": call.call_id, "type": "function", "function": {"name": "apply_patch", "arguments": json.dumps({"input": PATCHED})}}]},
            {"role": "tool", "tool_call_id": call.call_id, "content": "Done."}]
        expected = c.chat.completions.create(model="tools", messages=as_chat, tools=[PATCH_AS_FUNCTION], max_tokens=2)
    assert [o.type for o in whole.output] == ["custom_tool_call"] and (call.name, call.input) == ("apply_patch", PATCHED)
    kinds = [e["type"] for e in streamed]
    assert kinds[2:] == ["response.output_item.added", "response.custom_tool_call_input.delta",
                         "response.custom_tool_call_input.done", "response.output_item.done", "response.completed"]
    assert streamed[-2]["item"]["input"] == PATCHED == streamed[3]["delta"]
    assert after.usage.input_tokens == expected.usage.prompt_tokens  # the call and its output reached the template


@pytest.fixture(scope="module")
def served(demo_engine):
    with running(demo_engine) as (url, worker):
        yield url, worker


MSG = "Once upon a time"
BAD = [  # (body, param, words in the message)
    ({"input": MSG, "stream": "yes"}, "stream", "valid boolean"),
    ({"input": MSG, "max_output_tokens": 8.0}, "max_output_tokens", "valid integer"),
    ({"input": MSG, "max_output_tokens": 0}, "max_output_tokens", "at least 1"),
    ({"input": MSG, "temperature": "0"}, "temperature", "valid number"),
    ({"input": MSG, "parallel_tool_calls": "true"}, "parallel_tool_calls", "valid boolean"),
    ({"input": MSG, "previous_response_id": "resp_1"}, "previous_response_id", "stores no responses"),
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0]", "item references"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "data:"}]}]}, "input[0].content[0]", "input_image"),
    ({"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{"}]}, "input[0].arguments", "not JSON"),
    ({"input": [{"role": "robot", "content": "hi"}]}, "input[0].role", "'user'"),
    ({"input": MSG, "tool_choice": "required"}, "tool_choice", "forcing a tool"),
    ({"input": MSG, "text": {"format": {"type": "json_schema", "schema": {"type": "strin"}}}}, "text.format.schema",
     "does not compile"),
    ({"input": MSG * 200}, "input", "tokens too many"),
]


@pytest.mark.parametrize("body,param,words", BAD, ids=[b[1] for b in BAD])
def test_each_bad_request_is_a_4xx_in_openais_shape_and_the_server_answers_after_it(served, body, param, words):
    url, _ = served
    r = httpx.post(f"{url}/v1/responses", json={"model": "gpt-5", **body}, timeout=30)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and words in error["message"] and error["type"] == "invalid_request_error", r.text
    assert client(url).responses.create(model="gpt-5", input=MSG, max_output_tokens=2).usage.output_tokens == 2


@pytest.mark.parametrize("path,body", [("/v1/chat/completions", {"messages": [{"role": "user", "content": MSG}]}),
                                       ("/v1/completions", {"prompt": MSG}), ("/v1/responses", {"input": MSG}),
                                       ("/v1/messages", {"messages": [{"role": "user", "content": MSG}], "max_tokens": 4})])
def test_types_are_strict_in_every_api(served, path, body):
    url, _ = served
    for wrong in ({"stream": "yes"}, {"stream": 1}, {"temperature": "0.5"}, {"top_p": True}):
        r = httpx.post(url + path, json={"model": "demo", **body, **wrong}, timeout=30)
        assert r.status_code == 400, (wrong, r.text)
    assert httpx.post(url + path, json={"model": "demo", **body, "temperature": 0}, timeout=30).status_code == 200


def test_codexs_full_size_request_is_a_400_not_a_5xx(served):
    url, _ = served
    r = httpx.post(f"{url}/v1/responses", json=codex("full"), timeout=30)
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded", r.text


def test_models_read_by_the_openai_client_and_codex(served):
    url, _ = served
    assert [m.id for m in client(url).models.list()] == ["demo"]
    assert httpx.get(f"{url}/v1/models").json()["models"] == []  # Codex's list: it keeps its own defaults


def test_a_custom_tool_and_hosted_tools_are_accepted_and_unknown_items_ignored(served):
    url, _ = served
    tools = [{"type": "custom", "name": "apply_patch", "description": "Edit files",
              "format": {"type": "grammar", "syntax": "lark", "definition": "start: /.+/"}},
             {"type": "web_search"}, {"type": "namespace", "name": "mcp", "tools": [{"type": "function", "name": "f"}]}]
    history = [{"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "Be brief."}]},
               {"type": "message", "role": "user", "content": [{"type": "input_text", "text": MSG}]},
               {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": None},
               {"type": "custom_tool_call", "call_id": "c1", "name": "apply_patch", "input": "*** Begin Patch"},
               {"type": "custom_tool_call_output", "call_id": "c1", "output": "done"},
               {"type": "future_item", "x": 1}]
    r = client(url).responses.create(model="gpt-5-codex", input=history, tools=tools, store=False, max_output_tokens=3,
                                      reasoning={"effort": "low"}, include=["reasoning.encrypted_content"],
                                      prompt_cache_key="k", parallel_tool_calls=False)
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens" and r.usage.output_tokens == 3


def test_a_client_that_leaves_is_cancelled(paced_engine):  # answers too slowly to end first
    with running(paced_engine) as (url, _):
        assert leave_mid_stream(url, "/v1/responses", {"model": "m", "input": MSG}, lines=12) == CANCELLED
