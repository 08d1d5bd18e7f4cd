"""Continuous batching: many sequences, one forward pass a step. batch.py is the engine (`Batch`:
rows join, step, leave; passes.py the pass it keeps in flight, prefill.py the prompts it prefills
between passes, share.py the prefixes rows share), streams.py runs requests through it as
`Engine.stream` runs one, row.py is a sequence's place in it, probe.py says whether a model
batches, and cache.py (with kv.py, state.py, slots.py) is the ragged cache every row's entries
share."""
