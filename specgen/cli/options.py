"""The flags several commands take (`run`, `chat`, `serve`, `bench`, `simulate`), each declared
once (typer reads a declaration, and does not change it, so one serves every command that lists
it)."""

import typer

from specgen import defaults
from specgen.cli.kit import DTYPE_HELP

MODEL = typer.Option(defaults.MODEL, "-m", "--model", envvar=defaults.MODEL_ENV,
                     help="Alias from models.toml, Hugging Face repo id, or local folder.")
MAX_TOKENS = typer.Option(defaults.MAX_TOKENS, "-n", "--max-tokens", help="Most tokens to generate.")
DRAFT = typer.Option(None, "--draft", show_default=False,
                     help="Draft exactly up to N tokens per step with the plain n-gram predictor; 0 = plain "
                          "decoding. Default: the adaptive drafter chooses.")
MEMORY = typer.Option(False, "--memory",
                      help="Learn from and add to this model's n-gram memory of earlier outputs.")
TEMP = typer.Option(defaults.TEMP, "--temp", help="Sampling temperature; 0 = greedy.")
TOP_P = typer.Option(defaults.TOP_P, "--top-p",
                     help="Nucleus sampling: keep this much probability mass (0 = off).")
TOP_K = typer.Option(defaults.TOP_K, "--top-k", help="Sample among the k most likely tokens (0 = off).")
MIN_P = typer.Option(defaults.MIN_P, "--min-p",
                     help="Drop tokens below min-p times the top probability (0 = off).")
SEED = typer.Option(None, "--seed", show_default=False,
                    help="Sampling seed: same seed, same text. Default: random.")
SYSTEM = typer.Option(None, "--system", help="System message (chat template only).", show_default=False)
DTYPE = typer.Option(None, "--dtype", help=DTYPE_HELP, show_default=False)
RECALIBRATE = typer.Option(False, "--recalibrate", help="Measure this model's verify-cost curve again.")
NGRAM_ORDER = typer.Option(defaults.MAX_ORDER, "--ngram-order", help="Longest n-gram the predictor uses.")
WINDOW = typer.Option(defaults.WINDOW, "--window", help="Tokens of history the predictor keeps.")
JSON_SCHEMA = typer.Option(None, "--json-schema", show_default=False,
                           help="The output is JSON valid under the JSON Schema in FILE (with --prompts, "
                                "every line's but one with its own \"response_format\").")
GRAMMAR = typer.Option(None, "--grammar", show_default=False,
                       help="The output follows the Lark grammar in FILE.")
