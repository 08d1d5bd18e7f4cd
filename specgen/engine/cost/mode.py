"""How a run chooses draft lengths (`DraftMode`) and how that mode and its cost curve read in
titles, summaries and JSON (model-free)."""

from __future__ import annotations

from dataclasses import dataclass

from specgen.engine.cost.curve import Curve, queue_after


@dataclass(frozen=True)
class DraftMode:
    """How draft lengths are chosen: "auto" (the adaptive drafter, up to `cap`, under `curve`) or
    "fixed" (the n-gram predictor, exactly up to `cap`)."""

    kind: str
    cap: int
    curve: Curve | None = None
    memory_outputs: int | None = None  # drafting with a memory of this many earlier outputs

    @property
    def short(self) -> str:
        """e.g. "auto (up to 64)" or "fixed 4"."""
        return f"auto (up to {self.cap})" if self.kind == "auto" else f"fixed {self.cap}"

    def __str__(self) -> str:
        """The short form with the curve and the memory, as JSON's draft_mode."""
        text = self.short
        if self.curve is not None:
            text += f", {describe_curve(self.curve, adaptive=self.kind == 'auto')}"
        if self.memory_outputs is not None:
            text += f", memory of {self.memory_outputs} earlier outputs"
        return text


def queued_ahead(after: int, adaptive: bool = False) -> str:
    """How a queue_after policy reads in titles and summaries: the adaptive drafter's own
    (schedule.py) or, for a fixed draft length, after `after` silent steps."""
    if adaptive:
        return "plain steps queued ahead while the drafts they hold up cost less"
    return f"plain steps queued ahead after {after} silent {'one' if after == 1 else 'ones'}"


def describe_curve(curve: Curve, adaptive: bool = False) -> str:
    """e.g. "cost x1.00/1.21/1.45/2.03 at 1/2/4/8 positions", and how plain steps and passes
    nothing runs ahead of run."""
    ks = [k for k in sorted(curve.relative) if k <= 16]
    text = ("cost x" + "/".join(f"{curve.relative[k]:.2f}" for k in ks) + " at "
            + "/".join(map(str, ks)) + " positions")
    ahead = queue_after(curve)
    if ahead is not None:
        text += f"; {queued_ahead(ahead, adaptive)} (saves {curve.overlap:.0%})"
    if curve.eager:
        text += f"; other passes run as built (every {curve.eager} layers)"
    return text
