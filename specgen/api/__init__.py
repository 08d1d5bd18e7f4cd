"""The Python API: what a program calls, and what the CLI and the server call too.

generate.py: `load`, `generate`, `stream_generate` with mlx-lm's signatures; batching.py:
`batch_generate` (many prompts decoded together, each speculating); conversation.py: a
`Conversation` that keeps its cache and drafter between turns (`specgen chat`'s); prompts_file/: a prompts
file's lines and results file (no model) and its run through one engine.
May import: specgen.engine, specgen.draft, specgen.structured and the base modules.
"""

from specgen.api.batching import batch_generate
from specgen.api.conversation import Conversation
from specgen.api.generate import (
    Response,
    SpecgenWarning,
    engine_for,
    generate,
    load,
    stream_generate,
)

__all__ = ["Conversation", "Response", "SpecgenWarning", "batch_generate", "engine_for", "generate", "load", "stream_generate"]
