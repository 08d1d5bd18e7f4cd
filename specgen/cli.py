"""The `specgen` command line: wiring only; the work is done by the library modules."""

from __future__ import annotations

import functools
import json
import os
import signal
import sys
import traceback
from pathlib import Path
from typing import Optional

import click
import typer

from . import defaults, registry
from .errors import SpecgenError

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Faster local LLM generation on MLX with model-free (n-gram) speculative decoding.",
)

EXIT_ERROR, EXIT_INTERRUPTED, EXIT_BROKEN_PIPE = 1, 130, 141


def _fail(message: str, code: int = EXIT_ERROR):
    sys.stderr.write(f"specgen: error: {message}\n")
    raise typer.Exit(code)


def cli_errors(command):
    """Turn library errors into one line and exit 1; Ctrl-C into 130; a closed pipe into 141."""

    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        try:
            return command(*args, **kwargs)
        except SpecgenError as e:
            if os.environ.get("SPECGEN_DEBUG") == "1":
                traceback.print_exc()
            _fail(str(e))
        except KeyboardInterrupt:
            sys.stderr.write("specgen: interrupted\n")
            raise typer.Exit(EXIT_INTERRUPTED)
        except BrokenPipeError:
            # The reader (e.g. `head`) is gone: stop quietly, and keep Python's exit-time flush quiet.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            raise typer.Exit(EXIT_BROKEN_PIPE)
        except (typer.Exit, click.exceptions.ClickException, click.exceptions.Abort):
            raise
        except Exception as e:  # anything unforeseen still gets one line, not a traceback
            if os.environ.get("SPECGEN_DEBUG") == "1":
                traceback.print_exc()
            _fail(f"{type(e).__name__}: {e} (set SPECGEN_DEBUG=1 for the traceback)")

    return wrapper


def user_models_file() -> Path:
    """The user's own models.toml, in specgen's config directory."""
    return Path(click.get_app_dir("specgen")) / "models.toml"


def _resolve_model(name: str):
    return registry.resolve(name, registry.load_registry(user_models_file()))


def _cost_for(loaded, draft, recalibrate, notice):
    """For the adaptive drafter: its measured cost function, a note for the stats, and when to
    queue plain steps ahead (see decode.generate); (None, "", None) for --draft N."""
    if draft is not None:
        return None, "", None
    from .calibrate import describe, model_cost, pipeline_after

    cost, curve, overlap, fresh = model_cost(loaded, recalibrate=recalibrate)
    if curve is None:
        return None, "", None  # no speculation: generate() says why
    if fresh:
        notice(f"measured verify cost for {loaded.spec.name}: {describe(curve, overlap)} (cached)")
    return cost, f", {describe(curve, overlap)}", pipeline_after(overlap)


@app.command()
@cli_errors
def run(
    prompt: Optional[str] = typer.Argument(None, help="The prompt; '-' or piped input reads stdin.", show_default=False),
    model: str = typer.Option(defaults.MODEL, "-m", "--model", envvar=defaults.MODEL_ENV,
                              help="Alias from models.toml, Hugging Face repo id, or local folder."),
    file: Optional[str] = typer.Option(None, "-f", "--file", help="Read the prompt from a file ('-' = stdin).", show_default=False),
    max_tokens: int = typer.Option(defaults.MAX_TOKENS, "-n", "--max-tokens", help="Most tokens to generate."),
    draft: Optional[int] = typer.Option(None, "--draft", show_default=False,
                                        help="Draft exactly up to N tokens per step with the plain n-gram predictor; 0 = plain decoding. Default: the adaptive drafter chooses."),
    memory: bool = typer.Option(False, "--memory", help="Learn from and add to this model's n-gram memory of earlier outputs."),
    recalibrate: bool = typer.Option(False, "--recalibrate", help="Measure this model's verify-cost curve again."),
    ngram_order: int = typer.Option(defaults.MAX_ORDER, "--ngram-order", help="Longest n-gram the predictor uses."),
    window: int = typer.Option(defaults.WINDOW, "--window", help="Tokens of history the predictor keeps."),
    temp: float = typer.Option(defaults.TEMP, "--temp", help="Sampling temperature; 0 = greedy."),
    top_p: float = typer.Option(0.0, "--top-p", help="Nucleus sampling: keep this much probability mass (0 = off)."),
    top_k: int = typer.Option(0, "--top-k", help="Sample among the k most likely tokens (0 = off)."),
    min_p: float = typer.Option(0.0, "--min-p", help="Drop tokens below min-p times the top probability (0 = off)."),
    seed: Optional[int] = typer.Option(None, "--seed", help="Sampling seed: same seed, same text. Default: random.", show_default=False),
    raw: bool = typer.Option(False, "--raw", help="Send the prompt as is, without the chat template."),
    system: Optional[str] = typer.Option(None, "--system", help="System message (chat template only).", show_default=False),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object with text and stats instead of streaming."),
    quiet: bool = typer.Option(False, "-q", "--quiet", help="No live stats, summary or notices on stderr."),
    color: bool = typer.Option(False, "--color", help="Colour the text that came from accepted drafts."),
):
    """Generate text from a prompt, speculating with an n-gram predictor."""
    from .decode import Prefilled, check_settings, generate
    from .display import TextView
    from .drafter import make_drafter
    from .prompts import encode_prompt, read_prompt
    from .sampling import make_selector
    from .stats import RunStats

    check_settings(max_tokens=max_tokens, draft=draft)
    selector = make_selector(temp, top_p=top_p, top_k=top_k, min_p=min_p, seed=seed)
    make_drafter(draft, max_order=ngram_order, window=window)  # bad settings fail before the load
    text = read_prompt(prompt, file, sys.stdin)
    loaded = registry.load(_resolve_model(model))
    ids = encode_prompt(loaded.tokenizer, text, chat=loaded.spec.chat_template and not raw, system=system)

    def notice(message: str):
        if not quiet:
            sys.stderr.write(f"specgen: {message}\n")

    mem, mem_path, mem_warned = _read_memory(loaded, ngram_order, notice) if memory else (None, None, False)
    if memory and draft is not None:
        notice("--memory drafts only with the adaptive drafter (no --draft); this run just adds its output to it")
    cost, mode_note, ahead = _cost_for(loaded, draft, recalibrate, notice)
    predictor, cap, mode = make_drafter(draft, max_order=ngram_order, window=window, memory=mem,
                                        cost=cost)
    stats = RunStats(model=loaded.spec.name, draft_mode=mode + mode_note, temp=temp,
                     seed=getattr(selector, "seed", None))
    events = generate(loaded.model, ids, predictor=predictor, draft=cap, max_tokens=max_tokens,
                      stop_tokens=loaded.stop_ids, context_length=loaded.context_length,
                      selector=selector, pipeline_after=ahead)

    interrupted = False
    out_ids: list[int] = []
    view = TextView(loaded.tokenizer, sys.stdout, sys.stderr, stream=not json_out,
                    live=not quiet, color=color)
    with view:
        try:
            for event in events:
                stats.observe(event)
                if isinstance(event, Prefilled):
                    if event.speculation != "on" and draft != 0:
                        notice(f"speculation {event.speculation}; decoding plainly")
                    continue
                if event.notice:
                    notice(event.notice)
                out_ids.extend(event.tokens)
                view.show(event, stats)
        except KeyboardInterrupt:
            interrupted = True
            stats.stop_reason = "interrupted"
        out_text = view.finish()
    if mem is not None and out_ids and not interrupted:
        mem.add(out_ids)
        warning = mem.save(mem_path)
        if warning and not mem_warned:
            notice(f"warning: {warning} (replaced)")
    if json_out:
        sys.stdout.write(json.dumps({"text": out_text, **stats.to_dict()}) + "\n")
    elif not quiet:
        sys.stderr.write(stats.summary() + "\n")
    if interrupted:
        raise typer.Exit(EXIT_INTERRUPTED)


def _read_memory(loaded, ngram_order: int, notice):
    """(memory, its file, whether the file was unusable): this model's memory, empty if none;
    `notice` gets the warning for an unusable file."""
    from .memory import NGramMemory, memory_path

    path = memory_path(loaded.key)
    mem, warning = NGramMemory.load(path, loaded.key, max_order=ngram_order)
    if warning:
        notice(f"warning: {warning}")
    return mem, path, bool(warning)


@app.command()
@cli_errors
def simulate(
    traces: list[str] = typer.Argument(..., help="Trace files (JSONL): {prompt, output} text or {prompt_ids, output_ids}."),
    tokenizer: Optional[str] = typer.Option(None, "--tokenizer", "-t", show_default=False,
                                            help="Sentencepiece .model, tokenizer.json, or a model folder or alias (needed for text traces)."),
    draft: Optional[int] = typer.Option(None, "--draft", show_default=False,
                                        help="Fixed draft length with the plain n-gram predictor (as run --draft). Default: the adaptive drafter."),
    ngram_order: int = typer.Option(defaults.MAX_ORDER, "--ngram-order", help="Longest n-gram the predictor uses."),
    window: int = typer.Option(defaults.WINDOW, "--window", help="Tokens of history the predictor keeps."),
    beta: float = typer.Option(defaults.BETA, "--beta", help="Verify cost per drafted token, relative to one forward pass."),
    memory: bool = typer.Option(False, "--memory", help="Replay each file's traces in order into a memory of its own that starts empty (a file is one model's outputs)."),
    pipeline_after: Optional[int] = typer.Option(None, "--pipeline-after", show_default=False,
                                                 help="Replay as run does where queuing plain steps ahead pays: after N silent drafter steps, a step drafts nothing."),
    overlap: float = typer.Option(0.0, "--overlap",
                                  help="Share of a plain step that queuing it ahead saves (run's calibration measures it): queued steps, and mlx-lm's plain decoding, cost that much less."),
    json_out: bool = typer.Option(False, "--json", help="Print a JSON list, one object per file."),
):
    """Replay real model outputs through the drafter: steps, acceptance and predicted speedup."""
    from .calibrate import drafting_cost
    from .decode import check_settings
    from .drafter import linear_cost, make_drafter
    from .memory import NGramMemory
    from .simulate import load_tokenizer, read_traces, simulate_file

    check_settings(max_tokens=1, draft=draft)
    if beta < 0:
        raise SpecgenError(f"--beta must be 0 or more (got {beta})")
    if pipeline_after is not None and pipeline_after < 1:
        raise SpecgenError(f"--pipeline-after must be at least 1 (got {pipeline_after})")
    if not 0 <= overlap < 1:
        raise SpecgenError(f"--overlap must be at least 0 and below 1 (got {overlap})")
    _, cap, mode = make_drafter(draft, max_order=ngram_order, window=window)  # fails early if bad
    encode = load_tokenizer(tokenizer) if tokenizer else None
    cost = drafting_cost(linear_cost(beta), overlap, pipeline_after)  # as run's, for this policy

    def replay_file(path):
        # A memory holds one model's outputs, as run's does: files (models) do not share one.
        mem = NGramMemory("simulate", max_order=ngram_order) if memory else None
        return simulate_file(
            path, read_traces(path, encode),
            lambda: make_drafter(draft, max_order=ngram_order, window=window, cost=cost, memory=mem)[0],
            draft=cap, beta=beta, memory=mem, pipeline_after=pipeline_after, overlap=overlap)

    reports = [replay_file(path) for path in traces]
    if json_out:
        sys.stdout.write(json.dumps([r.to_dict() for r in reports], indent=1) + "\n")
        return
    from .report import simulate_table

    simulate_table(reports, draft_mode=mode, beta=beta, memory=memory, pipeline_after=pipeline_after,
                   overlap=overlap)


@app.command()
@cli_errors
def bench(
    model: str = typer.Option(defaults.MODEL, "-m", "--model", envvar=defaults.MODEL_ENV,
                              help="Alias from models.toml, Hugging Face repo id, or local folder."),
    prompts: Optional[str] = typer.Option(None, "--prompts", show_default=False,
                                          help="Your prompts: one per line, or JSONL {\"prompt\", \"set\"}. Default: built-in sets."),
    max_tokens: int = typer.Option(defaults.BENCH_MAX_TOKENS, "-n", "--max-tokens", help="Tokens per prompt."),
    repeats: int = typer.Option(defaults.BENCH_REPEATS, "--repeats", help="Timed rounds per set."),
    draft: Optional[int] = typer.Option(None, "--draft", show_default=False, help="Fixed draft length (as run --draft); default: adaptive."),
    recalibrate: bool = typer.Option(False, "--recalibrate", help="Measure the verify-cost curve again."),
    memory: bool = typer.Option(False, "--memory", help="Draft with this model's memory of earlier outputs, read-only (bench adds nothing to it)."),
    raw: bool = typer.Option(False, "--raw", help="Send prompts without the chat template."),
    json_out: bool = typer.Option(False, "--json", help="Print a JSON list, one object per prompt set."),
):
    """Measure specgen against mlx-lm's plain greedy decoding on the same prompts."""
    from .bench import builtin_sets, read_prompt_file, run_set
    from .decode import check_settings
    from .drafter import make_drafter
    from .prompts import encode_prompt

    check_settings(max_tokens=max_tokens, draft=draft)
    if memory and draft is not None:
        raise SpecgenError("--memory drafts only with the adaptive drafter: leave out --draft")
    if repeats < 1:
        raise SpecgenError(f"--repeats must be at least 1 (got {repeats})")
    sets = read_prompt_file(prompts) if prompts else None
    loaded = registry.load(_resolve_model(model))
    chat = loaded.spec.chat_template and not raw and getattr(loaded.tokenizer, "has_chat_template", False)
    sets = sets or builtin_sets(chat)

    def progress(message):
        sys.stderr.write(f"specgen bench: {message}\n")

    cost, note, ahead = _cost_for(loaded, draft, recalibrate, progress)
    mem = _read_memory(loaded, defaults.MAX_ORDER, progress)[0] if memory else None
    if mem is not None and not mem.outputs():
        progress(f"warning: {loaded.spec.name} has no memory yet; `specgen run --memory` builds it")
    mode = make_drafter(draft)[2] + note + (f", memory of {mem.outputs()} earlier outputs" if mem else "")
    results = []
    for name, texts in sets.items():
        ids = [encode_prompt(loaded.tokenizer, t, chat=chat) for t in texts]
        progress(f"{name}: {len(ids)} prompt(s) x {repeats} rounds, {max_tokens} tokens each")
        res = run_set(name, loaded.model, ids, max_tokens=max_tokens, repeats=repeats,
                      stop=loaded.stop_ids, context_length=loaded.context_length, pipeline_after=ahead,
                      make=lambda: make_drafter(draft, cost=cost,
                                                memory=mem.reader() if mem else None)[:2])
        results.append(res.to_dict())
    for r in results:
        for d in r["divergences"]:
            progress(f"{r['set']}: prompt {d['prompt']} diverges from mlx-lm at token {d['at_token']}")
    if json_out:
        sys.stdout.write(json.dumps([{"model": loaded.spec.name, "draft_mode": mode, **r} for r in results],
                                    indent=1) + "\n")
        return
    from .report import bench_table

    bench_table(results, model=loaded.spec.name, draft_mode=mode)


@app.command()
@cli_errors
def models(json_out: bool = typer.Option(False, "--json", help="Print the aliases as JSON.")):
    """List the model aliases (packaged models.toml plus your own)."""
    user_file = user_models_file()
    aliases = registry.load_registry(user_file)
    if json_out:
        rows = [{"alias": s.name, "model": s.source, "description": s.description} for s in aliases.values()]
        sys.stdout.write(json.dumps(rows, indent=1) + "\n")
        return
    from rich.console import Console
    from rich.table import Table

    table = Table("alias", "model", "description", box=None)
    for spec in aliases.values():
        table.add_row(spec.name, spec.source, spec.description)
    console = Console(highlight=False)
    console.print(table)
    console.print(f"\nYour own aliases: {user_file}" + ("" if user_file.exists() else " (not created yet)"),
                  style="dim", markup=False)


def main():  # the console script
    # Die quietly on SIGPIPE-like conditions handled above; keep Ctrl-C as KeyboardInterrupt.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    app()
