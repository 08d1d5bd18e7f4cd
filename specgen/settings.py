"""Validation of every user setting, in one place.

`check(**settings)` raises a `SettingError` naming the first setting out of its range (by its
library name: the CLI maps it to a flag) and returns warnings for settings that are valid but
have no effect, so that nothing the user set is ignored silently.
"""

from __future__ import annotations

import math
from typing import Callable

from specgen.errors import SettingError

Rule = tuple[Callable[[object], bool], str]
DTYPES = ("float32", "float16", "bfloat16")  # what weights may be converted to


def _int(low: int, high: int | None = None, text: str = "") -> Rule:
    ok = lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= low and (high is None or v <= high)
    return ok, text or (f"must be at least {low}" if high is None else f"must be between {low} and {high}")


def _real(low: float, high: float | None = None, *, above: bool = False, below: bool = False,
          text: str = "") -> Rule:
    def ok(v):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            return False
        return ((v > low if above else v >= low)
                and (high is None or (v < high if below else v <= high)))
    return ok, text


RULES: dict[str, Rule] = {
    "max_tokens": _int(1),
    "draft": _int(0, text="must be 0 or more"),
    "ngram_order": _int(2, 16),
    "window": _int(1),
    "temp": _real(0.0, text="must be 0 (greedy) or more"),
    "top_p": _real(0.0, 1.0, text="must be between 0 and 1 (0: off)"),
    "min_p": _real(0.0, 1.0, text="must be between 0 and 1 (0: off)"),
    "top_k": _int(0, text="must be 0 (off) or more"),
    "seed": _int(0, 2**63 - 1, text="must be between 0 and 2^63 - 1"),
    "beta": _real(0.0, text="must be 0 or more"),
    "overlap": _real(0.0, 1.0, below=True, text="must be at least 0 and below 1"),
    "queue_after": _int(1),
    "repeats": _int(1),
    "batch": _int(1),
    "max_batch": _int(1),
    "prefill_chunk": _int(1),
    "dtype": (lambda v: v in DTYPES, f"must be one of {', '.join(DTYPES)}"),
}
_OFF = {"top_p": 0.0, "min_p": 0.0, "top_k": 0}  # the sampling filters' "off" values


def check(**settings) -> list[tuple[str, str]]:
    """Raise SettingError for the first setting out of range (None means "not set" and passes);
    return (setting, warning) pairs for settings that are valid but change nothing."""
    for name, value in settings.items():
        if value is None or name not in RULES:
            continue
        ok, requirement = RULES[name]
        if not ok(value):
            raise SettingError(name, requirement, value)
    warnings = []
    if settings.get("temp", None) == 0:
        for name, off in _OFF.items():
            if settings.get(name) not in (None, off):
                warnings.append((name, "has no effect when decoding greedily (temperature 0)"))
        if settings.get("seed") is not None:
            warnings.append(("seed", "has no effect when decoding greedily (temperature 0)"))
    return warnings
