"""Run statistics, computed from the decode loop's events, and their one-line and JSON forms."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from .decode import Prefilled, Step


def ratio(num: float, den: float) -> float:
    """num / den, or 0 when there is nothing to divide by (no steps, no drafts)."""
    return num / den if den else 0.0


@dataclass
class RunStats:
    """Counts and timings of one generation; feed it every event with `observe`."""

    model: str = ""
    speculation: str = "on"
    draft_mode: str = ""
    temp: float = 0.0
    seed: int | None = None  # the sampling seed (None when greedy), so a run can be repeated
    prompt_tokens: int = 0
    generated_tokens: int = 0
    prefill_s: float = 0.0
    decode_s: float = 0.0
    steps: int = 0
    drafted: int = 0
    accepted: int = 0
    accept_histogram: list[int] = field(default_factory=list)  # [k] = steps that accepted k drafts
    stop_reason: str | None = None
    notices: list[str] = field(default_factory=list)
    _start: float = field(default_factory=time.perf_counter, repr=False)
    _decode_start: float | None = field(default=None, repr=False)

    def observe(self, event: Prefilled | Step) -> None:
        """Account for one event from `decode.generate`, timing it on arrival."""
        now = time.perf_counter()
        if isinstance(event, Prefilled):
            self.prompt_tokens = event.prompt_tokens
            self.speculation = event.speculation
            self.prefill_s = now - self._start
            self._decode_start = now
            return
        self.steps += 1
        self.generated_tokens += len(event.tokens)
        self.drafted += event.drafted
        self.accepted += event.accepted
        if len(self.accept_histogram) <= event.accepted:
            self.accept_histogram.extend([0] * (event.accepted + 1 - len(self.accept_histogram)))
        self.accept_histogram[event.accepted] += 1
        if event.stop_reason:
            self.stop_reason = event.stop_reason
        if event.notice:
            self.notices.append(event.notice)
        self.decode_s = now - (self._decode_start if self._decode_start is not None else self._start)

    @property
    def decode_tps(self) -> float:
        return ratio(self.generated_tokens, self.decode_s)

    @property
    def acceptance_rate(self) -> float:
        return ratio(self.accepted, self.drafted)

    @property
    def tokens_per_step(self) -> float:
        return ratio(self.generated_tokens, self.steps)

    def to_dict(self) -> dict:
        """The documented JSON fields (see README, "JSON output")."""
        return {
            "model": self.model,
            "prompt_tokens": self.prompt_tokens,
            "generated_tokens": self.generated_tokens,
            "prefill_s": round(self.prefill_s, 6),
            "decode_s": round(self.decode_s, 6),
            "decode_tps": round(self.decode_tps, 3),
            "steps": self.steps,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "acceptance_rate": round(self.acceptance_rate, 4),
            "tokens_per_step": round(self.tokens_per_step, 4),
            "accept_histogram": list(self.accept_histogram),
            "speculation": self.speculation,
            "draft_mode": self.draft_mode,
            "temp": self.temp,
            "seed": self.seed,
            "stop_reason": self.stop_reason,
        }

    def status_line(self) -> str:
        """The live line shown while generating."""
        return (f"{self.generated_tokens} tok  {self.decode_tps:.1f} tok/s  "
                f"accept {self.acceptance_rate:.0%}  {self.tokens_per_step:.2f} tok/step")

    def summary(self) -> str:
        """The one-line report printed after generating."""
        spec = (f"draft {self.draft_mode.split(',')[0]}: accepted {self.accepted}/{self.drafted} "
                f"({self.acceptance_rate:.0%}), {self.tokens_per_step:.2f} tok/step"
                if self.speculation == "on"
                else f"speculation {self.speculation}")
        return (f"{self.model}: {self.prompt_tokens} prompt tok in {self.prefill_s:.2f}s; "
                f"{self.generated_tokens} tok in {self.decode_s:.2f}s ({self.decode_tps:.1f} tok/s), "
                f"{self.steps} steps; {spec}; stop: {self.stop_reason}")
