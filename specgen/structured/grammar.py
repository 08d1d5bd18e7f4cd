"""Formats compiled for one tokenizer with llguidance, and the matcher one sequence walks.

`Grammars` belongs to a model: it reads the tokenizer once (a fast Hugging Face tokenizer), and
compiles each Format once (checked, then kept: agents resend the same schema every turn); each
generation gets a fresh `Matcher` copied from the compiled one. A Format that does not compile is
a SettingError carrying llguidance's reason (an unsupported keyword is named there, never
dropped). Thread-safe: a server compiles while its worker generates.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Sequence

import llguidance
import numpy as np

from specgen.errors import ModelError, SettingError
from specgen.structured.formats import Format, Thinking, grammar_text

KEPT = 64  # compiled formats kept per model (least recently used dropped first)


class Matcher:
    """Where one sequence stands in its grammar: which tokens may come next, moved only by
    tokens that were emitted (or, for a moment, by drafts being judged: see `after`)."""

    def __init__(self, ll: llguidance.LLMatcher, words: int):
        self._ll, self._words = ll, words

    def forced(self) -> list[int]:
        """Tokens the grammar forces next (its canonical tokenization of the forced bytes)."""
        return self._checked(self._ll.compute_ff_tokens())

    def valid(self, tokens: Sequence[int]) -> int:
        """How many of `tokens`, in order, the grammar's parser takes from here (nothing moves).
        A superset of what the masks allow: where bytes are forced, a mask allows only their
        canonical tokens, the parser any tokenization."""
        return self._checked(self._ll.validate_tokens(list(tokens))) if tokens else 0

    def advance(self, tokens: Sequence[int]) -> None:
        """Move past emitted tokens (each one allowed: checked by whoever chose it)."""
        if tokens and not self._ll.consume_tokens(list(tokens)):
            self._checked(None)
            raise GrammarFailed("refused a token it had allowed")

    def _checked(self, result):
        """`result`, unless the parser has failed (it gives up on a grammar too complex to go on
        with, say): then GrammarFailed with its reason's first line, never its state dump."""
        if self._ll.is_error():
            raise GrammarFailed(_first_line(self._ll.get_error()))
        return result

    def ended(self) -> bool:
        """Whether the grammar has ended: only its end (a stop token) may follow, which ends the
        sequence, so nothing is advanced past it."""
        return self._ll.is_stopped()

    def back(self, n: int) -> None:
        """Take back the last `n` tokens advanced past."""
        if n:
            self._ll.rollback(n)

    def bitmask(self) -> np.ndarray:
        """The tokens allowed next, one bit each (int32 words, token i at bit i % 32 of word i // 32):
        what plain constrained decoding masks with."""
        mask = np.empty(self._words, dtype=np.int32)
        self._ll.unsafe_compute_mask_ptr(mask.ctypes.data, mask.nbytes)
        return self._checked(mask)


class GrammarFailed(SettingError):
    """The grammar's parser failed while a sequence was generating: that sequence's error alone
    (a 400 naming response_format; its loop ends it, the others go on)."""

    def __init__(self, reason: str):
        super().__init__("response_format", f"could not be followed: {reason}")


def _first_line(reason: str) -> str:
    """llguidance's reason on one line (a Lark error goes on to quote the line with a caret; a
    regex error says what is wrong last, on its "error:" line, which is kept)."""
    lines = [line.strip() for line in reason.strip().splitlines() if line.strip()]
    if not lines:
        return "no reason given"
    said = next((line for line in lines[1:] if line.startswith("error:")), None)
    if not (lines[0].endswith(":") and said):
        return lines[0]
    return f"{lines[0]} {said.removeprefix('error:').strip()}"


def allowed(bitmask: np.ndarray, token: int) -> bool:
    """Whether `bitmask` (Matcher.bitmask) allows `token`."""
    return token >> 5 < len(bitmask) and bool((int(bitmask[token >> 5]) >> (token & 31)) & 1)


class Grammars:
    """Every format compiled for one tokenizer (an mlx-lm TokenizerWrapper or a Hugging Face one)."""

    def __init__(self, tokenizer, stop_ids: Sequence[int] = ()):
        self._tokenizer, self._stop_ids = tokenizer, sorted(stop_ids)
        self._ll_tokenizer = None
        self._compiled: OrderedDict[tuple, llguidance.LLMatcher] = OrderedDict()
        self._lock = threading.RLock()

    def _vocabulary(self) -> llguidance.LLTokenizer:
        if self._ll_tokenizer is None:
            import llguidance.hf

            hf = getattr(self._tokenizer, "_tokenizer", self._tokenizer)
            try:
                self._ll_tokenizer = llguidance.hf.from_tokenizer(hf, eos_token=self._stop_ids or None)
            except Exception as e:  # not a fast tokenizer, or one llguidance cannot read
                raise ModelError(f"structured output needs a tokenizer llguidance can read "
                                 f"(a fast Hugging Face tokenizer): {type(hf).__name__}: {e}") from None
        return self._ll_tokenizer

    def thinking(self, prompt: Sequence[int] = ()) -> Thinking | None:
        """The model's thinking markers where mlx-lm knows them (one special token each), and
        whether `prompt` ends inside a thinking block; None for other models."""
        tok = self._tokenizer
        if not getattr(tok, "has_thinking", False) or len(tok.think_start_tokens or ()) != 1 \
                or len(tok.think_end_tokens or ()) != 1:
            return None
        return Thinking(tok.think_start, tok.think_end,
                        bool(prompt) and tok.rfind_think_start(prompt) > tok.rfind_think_end(prompt))

    def compile(self, fmt: Format, thinking: Thinking | None = None) -> llguidance.LLMatcher:
        """The compiled matcher of `fmt` (after `thinking`'s block) at its start (checked once;
        SettingError if it fails)."""
        key = (fmt, thinking)
        with self._lock:
            found = self._compiled.get(key)
            if found is not None:
                self._compiled.move_to_end(key)
                return found
            vocab = self._vocabulary()
            try:
                text = grammar_text(fmt, thinking)
            except ValueError as e:
                raise SettingError("response_format", f"is not a usable {fmt.kind}: {e}") from None
            failed, messages = llguidance.LLMatcher.validate_grammar_with_warnings(text, vocab)
            matcher = None if failed else llguidance.LLMatcher(vocab, text, log_level=0)
            if matcher is None or matcher.is_error():
                raise SettingError("response_format", f"does not compile: "
                                   f"{_first_line(' '.join(messages) if failed else matcher.get_error())}")
            self._compiled[key] = matcher
            if len(self._compiled) > KEPT:
                self._compiled.popitem(last=False)
            return matcher

    def matcher(self, fmt: Format, prompt: Sequence[int] = ()) -> Matcher:
        """A fresh matcher at the start of `fmt`, for one generation from `prompt` (a reasoning
        model's thinking left free)."""
        with self._lock:
            fresh = self.compile(fmt, self.thinking(prompt)).deep_copy()
        return Matcher(fresh, (self._ll_tokenizer.vocab_size + 31) // 32)
