"""The engine: what runs the model. Loading (registry, distributed), the decode loop (decode: draft,
verify in one forward pass, keep the longest matching prefix, roll back: rollback), token selection
(sampling), stop strings (stops), the measured verify-cost curve (calibrate, cost, mode), one
request's options (options) and prompts as token ids (prompts); engine.py ties them into `Engine`.

May import: specgen.draft and the base modules. Re-exports nothing, so that the model-free modules
here (options, cost, mode) load without MLX.
"""
