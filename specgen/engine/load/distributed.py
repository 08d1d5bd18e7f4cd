"""Running under `mlx.launch`: one model sharded over a group of processes (MLX's distributed
backend), every rank running the same decode loop in lockstep.

The drafter is deterministic and sampling is keyed by seed and position, so ranks that start from
the same prompt ids, seed and cost curve draft, verify and roll back alike with no messages of
their own; this module sends what must be the same everywhere from rank 0 (`share`), forms the
group (`world`) and loads the model through mlx-lm's `sharded_load` (`load_sharded`).
"""

from __future__ import annotations

import os
from typing import NamedTuple

import mlx.core as mx

from specgen.errors import DistributedError, ModelError


class World(NamedTuple):
    group: object  # mx.distributed.Group
    rank: int
    size: int


def launched() -> bool:
    """Whether this process was started by mlx.launch (which sets MLX_RANK for every rank)."""
    return "MLX_RANK" in os.environ


def world() -> World | None:
    """The group mlx.launch started this process in, or None when not launched (or alone)."""
    if not launched():
        return None
    try:
        group = mx.distributed.init(strict=True)
    except Exception as e:  # each backend fails in its own way; all mean "no group"
        raise DistributedError(f"started by mlx.launch, but the distributed group could not be formed: {e}") from e
    return World(group, group.rank(), group.size()) if group.size() > 1 else None


def share(w: World | None, values: list[float] | None) -> list[float]:
    """Rank 0's `values` on every rank (other ranks pass None); a no-op without a group.
    Sent as float32 (exact for token ids and seeds below 2**24; larger ints go in two halves)."""
    if w is None:
        return list(values or [])
    mine = values if w.rank == 0 else []
    n = int(mx.distributed.all_sum(mx.array([len(mine)], mx.int32), group=w.group).item())
    if n == 0:
        return []
    data = mx.array(mine if w.rank == 0 else [0] * n, mx.float32)
    return mx.distributed.all_sum(data, group=w.group).tolist()


def share_ints(w: World | None, values: list[int] | None) -> list[int]:
    """Rank 0's non-negative ints (token ids, a seed below 2**48) on every rank."""
    halves = None if values is None else [h for v in values for h in divmod(int(v), 1 << 24)]
    got = [int(x) for x in share(w, halves)]
    return [hi * (1 << 24) + lo for hi, lo in zip(got[::2], got[1::2])]


def load_sharded(source: str, name: str, w: World):
    """(model, tokenizer, config, sharding) through mlx-lm's sharded_load: tensor-parallel where
    the model supports it, else pipeline; a one-line ModelError where it supports neither."""
    from mlx_lm.utils import sharded_load

    try:
        model, tokenizer, config = sharded_load(source, return_config=True)
    except ValueError as e:
        if "does not support" in str(e):
            raise ModelError(f"'{name}' cannot be split over {w.size} processes: mlx-lm has no "
                             f"tensor-parallel or pipeline sharding for it ({e})") from e
        raise ModelError(f"cannot load model '{name}' sharded: {e}") from e
    except FileNotFoundError as e:
        raise ModelError(f"cannot load model '{name}' sharded: {e} (pipeline sharding needs "
                         "model.safetensors.index.json)") from e
    sharding = "tensor" if hasattr(model, "shard") else "pipeline"
    return model, tokenizer, config, f"{sharding} over {w.size} ranks"
