"""Memories on disk: one file per model and n-gram order under the cache directory.

A file is named by its model's key and order (a readable part and a hash of the whole key, so two
models never share a file, and other settings never overwrite it), holds no pickles (numpy arrays
loaded with allow_pickle=False) and is never trusted: one that cannot be read is ignored with a
warning, and kept beside as `.bad` before a new one takes its place. Saving merges what this
process added into the file under an exclusive lock (runs may finish at once) and replaces it
atomically; a save that fails is a warning, never a lost result.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import NamedTuple

import numpy as np

from specgen.draft.acceptance import Judged
from specgen.draft.memory import NGramMemory
from specgen.store import CACHE_ENV, cache_dir, locked, write_atomic

FORMAT, VERSION = "specgen-memory", 1


def memory_dir() -> Path:
    return cache_dir() / "memory"


def memory_path(model_key: str, max_order: int) -> Path:
    """The memory file of a model (registry.model_key: its repo id, or its content's hash for a
    folder) at an n-gram order."""
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", model_key).strip("_")[-60:] or "model"
    digest = hashlib.sha256(f"{model_key}\n{max_order}".encode()).hexdigest()[:16]
    return memory_dir() / f"{slug}-o{max_order}-{digest}.npz"


class Header(NamedTuple):
    model: str
    max_order: int
    counts: dict  # acceptance counts per group, as [accepted, expected, judged]
    label: str  # where the model was last used from (a folder), for people


def _header(z) -> Header:
    header = json.loads(bytes(z["header"]).decode("utf-8"))
    if not isinstance(header, dict) or header.get("format") != FORMAT or header.get("version") != VERSION:
        raise ValueError("not a specgen memory file of this version")
    counts = header.get("calibration", {})
    if not isinstance(counts, dict):
        raise ValueError("its header is damaged")
    return Header(str(header.get("model")), header.get("max_order"), counts, str(header.get("label", "")))


def read(path: Path, model_key: str, label: str = "", **kw) -> NGramMemory:
    """The memory in `path`; ValueError (or OSError) saying why if it cannot be used."""
    with open(path, "rb") as f:
        if f.read(4) != b"PK\x03\x04":
            raise ValueError("not a specgen memory file")
    mem = NGramMemory(model_key, label=label, **kw)
    with np.load(path, allow_pickle=False) as z:
        header = _header(z)
        if header.model != model_key:
            raise ValueError(f"it belongs to model {header.model!r}")
        if header.max_order != mem.ngrams.max_order:
            raise ValueError("it was made with another n-gram order")
        order, key, token, count, stream = (z[k] for k in ("order", "key", "token", "count", "stream"))
    if not len(order) == len(key) == len(token) == len(count):
        raise ValueError("its arrays do not fit together")
    counts = {g: Judged(float(a), float(e), int(n)) for g, (a, e, n) in header.counts.items()}
    mem.restore(zip(order.tolist(), key.tolist(), token.tolist(), count.tolist()), counts, stream.tolist())
    return mem


def load(path: Path, model_key: str, label: str = "", **kw) -> tuple[NGramMemory, str | None]:
    """The memory stored at `path` (empty if absent) and a warning if the file was unusable;
    `label` says where the model is used from (kept in the file for `specgen cache`)."""
    if not path.exists():
        return NGramMemory(model_key, label=label, **kw), None
    try:
        return read(path, model_key, label, **kw), None
    except Exception as e:  # any damage at all: start empty rather than crash
        return NGramMemory(model_key, label=label, **kw), f"ignoring memory file {path}: {e}"


def _arrays(mem: NGramMemory) -> dict:
    rows = list(mem.rows())
    counts = {g: [c.accepted, c.expected, c.judged] for g, c in mem.acceptance.counts.items()}
    header = json.dumps({"format": FORMAT, "version": VERSION, "model": mem.model_key,
                         "label": mem.label, "max_order": mem.ngrams.max_order,
                         "calibration": counts}).encode("utf-8")
    return {"header": np.frombuffer(header, dtype=np.uint8),
            "order": np.array([r[0] for r in rows], dtype=np.int8),
            "key": np.array([r[1] for r in rows], dtype=np.uint64),
            "token": np.array([r[2] for r in rows], dtype=np.int32),
            "count": np.array([r[3] for r in rows], dtype=np.int32),
            "stream": np.array(mem.stream, dtype=np.int32)}


def _keep_bad(path: Path) -> Path:
    """Move an unusable file aside (never delete it): `path`.bad, or .bad.1, .bad.2 ..."""
    bad, n = path.with_name(path.name + ".bad"), 0
    while bad.exists():
        n += 1
        bad = path.with_name(f"{path.name}.bad.{n}")
    os.replace(path, bad)
    return bad


def save(mem: NGramMemory, path: Path) -> str | None:
    """Merge what `mem` added and learned since it was loaded into the file at `path`, under a
    lock; return a warning if the file on disk was unusable (kept as .bad) or could not be saved."""
    kw = dict(max_order=mem.ngrams.max_order, max_contexts=mem.max_contexts, params=mem.params)
    warning = None
    try:
        with locked(path):
            merged, unusable = load(path, mem.model_key, mem.label, **kw)
            if unusable:
                warning = f"the memory file {path} could not be used; kept it as {_keep_bad(path)}"
            for tokens in mem.unsaved():
                merged.add(tokens)
            for group, mine in mem.learned().items():
                disk = merged.acceptance.counts.get(group, Judged())
                merged.acceptance.set_counts(group, Judged(disk.accepted + mine.accepted,
                                                           disk.expected + mine.expected,
                                                           disk.judged + mine.judged))
            write_atomic(path, lambda f: np.savez(f, **_arrays(merged)))
    except OSError as e:
        return (f"cannot save the memory to {path} ({e.strerror or e}); "
                f"set {CACHE_ENV} to a writable folder")
    mem.mark_saved()
    return warning


class Stored(NamedTuple):
    """A memory file as `specgen cache` lists it."""

    path: Path
    model: str
    label: str
    max_order: int | None
    outputs: int
    size: int
    problem: str = ""


def stored() -> list[Stored]:
    """Every memory file in the cache directory (unreadable ones with their problem)."""
    found = []
    for path in sorted(memory_dir().glob("*.npz")) if memory_dir().is_dir() else []:
        try:
            with np.load(path, allow_pickle=False) as z:
                header = _header(z)
                outputs = int(np.count_nonzero(z["stream"] == -1))
            found.append(Stored(path, header.model, header.label, header.max_order, outputs,
                                path.stat().st_size))
        except Exception as e:
            found.append(Stored(path, "?", "", None, 0, path.stat().st_size, str(e) or type(e).__name__))
    return found
