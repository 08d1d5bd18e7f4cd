"""Every text specgen shows about a run: the live status line, the one-line summary, the cost curve
and draft mode, and the `simulate` and `bench` tables (the library itself never prints)."""

from __future__ import annotations

from pathlib import Path

from specgen.engine.cost.mode import queued_ahead
from specgen.stats import RunStats


def status_line(stats: RunStats) -> str:
    """The live line shown while generating."""
    c = stats.counts
    return (f"{c.tokens} tok  {stats.decode_tps:.1f} tok/s  "
            f"accept {c.acceptance_rate:.0%}  {c.tokens_per_step:.2f} tok/step")


def summary(stats: RunStats) -> str:
    """The one-line report printed after generating."""
    c = stats.counts
    if stats.speculation.on:
        spec = (f"draft {stats.draft_mode.split(',')[0]}: accepted {c.accepted}/{c.drafted} ({c.acceptance_rate:.0%}), "
                f"{c.tokens_per_step:.2f} tok/step")
    else:
        spec = f"speculation {stats.speculation}"
    seed = f"; seed {stats.seed}" if stats.seed is not None else ""
    if stats.prediction_drafted:
        spec += f"; prediction {stats.prediction_accepted}/{stats.prediction_drafted} accepted"
    return (f"{stats.model}: {stats.prompt_tokens} prompt tok in {stats.prefill_s:.2f}s; "
            f"{c.tokens} tok in {stats.decode_s:.2f}s ({stats.decode_tps:.1f} tok/s), "
            f"{c.steps} steps; {spec}{seed}; stop: {stats.stop_reason}")


def _console():
    from rich.console import Console

    return Console(highlight=False, width=max(Console().width, 110))


def simulate_table(reports, *, draft_mode: str, beta: float, memory: bool,
                   queue_after: int | None = None, overlap: float = 0.0) -> None:
    """One row per file and per category within it."""
    from rich.table import Table

    title = f"drafter {draft_mode}, verify cost 1 + {beta} x drafted" + (", memory on" if memory else "")
    if queue_after is not None:
        title += f", {queued_ahead(queue_after, adaptive=draft_mode.startswith('auto'))}"
    if overlap:
        title += f", queuing ahead saves {overlap:.0%} (mlx-lm queues every step)"
    table = Table(title=title, title_justify="left")
    for col in ("file / category", "output tok", "steps", "tok/step", "drafted/step", "accept",
                "speedup", "us/tok (median trace)"):
        table.add_column(col, justify="left" if col.startswith("file") else "right")
    for r in reports:
        name = Path(r.file).name
        if len(r.categories) == 1:
            name += f" [{next(iter(r.categories))}]"
        rows = [(name, r.to_dict(), "bold")]  # the file's dict adds the per-trace median
        if len(r.categories) > 1:
            rows += [(f"  {c}", t.to_dict(), None) for c, t in sorted(r.categories.items())]
        for name, d, style in rows:
            table.add_row(name, str(d["output_tokens"]), str(d["steps"]), f"{d['tokens_per_step']:.2f}",
                          f"{d['drafted_per_step']:.2f}", f"{d['acceptance_rate']:.1%}",
                          f"{d['predicted_speedup']:.3f}x",
                          f"{d['us_per_token']:.1f}" + (f" ({d['us_per_token_median']:.1f})"
                                                        if "us_per_token_median" in d else ""),
                          style=style)
    _console().print(table)


def bench_table(results, *, model: str, draft_mode: str, blas: str) -> None:
    """One row per prompt set: both speeds, the speedup spread, the replay's prediction, and
    whether outputs matched."""
    from rich.table import Table

    table = Table(title=f"{model}: specgen (draft {draft_mode}) vs mlx-lm greedy; {blas}",
                  title_justify="left")
    for col in ("set", "mlx-lm tok/s", "specgen tok/s", "speedup (min-max)", "predicted", "tok/step",
                "accept", "identical"):
        table.add_column(col, justify="left" if col == "set" else "right")
    for r in results:
        table.add_row(r["set"], f"{r['baseline_tps']:.1f}", f"{r['specgen_tps']:.1f}",
                      f"{r['speedup_median']:.2f}x ({r['speedup_min']:.2f}-{r['speedup_max']:.2f})",
                      f"{r['predicted_speedup']:.2f}x", f"{r['tokens_per_step']:.2f}",
                      f"{r['acceptance_rate']:.0%}", "yes" if r["identical"] else "NO")
    _console().print(table)

