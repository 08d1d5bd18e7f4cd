"""The README's commands run as written: every `specgen` command in its shell blocks parses with
the real command line's flags, those on the demo model run offline, and the fresh-machine
commands are the ones CI runs (.ci/run)."""

import re
import shlex
from pathlib import Path

import pytest
import typer
from typer.main import get_command
from typer.testing import CliRunner

from specgen.cli.commands import app

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
CLI = get_command(app)
# Typer carries its own click: its usage error is the one typer.BadParameter derives from.
UsageError = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "UsageError")
FILES = ("file", "prompts", "output", "predict", "json_schema", "grammar")  # options naming files


def shell_lines(text: str) -> list[str]:
    """Every line of the ```sh blocks."""
    return [line for block in re.findall(r"```sh\n(.*?)```", text, re.S) for line in block.splitlines()
            if line.strip()]


def specgen_commands(text: str) -> list[list[str]]:
    """The arguments of each `specgen` (or `.venv/bin/specgen`) command in the shell blocks, one
    per `&&` or `|` segment, comments dropped."""
    found = []
    for line in shell_lines(text):
        words = shlex.split(line, comments=True)
        segment: list[str] = []
        for w in words + ["|"]:
            if w in ("|", "&&", ";"):
                if segment and segment[0].rpartition("/")[2] == "specgen":
                    found.append(segment[1:])
                segment = []
            else:
                segment.append(w)
    return found


def parse(args: list[str]) -> tuple[list[str], dict]:
    """The command path and its parsed parameters, by click's own parser (UsageError where a
    command, flag or value is wrong), invoking nothing."""
    command, path, ctx = CLI, [], typer.Context(CLI, info_name="specgen")
    while hasattr(command, "list_commands") and args and args[0] in command.list_commands(ctx):
        path.append(args[0])
        command, args = command.get_command(ctx, args[0]), args[1:]
    if hasattr(command, "list_commands") and args and not args[0].startswith("-"):
        raise UsageError(f"no command {args[0]!r} under {path or 'specgen'}")
    return path, command.make_context(" ".join(["specgen", *path]), list(args)).params


COMMANDS = specgen_commands(README)


def test_the_readme_shows_commands_and_the_parser_refuses_a_wrong_flag():
    assert len(COMMANDS) >= 8 and ["run", "-m", "demo", "Once upon a time"] in COMMANDS
    for wrong in (["run", "--no-such-flag", "x"], ["run", "-n", "many", "x"], ["nope"], ["cache", "nope"]):
        with pytest.raises(UsageError):
            parse(wrong)


@pytest.mark.parametrize("args", COMMANDS, ids=lambda a: " ".join(a)[:60])
def test_every_readme_command_parses_and_the_demo_ones_run(args, tmp_path):
    path, params = parse(args)
    runs = (path[:1] in (["run"], ["models"]) and params.get("model") in (None, "demo")
            and not any(params.get(k) for k in FILES))  # a file of the reader's is not here
    if not runs:
        return
    if path == ["run"] and "-n" not in args and "--max-tokens" not in args:
        args = args + ["-n", "16"]  # as written, but short
    env = {"HF_HUB_OFFLINE": "1", "SPECGEN_MODEL": "demo", "XDG_CONFIG_HOME": str(tmp_path)}
    result = CliRunner().invoke(app, args, env=env)
    assert result.exit_code == 0, (args, result.output)


def test_the_fresh_machine_commands_are_what_ci_runs():
    first, second = shell_lines(README)[:2]
    ci = (ROOT / ".ci" / "run").read_text()
    install = re.search(r"pip install (-e '\.\[[a-z,]+\]')", first).group(1)
    assert install in ci and "specgen run -m demo" in first
    assert second.strip() == ".venv/bin/pytest -q" and ".venv/bin/pytest -q" in ci
