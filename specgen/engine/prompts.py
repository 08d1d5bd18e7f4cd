"""How a prompt (text, or a conversation) becomes token ids: through the chat template or not."""

from __future__ import annotations

from specgen.errors import SettingError


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
