"""Turns: where an agent's earlier turns began, for copying the output's start.

An agent session is one conversation: the prompt holds the model's earlier turns, each after the
same cue (`<|assistant|>` and a newline, say), and a turn often begins as earlier ones did (the
same tool call's JSON). While the output is too short for a copy key, and a tokenizer has spelled
its first token apart from the prompt's spelling of the same text (a leading space), no key of
its context occurred before; `Turns` remembers where the text after the prompt's last tokens
went on before, so that copies can follow an earlier turn from the output's second token on.
"""

from __future__ import annotations


class Turns:
    """The earlier starts of the output's context, ranked: those that began as most of them did
    (their first two tokens) first, then the longest backward match, then the newest."""

    def __init__(self, toks: list[int], candidates, cap: int):
        n, ranked = len(toks), []
        for q in candidates:
            m = 0
            while m < cap and q - 1 - m >= 0 and toks[q - 1 - m] == toks[n - 1 - m]:
                m += 1
            ranked.append((q, m))
        ranked.sort(key=lambda qm: (-qm[1], -qm[0]))
        began = [tuple(toks[q:q + 2]) for q, _ in ranked]
        votes = {b: began.count(b) for b in began}
        usual = max(votes, key=lambda b: (votes[b], -began.index(b))) if votes else None
        self.share = votes[usual] / len(ranked) if ranked else 0.0  # how many began that way
        self.ranked = [r for r, b in zip(ranked, began) if b == usual] + [
            r for r, b in zip(ranked, began) if b != usual]

    def __bool__(self) -> bool:
        return bool(self.ranked)

    def follow(self, toks: list[int], start: int) -> tuple[int, int] | None:
        """(position, match) to copy from, the output being toks[start:]: the best-ranked earlier
        start whose tokens after its first are the output's (its first may be spelled apart);
        the match counts the context before it and the output."""
        out, written = len(toks) - start, toks[start + 1:]
        for q, m in self.ranked:
            if toks[q + 1:q + out] == written and q + out < start:
                return q + out, m + out
        return None
