"""From a request to prompt token ids, and from generated text back to OpenAI's message parts.

Chat messages go through the model's chat template with their tools (mlx-lm's tokenizer
wrapper, as mlx_lm.server does), whichever API they came from; completions are encoded as mlx-lm
encodes a prompt. Generated text is split by mlx-lm's TextStateMachine into content, reasoning and
tool-call text, and tool calls are parsed by the model's mlx-lm tool parser: nothing of this is
written again here. A model whose tool-calling format mlx-lm does not know calls tools in
apis/tools.py's format.
"""

from __future__ import annotations

import functools
import json
import logging
import uuid
from typing import NamedTuple

from mlx_lm.generate import TextStateMachine, make_text_state_machine

from specgen.engine.engine import Engine
from specgen.engine.prompts import text_chars
from specgen.errors import SpecgenError
from specgen.serve.apis import tools as tool_format
from specgen.serve.apis.chat import ChatRequest, CompletionRequest
from specgen.serve.apis.ollama import ChatRequest as OllamaChat
from specgen.serve.schema import bad

_log = logging.getLogger("specgen.serve")


def chat_ids(engine: Engine, req: ChatRequest | OllamaChat) -> tuple[list[int], list[dict] | None]:
    """The conversation's token ids, through the chat template, and the tools it was given (chat
    completions' and Ollama's chat: the same prompt for the same conversation)."""
    messages, tools = req.conversation()
    if tools and not templated(engine):
        raise bad("tools", f"{engine.name} has no tool-calling format, nor a chat template to describe "
                           "tools in: send them in the prompt instead")
    ids, tools = agent_ids(engine, messages, tools, continue_last=False)
    return fits(engine, ids, "messages"), tools


def can_call(engine: Engine) -> bool:
    """Whether the model has a tool-calling format mlx-lm knows (chat template and parser)."""
    tokenizer = engine.loaded.tokenizer
    return bool(templated(engine) and tokenizer.has_tool_calling)


def template_ids(engine: Engine, messages: list[dict], tools: list[dict] | None,
                 continue_last: bool = False) -> list[int]:
    """Chat messages (and tools) through the model's chat template, as mlx_lm.server makes them;
    a 400 on `messages` when the template refuses them. Not checked against the context. With
    `continue_last`, a trailing assistant message is continued (Anthropic's prefill): the prompt
    ends inside it, and the answer is only what follows."""
    go_on = continue_last and bool(messages) and messages[-1].get("role") == "assistant"
    try:
        engine.check_fits(text_chars(messages), "the conversation")  # before tokenizing it
        if templated(engine):
            return list(engine.loaded.tokenizer.apply_chat_template(
                messages, tools=tools, add_generation_prompt=not go_on, continue_final_message=go_on))
        return engine.encode(messages)
    except SpecgenError as e:
        raise bad("messages", str(e)) from None
    except Exception as e:  # the template's own complaint (roles out of order, ...)
        raise bad("messages", f"the chat template refused them: {e}") from None


def agent_ids(engine: Engine, messages: list[dict], tools: list[dict] | None,
              continue_last: bool = True) -> tuple[list[int], list[dict] | None]:
    """(ids, tools) of a conversation, not checked against the context: a chat model with no
    tool-calling format mlx-lm knows gets the tools in its system message (apis/tools.py); a
    model with no chat template gets none and answers in text (logged once: agents send their
    tools with every request). A trailing assistant message is continued (`continue_last`: as
    Messages and Responses do; chat completions answer after it, as mlx_lm.server does)."""
    if tools and not templated(engine):
        _without_tools(engine.name)
        tools = None
    if tools and not can_call(engine):
        return template_ids(engine, tool_format.described(messages, tools), None, continue_last), tools
    return template_ids(engine, messages, tools, continue_last), tools


@functools.cache
def _without_tools(name: str) -> None:
    _log.warning("%s has no chat template: tools are left out of its prompts", name)


def templated(engine: Engine) -> bool:
    """Whether the model has a chat template (so tools can be offered to it, in its own format or
    the generic one)."""
    return bool(engine.loaded.spec.chat_template and getattr(engine.loaded.tokenizer, "has_chat_template", False))


def completion_ids(engine: Engine, req: CompletionRequest) -> list[int]:
    """The prompt's token ids: text encoded as mlx-lm encodes it, or the ids given."""
    prompt = req.one_prompt()
    if isinstance(prompt, str):
        ids = text_ids(engine, prompt, "prompt")
    else:
        ids = known_ids(engine, prompt, "prompt")
    return fits(engine, ids, "prompt")


def known_ids(engine: Engine, ids, param: str) -> list[int]:
    """Token ids a caller gave, or a 400 on `param` where one is outside the vocabulary."""
    vocab = engine.loaded.config.get("vocab_size") or len(engine.loaded.tokenizer.get_vocab())
    if any(not 0 <= t < vocab for t in ids):
        raise bad(param, f"holds token ids outside the vocabulary (0 to {vocab - 1})")
    return list(ids)


def text_ids(engine: Engine, text: str, param: str) -> list[int]:
    """Text encoded as mlx-lm encodes a raw prompt; a 400 on `param` when its characters cannot fit
    the context (checked before tokenizing it). Not checked against the context: `fits` does."""
    try:
        engine.check_fits(len(text))
    except SpecgenError as e:
        raise bad(param, str(e)) from None
    return list(engine.loaded.tokenizer.encode(text))


def fits(engine: Engine, ids: list[int], param: str) -> list[int]:
    """`ids`, or a 400 on `param` when they leave no room in the context to generate."""
    context = engine.loaded.context_length
    if not ids:
        raise bad(param, "is empty")
    if context is not None and len(ids) >= context:
        over = len(ids) - context + 1
        raise bad(param, f"is {len(ids)} tokens but {engine.name}'s context is {context} tokens: "
                                     f"{over} tokens too many (at most {context - 1} fit, leaving one to generate)",
                  code="context_length_exceeded")
    return ids


class Parts(NamedTuple):
    """A piece of an assistant message: its text, reasoning text and finished tool calls."""

    content: str = ""
    reasoning: str = ""
    tool_calls: tuple[dict, ...] = ()


class Splitter:
    """Splits a generation's text into Parts as it comes (mlx-lm's TextStateMachine), parsing
    each tool call once it is complete. With `one_call` (the request allows one call per turn:
    parallel_tool_calls false, disable_parallel_tool_use) only the first call is kept: a model
    cannot be made to write just one, so the calls after it are dropped. A model with no format of
    its own (`generic`) writes text (or a response_format's JSON), streamed once it cannot be a
    call, or one JSON call (apis/tools.py), held until it is complete."""

    def __init__(self, engine: Engine, prompt: list[int], tools: list[dict] | None, *,
                 one_call: bool = False):
        tokenizer = engine.loaded.tokenizer
        self.tools, self.parser, self.one_call = tools, getattr(tokenizer, "tool_parser", None), one_call
        special = getattr(tokenizer, "has_thinking", False) or (tools and getattr(tokenizer, "has_tool_calling", False))
        self.machine = make_text_state_machine(tokenizer) if special else None
        initial = "normal"
        if getattr(tokenizer, "has_thinking", False) and tokenizer.rfind_think_start(prompt) > tokenizer.rfind_think_end(prompt):
            initial = "reasoning"
        self.state = self.machine.make_state(initial) if self.machine else None
        self.tool_text = ""
        self.called = 0  # tool calls made
        self.generic = bool(tools) and not can_call(engine)  # the routes gave tools: a chat model
        self.held: str | None = ""  # generic: the answer so far while it may be a call; None: text

    def add(self, text: str, last: bool) -> Parts:
        """The Parts of `text`; `last` flushes what may still have been a control sequence."""
        if self.generic:
            return self._generic(text, last)
        if self.machine is None:
            return Parts(text)
        self.state, segments = TextStateMachine.split(self.state, text)
        if last:
            self.state, held, now = TextStateMachine.flush(self.state)
            segments.append((now, held))
        content = reasoning = ""
        calls: list[dict] = []
        for state, piece in segments:
            if state == "tool":
                self.tool_text += piece
                continue
            if self.tool_text:  # the tool call just ended
                calls, content = self._call(calls, content)
            if state == "reasoning":
                reasoning += piece
            else:
                content += piece
        if last and self.tool_text:
            calls, content = self._call(calls, content)
        return Parts(content, reasoning, tuple(calls))

    def _generic(self, text: str, last: bool) -> Parts:
        if self.held is None:
            return Parts(text)
        self.held += text
        said = self.held.lstrip()
        if said and not (tool_format.OPENING.startswith(said) or said.startswith(tool_format.OPENING)):
            text, self.held = self.held, None  # no call (text, or a response_format's JSON): stream it
            return Parts(text)
        if not last:
            return Parts()
        text, self.held = self.held, None
        call = tool_format.parse_call(text)
        return Parts(text) if call is None else Parts(tool_calls=(self._record(call),))

    def _call(self, calls: list[dict], content: str) -> tuple[list[dict], str]:
        text, self.tool_text = self.tool_text, ""
        try:
            parsed = self.parser(text, self.tools)
        except Exception as e:  # a call cut off by max_tokens, or not in the model's format
            _log.warning("a tool call could not be parsed (%s: %s); it is returned as text", type(e).__name__, e)
            return calls, content + text
        for call in parsed if isinstance(parsed, list) else [parsed]:
            if self.one_call and self.called:
                _log.info("a further tool call (%s) was dropped: the request allows one per turn",
                          call.get("name"))
                continue
            calls.append(self._record(call))
        return calls, content

    def _record(self, call: dict) -> dict:
        """A parsed call (`name`, `arguments`, maybe `id`) as OpenAI's tool call, counted."""
        arguments = call.get("arguments", {})
        self.called += 1
        return {"index": self.called - 1, "id": call.get("id") or f"call_{uuid.uuid4().hex[:24]}",
                "type": "function",
                "function": {"name": call["name"],
                             "arguments": arguments if isinstance(arguments, str)
                             else json.dumps(arguments, ensure_ascii=False)}}
