"""Copies: where the text being written already occurred, so that what followed it there can be
drafted, and what the request's copies have taught it.

- `CopyIndex`: context hash (the last `copy_key` tokens) -> the positions that followed it (the
  newest `copy_candidates`); the request's tokens and memory's stream each have one.
- `longest_match`: of those positions, the one whose preceding tokens match the end of the
  history the longest (reading through the request's substitutions).
- what the request's copies taught it (lessons.py): substitutions and hazards.
- `Copies`: the request's copy state, finding a `CopySource` each step: the longest match in the
  request's text or memory's, else an earlier turn that began as the output did (turns.py), else
  the start of a rewrite of the prompt, else a realignment after a broken copy.
"""

from __future__ import annotations

from typing import NamedTuple

from specgen.draft.lessons import Hazards, Substitutions
from specgen.draft.ngram import context_keys
from specgen.draft.params import DrafterParams
from specgen.draft.turns import Turns


class CopyIndex:
    """Context hash -> positions that followed it, newest last, at most `keep` per context."""

    def __init__(self, keep: int):
        self.keep = keep
        self.where: dict[int, list[int]] = {}

    def add(self, key: int, pos: int) -> None:
        where = self.where.get(key)
        if where is None:
            self.where[key] = [pos]
        else:
            where.append(pos)
            if len(where) > self.keep:
                del where[0]


_NOWHERE = -(1 << 62)  # a `skip` that is no position


def longest_match(seq: list[int], candidates, toks: list[int], subst: dict[int, int] | None,
                  params: DrafterParams, skip: int = -1) -> tuple[int, int] | None:
    """(position, match length) of the candidate position in `seq` whose preceding tokens match
    the end of `toks` the longest (at least copy_key, at most match_cap); a token of `seq` that
    the output substitutes (`subst`: source token -> output's) matches its substitute, and the
    token of `toks` at `skip` (the output's first, which tokenizers spell apart) matches any."""
    n = len(toks)
    cap, best = params.match_cap, None
    if not 0 <= skip < n:
        skip = _NOWHERE
    if not subst:
        # A candidate counts only if it beats the best so far: its farthest token, then one
        # slice comparison (in C), rule out most; only a winner is measured token by token.
        j = skip - n  # where the skipped token stands, from the end (negative)
        for p in candidates:
            m = params.copy_key if best is None else best[1] + 1
            if m > p or m > n or m > cap:
                continue
            if n - m > skip:
                if seq[p - m] != toks[n - m] or seq[p - m:p] != toks[n - m:]:
                    continue
            elif seq[p - m:p + j] != toks[n - m:skip] or seq[p + j + 1:p] != toks[skip + 1:]:
                continue
            while m < cap and p - 1 - m >= 0 and (seq[p - 1 - m] == toks[n - 1 - m] or n - 1 - m == skip):
                m += 1
            best = (p, m)
        return best
    for p in candidates:
        m = 0
        while m < cap and p - 1 - m >= 0:
            a, b = seq[p - 1 - m], toks[n - 1 - m]
            if a != b and subst.get(a) != b and n - 1 - m != skip:
                break
            m += 1
        if m >= params.copy_key and (best is None or m > best[1]):
            best = (p, m)
    return best


class CopySource(NamedTuple):
    """Where a draft copies from."""

    tokens: list[int]  # the request's own tokens, or memory's stream
    pos: int  # position in `tokens` of the first token to draft
    how: str  # "match" (found by its context), "start" (the output's start found once in the
    # prompt, or an earlier turn that began as it did), "turn" (an earlier turn, before the
    # output's second token), "trusted" (a match the output has followed since it began) or "realign"
    match: int  # the backward match ("match", "start"); 0 for "trusted" and "realign"
    own: bool  # the request's own tokens (it may substitute, and repeats its draft past the end)
    end: int  # copying stops here (own copies then repeat what they drafted)


class _Realign(NamedTuple):
    pos: int  # where the source would be had the output replaced as many tokens as it wrote
    steps_left: int
    broke: int  # the source position right after the break


class Copies:
    """The request's copy index, substitutions, hazards and the copy it is following."""

    def __init__(self, tokens: list[int], params: DrafterParams):
        self.tokens = tokens  # every token fed (shared with the drafter, which appends to it)
        self.params = params
        self.index = CopyIndex(params.copy_candidates)
        self.substitutions = Substitutions(params.subst_seen)
        self.hazards = Hazards(params)
        self.start: int | None = None  # where the output begins: tokens fed before the first draft
        self._anchor: int | None = None  # source position aligned with the end, while copying
        self._realign: _Realign | None = None  # after a broken copy
        self.turns: Turns | None = None  # where the output's context went on before (turns.py)

    def restart(self) -> None:
        """Another output begins after the next feed (a server's next turn): this one's place goes."""
        self.start = self.turns = self._anchor = self._realign = None

    def advance(self, tokens: list[int]) -> None:
        """The output grew by `tokens` (before they are appended): move along with it."""
        n = len(tokens)
        if self._anchor is not None:  # output and source advance together
            self._anchor += n
        if self._realign is not None:
            pos, left, broke = self._realign
            self._realign = _Realign(pos + n, left - 1, broke) if left > 1 else None
        if tokens and self.substitutions.pending:
            self.substitutions.resumed(self.tokens, tokens[0])

    def judged(self, src: int, emitted: list[int], accepted: int, drafted: int,
               substituted: bool) -> None:
        """A copy from position `src` of the request's tokens was verified: `emitted` followed,
        the first `accepted` of `drafted` draft tokens held (`substituted`: the first that did
        not was a substitute)."""
        self._anchor = src + len(emitted)
        if accepted < drafted:  # the copy broke at draft `accepted`; the source continues near here
            self._realign = _Realign(self._anchor, self.params.realign_steps, self._anchor)
            if accepted < len(emitted) and src + accepted < len(self.tokens):
                self.substitutions.broke(src + accepted, self.tokens[src + accepted],
                                         emitted[accepted], substituted)

    def is_followed(self, pos: int) -> bool:
        """Whether a copy at `pos` continues the copy the last step followed."""
        return pos == self._anchor

    def find(self, keys: list[int], memory=None) -> CopySource | None:
        """The source to copy from, given the keys of the current context (see `context_keys`):
        the longest match in the request's own text (read through the substitutions the output
        makes and past the output's first token, which tokenizers spell apart) or in memory's
        (searched only when the request's own match is short), else, while the output is too
        short for a key, where an earlier turn that began as the output did went on, or where the
        prompt has what it wrote, else a realignment after a broken copy."""
        toks, p = self.tokens, self.params
        if len(toks) < p.copy_key:
            return None
        key = keys[p.copy_key]
        found = self.index.where.get(key)
        out = len(toks) - self.start
        if out == 0 and self.turns is None:
            self.turns = Turns(toks, found or (), p.match_cap)
        # Past the output's first token only where earlier turns began in the output's context.
        skip = self.start if self.turns else -1
        best = longest_match(toks, found, toks, self.substitutions.forward, p, skip) if found else None
        back = self.substitutions.back
        if best is None and back and any(t in back for t in toks[-p.copy_key:]):
            ctx = [back.get(t, t) for t in toks[-p.copy_key:]]  # the context as the source has it
            best = longest_match(toks, self.index.where.get(context_keys(ctx, p.copy_key)[p.copy_key], ()),
                                 toks, self.substitutions.forward, p, skip)
        how = "match"
        if best is None and 0 < out <= p.copy_key and self.turns:
            best, how = self.turns.follow(toks, self.start), "turn" if out == 1 else "start"
        if memory is not None and (best is None or best[1] < p.agree_below):
            found = memory.index.where.get(key)
            mem = longest_match(memory.stream, found, toks, None, p) if found else None
            if mem is not None and (best is None or mem[1] > best[1]):
                pos, match = mem
                return CopySource(memory.stream, pos, "match", match, False, memory.output_end(pos))
        if best is not None:
            pos, match = best
            return self._own(pos, match, how)
        if p.start_slack < out <= p.copy_key:
            # Too little output for a key: what it has written (but its first start_slack
            # tokens), found once in the prompt, may be the start of a rewrite.
            pos = self._once_in_prompt(toks[self.start + p.start_slack:])
            if pos is not None:
                return self._own(pos, p.copy_key, "start")
        if self._realign is not None:
            last = toks[-1]
            pos, _, broke = self._realign
            found = [q for q in range(max(broke + p.realign_span[0], 1),
                                      min(pos + p.realign_span[1], len(toks) - 1)) if toks[q - 1] == last]
            if found:
                return CopySource(toks, min(found, key=lambda q: abs(q - pos)), "realign", 0, True,
                                  len(toks))
        return None

    def _own(self, pos: int, match: int, how: str) -> CopySource:
        """A copy from the request's own tokens; one the output has followed since its first
        token (a rewrite of the prompt's code) holds like a long match, not a short chance one."""
        out = len(self.tokens) - self.start
        if out >= self.params.copy_key and match >= out - self.params.start_slack:
            how, match = "trusted", 0
        return CopySource(self.tokens, pos, how, match, True, len(self.tokens))

    def _once_in_prompt(self, tail: list[int]) -> int | None:
        """The position after `tail` in the prompt if it occurs there exactly once, else None."""
        toks, m = self.tokens, len(tail)
        end = self.start - m  # occurrences begin before this, so that a prompt token follows
        if end <= 0:
            return None  # (list.index would count a negative end from the list's end)
        found, p = None, 0
        while True:
            try:
                p = toks.index(tail[0], p, end)
            except ValueError:
                return found
            if toks[p:p + m] == tail:
                if found is not None:
                    return None
                found = p + m
            p += 1
