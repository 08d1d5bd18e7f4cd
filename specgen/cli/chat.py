"""`specgen chat`: a conversation in the terminal, one model load, turn after turn (wiring: the
conversation is api/conversation.py's).

In a terminal: a `>>> ` prompt with line editing and history (kept in the cache folder), each
answer streamed as `run` streams it and a one-line summary on stderr after it, commands in the
input line (COMMANDS), `\"\"\"` to open and close a multi-line message. Ctrl-C during an answer
stops it (the turn is dropped, the conversation as before it); at the prompt it asks once more,
and a second Ctrl-C in a row, Ctrl-D or /bye ends the session. Not a terminal on stdin: each line
is a user turn, the answers go to stdout one after another, nothing else; exit status as `run`'s.
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Optional

import typer

from specgen.cli import options
from specgen.cli.kit import Notices, cli_errors
from specgen.errors import SettingError, SpecgenError

PROMPT, MORE, FENCE = ">>> ", "... ", '"""'
COMMANDS = """\
/help              this list
/clear             a new conversation (the system message stays)
/system TEXT       the system message (none: /system)
/set NAME VALUE    temperature, top_p, top_k, min_p, max_tokens, draft (N or auto), seed (N or none)
/stats             this session: tokens, time, acceptance, against plain decoding
/save FILE         the conversation as a --prompts line ({"messages": [...]})
/load FILE         a conversation saved so (its first line)
/bye               leave (or Ctrl-D)
\"\"\"                open a multi-line message; \"\"\" again closes it"""
SETTABLE = {"temperature": "temp", "temp": "temp", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p",
            "max_tokens": "max_tokens", "n": "max_tokens", "draft": "draft", "seed": "seed"}


@cli_errors
def chat(
    model: str = options.MODEL,
    max_tokens: int = options.MAX_TOKENS,
    draft: Optional[int] = options.DRAFT,
    memory: bool = options.MEMORY,
    temp: float = options.TEMP,
    top_p: float = options.TOP_P,
    top_k: int = options.TOP_K,
    min_p: float = options.MIN_P,
    seed: Optional[int] = options.SEED,
    system: Optional[str] = options.SYSTEM,
    dtype: Optional[str] = options.DTYPE,
    json_schema: Optional[str] = options.JSON_SCHEMA,
    grammar: Optional[str] = options.GRAMMAR,
    quiet: bool = typer.Option(False, "-q", "--quiet", help="No summaries or notices on stderr."),
):
    """Talk with a model, turn after turn: the conversation's cache and drafter are kept, so each
    turn prefills only its own tokens and drafts from everything said so far."""
    from specgen.api.conversation import Conversation
    from specgen.cli.prompts import read_format
    from specgen.engine.engine import Engine
    from specgen.engine.options import Options
    from specgen.settings import check

    say = Notices(quiet)
    fmt, _ = read_format(json_schema, grammar)
    options = Options(max_tokens=max_tokens, draft=draft, temp=temp, top_p=top_p, top_k=top_k, min_p=min_p,
                      seed=seed, memory=memory, response_format=fmt)
    say.settings(options.check() + check(dtype=dtype))
    engine = Engine.load(model, dtype=dtype, notice=say.warn, progress=say.progress)
    conversation = Conversation(engine, options, system)
    try:
        if sys.stdin.isatty() and sys.stdout.isatty():
            Terminal(conversation, say).run()
        else:
            for line in sys.stdin:
                if line.strip():
                    answer(conversation, line.rstrip("\n"), say, summary=False)
    finally:
        if memory:
            engine.save_memory()


def answer(conversation, text: str, say: Notices, summary: bool) -> None:
    """Stream the answer to `text` to stdout (Ctrl-C stops it); the summary after it on stderr."""
    from specgen.cli.report import summary as one_line
    from specgen.stats import RunStats

    stats = RunStats()
    stream = conversation.say(text, stats)
    said = ""
    try:
        for response in stream:
            said += response.text
            sys.stdout.write(response.text)
            sys.stdout.flush()
    except KeyboardInterrupt:
        sys.stdout.write("\n")
        say("stopped: the turn is dropped")
        return
    finally:
        stream.close()
    if conversation.dropped:
        say(f"the {conversation.dropped} oldest turn(s) were dropped to fit the context (/clear starts afresh)")
    if not said.endswith("\n"):
        sys.stdout.write("\n")
    sys.stdout.flush()
    if summary:
        say(one_line(stats))


class Terminal:
    """The interactive loop: a prompt, its commands, a line editor with history."""

    def __init__(self, conversation, say: Notices):
        self.conversation, self.say = conversation, say
        self.interrupted = False
        self.history = None
        try:
            import readline

            from specgen.store import cache_dir

            self.readline, self.history = readline, cache_dir() / "chat_history"
            try:
                readline.read_history_file(self.history)
            except OSError:
                pass  # none yet
        except ImportError:
            self.readline = None

    def run(self) -> None:
        self.say(f"chatting with {self.conversation.engine.name}: /help for commands, /bye or Ctrl-D to leave")
        try:
            while (text := self.read()) is not None:
                if text.startswith("/"):
                    if not self.command(text):
                        return
                elif text.strip():
                    try:
                        answer(self.conversation, text, self.say, summary=True)
                    except KeyboardInterrupt:  # a second Ctrl-C while the first one's answer closed
                        sys.stdout.write("\n")
                    except Exception as e:  # this turn's failure (a chat template's refusal, ...): not the session's
                        self.say(f"error: {type(e).__name__}: {e}" if not isinstance(e, SpecgenError) else f"error: {e}")
        finally:
            self.save_history()

    def read(self) -> str | None:
        """One message (a multi-line one between fences); None: leave."""
        try:
            line = input(PROMPT)
            self.interrupted = False
            if not line.startswith(FENCE):
                return line
            lines, rest = [], line[len(FENCE):]
            while not rest.endswith(FENCE):
                lines.append(rest)
                rest = input(MORE)
            lines.append(rest[: -len(FENCE)])
            return "\n".join(lines).strip("\n")
        except EOFError:
            sys.stdout.write("\n")
            return None
        except KeyboardInterrupt:
            sys.stdout.write("\n")
            if self.interrupted:
                return None
            self.interrupted = True
            self.say("Ctrl-C again (or Ctrl-D, /bye) to leave")
            return ""

    def command(self, text: str) -> bool:
        """Run a /command; False: leave."""
        name, _, argument = text[1:].partition(" ")
        argument, conversation = argument.strip(), self.conversation
        try:
            if name in ("bye", "exit", "quit"):
                return False
            if name == "help":
                sys.stdout.write(COMMANDS + "\n")
            elif name == "clear":
                conversation.clear()
                self.say("a new conversation")
            elif name == "system":
                conversation.set_system(argument)
                self.say(f"system message {'set' if argument else 'removed'}")
            elif name == "set":
                self.set(argument)
            elif name == "stats":
                sys.stdout.write(session_stats(conversation) + "\n")
            elif name == "save" and argument:
                conversation.save(argument)
                self.say(f"saved {len(conversation.messages) // 2} turn(s) to {argument}")
            elif name == "load" and argument:
                conversation.load(argument)
                self.say(f"loaded {len(conversation.messages)} message(s) from {argument}")
            else:
                self.say(f"unknown command /{name} (or it needs an argument): /help lists them")
        except Exception as e:  # a command's failure is said, and the session goes on
            self.say(f"error: {e}" if isinstance(e, (SpecgenError, OSError)) else f"error: {type(e).__name__}: {e}")
        return True

    def set(self, argument: str) -> None:
        key, _, value = argument.partition(" ")
        field = SETTABLE.get(key)
        if field is None or not value:
            raise SettingError(key or "/set", f"is not a setting /set takes ({', '.join(sorted(SETTABLE))})")
        if field in ("draft", "seed") and value in ("auto", "none"):
            parsed = None
        else:
            try:
                parsed = float(value) if field in ("temp", "top_p", "min_p") else int(value)
            except ValueError:
                raise SettingError(key, "must be a number", value) from None
        options = dataclasses.replace(self.conversation.options, **{field: parsed})
        for param, message in options.check():
            self.say(f"warning: {param} {message}")
        self.conversation.set_options(options)
        self.say(f"{key} = {value}")

    def save_history(self) -> None:
        if self.readline is not None and self.history is not None:
            try:
                self.history.parent.mkdir(parents=True, exist_ok=True)
                self.readline.write_history_file(self.history)
            except OSError as e:  # a cache that cannot be written is a warning, never a lost session
                self.say(f"warning: history not saved ({e})")


def session_stats(conversation) -> str:
    """This session's answers: tokens, time, acceptance, and their time against plain decoding's
    by the model's calibrated cost curve (a step of k positions costs curve(k) plain steps)."""
    turns = conversation.turns
    if not turns:
        return "no answers yet"
    tokens = sum(t.counts.tokens for t in turns)
    steps = sum(t.counts.steps for t in turns)
    drafted, accepted = sum(t.counts.drafted for t in turns), sum(t.counts.accepted for t in turns)
    seconds = sum(t.decode_s for t in turns)
    costs = conversation.engine.costs()
    spent = sum(t.counts.steps * costs.step(1 + t.counts.drafted / t.counts.steps) for t in turns if t.counts.steps)
    plain = tokens * costs.step(1)
    return (f"{len(turns)} answer(s), {tokens} tokens in {seconds:.2f}s ({tokens / seconds if seconds else 0:.1f} tok/s), "
            f"{steps} steps; drafts accepted {accepted}/{drafted} ({accepted / drafted if drafted else 0:.0%}); "
            f"by the calibrated curve {plain / spent if spent else 1:.2f}x plain decoding's time")
