"""`specgen serve` with a real chat model and with tool calls.

The shared SmolLM2 (4-bit, ChatML): a chat answer is the text `specgen run` prints, streamed or
not, and a conversation's next turn comes from the prompt cache with the text it has without it.
Tool calls: a model that recites a tool call in the json_tools format (mlx-lm's parser for
`<tool_call>` templates) is answered with OpenAI's `tool_calls`, whole and as stream deltas.
"""

import json
import shutil

import mlx.core as mx
import mlx.nn as nn
import pytest
from conftest import SHARED
from mlx_lm.models.cache import KVCache
from mlx_lm.tokenizer_utils import load as load_tokenizer
from servers import client, running
from typer.testing import CliRunner

import specgen
from specgen.cli.commands import app
from specgen.engine import calibrate, registry
from specgen.engine.engine import Engine

SMOLLM2 = SHARED / "models" / "smollm2-135m-instruct-4bit"
needs_smollm2 = pytest.mark.skipif(not SMOLLM2.is_dir(), reason="the shared models sit beside the repository")
QUESTION = [{"role": "user", "content": "Name three colours."}]


@needs_smollm2
def test_a_real_chat_model_answers_as_specgen_run_and_continues_from_its_cache(monkeypatch):
    monkeypatch.setattr(calibrate, "BUDGET_S", 0.5)
    engine = Engine.load(str(SMOLLM2))
    engine.costs()
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


TEMPLATE = (  # a ChatML template with tools, as Qwen2.5's (what mlx-lm reads as the json_tools format)
    "{%- if tools %}<|im_start|>system\n# Tools\n{%- for tool in tools %}\n{{ tool | tojson }}{%- endfor %}\n"
    "Call one as <tool_call>{\"name\": ..., \"arguments\": ...}</tool_call><|im_end|>\n{%- endif %}"
    "{%- for message in messages %}\n<|im_start|>{{ message.role }}\n{{ message.content }}"
    "{%- for tool_call in message.tool_calls or [] %}{%- set tool_call = tool_call.function %}"
    "<tool_call>{\"name\": \"{{ tool_call.name }}\", \"arguments\": {{ tool_call.arguments | tojson }}}</tool_call>"
    "{%- endfor %}<|im_end|>{%- endfor %}\n{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}")
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
SAID = 'Let me check.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


class Recited(nn.Module):
    """A model that answers any prompt of `start` tokens with `script`, then repeats its last token."""

    def __init__(self, script: list[int], start: int, vocab: int):
        super().__init__()
        self.bias = mx.zeros((1,))
        self.script, self.start, self.vocab = script, start, vocab

    def make_cache(self):
        return [KVCache()]

    def __call__(self, x, cache=None):
        n, first = x.shape[1], cache[0].offset
        cache[0].update_and_fetch(mx.zeros((1, 1, n, 1)), mx.zeros((1, 1, n, 1)))
        rows = [self.script[min(max(p - self.start + 1, 0), len(self.script) - 1)] for p in range(first, first + n)]
        return (mx.arange(self.vocab)[None, None, :] == mx.array(rows)[None, :, None]).astype(mx.float32)


@pytest.fixture(scope="module")
def tool_engine(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tools")
    shutil.copy(SHARED / "tokenizers" / "smollm2" / "tokenizer.json", folder)
    config = json.loads((SHARED / "models" / "smollm2-135m-instruct-4bit" / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": TEMPLATE}))
    tokenizer = load_tokenizer(folder)
    assert tokenizer.has_tool_calling
    prompt = tokenizer.apply_chat_template(QUESTION, tools=TOOLS, add_generation_prompt=True)
    script = tokenizer.encode(SAID, add_special_tokens=False) + [tokenizer.convert_tokens_to_ids("<|im_end|>")]
    return Engine(registry.wrap(Recited(script, len(prompt), len(tokenizer.get_vocab())), tokenizer))


@pytest.mark.skipif(not (SHARED / "tokenizers" / "smollm2").is_dir(), reason="the shared tokenizers sit beside the repository")
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
