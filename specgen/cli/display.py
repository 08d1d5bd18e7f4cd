"""Showing a generation: text to stdout as it comes, live stats on stderr when it is a terminal.

When stdout and stderr are both terminals, one rich Live view holds a preview of the line being
written (its last rows) above a stats footer, and each line is printed above it once finished,
whole and unwrapped (the terminal wraps it softly), so that text copied from the terminal is the
generated text. Otherwise the text is written as it comes, and the footer (if stderr is a
terminal) lives on stderr alone.
"""

from __future__ import annotations

import time
from typing import TextIO

from rich.console import Console, Group
from rich.live import Live
from rich.text import Text

from specgen.cli.report import status_line

DRAFT_STYLE = "cyan"  # --color: text that came from accepted drafts
UPDATE_EVERY_S = 0.05  # at most 20 live-view updates a second: more would slow small models
PREVIEW_ROWS = 4  # rows of an unfinished line the live view shows


class TextView:
    """Shows the engine's responses (text segments, whole UTF-8 characters) as they come."""

    def __init__(self, stdout: TextIO, stderr: TextIO, *, stream: bool, live: bool, color: bool):
        self._text: list[str] = []
        self._stdout = stdout
        self._stream = stream
        both_tty = stdout.isatty() and stderr.isatty()
        self._color = color and stdout.isatty()
        self._out = Console(file=stdout, highlight=False, markup=False, emoji=False,
                            no_color=not self._color)
        self._line = Text()  # the unfinished line, previewed in the Live view when both are terminals
        self._live = None
        self._status = Text()
        self._shown = 0.0  # when the live view was last updated
        self._in_live = live and both_tty and stream
        if live and stderr.isatty():
            console = self._out if self._in_live else Console(file=stderr, highlight=False)
            self._live = Live(console=console, transient=True, refresh_per_second=8,
                              redirect_stdout=False, redirect_stderr=False)

    def __enter__(self):
        if self._live:
            self._live.start()
        return self

    def __exit__(self, *exc):
        if self._live:
            self._live.stop()
        return False

    def show(self, response) -> None:
        """Add a response's text (an engine.Response), and refresh the footer."""
        self._text.append(response.text)
        self._emit(response.text, DRAFT_STYLE if response.from_draft else None)
        stats = response.stats
        now = time.monotonic()
        if self._live and now - self._shown >= UPDATE_EVERY_S:
            self._shown = now
            self._status = Text(status_line(stats), style="dim")
            self._refresh()

    def finish(self) -> str:
        """End the output with a newline; return the whole text."""
        if self._live:
            self._live.stop()
        text = "".join(self._text)
        if self._stream:
            if self._in_live:
                self._out.print(self._line, end="", soft_wrap=True)
            if text and not text.endswith("\n"):
                self._stdout.write("\n")
            self._stdout.flush()
        return text

    def _refresh(self, redraw: bool = True) -> None:
        if not self._in_live:
            self._live.update(self._status, refresh=redraw)
            return
        width = max(self._out.width, 1)
        tail = self._line[-(PREVIEW_ROWS * width):] if len(self._line) > PREVIEW_ROWS * width else self._line
        self._live.update(Group(tail, self._status), refresh=redraw)

    def _emit(self, segment: str, style: str | None) -> None:
        if not segment or not self._stream:
            return
        if not self._in_live:
            if self._color and style:
                self._out.print(Text(segment, style=style), end="", soft_wrap=True)
            else:
                self._stdout.write(segment)
            self._stdout.flush()
            return
        # Finished lines go above the Live view, whole; the unfinished one is only previewed.
        *done, rest = segment.split("\n")
        finished = []
        for part in done:
            self._line.append(part, style)
            finished.append(self._line)
            self._line = Text()
        self._line.append(rest, style)
        if finished:
            # The view drops a line before it is printed above, or it would show twice.
            self._refresh(redraw=False)
            for line in finished:
                self._live.console.print(line, soft_wrap=True)
