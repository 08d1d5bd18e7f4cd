"""A conversation with one model that keeps what it can between turns: `specgen chat`'s engine
room, and a program's.

`Conversation.say(text)` streams the answer to one more user turn. The model's cache is kept:
it holds the conversation so far (but its last token), so a new turn prefills only its own tokens
(after the longest prefix it shares with what the cache holds: a chat template that renders
earlier turns the same way shares them all). The adaptive drafter is kept too, having read the
whole conversation, so an answer that quotes or revises an earlier one drafts from it. An answer
cut short (`close()` on its stream, Ctrl-C) leaves no turn: the conversation is as before it
(a cache it may have left half-written is not kept). Where a new turn would not fit the context,
the oldest turns are dropped once it is answered (`dropped` says how many, for the caller to say
so). Messages are the `--prompts` line format's (`save`, `load`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

from mlx_lm.models.cache import can_trim_prompt_cache, make_prompt_cache, trim_prompt_cache

from specgen.api.prompts_file.items import ROLES
from specgen.engine.engine import Engine, Request, Response
from specgen.engine.options import Options
from specgen.errors import InputError
from specgen.stats import RunStats


class Conversation:
    """The turns so far with `engine`, generated with `options`, and the cache and drafter that
    have read them."""

    def __init__(self, engine: Engine, options: Options | None = None, system: str | None = None):
        self.engine, self.options = engine, options or Options()
        self.messages: list[dict] = []
        self.system = system
        self.dropped = 0  # turns the last `say` dropped to fit the context
        self.turns: list[RunStats] = []  # every finished answer's stats, this session
        self._reset()

    def _reset(self) -> None:
        self._cache, self._held, self._drafter = None, [], None  # _held: the tokens the cache holds

    def clear(self) -> None:
        """A new conversation (the system message stays)."""
        self.messages = []
        self._reset()

    def set_system(self, text: str | None) -> None:
        self.system = text or None

    def set_options(self, options: Options) -> None:
        """New settings for the next turns (their drafter is made afresh where it would differ)."""
        if _drafter_kind(options) != _drafter_kind(self.options):
            self._drafter = None
        self.options = options

    def _system(self) -> list[dict]:
        return [{"role": "system", "content": self.system}] if self.system else []

    def prompt(self, text: str, messages: list[dict] | None = None) -> list[dict]:
        """The messages the model reads for one more user turn `text` (after `messages`, by
        default the conversation's)."""
        return self._system() + (self.messages if messages is None else messages) + [{"role": "user", "content": text}]

    def say(self, text: str, stats: RunStats | None = None) -> Iterator[Response]:
        """Stream the answer to `text`; the turn joins the conversation once the answer ends
        (with the oldest turns dropped, where they had to be for it to fit)."""
        ids, kept = self._fitting(text)
        stats = stats or RunStats()
        cache, cached = self._cache_for(ids)
        self._cache, self._held = None, []  # until the answer ends: what the cache holds is this turn's
        drafter, fed = self._drafter_for(ids)
        if drafter is None and self.options.draft is None:  # adaptive: one kept for the next turns
            drafter = self.engine.new_drafter(self.options)
        request = Request(ids, self.options, prompt_cache=cache, cached=cached, drafter=drafter, drafter_fed=fed)
        answer, finished, whole = [], False, True
        try:
            for response in self.engine.stream(request, stats):
                answer.append(response.text)
                finished = response.finish_reason is not None
                yield response
        except BaseException as e:
            # Closed by its reader, the stream rewound the cache; any other way out (Ctrl-C in
            # the middle of a pass, an error) may have left some layers' entries in it.
            whole = isinstance(e, GeneratorExit)
            raise
        finally:
            # The cache holds the prompt and the output but its last token (Engine.stream), also
            # when the answer was cut short; the drafter has read as much.
            if whole:
                self._cache, self._held = cache, (ids + stats.output_ids)[:-1] if stats.prompt_tokens else []
                self._drafter = drafter
            if finished:
                self.messages = kept + [{"role": "user", "content": text},
                                        {"role": "assistant", "content": "".join(answer)}]
                self.turns.append(stats)

    def _fitting(self, text: str) -> tuple[list[int], list[dict]]:
        """The new turn's prompt ids and the earlier turns they hold: the oldest dropped (`dropped`
        says how many) while it would leave less than a quarter of the context (or max_tokens, if
        less) to answer in."""
        context = self.engine.loaded.context_length
        kept, self.dropped = self.messages, 0
        while True:
            ids = self.engine.encode(self.prompt(text, kept))
            room = None if context is None else context - len(ids)
            if room is None or room >= min(self.options.max_tokens, context // 4):
                return ids, kept
            if not kept:
                raise InputError(f"this turn is {len(ids)} tokens, too long for {self.engine.name}'s context of "
                                 f"{context} tokens with room to answer: shorten it")
            kept = kept[2:]  # the oldest turn: a user message and its answer
            self.dropped += 1

    def _cache_for(self, ids: list[int]) -> tuple[list, int]:
        """The kept cache cut back to the longest prefix of `ids` it holds (all but the last
        token at most: it is always fed), and how much of `ids` it then holds; else a new one."""
        common = 0
        for a, b in zip(self._held, ids[:-1]):
            if a != b:
                break
            common += 1
        cache = self._cache
        if cache is None or common == 0 or (common < len(self._held) and not can_trim_prompt_cache(cache)):
            return make_prompt_cache(self.engine.loaded.model), 0
        trim_prompt_cache(cache, len(self._held) - common)
        return cache, common

    def _drafter_for(self, ids: list[int]):
        """The kept drafter where what it has read starts `ids` (fed no more of them again), else
        None."""
        drafter = self._drafter
        if drafter is not None and hasattr(drafter, "tokens"):
            fed = list(drafter.tokens)
            if len(fed) <= len(ids) and fed == ids[: len(fed)]:
                return drafter, len(fed)
        return None, 0

    def save(self, path: str | Path) -> None:
        """The conversation as one `--prompts` line: {"messages": [...]} (the system message first)."""
        Path(path).write_text(json.dumps({"messages": self._system() + self.messages}, ensure_ascii=False) + "\n")

    def load(self, path: str | Path) -> None:
        """The conversation of a `--prompts` line's messages (the file's first line), replacing
        this one; it may end with an answer (as `save` writes it) or a question."""
        try:
            messages = json.loads(Path(path).read_text().splitlines()[0])["messages"]
        except (OSError, IndexError, ValueError, KeyError, TypeError) as e:
            raise InputError(f"cannot read a conversation from {path}: {type(e).__name__}: {e}") from None
        if not isinstance(messages, list) or not all(
                isinstance(m, dict) and m.get("role") in ROLES and isinstance(m.get("content"), str) for m in messages):
            raise InputError(f"{path}: \"messages\" must be a list of {{\"role\", \"content\"}}")
        system = [m for m in messages if m["role"] == "system"]
        self.system = system[0]["content"] if system else self.system
        self.messages = [m for m in messages if m["role"] != "system"]
        self._reset()


def _drafter_kind(options: Options) -> tuple:
    """What a kept drafter was made for: another kind of drafter for other settings."""
    return options.draft is None, options.memory, options.ngram_order, options.window
