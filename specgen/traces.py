"""Recorded model outputs to replay (`simulate`), and the tokenizers that turn text traces into ids.

A trace line is {"prompt", "output"} text (optional "id", "category") or pre-tokenized
{"prompt_ids", "output_ids"}.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from .errors import InputError


@dataclass
class Trace:
    id: str
    category: str
    prompt: list[int]
    output: list[int]


def load_tokenizer(spec: str) -> Callable[[str], list[int]]:
    """An encoder (text -> ids, no special tokens) from a sentencepiece .model, a tokenizer.json, or
    a model folder or alias holding one of them."""
    path = Path(spec).expanduser()
    if not path.exists():
        from . import registry

        try:
            model = registry.resolve(spec, registry.load_registry())
        except Exception as e:
            raise InputError(f"no tokenizer at {spec}: not a file, folder or known alias") from e
        source = registry.local_source(model.source)
        path = Path(source)
        if not path.exists():
            raise InputError(f"simulate needs a local tokenizer; '{spec}' is not downloaded ({source})")
    if path.is_dir():
        for name in ("tokenizer.model", "tokenizer.json"):
            if (path / name).is_file():
                path = path / name
                break
        else:
            raise InputError(f"{spec} holds no tokenizer.model or tokenizer.json")
    try:
        if path.suffix == ".model":
            import sentencepiece

            sp = sentencepiece.SentencePieceProcessor(model_file=str(path))
            return lambda text: sp.encode(text)
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(path))
        return lambda text: tok.encode(text, add_special_tokens=False).ids
    except Exception as e:
        raise InputError(f"cannot load tokenizer {path}: {e}") from e


def read_traces(path: str, encode: Callable[[str], list[int]] | None) -> list[Trace]:
    """The traces of a JSONL file (see the module docstring)."""
    p = Path(path)
    if not p.is_file():
        raise InputError(f"no such trace file: {path}")
    traces = []
    for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise InputError(f"{path}:{n}: not JSON ({e.msg})") from e
        if "output_ids" in row:
            prompt, output = row.get("prompt_ids", []), row["output_ids"]
        elif "output" in row:
            if encode is None:
                raise InputError(f"{path}:{n}: text traces need --tokenizer")
            prompt, output = encode(row.get("prompt", "")), encode(row["output"])
        else:
            raise InputError(f"{path}:{n}: needs \"output\" (text) or \"output_ids\"")
        traces.append(Trace(str(row.get("id", n)), str(row.get("category", "all")), list(prompt), list(output)))
    return traces
