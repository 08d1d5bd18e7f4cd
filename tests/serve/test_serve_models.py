"""`specgen serve` with a real chat model and with tool calls.

The shared SmolLM2 (4-bit, ChatML): a chat answer is the text `specgen run` prints, streamed or
not, and a conversation's next turn comes from the prompt cache with the text it has without it.
Tool calls: a model that recites a tool call in the json_tools format (mlx-lm's parser for
`<tool_call>` templates; conftest's `tool_engine`) is answered with OpenAI's `tool_calls`, whole
and as stream deltas; a request that allows one call per turn (parallel_tool_calls false,
disable_parallel_tool_use) gets only the first of the model's calls, on all three APIs.
"""

import json

from conftest import (  # noqa: F401 (test_agent_clients.py imports TEMPLATE from here)
    QUESTION,
    SAID,
    SMOLLM2,
    TEMPLATE,
    TOOLS,
    needs_smollm2,
    needs_tokenizers,
    reciting_engine,
)
from servers import anthropic_client, client, running
from typer.testing import CliRunner

import specgen
from specgen.cli.commands import app


@needs_smollm2
def test_a_real_chat_model_answers_as_specgen_run_and_continues_from_its_cache(smollm2_engine):
    engine = smollm2_engine
    with running(engine, model_name="smollm2") as (url, _):
        c = client(url)
        whole = c.chat.completions.create(model="smollm2", messages=QUESTION, max_tokens=8)
        chunks = list(c.chat.completions.create(model="smollm2", messages=QUESTION, max_tokens=8, stream=True))
        text = whole.choices[0].message.content
        assert "".join(ch.choices[0].delta.content or "" for ch in chunks) == text
        two = QUESTION + [{"role": "assistant", "content": text}, {"role": "user", "content": "And three more?"}]
        turn = c.chat.completions.create(model="smollm2", messages=two, max_tokens=8)
    assert turn.usage.prompt_tokens_details.cached_tokens > 40
    run = CliRunner().invoke(app, ["run", "-m", str(SMOLLM2), "-n", "8", "--json", QUESTION[0]["content"]])
    assert run.exit_code == 0 and json.loads(run.stdout)["text"] == text
    model, tokenizer = engine.loaded.model, engine.loaded.tokenizer
    fresh = specgen.generate(model, tokenizer, tokenizer.apply_chat_template(two, add_generation_prompt=True), max_tokens=8)
    assert turn.choices[0].message.content == fresh


@needs_tokenizers
def test_tool_calls_come_back_whole_and_as_stream_deltas(tool_engine):
    with running(tool_engine, model_name="tools", draft=0) as (url, _):
        c = client(url)
        whole = c.chat.completions.create(model="tools", messages=QUESTION, tools=TOOLS)
        stream = list(c.chat.completions.create(model="tools", messages=QUESTION, tools=TOOLS, stream=True))
        plain = c.chat.completions.create(model="tools", messages=QUESTION, max_tokens=4)
        call = whole.choices[0].message.tool_calls[0]
        follow = QUESTION + [{"role": "assistant", "content": "", "tool_calls": [call.model_dump()]},
                             {"role": "tool", "tool_call_id": call.id, "content": "18 C, sunny"}]
        after = c.chat.completions.create(model="tools", messages=follow, tools=TOOLS, max_tokens=2)
    assert whole.choices[0].finish_reason == "tool_calls"
    assert whole.choices[0].message.content == "Let me check."
    assert (call.function.name, json.loads(call.function.arguments)) == ("get_weather", {"city": "Paris"})
    deltas = [d for ch in stream for d in ch.choices[0].delta.tool_calls or []]
    assert [(d.index, d.function.name, json.loads(d.function.arguments)) for d in deltas] == [(0, "get_weather", {"city": "Paris"})]
    assert "".join(ch.choices[0].delta.content or "" for ch in stream) == "Let me check."
    assert stream[-1].choices[0].finish_reason == "tool_calls"
    assert whole.usage.prompt_tokens > plain.usage.prompt_tokens  # the tools reached the template
    assert after.usage.prompt_tokens > whole.usage.prompt_tokens  # and so did the call and its result


@needs_tokenizers
def test_one_call_per_turn_returns_only_the_models_first_call(tmp_path):
    two = SAID.replace("Let me check.", "") + SAID.replace("Let me check.", "").replace("Paris", "Rome")
    engine = reciting_engine(tmp_path, QUESTION, TOOLS, "Let me check." + two)
    tools = [{"type": "function", **t["function"]} for t in TOOLS]
    claude_tools = [{"name": t["function"]["name"], "description": t["function"]["description"],
                     "input_schema": t["function"]["parameters"]} for t in TOOLS]
    with running(engine, model_name="tools", draft=0) as (url, _):
        c, a = client(url), anthropic_client(url)

        def chat(**kw):
            r = c.chat.completions.create(model="tools", messages=QUESTION, tools=TOOLS, **kw).choices[0]
            return r.finish_reason, [json.loads(t.function.arguments)["city"] for t in r.message.tool_calls]

        def responses(**kw):
            r = c.responses.create(model="codex", input=QUESTION, tools=tools, **kw)
            return r.parallel_tool_calls, [json.loads(o.arguments)["city"] for o in r.output if o.type == "function_call"]

        def messages(**choice):
            r = a.messages.create(model="claude", max_tokens=200, messages=QUESTION, tools=claude_tools,
                                  tool_choice={"type": "auto", **choice})
            return r.stop_reason, [b.input["city"] for b in r.content if b.type == "tool_use"]

        assert chat() == chat(parallel_tool_calls=True) == ("tool_calls", ["Paris", "Rome"])
        assert chat(parallel_tool_calls=False) == ("tool_calls", ["Paris"])
        streamed = c.chat.completions.create(model="tools", messages=QUESTION, tools=TOOLS, stream=True,
                                             parallel_tool_calls=False)
        assert [d.index for ch in streamed for d in ch.choices[0].delta.tool_calls or []] == [0]
        assert responses() == (True, ["Paris", "Rome"])
        assert responses(parallel_tool_calls=False) == (False, ["Paris"])
        assert messages() == messages(disable_parallel_tool_use=False) == ("tool_use", ["Paris", "Rome"])
        assert messages(disable_parallel_tool_use=True) == ("tool_use", ["Paris"])
