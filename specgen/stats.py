"""Counting what a generation did: one set of step counters (`Counts`) for `run`, `bench` and
`simulate`'s replay, and a run's statistics (`RunStats`) computed from the decode loop's events,
with their JSON form. Text lines are report's and display's.
"""

from __future__ import annotations

import difflib
import math
import time
from dataclasses import dataclass, field

from specgen.events import Prefilled, Speculation, Step


def ratio(num: float, den: float) -> float:
    """num / den, or 0 when there is nothing to divide by (no steps, no drafts)."""
    return num / den if den else 0.0


@dataclass
class Counts:
    """Target forward passes after prefill (`steps`), the tokens they emitted, the draft tokens
    they verified and accepted, how many steps accepted k drafts (`histogram[k]`) and how many
    carried a draft at all (`drafts`)."""

    steps: int = 0
    tokens: int = 0
    drafted: int = 0
    accepted: int = 0
    histogram: list[int] = field(default_factory=list)
    drafts: int = 0

    def add_step(self, tokens: int, drafted: int, accepted: int) -> None:
        self.steps += 1
        self.drafts += drafted > 0
        self.tokens += tokens
        self.drafted += drafted
        self.accepted += accepted
        if len(self.histogram) <= accepted:
            self.histogram.extend([0] * (accepted + 1 - len(self.histogram)))
        self.histogram[accepted] += 1

    def add(self, other: "Counts") -> None:
        self.steps += other.steps
        self.drafts += other.drafts
        self.tokens += other.tokens
        self.drafted += other.drafted
        self.accepted += other.accepted
        for k, n in enumerate(other.histogram):
            if len(self.histogram) <= k:
                self.histogram.append(0)
            self.histogram[k] += n

    @property
    def tokens_per_step(self) -> float:
        return ratio(self.tokens, self.steps)

    @property
    def acceptance_rate(self) -> float:
        return ratio(self.accepted, self.drafted)

    @property
    def drafted_per_step(self) -> float:
        return ratio(self.drafted, self.steps)


def finite(x: float) -> float | None:
    """x for JSON, which has no NaN or Infinity: None in their place."""
    return x if math.isfinite(x) else None


@dataclass
class RunStats:
    """Counts and timings of one generation; feed it every event with `observe`."""

    model: str = ""
    draft_mode: str = ""
    temp: float = 0.0
    seed: int | None = None  # the sampling seed (None when greedy), so a run can be repeated
    speculation: Speculation = Speculation(True)
    ranks: int = 1  # processes the model runs on (an mlx.launch group)
    sharding: str = "none"  # how the model is split over them
    prompt_tokens: int = 0
    prefill_s: float = 0.0
    decode_s: float = 0.0
    counts: Counts = field(default_factory=Counts)
    near_ties: int = 0  # verify rows recomputed one position at a time (see engine/decode/sampling.py)
    stop_reason: str | None = None
    cached_tokens: int = 0  # prompt tokens not prefilled: a prompt cache held them, or a batch row's
    # cache (engine/batch/share.py)
    prediction_drafted: int = 0  # drafted tokens that came from the caller's prediction
    prediction_accepted: int = 0  # ...and were accepted
    prediction_ids: list[int] = field(default_factory=list, repr=False)  # the caller's prediction
    output_ids: list[int] = field(default_factory=list, repr=False)  # every token emitted
    stop_token: int | None = None  # the stop token that ended it, if one did (not in output_ids)
    stop_string: str | None = None  # the stop string that ended the text, if one did
    _start: float = field(default_factory=time.perf_counter, repr=False)
    _decode_start: float | None = field(default=None, repr=False)

    def observe(self, event: Prefilled | Step) -> None:
        """Account for one event from `decode.generate`, timing it on arrival."""
        now = time.perf_counter()
        if isinstance(event, Prefilled):
            self.prompt_tokens = event.prompt_tokens
            self.cached_tokens += event.shared
            self.speculation = event.speculation
            self.prefill_s = now - self._start
            self._decode_start = now
            return
        self.counts.add_step(len(event.tokens), event.drafted, event.accepted)
        self.output_ids.extend(event.tokens)
        self.near_ties += event.confirmed
        if event.stop_reason:
            self.stop_reason = event.stop_reason
        self.decode_s = now - (self._decode_start if self._decode_start is not None else self._start)

    @property
    def decode_tps(self) -> float:
        return ratio(self.counts.tokens, self.decode_s)

    @property
    def prompt_tps(self) -> float:
        """Prompt tokens prefilled (those a prompt cache held excluded) per second."""
        return ratio(self.prompt_tokens - self.cached_tokens, self.prefill_s)

    @property
    def finish_reason(self) -> str | None:
        """The stop reason as mlx-lm and OpenAI say it: "stop" or "length"."""
        if self.stop_reason is None:
            return None
        return "length" if self.stop_reason in ("max_tokens", "context") else "stop"

    @property
    def prediction_in_output(self) -> tuple[int, int]:
        """(accepted, rejected) prediction tokens as OpenAI counts them: the prediction's tokens
        that appear in the output (its longest common subsequence with it, in order), and the
        rest. Not what speculation took from it (`prediction_accepted`): a prediction equal to the
        answer counts whole, whichever source drafted its tokens."""
        if not self.prediction_ids:
            return 0, 0
        matcher = difflib.SequenceMatcher(None, self.prediction_ids, self.output_ids, autojunk=False)
        appeared = sum(block.size for block in matcher.get_matching_blocks())
        return appeared, len(self.prediction_ids) - appeared

    def to_dict(self) -> dict:
        """The documented JSON fields (see README, "JSON output")."""
        c = self.counts
        return {
            "model": self.model,
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "generated_tokens": c.tokens,
            "prefill_s": round(self.prefill_s, 6),
            "decode_s": round(self.decode_s, 6),
            "decode_tps": round(self.decode_tps, 3),
            "steps": c.steps,
            "drafted": c.drafted,
            "accepted": c.accepted,
            "acceptance_rate": round(c.acceptance_rate, 4),
            "tokens_per_step": round(c.tokens_per_step, 4),
            "accept_histogram": list(c.histogram),
            "near_ties": self.near_ties,
            "prediction_drafted": self.prediction_drafted,
            "prediction_accepted": self.prediction_accepted,
            "speculation": str(self.speculation),
            "draft_mode": self.draft_mode,
            "temp": finite(self.temp),
            "seed": self.seed,
            "stop_reason": self.stop_reason,
            "ranks": self.ranks,
            "sharding": self.sharding,
        }
