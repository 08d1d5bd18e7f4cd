"""Cross-request memory (opt-in): the output n-grams of earlier generations with the same model.

Chat answers from one model reuse its phrasing, so the n-gram tables of earlier outputs predict
later ones. The memory is a file per model under the user cache directory: bounded in size
(the most-used contexts are kept), merged under an exclusive lock and replaced atomically (two
processes may finish at once), and never trusted: a corrupt or foreign file is ignored with a
warning. It holds no pickles: numpy arrays loaded with allow_pickle=False.
"""

from __future__ import annotations

import copy
import json
import os
import re
import sys
import tempfile
from pathlib import Path

import numpy as np

from . import defaults
from .drafter import COPY_KEY, Calibration, remember
from .predictor import NGramPredictor, keys_along


def _split(stream: list[int]) -> list[list[int]]:
    """The outputs in a stream (each after a SEP)."""
    pieces: list[list[int]] = []
    for t in stream:
        if t == SEP:
            pieces.append([])
        elif pieces:
            pieces[-1].append(t)
    return pieces

FORMAT, VERSION = "specgen-memory", 1
MAX_CONTEXTS = 200_000  # n-gram contexts a model's memory keeps (a few MB on disk)
MAX_STREAM = 200_000  # tokens of earlier outputs kept verbatim for long copies
SEP = -1  # between outputs in the stream: copies never run across it
CACHE_ENV = "SPECGEN_CACHE_DIR"


def cache_dir() -> Path:
    """specgen's cache directory: $SPECGEN_CACHE_DIR, else the platform's user cache directory."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Caches" / "specgen"
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "specgen"


def memory_path(model_key: str) -> Path:
    """The memory file for a model (its repo id or resolved folder)."""
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", model_key).strip("_")[-120:] or "model"
    return cache_dir() / "memory" / f"{slug}.npz"


class NGramMemory:
    """Earlier outputs of one model: their n-gram tables, a bounded stream of them indexed for
    long copies, and how well drafts from both have fared (carried over between requests)."""

    def __init__(self, model_key: str = "", max_order: int = defaults.MAX_ORDER,
                 max_contexts: int = MAX_CONTEXTS):
        self.model_key = model_key
        self.max_contexts = max_contexts
        self.tables = NGramPredictor(max_order=max_order, window=max_order)
        self.calibration = Calibration()
        self.stream: list[int] = []  # recent outputs, each after a SEP
        self.index: dict[int, list[int]] = {}  # context hash -> stream positions that followed it
        self._added: list[list[int]] = []  # outputs added since load, merged into the file on save

    def reader(self) -> "NGramMemory":
        """A view for one request that shares the tables and stream but calibrates a copy of the
        calibration, so that runs being compared (bench) do not learn from one another."""
        view = copy.copy(self)
        view.calibration = self.calibration.copy()
        view._added = []
        return view

    def add(self, tokens) -> None:
        """Remember one finished output (its contexts do not run into the previous one's)."""
        tokens = list(tokens)
        self.tables.forget_history()
        self.tables.update_batch(tokens)
        self._bound()
        self._append_stream(tokens)
        self._added.append(tokens)

    def _bound(self) -> None:
        """Past the bound, drop the least-used contexts, down to 3/4 of it so that pruning is
        rare. Among contexts used as often, shorter ones stay first (they recur in more text), then
        newer ones. `run` saves the memory after each request and `simulate` adds each trace, both
        through `add`: so both draft from the same bounded memory."""
        if self.contexts() <= self.max_contexts:
            return
        ranked = []
        for order, table in self.tables.entries.items():
            for age, (key, entry) in enumerate(reversed(table.items())):  # tables keep insertion order
                ranked.append((-entry[3], order, age, key))
        ranked.sort()
        for _, order, _, key in ranked[self.max_contexts * 3 // 4:]:
            del self.tables.entries[order][key]

    def _append_stream(self, tokens: list[int]) -> None:
        tokens = tokens[-(MAX_STREAM // 2):]
        if len(self.stream) + len(tokens) + 1 > MAX_STREAM:
            # Drop the oldest outputs, a quarter of the stream at a time so that re-indexing is rare.
            outputs = _split(self.stream)
            size = sum(len(o) + 1 for o in outputs)
            while outputs and size + len(tokens) + 1 > MAX_STREAM * 3 // 4:
                size -= len(outputs.pop(0)) + 1
            self.stream, self.index = [], {}
            for out in outputs:
                self._index_output(out)
        self._index_output(tokens)

    def _index_output(self, tokens: list[int]) -> None:
        stream = self.stream
        stream.append(SEP)
        start = len(stream)
        stream.extend(tokens)
        for p, keys in enumerate(keys_along(tokens, COPY_KEY, COPY_KEY), start + COPY_KEY):
            remember(self.index, keys[COPY_KEY], p)

    def outputs(self) -> int:
        """How many earlier outputs the stream holds."""
        return self.stream.count(SEP)

    def contexts(self) -> int:
        return sum(len(t) for t in self.tables.entries.values())

    # --- persistence ------------------------------------------------------------------------

    @classmethod
    def load(cls, path: Path, model_key: str, **kw) -> tuple["NGramMemory", str | None]:
        """The memory stored at `path` (empty if absent) and a warning if the file was unusable."""
        mem = cls(model_key, **kw)
        if not path.exists():
            return mem, None
        try:
            mem._read(path)
        except Exception as e:  # any damage at all: start empty rather than crash
            return cls(model_key, **kw), f"ignoring memory file {path}: {e}"
        return mem, None

    def _read(self, path: Path) -> None:
        with open(path, "rb") as f:
            if f.read(4) != b"PK\x03\x04":
                raise ValueError("not a specgen memory file")
        with np.load(path, allow_pickle=False) as z:
            header = json.loads(bytes(z["header"]).decode("utf-8"))
            if header.get("format") != FORMAT or header.get("version") != VERSION:
                raise ValueError("not a specgen memory file of this version")
            if header.get("model") != self.model_key:
                raise ValueError(f"it belongs to model {header.get('model')!r}")
            if header.get("max_order") != self.tables.max_order:
                raise ValueError("it was made with another n-gram order")
            order, key, token, count, stream = (z[k] for k in ("order", "key", "token", "count", "stream"))
        cal = header.get("calibration", {})
        if not (len(order) == len(key) == len(token) == len(count)) or not isinstance(cal, dict):
            raise ValueError("its arrays do not fit together")
        tables = self.tables.entries
        for o, k, t, c in zip(order.tolist(), key.tolist(), token.tolist(), count.tolist()):
            if o not in tables or c < 1:
                raise ValueError("it holds an impossible entry")
            entry = tables[o].get(k)
            if entry is None:
                tables[o][k] = [t, c, {t: c}, c]
            else:  # rows of a context are written with its best token last
                entry[2][t] = entry[2].get(t, 0) + c
                entry[3] += c
                if entry[2][t] >= entry[1]:
                    entry[0], entry[1] = t, entry[2][t]
        for kind, (acc, exp, n) in cal.items():
            self.calibration.set_counts(kind, [float(acc), float(exp), int(n)])
        self._base_cal = {k: list(v) for k, v in self.calibration.counts.items()}
        self._bound()  # in case the file was written with a larger bound
        for piece in _split(stream.tolist()):
            self._append_stream(piece)

    def _arrays(self) -> dict:
        order, key, token, count = [], [], [], []
        for o, table in self.tables.entries.items():  # oldest first: loading keeps their age
            for k, (best, _, counts, _) in table.items():
                for t, c in sorted(counts.items(), key=lambda tc: tc[0] == best):  # best last
                    order.append(o)
                    key.append(k)
                    token.append(t)
                    count.append(c)
        header = json.dumps({"format": FORMAT, "version": VERSION, "model": self.model_key,
                             "max_order": self.tables.max_order,
                             "calibration": self.calibration.counts}).encode("utf-8")
        return {
            "header": np.frombuffer(header, dtype=np.uint8),
            "order": np.array(order, dtype=np.int8),
            "key": np.array(key, dtype=np.uint64),
            "token": np.array(token, dtype=np.int32),
            "count": np.array(count, dtype=np.int32),
            "stream": np.array(self.stream, dtype=np.int32),
        }

    def save(self, path: Path) -> str | None:
        """Merge what this process added into the file at `path`, under a lock; return a warning
        if the file on disk was unusable (it is then replaced)."""
        import fcntl

        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path.with_name(path.name + ".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            merged, warning = NGramMemory.load(path, self.model_key, max_order=self.tables.max_order,
                                               max_contexts=self.max_contexts)
            for tokens in self._added:
                merged.add(tokens)
            # What this process learned about memory's drafts since it loaded, added to the file's.
            base = getattr(self, "_base_cal", {})
            for kind, mine in self.calibration.counts.items():
                disk = merged.calibration.counts.get(kind, [0.0, 0.0, 0])
                was = base.get(kind, [0.0, 0.0, 0])
                merged.calibration.set_counts(kind, [d + m - b for d, m, b in zip(disk, mine, was)])
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
            try:
                with os.fdopen(fd, "wb") as f:
                    np.savez(f, **merged._arrays())
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, path)
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)
        self._added.clear()
        self._base_cal = {k: list(v) for k, v in self.calibration.counts.items()}
        return warning
