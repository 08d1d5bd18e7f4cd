"""Loading a model: aliases and mlx-lm's loader (registry.py); one model sharded over a group of
processes under `mlx.launch` (distributed.py)."""
