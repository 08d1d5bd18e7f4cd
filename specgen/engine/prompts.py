"""How a prompt (text, or a conversation) becomes token ids: through the chat template or not;
and whether its text can fit a context at all, told before tokenizing it."""

from __future__ import annotations

from specgen.errors import InputError, SettingError


def text_chars(prompt: str | list[dict]) -> int:
    """The characters of a prompt's own text (its messages' text contents, text parts included):
    no more than the tokenizer will see."""
    if isinstance(prompt, str):
        return len(prompt)
    total = 0
    for message in prompt:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, str):
            total += len(content)
        elif isinstance(content, list):
            total += sum(len(p["text"]) for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return total


# Text up to this long is tokenized even where it cannot fit, so that each API's own overflow error
# can say by how many tokens (about a second and a few hundred MB at most here); past it, it is
# refused unread.
TOKENIZED_CHARS = 1_000_000


def check_fits(chars: int, context_length: int | None, token_chars: int, what: str = "the prompt") -> None:
    """Refuse text of `chars` characters that no tokenization can fit in `context_length` tokens
    (each token at most `token_chars` characters), where it is longer than TOKENIZED_CHARS: before
    tokenizing it, whose time and memory grow with the text (a 30 MB body took minutes and
    gigabytes to be told it was too long)."""
    if context_length is not None and chars > max(context_length * token_chars, TOKENIZED_CHARS):
        raise InputError(f"{what} is {chars} characters, more than the model's context of {context_length} "
                         f"tokens can hold (a token is at most {token_chars} characters)")


def encode_prompt(tokenizer, prompt: str | list[dict], *, chat: bool, system: str | None = None
                  ) -> list[int]:
    """Token ids for a prompt (a user message, or a conversation: {"role", "content"} dicts
    ending with a user turn): through the tokenizer's chat template when `chat` and it has one,
    else the text (a conversation's turns joined by blank lines)."""
    messages = prompt if isinstance(prompt, list) else [{"role": "user", "content": prompt}]
    if chat and getattr(tokenizer, "has_chat_template", False):
        messages = ([{"role": "system", "content": system}] if system else []) + messages
        return list(tokenizer.apply_chat_template(messages, add_generation_prompt=True))
    if system:
        raise SettingError("system", "needs a chat template, and this model has none (or raw is set)")
    return list(tokenizer.encode("\n\n".join(m["content"] for m in messages)))
