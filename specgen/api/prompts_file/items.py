"""The prompts file of a batch run (`specgen run --prompts FILE`), without a model.

Owns what a prompt row looks like (also for `specgen bench`) and reading a prompts file or stream
into `Item`s and `BadLine`s. Each line is decided on its own: one that starts with '{' is a JSON
object (`{"prompt"}` or `{"messages"}`, an error if it does not parse), any other is a plain-text
prompt, so a file may mix the two. The results file is results.py's; run.py drives
the engine between them. No mlx here.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import IO, Iterator, NamedTuple

from specgen.errors import InputError, SettingError
from specgen.settings import check
from specgen.structured.formats import Format, parse

Prompt = str | list  # a user message, or a conversation (list of {"role", "content"})
ROLES = ("system", "user", "assistant")


class Item(NamedTuple):
    """One usable input line: its id (given, else the line number) and what to generate."""
    id: str
    line: int
    prompt: Prompt
    prediction: str | None = None
    max_tokens: int | None = None
    response_format: Format | None = None  # its own, else the run's (--json-schema, --grammar)


class BadLine(NamedTuple):
    """An input line that cannot be run; `id` is None when the line has no id of its own (it did
    not say one, or one an earlier line has)."""
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
    or text stream: a line that starts with '{' is its JSON object (None with the reason if it is
    not one), any other line {"prompt": line}. InputError if the file cannot be read."""
    if source == "-":
        source = sys.stdin
    # Any file that exists may be read: a pipe such as <(...) or /dev/stdin too.
    if isinstance(source, (str, os.PathLike)) and (not Path(source).exists() or Path(source).is_dir()):
        raise InputError(f"{source} is a directory, not a prompts file" if Path(source).is_dir()
                         else f"no such prompts file: {source}")
    return _rows(source)


def _rows(source) -> Iterator[tuple[int, dict | None, str | None]]:
    for n, line in _lines(source):
        if line is None:
            yield n, None, "not UTF-8 text"
        elif not line.lstrip().startswith("{"):
            if line.strip():
                yield n, {"prompt": line}, None
        else:  # a JSONL line, or one torn or mistyped: not run as text the user did not mean
            try:
                yield n, json.loads(line), None
            except json.JSONDecodeError as e:
                yield n, None, (f"not JSON ({e.msg}); a line that starts with '{{' must be a JSON "
                                "object (text that starts so: {\"prompt\": \"...\"})")
            except (ValueError, RecursionError):  # JSON, but an integer over Python's 4,300 digits
                # or arrays nested past the recursion limit: one bad line, not the end of the run
                yield n, None, "JSON too large to read (a number too long, or nesting too deep)"


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
                item = BadLine(n, None, f"duplicate \"id\" {json.dumps(item.id)}, first on line "
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
        fmt = parse(row.get("response_format"), "\"response_format\"")
    except SettingError as e:  # caught before InputError, which it is
        return BadLine(n, id_, e.naming(e.param if "response_format" in e.param else "\"max_tokens\""))
    except InputError as e:
        return BadLine(n, id_, str(e))
    return Item(id_, n, prompt, prediction, max_tokens, fmt)
