"""What one generation request asks for (`Options`), independent of the model: the record that
the CLI, batch runs, the Python API and the server all fill in and pass to the engine.

No mlx here: the server's schema and the CLI validate with it before a model is touched.
Validation is settings.check's (one place); `Options.check()` returns its warnings.
"""

from __future__ import annotations

from dataclasses import dataclass

from specgen import defaults
from specgen.errors import SettingError
from specgen.settings import check
from specgen.structured.formats import Format


@dataclass(frozen=True)
class Options:
    """The settings of one generation (every default is defaults.py's)."""

    max_tokens: int = defaults.MAX_TOKENS
    draft: int | None = None  # None: the adaptive drafter; N: fixed n-gram drafts of N; 0: plain
    temp: float = defaults.TEMP
    top_p: float = defaults.TOP_P
    top_k: int = defaults.TOP_K
    min_p: float = defaults.MIN_P
    seed: int | None = None  # None: a fresh random seed when sampling (reported in the stats)
    ngram_order: int = defaults.MAX_ORDER
    window: int = defaults.WINDOW
    memory: bool = False  # draft from, and add to, the model's memory of earlier outputs
    stop: tuple[str, ...] = ()  # stop strings: the text ends before the first one that appears
    response_format: Format | None = None  # the output's schema or grammar (formats.parse)

    def check(self) -> list[tuple[str, str]]:
        """Raise SettingError naming the first setting out of range; return (setting, warning)
        pairs for settings that are valid but change nothing."""
        warnings = check(max_tokens=self.max_tokens, draft=self.draft, temp=self.temp,
                         top_p=self.top_p, top_k=self.top_k, min_p=self.min_p, seed=self.seed,
                         ngram_order=self.ngram_order, window=self.window)
        if not all(isinstance(s, str) and s for s in self.stop):
            raise SettingError("stop", "must be non-empty strings")
        if self.response_format is not None and not isinstance(self.response_format, Format):
            raise SettingError("response_format", "must be read by specgen.structured.formats.parse")
        if self.memory and self.draft is not None:
            warnings.append(("memory", "drafts only with the adaptive drafter (draft unset); "
                                       "the output is still added to it"))
        return warnings
