"""The `specgen` command line: wiring only; the work is done by the library modules."""

from __future__ import annotations

import importlib.util
import io
import json
import os
import secrets
import signal
import sys
from pathlib import Path
from typing import Optional

import typer

from specgen import __version__, defaults
from specgen.cli import chat as cli_chat
from specgen.cli import options
from specgen.cli import tools as cli_tools
from specgen.cli.kit import (
    EXIT_INTERRUPTED,
    Notices,
    cli_errors,
    fail,
    launch_group,
    listenable,
    shared_ints,
    usage,
    user_models_file,
)
from specgen.engine.load import registry
from specgen.errors import SettingError
from specgen.serve import config as serve_config
from specgen.settings import check

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # plain help: flags shown as flags, not "--memory <bool>"
    help="Faster local LLM generation on MLX with model-free (n-gram) speculative decoding.",
)


def _version(value: bool):
    if value:
        sys.stdout.write(f"specgen {__version__}\n")
        raise typer.Exit()


@app.callback()
def main_options(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                              help="Print the version and exit.")):
    """Faster local LLM generation on MLX with model-free (n-gram) speculative decoding."""


@app.command()
@cli_errors
def run(
    prompt: Optional[str] = typer.Argument(None, help="The prompt; '-' or piped input reads stdin.", show_default=False),
    model: str = options.MODEL,
    file: Optional[str] = typer.Option(None, "-f", "--file", help="Read the prompt from a file ('-' = stdin).", show_default=False),
    prompts: Optional[str] = typer.Option(None, "--prompts", show_default=False,
                                          help="Run many prompts with one model load: JSONL {\"prompt\" or \"messages\", \"id\"} or plain lines ('-' = stdin); one JSON result line each."),
    output: Optional[str] = typer.Option(None, "-o", "--output", show_default=False,
                                         help="With --prompts: append results to this JSONL file; run again to resume (ids already there are skipped)."),
    batch_rows: Optional[int] = typer.Option(None, "--batch", show_default=False,
                                             help=f"With --prompts: decode up to N prompts together, each speculating (1 = one at a time). Default: {defaults.BATCH}."),
    predict: Optional[str] = typer.Option(None, "--predict", show_default=False,
                                          help="A file with text the output is expected to repeat (e.g. the file being edited): drafts come from it; the output is unchanged."),
    max_tokens: int = options.MAX_TOKENS,
    draft: Optional[int] = options.DRAFT,
    memory: bool = options.MEMORY,
    recalibrate: bool = options.RECALIBRATE,
    ngram_order: int = options.NGRAM_ORDER,
    window: int = options.WINDOW,
    temp: float = options.TEMP,
    top_p: float = options.TOP_P,
    top_k: int = options.TOP_K,
    min_p: float = options.MIN_P,
    seed: Optional[int] = options.SEED,
    raw: bool = typer.Option(False, "--raw", help="Send the prompt as is, without the chat template."),
    system: Optional[str] = options.SYSTEM,
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object with text and stats instead of streaming."),
    quiet: bool = typer.Option(False, "-q", "--quiet", help="No live stats, summary or notices on stderr."),
    color: bool = typer.Option(False, "--color", help="Colour the text that came from accepted drafts."),
    dtype: Optional[str] = options.DTYPE,
    json_schema: Optional[str] = options.JSON_SCHEMA,
    grammar: Optional[str] = options.GRAMMAR,
):
    """Generate text from a prompt (or many: --prompts), speculating with an n-gram predictor."""
    from specgen.cli.display import TextView
    from specgen.cli.prompts import read_file, read_format, read_prompt
    from specgen.cli.report import summary
    from specgen.engine.engine import Engine, Request
    from specgen.engine.options import Options
    from specgen.stats import RunStats

    group = launch_group(prompt, file, memory)  # under mlx.launch: every rank runs this, rank 0 speaks
    say = Notices(quiet)
    fmt, fmt_flag = read_format(json_schema, grammar)
    opts = Options(max_tokens=max_tokens, draft=draft, temp=temp, top_p=top_p, top_k=top_k, min_p=min_p,
                   seed=seed, ngram_order=ngram_order, window=window, memory=memory, response_format=fmt)
    say.settings(opts.check() + check(dtype=dtype, batch=batch_rows))
    batch = prompts is not None
    for value, why in ((prompt, f"the prompt argument ({prompt!r}) is not used with --prompts: each "
                                "line of the file is a prompt"),
                       (file, "--file cannot be used with --prompts: each line of the file is a prompt"),
                       (predict, "--predict cannot be used with --prompts: a JSONL line may carry its "
                                 "own \"prediction\""),
                       (color, "--color cannot be used with --prompts: results are JSON lines")):
        if batch and value:
            usage(why)
    if output is not None and not batch:
        usage("--output needs --prompts (a single run writes to stdout)")
    if batch_rows is not None and not batch:
        usage("--batch needs --prompts (a single prompt is decoded alone)")
    if batch and group is not None:
        fail("--prompts is not supported under mlx.launch yet: run one prompt per launch")
    if batch:
        from specgen.api.prompts_file.results import check_output

        check_output(prompts, output)  # run_batch checks too; here, before a slow load
    if temp > 0 and seed is None:  # every rank must sample with rank 0's seed
        opts = Options(**{**vars(opts), "seed": shared_ints(group, lambda: [secrets.randbits(32)])[0]})
    text = read_prompt(prompt, file, sys.stdin) if group is None and not batch else None  # before a slow load
    prediction = read_file(predict) if predict else None
    engine = Engine.load(model, dtype=dtype, world=group,
                         notice=say.warn, progress=say.progress)
    if fmt is not None:
        try:
            engine.grammars.compile(fmt)  # a format that does not compile fails before any prompt
        except SettingError as e:
            fail(e.naming(fmt_flag))
    if draft is None:
        engine.costs(recalibrate)  # once, before any prompt
    if batch:
        from specgen.api.prompts_file.run import run_batch

        raise typer.Exit(run_batch(engine, opts, prompts, output, raw=raw, system=system, say=say,
                                   batch=defaults.BATCH if batch_rows is None else batch_rows))
    ids = shared_ints(group, lambda: engine.encode(
        text if text is not None else read_prompt(prompt, file, io.StringIO()), raw=raw, system=system))
    stats = RunStats()
    interrupted = False
    view = TextView(sys.stdout, sys.stderr, stream=not json_out, live=not quiet, color=color)
    with view:
        try:
            for response in engine.stream(Request(ids, opts, prediction=prediction), stats):
                view.show(response)
        except KeyboardInterrupt:
            interrupted = True
            stats.stop_reason = "interrupted"
        out_text = view.finish()
    if memory and not interrupted:
        engine.save_memory()
    if json_out:
        sys.stdout.write(json.dumps({"text": out_text, **stats.to_dict()}, allow_nan=False) + "\n")
    elif not quiet:
        sys.stderr.write(summary(stats) + "\n")
    if interrupted:
        raise typer.Exit(EXIT_INTERRUPTED)


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


@app.command()
@cli_errors
def serve(
    model: Optional[list[str]] = typer.Option(None, "-m", "--model", show_default=False,
                                              help="Alias from models.toml, Hugging Face repo id, or local folder; "
                                                   "repeat to serve several (the first is the default, loaded at "
                                                   "start; the others when first asked for). Default: demo "
                                                   "(or $SPECGEN_MODEL)."),
    max_models: int = typer.Option(serve_config.MAX_MODELS, "--max-models",
                                   help="Models resident at once; the least recently used idle one unloads first."),
    keep_alive: str = typer.Option("5m", "--keep-alive",
                                   help="How long an idle model stays loaded: 5m, 1h, 30s, 0 (unload after each "
                                        "answer) or -1 (never). Requests may set their own (keep_alive)."),
    host: str = typer.Option(serve_config.HOST, "--host", help="Address to listen on (loopback by default)."),
    port: int = typer.Option(serve_config.PORT, "--port", help="Port to listen on."),
    dtype: Optional[str] = options.DTYPE,
    memory: bool = typer.Option(False, "--memory", help="Learn every response into this model's memory and draft from it."),
    api_key: Optional[str] = typer.Option(None, "--api-key", envvar="SPECGEN_API_KEY", show_default=False,
                                          help="Require the key on /v1/ requests: 'Authorization: Bearer KEY' or 'x-api-key: KEY' (Anthropic's clients)."),
    max_queue: int = typer.Option(serve_config.MAX_QUEUE, "--max-queue", help="Requests that may wait while --max-batch are running; more get 429."),
    max_batch: int = typer.Option(serve_config.MAX_BATCH, "--max-batch",
                                  help="Requests decoded together, each speculating (1 = one at a time)."),
    allowed_origins: Optional[list[str]] = typer.Option(None, "--allowed-origins", show_default=False,
                                                        help="Origins browsers may call from (CORS); repeat for several, '*' for any."),
    prompt_cache_bytes: int = typer.Option(serve_config.PROMPT_CACHE_BYTES, "--prompt-cache-bytes",
                                           help="Bytes of model caches kept for later turns of a conversation (0 = none)."),
    max_tokens: int = typer.Option(defaults.MAX_TOKENS, "-n", "--max-tokens", help="Most tokens for a request that sets no max_tokens."),
    draft: Optional[int] = typer.Option(None, "--draft", show_default=False,
                                        help="As in run: fixed drafts of up to N tokens; 0 = plain decoding. Default: adaptive."),
    recalibrate: bool = options.RECALIBRATE,
    quiet: bool = typer.Option(False, "-q", "--quiet", help="No request log lines or notices on stderr."),
):
    """Serve models over HTTP, speculating: OpenAI's chat and text completions and Responses (Codex),
    Anthropic's Messages (Claude Code) and Ollama's API, with up to --max-batch requests decoded together."""
    import logging

    from specgen.engine.engine import Engine
    from specgen.serve import ServeConfig, make_server, require_extra
    from specgen.serve.apis.ollama import seconds
    from specgen.serve.models import fewer_arenas

    require_extra()
    check(max_tokens=max_tokens, draft=draft, dtype=dtype, max_batch=max_batch)
    if not 0 <= port <= 65535:
        usage(f"--port must be between 0 and 65535 (got {port})")
    listenable(host)
    for flag, value in (("--max-queue", max_queue), ("--prompt-cache-bytes", prompt_cache_bytes)):
        if value < 0:
            usage(f"{flag} must be at least 0 (got {value})")
    if launch_group(None, None, memory) is not None:
        fail("serve is not supported under mlx.launch yet")
    specs = model or [os.environ.get(defaults.MODEL_ENV) or defaults.MODEL]
    try:
        keep_alive_s = seconds(keep_alive)
    except ValueError as e:
        usage(f"--keep-alive: {e}")
    names = [registry.served_name(m) for m in specs]
    if len(specs) > 1:
        fewer_arenas()  # before any model loads: what an unloaded one freed goes back
    # before the slow load: it refuses a key no request could send
    config = ServeConfig(model_name=names[0], model=specs[0], others=tuple(zip(names[1:], specs[1:])),
                         max_models=max_models, keep_alive_s=keep_alive_s, max_tokens=max_tokens, draft=draft,
                         memory=memory, api_key=api_key,
                         max_queue=max_queue, max_batch=max_batch, prompt_cache_bytes=prompt_cache_bytes,
                         allowed_origins=tuple(allowed_origins or ()))
    say = Notices(quiet)
    if host not in ("127.0.0.1", "localhost", "::1") and not api_key:
        say.warn(f"listening on {host} without --api-key: anyone who can reach this machine can use the model")
    logging.basicConfig(format="specgen: %(message)s", level=logging.WARNING if quiet else logging.INFO)

    def load(spec: str) -> Engine:
        engine = Engine.load(spec, dtype=dtype, notice=say.warn, progress=say)
        if draft is None:
            engine.costs(recalibrate)  # once, before its first request
        return engine

    first = load(specs[0])  # before the address is printed; the server holds it from here on
    say(f"serving {', '.join(names)} on http://{host}:{port}/v1 (OPENAI_BASE_URL=http://{host}:{port}/v1; "
        f"Ollama's API: OLLAMA_HOST=http://{host}:{port})")
    server = make_server(first, config, host, port, log_level="warning" if quiet else "info", load=load)
    del first  # the server's model registry alone holds it, so that an unload lets it go
    server.run()


app.command()(cli_chat.chat)
app.command()(cli_tools.simulate)
app.command()(cli_tools.bench)
app.command()(cli_tools.ps)
app.add_typer(cli_tools.cache, name="cache")


def main():  # the console script
    # Die quietly on SIGPIPE-like conditions handled above; keep Ctrl-C as KeyboardInterrupt.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if sys.platform == "linux" and not _mlx_backend():
        sys.stderr.write("specgen: MLX has no backend here: pip install 'specgen[cpu]' "
                         "(or 'specgen[cuda]' with an NVIDIA GPU)\n")
        sys.exit(1)
    app()


def _mlx_backend() -> bool:
    """Whether MLX's library is installed (on Linux it comes with mlx[cpu] or mlx[cuda13]); a
    missing mlx is left to the import that needs it."""
    spec = importlib.util.find_spec("mlx")
    places = spec.submodule_search_locations if spec else None
    return not places or any((Path(p) / "lib" / "libmlx.so").exists() for p in places)
