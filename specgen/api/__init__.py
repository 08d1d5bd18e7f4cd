"""The Python API: what a program calls, and what the CLI and the server call too.

generate.py: `load`, `generate`, `stream_generate` with mlx-lm's signatures; batching.py:
`batch_generate` (many prompts decoded together, each speculating); batch_file.py: prompt
files, batch_results.py: result files (no model); batch_run.py: a prompt file through one engine.
May import: specgen.engine, specgen.draft and the base modules (defaults, errors, settings).
"""

from specgen.api.batching import batch_generate
from specgen.api.generate import (
    Response,
    SpecgenWarning,
    engine_for,
    generate,
    load,
    stream_generate,
)

__all__ = ["Response", "SpecgenWarning", "batch_generate", "engine_for", "generate", "load", "stream_generate"]
