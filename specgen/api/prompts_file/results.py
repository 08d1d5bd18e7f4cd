"""The results file of a batch run (`specgen run --prompts FILE -o OUT`): writing each result as a
durable line, and resuming from the file. No mlx here.

Each line is one JSON object answering one input line: {"id", "text", ...} for a prompt that ran,
{"id", "line", "error"} for one that failed or a line that could not be run ("id" null where the
line has no id of its own). A finished run leaves one line per input line, so each id once.

Run again on the same file (`ResultWriter.resume`), a run skips the ids that have a text and the
bad lines whose identical error is already there, and runs the rest again: the error lines their
new outcomes replace are taken out before, so that no id ever has two lines. Taking lines out
writes the file anew beside it and renames it over it (a kill leaves the old file or the new one,
never a mix); a line with a text is never taken out. A line half-written by a killed run is cut
off; any other line that is not a result makes the file refused, untouched. A run holds an
exclusive lock on the file from opening it to the end, so a second run is refused, not mixed in.
"""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path
from typing import IO, NamedTuple

from specgen.api.prompts_file.items import BadLine, Item
from specgen.errors import InputError, SettingError

try:
    import fcntl
except ImportError:  # no flock (Windows): runs on one file are not kept apart
    fcntl = None


class Line(NamedTuple):
    """A result line of the file: its bytes (without the newline) and its object."""
    raw: bytes
    record: dict


def check_output(source: str, output: str | None) -> None:
    """SettingError naming `output` if it is the prompts file `source` ('-': standard input) under
    any name (a link included): its prompt lines, which have ids, would be taken for results."""
    if output is None:
        return
    try:
        prompts = os.fstat(sys.stdin.fileno()) if source == "-" else os.stat(source)
        results = os.stat(output)
    except (OSError, ValueError):  # either is missing, or stdin is not a file
        return
    if stat.S_ISREG(prompts.st_mode) and os.path.samestat(prompts, results):
        raise SettingError("output", f"is the prompts file ({output}): results need a file of their own")


class ResultWriter:
    """Writes results as JSON lines, each flushed (and fsynced, for a file) as it is written: to a
    results file (locked while open, a torn last line cut first; `resume` says what is left to
    run) or a text stream (stdout), which it leaves open. A context manager."""

    def __init__(self, out: str | os.PathLike | IO[str]):
        self._file, self.lines = None, []
        self._stream = None if isinstance(out, (str, os.PathLike)) else out
        if self._stream is not None:
            return
        self._path = Path(out)
        # Only a regular file is locked, repaired and fsynced (not a pipe such as /dev/stdout).
        self._regular = not self._path.exists() or self._path.is_file()
        if self._path.is_dir():
            raise InputError(f"{out} is a directory, not a results file")
        try:
            self._file = open(out, "a+b" if self._regular else "ab")  # a+: can read it back
            if self._regular:
                _lock(self._file, out)
                self.lines = _repair(self._file, out)
        except BaseException as e:
            if self._file is not None:
                self._file.close()
            if isinstance(e, OSError):
                raise InputError(f"cannot write {out}: {e}") from e
            raise

    @property
    def done(self) -> set[str]:
        """The ids that have a text in the file."""
        return {line.record["id"] for line in self.lines if "error" not in line.record}

    def resume(self, entries: list[Item | BadLine]) -> list[Item | BadLine]:
        """The entries (read_items') left to run: those whose id has no text in the file, and the
        bad lines whose identical error is not there. The error lines that their outcomes will
        replace (by line number, or a prompt's id), and repeats of one error, are taken out now."""
        done = self.done
        errors = {_key(line.record) for line in self.lines if "error" in line.record}
        todo = [e for e in entries if e.id not in done
                and not (isinstance(e, BadLine) and (e.line, e.id, e.error) in errors)]
        lines, ids = {e.line for e in todo}, {e.id for e in todo if isinstance(e, Item)}
        kept, seen = [], set()
        for line in self.lines:
            r = line.record
            if "error" in r:
                if _key(r) in seen or r["id"] in done or r.get("line") in lines or r["id"] in ids:
                    continue
                seen.add(_key(r))
            kept.append(line)
        if len(kept) < len(self.lines):
            self._rewrite(kept)
        return todo

    def _rewrite(self, kept: list[Line]) -> None:
        """Replace the file by `kept`: written and locked beside it, then renamed over it (the real
        file, where the path is a link), so that a kill leaves the old file or the new one."""
        real = Path(os.path.realpath(self._path))
        tmp = real.with_name(f".{real.name}.rewrite")  # a leftover from a kill is overwritten
        new = None
        try:
            new = open(os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND), "a+b")
            _lock(new, tmp)
            new.write(b"".join(line.raw + b"\n" for line in kept))
            new.flush()
            os.chmod(new.fileno(), stat.S_IMODE(os.fstat(self._file.fileno()).st_mode))
            os.fsync(new.fileno())
            os.replace(tmp, real)
        except OSError as e:
            if new is not None:
                new.close()
            tmp.unlink(missing_ok=True)
            raise InputError(f"cannot rewrite {self._path}: {e}") from e
        _fsync_dir(real.parent)
        self._file.close()  # the old file's lock goes; the new one is held
        self._file, self.lines = new, kept

    def write(self, record: dict) -> None:
        """Write `record` as one JSON line, now; ValueError (nothing written) if it is not JSON."""
        line = json.dumps(record, ensure_ascii=False, allow_nan=False) + "\n"
        if self._stream is not None:
            self._stream.write(line)
            self._stream.flush()
            return
        if self._regular:
            self._still_there()
        self._file.write(line.encode("utf-8"))
        self._file.flush()
        if self._regular:
            os.fsync(self._file.fileno())
            self.lines.append(Line(line[:-1].encode("utf-8"), record))

    def _still_there(self) -> None:
        """Make sure the file written is the one at the path: deleted meanwhile, a new one is
        written there holding every result so far (and this run goes on into it); replaced by
        another file, that file is left alone and the run stops, naming it (never "done" with
        the results nowhere)."""
        try:
            now = os.stat(self._path)
        except FileNotFoundError:
            now = None
        if now is not None and os.path.samestat(os.fstat(self._file.fileno()), now):
            return
        if now is not None:
            raise InputError(f"{self._path} was replaced by another file while this run wrote to it: "
                             "stopped, that file left as it is (the results so far were in the one replaced)")
        try:
            new = open(os.open(self._path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_APPEND), "a+b")
        except OSError as e:
            raise InputError(f"{self._path} was deleted while this run wrote to it, and cannot be written "
                             f"again: {e}") from e
        _lock(new, self._path)
        new.write(b"".join(line.raw + b"\n" for line in self.lines))
        new.flush()
        os.fsync(new.fileno())
        _fsync_dir(Path(os.path.realpath(self._path)).parent)
        self._file.close()
        self._file = new

    def close(self) -> None:
        """Close the results file (releasing its lock); a stream is left open."""
        if self._file is not None:
            self._file.close()

    def __enter__(self) -> ResultWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _key(record: dict) -> tuple:
    return record.get("line"), record["id"], record["error"]


def _lock(f, path) -> None:
    if fcntl is None:
        return
    try:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise InputError(f"{path} is being written by another specgen run") from None
    # A run that rewrote the file between our open and our lock renamed another over the path.
    if not os.path.samestat(os.fstat(f.fileno()), os.stat(path)):
        raise InputError(f"{path} is being written by another specgen run")


def _fsync_dir(folder: Path) -> None:
    """Make a rename in `folder` durable (where directories can be opened: not on Windows)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _repair(f, path) -> list[Line]:
    """The result lines of the locked file `f`, after cutting off a torn last line (or ending a
    complete one with its newline), so that appending starts a line of its own."""
    f.seek(0)
    *raws, tail = f.read().split(b"\n")
    terminated = not tail and bool(raws)
    last = raws.pop() if terminated else tail  # the only line a kill can have left unfinished
    keep, lines = sum(len(raw) + 1 for raw in raws), []
    for n, raw in enumerate([*raws, last], 1):
        record = _record(raw)
        if isinstance(record, dict):
            lines.append(Line(raw, record))
        # Only the last line can be torn (by a kill: it starts with '{' as all ours do; by a power
        # cut: NULs). Anything else is the user's: refused, never cut.
        elif (isinstance(record, str) and not (n > len(raws) and record.startswith("not JSON")
                                               and (raw.startswith(b"{") or not raw.strip(b"\0")))):
            raise InputError(f"{path}:{n}: not a result line ({record}); not appending to this file")
    if isinstance(_record(last), str):
        f.truncate(keep)
    elif not terminated and last:  # the whole object, only its newline missing: keep it
        f.seek(0, os.SEEK_END)
        f.write(b"\n")
    f.flush()
    os.fsync(f.fileno())
    return lines


def _record(raw: bytes) -> dict | str | None:
    """A result line's object, None for a blank line, or why it is not one."""
    if not raw.strip():
        return None
    try:
        record = json.loads(raw)
    except ValueError as e:  # UnicodeDecodeError included
        return f"not JSON: {e}"
    if not isinstance(record, dict) or "id" not in record:
        return "no \"id\" field"
    if isinstance(record.get("error"), str):  # "id" null: a line with no id of its own
        ok = (record["id"] is None or isinstance(record["id"], str)) and \
            isinstance(record.get("line", 0), int)
    else:
        ok = isinstance(record["id"], str) and isinstance(record.get("text"), str)
    return record if ok else "not {\"id\", \"text\"} or {\"id\", \"line\", \"error\"}"
