"""The files of a batch run (`specgen run --prompts FILE [-o OUT]`), without a model.

Owns what a prompt row looks like (also for `specgen bench`), reading a prompts file or stream
into `Item`s and `BadLine`s, and the results file: `done_ids` for resuming (it repairs a line
half-written by a killed run) and `ResultWriter`, which makes each result durable the moment it
is written. batch_run.py drives the engine between them. No mlx here.

Results file: one JSON object per line with an "id". A line with an "error" is not done: a rerun
retries it and appends its result, so an id may have an error line followed by its result (the
last line of an id is its outcome). A run holds an exclusive lock on the file while it reads or
appends, so a second run on the same file is refused rather than interleaved.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import IO, Iterator, NamedTuple

from specgen.errors import InputError, SettingError
from specgen.settings import check

try:
    import fcntl
except ImportError:  # no flock (Windows): runs on one file are not kept apart
    fcntl = None

Prompt = str | list  # a user message, or a conversation (list of {"role", "content"})
ROLES = ("system", "user", "assistant")


class Item(NamedTuple):
    """One usable input line: its id (given, else the line number) and what to generate."""
    id: str
    line: int
    prompt: Prompt
    prediction: str | None = None
    max_tokens: int | None = None


class BadLine(NamedTuple):
    """An input line that cannot be run; `id` is None when the line did not say one."""
    line: int
    id: str | None
    error: str


def conversation(row: dict) -> Prompt:
    """The prompt of a JSON row: {"prompt": text} or {"messages": [{"role", "content"}...]}
    ending with a user turn; InputError naming the field otherwise."""
    if "messages" in row:
        msgs = row["messages"]
        if (not isinstance(msgs, list) or not msgs or not all(
                isinstance(m, dict) and isinstance(m.get("content"), str) and m.get("role") in ROLES
                for m in msgs) or msgs[-1]["role"] != "user"):
            raise InputError("\"messages\" must be a list of {\"role\", \"content\"} ending with a user turn")
        return msgs
    if "prompt" not in row:
        raise InputError("expected {\"prompt\": \"...\"} or {\"messages\": [...]}")
    if not isinstance(row["prompt"], str) or not row["prompt"].strip():
        raise InputError("\"prompt\" must be a non-empty string")
    return row["prompt"]


def prompt_rows(source: str | IO[str]) -> Iterator[tuple[int, dict | None, str | None]]:
    """(line number, row, reason) for each non-blank line of a prompts file (a path; '-' is stdin)
    or text stream. JSONL if the first non-blank line starts with '{': a row is the line's JSON
    object, else None with the reason. Plain text otherwise: each line is {"prompt": line}.
    InputError if the file cannot be read."""
    if source == "-":
        source = sys.stdin
    # Any file that exists may be read: a pipe such as <(...) or /dev/stdin too.
    if isinstance(source, (str, os.PathLike)) and (not Path(source).exists() or Path(source).is_dir()):
        raise InputError(f"{source} is a directory, not a prompts file" if Path(source).is_dir()
                         else f"no such prompts file: {source}")
    return _rows(source)


def _rows(source) -> Iterator[tuple[int, dict | None, str | None]]:
    jsonl = None  # decided by the first non-blank line
    for n, line in _lines(source):
        if line is None or not line.strip():
            if line is None:
                yield n, None, "not UTF-8 text"
            continue
        jsonl = line.lstrip().startswith("{") if jsonl is None else jsonl
        try:
            row = json.loads(line) if jsonl else {"prompt": line}
        except json.JSONDecodeError as e:
            yield n, None, f"not JSON ({e.msg}); a JSONL prompts file must be JSON on every line"
            continue
        yield (n, row, None) if isinstance(row, dict) else (n, None, "expected a JSON object")


def _lines(source) -> Iterator[tuple[int, str | None]]:
    """Numbered lines split at '\\n' only (a JSON string may hold U+2028, which splitlines splits
    at); None for a line that is not UTF-8, so that one bad line does not stop the others."""
    if not isinstance(source, (str, os.PathLike)):
        try:
            for n, line in enumerate(source, 1):
                yield n, (line.lstrip("\ufeff") if n == 1 else line).rstrip("\r\n")
        except (OSError, UnicodeDecodeError) as e:  # a text stream cannot skip one bad line
            raise InputError(f"cannot read the prompts: {e}") from e
        return
    try:
        with open(source, "rb") as f:
            for n, raw in enumerate(f, 1):
                try:
                    yield n, raw.decode("utf-8-sig" if n == 1 else "utf-8").rstrip("\r\n")
                except UnicodeDecodeError:
                    yield n, None
    except OSError as e:
        raise InputError(f"cannot read {source}: {e}") from e


def read_items(source: str | IO[str]) -> Iterator[Item | BadLine]:
    """The prompts of a file (a path; '-' is stdin) or text stream, in order: an Item for each
    usable line, a BadLine (with a one-line reason) for each other; InputError if the file
    cannot be read at all. Ids are strings, unique within the file."""
    rows = prompt_rows(source)  # checks the path now, not at the first next()

    def items():
        seen: dict[str, int] = {}  # id -> the line that has it
        for n, row, reason in rows:
            item = BadLine(n, None, reason) if reason else _item(n, row)
            if item.id is not None and item.id in seen and isinstance(item, Item):
                item = BadLine(n, item.id, f"duplicate \"id\" {json.dumps(item.id)}, first on line "
                               f"{seen[item.id]}" + ("" if "id" in row else " (this line's id is its number)"))
            elif item.id is not None:
                seen.setdefault(item.id, n)
            yield item
    return items()


def _item(n: int, row: dict) -> Item | BadLine:
    id_ = row.get("id", n)
    if isinstance(id_, bool) or not isinstance(id_, (str, int)) or id_ == "":
        return BadLine(n, None, "\"id\" must be a non-empty string or an integer")
    id_, prediction, max_tokens = str(id_), row.get("prediction"), row.get("max_tokens")
    try:
        prompt = conversation(row)
        if prediction is not None and not isinstance(prediction, str):
            raise InputError("\"prediction\" must be a string")
        check(max_tokens=max_tokens)  # settings.py's range, as for --max-tokens
    except SettingError as e:  # caught before InputError, which it is
        return BadLine(n, id_, e.naming("\"max_tokens\""))
    except InputError as e:
        return BadLine(n, id_, str(e))
    return Item(id_, n, prompt, prediction, max_tokens)


def done_ids(out_path: str | os.PathLike) -> set[str]:
    """Ids with a result (a line without "error") in the results file `out_path`; empty if it does
    not exist. A half-written last line (a killed run) is cut off the file; InputError, the file
    untouched, if another line is not a result or another run is writing the file."""
    if not Path(out_path).is_file():  # missing, or not a file to resume from (/dev/stdout)
        if Path(out_path).is_dir():
            raise InputError(f"{out_path} is a directory, not a results file")
        return set()
    try:
        with open(out_path, "r+b") as f:
            _lock(f, out_path)
            return _repair(f, out_path)
    except OSError as e:
        raise InputError(f"cannot update {out_path}: {e}") from e


def _lock(f, path) -> None:
    if fcntl is not None:
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise InputError(f"{path} is being written by another specgen run") from None


def _repair(f, path) -> set[str]:
    """The done ids of the locked file `f`, after cutting off a torn last line (or ending a
    complete one with its newline), so that appending starts a line of its own."""
    f.seek(0)
    *lines, tail = f.read().split(b"\n")
    terminated = not tail and bool(lines)
    last = lines.pop() if terminated else tail  # the only line a kill can have left unfinished
    done, keep = set(), sum(len(raw) + 1 for raw in lines)
    for n, raw in enumerate([*lines, last], 1):
        record = _record(raw)
        if isinstance(record, dict) and "error" not in record and isinstance(record["id"], str):
            done.add(record["id"])
        # Only the last line can be torn (by a kill: it starts with '{' as all ours do; by a power
        # cut: NULs). Anything else is the user's: refused, never cut.
        elif (isinstance(record, str) and not (n > len(lines) and record.startswith("not JSON")
                                               and (raw.startswith(b"{") or not raw.strip(b"\0")))):
            raise InputError(f"{path}:{n}: not a result line ({record}); not appending to this file")
    if isinstance(_record(last), str):
        f.truncate(keep)
    elif not terminated and last:  # the whole object, only its newline missing: keep it
        f.seek(0, os.SEEK_END)
        f.write(b"\n")
    f.flush()
    os.fsync(f.fileno())
    return done


def _record(raw: bytes) -> dict | str | None:
    """A result line's object, None for a blank line, or why it is not one."""
    if not raw.strip():
        return None
    try:
        record = json.loads(raw)
    except ValueError as e:  # UnicodeDecodeError included
        return f"not JSON: {e}"
    return record if isinstance(record, dict) and "id" in record else "no \"id\" field"


class ResultWriter:
    """Writes results as JSON lines, each flushed (and fsynced, for a file) as it is written: to a
    results file (appended to, locked while open, a torn last line cut first) or a text stream
    (stdout), which it leaves open. A context manager."""

    def __init__(self, out: str | os.PathLike | IO[str]):
        self._stream, self._file = (None, None) if isinstance(out, (str, os.PathLike)) else (out, None)
        if self._stream is not None:
            return
        # Only a regular file is locked, repaired and fsynced (not a pipe such as /dev/stdout).
        self._regular = not Path(out).exists() or Path(out).is_file()
        try:
            self._file = open(out, "a+b" if self._regular else "ab")  # a+: can read the last byte
            if self._regular:
                _lock(self._file, out)
                if self._file.seek(0, os.SEEK_END) > 0:
                    self._file.seek(-1, os.SEEK_END)
                    if self._file.read(1) != b"\n":  # not repaired by done_ids: never glue lines
                        _repair(self._file, out)
        except BaseException as e:
            if self._file is not None:
                self._file.close()
            if isinstance(e, OSError):
                raise InputError(f"cannot write {out}: {e}") from e
            raise

    def write(self, record: dict) -> None:
        """Write `record` as one JSON line, now; ValueError (nothing written) if it is not JSON."""
        line = json.dumps(record, ensure_ascii=False, allow_nan=False) + "\n"
        if self._stream is not None:
            self._stream.write(line)
            self._stream.flush()
            return
        self._file.write(line.encode("utf-8"))
        self._file.flush()
        if self._regular:
            os.fsync(self._file.fileno())

    def close(self) -> None:
        """Close the results file (releasing its lock); a stream is left open."""
        if self._file is not None:
            self._file.close()

    def __enter__(self) -> ResultWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
