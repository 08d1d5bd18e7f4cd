"""Stop strings: the generated text ends before the first one that appears, and no text that may
still turn out to begin one is handed out before that is known (OpenAI's `stop`)."""

from __future__ import annotations


class StopText:
    """Feeds text segments through the stop strings; `add` returns what may be shown now."""

    def __init__(self, stops=()):
        self.stops = tuple(stops)
        self._held = ""  # the tail that could be the start of a stop string
        self.stopped = False
        self.matched: str | None = None  # the stop string that ended the text (first listed, where tied)

    def add(self, segment: str) -> tuple[str, bool]:
        """(text to hand out now, whether a stop string just appeared: nothing follows it)."""
        if not self.stops:
            return segment, False
        text = self._held + segment
        found = [(at, s) for s in self.stops if (at := text.find(s)) >= 0]
        if found:
            at, self.matched = min(found, key=lambda f: f[0])
            self._held, self.stopped = "", True
            return text[:at], True
        keep = max((n for s in self.stops for n in range(min(len(s) - 1, len(text)), 0, -1)
                    if text.endswith(s[:n])), default=0)
        self._held = text[len(text) - keep:] if keep else ""
        return text[: len(text) - keep], False

    def flush(self) -> str:
        """What was held back, at the end of the text (no stop string came)."""
        held, self._held = self._held, ""
        return held
