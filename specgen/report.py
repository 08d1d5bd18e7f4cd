"""Rich tables for `simulate` and `bench` (the library itself never prints; these are for the CLI)."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.table import Table


def queued_ahead(after: int) -> str:
    """How a pipeline_after policy reads in reports (run's summary, bench's and simulate's titles)."""
    return f"plain steps queued ahead after {after} silent {'one' if after == 1 else 'ones'}"


def simulate_table(reports, *, draft_mode: str, beta: float, memory: bool,
                   pipeline_after: int | None = None, overlap: float = 0.0) -> None:
    """One row per file and per category within it."""
    title = f"drafter {draft_mode}, verify cost 1 + {beta} x drafted" + (", memory on" if memory else "")
    if pipeline_after is not None:
        title += f", {queued_ahead(pipeline_after)}"
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
    Console(highlight=False, width=max(Console().width, 110)).print(table)


def bench_table(results, *, model: str, draft_mode: str) -> None:
    """One row per prompt set: both speeds, the speedup spread, and whether outputs matched."""
    from .calibrate import blas

    table = Table(title=f"{model}: specgen (draft {draft_mode}) vs mlx-lm greedy; {blas()}",
                  title_justify="left")
    for col in ("set", "mlx-lm tok/s", "specgen tok/s", "speedup (min-max)", "tok/step", "accept",
                "identical"):
        table.add_column(col, justify="left" if col == "set" else "right")
    for r in results:
        table.add_row(r["set"], f"{r['baseline_tps']:.1f}", f"{r['specgen_tps']:.1f}",
                      f"{r['speedup_median']:.2f}x ({r['speedup_min']:.2f}-{r['speedup_max']:.2f})",
                      f"{r['tokens_per_step']:.2f}", f"{r['acceptance_rate']:.0%}",
                      "yes" if r["identical"] else "NO")
    Console(highlight=False, width=max(Console().width, 110)).print(table)
