"""The engine: what runs the model, one folder a concept.

- engine.py: `Engine`, a loaded model and the one way through (`plan`, `stream`); options.py (one
  request's options, model-free), prompts.py (prompts as token ids), responder.py and stops.py
  (a run's events as mlx-lm's per-token responses, stop strings).
- decode/: one sequence's decoding: the loop (loop.py: draft, verify in one forward pass, keep the
  longest matching prefix, roll back), the per-sequence rules every loop shares (sequence.py),
  token selection (sampling.py), rollback of every cache kind (rollback.py), grammars applied to
  decoding (constrain.py), passes run while their graph is built (eager.py).
- batch/: many sequences in one forward pass a step: the engine a caller drives (batch.py,
  streams.py), its rows (row.py), whether a model batches (probe.py) and its ragged cache
  (cache.py, kv.py, state.py, slots.py).
- cost/: what a pass costs and what follows: the curve (curve.py, mode.py, model-free), its
  measurement (calibrate.py), its file (store.py), batched steps' costs (grid.py) and their
  pricing (batch.py).
- load/: model aliases and loading (registry.py), a model split over processes (distributed.py).

May import: specgen.draft, specgen.structured and the base modules. Re-exports nothing, so that
the model-free modules here (options, cost.curve, cost.mode) load without MLX.
"""
