"""Running a batch (`specgen run --prompts FILE [-o OUT] [--batch N]`): every prompt of the file
through one engine (one model load, one calibration), up to N decoded together (the batch engine,
engine/batch/streams.py; each text what the prompt gives alone), each result written as one JSON
line in input order as soon as it and those before it are done; with OUT, what is already there
is skipped, so a killed batch run again finishes. Models whose caches cannot batch, and
`--batch 1`, run one prompt at a time.

The prompts file is items.py's, the results file (resuming, writing) results.py's;
this module only drives the engine.
"""

from __future__ import annotations

import sys
from typing import Iterator

from specgen import defaults
from specgen.api.prompts_file.items import BadLine, read_items
from specgen.api.prompts_file.results import ResultWriter, check_output
from specgen.engine.batch.probe import batch_unsupported
from specgen.engine.batch.streams import Streams
from specgen.engine.engine import Engine, Request
from specgen.engine.options import Options
from specgen.errors import SpecgenError
from specgen.events import Failed
from specgen.stats import RunStats

EXIT_OK, EXIT_SOME_FAILED, EXIT_INTERRUPTED = 0, 1, 130


def run_batch(engine: Engine, opts: Options, source: str, output: str | None, *, raw: bool = False,
              system: str | None = None, say, batch: int = defaults.BATCH) -> int:
    """Run every prompt of `source` (a path, or '-' for stdin), up to `batch` at once; return the
    exit status: 0, or 1 when some lines or prompts failed (each failure is a result line with an
    "error"), in this run or, for a bad line skipped on resuming, before."""
    check_output(source, output)
    items = list(read_items(sys.stdin if source == "-" else source))
    failed = ok = 0
    with ResultWriter(output if output else sys.stdout) as out:
        todo = out.resume(items)
        if len(todo) < len(items):
            say(f"resuming: {len(items) - len(todo)} of {len(items)} prompts already in {output}")
        why = batch_unsupported(engine.loaded.model) if batch > 1 else None
        if why:
            engine.notice(f"prompts run one at a time: {why}")
        results = (_one_at_a_time(engine, opts, todo, raw, system) if batch == 1 or why
                   else _batched(engine, opts, todo, raw, system, batch))
        with say.bar("prompts", len(todo)) as advance:
            try:
                for record in results:
                    failed += "error" in record
                    ok += "error" not in record
                    out.write(record)
                    advance()
            except KeyboardInterrupt:
                say(f"interrupted after {ok + failed} prompts; run the same command again to resume"
                    if output else "interrupted")
                return EXIT_INTERRUPTED
            finally:
                if opts.memory:
                    engine.save_memory()  # what was learnt from the finished prompts
        # Bad lines skipped because their errors are in the file still failed: the status says so.
        bad = (sum(isinstance(e, BadLine) and e.id not in out.done for e in items)
               - sum(isinstance(e, BadLine) for e in todo))
    skipped = len(items) - len(todo)
    say(f"{ok} prompts done, {failed} failed" + (f", {skipped} skipped" if skipped else "")
        + (f" ({bad} bad lines, their errors already in {output})" if bad else ""))
    return EXIT_SOME_FAILED if failed or bad else EXIT_OK


def _request(engine: Engine, opts: Options, item, raw: bool, system: str | None) -> Request:
    ids = engine.encode(item.prompt, raw=raw, system=system)
    if item.max_tokens is not None:
        opts = Options(**{**vars(opts), "max_tokens": item.max_tokens})
    if item.response_format is not None:
        opts = Options(**{**vars(opts), "response_format": item.response_format})
    return Request(ids, opts, prediction=item.prediction)


def _failed(item, error: str) -> dict:
    return {"id": item.id, "line": item.line, "error": error}


def _one_at_a_time(engine: Engine, opts: Options, todo: list, raw: bool, system: str | None) -> Iterator[dict]:
    """The result line of each input line in turn: the text and run stats, or its error."""
    for item in todo:
        if isinstance(item, BadLine):
            yield _failed(item, item.error)
            continue
        try:
            stats = RunStats()
            text = "".join(r.text for r in engine.stream(_request(engine, opts, item, raw, system), stats))
        except SpecgenError as e:
            yield _failed(item, str(e))
            continue
        yield {"id": item.id, "text": text, **stats.to_dict()}


def _batched(engine: Engine, opts: Options, todo: list, raw: bool, system: str | None,
             rows: int) -> Iterator[dict]:
    """The result lines in input order, the prompts decoded `rows` at a time. A prompt joins as
    a row frees up (one more waits to prefill), so the finished ones come out roughly in order."""
    streams = Streams(engine, max_rows=rows)
    records: dict[int, dict] = {}  # by input position, until the ones before are written
    texts: dict[int, list[str]] = {}
    runs: dict[int, RunStats] = {}
    added = written = 0
    while written < len(todo):
        while added < len(todo) and len(streams) <= rows:
            item = todo[added]
            if isinstance(item, BadLine):
                records[added] = _failed(item, item.error)
            else:
                try:
                    runs[added] = streams.add(added, _request(engine, opts, item, raw, system))
                    texts[added] = []
                except SpecgenError as e:
                    records[added] = _failed(item, str(e))
            added += 1
        for i, response in streams.step() if streams.busy else ():
            if isinstance(response, Failed):  # its own error: an error line, the others go on
                texts.pop(i), runs.pop(i)
                streams.kept(i)
                records[i] = _failed(todo[i], str(response.error))
                continue
            texts[i].append(response.text)
            if response.finish_reason is not None:
                records[i] = {"id": todo[i].id, "text": "".join(texts.pop(i)), **runs.pop(i).to_dict()}
        while written in records:
            yield records.pop(written)
            written += 1
