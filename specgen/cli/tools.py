"""The `simulate`, `bench` and `cache` commands (registered by commands.py): wiring only."""

from __future__ import annotations

import json
import sys
from typing import Optional

import typer

from specgen import defaults
from specgen.cli import options
from specgen.cli.kit import (
    Notices,
    cli_errors,
    fail,
    launch_group,
    resolve,
    usage,
)
from specgen.settings import check


@cli_errors
def simulate(
    traces: list[str] = typer.Argument(..., help="Trace files (JSONL): {prompt, output} text or {prompt_ids, output_ids}."),
    tokenizer: Optional[str] = typer.Option(None, "--tokenizer", "-t", show_default=False,
                                            help="Sentencepiece .model, tokenizer.json, or a model folder or alias (needed for text traces)."),
    draft: Optional[int] = typer.Option(None, "--draft", show_default=False,
                                        help="Fixed draft length with the plain n-gram predictor (as run --draft). Default: the adaptive drafter."),
    ngram_order: int = options.NGRAM_ORDER,
    window: int = options.WINDOW,
    beta: float = typer.Option(defaults.BETA, "--beta", help="Verify cost per drafted token, relative to one forward pass."),
    memory: bool = typer.Option(False, "--memory", help="Replay each file's traces in order into a memory of its own that starts empty (a file is one model's outputs)."),
    pipeline_after: Optional[int] = typer.Option(None, "--pipeline-after", show_default=False,
                                                 help="Replay as run does where queuing plain steps ahead pays: a fixed --draft queues them after N silent drafter steps; the adaptive drafter while the drafts they hold up cost less than --overlap saves (always without --overlap)."),
    overlap: float = typer.Option(0.0, "--overlap",
                                  help="Share of a plain step that queuing it ahead saves (run's calibration measures it): queued steps, and mlx-lm's plain decoding, cost that much less."),
    json_out: bool = typer.Option(False, "--json", help="Print a JSON list, one object per file."),
    quiet: bool = typer.Option(False, "-q", "--quiet", help="No progress on stderr."),
):
    """Replay real model outputs through the drafter: steps, acceptance and predicted speedup."""
    from specgen.cli.report import simulate_table
    from specgen.draft.drafter import make_drafter
    from specgen.draft.length import linear_cost
    from specgen.draft.memory import NGramMemory
    from specgen.draft.simulate import simulate_file
    from specgen.draft.traces import read_traces
    from specgen.engine.cost.curve import drafting_cost
    from specgen.engine.cost.mode import DraftMode
    from specgen.engine.load.registry import tokenizer_for

    check(draft=draft, ngram_order=ngram_order, window=window, beta=beta, queue_after=pipeline_after,
          overlap=overlap)
    say = Notices(quiet, "specgen simulate")
    mode = DraftMode("auto" if draft is None else "fixed", defaults.MAX_DRAFT if draft is None else draft)
    encode = tokenizer_for(tokenizer) if tokenizer else None
    cost = drafting_cost(linear_cost(beta), overlap, pipeline_after)  # as run's, for this policy
    files = [(path, read_traces(path, encode)) for path in traces]
    reports = []
    with say.bar("replaying", sum(len(t) for _, t in files)) as advance:
        for path, rows in files:
            # A memory holds one model's outputs, as run's does: files (models) do not share one.
            mem = NGramMemory("simulate", max_order=ngram_order) if memory else None
            reports.append(simulate_file(
                path, rows,
                lambda: make_drafter(draft, max_order=ngram_order, window=window, cost=cost, memory=mem),
                draft=mode.cap, beta=beta, memory=mem, queue_after=pipeline_after, overlap=overlap,
                progress=advance))
    if json_out:
        sys.stdout.write(json.dumps([r.to_dict() for r in reports], indent=1) + "\n")
        return
    simulate_table(reports, draft_mode=str(mode), beta=beta, memory=memory, queue_after=pipeline_after,
                   overlap=overlap)


@cli_errors
def bench(
    model: str = options.MODEL,
    prompts: Optional[str] = typer.Option(None, "--prompts", show_default=False,
                                          help="Your prompts: one per line, or JSONL {\"prompt\" or \"messages\", \"set\"}. Default: built-in sets."),
    max_tokens: int = typer.Option(defaults.BENCH_MAX_TOKENS, "-n", "--max-tokens", help="Tokens per prompt."),
    repeats: int = typer.Option(defaults.BENCH_REPEATS, "--repeats", help="Timed rounds per set."),
    draft: Optional[int] = typer.Option(None, "--draft", show_default=False, help="Fixed draft length (as run --draft); default: adaptive."),
    recalibrate: bool = options.RECALIBRATE,
    memory: bool = typer.Option(False, "--memory", help="Draft with this model's memory of earlier outputs, read-only (bench adds nothing to it)."),
    raw: bool = typer.Option(False, "--raw", help="Send prompts without the chat template."),
    json_out: bool = typer.Option(False, "--json", help="Print a JSON list, one object per prompt set."),
    dtype: Optional[str] = options.DTYPE,
    quiet: bool = typer.Option(False, "-q", "--quiet", help="No progress or notices on stderr."),
):
    """Measure specgen against mlx-lm's plain greedy decoding on the same prompts."""
    from specgen.cli.bench import builtin_sets, read_prompt_file, replayer, run_set
    from specgen.cli.report import bench_table
    from specgen.draft.drafter import make_drafter
    from specgen.engine.cost.mode import DraftMode
    from specgen.engine.cost.store import blas
    from specgen.engine.prompts import encode_prompt

    group = launch_group(None, None, memory)  # under mlx.launch: every rank runs this, rank 0 speaks
    say = Notices(quiet, "specgen bench")
    check(max_tokens=max_tokens, draft=draft, repeats=repeats, dtype=dtype)
    if memory and draft is not None:
        usage("--memory drafts only with the adaptive drafter: leave out --draft")
    sets = read_prompt_file(prompts) if prompts else None  # under mlx.launch, on every machine
    from specgen.engine.engine import Engine

    engine = Engine.load(model, dtype=dtype, world=group, notice=say.warn, progress=say.progress)
    loaded = engine.loaded
    chat = loaded.spec.chat_template and not raw and getattr(loaded.tokenizer, "has_chat_template", False)
    sets = sets or builtin_sets(chat)
    found = engine.costs(recalibrate) if draft is None else None
    mem = engine.memory(defaults.MAX_ORDER) if memory else None
    if mem is not None and not mem.outputs():
        say.warn(f"{loaded.spec.name} has no memory yet; `specgen run --memory` builds it")
    mode = DraftMode("auto" if draft is None else "fixed", defaults.MAX_DRAFT if draft is None else draft,
                     found.curve if found else None, mem.outputs() if mem else None)

    def make():  # a fresh drafter per run, each with its own view of the memory
        return make_drafter(draft, cost=found.drafting if found else None, memory=mem.reader() if mem else None)

    off = found.off if found else None
    predict = (replayer(make, 0 if off else mode.cap, max_tokens, found.step,
                        0 if off else found.queue_after, found.curve.overlap) if found else None)
    encoded = {}
    for name, texts in sets.items():
        ids = [encode_prompt(loaded.tokenizer, t, chat=chat) for t in texts]
        fit = [p for p in ids if loaded.context_length is None or len(p) < loaded.context_length]
        if len(fit) < len(ids):
            say.warn(f"{name}: {len(ids) - len(fit)} prompt(s) longer than the model's context "
                     f"({loaded.context_length} tokens) left out")
        if fit:
            encoded[name] = fit
    if not encoded:
        fail(f"no prompt fits the model's context ({loaded.context_length} tokens)")
    results = []
    with say.bar("benchmarking", sum(len(ids) for ids in encoded.values()) * repeats) as advance:
        for name, ids in encoded.items():
            res = run_set(name, loaded.model, ids, max_tokens=max_tokens, repeats=repeats,
                          stop=loaded.stop_ids, context_length=loaded.context_length,
                          queue_after=found.queue_after if found else None, make=make, draft=mode.cap, off=off,
                          prices=found.prices if found else None, predict=predict, progress=advance)
            results.append(res.to_dict())
    for r in results:
        for d in r["divergences"]:
            say(f"{r['set']}: prompt {d['prompt']} diverges from mlx-lm at token {d['at_token']}")
    if json_out:
        sys.stdout.write(json.dumps([{"model": loaded.spec.name, "draft_mode": str(mode), "blas": blas(),
                                      "ranks": group.size if group else 1, "sharding": loaded.sharding, **r}
                                     for r in results], indent=1) + "\n")
        return
    bench_table(results, model=loaded.spec.name, draft_mode=str(mode), blas=blas())


cache = typer.Typer(help="Where memories and calibration curves live; clear them.", no_args_is_help=False,
                    rich_markup_mode=None)


@cache.callback(invoke_without_command=True)
@cli_errors
def cache_list(ctx: typer.Context,
               json_out: bool = typer.Option(False, "--json", help="Print one JSON object.")):
    """List the cache: each model's memory files and calibration curves, and their sizes."""
    if ctx.invoked_subcommand is not None:
        return
    from specgen.draft import memory_file
    from specgen.engine.cost.store import calibration_file, stored_curves
    from specgen.store import cache_dir

    memories = memory_file.stored()
    curves = stored_curves()
    if json_out:
        sys.stdout.write(json.dumps({
            "cache_dir": str(cache_dir()),
            "memories": [{"file": str(m.path), "model": m.model, "used_from": m.label, "ngram_order": m.max_order,
                          "outputs": m.outputs, "bytes": m.size, "problem": m.problem} for m in memories],
            "calibrations": [{"model": k.split("|", 1)[0], "machine": k.split("|", 1)[-1]} for k in curves],
        }, indent=1) + "\n")
        return
    out = [f"cache directory: {cache_dir()} (set by SPECGEN_CACHE_DIR, else the platform's cache)"]
    out.append(f"memories ({len(memories)}):")
    for m in memories:
        what = m.problem or f"{m.outputs} outputs, n-gram order {m.max_order}"
        where = f" ({m.label})" if m.label and m.label != m.model else ""
        out.append(f"  {m.model}{where}: {what}, {m.size / 1e6:.1f} MB  {m.path.name}")
    path = calibration_file()
    out.append(f"calibrations ({len(curves)}) in {path}:")
    for k in curves:
        out.append(f"  {k.split('|', 1)[0]}  ({k.split('|', 1)[-1]})")
    sys.stdout.write("\n".join(out) + "\n")


@cache.command("clear")
@cli_errors
def cache_clear(
    model: Optional[str] = typer.Option(None, "-m", "--model", show_default=False,
                                        help="Clear this model's entries (alias, repo id or folder)."),
    all_models: bool = typer.Option(False, "--all", help="Clear every model's entries."),
    memory_only: bool = typer.Option(False, "--memory", help="Only memories."),
    calibration_only: bool = typer.Option(False, "--calibration", help="Only calibration curves."),
):
    """Delete a model's (or every model's) memories and calibration curves."""
    from pathlib import Path

    from specgen.draft import memory_file
    from specgen.engine.cost.store import forget_curves
    from specgen.engine.load import registry

    if (model is None) == (not all_models):
        usage("say whose entries to clear: -m MODEL or --all (one of the two)")
    key = registry.model_key(resolve(model)) if model else None
    removed = []
    if not calibration_only:
        for m in memory_file.stored():
            if key is None or m.model == key:
                Path(m.path).unlink()
                removed.append(m.path.name)
    curves = 0 if memory_only else forget_curves(key)
    sys.stdout.write(f"removed {len(removed)} memory file(s) and {curves} calibration curve(s)"
                     + (f" of {key}" if key else "") + "\n")


@cli_errors
def ps(
    url: str = typer.Option("http://127.0.0.1:8080", "--url", help="The running server (specgen serve)."),
    api_key: Optional[str] = typer.Option(None, "--api-key", envvar="SPECGEN_API_KEY", show_default=False,
                                          help="Its --api-key, if it has one."),
    json_out: bool = typer.Option(False, "--json", help="Print the server's answer as JSON."),
):
    """What a running `specgen serve` holds: its resident models, their size and when each unloads (UTC)."""
    import urllib.error
    import urllib.request

    asked = urllib.request.Request(f"{url.rstrip('/')}/api/ps",
                                   headers={"Authorization": f"Bearer {api_key}"} if api_key else {})
    try:
        with urllib.request.urlopen(asked, timeout=10) as r:
            models = json.loads(r.read())["models"]
    except urllib.error.HTTPError as e:
        fail(f"{url} answered {e.code}: {e.read()[:200].decode(errors='replace')}")
    except (urllib.error.URLError, OSError, ValueError) as e:
        fail(f"no server at {url}: {e} (start one with specgen serve, or pass --url)")
    if json_out:
        sys.stdout.write(json.dumps(models, indent=1) + "\n")
        return
    rows = [("NAME", "SIZE", "CONTEXT", "UNTIL")] + [
        (m["name"], f"{m['size'] / 1e6:.0f} MB", str(m.get("context_length") or "-"),
         "forever" if m["expires_at"].startswith("2318") else m["expires_at"][:19].replace("T", " ") + " UTC")
        for m in models]
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    sys.stdout.write("\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows) + "\n")
