"""What every `specgen` command shares: turning library errors into one line and an exit code,
flag names for the library's setting names, notices on stderr, progress bars, whether serve can
listen on its --host, and the mlx.launch group (loading, calibration and memory are the engine's)."""

from __future__ import annotations

import contextlib
import functools
import os
import socket
import sys
import traceback

import click
import typer

from specgen.engine.load import registry
from specgen.errors import SettingError, SpecgenError

# One rule: 2 when the command line itself is wrong (an unknown flag, a flag's value of the wrong
# kind or out of range, flags that cannot go together: click's own usage errors are 2 too), 1 for
# bad input (a prompt, a file, a model) and everything else that fails.
EXIT_ERROR, EXIT_USAGE, EXIT_INTERRUPTED, EXIT_BROKEN_PIPE = 1, 2, 130, 141
# The flag of each setting the library names in its errors and warnings.
FLAGS = {"max_tokens": "--max-tokens", "draft": "--draft", "ngram_order": "--ngram-order",
         "window": "--window", "temp": "--temp", "top_p": "--top-p", "top_k": "--top-k",
         "min_p": "--min-p", "seed": "--seed", "beta": "--beta", "overlap": "--overlap",
         "queue_after": "--pipeline-after", "repeats": "--repeats", "system": "--system",
         "dtype": "--dtype", "prompt": "the prompt", "memory": "--memory", "batch": "--batch",
         "max_batch": "--max-batch", "output": "-o/--output", "max_models": "--max-models",
         "keep_alive": "--keep-alive", "model": "-m"}
DTYPE_HELP = "Convert (and dequantize) the weights to this dtype: float32, float16 or bfloat16."


def fail(message: str, code: int = EXIT_ERROR):
    sys.stderr.write(f"specgen: error: {message}\n")
    raise typer.Exit(code)


def usage(message: str):
    """Fail because the command line is wrong (a flag's value, flags that cannot go together)."""
    fail(message, EXIT_USAGE)


def cli_errors(command):
    """Turn library errors into one line and exit 1 (2 for a flag's value); Ctrl-C into 130; a
    closed pipe into 141."""

    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        try:
            return command(*args, **kwargs)
        except SpecgenError as e:
            if os.environ.get("SPECGEN_DEBUG") == "1":
                traceback.print_exc()
            if isinstance(e, SettingError):
                flag = FLAGS.get(e.param, e.param)
                fail(e.naming(flag), EXIT_USAGE if flag.startswith("-") else EXIT_ERROR)
            fail(str(e))
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
            fail(f"{type(e).__name__}: {e} (set SPECGEN_DEBUG=1 for the traceback)")

    return wrapper


class Notices:
    """One-line notices and warnings on stderr (none with --quiet); progress only in a terminal,
    where someone waits for it (a script's log gets nothing it did not ask for)."""

    def __init__(self, quiet: bool, prefix: str = "specgen"):
        self.quiet, self.prefix = quiet, prefix

    def __call__(self, message: str) -> None:
        if not self.quiet:
            sys.stderr.write(f"{self.prefix}: {message}\n")
            sys.stderr.flush()

    def warn(self, message: str) -> None:
        self(f"warning: {message}")

    def settings(self, warnings) -> None:
        """Warnings from settings.check, by flag."""
        for param, message in warnings:
            self.warn(f"{FLAGS.get(param, param)} {message}")

    @property
    def shows_progress(self) -> bool:
        return not self.quiet and sys.stderr.isatty()

    def progress(self, message: str) -> None:
        if self.shows_progress:
            self(message)

    @contextlib.contextmanager
    def bar(self, description: str, total: int):
        """A rich progress bar on stderr; yields advance(n) (a no-op where progress is not shown)."""
        if not self.shows_progress:
            yield lambda n=1: None
            return
        from rich.console import Console
        from rich.progress import Progress

        with Progress(console=Console(file=sys.stderr), transient=True) as bar:
            task = bar.add_task(description, total=total)
            yield lambda n=1: bar.advance(task, n)


user_models_file = registry.user_models_file


def resolve(model: str) -> registry.ModelSpec:
    return registry.resolve(model, registry.load_registry(user_models_file()))


def listenable(host: str) -> None:
    """Fail naming --host unless this machine can listen on it (checked before a slow load, and
    said in one line: uvicorn would log it and exit 3)."""
    try:
        family, kind, _, _, address = socket.getaddrinfo(host, 0, type=socket.SOCK_STREAM,
                                                         flags=socket.AI_PASSIVE)[0]
        with socket.socket(family, kind) as s:
            s.bind(address)
    except OSError as e:  # not an address or name (gaierror), or not this machine's
        fail(f"--host {host}: cannot listen there ({e.strerror or e})")


def launch_group(prompt: str | None, file: str | None, memory: bool):
    """The mlx.launch group this process runs in (None when not launched, or alone); ranks other
    than 0 print nothing (rank 0 speaks for the group). What cannot be used under it fails here."""
    from specgen.engine.load.distributed import world

    w = world()
    if w is not None and w.rank != 0:
        sys.stdout = sys.stderr = open(os.devnull, "w")
    if w is not None and "-" in (prompt, file):
        raise SettingError("prompt", "cannot come from standard input under mlx.launch, which does not "
                           "pass it on: give it as an argument or with -f FILE")
    if w is not None and memory:
        raise SettingError("memory", "is not supported under mlx.launch yet (each machine would draft "
                           "from its own memory)")
    return w


def shared_ints(w, make) -> list[int]:
    """`make()` (ints, such as prompt ids) on rank 0, sent to every rank; a SpecgenError raised by
    `make` on rank 0 ends every rank (rank 0 reports it)."""
    if w is None:
        return make()
    from specgen.engine.load.distributed import share_ints

    made, error = None, None
    if w.rank == 0:
        try:
            made = make()
        except SpecgenError as e:
            error = e
    got = share_ints(w, (made or []) if w.rank == 0 else None)
    if error is not None:
        raise error
    if not got:
        raise typer.Exit(EXIT_ERROR)
    return got
