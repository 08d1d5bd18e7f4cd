"""Validation of every user setting, in one place.

`check(**settings)` raises a `SettingError` naming the first setting of the wrong kind or out of its
range (by its library name: the CLI maps it to a flag) and returns warnings for settings that are
valid but have no effect, so that nothing the user set is ignored silently.
"""

from __future__ import annotations

import math
from typing import Callable

from specgen.errors import SettingError

# A rule: the kind of value a setting takes (the test, and the requirement it names: "5" for an
# integer is refused as not one, not as out of range), then its range (the test, the requirement).
Rule = tuple[Callable[[object], bool], str, Callable[[object], bool], str]
DTYPES = ("float32", "float16", "bfloat16")  # what weights may be converted to


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)  # True is an int to Python, not to a user


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _int(low: int, high: int | None = None, text: str = "") -> Rule:
    ok = lambda v: v >= low and (high is None or v <= high)
    return _is_int, "must be an integer", ok, text or (
        f"must be at least {low}" if high is None else f"must be between {low} and {high}")


def _real(low: float, high: float | None = None, *, above: bool = False, below: bool = False,
          text: str = "") -> Rule:
    def ok(v):
        return (math.isfinite(v) and (v > low if above else v >= low)
                and (high is None or (v < high if below else v <= high)))
    return _is_number, "must be a number", ok, text


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
    "dtype": (lambda v: isinstance(v, str), "must be a string", lambda v: v in DTYPES,
              f"must be one of {', '.join(DTYPES)}"),
}
_OFF = {"top_p": 0.0, "min_p": 0.0, "top_k": 0}  # the sampling filters' "off" values


def check(**settings) -> list[tuple[str, str]]:
    """Raise SettingError for the first setting out of range (None means "not set" and passes);
    return (setting, warning) pairs for settings that are valid but change nothing."""
    for name, value in settings.items():
        if value is None or name not in RULES:
            continue
        is_kind, kind, ok, requirement = RULES[name]
        if not is_kind(value):
            raise SettingError(name, kind, value)
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
