"""Acceptance estimates: q, the chance that the target accepts a drafted token, given that it
accepted the ones before it.

Every drafted token comes with its `Evidence`: a coarse kind of support (a copy with a backward
match of a given length, whether the n-gram tables agree, ...; an n-gram of some order, count
and share; a realignment; a substitution), which has a prior. A request's `Acceptance` rescales
the prior odds of each group of evidence by how its own drafts of that group have fared, shrunk
towards the priors, so edits and chat settle at different levels within a few steps.

Evidence objects are interned: one per kind, built once per parameters record (`evidence_for`).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import NamedTuple

from specgen.draft.params import DrafterParams

# Rescaling groups whose counts live with the memory (they carry over between requests).
MEMORY_GROUPS = ("memory", "mcopy", "turn")  # "turn": with a memory only
NGRAM_GROUPS = ("ngram", "ngram1")  # shrunk by ngram_shrink; the others by shrink


class Evidence(NamedTuple):
    """A kind of support for a drafted token, with its prior and the group that rescales it."""

    kind: str  # "copy", "mcopy" (memory's), "realign", "subst", "ngram", "ngram1" (seen once), "memory",
    # "recycled" (the target's own earlier prediction after the same token), "predicted" (a copy
    # from the caller's predicted output), "turn" (the start of an earlier turn, see copies.py)
    prior: float
    odds: float  # prior / (1 - prior)
    group: str  # the rescaling it shares: its kind, but "long" copies apart and realign with copies


def odds_scaled(q: float, factor: float) -> float:
    """q with its odds multiplied by `factor`."""
    odds = q / (1.0 - q) * factor
    return odds / (1.0 + odds)


def _evidence(kind: str, prior: float, group: str | None = None) -> Evidence:
    return Evidence(kind, prior, prior / (1.0 - prior), group or kind)


@dataclass(frozen=True)
class EvidenceTable:
    """Every kind of evidence for one parameters record, indexed by its features."""

    copy: tuple  # [own 0 / memory 1 / prediction 2][match bucket][agree 0/1][continues the last copy 0/1]
    bucket_of: tuple  # backward match length (capped at match_cap + 1) -> its match bucket
    realign: tuple  # [drafted position, the last one repeating]
    predicted_realign: tuple  # the same, realigning with the caller's prediction
    subst: Evidence
    recycled: Evidence
    ngram: tuple  # [kind: own 0 / own and seen once 1 / memory 2][order 2..4 - 2][share 0..2][count 1..4+ - 1]
    turn: tuple  # [share of earlier turns that began alike: < 0.5, < 0.8, more]

    def copy_at(self, match: int, *, agree: bool = True, cont: bool = False, own: bool = True) -> Evidence:
        """The evidence of a copied token whose backward match is `match` tokens long."""
        top = len(self.bucket_of) - 1
        return self.copy[0 if own else 1][self.bucket_of[min(match, top)]][agree][cont]


@lru_cache(maxsize=8)
def evidence_for(params: DrafterParams) -> EvidenceTable:
    """The interned evidence table of a parameters record."""
    last = len(params.copy_bounds) - 1

    def copy_evidence(source: int, b: int, agree: int, cont: int) -> Evidence:
        prior = params.copy_prior[b][agree or b == last]
        if source == 0:
            return _evidence("copy", odds_scaled(prior, params.cont_odds) if cont else prior,
                             "long" if b == last else "copy")
        if source == 1:
            return _evidence("mcopy", odds_scaled(prior, params.memory_odds))
        odds = params.predicted_odds * (params.cont_odds if cont else 1.0)
        return _evidence("predicted", odds_scaled(prior, odds))

    copy = tuple(tuple(tuple(tuple(copy_evidence(source, b, agree, cont) for cont in (0, 1))
                             for agree in (0, 1)) for b in range(last + 1)) for source in (0, 1, 2))
    realign = tuple(_evidence("realign", p, "copy") for p in params.realign_prior)
    predicted_realign = tuple(_evidence("predicted", odds_scaled(p, params.predicted_odds))
                              for p in params.realign_prior)
    ngram = tuple(tuple(tuple(tuple(
        _evidence(kind, odds_scaled(q, params.memory_odds) if kind == "memory" else q)
        for q in by_count) for by_count in by_share) for by_share in params.ngram_prior)
        for kind in ("ngram", "ngram1", "memory"))
    bucket_of = tuple(next((i for i, bound in enumerate(params.copy_bounds) if m < bound), last)
                      for m in range(params.match_cap + 2))
    return EvidenceTable(copy, bucket_of, realign, predicted_realign, _evidence("subst", params.subst_prior),
                         _evidence("recycled", params.recycled_prior), ngram,
                         tuple(_evidence("turn", q) for q in params.turn_prior))


@dataclass(slots=True)
class Judged:
    """How a group's drafts fared: accepted, the sum of their priors, and how many were judged."""

    accepted: float = 0.0
    expected: float = 0.0
    judged: int = 0


class Acceptance:
    """Per group of evidence: the judged drafts (`counts`) and the odds rescaling they imply."""

    def __init__(self, params: DrafterParams):
        self.params = params
        self.counts: dict[str, Judged] = {}
        self.scale: dict[str, float] = {}

    def copy(self) -> "Acceptance":
        """An independent copy (bench compares runs that must not learn from one another)."""
        other = Acceptance(self.params)
        for group, c in self.counts.items():
            other.set_counts(group, Judged(c.accepted, c.expected, c.judged))
        return other

    def record(self, evidence: Evidence, hit: bool) -> None:
        """Count one judged draft token."""
        c = self.counts.get(evidence.group)
        if c is None:
            c = self.counts[evidence.group] = Judged()
        c.accepted += hit
        c.expected += evidence.prior
        c.judged += 1
        self._rescale(evidence.group, c)

    def set_counts(self, group: str, counts: Judged) -> None:
        """Set a group's counts (e.g. read from a memory file) and rescale its odds."""
        self.counts[group] = counts
        self._rescale(group, counts)

    def _rescale(self, group: str, c: Judged) -> None:
        """Observed odds over the priors' odds, both shrunk towards the priors."""
        acc, exp, n = c.accepted, c.expected, c.judged
        s = self.params.ngram_shrink if group in NGRAM_GROUPS else self.params.shrink
        self.scale[group] = ((acc + s) / (n - acc + s)) / ((exp + s) / (n - exp + s))

    def q(self, evidence: Evidence) -> float:
        """The acceptance chance for a kind of evidence: its prior with its group's odds rescaled."""
        odds = evidence.odds * self.scale.get(evidence.group, 1.0)
        return odds / (1.0 + odds)
