"""Cross-request memory (opt-in): the outputs of earlier generations with the same model.

Chat answers from one model reuse its phrasing, so the n-gram tables of earlier outputs predict
later ones, and a bounded stream of the outputs themselves serves long copies. How well memory's
drafts fare is learned across requests too. The memory is bounded in size (the most-used
contexts are kept, as it grows). memory_file.py keeps it on disk.
"""

from __future__ import annotations

import copy
from bisect import bisect_right

from specgen import defaults
from specgen.draft.acceptance import Acceptance, Judged
from specgen.draft.copies import CopyIndex
from specgen.draft.ngram import context_keys, keys_along
from specgen.draft.params import PARAMS, DrafterParams
from specgen.draft.predictor import NGramPredictor

MAX_CONTEXTS = 200_000  # n-gram contexts a model's memory keeps (a few MB on disk)
MAX_STREAM = 200_000  # tokens of earlier outputs kept verbatim for long copies
SEP = -1  # stands before each output in the stream: a backward match never runs across it


class NGramMemory:
    """Earlier outputs of one model: their n-gram tables, a bounded stream of them indexed for
    long copies, and how well drafts from both have fared (carried over between requests)."""

    def __init__(self, model_key: str = "", max_order: int = defaults.MAX_ORDER,
                 max_contexts: int = MAX_CONTEXTS, params: DrafterParams = PARAMS, label: str = ""):
        self.model_key = model_key
        self.label = label  # where the model is used from (a folder), for people (see memory_file)
        self.max_contexts = max_contexts
        self.params = params
        self.tables = NGramPredictor(max_order=max_order, window=max_order)  # fed one output at a time
        self.ngrams = self.tables.ngrams
        self.acceptance = Acceptance(params)
        self.stream: list[int] = []  # recent outputs, each after a SEP
        self._starts: list[int] = []  # where each output begins in the stream
        self.index = CopyIndex(params.copy_candidates)  # context hash -> stream positions
        self._added: list[list[int]] = []  # outputs added since load, merged into the file on save
        self._base: dict[str, Judged] = {}  # acceptance counts as loaded (the file's share of them)

    def reader(self) -> "NGramMemory":
        """A view for one request that shares the tables and stream but learns on a copy of the
        acceptance counts, so that runs being compared (bench) do not learn from one another."""
        view = copy.copy(self)
        view.acceptance = self.acceptance.copy()
        view._added = []
        return view

    def add(self, tokens) -> None:
        """Remember one finished output (its contexts do not run into the previous one's)."""
        tokens = list(tokens)
        self.tables.forget_history()
        self.tables.feed(tokens)
        self._bound()
        self._append_stream(tokens)
        self._added.append(tokens)

    def outputs(self) -> int:
        """How many earlier outputs the stream holds."""
        return len(self._starts)

    def respellings(self, toks: list[int], index: CopyIndex, newest: int = 8) -> dict[int, int] | None:
        """Whether the request (`toks`, its copy index) continues the conversation of this memory's
        newest output, as an agent's next turn does: its prompt then holds that output verbatim
        but for the first token, which the output spells apart (a leading space). If it does,
        {the prompt's spelling of an output's first token: the output's own}, from the newest
        outputs the prompt holds; else None (memory then drafts as usual)."""
        found = {}
        for i in range(len(self._starts) - 1, max(len(self._starts) - 1 - newest, -1), -1):
            at = self._held_at(i, toks, index)
            if at is None:
                if i == len(self._starts) - 1:
                    return None  # the newest output is not there: another conversation
                continue
            found.setdefault(toks[at], self.stream[self._starts[i]])
        return found if self._starts else None

    def prompt_holds(self, toks: list[int], index: CopyIndex, share: float) -> bool:
        """Whether the request's prompt (`toks`, its copy index) holds at least `share` of this
        memory's output tokens (each output verbatim but its first token): if so, memory knows
        little the prompt does not. Newest outputs first; it stops once the answer is known."""
        total = len(self.stream) - len(self._starts)  # the stream holds a SEP before each output
        need, spare = share * total, (1 - share) * total  # held tokens wanted, others allowed
        held = other = 0
        for i in range(len(self._starts) - 1, -1, -1):
            if held >= need or other > spare:
                break
            size = self._end(i) - self._starts[i]
            if self._held_at(i, toks, index) is None:
                other += size
            else:
                held += size
        return held >= need

    def _end(self, i: int) -> int:
        """The end (exclusive) in the stream of output `i`."""
        return self._starts[i + 1] - 1 if i + 1 < len(self._starts) else len(self.stream)

    def _held_at(self, i: int, toks: list[int], index: CopyIndex) -> int | None:
        """Where `toks` (its copy index) holds output `i` verbatim but for its first token (the
        position of that token, the newest such place), else None (as for outputs too short to tell)."""
        key = self.params.copy_key
        out = self.stream[self._starts[i]:self._end(i)]
        if len(out) <= key + 1:
            return None
        for p in reversed(index.where.get(context_keys(out[1:1 + key], key)[key], ())):
            if p - key - 1 >= 0 and toks[p:p + len(out) - 1 - key] == out[1 + key:]:
                return p - key - 1
        return None

    def contexts(self) -> int:
        return self.ngrams.contexts()

    def output_end(self, pos: int) -> int:
        """The end (exclusive) in the stream of the output that holds position `pos`."""
        return self._end(bisect_right(self._starts, pos) - 1)

    def _bound(self) -> None:
        """Past the bound, drop the least-used contexts, down to 3/4 of it so that pruning is
        rare. Among contexts used as often, shorter ones stay first (they recur in more text), then
        newer ones. `run` saves the memory after each request and `simulate` adds each trace, both
        through `add`: so both draft from the same bounded memory."""
        if self.contexts() <= self.max_contexts:
            return
        ranked = []
        for order, table in self.ngrams.tables.items():
            for age, (key, entry) in enumerate(reversed(table.items())):  # tables keep insertion order
                ranked.append((-entry.total, order, age, key))
        ranked.sort()
        for _, order, _, key in ranked[self.max_contexts * 3 // 4:]:
            del self.ngrams.tables[order][key]

    def _append_stream(self, tokens: list[int]) -> None:
        tokens = tokens[-(MAX_STREAM // 2):]
        if len(self.stream) + len(tokens) + 1 > MAX_STREAM:
            # Drop the oldest outputs, a quarter of the stream at a time so that re-indexing is rare.
            outputs = self._outputs()
            size = sum(len(o) + 1 for o in outputs)
            while outputs and size + len(tokens) + 1 > MAX_STREAM * 3 // 4:
                size -= len(outputs.pop(0)) + 1
            self.stream, self._starts = [], []
            self.index = CopyIndex(self.params.copy_candidates)
            for out in outputs:
                self._index_output(out)
        self._index_output(tokens)

    def _outputs(self) -> list[list[int]]:
        ends = self._starts[1:] + [len(self.stream) + 1]
        return [self.stream[s:e - 1] for s, e in zip(self._starts, ends)]

    def _index_output(self, tokens: list[int]) -> None:
        stream, key = self.stream, self.params.copy_key
        stream.append(SEP)
        start = len(stream)
        self._starts.append(start)
        stream.extend(tokens)
        for p, keys in enumerate(keys_along(tokens, key, key), start + key):
            self.index.add(keys[key], p)

    # --- what a file holds ----------------------------------------------------------------

    def rows(self):
        """(order, context key, token, count) of every n-gram count, oldest context first (so that
        loading keeps their age) and each context's best token last (so that loading keeps it)."""
        for o, table in self.ngrams.tables.items():
            for k, entry in table.items():
                for t, c in sorted(entry.counts.items(), key=lambda tc: tc[0] == entry.best):
                    yield o, k, t, c

    def restore(self, rows, counts: dict[str, Judged], stream: list[int]) -> None:
        """Fill an empty memory with what a file holds (see `rows`); ValueError if it cannot be."""
        tables = self.ngrams.tables
        for o, k, t, c in rows:
            if o not in tables or c < 1:
                raise ValueError("it holds an impossible entry")
            self.ngrams.count(tables[o], k, t, c)
        for group, judged in counts.items():
            self.acceptance.set_counts(group, judged)
        self._bound()  # in case the file was written with a larger bound
        starts = [i + 1 for i, t in enumerate(stream) if t == SEP] + [len(stream) + 1]
        for s, e in zip(starts, starts[1:]):
            self._append_stream(stream[s:e - 1])
        self.mark_saved()

    # --- what to merge into the file ---------------------------------------------------------

    def unsaved(self) -> list[list[int]]:
        """The outputs added since the memory was loaded or last saved."""
        return list(self._added)

    def learned(self) -> dict[str, Judged]:
        """What this process learned about memory's drafts since it loaded (per group)."""
        out = {}
        for group, mine in self.acceptance.counts.items():
            was = self._base.get(group, Judged())
            out[group] = Judged(mine.accepted - was.accepted, mine.expected - was.expected,
                                mine.judged - was.judged)
        return out

    def mark_saved(self) -> None:
        """Everything so far is in the file now."""
        self._added.clear()
        self._base = {g: Judged(c.accepted, c.expected, c.judged) for g, c in self.acceptance.counts.items()}
