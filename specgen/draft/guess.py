"""The n-gram guess for a context: the request's own tables and memory's, each consulted at the
longest context it knows; when both know it but disagree, the counts of both decide, and the
winner's evidence (source, order, share, count) gives its acceptance chance."""

from __future__ import annotations

from typing import NamedTuple

from specgen.draft.acceptance import Acceptance, Evidence, EvidenceTable
from specgen.draft.ngram import Entry, NGramTables
from specgen.draft.params import DrafterParams


class Guess:
    """An n-gram table's candidate: its token, evidence and acceptance chance."""

    __slots__ = ("token", "evidence", "q")

    def __init__(self, token: int, evidence: Evidence, q: float):
        self.token, self.evidence, self.q = token, evidence, q


class _Source(NamedTuple):
    """A set of n-gram tables to consult: the request's, then memory's."""

    kind: int  # index into EvidenceTable.ngram: 0 the request's own, 2 memory's
    by_order: list
    acceptance: Acceptance
    own: int  # 1 for the request's own tables (they weigh double when sources disagree)


class NGramGuesser:
    """Guesses the next token from the request's n-gram tables and (optionally) memory's."""

    def __init__(self, own: NGramTables, acceptance: Acceptance, evidence: EvidenceTable,
                 params: DrafterParams, memory=None):
        self._evidence = evidence
        self._smooth = params.support_smooth
        self._sources = [_Source(0, own.by_order, acceptance, 1)]
        if memory is not None:
            self._sources.append(_Source(2, memory.ngrams.by_order, memory.acceptance, 0))

    def guess(self, keys: list[int]) -> Guess | None:
        """The guess for the context of `keys` (see `context_keys`), or None if no table knows it.
        When both sources know it but disagree, each one's token is weighed by the counts of both
        (`_margin`): memory knows more text, the request's own is more to the point. When they
        agree, the likelier evidence speaks for the token."""
        found = None  # (entry, order, source) of the winner so far
        n = len(keys)
        for source in self._sources:
            for k, tab in source.by_order:
                if n >= k:
                    entry = tab.get(keys[k - 1])
                    if entry is not None:
                        if found is None:
                            found = (entry, k, source)
                        elif entry.best == found[0].best:
                            mine, theirs = self._guess(*found), self._guess(entry, k, source)
                            return theirs if theirs.q > mine.q else mine
                        elif (self._margin(entry, k + source.own, found[0].best)
                              > self._margin(found[0], found[1] + found[2].own, entry.best)):
                            found = (entry, k, source)
                        break
        return None if found is None else self._guess(*found)

    def _margin(self, entry: Entry, weight: int, rival: int) -> float:
        """How much more an entry backs its own best token than the `rival` another source
        proposes: the difference in counts as a share of the context's (support_smooth
        pseudo-counts keep a context seen once from being sure), doubled per token of context
        and once more for the request's own table (`weight` = order, plus 1 if own)."""
        return (1 << weight) * (entry.count - entry.counts.get(rival, 0)) / (entry.total + self._smooth)

    def _guess(self, entry: Entry, order: int, source: _Source) -> Guess:
        """The guess of an entry found at `order` in `source`: its evidence is the source, the
        order, the best token's share of the context's counts and its count."""
        c = entry.count
        share = c / entry.total
        kind = 1 if c == 1 and source.own else source.kind  # seen once in the request: rescaled apart
        ev = self._evidence.ngram[kind][(order if order < 4 else 4) - 2][
            2 if share >= 0.8 else 1 if share >= 0.5 else 0][(c if c < 4 else 4) - 1]
        return Guess(entry.best, ev, source.acceptance.q(ev))
