"""The terminal: `specgen` commands (commands: run, models, serve; tools: simulate, bench, cache),
what they share (kit), where a prompt comes from (prompts), what they show (display, report) and
`bench`'s timing against mlx-lm (bench, timing). Wiring only: the work is the library's.

May import every other layer.
"""
