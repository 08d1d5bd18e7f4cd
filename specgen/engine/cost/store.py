"""The calibration files: measured cost curves by "model key|machine" (`machine_id`: what a curve
depends on besides the model), in the cache directory (calibration.json: one sequence's curve;
batch_calibration.json: a batched step's by rows).

Entries are checked when read (a damaged one reads as none), and each file is written atomically
under a lock (calibrate.py and batch.py measure and save; `specgen cache` lists and forgets)."""

from __future__ import annotations

import ctypes
import json
import math
import os
import platform
from pathlib import Path

import mlx.core as mx

from specgen.engine.cost.curve import Curve
from specgen.store import cache_dir, locked, write_atomic

VERSION = 8  # of how curves are measured (calibrate.py): curves measured otherwise are measured again


def blas() -> str:
    """The BLAS that MLX's CPU matmuls run on: a preloaded library (as the README's Linux benchmarks
    use), else the one the mlx wheel brings; and on how many threads."""
    name, threads = os.environ.get("LD_PRELOAD", "").strip() or "bundled BLAS", blas_threads()
    return f"{name} ({threads} thread{'s' * (threads != 1)})"


def blas_threads() -> int:
    """Threads MLX's CPU matmuls run on: a loaded OpenBLAS's, else 1 (the reference BLAS the Linux
    wheel brings runs on the calling thread)."""
    try:
        get = getattr(ctypes.CDLL(None), "openblas_get_num_threads", None)
    except OSError:
        get = None
    return int(get()) if get is not None else 1


def cores() -> int:
    """CPU cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def host_has_a_core() -> bool:
    """Whether the host's Python runs beside the model's compute rather than on cores it takes from
    it: on a GPU, or on a CPU whose matmuls leave a core free (docs/design.md, "Where the host
    competes with the device")."""
    return mx.default_device().type != mx.cpu or blas_threads() < cores()


def machine_id() -> str:
    """What the curve depends on besides the model: this machine, its MLX device and version, and
    (on the CPU) the BLAS and its threads, which change the curve's shape."""
    return (f"{platform.node()}|{platform.machine()}|{mx.default_device()}|mlx {mx.__version__}"
            f"|{blas()}|v{VERSION}")


def entry_key(model_key: str) -> str:
    """A model's key in the calibration files: the model, on this machine."""
    return f"{model_key}|{machine_id()}"


def calibration_file() -> Path:
    return cache_dir() / "calibration.json"


def batch_calibration_file() -> Path:
    return cache_dir() / "batch_calibration.json"


def save_entry(path: Path, key: str, entry: dict) -> None:
    """Add or replace one entry, under the lock (another process may be saving its own model's),
    atomically; a damaged file is replaced. An OSError says the file cannot be written."""
    with locked(path):
        try:
            store = read_store(path)
        except ValueError:
            store = {}  # damaged: replaced by what is saved now
        store[key] = entry
        write_atomic(path, lambda f: f.write(json.dumps(store, indent=1).encode()))


def valid_curve(entry) -> Curve | None:
    """The curve of a cache entry, or None if the entry is damaged in any way."""
    try:
        rel = {int(k): float(v) for k, v in entry["relative"].items()}
        overlap = float(entry["overlap"])
        eager = entry["eager"]
    except (KeyError, ValueError, TypeError, AttributeError):
        return None
    if (len(rel) < 2 or 1 not in rel or not all(k >= 1 and math.isfinite(v) and v >= 1.0 for k, v in rel.items())
            or not (math.isfinite(overlap) and 0.0 <= overlap < 1.0)
            or type(eager) is not int or eager < 0):
        return None
    return Curve(rel, overlap, eager)


def read_store(path: Path) -> dict:
    try:
        store = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    return store if isinstance(store, dict) else {}


def flat(curve: Curve | None) -> list[float]:
    return [] if curve is None else [curve.overlap, curve.eager,
                                     *(x for kv in sorted(curve.relative.items()) for x in kv)]


def unflat(values: list[float]) -> Curve | None:
    if not values:
        return None
    return Curve({int(k): v for k, v in zip(values[2::2], values[3::2])}, values[0], int(values[1]))


def stored_curves() -> dict[str, dict]:
    """The cached calibration entries, by "model key|machine"."""
    try:
        return read_store(calibration_file())
    except (OSError, ValueError):
        return {}


def forget_curves(model_key: str | None = None) -> int:
    """Drop the cached curves (single-sequence and batched) of one model, on every machine, or all
    of them; how many went."""
    gone = 0
    for path in (calibration_file(), batch_calibration_file()):
        if not path.exists():
            continue
        with locked(path):
            try:
                store = read_store(path)
            except ValueError:
                store = {}  # damaged: nothing in it can be used anyway
            dropped = [k for k in store if model_key is None or k.split("|", 1)[0] == model_key]
            for k in dropped:
                del store[k]
            write_atomic(path, lambda f: f.write(json.dumps(store, indent=1).encode()))
        gone += len(dropped)
    return gone
