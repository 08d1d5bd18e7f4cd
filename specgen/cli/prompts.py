"""Where a command's prompt comes from (an argument, a file, or standard input), and its output
format (a JSON Schema or grammar file)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TextIO

from specgen.errors import InputError
from specgen.structured.formats import Format, parse


def read_file(path: str) -> str:
    """A UTF-8 text file's contents; a missing or unreadable file is an InputError naming it."""
    p = Path(path)
    if not p.exists():
        raise InputError(f"no such file: {path}")
    try:
        data = p.read_bytes()
    except OSError as e:
        raise InputError(f"cannot read {path}: {e.strerror or e}") from e
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputError(f"{path} is not UTF-8 text (invalid byte at offset {e.start})") from e


def _read_stream(stream: TextIO) -> str:
    data = stream.buffer.read() if hasattr(stream, "buffer") else stream.read()
    if isinstance(data, str):
        return data
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputError(f"standard input is not UTF-8 text (invalid byte at offset {e.start})") from e


def read_prompt(argument: str | None, file: str | None, stdin: TextIO) -> str:
    """The prompt text: a file (`-` = stdin) or piped stdin, then the argument after a blank line.

    Trailing newlines of file and piped text are dropped (`echo` adds one); the argument is verbatim.
    The argument `-` also means stdin. Piped input and an argument combine, as in `llm`:
    `cat code.py | specgen run "Add type hints"`.
    """
    parts = []
    if file is not None:
        parts.append((_read_stream(stdin) if file == "-" else read_file(file)).rstrip("\n"))
        if not parts[0].strip():
            raise InputError(f"the prompt file {'(stdin)' if file == '-' else file} is empty")
    elif argument == "-" or not stdin.isatty():
        piped = _read_stream(stdin)
        if piped.strip():
            parts.append(piped.rstrip("\n"))
    if argument is not None and argument != "-":
        parts.append(argument)
    text = "\n\n".join(parts)
    if not text.strip():
        raise InputError("the prompt is empty (give it as an argument, with -f FILE, or on stdin)")
    return text


def read_format(json_schema: str | None, grammar: str | None) -> tuple[Format | None, str]:
    """The output format `--json-schema FILE` (a JSON Schema) or `--grammar FILE` (a Lark
    grammar) asks for, and the flag that asked (errors name it)."""
    if json_schema and grammar:
        raise InputError("--json-schema and --grammar are two formats: give one")
    if grammar:
        return parse({"type": "grammar", "grammar": read_file(grammar)}), "--grammar"
    if not json_schema:
        return None, ""
    try:
        schema = json.loads(read_file(json_schema))
    except json.JSONDecodeError as e:
        raise InputError(f"--json-schema {json_schema} is not JSON: {e}") from None
    if not isinstance(schema, dict):
        raise InputError(f"--json-schema {json_schema} must hold a JSON Schema (an object)")
    return parse({"type": "json_schema", "schema": schema}), "--json-schema"
