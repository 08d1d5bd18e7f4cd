"""specgen's cache directory and the one way its files are written.

Every cache file (calibration curves, memories) is replaced atomically: written to a temporary
file beside it, flushed to disk, then renamed over it, so a reader sees the old file or the new
one; `locked` serialises read-merge-write cycles between processes. Caches are optimisations:
callers turn an OSError from here into a warning, never a lost result.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from pathlib import Path
from typing import BinaryIO, Callable, Iterator

CACHE_ENV = "SPECGEN_CACHE_DIR"


def cache_dir() -> Path:
    """specgen's cache directory: $SPECGEN_CACHE_DIR, else the platform's user cache directory."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Caches" / "specgen"
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "specgen"


def write_atomic(path: Path, write: Callable[[BinaryIO], None]) -> None:
    """Replace `path` with what `write(file)` writes, atomically; raises OSError on failure and
    then leaves no temporary file behind."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """An exclusive lock on `path` (through `path`.lock beside it) for a read-merge-write cycle."""
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield
