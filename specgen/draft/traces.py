"""Recorded model outputs to replay (`simulate`), and the tokenizers that turn text traces into ids.

A trace line is {"prompt", "output"} text (optional "id", "category") or pre-tokenized
{"prompt_ids", "output_ids"}, optionally with "topk": for every position of prompt + output, the
recording model's likeliest next tokens, best first (its first one is what the target would have
told a recycling drafter there).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from specgen.errors import InputError


@dataclass
class Trace:
    id: str
    category: str
    prompt: list[int]
    output: list[int]
    predicted: list[int] | None = None  # the model's top-1 after each token of prompt + output


def load_tokenizer(spec: str) -> Callable[[str], list[int]]:
    """An encoder (text -> ids, no special tokens) from a sentencepiece .model, a tokenizer.json, or
    a folder holding one of them (a model alias: `registry.tokenizer_for`)."""
    path = Path(spec).expanduser()
    if not path.exists():
        raise InputError(f"no tokenizer at {spec}: not a file or folder")
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


def _ids(x) -> bool:
    return isinstance(x, list) and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in x)


def read_traces(path: str, encode: Callable[[str], list[int]] | None) -> list[Trace]:
    """The traces of a JSONL file (see the module docstring)."""
    p = Path(path)
    if p.is_dir():
        raise InputError(f"{path} is a directory, not a trace file")
    if not p.is_file():
        raise InputError(f"no such trace file: {path}")
    try:
        lines = p.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"cannot read {path}: {e}") from e
    traces = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise InputError(f"{path}:{n}: not JSON ({e.msg})") from e
        if not isinstance(row, dict):
            raise InputError(f"{path}:{n}: expected a JSON object")
        if "output_ids" in row:
            prompt, output = row.get("prompt_ids", []), row["output_ids"]
            if not all(_ids(x) for x in (prompt, output)):
                raise InputError(f"{path}:{n}: prompt_ids and output_ids must be lists of token ids")
        elif "output" in row:
            if encode is None:
                raise InputError(f"{path}:{n}: text traces need --tokenizer")
            if not all(isinstance(row.get(k, ""), str) for k in ("prompt", "output")):
                raise InputError(f"{path}:{n}: prompt and output must be text")
            prompt, output = encode(row.get("prompt", "")), encode(row["output"])
        else:
            raise InputError(f"{path}:{n}: needs \"output\" (text) or \"output_ids\"")
        if not output:
            raise InputError(f"{path}:{n}: the output is empty: there is nothing to replay")
        predicted = None
        if "topk" in row:
            topk = row["topk"]
            if (not isinstance(topk, list) or len(topk) != len(prompt) + len(output)
                    or not all(_ids(k) and k for k in topk)):
                raise InputError(f"{path}:{n}: \"topk\" must hold a non-empty list of token ids for "
                                 "every position of prompt + output")
            predicted = [k[0] for k in topk]
        traces.append(Trace(str(row.get("id", n)), str(row.get("category", "all")), list(prompt),
                            list(output), predicted))
    if not traces:
        raise InputError(f"{path} holds no traces")
    return traces
