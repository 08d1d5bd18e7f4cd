"""Running a batch (`specgen run --prompts FILE [-o OUT]`): every prompt of the file through one
engine (one model load, one calibration), each result written as one JSON line the moment it is
done; with OUT, ids already complete there are skipped, so a killed batch run again finishes.

The file format, resuming and writing are batch.py's; this module only drives the engine.
"""

from __future__ import annotations

import sys

from specgen.api.batch_file import BadLine, ResultWriter, done_ids, read_items
from specgen.draft.stats import RunStats
from specgen.engine.engine import Engine, Request
from specgen.engine.options import Options
from specgen.errors import SpecgenError

EXIT_OK, EXIT_SOME_FAILED, EXIT_INTERRUPTED = 0, 1, 130


def run_batch(engine: Engine, opts: Options, source: str, output: str | None, *, raw: bool = False,
              system: str | None = None, say) -> int:
    """Run every prompt of `source` (a path, or '-' for stdin); return the exit status: 0, or 1
    when some lines or prompts failed (each failure is a result line with an "error")."""
    items = list(read_items(sys.stdin if source == "-" else source))
    done = done_ids(output) if output else set()
    todo = [it for it in items if it.id is None or it.id not in done]
    if done:
        say(f"resuming: {len(items) - len(todo)} of {len(items)} prompts already in {output}")
    failed = ok = 0
    with ResultWriter(output if output else sys.stdout) as out, say.bar("prompts", len(todo)) as advance:
        try:
            for item in todo:
                record = _one(engine, opts, item, raw=raw, system=system)
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
    say(f"{ok} prompts done, {failed} failed" + (f", {len(items) - len(todo)} skipped" if done else ""))
    return EXIT_SOME_FAILED if failed else EXIT_OK


def _one(engine: Engine, opts: Options, item, *, raw: bool, system: str | None) -> dict:
    """The result line of one input line: the text and run stats, or its error."""
    if isinstance(item, BadLine):
        return {"id": item.id, "line": item.line, "error": item.error}
    try:
        ids = engine.encode(item.prompt, raw=raw, system=system)
        if item.max_tokens is not None:
            opts = Options(**{**vars(opts), "max_tokens": item.max_tokens})
        stats = RunStats()
        text = "".join(r.text for r in engine.stream(Request(ids, opts, prediction=item.prediction), stats))
    except SpecgenError as e:
        return {"id": item.id, "line": item.line, "error": str(e)}
    return {"id": item.id, "text": text, **stats.to_dict()}
