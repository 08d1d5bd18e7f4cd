"""The adaptive drafter: the n-gram tables plus long copies, drafting only as far as it pays.

For each position it could draft, it estimates q, the chance that the target accepts that token
given that it accepted the ones before. With P_i = q_1 * ... * q_i, drafting k tokens yields
1 + P_1 + ... + P_k tokens per step on average (Leviathan et al. 2023, sec. 3.5), so it drafts
the k that maximises that over the step's relative cost, cost(k). Novel text gets short or empty
drafts; long copies get long ones.

Evidence, in order of preference:
- a copy: the last COPY_KEY tokens occurred before (prompt or output, or with memory, an earlier
  output); the draft continues from the occurrence with the longest backward match, as far as
  the source goes (a copy the output has followed since it began is trusted like a long
  match, and before the output is COPY_KEY tokens long, what it has written so far, found once in
  the prompt, starts one); after a copy breaks, it realigns where the output resumes the source
  (after text it replaced, or inserted at the break);
  a token the output keeps putting in place of the source's (a rename, a re-indented block) is
  substituted while copying; after a token that copies keep breaking at (where the output inserts
  lines), copying on is judged less likely;
- n-gram predictions: the request's own tables (the mission's FNV-hashed 2-4-gram tables over
  the window), or memory's tables of earlier outputs; when the two disagree, the counts of
  both decide.
q starts from a coarse prior per kind of evidence; each request rescales the odds of each kind
by how its drafts have fared so far, so edits and chat settle at different levels quickly.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Callable

from . import defaults
from .predictor import NGramPredictor, context_keys

COPY_KEY = 4  # tokens of context that locate an earlier occurrence to copy from
COPY_CANDIDATES = 16  # earlier occurrences remembered per context; the longest backward match wins
MATCH_CAP = 128  # longest backward match measured
# Output tokens at its start that a copy may miss and still count as copying all of the output
# (tokenizers spell an output's first token apart, e.g. with a leading space).
START_SLACK = 1
AGREE_BELOW = 16  # below this match length, ask the n-gram tables for a second opinion
MIN_P = 0.05  # stop extending a draft once the chance that all of it is accepted falls below this
# After a copy breaks, the output resumes the source either where the tokens it has emitted since
# put it (it replaced as many as it wrote) or at the break (it inserted text): look for its last
# token from this far before the break to this far after the first place, nearest the first place.
# A wider span finds more resumptions but more chance matches of a common token.
REALIGN_SPAN = (-2, 4)
REALIGN_STEPS = 6  # steps after a broken copy during which realigning is tried
SUBST_SEEN = 2  # times the output must have replaced a source token before copies substitute it
HAZARD_SHRINK = 10.0  # judged copies after a token before its own break rate outweighs the usual
HAZARD_BASE = (1.0, 20.0)  # (breaks, judged) assumed before a request has judged any copy token
SHRINK = 2.0  # pseudo-observations that hold a request's rescaling near 1 until evidence builds
# The n-gram priors hold up better than a request's first few dozen n-gram drafts can tell (on the
# shared traces any value from 20 to 200 does better than 2, on every file, with memory or not).
NGRAM_SHRINK = 50.0
SUPPORT_SMOOTH = 2.0  # pseudo-counts added to a context's total when the n-gram sources disagree
CONT_ODDS = 2.0  # prior odds multiplier for a copy that continues the source the last step followed

# Priors, measured coarsely on real model outputs (between what chat answers and code edits show).
# Copies by backward match length (upper bound) -> (prior if the n-gram tables disagree, if agree).
_COPY_PRIOR = {4: (0.15, 0.6), 8: (0.35, 0.72), 16: (0.6, 0.85), 32: (0.8, 0.92),
               MATCH_CAP + 1: (0.97, 0.97)}
# A realignment, by drafted position: once its first token holds, it is likely the right one.
_REALIGN_PRIOR = (0.35, 0.6, 0.7, 0.8)
_REALIGN_LAST = len(_REALIGN_PRIOR) - 1  # later positions share the last prior
_SUBST_PRIOR = 0.4  # a learned substitution applied again (renames hold; one-off fixes do not)
# n-grams: order -> share of the context's counts (< 0.5, < 0.8, >= 0.8) -> best count 1, 2, 3, 4+.
_NGRAM_PRIOR = {
    4: ((0.1, 0.2, 0.3, 0.4), (0.2, 0.4, 0.5, 0.6), (0.5, 0.75, 0.85, 0.9)),
    3: ((0.05, 0.15, 0.25, 0.35), (0.15, 0.3, 0.4, 0.5), (0.4, 0.7, 0.8, 0.85)),
    2: ((0.05, 0.1, 0.15, 0.2), (0.1, 0.2, 0.3, 0.4), (0.25, 0.5, 0.65, 0.75)),
}
# n-grams seen once in the request: in edits they follow the prompt being copied, in chat they are
# as unreliable as their priors say, so each request rescales them apart from the others.
_ONCE = "ngram1"
_MEMORY_ODDS = 0.5  # memory n-grams and copies start at half the odds of the request's own
_MEMORY_KINDS = ("memory", "mcopy")


def _odds_scaled(q: float, factor: float) -> float:
    odds = q / (1.0 - q) * factor
    return odds / (1.0 + odds)


def _copy_bucket(match: int, agree: bool, cont: bool, kind: str = "copy") -> tuple:
    for bound in _COPY_PRIOR:
        if match < bound:
            return (kind, bound, agree, cont)
    return (kind, MATCH_CAP + 1, True, cont)


def prior(bucket: tuple) -> float:
    """The prior acceptance chance for a kind of evidence (see the module docstring)."""
    kind = bucket[0]
    if kind == "realign":
        return _REALIGN_PRIOR[bucket[1]]
    if kind == "subst":
        return _SUBST_PRIOR
    if kind in ("copy", "mcopy"):
        q = _COPY_PRIOR[bucket[1]][bucket[2]]
        if kind == "mcopy":
            return _odds_scaled(q, _MEMORY_ODDS)
        return _odds_scaled(q, CONT_ODDS) if bucket[3] else q
    q = _NGRAM_PRIOR[bucket[1]][bucket[2]][bucket[3] - 1]
    return _odds_scaled(q, _MEMORY_ODDS) if kind == "memory" else q


@lru_cache(maxsize=None)  # one function per beta, so min_slopes below is computed once for it
def linear_cost(beta: float) -> Callable[[int], float]:
    """cost(k) = 1 + beta * k: verifying k drafted tokens, relative to a one-token step."""
    return lambda k: 1.0 + beta * k


@lru_cache(maxsize=8)
def min_slopes(cost: Callable[[int], float], longest: int = defaults.MAX_DRAFT) -> list[float]:
    """m[k] = the least extra cost per extra token from k drafts to any longer draft (<= longest).

    Drafting on from k cannot beat a best rate r once P_k <= m[k] * r: every later rate is at most
    the mediant of the rate at k and P_k / m[k]. `predict` stops there, which changes no draft.
    """
    costs = [cost(k) for k in range(longest + 1)]
    return [min(((costs[j] - costs[k]) / (j - k) for j in range(k + 1, longest + 1)),
                default=float("inf")) for k in range(longest + 1)]


def remember(index: dict[int, list[int]], key: int, pos: int) -> None:
    """Note that position `pos` followed the context hashed to `key`, keeping the newest
    COPY_CANDIDATES positions per context (the request's copy index and memory's share this)."""
    where = index.get(key)
    if where is None:
        index[key] = [pos]
    else:
        where.append(pos)
        if len(where) > COPY_CANDIDATES:
            del where[0]


def _margin(entry: list, weight: int, rival: int) -> float:
    """How much more an n-gram entry backs its own best token than the `rival` another source
    proposes: the difference in counts as a share of the context's (SUPPORT_SMOOTH pseudo-counts
    keep a context seen once from being sure), doubled per token of context and once more for
    the request's own table (`weight` = order, plus 1 if own). The larger margin wins."""
    return (1 << weight) * (entry[1] - entry[2].get(rival, 0)) / (entry[3] + SUPPORT_SMOOTH)


def _judged(entry: list, order: int, source: tuple) -> tuple[int, tuple, float]:
    """(token, bucket, q) for an n-gram table entry found at `order` in one of `_ngram`'s sources.
    The bucket: kind, order, share of the context's counts, best count."""
    kind, _, calibration, own = source
    c = entry[1]
    share = c / entry[3]
    bucket = (_ONCE if c == 1 and own else kind, order if order < 4 else 4,
              2 if share >= 0.8 else 1 if share >= 0.5 else 0, c if c < 4 else 4)
    return entry[0], bucket, calibration.q(bucket)


def _kind(bucket: tuple) -> str:
    """Which rescaling a bucket shares. Realigning is a kind of copy; copies with a backward match
    of 32 or more are rescaled apart: they break where the output edits the source, shorter ones
    where the match was a coincidence, and in edits the first are overrated when the second are
    underrated (replayed code fixes: 98.7% accepted against q 99.4%, 61-88% against 43-78%)."""
    kind = bucket[0]
    if kind == "realign":
        return "copy"
    if kind == "copy" and bucket[1] > MATCH_CAP:
        return "long"
    return kind


_PRIOR_ODDS: dict[tuple, tuple[float, float, str]] = {}  # bucket -> (prior, its odds, kind)


def _prior_odds(bucket: tuple) -> tuple[float, float, str]:
    """(prior, prior odds, kind) of a bucket, remembered: priors are fixed."""
    p = prior(bucket)
    found = _PRIOR_ODDS[bucket] = (p, p / (1.0 - p), _kind(bucket))
    return found


class Calibration:
    """Per kind of evidence, [accepted, expected (sum of priors), judged] and the odds rescaling."""

    def __init__(self):
        self.counts: dict[str, list[float]] = {}
        self.scale: dict[str, float] = {}

    def copy(self) -> "Calibration":
        other = Calibration()
        for kind, counts in self.counts.items():
            other.set_counts(kind, list(counts))
        return other

    def record(self, bucket: tuple, hit: bool) -> None:
        """Count one judged draft token."""
        p, _, kind = _PRIOR_ODDS.get(bucket) or _prior_odds(bucket)
        acc, exp, n = self.counts.get(kind, (0.0, 0.0, 0))
        self.set_counts(kind, [acc + hit, exp + p, n + 1])

    def set_counts(self, kind: str, counts: list) -> None:
        """Set [accepted, expected, judged] for a kind and rescale its odds."""
        acc, exp, n = self.counts[kind] = counts
        # Observed odds over the priors' odds, both shrunk towards the priors.
        s = NGRAM_SHRINK if kind == "ngram" or kind == _ONCE else SHRINK
        self.scale[kind] = ((acc + s) / (n - acc + s)) / ((exp + s) / (n - exp + s))

    def q(self, bucket: tuple) -> float:
        """The acceptance chance for a bucket: its prior with its kind's odds rescaled."""
        _, odds, kind = _PRIOR_ODDS.get(bucket) or _prior_odds(bucket)
        odds *= self.scale.get(kind, 1.0)
        return odds / (1.0 + odds)


class Substitutions:
    """Single-token substitutions the output makes in what it copies (a renamed variable, a
    re-indented block). One is confirmed when the output, right after the token that broke a copy,
    goes on with what followed the source's token; once confirmed SUBST_SEEN times, copies read
    and draft through it, until the output keeps the source's token instead."""

    def __init__(self):
        self.forward: dict[int, int] = {}  # source token -> the output's token in its place
        self.back: dict[int, int] = {}  # and back
        self._confirmed: dict[int, tuple[int, int]] = {}  # source token -> (output's, times)
        # (source position, its token, output's) of a break whose next token is awaited
        self.pending: tuple[int, int, int] | None = None

    def broke(self, pos: int, was: int, now: int, substituted: bool) -> None:
        """A copy broke at source position `pos`, whose token `was` the draft had (or, if
        `substituted`, its substitute): the output has `now` there."""
        if substituted:
            if now == was:
                self._forget(was)
        elif now != was:
            self.pending = (pos, was, now)

    def resumed(self, source: list[int], token: int) -> None:
        """`token` was emitted next: after a break, it confirms the substitution if the source
        had it next too."""
        if self.pending is None:
            return
        pos, was, now = self.pending
        self.pending = None
        if pos + 1 < len(source) and source[pos + 1] == token:
            old = self._confirmed.get(was)
            times = old[1] + 1 if old is not None and old[0] == now else 1
            self._forget(was)
            self._confirmed[was] = (now, times)
            if times >= SUBST_SEEN:
                self.forward[was] = now
                self.back[now] = was

    def _forget(self, was: int) -> None:
        self._confirmed.pop(was, None)
        now = self.forward.pop(was, None)
        if now is not None and self.back.get(now) == was:
            del self.back[now]


class Hazards:
    """Tokens after which the request's copies break more often than usual: where the output
    inserts a line, or changes an indentation, the copy it was following breaks at the token after
    the same newline or indentation each time. Per preceding token it counts the copy tokens judged
    and how many broke; `odds` lowers a copy's odds after a token that breaks more often than copies
    of this request usually do, and never raises them (match lengths already say when copies hold)."""

    def __init__(self):
        self.after: dict[int, list[int]] = {}  # preceding token -> [copy tokens judged, breaks]
        self.judged = 0
        self.broke = 0

    def record(self, prev: int, broke: bool) -> None:
        """A copy token drafted after `prev` was judged."""
        counts = self.after.get(prev)
        if counts is None:
            counts = self.after[prev] = [0, 0]
        counts[0] += 1
        counts[1] += broke
        self.judged += 1
        self.broke += broke

    def odds(self, prev: int) -> float:
        """The factor (at most 1) on the odds that a copy token drafted after `prev` is accepted."""
        counts = self.after.get(prev)
        if counts is None:
            return 1.0
        usual = (self.broke + HAZARD_BASE[0]) / (self.judged + HAZARD_BASE[1])
        rate = (counts[1] + HAZARD_SHRINK * usual) / (counts[0] + HAZARD_SHRINK)
        return min(1.0, (1.0 - rate) / rate * usual / (1.0 - usual))


_HAZARD_KINDS = ("copy", "realign")  # the request's own copies (memory's are other requests')


class AdaptiveDrafter(NGramPredictor):
    """Drafts from long copies, the n-gram tables and (optionally) memory, as far as it pays."""

    def __init__(self, max_order: int = defaults.MAX_ORDER, window: int = defaults.WINDOW,
                 min_order: int = defaults.MIN_ORDER, *,
                 cost: Callable[[int], float] = linear_cost(defaults.BETA), memory=None):
        super().__init__(max_order=max_order, window=window, min_order=min_order)
        self.cost = cost
        self._keys: tuple[int, list[int]] | None = None  # (history length, keys) from predict
        self._hashed = max(max_order - 1, COPY_KEY)  # context tokens hashed: n-grams' and copies'
        # Whether keys hashed from the whole list are the window's too (it holds the n-gram context).
        self._list_keys = window >= max_order - 1
        self._costs: list[float] = []  # cost(k) and min_slopes, tabulated up to the longest draft
        self._slopes: list[float] = []
        self.memory = memory
        self.calibration = Calibration()
        self._all: list[int] = []  # every token fed: the source of copies (not windowed)
        self._seen: dict[int, list[int]] = {}  # context hash -> positions of the tokens that followed
        self._last: tuple[list[int], list[tuple], int | None] | None = None  # drafts, buckets, source
        self._anchor: int | None = None  # source position aligned with the end, while copying
        # After a broken copy: (source position if the output replaced what it wrote since, steps
        # left, source position right after the break).
        self._near: tuple[int, int, int] | None = None
        self.substitutions = Substitutions()
        self.hazards = Hazards()
        self._start: int | None = None  # where the output begins: tokens fed before the first draft
        # (kind, tables, calibration, 1 if the request's own) for _ngram, in this order
        self._ngram_sources = [("ngram", self.by_order, self.calibration, 1)]
        if memory is not None:
            self._ngram_sources.append(("memory", memory.tables.by_order, memory.calibration, 0))

    def update(self, token: int, keys: list[int] | None = None) -> list[int]:
        """Count `token` in the tables and remember where it followed its COPY_KEY-token context."""
        toks = self._all
        if keys is None:
            known = self._keys
            if known is not None and known[0] == len(toks):
                keys = known[1]
            elif self._list_keys:  # hash once, for both the tables and the copy index
                keys = context_keys(toks, self._hashed)
        keys = super().update(token, keys)
        if len(toks) >= COPY_KEY:
            key = keys[COPY_KEY] if len(keys) > COPY_KEY else context_keys(toks, COPY_KEY)[COPY_KEY]
            remember(self._seen, key, len(toks))
        toks.append(token)
        return keys

    def update_batch(self, tokens) -> None:
        """Feed emitted tokens; if they follow a draft, learn which of its tokens were accepted."""
        tokens = list(tokens)
        if self._anchor is not None:  # output and source advance together
            self._anchor += len(tokens)
        if self._near is not None:
            pos, left, broke = self._near
            self._near = (pos + len(tokens), left - 1, broke) if left > 1 else None
        if tokens and self.substitutions.pending:
            self.substitutions.resumed(self._all, tokens[0])
        if self._last is not None:
            drafts, buckets, src = self._last
            self._last = None
            n = 0
            prev = self._all[-1]
            for b in buckets:
                if n >= len(tokens):
                    break  # generation stopped (a stop token) before this draft was judged
                hit = tokens[n] == drafts[n]
                # Memory's calibration lives with the memory: it carries over between requests.
                (self.memory.calibration if b[0] in _MEMORY_KINDS else self.calibration).record(b, hit)
                if b[0] in _HAZARD_KINDS:
                    self.hazards.record(prev, not hit)
                if not hit:
                    break  # later tokens were never judged on their own
                prev = drafts[n]
                n += 1
            if src is not None:
                self._anchor = src + len(tokens)
                if n < len(drafts):  # the copy broke at draft n; the source continues near here
                    self._near = (self._anchor, REALIGN_STEPS, self._anchor)
                    if n < len(tokens) and src + n < len(self._all):
                        self.substitutions.broke(src + n, self._all[src + n], tokens[n],
                                                 buckets[n][0] == "subst")
        super().update_batch(tokens)

    def _copy_source(self, keys: list[int]) -> tuple[list[int], int, int] | None:
        """(tokens to copy from, position, backward match; -1 when realigning) or None, given the
        keys of the current context (see `context_keys`).

        The longest match in the request's own text (read through the substitutions the output
        makes) or in memory (searched only when the request's own match is short), else, while
        the output is too short for a key, where the prompt has what it wrote, else a realignment
        after a broken copy.
        """
        toks = self._all
        if len(toks) < COPY_KEY:
            return None
        key = keys[COPY_KEY]
        found = self._seen.get(key)
        best = self._longest_match(toks, found) if found else None
        back = self.substitutions.back
        if best is None and back and any(t in back for t in toks[-COPY_KEY:]):
            ctx = [back.get(t, t) for t in toks[-COPY_KEY:]]  # the context as the source has it
            best = self._longest_match(toks, self._seen.get(context_keys(ctx, COPY_KEY)[COPY_KEY], ()))
        if self.memory is not None and (best is None or best[1] < AGREE_BELOW):
            found = self.memory.index.get(key)
            mem = self._longest_match(self.memory.stream, found) if found else None
            if mem is not None and (best is None or mem[1] > best[1]):
                return (self.memory.stream, *mem)
        if best is not None:
            return (toks, *best)
        start = self._start
        if start + START_SLACK < len(toks) <= start + COPY_KEY:
            # Too little output for a key: what it has written (but its first START_SLACK tokens),
            # found once in the prompt, may be the start of a rewrite; drafted as the shortest match.
            pos = self._once_in_prompt(toks[start + START_SLACK:])
            if pos is not None:
                return toks, pos, COPY_KEY
        if self._near is not None:
            last = toks[-1]
            pos, _, broke = self._near
            found = [p for p in range(max(broke + REALIGN_SPAN[0], 1),
                                      min(pos + REALIGN_SPAN[1], len(toks) - 1)) if toks[p - 1] == last]
            if found:
                return toks, min(found, key=lambda p: abs(p - pos)), -1
        return None

    def _once_in_prompt(self, tail: list[int]) -> int | None:
        """The position after `tail` in the prompt if it occurs there exactly once, else None."""
        toks, m = self._all, len(tail)
        end = self._start - m  # occurrences begin before this, so that a prompt token follows
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

    def _longest_match(self, seq: list[int], candidates) -> tuple[int, int] | None:
        """(position, match) of the candidate whose preceding tokens match the end the longest."""
        toks = self._all
        n = len(toks)
        best = None
        subst = self.substitutions.forward if seq is toks else None
        if not subst:
            # A candidate counts only if it beats the best so far: its farthest token, then one
            # slice comparison (in C), rule out most; only a winner is measured token by token.
            for p in candidates:
                m = COPY_KEY if best is None else best[1] + 1
                if (m > p or m > n or m > MATCH_CAP or seq[p - m] != toks[n - m]
                        or seq[p - m:p] != toks[n - m:]):
                    continue
                while m < MATCH_CAP and p - 1 - m >= 0 and seq[p - 1 - m] == toks[n - 1 - m]:
                    m += 1
                best = (p, m)
            return best
        for p in candidates:  # a token the output substitutes matches its substitute
            m = 0
            while m < MATCH_CAP and p - 1 - m >= 0:
                a, b = seq[p - 1 - m], toks[n - 1 - m]
                if a != b and subst.get(a) != b:
                    break
                m += 1
            if m >= COPY_KEY and (best is None or m > best[1]):
                best = (p, m)
        return best

    def _ngram(self, keys: list[int]) -> tuple[int, tuple, float] | None:
        """(token, bucket, q) from the request's tables or from memory's; `keys` are the context's
        (see `context_keys`). When both know the context but disagree, each one's token is weighed
        by the counts of both (see `_margin`): memory knows more text, the request's own is more
        to the point. When they agree, the likelier bucket speaks for the token."""
        found = None  # (entry, order, source): the longest context a source knows; the winner's
        n = len(keys)
        # lookup_keys, inlined: this runs for every position drafted from n-grams.
        for source in self._ngram_sources:
            for k, table in source[1]:
                if n >= k:
                    entry = table.get(keys[k - 1])
                    if entry is not None:
                        if found is None:
                            found = (entry, k, source)
                        elif entry[0] == found[0][0]:
                            return max(_judged(*found), _judged(entry, k, source), key=lambda j: j[2])
                        elif (_margin(entry, k + source[3], found[0][0])
                              > _margin(found[0], found[1] + found[2][3], entry[0])):
                            found = (entry, k, source)
                        break
        return None if found is None else _judged(*found)

    def _q(self, bucket: tuple) -> float:
        if bucket[0] in _MEMORY_KINDS:
            return self.memory.calibration.q(bucket)
        return self.calibration.q(bucket)

    def predict(self, n: int) -> list[int]:
        """Up to `n` drafted tokens: the length that maximises expected tokens per unit of cost."""
        toks = self._all
        if self._start is None:
            self._start = len(toks)
        if n <= 0:
            return []
        drafts: list[int] = []
        buckets: list[tuple] = []
        gain = 0.0  # P_1 + ... + P_k for the drafts so far
        p_all = 1.0
        costs, slopes = self._costs, self._slopes
        if n >= len(costs):
            longest = max(n, defaults.MAX_DRAFT)
            self._costs = costs = [self.cost(k) for k in range(longest + 1)]
            self._slopes = slopes = min_slopes(self.cost, longest)
        best_k, best_rate = 0, 1.0 / costs[0]
        order = self.max_order - 1
        keys = context_keys(toks, self._hashed)  # of the context the first draft follows
        if self._list_keys:  # the next update's keys are these
            self._keys = (len(toks), keys)
        src = self._copy_source(keys)
        if src is not None:
            seq, pos, match = src
            own = seq is toks
            out = len(toks) - self._start
            if own and out >= COPY_KEY and match >= out - START_SLACK:
                # The output has copied this source since it began (a rewrite of the prompt's
                # code): that holds like a long match, not like a short one found by chance.
                match = MATCH_CAP + 1
            kind = "copy" if own else "mcopy"
            cont = own and pos == self._anchor  # the copy the last step was following
            subst = self.substitutions.forward
        ctx = toks[-order:]
        i = 0  # drafts so far
        while i < n and p_all > slopes[i] * best_rate:
            if src is not None:
                at = pos + i
                if at < len(seq):
                    tok = seq[at]
                elif own:  # the copy reached the end: it repeats what it just drafted
                    tok = drafts[at - len(seq)]
                else:
                    break
                if tok < 0:  # the end of an output in memory's stream
                    break
                alt = None
                if subst and own and at < len(seq) and tok in subst:
                    tok = subst[tok]
                    bucket = ("subst",)
                elif match < 0:
                    bucket = ("realign", i if i < _REALIGN_LAST else _REALIGN_LAST)
                elif match + i >= AGREE_BELOW:
                    bucket = _copy_bucket(match + i, True, cont, kind)
                else:
                    alt = self._ngram(keys or context_keys(ctx, order))
                    bucket = _copy_bucket(match + i, alt is None or alt[0] == tok, cont, kind)
                q = self._q(bucket)
                if bucket[0] in _HAZARD_KINDS:
                    factor = self.hazards.odds(ctx[-1])
                    if factor < 1.0:
                        q = _odds_scaled(q, factor)
                if alt is not None and not bucket[2] and alt[2] > q:
                    src = None  # the tables know better: stop copying
                    tok, bucket, q = alt
            else:
                alt = self._ngram(keys or context_keys(ctx, order))
                if alt is None:
                    break
                tok, bucket, q = alt
            p_all *= q
            if p_all < MIN_P:
                break
            drafts.append(tok)
            buckets.append(bucket)
            gain += p_all
            i += 1
            rate = (1.0 + gain) / costs[i]
            if rate > best_rate:
                best_k, best_rate = i, rate
            ctx.append(tok)
            keys = None  # hashed again only if the n-gram tables are asked
        k = best_k
        if k == 0:
            return []
        self._last = (drafts[:k], buckets[:k], pos if src is not None and own else None)
        return drafts[:k]


def make_drafter(draft: int | None = None, *, max_order: int = defaults.MAX_ORDER,
                 window: int = defaults.WINDOW, cost: Callable[[int], float] | None = None,
                 memory=None) -> tuple[NGramPredictor, int, str]:
    """(drafter, most drafted tokens per step, mode) as `run`, `simulate` and `bench` use them.

    No `draft`: the adaptive drafter, up to MAX_DRAFT tokens ("auto"). `draft=N`: the plain n-gram
    predictor chaining exactly up to N tokens ("fixed N"); 0 turns speculation off.
    """
    if draft is None:
        drafter = AdaptiveDrafter(max_order, window, cost=cost or linear_cost(defaults.BETA),
                                  memory=memory)
        return drafter, defaults.MAX_DRAFT, f"auto (up to {defaults.MAX_DRAFT})"
    return NGramPredictor(max_order, window), draft, f"fixed {draft}"
