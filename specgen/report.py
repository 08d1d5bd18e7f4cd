"""Rich tables for `simulate` and `bench` (the library itself never prints; these are for the CLI)."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.table import Table


def simulate_table(reports, *, draft_mode: str, beta: float, memory: bool) -> None:
    """One row per file and per category within it."""
    table = Table(title=f"drafter {draft_mode}, verify cost 1 + {beta} x drafted"
                        + (", memory on" if memory else ""), title_justify="left")
    for col in ("file / category", "output tok", "steps", "tok/step", "drafted/step", "accept",
                "speedup", "us/tok"):
        table.add_column(col, justify="left" if col.startswith("file") else "right")
    for r in reports:
        name = Path(r.file).name
        if len(r.categories) == 1:
            name += f" [{next(iter(r.categories))}]"
        rows = [(name, r.total.to_dict(), "bold")]
        if len(r.categories) > 1:
            rows += [(f"  {c}", t.to_dict(), None) for c, t in sorted(r.categories.items())]
        for name, d, style in rows:
            table.add_row(name, str(d["output_tokens"]), str(d["steps"]), f"{d['tokens_per_step']:.2f}",
                          f"{d['drafted_per_step']:.2f}", f"{d['acceptance_rate']:.1%}",
                          f"{d['predicted_speedup']:.3f}x", f"{d['us_per_token']:.1f}", style=style)
    Console(highlight=False, width=max(Console().width, 110)).print(table)
